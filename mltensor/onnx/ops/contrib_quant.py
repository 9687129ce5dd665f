"""onnxruntime's block-quantized weight operators (com.microsoft): MatMulNBits and
GatherBlockQuantized, lowered to ops/nbits.py's kernels with the packed weights uploaded as they
are (a 4-bit model's weights stay 4-bit on the GPU)."""

import numpy as np

from ..errors import unsupported
from ._helpers import X, const, prod
from ._registry import op

MS = "com.microsoft"


def _words(arr):
    """The packed bytes as little-endian u32 words (a view when their count is a multiple of 4,
    as B's always is: weights read in place from the model file stay uncopied)."""
    a = np.ascontiguousarray(arr, dtype=np.uint8).reshape(-1)
    if a.size % 4:
        a = np.concatenate([a, np.zeros(4 - a.size % 4, np.uint8)])
    return a.view("<u4")


def _packed_const(im, v, what, nbytes):
    """A packed uint8 initializer of `nbytes` bytes as a uint32 constant operand."""
    v = const(im, v, f"{what} (packed weights must be initializers)")
    if v.dtype != np.uint8:
        unsupported(f"{what} of type {v.dtype} is not supported (packed uint8 expected)")
    if v.size != nbytes:
        unsupported(f"{what} holds {v.size} bytes (shape {list(v.shape)}), expected {nbytes}")
    return im.b.constant(_words(v))


def _float_param(im, v, a_type, n, what):
    """Scales or float zero points: a flat [n] operand of the compute type."""
    if isinstance(v, np.ndarray):
        if v.dtype.kind != "f" or v.dtype == np.float64:
            unsupported(f"{what} of type {v.dtype} is not supported")
        if v.size != n:
            unsupported(f"{what} has shape {list(v.shape)}, expected {n} values")
        return X(im, np.ascontiguousarray(v.reshape(-1)).astype(a_type, copy=False))
    x = X(im, v)
    if x.data_type != a_type:
        unsupported(f"{what} of type {x.data_type} differs from the input's {a_type}")
    if prod(x.shape) != n:
        unsupported(f"{what} has shape {list(x.shape)}, expected {n} values")
    return im.b.reshape(x, [n]) if tuple(x.shape) != (n,) else x


