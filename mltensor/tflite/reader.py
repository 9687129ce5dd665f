"""Read a .tflite flatbuffer (with the `tflite` package) into plain Python objects.

Only what the importer needs: tensors (name, type, shape, signature, constant data, quantization)
and operators (name, custom code, inputs, outputs, options table, custom options bytes) of every
subgraph. The Model is subgraph 0 (the one a model runs); `subgraphs` lists them all (itself
first): the branches and bodies of IF / WHILE and CALL_ONCE's initialization subgraph.
"""

import os
import struct
from dataclasses import dataclass, field

import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

from ..errors import DataError

IDENTIFIER = b"TFL3"

# TFLite TensorType -> (WebNN data type or None, numpy dtype)
TENSOR_TYPES = {
    tflite.TensorType.FLOAT32: ("float32", np.float32),
    tflite.TensorType.FLOAT16: ("float16", np.float16),
    tflite.TensorType.INT32: ("int32", np.int32),
    tflite.TensorType.UINT8: ("uint8", np.uint8),
    tflite.TensorType.INT64: ("int64", np.int64),
    tflite.TensorType.INT8: ("int8", np.int8),
    tflite.TensorType.UINT32: ("uint32", np.uint32),
    tflite.TensorType.UINT64: ("uint64", np.uint64),
    tflite.TensorType.INT16: (None, np.int16),
    tflite.TensorType.BOOL: (None, np.bool_),
    tflite.TensorType.FLOAT64: (None, np.float64),
    tflite.TensorType.RESOURCE: (None, None),  # a resource variable's handle (VAR_HANDLE)
}
TYPE_NAMES = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}


@dataclass
class Tensor:
    index: int
    name: str
    type: int  # tflite.TensorType
    shape: tuple
    signature: tuple  # shape_signature: -1 marks a free dimension
    data: np.ndarray = None  # constant value (in the tensor's shape), None for activations
    scale: np.ndarray = None  # quantization (None when not quantized)
    zero_point: np.ndarray = None
    quantized_dimension: int = 0
    is_variable: bool = False  # a variable tensor (an LSTM's state: LiteRT keeps it between invokes)

    @property
    def data_type(self):
        if self.type == tflite.TensorType.INT16 and self.scale is not None:
            return "int16"  # a 16x8 model's quantized activation: computed as its real values
        return TENSOR_TYPES.get(self.type, (None, None))[0]

    @property
    def type_name(self):
        return TYPE_NAMES.get(self.type, str(self.type))


@dataclass
class Operator:
    index: int
    name: str  # builtin name ("CONV_2D") or "CUSTOM"
    custom_code: str  # custom operators' code ("Convolution2DTransposeBias"), else None
    version: int
    inputs: list  # tensor indices, -1 for an omitted optional input
    outputs: list
    options: object = None  # the builtin options table (tflite.*Options), or None
    custom_options: bytes = b""
    subgraph: int = 0  # the subgraph it belongs to

    @property
    def display(self):
        name = f"CUSTOM '{self.custom_code}'" if self.custom_code is not None else self.name
        return name if not self.subgraph else f"{name}, subgraph {self.subgraph}"


@dataclass
class Model:
    """One subgraph; the one `read` returns is subgraph 0, whose `subgraphs` lists every subgraph
    of the file (each of them shares that list)."""

    tensors: list
    operators: list
    inputs: list  # tensor indices
    outputs: list
    description: str = ""
    extra: dict = field(default_factory=dict)
    subgraphs: list = field(default_factory=list)
    name: str = ""
    index: int = 0


