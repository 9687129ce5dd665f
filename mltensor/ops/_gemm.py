"""The GEMM engine shared by matmul, gemm, conv2d (implicit GEMM), the integer GEMMs, attention
and scan: tiled and GEMV launches of shaders/matmul.wgsl, their candidate configurations for the
autotuner, split-K, and the size buckets of GEMMs with dynamic dimensions (see ops/matmul.py's
docstring for the kernels, and the builder methods that call gemm_launch).

Dynamic dimensions: the range of M (or else N) is cut into at most MAX_VARIANTS size buckets
(_variants): the GEMV range (M <= GEMV_MAX_M) and the ranges where the tile chosen at a bucket's
maximum changes; each bucket's configuration is chosen (tuned) at its maximum, and each is
launched gated on its sizes at dispatch.
"""

import dataclasses

from ..dynamic.dims import Condition, Sym, cdiv, high, low, size_at_least, smax, wgsl
from ..errors import NotSupportedError
from ..switches import switch
from ..runtime import autotune
from ..dynamic.kernels import MAX_GROUPS, grid
from ..runtime.wgsl import LOOP_BUDGET, WORKGROUP, Binding, cpu_device, Kernel
from ._index import is_one, row_strides

GEMV_MAX_M = 4


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


def folds_batch(a_batch, b_batch, out_batch):
    """True where a GEMM over the matrices of `out_batch` is one GEMM of batch * M rows: B is the
    same matrix for every batch entry (its batch dimensions are all 1: a projection's 2-D weight)
    and A's matrices lie one after another (A's batch dimensions are the output's, none
    broadcast), so row m of matrix bt is row bt * M + m of one [batch * M, K] matrix, and the
    output's rows likewise. A [197, 1, 768] x [768, 2304] in-projection is then one GEMM of 197
    rows reading the weights once, not 197 GEMVs each reading them all (sizes may be Syms)."""
    if all(is_one(d) for d in out_batch) or not all(is_one(d) for d in b_batch):
        return False
    r = len(out_batch)
    a = (1,) * (r - len(a_batch)) + tuple(a_batch)
    return all(x == y for x, y in zip(a, out_batch))


def _sizes(**sizes):
    """The template's `sz`: each size, the name of its constant when static (the template
    declares `const M = 12u;`), else the Sym, which the kernel renders reading it at dispatch."""
    return {n: v if isinstance(v, Sym) else n for n, v in sizes.items()}


def grid_checked(n, name):
    """grid(n); for a count known at dispatch, NotSupportedError at build when its maximum does
    not fit a folded 2-D grid (kernels rebuild the linear index as wid.y * nwg.x + wid.x)."""
    if isinstance(n, Sym) and n.hi > MAX_GROUPS * MAX_GROUPS:
        raise NotSupportedError(
            f"[{name.split('_')[0]}] {n} workgroups (up to {n.hi}) exceed {MAX_GROUPS}x{MAX_GROUPS}"
        )
    return grid(n)


def common_k(ka, kb):
    """The K of a GEMM whose operands give K as ka and kb (equal at dispatch, see check_k): a
    static one where there is one, else the tighter bound."""
    if ka == kb or isinstance(ka, int):
        return ka
    if isinstance(kb, int) or kb.hi < ka.hi:
        return kb
    return ka


def check_k(b, ka, kb, message):
    """K of A (ka) and of B (kb) must be equal: structurally at build, or, where a dynamic
    dimension makes them differ only by name or by a size within its range, checked by each
    dispatch (b._require_equal). TypeError(message) where they can never be equal."""
    if ka == kb:
        return
    if isinstance(ka, int) and isinstance(kb, int) or low(ka) > high(kb) or low(kb) > high(ka):
        raise TypeError(message)
    b._require_equal(ka, kb, message)


def dim_maxes(*sizes):
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
def _cfg(tx, ty, rm, rn, bk, split=1, db=False, direct=False):
    return {"TX": tx, "TY": ty, "RM": rm, "RN": rn, "BK": bk, "SPLIT": split, "DB": db, "DIRECT": direct}


def direct_config(M, N, gather=False):
    """The DIRECT tile (matmul.wgsl): no workgroup memory, 8 threads (one SIMD group of llvmpipe,
    whose lanes are invocations) on adjacent column blocks, each RM x RN outputs read straight
    from A and B. On lavapipe (2 cores) 8 x 16 outputs a thread ran a 1024^3 GEMM at 2.3x the
    staged 64x64 tile's rate; narrower blocks where N or M is small, so that the tile is not
    mostly padding. The CPU adapters' heuristic for matmul.wgsl; a tuning candidate elsewhere.
    `gather`: B's elements are gathered with index arithmetic each (a 3x3 convolution's im2col,
    ops/conv.py), which 16 rows a thread share: MobileViT-XXS's 3x3 convolutions (48 x 864 x 784,
    64 x 1152 x 196, 80 x 1440 x 49, batch 2) in 0.65x, 0.67x and 0.4-0.7x the CPU time of 8 rows
    on lavapipe (16 x 8 where N < 128)."""
    if gather and M >= 16:
        return _cfg(8, 1, 16, 16 if N >= 128 else 8, 4, direct=True)
    rn = 16 if N >= 128 else 8 if N >= 64 else 4
    rm = 8 if M >= 8 else 4
    return _cfg(8, 1, rm, rn, 4, direct=True)


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


