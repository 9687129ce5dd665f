"""Block-quantized 2-, 4- and 8-bit weights that stay packed on the GPU (shaders/matmul_nbits.wgsl):
internal operators behind onnxruntime's com.microsoft MatMulNBits and GatherBlockQuantized
(onnx/ops/contrib_quant.py). They are not WebNN operators (leading underscore).

`_matmul_nbits`: out[..., n] = sum_k a[..., k] * (q[n, k] - zp[n, k / bs]) * scale[n, k / bs]
(+ bias[n]), with q packed as onnxruntime packs it: row n of B is k_blocks * block_size values,
`bits` each, low bits first, read here as little-endian u32 words (a `uint32` operand holding the
packed bytes as they are). Zero points: none (2^(bits-1)), packed like B (a `uint32` operand of
the packed bytes, one row of ceil(k_blocks * bits / 8) bytes per n) or float (float32 or
float16, one per block). The scales may be float16 next to float32 activations (GGUF's are:
2 bytes a block on the GPU); the kernels widen both to f32 as they load them. The weights are decoded in the kernels' loads, never expanded in memory:
a GEMV path for M <= 4 (decoding) and a shared-memory tiled path above.

`_gather_nbits`: rows of a [V, H] 2/4/8-bit matrix quantized in blocks along H (its rows packed
back to back, no padding), gathered by index and dequantized (embedding tables): only the
gathered rows are decoded.
"""

import math

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, low, smin, wgsl
from ..dynamic.kernels import grid
from ..ir.registry import MAX_RANK, builder_op, lowering, register
from ..runtime.wgsl import LOOP_BUDGET, WORKGROUP, Binding, cpu_device, Kernel, store_fn
from ._checks import check_support, same_type

FLOAT = dtypes.FLOATS
GEMV_MAX_M = 4
ZP_MODES = ("none", "packed", "float")

# Builder methods taking operands with dynamic dimensions: the rows of A (tokens), the indices
DYNAMIC_OPS = frozenset({"_matmul_nbits", "_gather_nbits"})

register(
    "_matmul_nbits",
    {"a": FLOAT, "b": ("uint32",), "scales": FLOAT, "zero_points": FLOAT + ("uint32",), "bias": FLOAT, "output": FLOAT},
    ranks={"a": (1, MAX_RANK), "b": (1, 1), "scales": (1, 1), "zero_points": (1, 1), "bias": (1, 1)},
)
register(
    "_gather_nbits",
    {"data": ("uint32",), "indices": ("int32",), "scales": FLOAT, "zero_points": FLOAT + ("uint32",), "output": FLOAT},
    ranks={"data": (1, 1), "scales": (1, 1), "zero_points": (1, 1)},
)


def _words(where, what, x, n):
    if x.shape != (n,):
        raise TypeError(f"[{where}] {what} must hold {n} packed u32 words, got shape {list(x.shape)}")


