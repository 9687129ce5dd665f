"""matmul and gemm: one batched GEMM kernel family (shaders/matmul.wgsl).

Static sizes, strides, transposes and batch broadcasting are baked into the WGSL as constants.
Two paths: a shared-memory tiled, register-blocked kernel (64 or 256 threads with
8x8 to 4x4 outputs each: 128x128 down to 16x8 output tiles, optionally split-K) whose
configuration is autotuned per signature on hardware adapters (runtime/autotune.py), and a
GEMV kernel for M <= 4. The fused epilogue (activations,
residual operands; gemm's alpha, beta * c) is applied as each output is stored. conv.py reuses `gemm_launch`.

Dynamic dimensions (mltensor/dynamic/): matmul and gemm take M, N, K and batch dimensions known
only at dispatch. Such a size reaches the WGSL as an expression over the immediate `dims` (the
template reads every size through `sz`, which names its constant when static), workgroup counts
are evaluated per dispatch, and variants are chosen on what holds for every size: vec4 loads and
unchecked edges only where structurally valid (`K % 4 == 0` for `4*seq`), split-K with a fixed
chunk count (a chunk's length follows K). The range of M (or else N) is cut into at most
MAX_VARIANTS size buckets (_variants): the GEMV range (M <= GEMV_MAX_M) and the ranges where the
tile chosen at a bucket's maximum changes (lavapipe's 8 rows a thread from M >= 8*TY, the
candidates' 64- and 128-row tiles); each bucket's configuration is chosen (tuned) at its maximum,
and each is launched gated on its sizes at dispatch (outside its bucket, a single workgroup that
returns at once), so a size runs the tile a static build of the bucket's maximum runs, and the
path a static build of that size runs.
"""

import dataclasses
import math

from .. import dtypes
from ..dynamic.dims import Condition, Sym, cdiv, high, low, smax, smin, wgsl
from ..dynamic.kernels import MAX_GROUPS, grid
from ..errors import NotSupportedError
from ..front.builder import builder_op
from ..runtime import autotune
from ..runtime.wgsl import LOOP_BUDGET, WORKGROUP, Binding, Kernel, binop, f32_lit, store_fn
from . import (MAX_RANK, broadcast_shapes, check_bool, check_number, check_support, lowering, merge_dims, radix,
               register, row_strides, same_type, unidirectional)

FLOAT = dtypes.FLOATS
GEMV_MAX_M = 4

# Builder methods taking operands with dynamic dimensions (mltensor/dynamic/)
DYNAMIC_OPS = frozenset({"matmul", "gemm"})


def batch_offset_expr(batch_shape, out_batch, matrix_size):
    """WGSL expression (in `bt`, the flat output batch index) for the flat offset of the matrix
    of an operand whose batch shape `batch_shape` broadcasts to `out_batch` (sizes may be Syms)."""
    r = len(out_batch)
    s = (1,) * (r - len(batch_shape)) + tuple(batch_shape)
    if isinstance(matrix_size, Sym) and all(isinstance(d, int) and d == 1 for d in out_batch):
        return "0u"  # one matrix (bt is 0): no multiplication by a size read at dispatch
    if tuple(s) == tuple(out_batch):
        return f"bt * {wgsl(matrix_size)}" if matrix_size != 1 else "bt"
    strides = row_strides(s)
    terms, inner = [], 1
    for d in range(r - 1, -1, -1):
        if s[d] != 1:
            c = f"(bt / {wgsl(inner)})" if inner != 1 else "bt"
            if d > 0:
                c = f"({c} % {wgsl(out_batch[d])})"
            terms.append(f"{c} * {wgsl(strides[d] * matrix_size)}")
        inner *= out_batch[d]
    return " + ".join(terms) if terms else "0u"


def _sizes(**sizes):
    """The template's `sz`: each size, the name of its constant when static (the template
    declares `const M = 12u;`), else the Sym, which the kernel renders reading it at dispatch."""
    return {n: v if isinstance(v, Sym) else n for n, v in sizes.items()}


def _grid(n, name):
    """grid(n); for a count known at dispatch, NotSupportedError at build when its maximum does
    not fit a folded 2-D grid (kernels rebuild the linear index as wid.y * nwg.x + wid.x)."""
    if isinstance(n, Sym) and n.hi > MAX_GROUPS * MAX_GROUPS:
        raise NotSupportedError(f"[{name.split('_')[0]}] {n} workgroups (up to {n.hi}) exceed "
                                f"{MAX_GROUPS}x{MAX_GROUPS}")
    return grid(n)


def _common_k(ka, kb):
    """The K of a GEMM whose operands give K as ka and kb (equal at dispatch, see _check_k): a
    static one where there is one, else the tighter bound."""
    if ka == kb or isinstance(ka, int):
        return ka
    if isinstance(kb, int) or kb.hi < ka.hi:
        return kb
    return ka


def _check_k(b, ka, kb, message):
    """K of A (ka) and of B (kb) must be equal: structurally at build, or, where a dynamic
    dimension makes them differ only by name or by a size within its range, checked by each
    dispatch (b._require_equal). TypeError(message) where they can never be equal."""
    if ka == kb:
        return
    if isinstance(ka, int) and isinstance(kb, int) or low(ka) > high(kb) or low(kb) > high(ka):
        raise TypeError(message)
    b._require_equal(ka, kb, message)


def _dim_maxes(*sizes):
    """{dimension name: max_size} of the named dimensions in sizes (their atoms, recursively)."""
    out = {}

    def walk(x):
        if isinstance(x, Sym):
            for mono in x.terms:
                for atom in mono:
                    if atom.kind == "dim":
                        out[atom.args[0]] = atom.args[1]
                    else:
                        for y in atom.args:
                            walk(y)

    for x in sizes:
        walk(x)
    return out


# A tile configuration: TX x TY threads, RM x RN outputs each ((TY RM) x (TX RN) tile), depth BK,
# SPLIT K chunks (split-K; partial sums in scratch, then a reduction fused with the epilogue).
# DB: double-buffered staging (two tiles in workgroup memory, one barrier a step).
def _cfg(tx, ty, rm, rn, bk, split=1, db=False):
    return {"TX": tx, "TY": ty, "RM": rm, "RN": rn, "BK": bk, "SPLIT": split, "DB": db}


def _smem(c):
    """Workgroup memory bytes of a configuration."""
    return 4 * c["BK"] * (c["TY"] * c["RM"] + c["TX"] * c["RN"]) * (2 if c["DB"] else 1)


