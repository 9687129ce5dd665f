"""_attention: scaled dot-product attention as one kernel (shaders/attention.wgsl).

An internal builder operator (leading underscore: not a WebNN operator, not in
op_support_limits()), made by the compiler from the chain matmul(Q, K^T) -> [scale] -> [+ bias]
-> [where(mask, ., value)] -> softmax -> matmul(P, V) (compiler/fusion/attention.py), and callable
directly as `builder._attention(q, k, v, scale=..., bias=..., causal=..., k_transposed=...,
layout=...)`.

Shapes (layout "bhsd", the default): q [B, H, Sq, D] (or rank 3, [B*H, Sq, D]; or rank 5,
[B, P, H, Sq, D]: MaxViT's windows or grid cells P); k [B, Hkv, Sk, D],
or [B, Hkv, D, Sk] with k_transposed (read through strides, never copied); v [B, Hkv, Sk, DV];
out [B, H, Sq, DV]. Layout "bshd" (position-major, as a KV cache appended in place is stored,
mltensor/llm): q [B, Sq, H, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, DV], out [B, Sq, H, DV], or at
rank 3 the same without B; read and written through strides, nothing transposed. Each
batch dimension of k and v equals q's, is 1, or divides it (grouped-query heads: head h reads kv
head h / (H / Hkv)). bias broadcasts to the scores [B, H, Sq, Sk] and is added to them; causal
masks key j from row i when j > i + Sk - Sq (bottom-right aligned, as a decode step with a cache
of Sk - Sq earlier keys needs); `window` W > 0 (with causal: a sliding-window layer) masks key j
too when j <= i + Sk - Sq - W (each row sees its own key and the W - 1 before it); `softcap` c > 0
replaces each scaled score s by c * tanh(s / c) before the bias and masks (Gemma 2's attention
logit soft-capping). The softmax is computed online (running maximum and sum per row)
over tiles of keys, so the Sq x Sk scores are never written: see the template's header.

Variants (`attention_candidates`): a tiled kernel for prompts (BQ query rows per workgroup, K and
V tiles staged in workgroup memory), and for Sq <= DECODE_MAX_SQ two decode kernels, K and V
read in place:
- "dec": one workgroup per head walks every key, its threads splitting each tile of keys (one
  score per thread per tile, outputs spread over the head dimension);
- "split" (flash-decoding): the keys are cut into at most SPLIT blocks of whole tiles, one
  workgroup per (group of query heads, block) computing the block's partial maximum, sum and
  unnormalized output for every row of its heads (GR query heads sharing one K/V head: each K/V
  element is read once for all of them), then a reduce kernel (one workgroup per output row)
  rescales and sums the partials. Long caches then use many workgroups, not one per head.
Candidate 0 is the lavapipe choice for decodes; the others are autotuned on hardware adapters
like the GEMM family's (runtime/autotune.py), each correct for every shape. Prompts on CPU
adapters run the ROWS kernel (attention_cpu.wgsl, `row_config`: a thread per query row, no
workgroup memory, no barriers; appended as the last candidate), MLTENSOR_NO_ROW_ATTENTION=1 the
tiled one.

Sizes Sq, Sk and the batch dimensions may be dynamic (Syms, rendered with wgsl()); head sizes
are static. float32, and float16 loaded into f32 (every sum in f32, stored through f16_of).
"""

import dataclasses
import math

import numpy as np

from ..dynamic.dims import Sym, cdiv, exact_div, high, low, size_at_least, wgsl
from ..errors import NotSupportedError
from ..ir.registry import builder_op, lowering, register
from ..runtime import autotune
from ..runtime.wgsl import LOOP_BUDGET, Binding, cpu_device, f32_lit, Kernel, ld_st
from ..switches import switch
from ._checks import check_bool, check_number, check_support, same_type, unidirectional
from ._index import row_strides
from .reduce import groups
from ._gemm import dim_maxes, fit_sizes

FLOAT = ("float32", "float16")
DYNAMIC_OPS = frozenset({"_attention"})

DECODE_MAX_SQ = 4  # query rows up to which the decode kernel (keys split over threads) is used
# Keys up to which a decode runs the one-workgroup-per-head kernel ("dec", one launch) rather
# than the split decode (two launches: partials, then their reduction). lavapipe, the bench's
# 2-layer Llama-style decoder (16 / 4 heads of 64), whole decode step, dec against split,
# alternated: on par at 129 keys (1.015x), 5% slower at 257, 10% slower at 513. With a dynamic
# key length spanning it both launch, each gated on the key length at dispatch. GPUs:
# unmeasured (for a short cache the second launch likely costs more than the split gains).
DECODE_SPLIT_MIN_SK = 192
# Largest head size the compiler fuses: up to it some tiled candidate fits WebGPU's default 16 KiB
# of workgroup memory (4 rows, 8 keys a tile at 256)
MAX_HEAD = 256
WG_STORAGE = 16384  # WebGPU's default workgroup memory: every candidate but the first fits it