def _geometry(where, K, N, bits, block_size, names=("K", "N")):
    """(blocks a quantized row, u32 words of a row padded to whole blocks) of N rows of K values."""
    for what, v in ((names[0], K), (names[1], N), ("bits", bits), ("block_size", block_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise TypeError(f"[{where}] {what} must be a positive integer, got {v!r}")
    if bits not in (2, 4, 8):
        raise TypeError(f"[{where}] bits must be 2, 4 or 8, got {bits}")
    if block_size < 16 or block_size & (block_size - 1):
        raise TypeError(f"[{where}] block_size must be a power of two >= 16, got {block_size}")
    kb = -(-K // block_size)
    return kb, kb * block_size * bits // 32  # blocks per row, u32 words per row


def _zp_bytes(kb, bits):
    """Bytes of one row of packed zero points (kb blocks, `bits` each, the last byte padded)."""
    return -(-kb * bits // 8)


def _check_zp(where, zero_points, zp_mode, scales, n_rows, kb, bits):
    if zp_mode not in ZP_MODES:
        raise TypeError(f"[{where}] zp_mode must be one of {', '.join(ZP_MODES)}, got {zp_mode!r}")
    if (zero_points is None) != (zp_mode == "none"):
        raise TypeError(f"[{where}] zero_points must be given exactly when zp_mode is not 'none'")
    if zp_mode == "packed":
        if zero_points.data_type != "uint32":
            raise TypeError(f"[{where}] packed zero_points must be uint32 words")
        _words(where, "zero_points", zero_points, cdiv(n_rows * _zp_bytes(kb, bits), 4))
    elif zp_mode == "float":
        if zero_points.data_type not in ("float32", "float16"):
            raise TypeError(f"[{where}] float zero_points must be float32 or float16, got {zero_points.data_type}")
        if zero_points.shape != scales.shape:
            raise TypeError(
                f"[{where}] float zero_points shape {list(zero_points.shape)} differs from "
                f"scales shape {list(scales.shape)}"
            )


@builder_op
def _matmul_nbits(
    b, a, packed, scales, *, K, N, bits, block_size, zero_points=None, zp_mode="none", bias=None, label=None
):
    where = "_matmul_nbits"
    for what, v in (("a", a), ("b", packed), ("scales", scales), ("zero_points", zero_points), ("bias", bias)):
        if v is not None:
            b._operand(v, where, what)
    check_support(where, a=a, b=packed, scales=scales, zero_points=zero_points, bias=bias)
    # (scales and float zero points may be float16 next to float32 activations: GGUF's scales
    # are float16, kept at 2 bytes a block; the kernels widen them to f32 as they load)
    same_type(where, ("a", a), ("bias", bias))
    kb, wpr = _geometry(where, K, N, bits, block_size)
    if a.shape[-1] != K:
        raise TypeError(f"[{where}] the last dimension of a ({a.shape[-1]}) must be K ({K})")
    _words(where, "b", packed, N * wpr)
    if scales.shape != (N * kb,):
        raise TypeError(f"[{where}] scales must have shape [{N * kb}], got {list(scales.shape)}")
    _check_zp(where, zero_points, zp_mode, scales, N, kb, bits)
    if bias is not None and bias.shape != (N,):
        raise TypeError(f"[{where}] bias must have shape [{N}], got {list(bias.shape)}")
    attrs = {"K": K, "N": N, "bits": bits, "block_size": block_size, "zp_mode": zp_mode, "has_bias": bias is not None}
    ins = [a, packed, scales] + [x for x in (zero_points, bias) if x is not None]
    return b._emit1(where, ins, attrs, a.data_type, tuple(a.shape[:-1]) + (N,), label)


@builder_op
def _gather_nbits(b, data, indices, scales, *, V, H, bits, block_size, zero_points=None, zp_mode="none", label=None):
    """Rows `indices` (int32, negative counted from the end, clamped into [0, V)) of the [V, H]
    matrix packed in `data` (its V * H values back to back, `bits` each, low bits first; blocks
    of block_size along H, the last one possibly short), dequantized: shape indices.shape + [H],
    the scales' type."""
    where = "_gather_nbits"
    for what, v in (("data", data), ("indices", indices), ("scales", scales), ("zero_points", zero_points)):
        if v is not None:
            b._operand(v, where, what)
    check_support(where, data=data, indices=indices, scales=scales, zero_points=zero_points)
    kb, _ = _geometry(where, H, V, bits, block_size, ("H", "V"))
    if V * H >= 1 << 32:
        raise TypeError(f"[{where}] a table of {V} x {H} values exceeds 2^32 values")
    _words(where, "data", data, cdiv(V * H * bits, 32))  # rows packed back to back, no padding
    if scales.shape != (V * kb,):
        raise TypeError(f"[{where}] scales must have shape [{V * kb}], got {list(scales.shape)}")
    _check_zp(where, zero_points, zp_mode, scales, V, kb, bits)
    attrs = {"V": V, "H": H, "bits": bits, "block_size": block_size, "zp_mode": zp_mode}
    ins = [data, indices, scales] + ([zero_points] if zero_points is not None else [])
    return b._emit1(where, ins, attrs, scales.data_type, tuple(indices.shape) + (H,), label)


# -- lowering -----------------------------------------------------------------------------------


def _quant_params(attrs, cols):
    """Template parameters of the packed layout: quantized rows of `cols` values."""
    bits, bs = attrs["bits"], attrs["block_size"]
    kb = -(-cols // bs)
    return {
        "BITS": bits,
        "MASK": (1 << bits) - 1,
        "VPW": 32 // bits,
        "BS": bs,
        "KB": kb,
        "WPR": kb * bs * bits // 32,
        "ZPB": _zp_bytes(kb, bits),
        "zp_mode": attrs["zp_mode"],
        "ZP_DEFAULT": float(1 << (bits - 1)),
        "KIND": "",  # a GGUF block type (ops/blocks.py) decodes B instead of the packed words
    }


@lowering("_matmul_nbits")
def _lower_matmul_nbits(kc, node):
    at = node.attrs
    a, packed, scales = node.inputs[:3]
    rest = list(node.inputs[3:])
    zp = rest.pop(0) if at["zp_mode"] != "none" else None
    bias = rest.pop(0) if at["has_bias"] else None
    out = kc.out(node)
    K, N = at["K"], at["N"]
    M = math.prod(a.shape[:-1])
    t = kc.wtype(a)
    p = _quant_params(at, K)
    # M may be a size known at dispatch (tokens of a sequence): SM is its WGSL, the constant M
    # where static; check_m: rows past M are not loaded (the GEMV kernel's 4 lanes)
    dyn = isinstance(M, Sym)
    p.update(
        N=N,
        K=K,
        ST=store_fn(t),
        has_bias=bias is not None,
        SM=wgsl(M) if dyn else "M",
        M=None if dyn else M,
        check_m=dyn,
        MROWS=4 if dyn else M,
        gate="",
    )
    bindings = [Binding("a", t), Binding("b", "u32"), Binding("scales", kc.wtype(scales))]
    args = [a, packed, scales]
    if zp is not None:
        bindings.append(Binding("zp", kc.wtype(zp)))
        args.append(zp)
    if bias is not None:
        bindings.append(Binding("bias", kc.wtype(bias)))
        args.append(bias)
    bindings.append(Binding("out", t, True))
    args.append(out)
    name = (
        f"matmul_nbits{at['bits']}_{t}_{M}x{K}x{N}_bs{at['block_size']}_{at['zp_mode']}"
        f"{'_bias' if bias is not None else ''}"
    )
    if not dyn:
        if M <= GEMV_MAX_M:
            _gemv(kc, name, p, bindings, args, N, 1)
        else:
            tiled_launch(kc, name, p, bindings, args, M, N, M, 1)
        return
    # Sizes known at dispatch: the GEMV kernel for M <= 4 and the tiled one above, each launched
    # with a workgroup count that is 0 outside its range (and returning at once there too)
    lo, hi = max(1, low(M)), high(M)
    big = 1 if lo > GEMV_MAX_M else smin(M // (GEMV_MAX_M + 1), 1)  # 1 where M > 4, else 0
    if lo <= GEMV_MAX_M:
        gate = "" if hi <= GEMV_MAX_M else f"{wgsl(M)} <= {GEMV_MAX_M}u"
        _gemv(kc, name, dict(p, gate=gate), bindings, args, N, 1 if hi <= GEMV_MAX_M else 1 - big)
    if hi > GEMV_MAX_M:
        gate = "" if lo > GEMV_MAX_M else f"{wgsl(M)} > {GEMV_MAX_M}u"
        tiled_launch(kc, name, dict(p, gate=gate), bindings, args, M, N, hi, big)


def _gemv(kc, name, p, bindings, args, N, on):
    # decoding: a workgroup owns 4 output columns, its 64 threads split the row's words
    p = dict(p, path="gemv", COLS=cdiv(N, 4))
    # (loops: the row's words over 64 threads, the tree; LOOP_BUDGET in runtime/wgsl.py)
    kc.launch(
        Kernel(f"{name}_gemv", "matmul_nbits.wgsl", p, bindings),
        args,
        grid(cdiv(N, 4) * on),
        iters=cdiv(p["KB"] * p["BS"] // p["VPW"], 64) + 16,
    )


def tiled_launch(kc, name, p, bindings, args, M, N, m_max, on):
    # Tiles: on CPU adapters lavapipe's GEMM shape (64 threads, 8x8 outputs each where the
    # sizes fill it: ops/matmul.lavapipe_config), elsewhere 256 threads with 4x4 outputs each.
    # Both fit WebGPU's default 16 KiB of workgroup memory with BK = 32. Chosen at the largest M.
    if cpu_device(kc.device):
        tx = ty = 8
        rm = 8 if m_max >= 64 else 4
        rn = 8 if N >= 64 else 4
    else:
        tx = ty = 16
        rm = rn = 4
    bm, bn = ty * rm, tx * rn
    tiles = cdiv(M, bm) * cdiv(N, bn)
    p = dict(
        p,
        path="tiled",
        SPLIT=1,
        KCHUNK=0,
        TX=tx,
        TY=ty,
        RM=rm,
        RN=rn,
        BK=32,
        TILES_N=cdiv(N, bn),
        TILES=wgsl(tiles) if isinstance(tiles, Sym) else f"{tiles}u",
    )
    # loops per BK step: the step, A's and B's staging, the products (runtime/wgsl.py LOOP_BUDGET,
    # a loop of n counting n + 1). Past the budget (K ~26000 on lavapipe's tile) K is cut into
    # SPLIT chunks of KCHUNK (whole BK steps), each summed into scratch, then added in order by a
    # thread per output, which stores (with the bias)
    per = 1 + cdiv(32 * bm, tx * ty) + 1 + cdiv(32 // p["VPW"] * bn, tx * ty) + 1 + 33
    K = p["K"]
    split = 1
    while cdiv(K, 32 * split) * per + 16 > LOOP_BUDGET:
        split += 1
    kchunk = cdiv(K, 32 * split) * 32
    split = cdiv(K, kchunk)
    p = dict(p, SPLIT=split, KCHUNK=kchunk)
    if split == 1:
        kc.launch(
            Kernel(f"{name}_t{bm}x{bn}", "matmul_nbits.wgsl", p, bindings),
            args,
            grid(tiles * on),
            iters=cdiv(K, 32) * per + 16,
        )
        return
    part = kc.scratch(4 * split * m_max * N)
    kc.launch(
        Kernel(f"{name}_t{bm}x{bn}_s{split}", "matmul_nbits.wgsl", p, bindings + [Binding("part", "f32", True)]),
        args + [part],
        grid(tiles * split * on),
        iters=cdiv(kchunk, 32) * per + 16,
    )
    kc.launch(
        Kernel(
            f"{name}_t{bm}x{bn}_s{split}_reduce",
            "matmul_nbits.wgsl",
            dict(p, path="reduce"),
            bindings + [Binding("part", "f32")],
        ),
        args + [part],
        grid(cdiv(M * N, WORKGROUP) * on),
        iters=split + 1,
    )


@lowering("_gather_nbits")
def _lower_gather_nbits(kc, node):
    at = node.attrs
    data, idx, scales = node.inputs[:3]
    zp = node.inputs[3] if at["zp_mode"] != "none" else None
    out = kc.out(node)
    V, H = at["V"], at["H"]
    rows = math.prod(idx.shape)
    t = kc.wtype(out)
    p = _quant_params(at, H)
    # one thread per output element (a row of the table is not word-aligned when H * bits is
    # not a multiple of 32): only the gathered rows are read and decoded
    n = rows * H
    p.update(path="gather", H=H, V=V, n=n, ST=store_fn(t))
    bindings = [Binding("b", "u32"), Binding("idx", "i32"), Binding("scales", kc.wtype(scales))]
    args = [data, idx, scales]
    if zp is not None:
        bindings.append(Binding("zp", kc.wtype(zp)))
        args.append(zp)
    bindings.append(Binding("out", t, True))
    args.append(out)
    name = f"gather_nbits{at['bits']}_{t}_{rows}x{V}x{H}_bs{at['block_size']}_{at['zp_mode']}"
    kc.launch(Kernel(name, "matmul_nbits.wgsl", p, bindings), args, grid(cdiv(n, WORKGROUP)))
