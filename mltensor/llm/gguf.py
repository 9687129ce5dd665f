"""GGUF files (llama.cpp's format): metadata and tensors read straight from the mapped file
(`read_gguf`, the gguf package's types and block sizes; its GGUFReader for the files that reader
leaves, big-endian ones), validation, and the weights kept in their blocks on the GPU. Q4_0, Q4_1 and Q8_0 are repacked into the packed layout
of `_matmul_nbits` / `_gather_nbits` (mltensor/ops/nbits.py); the K-quants (Q2_K, Q3_K, Q4_K,
Q5_K, Q6_K), Q5_0, Q5_1, IQ4_NL, IQ4_XS, BF16 and F16 matrices go to the GPU as the file's
bytes (`_matmul_blocks` / `_gather_blocks`, mltensor/ops/blocks.py: BlockWeight); F32 tensors
and F16/BF16 vectors are dense. One file may mix them (a Q4_K_M file holds Q4_K, Q6_K and Q5_0 or Q8_0 tensors).

Block formats (ggml-quants.c; 32 values a block, each block's bytes in this order):
- Q4_0: d (f16), 16 bytes of nibbles; value j = (nibble_j - 8) * d, where the low nibbles of the
  16 bytes are values 0..15 and the high nibbles values 16..31.
- Q4_1: d (f16), m (f16), 16 bytes of nibbles in Q4_0's order; value j = nibble_j * d + m.
- Q8_0: d (f16), 32 int8; value j = q_j * d.
`_matmul_nbits` decodes value = (q - zp) * scale with q packed low bits first in consecutive
order (value 2i in the low nibble of byte i, 2i+1 in the high one: onnxruntime's MatMulNBits
layout), so the nibbles are reordered here, Q4_1's offset becomes the float zero point -m/d,
and Q8_0's signed bytes are stored offset by 128 (the default zero point of 8-bit blocks).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from ..errors import DataError, NotSupportedError
from ..ops.blocks import BLOCK_TYPES, pack_blocks
from .arch import ARCHS, read_rope_scaling

BLOCK = 32  # values a block in Q4_0, Q4_1 and Q8_0
SUPPORTED_ARCHS = tuple(ARCHS)
NBITS_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # repacked for _matmul_nbits
SUPPORTED_TYPES = ("F32",) + NBITS_TYPES + tuple(BLOCK_TYPES)


def _gguf() -> ModuleType:
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - declared in the `test` / `llm` extras
        raise NotSupportedError("reading GGUF files needs the `gguf` package: pip install gguf") from e
    return gguf


class QuantizedWeight:
    """A [rows, cols] matrix in `_matmul_nbits`'s layout: `packed` uint32 words (rows of cols
    values, `bits` each, back to back), `scales` float32 [rows * cols / 32], `zero_points`
    float32 of the same shape or None (the default 2^(bits-1)). Made by `repack`.

    Parameters
    ----------
    rows, cols : int
        The matrix's shape.
    bits : int
        4 or 8: the bits of a value.
    packed : numpy.ndarray
        uint32 words, the values of each row back to back, low bits first.
    scales : numpy.ndarray
        float32 [rows * cols / 32]: one scale a block of 32 values.
    zero_points : numpy.ndarray or None
        float32 like `scales`, or None: the default 2^(bits-1).
    kind : str
        The GGUF tensor type it came from ("Q4_0", "Q4_1", "Q8_0").
    """

    __slots__ = ("rows", "cols", "bits", "block_size", "packed", "scales", "zero_points", "kind", "scales16")

    def __init__(
        self,
        rows: int,
        cols: int,
        bits: int,
        packed: np.ndarray,
        scales: np.ndarray,
        zero_points: np.ndarray | None,
        kind: str,
    ) -> None:
        self.rows, self.cols, self.bits, self.block_size = rows, cols, bits, BLOCK
        self.packed, self.scales, self.zero_points, self.kind = packed, scales, zero_points, kind
        # the scales as the matmuls read them: float16 when that is exact (GGUF stores them in
        # float16), 2 bytes a block instead of 4: the weights take the file's size on the GPU
        s16 = scales.astype(np.float16)
        self.scales16 = s16 if np.array_equal(s16.astype(np.float32), scales) else scales

    @property
    def nbytes(self) -> int:
        """Bytes on the GPU as the matmuls read it (a gather of embeddings adds float32 scales)."""
        zp = 0 if self.zero_points is None else self.zero_points.nbytes
        return self.packed.nbytes + self.scales16.nbytes + zp

    def dequantize(self) -> np.ndarray:
        """The matrix the GPU decodes, on the host (for checks, not on the GPU path).

        Returns
        -------
        numpy.ndarray
            float32 [rows, cols].
        """
        vpw = 32 // self.bits
        shifts = (np.arange(vpw, dtype=np.uint32) * self.bits)[None, :]
        q = ((self.packed[:, None] >> shifts) & ((1 << self.bits) - 1)).reshape(-1).astype(np.float32)
        q3 = q.reshape(self.rows, -1, BLOCK)
        s = self.scales.reshape(self.rows, -1, 1)
        zp = (
            np.float32(1 << (self.bits - 1)) if self.zero_points is None else self.zero_points.reshape(self.rows, -1, 1)
        )
        out: np.ndarray = ((q3 - zp) * s).reshape(self.rows, self.cols)
        return out


def _blocks(raw: Any, rows: int, cols: int, block_bytes: int, kind: str) -> npt.NDArray[np.uint8]:
    nb = cols // BLOCK
    if cols % BLOCK:
        raise DataError(f"[gguf] a {kind} tensor's rows must be whole blocks of {BLOCK}, got {cols} values")
    data: npt.NDArray[np.uint8] = np.ascontiguousarray(raw, dtype=np.uint8)
    if data.size != rows * nb * block_bytes:
        raise DataError(
            f"[gguf] {kind} tensor of {rows} x {cols} needs {rows * nb * block_bytes} bytes, the file holds {data.size}"
        )
    return data.reshape(rows * nb, block_bytes)


def _f16(b: npt.NDArray[np.uint8], off: int) -> npt.NDArray[np.float32]:
    return b[:, off : off + 2].copy().view(np.float16).reshape(-1).astype(np.float32)


def _nibbles_consecutive(qs: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
    """GGUF's 16 bytes of nibbles [n, 16] (low nibbles: values 0..15, high: 16..31) -> the same
    32 values packed 2 a byte in order (value 2i low, 2i+1 high), as uint32 words [n * 4]."""
    vals = np.concatenate([qs & 0x0F, qs >> 4], axis=1)  # [n, 32] in value order
    out = (vals[:, 0::2] | (vals[:, 1::2] << 4)).astype(np.uint8)
    words: npt.NDArray[Any] = out.reshape(-1).view("<u4").copy()
    return words


def repack(kind: str, raw: np.ndarray | bytes, rows: int, cols: int) -> QuantizedWeight:
    """A GGUF block tensor in the packed layout of `_matmul_nbits` (the nibbles reordered, Q4_1's
    offset made a zero point, Q8_0's bytes offset by 128).

    Parameters
    ----------
    kind : str
        The GGUF tensor type: "Q4_0", "Q4_1" or "Q8_0".
    raw : numpy.ndarray or bytes
        The tensor's bytes, as the file stores them (rows of `cols` values in blocks of 32).
    rows, cols : int
        The matrix's shape; `cols` a multiple of 32.

    Returns
    -------
    QuantizedWeight
        The repacked matrix.

    Raises
    ------
    mltensor.NotSupportedError
        Another tensor type (the others are read by `load_weight` as blocks or dense arrays).
    mltensor.DataError
        `raw` does not hold rows x cols values of this type.
    """
    if kind == "Q4_0":
        b = _blocks(raw, rows, cols, 18, kind)
        return QuantizedWeight(rows, cols, 4, _nibbles_consecutive(b[:, 2:]), _f16(b, 0), None, kind)
    if kind == "Q4_1":
        b = _blocks(raw, rows, cols, 20, kind)
        d, m = _f16(b, 0), _f16(b, 2)
        qs = b[:, 4:].copy()
        # q*d + m = (q - (-m/d)) * d. Where d == 0 every value of the block is m: the nibbles
        # are set to 0 and the block decodes as (0 - (-1)) * m, exactly m.
        zero = d == 0
        qs[zero] = 0
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.where(zero, np.float32(-1.0), -(m.astype(np.float64) / np.where(zero, 1, d))).astype(np.float32)
        scale = np.where(zero, m, d).astype(np.float32)
        return QuantizedWeight(rows, cols, 4, _nibbles_consecutive(qs), scale, zp, kind)
    if kind == "Q8_0":
        b = _blocks(raw, rows, cols, 34, kind)
        q = (b[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        return QuantizedWeight(rows, cols, 8, q.reshape(-1).view("<u4").copy(), _f16(b, 0), None, kind)
    raise NotSupportedError(
        f"[gguf] tensor type {kind} has no _matmul_nbits layout (repack takes {', '.join(NBITS_TYPES)}; "
        "load_weight reads the others)"
    )


class BlockWeight:
    """A [rows, cols] matrix of GGUF blocks of `kind` (ops/blocks.py BLOCK_TYPES) as the u32
    `words` `_matmul_blocks` / `_gather_blocks` decode: the file's bytes."""

    __slots__ = ("rows", "cols", "kind", "words")

    def __init__(self, kind: str, raw: Any, rows: int, cols: int) -> None:
        self.rows, self.cols, self.kind = rows, cols, kind
        self.words: npt.NDArray[np.uint32] = pack_blocks(kind, raw, rows, cols)

    @property
    def nbytes(self) -> int:
        return self.words.nbytes


class _Unusual(Exception):
    """A valid file read_gguf leaves to the gguf package's reader."""


# GGUFValueType -> struct format of the scalar types; 8 is STRING, 9 ARRAY
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_DENSE = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}  # fmt: skip


