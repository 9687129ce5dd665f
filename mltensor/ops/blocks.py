"""GGUF block formats (llama.cpp's K-quants, Q5_0/Q5_1, IQ4_NL/IQ4_XS, BF16, F16) read packed on the
GPU: internal operators `_matmul_blocks` and `_gather_blocks` (not WebNN: leading underscore),
used by mltensor.llm for the types `_matmul_nbits` cannot express without growing them.

The weights are the file's blocks as u32 words (`pack_blocks`), each block word-aligned: a block
whose size is 2 modulo 4 (Q5_0, IQ4_NL: 22/18 bytes with the f16 scale `d` first; Q3_K, Q6_K:
110/210 bytes with `d` last) has its `d` moved out, into f16 pairs after all the blocks. So the
GPU holds exactly the file's bytes (plus at most 2 bytes of padding), and every decode reads
aligned words and extracts bytes, nibbles and bit fields from them (shaders/blocks_decode.wgsl).
Row r of the [N, K] matrix is K / QBV consecutive blocks.

`_matmul_blocks`: out[..., n] = sum_k a[..., k] * W[n, k]. A static M <= 4 (decoding) takes a
GEMV kernel (shaders/blocks.wgsl) that decodes a unit of a block (a 64-value quarter of a K-quant
super-block, a whole 32-value block otherwise) at once: the unit's scales and mins decoded once,
nibbles and bit planes extracted as vec4s dotted with vec4 loads of a, the mins and offsets
applied to the sum of a (scale * (sum q*a) - min * (sum a)). CPU adapters give each thread two
output rows (no barriers: llm/kernels.py's measured choice; the rows share a's loads) for one
row of a; for several (a serving step, `rows_gemv`) a thread takes up to 8 rows of a (STEP_MT),
each unit's words loaded and decoded once for them, and 16 output rows sharing a's loads (each row of
a summed as alone: a row's result does not depend on the rows beside it), except
Q2_K and Q3_K (shaders/blocks_k23.wgsl: a's rows prescaled by powers of two into a scratch buffer
so that a weight is one AND and a conversion, each block's loads of a shared by 16 rows); GPUs split
a row's units over 32 threads and reduce in workgroup memory, Q4_K and Q6_K in units of 16 values
(16 threads a super-block, neighbouring threads on neighbouring words, as llama.cpp's Vulkan
mul_mat_vec_q4_k/q6_k split them; untimed on a GPU so far, checked on lavapipe by forcing it). Other M
(prompts, or M known only at dispatch without `rows_gemv`) take
`_matmul_nbits`' tiled GEMM, whose B staging decodes 4 values at a time into workgroup memory.

`_gather_blocks`: rows of a [V, H] table (embeddings) gathered by index, only those decoded.
"""

import math

import numpy as np

from ..dynamic.dims import Sym, cdiv, high, size_at_least, wgsl
from ..dynamic.kernels import grid
from ..errors import DataError, NotSupportedError
from ..ir.registry import MAX_RANK, builder_op, lowering, register
from ..runtime.wgsl import WORKGROUP, Binding, cpu_device, Kernel, store_fn
from ._checks import check_support
from .nbits import GEMV_MAX_M, tiled_launch

# kind: (values a block, bytes a block in the file, byte offset of an f16 `d` moved out of the
# block, or None). BF16, F16 and F32 are read as blocks of 32 values (64 or 128 bytes) for the same
# kernels (F32: the serving step's float32 projections, whose GEMV sums do not depend on M).
BLOCK_TYPES = {
    "Q5_0": (32, 22, 0),
    "Q5_1": (32, 24, None),
    "IQ4_NL": (32, 18, 0),
    "BF16": (32, 64, None),
    "F16": (32, 64, None),
    "F32": (32, 128, None),
    "Q2_K": (256, 84, None),
    "Q3_K": (256, 110, 108),
    "Q4_K": (256, 144, None),
    "Q5_K": (256, 176, None),
    "Q6_K": (256, 210, 208),
    "IQ4_XS": (256, 136, None),
}
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

DYNAMIC_OPS = frozenset({"_matmul_blocks", "_gather_blocks"})

register(
    "_matmul_blocks",
    {"a": ("float32",), "b": ("uint32",), "output": ("float32",)},
    ranks={"a": (1, MAX_RANK), "b": (1, 1)},
)
register(
    "_gather_blocks",
    {"data": ("uint32",), "indices": ("int32",), "output": ("float32",)},
    ranks={"data": (1, 1)},
)