def load_bytes(source):
    """A path (str / os.PathLike), bytes, bytearray or memoryview -> bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read()
    raise TypeError(f"[tflite] expected a path, bytes or bytearray, got {type(source).__name__}")


def is_tflite(data: bytes | bytearray | memoryview) -> bool:
    """Whether `data` is a TFLite flatbuffer: it carries the identifier ``b"TFL3"`` at bytes 4..8.

    Parameters
    ----------
    data : bytes, bytearray or memoryview
        A file's bytes (the first 8 are enough).

    Returns
    -------
    bool
        True for a TFLite model.
    """
    return len(data) >= 8 and bytes(data[4:8]) == IDENTIFIER


# Builtin options: the union type number -> the options class (by name, as in the schema).
_OPTION_CLASSES = {
    v: getattr(tflite, k)
    for k, v in vars(tflite.BuiltinOptions).items()
    if not k.startswith("_") and hasattr(tflite, k)
}


def _options(op):
    t = op.BuiltinOptionsType()
    if t == 0:
        return None
    table = op.BuiltinOptions()
    cls = _OPTION_CLASSES.get(t)
    if table is None or cls is None:
        return None
    opt = cls()
    opt.Init(table.Bytes, table.Pos)
    # Touch every field now (the table is read lazily): a corrupt offset then fails here, where the
    # error can name the operator's options, instead of deep inside a converter.
    for attr in dir(cls):
        fn = getattr(opt, attr)
        getter = attr[:1].isupper() and not attr.startswith(("Init", "GetRootAs")) and "BufferHas" not in attr
        if getter and callable(fn) and fn.__code__.co_argcount == 1:
            fn()
    return opt


# Caps that keep a corrupted file from asking for absurd allocations (a flipped bit in a shape or a
# dense_size can claim terabytes): no real model comes near them.
MAX_ELEMENTS = 1 << 28  # per tensor (1 GiB of float32)
MAX_RANK = 8


def _buffer_data(model, raw, index):
    if index <= 0:
        return None
    if index >= model.BuffersLength():
        raise DataError(f"buffer index {index} is out of range (the model has {model.BuffersLength()} buffers)")
    buf = model.Buffers(index)
    off, size = buf.Offset(), buf.Size()
    if off > 1:  # large models keep buffers after the flatbuffer
        if off + size > len(raw):
            raise DataError(f"buffer {index} spans bytes {off}..{off + size}, past the {len(raw)}-byte file's end")
        return raw[off : off + size] if size else None
    if buf.DataLength() == 0:
        return None
    return buf.DataAsNumpy().tobytes()


def _index_vector(dm, which):
    """A DimensionMetadata's array_segments / array_indices (a union of int32/uint16/uint8 vectors)."""
    kind = dm.ArraySegmentsType() if which == "array_segments" else dm.ArrayIndicesType()
    table = dm.ArraySegments() if which == "array_segments" else dm.ArrayIndices()
    cls = {tflite.SparseIndexVector.Int32Vector: tflite.Int32Vector,
           tflite.SparseIndexVector.Uint16Vector: tflite.Uint16Vector,
           tflite.SparseIndexVector.Uint8Vector: tflite.Uint8Vector}.get(kind)  # fmt: skip
    if cls is None or table is None:
        raise DataError(f"{which} is missing or has unknown vector type {kind}")
    v = cls()
    v.Init(table.Bytes, table.Pos)
    return v.ValuesAsNumpy().astype(np.int64) if v.ValuesLength() else np.zeros(0, np.int64)