def gemm_candidates(M, N, K, batch, smem_limit=None, direct=False):
    """(candidates, GPU heuristic index): a small set, every entry valid for any shape (ragged
    edges are bounds-checked), so the tuner may pick any of them. `direct`: the kernel has the
    DIRECT path (matmul.wgsl): its tile first, the CPU adapters' heuristic."""
    cands = ([direct_config(M, N, direct == "gather")] if direct else []) + [lavapipe_config(M, N, K, smem_limit)]
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
    pick = (
        _cfg(16, 16, 4, 8, 8) if _cfg(16, 16, 4, 8, 8) in cands and M * N * batch >= 1 << 20 else _cfg(16, 16, 4, 4, 16)
    )
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
    if c.get("DIRECT"):
        return cdiv(kchunk, bk) * 2 + 16  # (one loop over k, its quads unrolled; no staging)
    per = (
        1
        + (bk // ku + 1)
        + (bk + 1 if rms else 0)
        + cdiv(c["TY"] * c["RM"] * bk // 4, threads)
        + 1
        + cdiv(c["TX"] * c["RN"] * bk // 4, threads)
        + 1
    )
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
    return cdiv(N, bn) * (1 + _tiled_iters(c, high(K), ku=POST_NORM_KU)) + cdiv(bm, threads) * (3 * (N + 1) + 1) + 1


def post_norm_fits(M, N, K):
    """A GEMM of these sizes can take the normalization after it (compiler/fusion/norm.py
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
    for k in (
        "a_at",
        "b_fused",
        "b4_fused",
        "b_quad",
        "gemv_loop",
        "fused_store",
        "fused_copy",
        "fused_rms",
        "c_base",
        "post_ln",
    ):  # (_fused_matmul's, _post_norm's; conv2d.wgsl has its own loaders)
        p.setdefault(k, "")
    p.setdefault("fused_w", 4)
    p.setdefault("b_kmajor", False)
    p.setdefault("DIRECT", False)
    if p["post_ln"]:  # whole rows a workgroup, no split (_post_norm_cands keeps the tiles that fit)
        p["KU"] = POST_NORM_KU
        kc.check_loops(_op_name(kc, name), _post_norm_iters(c, N, K))
    elif not p["fused_store"]:  # (split-K cannot run a fused store: no_split; the guard below refuses)
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
    p.setdefault("edge_a", dynamic and p["check_a"] and not p["DIRECT"])
    p.setdefault("edge_b", dynamic and p["check_b"] and not p["DIRECT"])
    p["gate"] = gate.condition() if gate is not None else ""
    threads = "" if c["TX"] * c["TY"] == 64 else f"w{c['TX'] * c['TY']}"
    kname = f"{name}_t{bm}x{bn}k{bk}{threads}{'db' if c['DB'] else ''}{'d' if p['DIRECT'] else ''}"
    on = 1 if gate is None else gate.sym()
    if split > 1 and isinstance(kchunk, int):
        split = -(-K // kchunk)  # chunks actually used
    kc.check_loops(
        _op_name(kc, name),
        _tiled_iters(c, cdiv(high(K), split * bk) * bk if split > 1 else high(K), bool(p["fused_rms"])),
    )
    p.update(
        tiles_m=tiles_m,
        tiles_n=tiles_n,
        tiles=tiles,
        kchunk=kchunk,
        SPLIT=split,
        sz=_sizes(M=M, N=N, K=K, BATCH=batch, TILES_M=tiles_m, TILES_N=tiles_n, TILES=tiles, KCHUNK=kchunk),
    )
    # Dynamic sizes: a 3-D grid where every count fits (the tile is then the workgroup id, no
    # division by a size per invocation: 10-15% of a 512^3 GEMM on lavapipe), else the folded
    # 1-D grid of the static kernels
    p["grid3"] = dynamic and max(high(tiles_n), high(tiles_m), high(batch) * split) <= MAX_GROUPS
    if p["grid3"]:
        groups = (tiles_n * on, tiles_m * on, batch * split * on)
    else:
        groups = grid_checked(tiles * split * on, name)
    if split == 1:
        return [(Kernel(kname, template, p, bindings), list(args), groups)]
    part = kc.scratch(4 * split * high(batch * M * N))
    b1 = list(bindings) + [Binding("part", "f32", True)]
    b2 = list(bindings) + [Binding("part", "f32")]
    r = dict(p, path="splitk_reduce", check_out=False)
    return [
        (Kernel(f"{kname}_s{split}", template, p, b1), list(args) + [part], groups),
        (
            Kernel(f"{kname}_s{split}_reduce", template, r, b2),
            list(args) + [part],
            grid_checked(cdiv(batch * M * N, WORKGROUP) * on, name),
        ),
    ]


# -- dynamic sizes: one gated variant per size bucket ---------------------------------------------

MAX_VARIANTS = 3  # launches of one dynamic GEMM, each gated on its bucket of sizes
MIN_GAIN = 1.1  # a bucket boundary is kept only where it saves at least this factor of padded work


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
            on = on * (size_at_least(x, lo) - (size_at_least(x, hi + 1) if hi < high(x) else 0))
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


def fit_sizes(values, x, target):
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


def _variants(kc, cpu, M, N, K, batch, direct=False):
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
            return direct_config(m, n, direct == "gather") if direct else lavapipe_config(m, n, hK, lim)
        cands, h = gemm_candidates(m, n, hK, hb, lim, direct)
        return cands[h]

    def key(m, n):
        if not tuning:
            return repr(cfg(m, n))
        return repr(gemm_candidates(m, n, hK, hb, lim, direct))

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
    cpu = cpu_device(kc.device)
    if params.get("post_ln"):
        # a normalization after the GEMM (Step.post_norm): one tiled kernel for every size (its
        # workgroups own whole rows; the GEMV path's own columns)
        _gemm_path(kc, cpu, False, name, template, params, bindings, args, M, N, K, batch)
        return
    # a size whose bounds lose its positivity (a product of differences: a transposed conv's
    # N * 2H * (3W - 1)) is checked >= 1 at dispatch: as max(x, 1) its bounds say so, for the
    # tile counts and remainders below
    M, N, K, batch = (smax(x, 1) if isinstance(x, Sym) and low(x) < 1 else x for x in (M, N, K, batch))
    for gemv, bucket in _variants(kc, cpu, M, N, K, batch, _direct_kind(template, params)):
        _gemm_path(kc, cpu, gemv, name, template, params, bindings, args, M, N, K, batch, bucket)


def has_direct(template):
    """The kernel has the DIRECT path (matmul.wgsl's tiled main; conv2d.wgsl has its own).
    MLTENSOR_NO_DIRECT_GEMM=1 leaves it out (A/B comparisons; a driver that miscompiles it)."""
    return template == "matmul.wgsl" and not switch("MLTENSOR_NO_DIRECT_GEMM")


def _direct_kind(template, params):
    """`direct` of gemm_candidates: False (no DIRECT path), True, or "gather" where the loader
    gathers B (params' gather_b: an im2col, ops/conv.py)."""
    return has_direct(template) and ("gather" if params.get("gather_b") else True)


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
        cands, heur = gemm_candidates(hM, hN, hK, hb, lim, _direct_kind(template, params))
        if params.get("fused_store"):
            cands, heur = no_split(cands, heur, params.get("fused_w", 4))
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
        values.update(dim_maxes(M, N, K, batch))
        if gate is not None:
            for x, _, hi in gate.conds:
                if hi < high(x):
                    values = fit_sizes(values, x, hi)

    def measure(i):
        return kc.timing_form(launches(cands[i]), values)

    problem = (
        template,
        M,
        N,
        K,
        batch,
        len(bindings),
        sorted((k, repr(v)) for k, v in params.items() if k != "act"),
        cands,
    )
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
    for k in (
        "a_at",
        "b_fused",
        "b4_fused",
        "b_quad",
        "gemv_loop",
        "fused_store",
        "fused_copy",
        "fused_rms",
        "c_base",
        "post_ln",
    ):
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
    p["grid3"] = any(isinstance(x, Sym) for x in (M, N, K, batch)) and max(high(cols), high(batch)) <= MAX_GROUPS
    g = (cols * on, batch * on, 1) if p["grid3"] else grid_checked(groups * on, name)
    return [(Kernel(f"{name}_gemv{'_sg' if c['SG'] else ''}", template, p, bindings), list(args), g)]


# vec4 global loads in matmul: on for hardware adapters, and on CPU adapters for the kernels with
# the DIRECT path (its loads are the global ones: 20 vs 11 GFLOP/s at 1024^3 on lavapipe); off for
# the others there, where the transposed workgroup-memory writes of A measured slower on lavapipe
# (512^3: ~95-155 ms vs ~80-95 ms, noisy shared cores). Tests set it to True to check the vec4
# path on lavapipe.
VEC_LOADS = None


def vec_loads(kc, direct=False):
    """Whether a GEMM binds its operands as vec4 where their rows allow; `direct`: the kernel has
    the DIRECT path (has_direct)."""
    if VEC_LOADS is not None:
        return VEC_LOADS
    if direct and not switch("MLTENSOR_NO_DIRECT_GEMM"):
        return True
    return not cpu_device(kc.device)


def no_split(cands, heur, w=4):
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