def block_words(kind, rows, cols):
    """u32 words of `rows` rows of `cols` values of `kind` as pack_blocks lays them out."""
    bv, bb, doff = BLOCK_TYPES[kind]
    n = rows * (cols // bv)
    wpb = (bb - (2 if doff is not None else 0)) // 4
    return n * wpb + (cdiv(n, 2) if doff is not None else 0)


def pack_blocks(kind, raw, rows, cols):
    """The bytes of a GGUF tensor of `kind` (rows of `cols` values) as the u32 words the kernels
    read: the blocks in file order, a 2-mod-4 block's f16 `d` moved to the pairs after them."""
    if kind not in BLOCK_TYPES:
        raise NotSupportedError(f"[gguf] block type {kind} has no GPU decoder (have: {', '.join(BLOCK_TYPES)})")
    bv, bb, doff = BLOCK_TYPES[kind]
    if cols % bv:
        raise DataError(f"[gguf] a {kind} tensor's rows must be whole blocks of {bv} values, got {cols}")
    nb = rows * (cols // bv)
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
    if raw.size != nb * bb:
        raise DataError(f"[gguf] {kind} tensor of {rows} x {cols} needs {nb * bb} bytes, the file holds {raw.size}")
    blocks = raw.reshape(nb, bb)
    if doff is None:
        return blocks.reshape(-1).view("<u4").copy()
    body = np.concatenate([blocks[:, :doff], blocks[:, doff + 2 :]], axis=1)
    d = blocks[:, doff : doff + 2].reshape(-1)
    if nb % 2:
        d = np.concatenate([d, np.zeros(2, np.uint8)])
    return np.concatenate([body.reshape(-1), d]).view("<u4").copy()


def _check_kind(where, kind, cols, what):
    if kind not in BLOCK_TYPES:
        raise TypeError(f"[{where}] kind must be one of {', '.join(BLOCK_TYPES)}, got {kind!r}")
    if isinstance(cols, bool) or not isinstance(cols, int) or cols < 1 or cols % BLOCK_TYPES[kind][0]:
        raise TypeError(
            f"[{where}] {what} must be a positive multiple of {BLOCK_TYPES[kind][0]} for {kind}, got {cols}"
        )


def _check_rows(where, what, v):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TypeError(f"[{where}] {what} must be a positive integer, got {v!r}")


@builder_op
def _matmul_blocks(b, a, packed, *, kind, K, N, rows_gemv=False, label=None):
    """rows_gemv: the GEMV kernel for every M, a dynamic one too (a serving step's rows,
    mltensor/llm/model.py "rows": each row's sums as alone, whatever the rows beside it)."""
    where = "_matmul_blocks"
    b._operand(a, where, "a")
    b._operand(packed, where, "b")
    check_support(where, a=a, b=packed)
    _check_kind(where, kind, K, "K")
    _check_rows(where, "N", N)
    if a.shape[-1] != K:
        raise TypeError(f"[{where}] the last dimension of a ({a.shape[-1]}) must be K ({K})")
    if packed.shape != (block_words(kind, N, K),):
        raise TypeError(f"[{where}] b must hold {block_words(kind, N, K)} u32 words, got {list(packed.shape)}")
    attrs = {"kind": kind, "K": K, "N": N, "rows_gemv": bool(rows_gemv)}
    return b._emit1(where, [a, packed], attrs, "float32", tuple(a.shape[:-1]) + (N,), label)


@builder_op
def _gather_blocks(b, data, indices, *, kind, V, H, label=None):
    """Rows `indices` (int32, negative counted from the end, clamped into [0, V)) of the [V, H]
    table of `kind` blocks in `data`, decoded to float32: shape indices.shape + [H]."""
    where = "_gather_blocks"
    b._operand(data, where, "data")
    b._operand(indices, where, "indices")
    check_support(where, data=data, indices=indices)
    _check_kind(where, kind, H, "H")
    _check_rows(where, "V", V)
    if data.shape != (block_words(kind, V, H),):
        raise TypeError(f"[{where}] data must hold {block_words(kind, V, H)} u32 words, got {list(data.shape)}")
    attrs = {"kind": kind, "V": V, "H": H}
    return b._emit1(where, [data, indices], attrs, "float32", tuple(indices.shape) + (H,), label)


# -- lowering -----------------------------------------------------------------------------------


def _iq4_words():
    """IQ4_NL's 16 values as 4 u32 words of int8s (value i: byte i % 4 of word i / 4)."""
    raw = np.array(IQ4_VALUES, np.int8).view(np.uint8)
    return [int(x) for x in raw.view("<u4")]


def decode_params(kind, rows, cols):
    """Template parameters of shaders/blocks_decode.wgsl for `rows` rows of `cols` values."""
    bv, bb, doff = BLOCK_TYPES[kind]
    kb = cols // bv
    wpb = (bb - (2 if doff is not None else 0)) // 4
    return {
        "KIND": kind,
        "QBV": bv,
        "QWPB": wpb,
        "QKB": kb,
        "QDOFF": rows * kb * wpb,
        "PARTS": bv // 64 if bv == 256 else 1,
        "IQ4": _iq4_words(),
    }


# GEMV geometry: CPU adapters one thread per ROWS_CPU rows (threads of WG_CPU); GPUs TPR threads
# per row splitting its units, WG_GPU threads a workgroup (WG_GPU / TPR rows)
WG_CPU, ROWS_CPU = 32, 2
# a CPU thread's rows of a (blocks.wgsl MT) and output rows (R) in a step of several rows of a:
# a unit's words decoded once for MT rows of a, a's loads (gathers on llvmpipe) shared by R rows;
# MT the smallest of STEP_MT that holds the step's rows (2: M = 2, 4: M = 3, 4, 8: M >= 5, in
# tiles of 8; the rows past M of a tile cost as much as the others).
# SmolLM2-135M requantized to Q4_K_M (Q5_0, Q4_K, Q6_K projections), its serving step of 8 rows
# on lavapipe (2 cores, host shared), variants alternated in one process, 8 rows / 1 row in CPU
# time: (1, 2) (the rows one after the other, the one-row thread) 4.9-5.4x; (8, 2) 5.2x, no gain
# (a's loads dominate); (8, 8) 2.3x; (8, 12) ~(8, 8); (4, 16) 2.2x; (8, 16) 1.9-2.0x; (8, 24) no
# better; workgroups of 8 or 16 threads instead of 32: the same within noise. Steps of 2, 3, 4 rows
# (CPU ms, MT 8 only against the tiers): 226/150, 231/179, 245/179. Cost: a tile's first step
# compiles it (~0.4 s); the build renders each distinct kernel once (wgsl.py Kernel.source: the
# rows graph 1.15 s, where rendering every launch's copy took 9.4 s).
STEP_MT, STEP_R = (2, 4, 8), 16
WG_GPU, TPR_GPU = 128, 32
# types whose GPU GEMV splits a super-block over 16 threads (each thread 16 values, reading words
# its neighbours' words are next to), as llama.cpp's Vulkan mul_mat_vec does
GPU_SPLIT = ("Q4_K", "Q6_K")
# types whose CPU GEMV is shaders/blocks_k23.wgsl, and its rows a thread. On llvmpipe a load inside
# a loop is a gather, one per invocation, even where every invocation reads the same address, so
# what counts is loads a weight: a's 256 values of a block are loaded once for ROWS_K23 rows.
# Measured on lavapipe (2 cores, host shared; bench/test_bench_blocks.py, 2048 x 2048, bandwidth
# against the Q4_0 GEMV of the same matrix): the q_unit GEMV of 2 rows a thread Q2_K 0.42x, Q3_K
# 0.48x (4 rows: 0.55x, 0.57x); blocks_k23 with units of half a block 0.90x, 0.73x; whole blocks
# (Q3_K's hmask word read once) 0.87-0.88x, 0.82-0.83x; rows a thread 8: 0.75x, 0.62x; 12: 0.74x,
# 0.75x; 24: 0.91x, 0.78x; 32: 0.91x, 0.66x (2048 rows in 2 or 3 workgroups of 32 threads). GPUs keep
# the q_unit GEMV (unmeasured there).
CPU_K23 = ("Q2_K", "Q3_K")
ROWS_K23 = 16


@lowering("_matmul_blocks")
def _lower_matmul_blocks(kc, node):
    at = node.attrs
    a, packed = node.inputs
    out = kc.out(node)
    kind, K, N = at["kind"], at["K"], at["N"]
    M = math.prod(a.shape[:-1])
    dp = decode_params(kind, N, K)
    name = f"matmul_blocks_{kind}_{M}x{K}x{N}"
    if (not isinstance(M, Sym) and M <= GEMV_MAX_M) or at.get("rows_gemv"):
        # (rows_gemv: a serving step, every M; each row's sums are the same for every M and tile)
        cpu = cpu_device(kc.device)
        if cpu and kind in CPU_K23:
            _launch_k23(kc, name, dp, M, K, N, [a, packed, out])
            return
        wg, tpr, r = (WG_CPU, 1, ROWS_CPU) if cpu else (WG_GPU, TPR_GPU, 1)
        if not cpu and kind in GPU_SPLIT:
            dp["PARTS"] = 16  # llama.cpp's split: 16 threads a super-block, neighbours on neighbouring words
        units = dp["QKB"] * dp["PARTS"]
        p = dict(dp, path="gemv", M=wgsl(M) if isinstance(M, Sym) else f"{M}u", N=N, K=K, WG=wg, TPR=tpr)
        # CPU adapters, several rows of a: a thread MT of them (their units decoded once) and
        # STEP_R output rows, a workgroup per MT rows of a and WG * STEP_R output rows; one row of
        # a: the one-row kernel. M known at dispatch launches each kernel gated on its range of M
        # by a 0/1 factor of its workgroup count (the same sums for a row whichever runs it).
        if not cpu:
            tiles = [(1, 1)]
        elif isinstance(M, Sym):
            lows = [2] + [t + 1 for t in STEP_MT[:-1]]  # the tile of MT STEP_MT[i] serves M >= lows[i]
            ge = [size_at_least(M, lo) if lo <= high(M) else 0 for lo in lows] + [0]
            tiles = [(1, 1 - ge[0])] + [(mt, ge[i] - ge[i + 1]) for i, mt in enumerate(STEP_MT)]
            tiles = [t for t in tiles if not isinstance(t[1], int) or t[1]]  # (those M never takes: none)
        else:
            tiles = [(min(M, STEP_MT[-1]), 1)]
        for mt, on in tiles:
            if mt == 1:
                q = dict(p, R=r, MT=1, RS=[""])
                count = cdiv(N, wg // tpr * r)
            else:
                gn = cdiv(N, wg * STEP_R)
                q = dict(p, R=STEP_R, MT=mt, RS=[f"_{i}" for i in range(mt)], GN=gn)
                count = gn * cdiv(M, mt)
            kc.launch(
                Kernel(
                    f"{name}_gemv_t{tpr}r{q['R']}" + (f"m{mt}" if mt > 1 else ""),
                    "blocks.wgsl",
                    q,
                    [Binding("a", "vec4<f32>"), Binding("b", "u32"), Binding("out", "f32", True)],
                ),
                [a, packed, out],
                grid(count * on),
                iters=high(M) * (cdiv(units, tpr) + 8) + 16,
            )
        return
    # prompts: _matmul_nbits' tiled GEMM, its B staging decoding 4 values at a time (QBV-value
    # blocks read as "words" of 4 values: VPW = 4); M known only at dispatch takes it at every size
    dyn = isinstance(M, Sym)
    p = dict(
        dp,
        BITS=8,
        MASK=255,
        VPW=4,
        BS=dp["QBV"],
        KB=dp["QKB"],
        WPR=0,
        ZPB=0,
        zp_mode="none",
        ZP_DEFAULT=0.0,
        N=N,
        K=K,
        ST=store_fn("f32"),
        has_bias=False,
        SM=wgsl(M) if dyn else "M",
        M=None if dyn else M,
        check_m=dyn,
        MROWS=4,
        gate="",
    )
    bindings = [Binding("a", "f32"), Binding("b", "u32"), Binding("out", "f32", True)]
    tiled_launch(kc, name, p, bindings, [a, packed, out], M, N, high(M), 1)


def _launch_k23(kc, name, dp, M, K, N, args):
    """Q2_K / Q3_K on CPU adapters: a's rows prescaled, with their sub-block sums, into a scratch
    buffer (one thread per 64 values), then the GEMV reading them (shaders/blocks_k23.wgsl)."""
    a, packed, out = args
    mmax = high(M)
    xq = kc.scratch(4 * mmax * (K + 16 * dp["QKB"]))
    p = dict(dp, M=wgsl(M) if isinstance(M, Sym) else f"{M}u", MMAX=mmax, N=N, K=K, WG=WG_CPU, R=ROWS_K23)
    n = mmax * dp["QKB"] * 4
    vec4 = [Binding("a", "vec4<f32>")]
    kc.launch(
        Kernel(
            f"{name}_k23prep", "blocks_k23.wgsl", dict(p, path="prep", n=n), vec4 + [Binding("xq", "vec4<f32>", True)]
        ),
        [a, xq],
        grid(cdiv(n, WORKGROUP)),
    )
    kc.launch(
        Kernel(
            f"{name}_gemv_k23r{ROWS_K23}",
            "blocks_k23.wgsl",
            dict(p, path="gemv"),
            [Binding("xq", "vec4<f32>"), Binding("b", "u32"), Binding("out", "f32", True)],
        ),
        [xq, packed, out],
        grid(cdiv(N, WG_CPU * ROWS_K23)),
        iters=high(M) * dp["QKB"] * (ROWS_K23 + 1) + 16,
    )


@lowering("_gather_blocks")
def _lower_gather_blocks(kc, node):
    at = node.attrs
    data, idx = node.inputs
    out = kc.out(node)
    kind, V, H = at["kind"], at["V"], at["H"]
    rows = math.prod(idx.shape)
    n = rows * (H // 4)
    p = dict(decode_params(kind, V, H), path="gather", H=H, V=V, n=n, ST=store_fn("f32"))
    bindings = [Binding("b", "u32"), Binding("idx", "i32"), Binding("out", "f32", True)]
    kc.launch(
        Kernel(f"gather_blocks_{kind}_{rows}x{V}x{H}", "blocks.wgsl", p, bindings),
        [data, idx, out],
        grid(cdiv(n, WORKGROUP)),
    )