def _zero_points(im, zp, a_type, rows, kb, bits, what):
    """(operand, zp_mode) of an optional zero point input: packed uint8 like the weights (one row
    of ceil(kb * bits / 8) bytes per quantized row) or float like the scales."""
    if zp is None:
        return None, "none"
    if isinstance(zp, np.ndarray) and zp.dtype == np.uint8:
        return _packed_const(im, zp, what, rows * (-(-kb * bits // 8))), "packed"
    if not isinstance(zp, np.ndarray) and X(im, zp).data_type == "uint8":
        unsupported(f"{what} computed at run time (packed zero points must be initializers)")
    return _float_param(im, zp, a_type, rows * kb, what), "float"


def _check_bits(name, bits, block_size, allowed=(4, 8)):
    if bits not in allowed:
        unsupported(f"{name} attribute bits={bits} is not supported ({', '.join(map(str, allowed))} are)")
    if not 16 <= block_size <= 256 or block_size & (block_size - 1):
        unsupported(f"{name} attribute block_size={block_size} is not supported (a power of two in 16..256)")


@op(f"{MS}.MatMulNBits", attrs=("K", "N", "bits", "block_size", "accuracy_level"))
def _matmul_nbits(im, node, ins, attrs):
    # accuracy_level lets onnxruntime compute in int8 / f16; we always accumulate in f32, at least
    # as accurate as every level
    K, N = int(attrs["K"]), int(attrs["N"])
    bits, bs = int(attrs.get("bits", 4)), int(attrs["block_size"])
    _check_bits("MatMulNBits", bits, bs, (2, 4, 8))
    a = X(im, ins[0])
    if a.data_type not in ("float32", "float16"):
        unsupported(f"MatMulNBits input A of type {a.data_type} is not supported")
    if a.shape[-1] != K:
        unsupported(f"MatMulNBits input A's last dimension {a.shape[-1]} differs from attribute K={K}")
    kb = -(-K // bs)
    row = kb * bs * bits // 8  # bytes of one column's packed weights
    B = const(im, ins[1], "MatMulNBits input B (packed weights must be initializers)")
    if B.dtype != np.uint8 or B.size != N * row:
        unsupported(
            f"MatMulNBits input B of type {B.dtype} and shape {list(B.shape)} is not supported "
            f"(uint8 [{N}, {kb}, {row // kb}] expected)"
        )
    sc, zp = ins[2], ins[3] if len(ins) > 3 else None
    g_idx = ins[4] if len(ins) > 4 else None
    bias = ins[5] if len(ins) > 5 else None
    packed_zp = isinstance(zp, np.ndarray) and zp.dtype == np.uint8
    if g_idx is not None:
        g = const(im, g_idx, "MatMulNBits g_idx")
        if g.size != K or not np.array_equal(g.reshape(-1), np.arange(K) // bs):
            unsupported(
                "MatMulNBits input g_idx other than the trivial k // block_size (act-order "
                "group reordering) is not supported"
            )
        if packed_zp:
            # onnxruntime's CPU kernel ignores packed zero points when g_idx is given (its act-order
            # path uses the default 2^(bits-1)) while the operator's definition applies them:
            # refused rather than silently matching one of the two
            unsupported(
                "MatMulNBits input g_idx together with packed uint8 zero_points is not "
                "supported (onnxruntime ignores the zero points there)"
            )
    zpb = -(-kb * bits // 8)  # bytes of one column's packed zero points
    for v, n_want, what in (
        (sc, N * kb, "scales"),
        (zp, N * (zpb if packed_zp else kb), "zero_points"),
        (bias, N, "bias"),
    ):
        if isinstance(v, np.ndarray) and v.size != n_want:
            unsupported(f"MatMulNBits {what} has shape {list(v.shape)}, expected {n_want} values")

    def piece(n0, n1):
        """The product with output columns n0..n1 (their packed rows, scales, zero points)."""
        n = n1 - n0
        whole = n == N
        rows = lambda v, w: v if whole else np.asarray(v).reshape(N, w)[n0:n1]  # noqa: E731
        packed = im.b.constant(_words(rows(B, row)))
        scales = _float_param(im, rows(sc, kb), a.data_type, n * kb, "MatMulNBits scales")
        if zp is None:
            z, mode = None, "none"
        elif packed_zp:
            z, mode = _packed_const(im, rows(zp, zpb), "MatMulNBits zero_points", n * zpb), "packed"
        else:
            z, mode = _zero_points(im, rows(zp, kb), a.data_type, n, kb, bits, "MatMulNBits zero_points")
        bb = None if bias is None else _float_param(im, rows(bias, 1), a.data_type, n, "MatMulNBits bias")
        return im.b._matmul_nbits(
            a, packed, scales, K=K, N=n, bits=bits, block_size=bs, zero_points=z, zp_mode=mode, bias=bb
        )

    if N * row <= im.ctx._max_bytes:
        return piece(0, N)
    # weights above the largest binding (a large vocabulary's output projection): one product per
    # slice of columns, concatenated
    if not all(v is None or isinstance(v, np.ndarray) for v in (sc, zp, bias)):
        unsupported(
            f"MatMulNBits input B of {N * row} bytes exceeds the largest binding and its scales, "
            "zero points or bias are computed at run time (they must be initializers to split it)"
        )
    step = max(1, im.ctx._max_bytes // row)
    outs = [piece(n0, min(N, n0 + step)) for n0 in range(0, N, step)]
    return im.b.concat(outs, len(a.shape) - 1)


def _pack(q, bits):
    """Values (non-negative ints, last axis) packed onnxruntime's way: 8 / bits a byte, low bits
    first, the last byte of each row padded with zeros."""
    q = np.asarray(q, np.uint8)
    per = 8 // bits
    pad = -q.shape[-1] % per
    if pad:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (pad,), np.uint8)], -1)
    out = np.zeros(q.shape[:-1] + (q.shape[-1] // per,), np.uint8)
    for e in range(per):
        out |= q[..., e::per] << np.uint8(e * bits)
    return out


def _int4_table(im, data, zp, bits, kb):
    """int4 / uint4 tensors (one value an element): (table, zero point operand, zp mode) in the
    uint8 layout. Signed values are stored offset by 8 (as uint4) and so are their zero points
    (default 0 becomes 8): (q + 8) - (zp + 8) is exactly q - zp."""
    kind = data.dtype.name
    if bits != 4:
        unsupported(f"GatherBlockQuantized attribute bits={bits} with {kind} data is not supported (4 is)")
    off = 8 if kind == "int4" else 0
    q = data.astype(np.int16) + off
    table = im.b.constant(_words(_pack(q.reshape(-1), 4)))  # rows back to back, as the tensor is
    if zp is None:
        if off:
            return table, None, "none"  # the default zero point 8
        z = np.zeros((data.shape[0], kb), np.int16)
    else:
        z = const(im, zp, "GatherBlockQuantized zero_points")
        if z.dtype != data.dtype or z.size != data.shape[0] * kb:
            unsupported(
                f"GatherBlockQuantized zero_points of type {z.dtype} and shape {list(z.shape)} do "
                f"not match {kind} data with {kb} blocks a row"
            )
        z = z.astype(np.int16).reshape(data.shape[0], kb) + off
    return table, im.b.constant(_words(_pack(z, 4))), "packed"


@op(f"{MS}.GatherBlockQuantized", attrs=("gather_axis", "quantize_axis", "block_size", "bits"))
def _gather_block_quantized(im, node, ins, attrs):
    data = ins[0]
    bits, bs = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    _check_bits("GatherBlockQuantized", bits, bs)
    if not isinstance(data, np.ndarray):
        unsupported("GatherBlockQuantized data computed at run time (quantized tables must be initializers)")
    if data.dtype != np.uint8 and data.dtype.name not in ("int4", "uint4"):
        unsupported(f"GatherBlockQuantized data of type {data.dtype} is not supported (uint8, int4, uint4 are)")
    if data.ndim != 2:
        unsupported(f"GatherBlockQuantized data of rank {data.ndim} is not supported (rank 2 is)")
    ga, qa = int(attrs.get("gather_axis", 0)), int(attrs.get("quantize_axis", 1))
    if ga not in (0, -2):
        unsupported(f"GatherBlockQuantized attribute gather_axis={ga} is not supported (0 is)")
    if qa not in (1, -1):
        unsupported(f"GatherBlockQuantized attribute quantize_axis={qa} is not supported (the last axis is)")
    V = data.shape[0]
    sc = ins[2]
    s_type = sc.dtype.name if isinstance(sc, np.ndarray) else X(im, sc).data_type
    if s_type not in ("float32", "float16"):
        unsupported(f"GatherBlockQuantized scales of type {s_type} are not supported")
    zp_in = ins[3] if len(ins) > 3 else None
    if data.dtype == np.uint8:
        H = data.shape[1] * 8 // bits  # uint8 data holds 8 / bits values a byte, low bits first
        kb = -(-H // bs)
        table = _packed_const(im, data, "GatherBlockQuantized data", V * H * bits // 8)
        zp, mode = _zero_points(im, zp_in, s_type, V, kb, bits, "GatherBlockQuantized zero_points")
    else:
        H = data.shape[1]
        kb = -(-H // bs)
        table, zp, mode = _int4_table(im, data, zp_in, bits, kb)
    scales = _float_param(im, sc, s_type, V * kb, "GatherBlockQuantized scales")
    idx = ins[1]
    if isinstance(idx, np.ndarray):
        if idx.dtype.kind not in "iu":
            unsupported(f"GatherBlockQuantized indices of type {idx.dtype} are not supported")
        # clamped into [-V, V) at load (the kernel wraps negative ones and clamps the same way)
        idx_op = X(im, np.clip(idx.astype(np.int64), -V, V - 1).astype(np.int32))
    else:
        idx_op = X(im, idx)
        if idx_op.data_type not in ("int32", "int64"):
            unsupported(f"GatherBlockQuantized indices of type {idx_op.data_type} are not supported")
        if idx_op.data_type == "int64":
            # indices beyond int32 are out of range of any table the kernels can bind
            idx_op = im.b.cast(im.b.clamp(idx_op, min_value=float(-V), max_value=float(V - 1)), "int32")
    return im.b._gather_nbits(table, idx_op, scales, V=V, H=H, bits=bits, block_size=bs, zero_points=zp, zp_mode=mode)