def read_gguf(gguf: ModuleType, path: str, size: int) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(metadata, tensors, the mapping that keeps them alive) of a little-endian GGUF file (v2,
    v3), as GGUFFile holds them and as the gguf package's GGUFReader gives them (its field
    contents, its tensors' data arrays), read directly: that reader spends about 30 us on each
    string, 9-15 s on the 150k-400k tokens and merges of a Llama 3, Qwen2 or Gemma vocabulary.
    Raises _Unusual for files it leaves to GGUFReader (big-endian, nested arrays), and
    ValueError / struct.error / ... for malformed ones."""
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    unpack = struct.unpack_from
    magic, version = unpack("<II", mm, 0)
    if magic != gguf.GGUF_MAGIC:
        raise ValueError("GGUF magic invalid")
    if version & 0xFFFF == 0:
        raise _Unusual  # the other byte order
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = unpack("<QQ", mm, 8)
    off = 24

    def string() -> str:
        nonlocal off
        (n,) = unpack("<Q", mm, off)
        if off + 8 + n > size:
            raise ValueError(f"a string at byte {off} runs past the end of the file")
        v = mm[off + 8 : off + 8 + n].decode("utf-8")
        off += 8 + n
        return v

    def value(kind: int) -> Any:
        nonlocal off
        if kind in _SCALAR:
            fmt = "<" + _SCALAR[kind]
            (v,) = unpack(fmt, mm, off)
            off += struct.calcsize(fmt)
            return v
        if kind == 8:
            return string()
        if kind != 9:
            raise ValueError(f"unknown metadata type {kind} at byte {off}")
        sub, n = unpack("<IQ", mm, off)
        off += 12
        if sub == 8:
            return [string() for _ in range(n)]
        if sub not in _SCALAR:
            raise _Unusual  # (nested arrays)
        dt = np.dtype("<" + _SCALAR[sub])
        if off + n * dt.itemsize > size:
            raise ValueError(f"an array at byte {off} runs past the end of the file")
        v = np.frombuffer(mm, dt, n, off).tolist()
        off += n * dt.itemsize
        return v

    metadata: dict[str, Any] = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}
    for _ in range(n_kv):
        key = string()
        (kind,) = unpack("<I", mm, off)
        off += 4
        if key in metadata:
            raise ValueError(f"metadata key {key!r} is given twice")
        metadata[key] = value(kind)
    infos = []
    for _ in range(n_tensors):
        name = string()
        (n_dims,) = unpack("<I", mm, off)
        dims = unpack(f"<{n_dims}Q", mm, off + 4)
        kind, offset = unpack("<IQ", mm, off + 4 + 8 * n_dims)
        off += 4 + 8 * n_dims + 12
        infos.append((name, dims, gguf.GGMLQuantizationType(kind), offset))
    align = metadata.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align <= 0 or align & (align - 1):
        raise ValueError(f"general.alignment {align!r} is not a power of two")
    start = -(-off // align) * align
    tensors: dict[str, Any] = {}
    for name, dims, qtype, offset in infos:
        if name in tensors:
            raise ValueError(f"tensor {name!r} is given twice")
        shape = tuple(int(x) for x in reversed(dims))  # ggml's ne is innermost first
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = int(np.prod(shape, dtype=np.int64)) * type_size // block
        begin = start + offset
        if begin + n_bytes > size:
            raise DataError(
                f"[gguf] {path} is truncated: tensor {name!r} ends at byte {begin + n_bytes}, the file has {size}"
            )
        if qtype.name in _DENSE:
            data = np.frombuffer(mm, _DENSE[qtype.name], n_bytes // type_size, begin).reshape(shape)
        else:
            byte_shape = gguf.quant_shape_to_byte_shape(shape, qtype)
            data = np.frombuffer(mm, np.uint8, n_bytes, begin).reshape(byte_shape)
        tensors[name] = (qtype.name, shape, data)
    return metadata, tensors, mm


class GGUFFile:
    """A parsed GGUF file: `metadata` (key -> Python value), `tensors` (name -> (type name, numpy
    shape [.., rows, cols], the raw data as the gguf package's reader gives it)); the file stays mapped.

    Parameters
    ----------
    path : str or os.PathLike
        The ``.gguf`` file.

    Raises
    ------
    mltensor.DataError
        An unreadable, malformed or truncated file.
    mltensor.NotSupportedError
        The ``gguf`` package is missing (``pip install 'mltensor[llm]'``).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        gguf = _gguf()
        self.path = os.fspath(path)
        try:
            size = os.path.getsize(self.path)
        except OSError as e:
            raise DataError(f"[gguf] cannot read {self.path}: {e}") from None
        try:
            self.metadata, self.tensors, self._reader = read_gguf(gguf, self.path, size)
            return
        except _Unusual:
            pass  # (a big-endian file, a nested array: the gguf package's reader below)
        except (ValueError, IndexError, KeyError, TypeError, OverflowError, struct.error, UnicodeDecodeError) as e:
            raise DataError(f"[gguf] {self.path} is not a valid GGUF file ({type(e).__name__}: {e})") from None
        try:
            reader = gguf.GGUFReader(self.path, "r")
        except (ValueError, IndexError, KeyError, TypeError, OverflowError, EOFError, AssertionError) as e:
            raise DataError(f"[gguf] {self.path} is not a valid GGUF file ({type(e).__name__}: {e})") from None
        self.metadata = {}
        for key, field in reader.fields.items():
            try:
                self.metadata[key] = field.contents()
            except Exception as e:  # noqa: BLE001 - a field the reader cannot decode is a bad file
                raise DataError(f"[gguf] metadata {key!r} of {self.path} cannot be read ({e})") from None
        self.tensors = {}
        for t in reader.tensors:
            kind = t.tensor_type.name
            shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # ggml's ne is innermost first
            end = int(t.data_offset) + int(t.n_bytes)
            if end > size:
                raise DataError(
                    f"[gguf] {self.path} is truncated: tensor {t.name!r} ends at byte {end}, the file has {size}"
                )
            self.tensors[t.name] = (kind, shape, t.data)
        self._reader = reader  # keeps the memory map alive while tensors are read

    def get(self, key: str, default: Any = None) -> Any:
        """A metadata value.

        Parameters
        ----------
        key : str
            The metadata key ("general.architecture").
        default : object, default None
            What a missing key gives.

        Returns
        -------
        object
            The value (a Python str, number, bool or list), or `default`.
        """
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        """A metadata value the file must have.

        Parameters
        ----------
        key : str
            The metadata key.

        Returns
        -------
        object
            The value.

        Raises
        ------
        mltensor.DataError
            The file lacks the key.
        """
        if key not in self.metadata:
            raise DataError(f"[gguf] {self.path} lacks the metadata key {key!r}")
        return self.metadata[key]


class LlamaConfig:
    """The decoder hyperparameters of a GGUF file (`<arch>.*` keys) for any architecture of
    mltensor/llm/arch (`arch`: its description): sizes, per-layer sliding windows (`windows`) and
    rotary parameters (`layer_ropes`), soft-caps, the attention scale.

    Parameters
    ----------
    f : GGUFFile
        The opened file.

    Raises
    ------
    mltensor.NotSupportedError
        An architecture mltensor/llm/arch does not describe, or key and value heads of
        different sizes.
    mltensor.DataError
        Missing or inconsistent hyperparameters.
    """

    def __init__(self, f: GGUFFile) -> None:
        arch = f.require("general.architecture")
        if arch not in ARCHS:
            raise NotSupportedError(
                f"[gguf] architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
            )
        self.arch = arch
        spec = self.spec = ARCHS[arch]

        def num(key: str, default: Any = None, kind: Callable[[Any], Any] = int) -> Any:
            v = f.get(f"{arch}.{key}", default)
            if v is None:
                raise DataError(f"[gguf] {f.path} lacks the metadata key {arch}.{key!r}")
            try:
                v = kind(v)
            except (TypeError, ValueError):
                raise DataError(f"[gguf] {arch}.{key} must be a number, got {v!r}") from None
            return v

        self.n_layers = num("block_count")
        self.hidden = num("embedding_length")
        self.ffn = num("feed_forward_length")
        self.n_heads = num("attention.head_count")
        self.n_kv_heads = num("attention.head_count_kv", self.n_heads)
        self.context_length = num("context_length", 2048)
        self.eps = num("attention.layer_norm_rms_epsilon", 1e-5, float)
        self.rope_base = num("rope.freq_base", 10000.0, float)
        for what in ("n_layers", "hidden", "ffn", "n_heads", "n_kv_heads", "context_length"):
            if getattr(self, what) < 1:
                raise DataError(f"[gguf] {what} must be positive, got {getattr(self, what)}")
        if self.n_heads % self.n_kv_heads:
            raise DataError(f"[gguf] {self.n_heads} heads on {self.n_kv_heads} KV heads do not divide evenly")
        if f"{arch}.attention.key_length" not in f.metadata and self.hidden % self.n_heads:
            raise DataError(f"[gguf] {self.n_heads} heads do not divide the {self.hidden} channels evenly")
        self.head_dim = num("attention.key_length", self.hidden // self.n_heads)
        vdim = num("attention.value_length", self.head_dim)
        if self.head_dim < 1 or vdim != self.head_dim:
            raise NotSupportedError(
                f"[gguf] key heads of {self.head_dim} channels, value heads of {vdim}: only equal sizes are supported"
            )
        self.rope_dims = num("rope.dimension_count", self.head_dim)
        if self.rope_dims % 2 or not 0 < self.rope_dims <= self.head_dim:
            raise DataError(
                f"[gguf] rope.dimension_count {self.rope_dims} must be even and within the head size {self.head_dim}"
            )
        read_rope_scaling(self, f, arch)
        emb = f.tensors.get("token_embd.weight")
        if emb is None:
            raise DataError(f"[gguf] {f.path} has no token_embd.weight tensor")
        self.vocab = int(f.get(f"{arch}.vocab_size", emb[1][0]))
        self.window, self.attn_softcap, self.final_softcap = 0, 0.0, 0.0
        spec.configure(self, num)
        if self.window < 0 or self.attn_softcap < 0 or self.final_softcap < 0:
            raise DataError("[gguf] the sliding window and soft-caps must not be negative")
        self.windows = [self.window if spec.sliding(self, i) else 0 for i in range(self.n_layers)]
        self.layer_ropes = [spec.layer_rope(self, i) for i in range(self.n_layers)]
        self.attn_scale = spec.attn_scale(self)

    def __repr__(self) -> str:
        return (
            f"LlamaConfig(arch={self.arch}, layers={self.n_layers}, hidden={self.hidden}, ffn={self.ffn}, "
            f"heads={self.n_heads}, kv_heads={self.n_kv_heads}, head_dim={self.head_dim}, vocab={self.vocab}, "
            f"rope_base={self.rope_base}, rope_dims={self.rope_dims}, window={self.window})"
        )


class Weight:
    """One tensor of the model: `q` (a QuantizedWeight), `blocks` (a BlockWeight) or `dense`
    (float32/float16 ndarray)."""

    __slots__ = ("name", "kind", "shape", "q", "dense", "blocks")

    def __init__(
        self,
        name: str,
        kind: str,
        shape: Sequence[int],
        q: QuantizedWeight | None = None,
        dense: npt.NDArray[Any] | None = None,
        blocks: BlockWeight | None = None,
    ) -> None:
        self.name, self.kind, self.shape, self.q, self.dense, self.blocks = name, kind, shape, q, dense, blocks

    @property
    def nbytes(self) -> int | None:
        for x in (self.q, self.blocks, self.dense):
            if x is not None:
                return x.nbytes
        return None


def load_weight(f: GGUFFile, name: str, shape: Sequence[int]) -> Weight:
    """Tensor `name` of GGUFFile f, checked to have numpy shape `shape`, repacked for the GPU."""
    if name not in f.tensors:
        raise DataError(f"[gguf] {f.path} has no tensor {name!r}")
    kind, got, data = f.tensors[name]
    if tuple(got) != tuple(shape):
        raise DataError(f"[gguf] tensor {name!r} has shape {list(got)}, expected {list(shape)}")
    if kind == "F32":
        return Weight(name, kind, shape, dense=np.asarray(data, dtype=np.float32).reshape(shape))
    if kind == "F16" and (len(shape) != 2 or shape[1] % BLOCK_TYPES[kind][0]):
        return Weight(name, kind, shape, dense=np.asarray(data, dtype=np.float16).reshape(shape))
    if kind not in SUPPORTED_TYPES:
        raise NotSupportedError(
            f"[gguf] tensor {name!r} has type {kind}, which is not supported (supported: {', '.join(SUPPORTED_TYPES)})"
        )
    if kind == "BF16" and (len(shape) != 2 or shape[1] % BLOCK_TYPES[kind][0]):
        # vectors (norms) and odd rows: float32 on the host, exact (a bfloat16 is an f32's high half)
        bits = np.ascontiguousarray(data).view(np.uint16).astype(np.uint32) << 16
        return Weight(name, kind, shape, dense=bits.view(np.float32).reshape(shape))
    if len(shape) != 2:
        raise NotSupportedError(f"[gguf] tensor {name!r}: only 2-D tensors may be quantized ({kind})")
    if kind in BLOCK_TYPES:
        return Weight(name, kind, shape, blocks=BlockWeight(kind, data, shape[0], shape[1]))
    return Weight(name, kind, shape, q=repack(kind, data, shape[0], shape[1]))