def _cfg(wg, bq, bk, stage, rk4=1, rc4=1, split=0, gr=1):
    """WG threads, BQ rows, BK keys a tile; STAGE: the tiled kernel, whose threads compute
    blocks of 4 rows x 4 RK4 keys (scores) and 4 rows x 4 RC4 columns (outputs). SPLIT (decode):
    the most blocks the keys are cut into (0: the one-workgroup-per-head decode kernel), GR the
    query heads a split workgroup serves."""
    return {"WG": wg, "BQ": bq, "BK": bk, "STAGE": stage, "RK4": rk4, "RC4": rc4, "SPLIT": split, "GR": gr}


def _smem(c, D, DV):
    """Workgroup memory bytes of a configuration (attention.wgsl's workgroup arrays)."""
    bq, bk = c["BQ"], c["BK"]
    if c["SPLIT"]:  # qs, ps (all rows of the heads), red, red2, rowf, rowm, rowl
        rb = c["GR"] * bq
        return 4 * (rb * D + rb * bk + 2 * c["WG"] + 3 * rb)
    if c["STAGE"]:  # qT, kvs (K tile, then V tile with rows padded to RC4 quads), sT, red, red2, rowf
        dvp = -(-(-(-DV // 4)) // c["RC4"]) * c["RC4"]
        return 4 * (D * bq + max(D * bk, bk * 4 * dvp) + bk * bq + 2 * c["WG"] + bq)
    return 4 * (bq * D + bq * bk + bq)  # qs, ps, rowf


def _fit(c, D, DV, limit):
    """c with BK, then BQ, halved until it fits `limit` bytes of workgroup memory (the tiled
    kernel keeps both multiples of 4, and WG a multiple of BQ)."""
    c = dict(c)
    while _smem(c, D, DV) > limit and c["BK"] > max(8, 8 * c["RK4"]):
        c["BK"] //= 2
    while _smem(c, D, DV) > limit and c["BQ"] > (4 if c["STAGE"] else 1):
        c["BQ"] //= 2
    return c


MAX_SPLIT_ROWS = 16  # rows (query heads x query rows) of one split workgroup


def _split_cfg(wg, bq, split, ratio, D, DV, limit):
    """A split configuration with the most query heads a workgroup serves (a divisor of `ratio`)
    within MAX_SPLIT_ROWS rows, WG threads (at least one per row) and `limit` bytes."""
    for gr in sorted((g for g in range(1, ratio + 1) if ratio % g == 0), reverse=True):
        c = _cfg(wg, bq, wg, False, split=split, gr=gr)
        if gr * bq <= min(MAX_SPLIT_ROWS, wg) and _smem(c, D, DV) <= limit:
            return c
    return None


def attention_candidates(Sq, Sk, D, DV, smem_limit=None, ratio=1):
    """(candidates, GPU heuristic index). Sizes may be Syms: chosen at their maxima. `ratio`:
    consecutive query heads that read one K/V head (grouped-query attention), which a split
    decode workgroup may serve together."""
    hq = high(Sq)
    lim0 = smem_limit or WG_STORAGE
    if hq <= DECODE_MAX_SQ:
        bq = 1 if hq == 1 else 2 if hq == 2 else 4
        # Split (flash-decoding): at most SPLIT blocks of keys, the query heads of one K/V head
        # together. lavapipe (2 cores, SmolLM2's 9 heads on 3 K/V heads of 64, bshd, CPU time
        # of one launch pair): 32 threads and 8 blocks, 0.25 / 1.2 / 2.1 / 3.8 ms at 64 / 512 /
        # 1000 / 2000 keys (64 threads: 0.24 / 1.5 / 2.5 / 4.4; 2 blocks: 0.23 / 1.2 / 2.1 /
        # 4.0) against 0.36 / 4.3 / 8.5 ms for the best one-workgroup-per-head kernel; q, k and
        # v read as vec4, 2.5x faster than scalar loads there. GPUs: more threads and blocks
        # (enough workgroups for a long cache with few heads; unmeasured, the tuner decides).
        split = [(32, 8), (64, 32), (64, 8), (128, 16), (128, 64), (256, 32)]
        shapes = [
            c
            for c in (
                _split_cfg(wg, bq, n, ratio, D, DV, lim0 if not k else WG_STORAGE) for k, (wg, n) in enumerate(split)
            )
            if c
        ]
        heur = 1 if len(shapes) > 1 else 0
        # One workgroup per head, BK = WG: one score per row per thread per tile (the key
        # dimension spread over the threads); a larger tile halves the tiles (and barriers)
        shapes += [_cfg(64, bq, 64, False), _cfg(128, bq, 128, False), _cfg(256, bq, 256, False)]
    else:
        # lavapipe (measured on 2 cores, 12 heads of 256 x 256 x 64: 39 ms against 46-54 ms
        # for 4 x 4 blocks or 16-row tiles): 64 threads, 32 rows, 32 keys a tile, 4 x 8 blocks
        # (16 FMAs per vec4 read from workgroup memory). GPU shapes, within 16 KiB: more
        # threads and rows a workgroup (unmeasured on GPUs: the tuner decides there)
        shapes = [
            _cfg(64, 32, 32, True, 2, 2),
            _cfg(64, 16, 32, True, 2, 2),
            _cfg(128, 32, 32, True, 2, 2),
            _cfg(64, 16, 64, True),
            _cfg(256, 64, 16, True),
        ]
        heur = 2
    cands = []
    for k, c in enumerate(shapes):
        if not c["SPLIT"]:
            c = _fit(c, D, DV, lim0 if k == 0 else WG_STORAGE)
        if c not in cands and _smem(c, D, DV) <= (lim0 if k == 0 else WG_STORAGE):
            cands.append(c)
    if not cands:
        raise NotSupportedError(f"[_attention] head sizes {D} and {DV} need more workgroup memory than {lim0} bytes")
    return cands, min(heur, len(cands) - 1)


# The ROWS kernel (attention_cpu.wgsl): a thread per query row (RQ rows each), 8 threads a
# workgroup (one SIMD group of llvmpipe), KC keys a chunk, no workgroup memory. lavapipe (2
# cores), CPU time of one launch against the staged kernel's lavapipe tile (64 threads, 32 x 32):
# MobileViT-XXS's 32 heads of 196 x 196 x 16 and 49 x 49 x 20: 0.12x and 0.14x (RQ 16 and 8);
# ViT-B's 12 of 197 x 197 x 64: 0.19x (RQ 16), BERT's 12 of 384 x 384 x 64: 0.18x. Each K and V
# load serves the RQ rows of every thread, so more rows a thread cost less a row (relative cost
# a row, ViT-B: ROW_COST), up to the rows past Sq computed in vain; 2 keys a chunk beat 1, 4, 8
# and 16 there (the registers of larger chunks spill).
ROW_WG = 8
ROW_COST = {1: 1.0, 2: 0.5, 4: 0.3, 8: 0.23, 16: 0.18}
ROW_REGS4 = 256  # at most RQ x head quads of q registers: 4 rows of 256 build in 0.5 s on lavapipe
ROW_COLS4 = 16  # column quads of one pass of the outputs (registers a row keeps)


def row_config(Sq, Sk, D, DV, rq=None, kc=2):
    """The ROWS configuration (attention_cpu.wgsl), the CPU adapters' kernel for prompts (more
    than DECODE_MAX_SQ query rows), or None where MLTENSOR_NO_ROW_ATTENTION=1 or where its
    passes over the keys would loop past LOOP_BUDGET (runtime/wgsl.py: llvmpipe's silent cap;
    the staged kernel splits such keys). RQ (rows a thread): the least estimated cost of the rows
    computed, ROW_COST. Not offered to GPUs: with a thread per row and nothing shared, a
    workgroup of 8 threads would leave most of a GPU's lanes and its memory reuse idle."""
    if switch("MLTENSOR_NO_ROW_ATTENTION"):
        return None
    passes = cdiv(cdiv(DV, 4), ROW_COLS4)
    if passes * cdiv(high(Sk), kc) + 64 > LOOP_BUDGET:
        return None
    if rq is None:
        ok = [r for r in ROW_COST if r == 1 or r * cdiv(D, 4) <= ROW_REGS4]
        rq = min(ok, key=lambda r: (cdiv(high(Sq), ROW_WG * r) * ROW_WG * r * ROW_COST[r], -r))
    return {"ROWS": True, "WG": ROW_WG, "RQ": rq, "KC": kc, "BQ": ROW_WG * rq, "STAGE": False, "SPLIT": 0}


def _row_passes(DV):
    """[(first column quad, quads)] of the ROWS kernel's output passes: at most ROW_COLS4 quads
    each, as even as they go."""
    n4 = cdiv(DV, 4)
    cp = cdiv(n4, cdiv(n4, ROW_COLS4))
    return [(c, min(cp, n4 - c)) for c in range(0, n4, cp)]


def _batch_ok(qd, kd):
    """A k/v batch dimension kd serves q's qd: equal, 1, or (static sizes) a divisor of it."""
    if kd == qd or (isinstance(kd, int) and kd == 1):
        return True
    return isinstance(kd, int) and isinstance(qd, int) and kd > 0 and qd % kd == 0


def _is_one(x):
    return isinstance(x, int) and x == 1


# -- builder method -------------------------------------------------------------------------------

register(
    "_attention",
    {"q": FLOAT, "k": FLOAT, "v": FLOAT, "bias": FLOAT, "cond": ("uint8",), "output": FLOAT},
    ranks={"q": (3, 5), "k": (3, 5), "v": (3, 5), "bias": (0, 5), "cond": (0, 5)},
)


LAYOUTS = ("bhsd", "bshd")


def _logical(shape, layout):
    """An operand's shape as the kernel indexes it, [.., heads, rows, columns], and the element
    strides of its storage along those axes ("bshd" keeps rows before heads in memory)."""
    shape, st = tuple(shape), row_strides(shape)
    if layout == "bshd":
        shape = shape[:-3] + (shape[-2], shape[-3], shape[-1])
        st = st[:-3] + [st[-2], st[-3], st[-1]]
    return shape, list(st)


def check_shapes(where, q, k, v, k_transposed, layout="bhsd"):
    """(Sq, Sk, D, DV) of an attention, TypeError when the shapes do not fit together."""
    if not q.rank == k.rank == v.rank:
        raise TypeError(f"[{where}] q, k and v must have one rank, got {q.rank}, {k.rank}, {v.rank}")
    qs, ks, vs = (_logical(x.shape, layout)[0] for x in (q, k, v))
    Sq, D = qs[-2], qs[-1]
    kd, Sk = (ks[-2], ks[-1]) if k_transposed else (ks[-1], ks[-2])
    DV = vs[-1]
    if not all(isinstance(x, int) for x in (D, kd, DV)) or D != kd:
        raise TypeError(
            f"[{where}] head sizes must be static and equal for q and k, got q {list(q.shape)}, "
            f"k {list(k.shape)} (k_transposed={k_transposed}, layout {layout})"
        )
    if vs[-2] != Sk:
        raise TypeError(f"[{where}] v must have Sk = {Sk} rows, got shape {list(v.shape)} (layout {layout})")
    for x, name in ((ks, "k"), (vs, "v")):
        if not all(_batch_ok(a, b) for a, b in zip(qs[:-2], x[:-2])):
            raise TypeError(
                f"[{where}] {name} batch dimensions {list(x[:-2])} must equal q's "
                f"{list(qs[:-2])}, be 1 or divide them (layout {layout})"
            )
    return Sq, Sk, D, DV


@builder_op
def _attention(
    b,
    q,
    k,
    v,
    *,
    scale=1.0,
    bias=None,
    causal=False,
    k_transposed=False,
    layout="bhsd",
    softcap=0.0,
    window=0,
    label=None,
):
    """softmax(cap((q k^T) * scale) + bias [causal] [window]) v in one kernel; see the module's docstring."""
    for what, x in (("q", q), ("k", k), ("v", v)):
        b._operand(x, "_attention", what)
    if bias is not None:
        b._operand(bias, "_attention", "bias")
    check_support("_attention", q=q, k=k, v=v, bias=bias)
    same_type("_attention", ("q", q), ("k", k), ("v", v), ("bias", bias))
    scale = check_number("_attention", "scale", scale)
    causal = check_bool("_attention", "causal", causal)
    k_transposed = check_bool("_attention", "k_transposed", k_transposed)
    if layout not in LAYOUTS:
        raise TypeError(f"[_attention] layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    softcap = check_number("_attention", "softcap", softcap)
    if not softcap >= 0.0 or math.isinf(softcap):
        raise TypeError(f"[_attention] softcap must be a finite number >= 0 (0: none), got {softcap!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise TypeError(f"[_attention] window must be an integer >= 0 (0: none), got {window!r}")
    if window and not causal:
        raise TypeError("[_attention] a sliding window needs causal=True")
    if layout == "bshd" and k_transposed:
        raise TypeError("[_attention] k_transposed needs layout 'bhsd'")
    Sq, Sk, D, DV = check_shapes("_attention", q, k, v, k_transposed, layout)
    if bias is not None:  # (broadcast to the scores [.., H, Sq, Sk], whatever the layout)
        unidirectional("_attention", bias.shape, _logical(q.shape, layout)[0][:-2] + (Sq, Sk))
    attrs = {
        "scale": scale,
        "scale_op": "mul",
        "causal": causal,
        "k_transposed": k_transposed,
        "where_value": None,
        "where_keeps": True,
        "layout": layout,
        "softcap": softcap,
        "window": window,
    }
    return b._emit1("_attention", [q, k, v, bias, None], attrs, q.data_type, tuple(q.shape[:-1]) + (DV,), label)


# -- lowering -------------------------------------------------------------------------------------


def _offset(var, out_batch, shape, strides):
    """WGSL u32 offset, for the flat batch index `var` over `out_batch`, of the matrix of an
    operand whose batch shape `shape` (same rank) is equal along a dimension, 1 (broadcast), or
    a divisor (grouped heads: coordinate c reads c / (out / size)); `strides` its element strides.
    Dynamic sizes that differ by name only are equal at dispatch (unified by the builder)."""
    if tuple(shape) == tuple(out_batch) and all(
        strides[d] == strides[d + 1] * shape[d + 1] for d in range(len(shape) - 1)
    ):
        return "0u" if not shape or _is_one(math.prod(shape)) else f"{var} * {wgsl(strides[-1])}"
    terms, inner = [], 1
    for d in range(len(out_batch) - 1, -1, -1):
        n, s, st = out_batch[d], shape[d], strides[d]
        if not _is_one(s) and not _is_one(n):
            c = var if _is_one(inner) else f"({var} / {wgsl(inner)})"
            if d > 0:
                c = f"({c} % {wgsl(n)})"
            if isinstance(s, int) and isinstance(n, int) and s != n:
                c = f"({c} / {wgsl(n // s)})"
            terms.append(c if _is_one(st) else f"{c} * {wgsl(st)}")
        inner = inner * n
    return " + ".join(terms) if terms else "0u"


def _mask_at(x, rank, out_batch):
    """(batch offset in `bt`, offset of (qi, kj)) of an operand broadcast to the scores."""
    shape = (1,) * (rank - x.rank) + tuple(x.shape)
    st = row_strides(shape)
    base = _offset("bt", out_batch, shape[:-2], st[:-2])
    parts = [
        f"qi * {wgsl(st[-2])}" if not _is_one(shape[-2]) else "",
        f"kj * {wgsl(st[-1])}" if not _is_one(shape[-1]) else "",
    ]
    return base, " + ".join(p for p in parts if p) or "0u"


@lowering("_attention")
def _lower_attention(kc, node):
    q, k, v, bias, cond = node.inputs
    a = node.attrs
    layout = a.get("layout", "bhsd")
    out = kc.out(node)
    kt = a["k_transposed"]
    Sq, Sk, D, DV = check_shapes("_attention", q, k, v, kt, layout)
    (qs, qst), (ks, kst), (vs, vst), (_, ost) = (_logical(x.shape, layout) for x in (q, k, v, out))
    rank = q.rank
    ob = tuple(qs[:-2])
    nb = math.prod(ob)
    t = kc.wtype(q)
    params = {
        "D": D,
        "DV": DV,
        "causal": a["causal"],
        "softcap": f32_lit(a["softcap"]) if a.get("softcap") else "",
        "inv_softcap": f32_lit(1.0 / a["softcap"]) if a.get("softcap") else "",
        "window": a.get("window", 0),
        **ld_st(t),
        "q_base": _offset("bt", ob, ob, qst[:-2]),
        "k_base": _offset("bt", ob, ks[:-2], kst[:-2]),
        "v_base": _offset("bt", ob, vs[:-2], vst[:-2]),
        "o_base": _offset("bt", ob, ob, ost[:-2]),
        # row strides of q, v and the output; element (key j, column d) of k: [.., Sk, D] rows,
        # or [.., D, Sk] columns (k_transposed)
        "q_si": wgsl(qst[-2]),
        "v_sj": wgsl(vst[-2]),
        "o_si": wgsl(ost[-2]),
        "k_sj": wgsl(1 if kt else kst[-2]),
        "k_sd": wgsl(kst[-2] if kt else 1),
        "sizes": [("SQ", wgsl(Sq)), ("SK", wgsl(Sk)), ("NB", wgsl(nb))],
        "scale": "",
        "has_bias": bias is not None,
        "has_cond": cond is not None,
        "bias_base": "",
        "bias_at": "",
        "cond_base": "",
        "cond_at": "",
        "where_value": "",
        "where_keeps": "true",
        "REDUCE": False,
        "LD4": "vec4<f32>" if t == "f16" else "",
        "TPS": 0,
        # a row whose scores are all -inf (fully masked): NaN, as softmax's 0 / 0, or 0 where the
        # graph replaced NaN probabilities by 0 (where(isnan(p), 0, p): torch's SDPA export)
        "empty_row": "0.0" if a.get("nan_zero") else "nan_f32()",
    }
    if a["scale_op"] is not None:
        params["scale"] = f" {'*' if a['scale_op'] == 'mul' else '/'} {f32_lit(a['scale'])}"
    bindings = [Binding("q", t), Binding("k", t), Binding("v", t)]
    args = [q, k, v]
    if bias is not None:
        params["bias_base"], params["bias_at"] = _mask_at(bias, rank, ob)
        bindings.append(Binding("bias", kc.wtype(bias)))
        args.append(bias)
    if cond is not None:
        params["cond_base"], params["cond_at"] = _mask_at(cond, rank, ob)
        # the value the unfused where stores, in the value type (-3.4e38 is -inf in float16)
        w = float(a["where_value"])
        if t == "f16":
            with np.errstate(over="ignore"):
                w = float(np.float16(w))
        params["where_value"] = f32_lit(w)
        params["where_keeps"] = "true" if a["where_keeps"] else "false"
        bindings.append(Binding("cond", kc.wtype(cond)))
        args.append(cond)
    reads = (list(bindings), list(args))  # what a split decode's first kernel binds (its output: scratch)
    bindings.append(Binding("out", t, True))
    args.append(out)
    params["act"] = kc.epilogue(bindings, args)
    # the split decode's reduce kernel: the partials, the epilogue's operands, the output
    red_b, red_a = [Binding("part", "f32"), Binding("out", t, True)], [None, out]
    kc.epilogue(red_b, red_a)  # (the same act(): its operands bound under the same names)
    # the split decode reads q, k and v as vec4 where every row and matrix starts at a multiple
    # of 4 elements
    v4 = not kt and all(_mult4(x) for x in [D, DV] + qst[:-1] + kst[:-1] + vst[:-1])
    # the ROWS kernel binds each of q, k and v as vec4 where its own rows and matrices allow
    quads = {
        "q": all(_mult4(x) for x in [D] + qst[:-1]),
        "k": not kt and all(_mult4(x) for x in [D] + kst[:-1]),
        "v": all(_mult4(x) for x in [DV] + vst[:-1]),
    }
    split = {
        "reads": reads,
        "reduce": (red_b, red_a),
        "ratio": _ratio(ob, ks[:-2], vs[:-2]),
        "v4": v4,
        "quads": quads,
    }

    base = (
        f"attention_{t}_{f'b{nb}_' if isinstance(nb, Sym) or nb > 1 else ''}q{Sq}k{Sk}d{D}"
        f"{f'v{DV}' if DV != D else ''}{'_kt' if kt else ''}{'_bshd' if layout == 'bshd' else ''}"
        f"{'_causal' if a['causal'] else ''}"
        f"{'_sc' + format(a['softcap'], '.9g').replace('.', 'p').replace('-', 'm').replace('+', '') if a.get('softcap') else ''}"
        f"{'_w' + str(a['window']) if a.get('window') else ''}"
    )
    # A dynamic Sq on both sides of DECODE_MAX_SQ: both kernels are launched, each gated on Sq at
    # dispatch (outside its range, one workgroup that returns at once), so every size runs the
    # kernel a static build of it runs (a row's result depends on the kernel, not on Sq)
    if isinstance(Sq, Sym) and low(Sq) <= DECODE_MAX_SQ < high(Sq):
        on = size_at_least(Sq, DECODE_MAX_SQ + 1)
        variants = [
            (DECODE_MAX_SQ, f"{wgsl(Sq)} <= {DECODE_MAX_SQ}u", 1 - on),
            (Sq, f"{wgsl(Sq)} > {DECODE_MAX_SQ}u", on),
        ]
    else:
        variants = [(Sq, "", 1)]
    for at, gate, on in variants:
        if high(at) > DECODE_MAX_SQ or low(Sk) > DECODE_SPLIT_MIN_SK:
            _launch_variant(kc, dict(params, gate=gate), bindings, args, split, base, Sq, Sk, D, DV, nb, at, on)
            continue
        # a decode: up to DECODE_SPLIT_MIN_SK keys the one-launch kernel; past it (a dynamic key
        # length spanning it) the split decode's candidates too, both gated on Sk at dispatch

        long_ = size_at_least(Sk, DECODE_SPLIT_MIN_SK + 1) if high(Sk) > DECODE_SPLIT_MIN_SK else 0
        g0 = f"({gate}) && " if gate else ""
        if long_ != 1:
            short = f"{g0}{wgsl(Sk)} <= {DECODE_SPLIT_MIN_SK}u" if long_ != 0 else gate
            _launch_variant(
                kc,
                dict(params, gate=short),
                bindings,
                args,
                split,
                base,
                Sq,
                Sk,
                D,
                DV,
                nb,
                at,
                on * (1 - long_),
                keys=min(high(Sk), DECODE_SPLIT_MIN_SK),
            )
        if long_ != 0:
            _launch_variant(
                kc,
                dict(params, gate=f"{g0}{wgsl(Sk)} > {DECODE_SPLIT_MIN_SK}u"),
                bindings,
                args,
                split,
                base,
                Sq,
                Sk,
                D,
                DV,
                nb,
                at,
                on * long_,
            )


def _mult4(x):
    """Size x is a multiple of 4 for every value of its dimensions."""
    return x % 4 == 0 if isinstance(x, int) else exact_div(x, 4) is not None


def _ratio(ob, kb, vb):
    """Consecutive query heads (flat batch indices) that read one K/V matrix: the last batch
    dimension's ratio when k and v are indexed alike (grouped-query heads, or one K/V head
    broadcast), else 1."""
    if not ob or tuple(kb) != tuple(vb) or not isinstance(ob[-1], int):
        return 1
    n, s = ob[-1], kb[-1]
    if _is_one(s):
        return n
    return n // s if isinstance(s, int) and n % s == 0 else 1


def _launch_variant(kc, params, bindings, args, split, base, Sq, Sk, D, DV, nb, at, on, keys=None):
    """Choose (autotune) and launch one kernel among the candidates for query length `at` (Sq,
    or the largest Sq of the variant's range), `on` (1, or a Sym 0 outside the range) times
    its workgroup count. `keys`: a decode of at most that many keys (DECODE_SPLIT_MIN_SK), which
    runs one of the one-launch candidates (chosen, tuned, at that key length)."""
    lim = kc.device.limits.get("max-compute-workgroup-storage-size", WG_STORAGE)
    cands, heur = attention_candidates(at, Sk, D, DV, lim, ratio=split["ratio"])
    if keys is not None:
        one = [c for c in cands if not c["SPLIT"]]
        heur = one.index(cands[heur]) if cands[heur] in one else 0
        cands = one
    if cpu_device(kc.device):
        heur = 0
        row = row_config(at, Sk, D, DV) if keys is None and high(at) > DECODE_MAX_SQ else None
        if row is not None:  # (last: the other candidates keep their indices)
            cands, heur = cands + [row], len(cands)

    def fits(c):  # the one-workgroup-per-head decode kernel walks every key: only under the cap
        if c["STAGE"] or c["SPLIT"] or c.get("ROWS"):  # (ROWS: row_config checked it)
            return True
        per, fixed = _tile_iters(c, D, DV)
        return cdiv(high(Sk), c["BK"]) * per + fixed <= LOOP_BUDGET

    keep = [i for i, c in enumerate(cands) if fits(c)]  # (the split and tiled ones split keys)
    heur = keep.index(heur) if heur in keep else 0
    cands = [cands[i] for i in keep]
    scratch = {}

    def launches_of(c):
        """[(Kernel, args, groups)] of configuration c: one kernel, or the split decode's two, or
        the tiled kernel's key split and its reduce."""
        if c.get("ROWS"):
            q4 = split["quads"]
            rb = [dataclasses.replace(b, elem=f"vec4<{b.elem}>") if q4.get(b.name) else b for b in bindings]
            p = dict(params, **c, Q4=q4["q"], K4=q4["k"], V4=q4["v"], PASSES=_row_passes(DV))
            tag = "".join(x for x in "qkv" if q4[x])
            name = f"{base}_rows{c['RQ']}k{c['KC']}{'v4' + tag if tag else ''}"
            return [
                (Kernel(name, "attention_cpu.wgsl", p, rb), args, groups("_attention", nb * cdiv(Sq, c["BQ"]) * on))
            ]
        kind = "tile" if c["STAGE"] else "split" if c["SPLIT"] else "dec"
        if c["SPLIT"]:
            return _split_launches(kc, params, split, base, c, Sq, Sk, D, DV, nb, at, on, scratch)
        # NB3: output blocks a thread owns (tiled kernel)
        p = dict(params, **c, NB3=cdiv(c["BQ"] // 4 * cdiv(cdiv(DV, 4), c["RC4"]), c["WG"]), TPS=0)
        blocks = f"r{c['RK4']}{c['RC4']}" if c["STAGE"] and (c["RK4"], c["RC4"]) != (1, 1) else ""
        name = f"{base}_{kind}{c['BQ']}x{c['BK']}w{c['WG']}{blocks}"
        per, fixed = _tile_iters(p, D, DV)
        nkt = cdiv(high(Sk), c["BK"])
        if nkt * per + fixed <= LOOP_BUDGET:
            return [
                (Kernel(name, "attention.wgsl", p, bindings), args, groups("_attention", nb * cdiv(Sq, c["BQ"]) * on))
            ]
        if not c["STAGE"]:
            kc.check_loops("_attention", nkt * per + fixed)  # (not a candidate then: attention_candidates)
        # Keys past what one workgroup may walk (llvmpipe's loop cap, runtime/wgsl.py LOOP_BUDGET:
        # Sk ~13000 for lavapipe's tile): blocks of TPS tiles, a workgroup per (query tile, block)
        # writing the block's partials of its rows, then the split decode's reduce kernel. TPS is
        # fixed (not the block count), so a dynamic Sk gets a static build's blocks at every size.
        tps = (LOOP_BUDGET - fixed) // per
        nsb = cdiv(cdiv(Sk, c["BK"]), tps)
        rows = high(nb) * high(Sq)
        n = rows * cdiv(nkt, tps) * (DV + 2)
        if n not in scratch:
            scratch[n] = kc.scratch(4 * n)
        part = scratch[n]
        rb, ra = split["reads"]
        p = dict(p, TPS=tps, act="")  # (no store goes through act() here)
        first = (
            Kernel(f"{name}_ks{tps}", "attention.wgsl", p, rb + [Binding("pout", "f32", True)]),
            ra + [part],
            groups("_attention", nb * cdiv(Sq, c["BQ"]) * nsb * on),
        )
        red_b, red_a = split["reduce"]
        pr = dict(p, REDUCE=True, WG=64, act=params["act"], KS=1, SPLIT=cdiv(nkt, tps))
        second = (
            Kernel(f"{name}_ks{tps}_reduce", "attention.wgsl", pr, red_b),
            [part] + red_a[1:],
            groups("_attention", nb * Sq * on),
        )
        return [first, second]

    values = None
    if any(isinstance(x, Sym) for x in (Sq, Sk, nb)):  # timed at the maxima (of the variant's range)
        values = dict.fromkeys(kc.dims, 1)
        values.update(dim_maxes(Sq, Sk, nb))
        if isinstance(Sq, Sym) and at != Sq:
            values = fit_sizes(values, Sq, at)
        if keys is not None and isinstance(Sk, Sym) and keys < high(Sk):
            values = fit_sizes(values, Sk, keys)

    def measure(i):  # (autotune on hardware adapters: scratch buffers of the right sizes)
        return kc.timing_form(launches_of(cands[i]), values)

    problem = (
        "attention.wgsl",
        Sq,
        Sk,
        D,
        DV,
        nb,
        len(bindings),
        sorted((key, repr(val)) for key, val in params.items() if key != "act"),
        cands,
    )
    if keys is not None:
        problem += (keys,)
    best = autotune.choose(kc, autotune.signature_of(problem), cands, measure, heur)
    for kern, largs, g in launches_of(cands[best]):
        kc.launch(kern, largs, g)


def _tile_iters(p, D, DV):
    """(loop iterations per tile of keys, iterations outside the tile loop) of one invocation of
    the tiled (STAGE) or one-workgroup-per-head decode kernel with parameters p, counting every
    loop (llvmpipe counts a loop of n iterations as n + 1, and unrolls only some constant ones:
    an over-estimate is safe) against runtime/wgsl.py LOOP_BUDGET."""
    wg, bq, bk = p["WG"], p["BQ"], p["BK"]
    if p["STAGE"]:
        bq4, bk4 = bq // 4, bk // 4
        kb, tpr = bk4 // p["RK4"], wg // bq
        dvp = -(-(-(-DV // 4)) // p["RC4"]) * p["RC4"]
        per = (
            1
            + (-(-D * bk4 // wg) + 1)
            + -(-bq4 * kb // wg) * (D + 1)
            + 1
            + 2 * (-(-bk // tpr) + 1)
            + (-(-bk * dvp // wg) + 1)
            + 2 * (tpr + 1)
            + p["NB3"] * (bk + 1)
        )
        return per, -(-D * bq4 // wg) + 64
    # decode kernel (one workgroup per head): per tile a thread's key (D), the row statistics
    # (BK a row, rows in turn) and the outputs (the tile's keys, for each of its columns)
    per = 1 + bq * (D + 1) + 4 * bq * (bk + 1) + -(-DV // wg) * bq * (bk + 1) + 16
    return per, -(-bq * D // wg) + 64


def _split_iters(c, D, DV, ks):
    """Loop iterations per tile of keys of one invocation of the split decode kernel (as
    _tile_iters)."""
    rb, wg, bk = c["GR"] * c["BQ"], c["WG"], c["BK"]
    tpr = wg // rb
    return 1 + (D + 1) + 2 * (-(-bk // tpr) + 1) + 2 * (tpr + 1) + (-(-bk // ks) + 1)


def _split_launches(kc, params, split, base, c, Sq, Sk, D, DV, nb, at, on, scratch):
    """The split decode (flash-decoding): partials of each (group of GR heads, block of keys),
    then one reduce workgroup per output row. The partials (maximum, sum, DV outputs per row,
    block and key slice) live in a scratch buffer sized for the most blocks."""
    gr, wg = c["GR"], c["WG"]
    cols = DV // 4 if split["v4"] else DV  # a thread per column (or column quad) and key slice:
    ct = min(wg, cols)  # threads of a slice (NU columns each, CT apart)
    ks = wg // ct  # key slices of a tile (threads beyond the columns sum other keys)
    # more blocks where a block's tiles would loop past llvmpipe's cap (runtime/wgsl.py
    # LOOP_BUDGET): at most `tps` tiles a block
    tps = (LOOP_BUDGET - 64 - D) // _split_iters(c, D, DV, ks)
    c = dict(c, SPLIT=max(c["SPLIT"], cdiv(cdiv(high(Sk), c["BK"]), tps)))
    rows = high(nb) * min(high(Sq), high(at))
    n = rows * c["SPLIT"] * ks * (DV + 2)
    if n not in scratch:  # (one buffer for every candidate measured, and the launches)
        scratch[n] = kc.scratch(4 * n)
    part = scratch[n]
    nkt = cdiv(Sk, c["BK"])
    ns = cdiv(nkt, cdiv(nkt, c["SPLIT"]))  # blocks: whole tiles, as the kernels count them
    ng = exact_div(nb, gr)
    p = dict(
        params, **c, KS=ks, CT=ct, NU=cdiv(cols, ct), V4=split["v4"], NB3=0, act=""
    )  # (no store goes through act() here)
    rb, ra = split["reads"]
    if split["v4"]:  # q, k and v as vec4
        rb = [dataclasses.replace(b, elem=f"vec4<{b.elem}>") if b.name in ("q", "k", "v") else b for b in rb]
    tag = f"{c['BQ']}x{c['BK']}w{wg}s{c['SPLIT']}g{gr}{'v4' if split['v4'] else ''}"
    first = (
        Kernel(f"{base}_split{tag}", "attention.wgsl", p, rb + [Binding("part", "f32", True)]),
        ra + [part],
        groups("_attention", ng * ns * on),
    )
    red_b, red_a = split["reduce"]
    pr = dict(p, REDUCE=True, WG=64, act=params["act"])
    second = (
        Kernel(f"{base}_reduce{tag}", "attention.wgsl", pr, red_b),
        [part] + red_a[1:],
        groups("_attention", nb * Sq * on),
    )
    return [first, second]