def lavapipe_config(M, N, K, smem_limit=None):
    """The tiles measured best on lavapipe (2 CPU cores run every workgroup): the heuristic on
    CPU adapters, and candidate 0 everywhere. smem_limit: the device's workgroup memory (default
    WebGPU's 16 KiB); BK is halved until the tiles fit it."""
    # TY x TX = 64 threads, each RM x RN outputs. 8x8 outputs per thread (64x64 tiles: 16 vec4
    # loads per 64 FMAs) measured 1.5-2x faster than 4x4 on lavapipe at 512^3; 4 along a
    # dimension shorter than 64 so that small problems do not compute mostly padding.
    # Narrow N (MobileNet 1x1 convolutions to 8-16 channels): 16x4 or 32x2 threads make the
    # tile 16 or 8 columns wide instead of computing a 32-wide tile of mostly padding.
    rn = 8 if N >= 64 else 4
    tx = 8 if N > 16 else 4 if N > 8 else 2
    ty = 64 // tx
    rm = 8 if M >= 8 * ty else 4
    # Depth BK: 32, or K rounded up to a multiple of 8 when shorter (one staging round and two
    # barriers instead of several: 1.3-1.5x on the K = 16..24 1x1 convolutions of MobileNets)
    c = _cfg(tx, ty, rm, rn, min(32, -(-K // 8) * 8))
    while _smem(c) > (smem_limit or WG_STORAGE) and c["BK"] > 4:
        c["BK"] //= 2  # a 256x8 tile with BK 32 needs 33 KiB
    return c


# Workgroups that fill a large GPU (an H100 has 132 SMs; two resident workgroups each): below
# this, split-K trades a second small pass for more parallelism along K.
FILL_GROUPS = 264
WG_STORAGE = 16384  # WebGPU's default maxComputeWorkgroupStorageSize: every candidate fits it


def _tiles(M, N, batch, c):
    return -(-M // (c["TY"] * c["RM"])) * -(-N // (c["TX"] * c["RN"])) * batch


def _split_for(M, N, K, batch, c):
    """Split factor making the grid fill the GPU, each chunk at least 8 BK deep (else 1)."""
    tiles = _tiles(M, N, batch, c)
    s = 1
    while s < 16 and tiles * s * 2 <= FILL_GROUPS and K // (s * 2) >= 8 * c["BK"]:
        s *= 2
    return s


def gemm_candidates(M, N, K, batch, smem_limit=None):
    """(candidates, GPU heuristic index): a small set, every entry valid for any shape (ragged
    edges are bounds-checked), so the tuner may pick any of them."""
    cands = [lavapipe_config(M, N, K, smem_limit)]
    shapes = []
    # larger tiles only where they are not mostly padding
    if M >= 128 and N >= 128:
        shapes += [(16, 16, 8, 8, 8)]  # 128x128, 256 threads: the large-GEMM tile
    if M >= 64 and N >= 128:
        shapes += [(16, 16, 4, 8, 8)]  # 64x128
    if M >= 128 and N >= 64:
        shapes += [(16, 16, 8, 4, 8)]  # 128x64
    shapes += [(16, 16, 4, 4, 16), (8, 8, 8, 8, 16)]  # 64x64 with 256 or 64 threads
    for sh in shapes:
        c = _cfg(*sh)
        if c not in cands:
            cands.append(c)
        s = _split_for(M, N, K, batch, c)
        if s > 1:
            cands.append(_cfg(*sh, split=s))
    # Double-buffered variants of the GPU tiles, where K leaves several steps to overlap and two
    # tiles fit the workgroup memory (not split: a split's chunk is short already).
    for sh in shapes:
        c = _cfg(*sh, db=True)
        if K >= 4 * c["BK"] and _smem(c) <= WG_STORAGE:
            cands.append(c)
    # Heuristic (hardware adapters without tuning): on an H100 (bench/results/REPORT-h100-kernels.md)
    # the 256-thread 64x64 BK=16 tile won most resnet50 layers and 64x128 the square matmuls;
    # split-K whenever the grid is under half full.
    pick = _cfg(16, 16, 4, 8, 8) if _cfg(16, 16, 4, 8, 8) in cands and M * N * batch >= 1 << 20 else _cfg(16, 16, 4, 4, 16)
    h = cands.index(pick)
    if _tiles(M, N, batch, pick) * 2 < FILL_GROUPS and h + 1 < len(cands) and cands[h + 1]["SPLIT"] > 1:
        h += 1
    return cands, h


def _tiled_iters(c, kchunk, rms=False, ku=1):
    """Loop iterations of one invocation of the tiled kernel over kchunk of K: per BK step, the
    step loop, the BK-deep compute loop (BK / ku: `ku` steps of k an iteration; the RMS
    prologue's loop besides) and the staging loops (AS / THREADS + BS / THREADS; the register
    blocks are unrolled), and a margin for the store. llvmpipe counts a loop of n iterations as
    n + 1 (its exit test): measured, lavapipe's 128x8 tile (53 a step of 32) summed only the
    first 39560 of K = 40000-44000."""
    threads, bk = c["TX"] * c["TY"], c["BK"]
    per = (1 + (bk // ku + 1) + (bk + 1 if rms else 0) + cdiv(c["TY"] * c["RM"] * bk // 4, threads) + 1
           + cdiv(c["TX"] * c["RN"] * bk // 4, threads) + 1)
    return cdiv(kchunk, bk) * per + 16


def _loop_split(c, K, rms=False):
    """The least split-K factor (at least the configuration's) keeping every invocation of the
    tiled kernel under llvmpipe's loop cap (runtime/wgsl.py LOOP_BUDGET) for every allowed K:
    K >= ~40000 on lavapipe's tile, which would otherwise silently sum only a prefix of K."""
    split, bk = c["SPLIT"], c["BK"]
    while _tiled_iters(c, cdiv(high(K), split * bk) * bk, rms) > LOOP_BUDGET:
        split += 1
    return split


POST_NORM_KU = 4  # k steps an iteration of the post-norm kernel's compute loop (matmul.wgsl KU)


def _post_norm_iters(c, N, K):
    """Loop iterations of one invocation of a GEMM + normalization (post_ln): the K walk of every
    column tile of its rows, then per row it normalizes (BM / THREADS rows a thread) the mean,
    deviation and store walks over N and the row loop."""
    threads, bm, bn = c["TX"] * c["TY"], c["TY"] * c["RM"], c["TX"] * c["RN"]
    return (cdiv(N, bn) * (1 + _tiled_iters(c, high(K), ku=POST_NORM_KU))
            + cdiv(bm, threads) * (3 * (N + 1) + 1) + 1)


def post_norm_fits(M, N, K):
    """A GEMM of these sizes can take the normalization after it (compiler/passes.py
    fuse_post_norms): some tile of _post_norm_cands keeps its invocations under the loop
    budget (its workgroups walk whole rows, and cannot split K)."""
    cands, _ = gemm_candidates(high(M), N, high(K), 1)
    return bool(_post_norm_cands(cands, 0, N, K)[0])


def _gemv_iters(K):
    """Loop iterations of a GEMV invocation: its threads' walk over K (64 threads) and the tree."""
    return cdiv(high(K), 64) + 16


def _tiled_launches(kc, name, template, params, bindings, args, M, N, K, batch, c, gate=None):
    """[(Kernel, args, groups)] of one configuration of the tiled path. Sizes may be Syms;
    `gate` (a _Bucket, gemm_launch): the sizes this variant runs at, checked at dispatch (else
    one workgroup returning at once)."""
    p = dict(params, M=M, N=N, K=K, batch=batch, path="tiled", **c)
    p.setdefault("vec_a", False)
    p.setdefault("vec_b", False)
    p.setdefault("a_kmajor", p["vec_a"])
    for k in ("a_at", "b_fused", "b4_fused", "b_quad", "gemv_loop", "fused_store", "fused_copy", "fused_rms",
              "post_ln"):  # (_fused_matmul's, _post_norm's; conv2d.wgsl has its own loaders)
        p.setdefault(k, "")
    p.setdefault("fused_w", 4)
    p.setdefault("b_kmajor", False)
    if p["post_ln"]:  # whole rows a workgroup, no split (_post_norm_cands keeps the tiles that fit)
        p["KU"] = POST_NORM_KU
        kc.check_loops(_op_name(kc, name), _post_norm_iters(c, N, K))
    elif not p["fused_store"]:  # (split-K cannot run a fused store: _no_split; the guard below refuses)
        c = dict(c, SPLIT=_loop_split(c, K, bool(p["fused_rms"])))
    bm, bn, bk, split = c["TY"] * c["RM"], c["TX"] * c["RN"], c["BK"], c["SPLIT"]
    # the staging loops give each thread fixed m / k quads (setup_a, conv2d.wgsl's hoisting)
    assert (c["TX"] * c["TY"]) % (bm // 4) == 0 and bk % 4 == 0, c
    tiles_m, tiles_n = cdiv(M, bm), cdiv(N, bn)
    if p["post_ln"]:
        tiles_n = 1  # a workgroup walks every column tile of its rows (then normalizes them)
    tiles = tiles_m * tiles_n * batch
    # a split's K range, a multiple of BK; for a dynamic K a fixed number of chunks whose length
    # follows K (chunks past K, at small sizes, are empty: their partial sums are 0)
    kchunk = cdiv(K, split * bk) * bk if split > 1 else K
    # edges need bounds checks unless every size is a whole number of tiles (structurally, for Syms)
    p.setdefault("check_a", M % bm != 0 or K % bk != 0)
    p.setdefault("check_b", N % bn != 0 or K % bk != 0)
    p.setdefault("check_out", M % bm != 0 or N % bn != 0)
    # Dynamic sizes: a tile inside the edges (most of a large GEMM) stages whole steps of K with
    # unchecked loads, the edge tiles and the last step with the checked ones (the static kernels
    # know which checks each size needs and keep one staging). 512^3 on lavapipe: 1.24x -> 1.10x
    # the static kernel's time. (The same split of the stores measured no faster: not done.)
    dynamic = any(isinstance(x, Sym) for x in (M, N, K, batch))
    p.setdefault("edge_a", dynamic and p["check_a"])
    p.setdefault("edge_b", dynamic and p["check_b"])
    p["gate"] = gate.condition() if gate is not None else ""
    threads = "" if c["TX"] * c["TY"] == 64 else f"w{c['TX'] * c['TY']}"
    kname = f"{name}_t{bm}x{bn}k{bk}{threads}{'db' if c['DB'] else ''}"
    on = 1 if gate is None else gate.sym()
    if split > 1 and isinstance(kchunk, int):
        split = -(-K // kchunk)  # chunks actually used
    kc.check_loops(_op_name(kc, name), _tiled_iters(c, cdiv(high(K), split * bk) * bk if split > 1 else high(K),
                                                bool(p["fused_rms"])))
    p.update(tiles_m=tiles_m, tiles_n=tiles_n, tiles=tiles, kchunk=kchunk, SPLIT=split,
             sz=_sizes(M=M, N=N, K=K, BATCH=batch, TILES_M=tiles_m, TILES_N=tiles_n, TILES=tiles,
                       KCHUNK=kchunk))
    # Dynamic sizes: a 3-D grid where every count fits (the tile is then the workgroup id, no
    # division by a size per invocation: 10-15% of a 512^3 GEMM on lavapipe), else the folded
    # 1-D grid of the static kernels
    p["grid3"] = dynamic and max(high(tiles_n), high(tiles_m), high(batch) * split) <= MAX_GROUPS
    if p["grid3"]:
        groups = (tiles_n * on, tiles_m * on, batch * split * on)
    else:
        groups = _grid(tiles * split * on, name)
    if split == 1:
        return [(Kernel(kname, template, p, bindings), list(args), groups)]
    part = kc.scratch(4 * split * high(batch * M * N))
    b1 = list(bindings) + [Binding("part", "f32", True)]
    b2 = list(bindings) + [Binding("part", "f32")]
    r = dict(p, path="splitk_reduce", check_out=False)
    return [(Kernel(f"{kname}_s{split}", template, p, b1), list(args) + [part], groups),
            (Kernel(f"{kname}_s{split}_reduce", template, r, b2), list(args) + [part],
             _grid(cdiv(batch * M * N, WORKGROUP) * on, name))]


# -- dynamic sizes: one gated variant per size bucket ---------------------------------------------

MAX_VARIANTS = 3  # launches of one dynamic GEMM, each gated on its bucket of sizes
MIN_GAIN = 1.1  # a bucket boundary is kept only where it saves at least this factor of padded work


def _at_least(x, t):
    """A size expression that is 1 where size x >= t, else 0 (x >= 1)."""
    return 1 if t <= max(1, low(x)) else smin(x // t, 1)


@dataclasses.dataclass(frozen=True)
class _Bucket:
    """Sizes one variant of a dynamic GEMM runs at: lo <= x <= hi for each (x, lo, hi) of conds
    (x: M or N, a Sym; a bound that every size meets is not checked). `at`: (M, N), the sizes
    its configuration is chosen (and tuned) at, its maxima."""

    conds: tuple
    at: tuple

    def sym(self):
        """1 where the sizes are in the bucket, else 0: the factor of its workgroup counts."""
        on = 1
        for x, lo, hi in self.conds:
            on = on * (_at_least(x, lo) - (_at_least(x, hi + 1) if hi < high(x) else 0))
        return on

    def condition(self):
        """The condition of the bucket (its kernels return at once where it fails), rendered by
        the kernel (dims.Condition)."""
        out = []
        for x, lo, hi in self.conds:
            if lo > max(1, low(x)):
                out.append((x, ">=", lo))
            if hi < high(x):
                out.append((x, "<=", hi))
        return Condition(out)

    def key(self):
        return tuple((str(x), lo, hi) for x, lo, hi in self.conds)


def _padded(c, m, n):
    """Output elements a configuration computes for an m x n GEMM (whole tiles)."""
    bm, bn = c["TY"] * c["RM"], c["TX"] * c["RN"]
    return -(-m // bm) * bm * -(-n // bn) * bn


def _pieces(key, a, b):
    """[(lo, hi, key)]: [a, b] cut where key(size) changes (found by doubling then bisection;
    the choices are piecewise constant in a size, changing at a few thresholds)."""
    out, lo = [], a
    while lo <= b:
        k, hi, step = key(lo), lo, 1
        while hi < b and key(min(b, lo + step)) == k:
            hi, step = min(b, lo + step), step * 2
        if hi < b:
            bad = min(b, lo + step)
            while bad - hi > 1:
                mid = (hi + bad) // 2
                hi, bad = (mid, bad) if key(mid) == k else (hi, mid)
        out.append([lo, hi, k])
        lo = hi + 1
    return out


def _buckets(pieces, room, cfg_at, padded):
    """Merge adjacent pieces [lo, hi, key] (a merged piece takes the upper one's configuration,
    chosen at its maximum) until at most `room` remain and every boundary left saves at least
    MIN_GAIN: the cost of merging piece i into i + 1 is the padded work of i + 1's configuration
    over i's own, the worst at i's smallest, middle and largest size (for a smaller split-K
    factor, at least the factor lost)."""
    def cost(i):
        lo, hi = pieces[i][0], pieces[i][1]
        c0, c1 = cfg_at(hi), cfg_at(pieces[i + 1][1])
        r = max(padded(c1, s) / padded(c0, s) for s in (lo, (lo + hi) // 2, hi))
        return max(r, c0["SPLIT"] / c1["SPLIT"])

    pieces = [list(p) for p in pieces]
    while len(pieces) > 1:
        costs = [cost(i) for i in range(len(pieces) - 1)]
        i = min(range(len(costs)), key=costs.__getitem__)
        if len(pieces) <= room and costs[i] >= MIN_GAIN:
            break
        pieces[i + 1][0] = pieces[i][0]
        del pieces[i]
    return [(lo, hi) for lo, hi, _ in pieces]


def _fit(values, x, target):
    """values with the dimensions of size x lowered (in proportion to their maxima) so that x is
    as large as it can be without exceeding target."""
    names = sorted(x.names())
    if len(names) == 1 and x == Sym.dim(names[0], values[names[0]]):
        return dict(values, **{names[0]: target})
    maxes = {n: values[n] for n in names}
    T = 1 << 16

    def at(t):
        return dict(values, **{n: max(1, v * t // T) for n, v in maxes.items()})

    lo, hi = 0, T
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if x.eval(at(mid)) <= target else (lo, mid)
    return at(lo)


def _variants(kc, cpu, M, N, K, batch):
    """[(gemv, _Bucket or None)]: the paths and size buckets a GEMM launches. Static sizes: one
    path, ungated. Dynamic ones: the GEMV path for M <= GEMV_MAX_M and the tiled path above it,
    the tiled range cut where the configuration chosen at a bucket's maximum changes (the
    heuristic's tile, or with tuning the candidate list), along M or else N, into at most
    MAX_VARIANTS variants in all; each variant's kernels check its bucket at dispatch."""
    mlo, mhi = max(1, low(M)), high(M)
    if _gemv_iters(K) > LOOP_BUDGET:  # K past ~3.8M: the GEMV's threads would loop past the cap
        return [(False, None)]
    if not any(isinstance(x, Sym) for x in (M, N, K, batch)) or not isinstance(M, Sym) and not isinstance(N, Sym):
        return [(mhi <= GEMV_MAX_M, None)]
    hN, hK, hb = high(N), high(K), high(batch)
    nlo = max(1, low(N))
    out = []
    if mlo <= GEMV_MAX_M:
        out.append((True, _Bucket(((M, mlo, min(mhi, GEMV_MAX_M)),), (min(mhi, GEMV_MAX_M), hN))))
    if mhi <= GEMV_MAX_M:
        return [(True, None)]
    a = max(mlo, GEMV_MAX_M + 1)
    lim = kc.device.limits.get("max-compute-workgroup-storage-size", WG_STORAGE)
    tuning = autotune.enabled(kc.device) or autotune.forced_index(2) is not None

    def cfg(m, n):  # the configuration the heuristic picks
        if cpu:
            return lavapipe_config(m, n, hK, lim)
        cands, h = gemm_candidates(m, n, hK, hb, lim)
        return cands[h]

    def key(m, n):
        if not tuning:
            return repr(cfg(m, n))
        return repr(gemm_candidates(m, n, hK, hb, lim))

    room = MAX_VARIANTS - len(out)
    axis = []
    if isinstance(M, Sym):
        pm = _pieces(lambda m: key(m, hN), a, mhi)
        axis.append((len(pm), 0, pm))
    if isinstance(N, Sym):
        pn = _pieces(lambda n: key(mhi, n), nlo, hN)
        axis.append((len(pn), 1, pn))
    _, ax, pieces = max(axis, key=lambda t: (t[0] > 1, -t[1]))  # M where it has pieces
    if ax == 0:
        spans = _buckets(pieces, room, lambda m: cfg(m, hN), lambda c, m: _padded(c, m, hN))
        tiled = [_Bucket(((M, lo, hi),), (hi, hN)) for lo, hi in spans]
    else:
        spans = _buckets(pieces, room, lambda n: cfg(mhi, n), lambda c, n: _padded(c, mhi, n))
        mc = ((M, a, mhi),) if a > mlo else ()
        tiled = [_Bucket(mc + ((N, lo, hi),), (mhi, hi)) for lo, hi in spans]
    if len(tiled) == 1 and not out:
        return [(False, None)]
    return out + [(False, t) for t in tiled]


def gemm_launch(kc, name, template, params, bindings, args, M, N, K, batch):
    """Pick the path and configuration for an (M x K) * (K x N) GEMM over `batch` matrices and
    launch it. `params` are the template's loader parameters; the kernel name gets the path and
    configuration appended. The configuration is autotuned on hardware adapters (autotune.py).

    Sizes may be Syms (dynamic dimensions): the sizes are cut into buckets (_variants: the GEMV
    range of M, and the ranges of M or N where a different tile would be chosen), each launched
    with its configuration chosen (tuned) at the bucket's maximum and a workgroup count that is
    0 (1 workgroup returning at once) outside the bucket."""
    cpu = str(kc.device.adapter.info.get("adapter_type", "")).upper() == "CPU"
    if params.get("post_ln"):
        # a normalization after the GEMM (Step.post_norm): one tiled kernel for every size (its
        # workgroups own whole rows; the GEMV path's own columns)
        _gemm_path(kc, cpu, False, name, template, params, bindings, args, M, N, K, batch)
        return
    # a size whose bounds lose its positivity (a product of differences: a transposed conv's
    # N * 2H * (3W - 1)) is checked >= 1 at dispatch: as max(x, 1) its bounds say so, for the
    # tile counts and remainders below
    M, N, K, batch = (smax(x, 1) if isinstance(x, Sym) and low(x) < 1 else x for x in (M, N, K, batch))
    for gemv, bucket in _variants(kc, cpu, M, N, K, batch):
        _gemm_path(kc, cpu, gemv, name, template, params, bindings, args, M, N, K, batch, bucket)


def _gemm_path(kc, cpu, gemv, name, template, params, bindings, args, M, N, K, batch, gate=None):
    hM, hN, hK, hb = high(M), high(N), high(K), high(batch)
    if gate is not None:
        hM, hN = gate.at  # the bucket's maxima: chosen (tuned) there
    if gemv:
        # reduction in workgroup memory, or within subgroups first where the adapter has them
        cands = [{"SG": False}] + ([{"SG": True}] if "subgroup" in kc.device.features else [])
        launches = lambda c: _gemv_launches(name, template, params, bindings, args, M, N, K, batch, c, gate)  # noqa: E731
        heur = 0  # (the subgroup variant is unmeasured on GPUs; tuning decides there)
    else:
        lim = kc.device.limits.get("max-compute-workgroup-storage-size", WG_STORAGE)
        cands, heur = gemm_candidates(hM, hN, hK, hb, lim)
        if params.get("fused_store"):
            cands, heur = _no_split(cands, heur, params.get("fused_w", 4))
        if params.get("post_ln"):
            cands, heur = _post_norm_cands(cands, heur, hN, hK)
        launches = lambda c: _tiled_launches(kc, name, template, params, bindings, args, M, N, K, batch, c, gate)  # noqa: E731
        if cpu:
            heur = 0
    # Dynamic sizes: timed at the maximum of the bucket (immediates and workgroup counts of
    # those sizes)
    values = None
    if any(isinstance(x, Sym) for x in (M, N, K, batch)):
        values = dict.fromkeys(kc.dims, 1)
        values.update(_dim_maxes(M, N, K, batch))
        if gate is not None:
            for x, _, hi in gate.conds:
                if hi < high(x):
                    values = _fit(values, x, hi)

    def measure(i):
        return kc.timing_form(launches(cands[i]), values)

    problem = (template, M, N, K, batch, len(bindings),
               sorted((k, repr(v)) for k, v in params.items() if k != "act"), cands)
    if gate is not None:
        problem += (gate.key(),)
    best = autotune.choose(kc, autotune.signature_of(problem), cands, measure, heur)
    for k, a, g in launches(cands[best]):
        kc.launch(k, a, g)


def _op_name(kc, name):
    """The operator a GEMM launch computes, for errors: the step's node, else the kernel name's head."""
    step = kc.step
    return step.node.op if step is not None and step.node is not None else name.split("_")[0]


def _gemv_launches(name, template, params, bindings, args, M, N, K, batch, c, gate=None):
    # (_variants takes the tiled path, which splits K, where the GEMV would loop past the cap)
    assert _gemv_iters(K) <= LOOP_BUDGET, (name, K)
    p = dict(params, M=M, N=N, K=K, batch=batch, path="gemv", **c)
    p.setdefault("vec_a", False)
    p.setdefault("vec_b", False)
    for k in ("a_at", "b_fused", "b4_fused", "b_quad", "gemv_loop", "fused_store", "fused_copy", "fused_rms", "post_ln"):
        p.setdefault(k, "")
    assert not p["post_ln"], "a normalization after the GEMM runs on the tiled path only"
    p.setdefault("fused_w", 4)
    cols = cdiv(N, p["fused_w"] if p["fused_store"] else 4)
    groups = batch * cols
    p.update(cols=cols, groups=groups, sz=_sizes(M=M, N=N, K=K, BATCH=batch, COLS=cols, GROUPS=groups))
    p.setdefault("check_a", isinstance(M, Sym) or M < 4)
    p.setdefault("check_b", N % 4 != 0)
    p.setdefault("check_out", N % 4 != 0)
    p.update(edge_a=False, edge_b=False)
    p["gate"] = gate.condition() if gate is not None else ""
    on = 1 if gate is None else gate.sym()
    # dynamic sizes: (column quads, batch) where both fit, so that no invocation divides by a size
    p["grid3"] = (any(isinstance(x, Sym) for x in (M, N, K, batch))
                  and max(high(cols), high(batch)) <= MAX_GROUPS)
    g = (cols * on, batch * on, 1) if p["grid3"] else _grid(groups * on, name)
    return [(Kernel(f"{name}_gemv{'_sg' if c['SG'] else ''}", template, p, bindings), list(args), g)]


# vec4 global loads in matmul: on for hardware adapters; off on CPU adapters, where the transposed
# workgroup-memory writes of A measured slower on lavapipe (512^3: ~95-155 ms vs ~80-95 ms, noisy
# shared cores). Tests set it to True to check the vec4 path on lavapipe.
VEC_LOADS = None


def vec_loads(kc):
    if VEC_LOADS is not None:
        return VEC_LOADS
    return str(kc.device.adapter.info.get("adapter_type", "")).upper() != "CPU"


# -- matmul ---------------------------------------------------------------------------------

register(
    "matmul",
    {"a": FLOAT, "b": FLOAT, "output": FLOAT},
    ranks={"a": (2, MAX_RANK), "b": (2, MAX_RANK)},
)


@builder_op
def matmul(b, a, c, *, label=None):
    """Matrix product of `a` [..., M, K] and `c` [..., K, N] (WebNN's operand names are a and b)
    -> [..., M, N], batch dimensions broadcast; 1-D operands are not allowed (rank >= 2).
    Runs on the tiled GEMM kernel family (or the GEMV path for M <= 4); activations and
    residual adds after it are fused into its stores."""
    # IDL: MLOperand matmul(MLOperand a, MLOperand b, optional MLOperatorOptions options = {});
    b._operand(a, "matmul", "a")
    b._operand(c, "matmul", "b")
    check_support("matmul", a=a, b=c)
    same_type("matmul", ("a", a), ("b", c))
    _check_k(b, a.shape[-1], c.shape[-2],
             f"[matmul] columns of a ({a.shape[-1]}) must equal rows of b ({c.shape[-2]}); "
             f"shapes {list(a.shape)} and {list(c.shape)}")
    batch = broadcast_shapes("matmul", a.shape[:-2], c.shape[:-2])
    shape = tuple(batch) + (a.shape[-2], c.shape[-1])
    return b._emit1("matmul", [a, c], {}, a.data_type, shape, label)


@lowering("matmul")
def _lower_matmul(kc, node):
    a, b = node.inputs
    out = kc.out(node)
    M, ka, kb, N = a.shape[-2], a.shape[-1], b.shape[-2], b.shape[-1]
    K = _common_k(ka, kb)  # ka and kb are equal at dispatch (matmul's _check_k)
    ob = out.shape[:-2]
    batch = math.prod(ob)
    params = {
        "a_base": batch_offset_expr(a.shape[:-2], ob, M * ka),
        "b_base": batch_offset_expr(b.shape[:-2], ob, kb * N),
        "a_sm": ka, "a_sk": 1, "b_sk": N, "b_sn": 1,
        "alpha": 1.0, "beta": 0.0, "has_c": False,
    }
    # 16-byte loads where rows are whole vec4s (row-major A with K % 4, B with N % 4): for a
    # dynamic size, only where that holds for every size (4*seq)
    vec = vec_loads(kc)
    params.update(vec_a=vec and ka % 4 == 0, vec_b=vec and N % 4 == 0)
    t = kc.wtype(a)  # f32, or f16 (loaded into f32 accumulators, stored through ST)
    params["ST"] = store_fn(t)
    bindings = [Binding("a", f"vec4<{t}>" if params["vec_a"] else t),
                Binding("b", f"vec4<{t}>" if params["vec_b"] else t), Binding("out", t, True)]
    args = [a, b, out]
    params["act"] = kc.epilogue(bindings, args)
    ln = _post_norm(kc, params, bindings, args, "out")
    name = f"matmul_{t}_{f'b{batch}_' if isinstance(batch, Sym) or batch > 1 else ''}{M}x{K}x{N}{ln}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, batch)




# -- gemm -----------------------------------------------------------------------------------

register(
    "gemm",
    {"a": FLOAT, "b": FLOAT, "c": FLOAT, "output": FLOAT},
    ranks={"a": (2, 2), "b": (2, 2), "c": (0, 2)},
)


@builder_op
def gemm(b, a, bb, *, c=None, alpha=1.0, beta=1.0, a_transpose=False, b_transpose=False, label=None):
    """General matrix multiply of 2-D operands: alpha * A' @ B' + beta * C, where A' is `a`
    (transposed when `a_transpose`), B' is `bb` (transposed when `b_transpose`; WebNN's operand
    is named b) and `c` an optional operand that broadcasts to the [M, N] output."""
    # IDL: MLOperand gemm(MLOperand a, MLOperand b, optional MLGemmOptions options = {});
    b._operand(a, "gemm", "a")
    b._operand(bb, "gemm", "b")
    if c is not None:
        b._operand(c, "gemm", "c")
    check_support("gemm", a=a, b=bb, c=c)
    same_type("gemm", ("a", a), ("b", bb), ("c", c))
    alpha = check_number("gemm", "alpha", alpha)
    beta = check_number("gemm", "beta", beta)
    a_transpose = check_bool("gemm", "a_transpose", a_transpose)
    b_transpose = check_bool("gemm", "b_transpose", b_transpose)
    sa = a.shape[::-1] if a_transpose else a.shape
    sb = bb.shape[::-1] if b_transpose else bb.shape
    _check_k(b, sa[1], sb[0],
             f"[gemm] K of a ({sa[1]}) must equal K of b ({sb[0]}); shapes {list(a.shape)} "
             f"(a_transpose={a_transpose}) and {list(bb.shape)} (b_transpose={b_transpose})")
    shape = (sa[0], sb[1])
    if c is not None:
        unidirectional("gemm", c.shape, shape)
    attrs = {"alpha": alpha, "beta": beta, "a_transpose": a_transpose, "b_transpose": b_transpose}
    return b._emit1("gemm", [a, bb, c], attrs, a.data_type, shape, label)


@lowering("gemm")
def _lower_gemm(kc, node):
    a, b, c = node.inputs
    out = kc.out(node)
    at, bt = node.attrs["a_transpose"], node.attrs["b_transpose"]
    M, N = out.shape
    ka, kb = a.shape[0 if at else 1], b.shape[1 if bt else 0]
    K = _common_k(ka, kb)  # equal at dispatch (gemm's _check_k)
    params = {
        "a_base": "0u", "b_base": "0u",
        # A is [M, K] or, transposed, [K, M]; B is [K, N] or [N, K]
        "a_sm": 1 if at else ka, "a_sk": M if at else 1,
        "b_sk": 1 if bt else N, "b_sn": kb if bt else 1,
        "alpha": node.attrs["alpha"], "beta": node.attrs["beta"], "has_c": c is not None,
        # B transposed ([N, K], an ONNX Gemm with transB: fully connected layers) has k
        # contiguous: staged k-major on hardware adapters, so threads read consecutive words
        "b_kmajor": vec_loads(kc) and bt,
    }
    t = kc.wtype(a)  # f32, or f16 (loaded into f32 accumulators, stored through ST)
    params["ST"] = store_fn(t)
    bindings = [Binding("a", t), Binding("b", t)]
    args = [a, b]
    if c is not None:
        cs = (1,) * (2 - len(c.shape)) + tuple(c.shape)
        params["c_sm"] = cs[1] if cs[0] != 1 else 0
        params["c_sn"] = 1 if cs[1] != 1 else 0
        bindings.append(Binding("c", t))
        args.append(c)
    bindings.append(Binding("out", t, True))
    args.append(out)
    params["act"] = kc.epilogue(bindings, args)
    name = f"gemm_{t}_{M}x{K}x{N}{'_at' if at else ''}{'_bt' if bt else ''}{'_c' if c is not None else ''}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, 1)




# -- _fused_matmul (compiler/passes.py: views, rotary pairs, gated units, merged projections) ------

register("_fused_matmul", {"a": FLOAT, "b": FLOAT, "output": FLOAT})


def _no_split(cands, heur, w=4):
    """The candidates without split-K (a fused store writes whole quads through nodes that need
    the complete sum), with 8 columns a thread where the store takes octets (w 8), and the
    heuristic's index among them (its un-split twin)."""
    def fix(c):
        return dict(c, SPLIT=1, RN=8) if w == 8 else dict(c, SPLIT=1)

    pick = fix(cands[heur])
    out = []
    for c in cands:  # (the first, lavapipe's, halves BK itself where it must)
        if c["SPLIT"] == 1 and fix(c) not in out and (not out or _smem(fix(c)) <= WG_STORAGE):
            out.append(fix(c))
    return out, out.index(pick) if pick in out else 0


def _post_norm_cands(cands, heur, N, K):
    """Candidates of a GEMM whose workgroups own whole rows (Step.post_norm): no split-K (its
    partial sums are not the rows' values), and a walk over the row's N x K under the loop
    budget (post_norm_fits: the pass fuses only where one is left). (lavapipe's 64-row tile stays: 32-row tiles, twice
    the workgroups, measured 1.45x slower there for BERT's 128 x 3072 x 768 + LayerNorm, their
    4 x 8 blocks doing half the FMAs per staged load; the 64-row one is on par with the GEMM
    and the normalization kernel it replaces.)"""
    keep = [c for c in cands if c["SPLIT"] == 1 and _post_norm_iters(c, N, K) <= LOOP_BUDGET]
    return keep, keep.index(cands[heur]) if cands[heur] in keep else 0


def _post_norm(kc, params, bindings, args, out_name):
    """The normalization after the GEMM's epilogue (compiler/passes.py fuse_post_norms: the
    step's post_norm node): its scale and bias bound before the output (the last binding),
    `post_ln` the output binding holding the sums, `ln_dst` the one the normalized rows go to:
    the same one (in place), or where the sum is a value of its own (Step.outputs[1]) the
    normalization's output, bound last. Nothing where the step has none."""
    step = kc.step
    ln = step.post_norm if step is not None else None
    params.setdefault("post_ln", "")
    if ln is None:
        return ""
    _, scale, bias = ln.inputs
    for name, v in (("ln_s", scale), ("ln_b", bias)):
        if v is not None:
            bindings.insert(len(bindings) - 1, Binding(name, kc.wtype(v)))
            args.insert(len(args) - 1, v)
    dst = out_name
    if len(step.outputs) > 1:
        bindings.append(Binding("ln_o", kc.wtype(step.outputs[0]), True))
        args.append(step.outputs[0])
        dst = "ln_o"
    params.update(post_ln=out_name, ln_dst=dst, ln_eps=f32_lit(ln.attrs["epsilon"]), ln_scale=scale is not None,
                  ln_bias=bias is not None)
    return "_ln" if dst == out_name else "_ln2"


@lowering("_fused_matmul")
def _lower_fused(kc, node):
    """One GEMM over the plan's segments side by side (compiler/passes.py FusedPlan). Columns of a
    pair segment come in octets: rotary "rope" (head size D): GEMM column c of head h, octet o,
    half j, lane l is channel o*4 + l + j*D/2, so channels d and d + D/2 are columns c and c + 4
    of one octet; "glu": quad 2o holds gate columns 4o..4o+3, quad 2o + 1 the same up columns.
    Every quad is one run of a B operand's columns (read as one quad: load_b4n). A thread (the
    tiled path with 8 columns a thread, or the GEMV's row thread) stores an octet through store8
    (any pair segment) or a quad through store4."""
    from ..compiler.passes import coords_of_batch
    from .elementwise import broadcast_index, node_lines

    plan = node.attrs["plan"]
    segs = plan.segments
    src, A = node.inputs[0], plan.a
    mm0 = segs[0].mms[0]
    M = A.shape[-2]
    K = _common_k(A.shape[-1], mm0.inputs[1].shape[-2])
    ob = mm0.outputs[0].shape[:-2]
    batch = math.prod(ob)
    N = sum(s.width for s in segs)
    W = 8 if any(s.kind != "plain" for s in segs) else 4  # columns a store call takes
    t = kc.wtype(src)
    ST = store_fn(t)
    vec_a = vec_loads(kc) and plan.a_view is None and A.shape[-1] % 4 == 0
    bindings = [Binding("a", f"vec4<{t}>" if vec_a else t)]
    args = [src]
    bname = []
    for j, s in enumerate(segs):
        bname.append([])
        for q, b in enumerate(s.bs):
            bname[-1].append(f"b{j}_{q}")
            bindings.append(Binding(bname[-1][-1], t))
            args.append(b)
    nb = sum(len(s.bs) for s in segs)
    extras = node.inputs[1 + nb:]
    rms = plan.rms  # (scale or None, epsilon): A is x, the GEMM computes rms_norm(x) * scale @ B
    rw = ""
    if rms is not None and rms[0] is not None:
        extras = extras[:-1]  # (the scale is the last input)
        bindings.append(Binding("rw", t))
        args.append(node.inputs[-1])
        rw = " * f32(rw[k])"
    xname = {}
    for k, v in enumerate(extras):
        xname[id(v)] = f"xb{k}"
        bindings.append(Binding(f"xb{k}", kc.wtype(v)))
        args.append(v)
    outs = list(node.outputs)
    single = len(outs) == 1
    oname = {}
    for k, v in enumerate(outs):
        oname[id(v)] = f"o{k}"
        w = kc.out(node, k)
        bindings.append(Binding(f"o{k}", kc.wtype(w), True))
        args.append(w)
    act = kc.epilogue(bindings, args) if single else ""

    params = {"a_base": batch_offset_expr(A.shape[:-2], ob, M * A.shape[-1]), "b_base": "0u",
              "a_sm": A.shape[-1], "a_sk": 1, "b_sk": N, "b_sn": 1, "alpha": 1.0, "beta": 0.0,
              "has_c": False, "vec_a": vec_a, "vec_b": False, "ST": ST, "act": act, "a_at": "",
              "fused_w": W, "fused_rms": f32_lit(rms[1]) if rms is not None else ""}
    if plan.a_view is not None:
        params["a_at"] = plan.a_view.load_index(coords_of_batch(A.shape[:-2]) + ["m", "k"])

    # B: the segment of column n, its operand and the column there (quad base for load_b4n)
    def col_of(s, c):
        """(operand index, WGSL column) of segment column c (c a WGSL expression)."""
        if s.kind == "plain":
            return 0, c
        if s.kind == "rope":
            h = s.head
            return 0, f"({c} / {h}u) * {h}u + (({c} % {h}u) / 8u) * 4u + ((({c} % {h}u) / 4u) % 2u) * {h // 2}u + ({c} % 4u)"
        return None, f"({c} / 8u) * 4u + ({c} % 4u)"  # glu: operand by ((c / 4) % 2)

    one, where, start = [], [], 0
    ops = [(j, q) for j, s in enumerate(segs) for q in range(len(s.bs))]  # operand codes
    for j, s in enumerate(segs):
        c = f"(n - {start}u)" if start else "n"
        end = start + s.width
        q, col = col_of(s, c)
        code = ops.index((j, 0))
        if q is None:  # glu: gate quads, up quads alternate
            b1 = (f"let q = {col}; if ((({c} / 4u) % 2u) == 0u) {{ return f32({bname[j][0]}[k * {s.n}u + q]){rw}; }} "
                  f"return f32({bname[j][1]}[k * {s.n}u + q]){rw};")
            w4 = f"return vec2<u32>({code}u + (({c} / 4u) % 2u), {col});"
        else:
            b1 = f"return f32({bname[j][q]}[k * {s.n}u + {col}]){rw};"
            w4 = f"return vec2<u32>({code + q}u, {col});"
        last = j == len(segs) - 1
        one.append(f"    {b1}" if last else f"    if (n < {end}u) {{ {b1} }}")
        where.append(f"    {w4}" if last else f"    if (n < {end}u) {{ {w4} }}")
        start = end
    params["b_fused"] = "\n".join(one)
    cases = []
    for code, (j, q) in enumerate(ops):
        b = bname[j][q]
        ld = f"let r = k * {segs[j].n}u + w.y; return vec4<f32>(f32({b}[r]), f32({b}[r + 1u]), f32({b}[r + 2u]), f32({b}[r + 3u])){rw};"
        cases.append(f"        case {code}u: {{ {ld} }}" if code < len(ops) - 1 else f"        default: {{ {ld} }}")
    # the fused GEMV's loops over k: one per segment, B operands and columns fixed outside them
    loops, start = [], 0
    for j, s in enumerate(segs):
        c = f"(n - {start}u)" if start else "n"
        end = start + s.width
        body = ["        let av = vec4<f32>(load_a(bt, 0u, k), load_a(bt, 1u, k), load_a(bt, 2u, k), load_a(bt, 3u, k));"]
        if rms is not None:
            body.append("        ssq = fma(av, av, ssq);")
        head = []
        for qq in range(W // 4):
            cq = f"({c} + {4 * qq}u)" if qq else c
            q, col = col_of(s, cq)
            b = bname[j][qq % 2 if q is None else q]  # glu: the octet's quads are gate, then up
            head.append(f"        let c{qq} = {col};")
            body.append(f"        let r{qq} = k * {s.n}u + c{qq};")
            body.append(f"        let b{qq} = vec4<f32>(f32({b}[r{qq}]), f32({b}[r{qq} + 1u]), f32({b}[r{qq} + 2u]), f32({b}[r{qq} + 3u])){rw};")
            body += [f"        acc{qq}[{e}] = fma(av, vec4<f32>(b{qq}.{'xyzw'[e]}), acc{qq}[{e}]);" for e in range(4)]
        loop = (head + [f"        for (var k = li; k < {wgsl(K)}; k = k + 64u) {{"] + ["    " + x for x in body] + ["        }"])
        cond = f"n < {end}u" if j < len(segs) - 1 else "true"
        loops.append(f"    {'if' if j == 0 else 'else if'} ({cond}) {{\n" + "\n".join(loop) + "\n    }")
        start = end
    params["gemv_loop"] = "\n".join(loops)
    # where a quad of columns is (operand, first column): computed once per quad, outside the loops
    # over k where the kernel can (the GEMV); load_bq reads row k there
    params["b4_fused"] = "    return load_bq(k, bquad(n));"
    params["b_quad"] = ("fn bquad(n: u32) -> vec2<u32> {\n" + "\n".join(where) + "\n}\n\n"
                        "fn load_bq(k: u32, w: vec2<u32>) -> vec4<f32> {\n    switch w.x {\n" + "\n".join(cases)
                        + "\n    }\n}\n")

    # stores
    fns = []

    def writes(leaf, val, f, pad="        "):
        return [f"{pad}{oname[id(v)]}[{f}] = {f'act({val}, {f})' if single else val};" for v in leaf.values]

    def pre_lines(s, names, tag):
        names.update({id(v): f"{xname[id(v)]}[{broadcast_index(v.shape, s.x.shape, 'i')}]"
                      for n in s.pre for v in n.inputs if v is not None and id(v) in xname})
        return node_lines(kc, s.pre, names, tag)

    def guarded(conds, lines):
        if not conds:
            return lines
        return [f"    if ({' && '.join(conds)}) {{"] + ["    " + x for x in lines] + ["    }"]

    for j, s in enumerate(segs):
        xs = s.x.shape
        nn = wgsl(xs[-1])
        bc = coords_of_batch(xs[:-2])

        def idx(c, nn=nn):
            return f"bt * ({wgsl(M)} * {nn}) + m * {nn} + {c}" if any(not _is1(d) for d in ob) else f"m * {nn} + {c}"

        if s.kind == "plain":
            names = {id(s.mms[0].outputs[0]): "x"}
            pl, last = pre_lines(s, names, "p")
            val = last or "x"
            body = [f"    let i = {idx('c')};"] + pl
            for k, leaf in enumerate(s.leaves):
                f, conds = leaf.view.store_index(bc + ["m", "c"], leaf.into())
                body.append(f"    let f{k} = {f};")
                body += guarded(conds, writes(leaf, val, f"f{k}", "    "))
            fns.append(f"fn put{j}(bt: u32, m: u32, c: u32, x: {t}) {{\n" + "\n".join(body) + "\n}")
            fns.append(f"fn seg{j}(bt: u32, m: u32, c: u32, v: vec4<f32>) {{\n"
                       + "".join(f"    put{j}(bt, m, c + {q}u, {ST}(v.{'xyzw'[q]}));\n" for q in range(4)) + "}")
            if W == 8:
                fns.append(f"fn oct{j}(bt: u32, m: u32, c: u32, lo: vec4<f32>, hi: vec4<f32>) {{\n"
                           f"    seg{j}(bt, m, c, lo);\n    seg{j}(bt, m, c + 4u, hi);\n}}")
        elif s.kind == "rope":
            h = s.head
            leaf = s.leaves[0]
            cos, sin = leaf.rope
            tv = leaf.values[0]
            tt = kc.wtype(tv)
            body, vals = [], []
            for q in (0, 1):
                names = {id(s.mms[0].outputs[0]): f"y{q}"}
                pl, last = pre_lines(s, names, f"p{q}_")
                body.append(f"    let i{q} = {idx(f'c{q}')};")
                body += _reindex(pl, f"i{q}")
                vals.append(last or f"y{q}")
            f, conds = leaf.view.store_index(bc + ["m", "c0"], leaf.into())
            rshape = leaf.view.shape  # the rotation's own shape (cos / sin broadcast to it)

            def at(v, var):
                return f"{xname[id(v)]}[{broadcast_index(v.shape, rshape, var)}]"

            y0, y1 = vals
            r0 = binop("+", tt, binop("*", tt, y0, at(cos, "t0")), binop("*", tt, f"(-{y1})", at(sin, "t0")))
            r1 = binop("+", tt, binop("*", tt, y1, at(cos, "t1")), binop("*", tt, y0, at(sin, "t1")))
            body += [f"    let f0 = {f};", f"    let f1 = f0 + {h // 2}u;"]
            if leaf.cat is not None:  # (f0: the place in the concat; t0: in the rotation)
                body += [f"    let t0 = {leaf.view.store_index(bc + ['m', 'c0'])[0]};", f"    let t1 = t0 + {h // 2}u;"]
            else:
                body += ["    let t0 = f0;", "    let t1 = f1;"]
            inner = [f"    let r0: {tt} = {r0};", f"    let r1: {tt} = {r1};"]
            inner += writes(leaf, "r0", "f0", "    ") + writes(leaf, "r1", "f1", "    ")
            body += guarded(conds, inner)
            fns.append(f"fn pair{j}(bt: u32, m: u32, c0: u32, y0: {t}, y1: {t}) {{\n    let c1 = c0 + {h // 2}u;\n"
                       + "\n".join(body) + "\n}")
            # octet c (a multiple of 8) of head h: channels d .. d+3 and d + D/2 .. d + D/2 + 3
            fns.append(f"fn oct{j}(bt: u32, m: u32, c: u32, lo: vec4<f32>, hi: vec4<f32>) {{\n"
                       f"    let d = (c / {h}u) * {h}u + ((c % {h}u) / 8u) * 4u;\n"
                       + "".join(f"    pair{j}(bt, m, d + {q}u, {ST}(lo.{'xyzw'[q]}), {ST}(hi.{'xyzw'[q]}));\n"
                                 for q in range(4)) + "}")
        else:  # glu
            g, u = (mm.outputs[0] for mm in s.mms)
            names = {id(g): "g", id(u): "u"}
            pl, last = pre_lines(s, names, "p")
            body = [f"    let i = {idx('c')};"] + pl
            leaf = s.leaves[0]
            f, conds = leaf.view.store_index(bc + ["m", "c"], leaf.into())
            body.append(f"    let f = {f};")
            body += guarded(conds, writes(leaf, last, "f", "    "))
            fns.append(f"fn pair{j}(bt: u32, m: u32, c: u32, g: {t}, u: {t}) {{\n" + "\n".join(body) + "\n}")
            fns.append(f"fn oct{j}(bt: u32, m: u32, c: u32, lo: vec4<f32>, hi: vec4<f32>) {{\n"
                       f"    let o = (c / 8u) * 4u;\n"
                       + "".join(f"    pair{j}(bt, m, o + {q}u, {ST}(lo.{'xyzw'[q]}), {ST}(hi.{'xyzw'[q]}));\n"
                                 for q in range(4)) + "}")
    disp, start = [], 0
    call = "oct{j}(bt, m, {c}, lo, hi)" if W == 8 else "seg{j}(bt, m, {c}, v)"
    for j, s in enumerate(segs):
        c = f"n - {start}u" if start else "n"
        end = start + s.width
        cj = call.format(j=j, c=c)
        disp.append(f"    if (n < {end}u) {{ {cj}; return; }}" if j < len(segs) - 1 else f"    {cj};")
        start = end
    sig = "lo: vec4<f32>, hi: vec4<f32>" if W == 8 else "v: vec4<f32>"
    fns.append(f"fn store{W}(bt: u32, m: u32, n: u32, {sig}) {{\n"
               f"    if (m >= {wgsl(M)} || n >= {N}u) {{ return; }}\n" + "\n".join(disp) + "\n}")
    params["fused_store"] = "\n\n".join(fns)
    # the inputs before the rows this kernel writes into concats (a KV cache's past), copied by
    # every workgroup's threads in turn (grid-stride) before the GEMM
    copies = []
    for s in segs:
        for leaf in s.leaves:
            if leaf.cat is None:
                continue
            p, axis = leaf.cat
            rs = row_strides(leaf.values[0].shape)
            idx = radix("e", merge_dims([(d, (st,)) for d, st in zip(p.shape, rs)]))[0]
            writes_ = " ".join(f"{oname[id(v)]}[{idx}] = {xname[id(p)]}[e];" for v in leaf.values)
            copies.append(f"    for (var e = g * nt + li; e < {wgsl(math.prod(p.shape))}; e = e + ng * nt) {{ {writes_} }}")
    params["fused_copy"] = ("fn copy_in(g: u32, ng: u32, li: u32, nt: u32) {\n" + "\n".join(copies) + "\n}") if copies else ""
    kinds = "+".join(s.kind if s.kind != "rope" else f"rope{s.head}" for s in segs)
    if plan.a_view is not None:
        kinds = "aview+" + kinds
    if rms is not None:
        kinds = "rms+" + kinds
    kinds += _post_norm(kc, params, bindings, args, "o0")
    name = f"matmul_{t}_{f'b{batch}_' if isinstance(batch, Sym) or batch > 1 else ''}{M}x{K}x{N}_{kinds}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, batch)


def _is1(d):
    return isinstance(d, int) and d == 1


def _reindex(lines, var):
    """Lines reading element `i` of bound values, made to read `var` instead."""
    import re

    return [re.sub(r"\bi\b", var, ln) for ln in lines]