def densify(values, shape, traversal_order, block_map, dims):
    """Scatter the stored values of a sparse tensor into a dense array of `shape`.

    TFLite's sparsity format (schema.fbs SparsityParameters): the tensor of rank n is viewed as
    n + k dimensions, the last k being blocks of the original dimensions block_map[0..k); those
    are traversed in `traversal_order`, each level either DENSE (dense_size children per parent)
    or SPARSE_CSR (the children of parent p are array_indices[array_segments[p]:array_segments[p+1]]).
    `dims` is [(format, dense_size, segments or None, indices or None)] in traversal order.
    The leaves, in order, are the stored values.
    """
    n, k = len(shape), len(block_map)
    if sorted(traversal_order) != list(range(n + k)):
        raise DataError(f"traversal_order {list(traversal_order)} is not a permutation of 0..{n + k - 1}")
    if len(dims) != n + k:
        raise DataError(f"dim_metadata has {len(dims)} entries, traversal_order {n + k}")
    if any(not 0 <= b < n for b in block_map) or len(set(block_map)) != k:
        raise DataError(f"block_map {list(block_map)} does not name distinct dimensions of a rank-{n} tensor")
    level_of = {d: lvl for lvl, d in enumerate(traversal_order)}
    block = [1] * n
    for j, b in enumerate(block_map):
        block[b] = dims[level_of[n + j]][1]
        if block[b] <= 0 or shape[b] % block[b]:
            raise DataError(f"block size {block[b]} does not divide dimension {b} of size {shape[b]}")
    extent = [shape[d] // block[d] for d in range(n)] + [block[b] for b in block_map]
    pos = np.zeros(1, np.int64)
    coords = {}
    for lvl, d in enumerate(traversal_order):
        fmt, size, seg, idx = dims[lvl]
        if fmt == tflite.DimensionType.DENSE:
            if size != extent[d]:
                raise DataError(f"dense_size {size} of level {lvl} does not match its dimension's extent {extent[d]}")
            if pos.size * size > MAX_ELEMENTS:
                raise DataError(f"level {lvl} expands to {pos.size * size} elements")
            c = np.tile(np.arange(size, dtype=np.int64), pos.size)
            rep = size
            pos = (pos[:, None] * size + np.arange(size)).reshape(-1)
        elif fmt == tflite.DimensionType.SPARSE_CSR:
            if seg is None or idx is None:
                raise DataError(f"level {lvl} is SPARSE_CSR without array_segments / array_indices")
            if pos.size and (int(pos.max()) + 1 >= seg.size):
                raise DataError(f"array_segments of level {lvl} has {seg.size} entries, needs {int(pos.max()) + 2}")
            lo, hi = seg[pos], seg[pos + 1]
            counts = hi - lo
            if (counts < 0).any() or (hi > idx.size).any() or (lo < 0).any():
                raise DataError(f"array_segments of level {lvl} are not a valid partition of its {idx.size} indices")
            if counts.sum() > MAX_ELEMENTS:
                raise DataError(f"level {lvl} expands to {counts.sum()} elements")
            rep = counts
            starts = np.repeat(lo - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
            pos = np.arange(int(counts.sum()), dtype=np.int64) + starts
            c = idx[pos]
            if c.size and (c.min() < 0 or c.max() >= extent[d]):
                raise DataError(f"array_indices of level {lvl} leave [0, {extent[d]})")
        else:
            raise DataError(f"dimension format {fmt} of level {lvl} is neither DENSE nor SPARSE_CSR")
        coords = {e: np.repeat(v, rep) for e, v in coords.items()}
        coords[d] = c
    if pos.size != values.size or pos.size and int(pos.max()) >= values.size:
        raise DataError(f"the sparsity structure addresses {pos.size} values, the buffer holds {values.size}")
    dense = np.zeros(shape, values.dtype)
    full = [coords[d] * block[d] for d in range(n)]
    for j, b in enumerate(block_map):
        full[b] = full[b] + coords[n + j]
    dense[tuple(full)] = values[pos]
    return dense


def _sparsity(t):
    sp = t.Sparsity()
    if sp is None:
        return None
    order = [int(v) for v in sp.TraversalOrderAsNumpy()] if sp.TraversalOrderLength() else []
    block_map = [int(v) for v in sp.BlockMapAsNumpy()] if sp.BlockMapLength() else []
    dims = []
    for lvl in range(sp.DimMetadataLength()):
        dm = sp.DimMetadata(lvl)
        if dm.Format() == tflite.DimensionType.SPARSE_CSR:
            segments, indices = _index_vector(dm, "array_segments"), _index_vector(dm, "array_indices")
            dims.append((dm.Format(), dm.DenseSize(), segments, indices))
        else:
            dims.append((dm.Format(), dm.DenseSize(), None, None))
    return order, block_map, dims


def _nelem(shape, what):
    if len(shape) > MAX_RANK:
        raise DataError(f"{what} has rank {len(shape)} (at most {MAX_RANK} supported)")
    if any(d < 0 for d in shape):
        raise DataError(f"{what} has a negative dimension: {list(shape)}")
    n = 1
    for d in shape:
        n *= d
    if n > MAX_ELEMENTS:
        raise DataError(f"{what} has {n} elements ({list(shape)}); at most {MAX_ELEMENTS} are supported")
    return n


def read(raw, name=None):
    """Parse the flatbuffer bytes `raw` into a Model. `name` (the file's name) prefixes errors.

    Every malformed construct raises DataError naming the table and field at fault: a flatbuffer
    that points past its end, indices out of range, constant data that does not fit its shape.
    """
    src = f"[tflite] {name}: " if name else "[tflite] "
    if not is_tflite(raw):
        head = bytes(raw[4:8])
        raise DataError(f"{src}not a TFLite flatbuffer: file identifier is {head!r}, expected b'TFL3'")
    where = ["the model table"]
    try:
        return _read(raw, where)
    except DataError as e:
        raise DataError(f"{src}{where[0]}: {e}") from None
    except (struct.error, IndexError) as e:  # flatbuffers reads with struct.unpack_from / slicing
        raise DataError(
            f"{src}{where[0]}: reads past the end of the {len(raw)}-byte file (truncated, or a corrupt offset: "
            f"{type(e).__name__}: {e})"
        ) from None
    except (ValueError, TypeError, KeyError, OverflowError, AttributeError, UnicodeDecodeError, RecursionError,
            MemoryError) as e:  # fmt: skip
        raise DataError(f"{src}{where[0]}: malformed flatbuffer ({type(e).__name__}: {e})") from None


def _read(raw, where):
    m = tflite.Model.GetRootAsModel(raw, 0)
    n_sub = m.SubgraphsLength()
    if n_sub < 1:
        raise DataError("the model has no subgraph")

    codes = []
    for i in range(m.OperatorCodesLength()):
        where[0] = f"operator_codes[{i}]"
        oc = m.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        name = BUILTIN_OPCODE2NAME.get(code, f"BUILTIN_{code}")
        custom = oc.CustomCode()
        codes.append((name, custom.decode("utf-8", "replace") if custom is not None else None, oc.Version()))

    subgraphs = []
    for s in range(n_sub):
        where[0] = f"subgraph {s}"
        subgraphs.append(_subgraph(raw, m, s, codes, where))
    where[0] = "the model's description"
    main = subgraphs[0]
    main.description = (m.Description() or b"").decode("utf-8", "replace")
    for sg in subgraphs:
        sg.subgraphs = subgraphs
    return main


def _subgraph(raw, m, s, codes, where):
    sg = m.Subgraphs(s)
    tensors = []
    n_tensors = sg.TensorsLength()
    for i in range(n_tensors):
        where[0] = f"subgraph {s}, tensor {i}"
        t = sg.Tensors(i)
        name = (t.Name() or b"").decode("utf-8", "replace")
        where[0] = f"subgraph {s}, tensor {i} ('{name}')"
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        sig = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
        n = _nelem(shape, "shape")
        if len(sig) != len(shape) or any(s != -1 and s != d for s, d in zip(sig, shape)):
            raise DataError(f"shape_signature {list(sig)} does not fit shape {list(shape)}")
        tt = Tensor(i, name, t.Type(), shape, sig, is_variable=bool(t.IsVariable()))
        where[0] += ", buffer"
        data = _buffer_data(m, raw, t.Buffer())
        if data is not None:
            np_type = TENSOR_TYPES.get(t.Type(), (None, None))[1]
            if np_type is None:
                raise DataError(f"constant tensor has unsupported type {tt.type_name}")
            itemsize = np.dtype(np_type).itemsize
            if len(data) % itemsize:
                raise DataError(f"holds {len(data)} bytes, not a whole number of {tt.type_name} values")
            arr = np.frombuffer(data, dtype=np.dtype(np_type).newbyteorder("<")).astype(np_type)
            sparsity = _sparsity(t)
            if sparsity is not None:
                where[0] = f"subgraph {s}, tensor {i} ('{name}'), sparsity"
                arr = densify(arr, shape, *sparsity)
            elif arr.size != n:
                raise DataError(f"constant tensor holds {arr.size} values, its shape {list(shape)} needs {n}")
            tt.data = arr.reshape(shape)
        where[0] = f"subgraph {s}, tensor {i} ('{name}'), quantization"
        q = t.Quantization()
        if q is not None and q.ScaleLength():
            tt.scale = q.ScaleAsNumpy().astype(np.float32)
            tt.zero_point = (
                q.ZeroPointAsNumpy().astype(np.int64) if q.ZeroPointLength() else np.zeros_like(tt.scale, np.int64)
            )
            tt.quantized_dimension = q.QuantizedDimension()
            if tt.zero_point.size != tt.scale.size:
                raise DataError(f"{tt.scale.size} scales but {tt.zero_point.size} zero points")
            qd = tt.quantized_dimension
            if tt.scale.size > 1 and not (0 <= qd < len(shape) and shape[qd] == tt.scale.size):
                raise DataError(f"{tt.scale.size} per-axis scales do not fit dimension {qd} of {list(shape)}")
        tensors.append(tt)

    def tensor_list(vec, what):
        idx = [int(x) for x in vec]
        bad = [x for x in idx if not -1 <= x < n_tensors]
        if bad:
            raise DataError(f"{what} names tensor {bad[0]}, the subgraph has {n_tensors}")
        return idx

    ops = []
    for i in range(sg.OperatorsLength()):
        where[0] = f"subgraph {s}, operator {i}"
        op = sg.Operators(i)
        oi = op.OpcodeIndex()
        if not 0 <= oi < len(codes):
            raise DataError(f"opcode_index {oi} is out of range ({len(codes)} operator codes)")
        name, custom, version = codes[oi]
        where[0] = f"subgraph {s}, operator {i} ({name if custom is None or name != 'CUSTOM' else repr(custom)})"
        ins = tensor_list(op.InputsAsNumpy(), "inputs") if op.InputsLength() else []
        outs = tensor_list(op.OutputsAsNumpy(), "outputs") if op.OutputsLength() else []
        if -1 in outs:
            raise DataError("an output is tensor -1")
        copts = op.CustomOptionsAsNumpy().tobytes() if op.CustomOptionsLength() else b""
        where[0] += ", builtin options"
        ops.append(Operator(i, name, custom if name == "CUSTOM" else None, version, ins, outs, _options(op), copts, s))

    where[0] = f"subgraph {s}, inputs/outputs"
    inputs = tensor_list(sg.InputsAsNumpy(), "inputs") if sg.InputsLength() else []
    outputs = tensor_list(sg.OutputsAsNumpy(), "outputs") if sg.OutputsLength() else []
    if -1 in inputs or -1 in outputs:
        raise DataError("a subgraph input or output is tensor -1")
    name = (sg.Name() or b"").decode("utf-8", "replace")
    return Model(tensors, ops, inputs, outputs, name=name, index=s)
