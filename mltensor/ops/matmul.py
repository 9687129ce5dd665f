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
unchecked edges only where structurally valid (`K % 4 == 0` for `4*seq`), tiles and split-K
factors by the maximum sizes (dims.high), split-K with a fixed chunk count (a chunk's length
follows K). An M that may be either side of GEMV_MAX_M launches both paths, each gated on M at
dispatch (the inactive one gets a single workgroup that returns at once), so every size computes
exactly as a static build of that size does.
"""

import dataclasses
import math

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, low, smin, wgsl
from ..errors import NotSupportedError
from ..front.builder import builder_op
from ..runtime import autotune
from ..runtime.wgsl import MAX_GROUPS, WORKGROUP, Binding, Kernel, grid, store_fn
from . import (MAX_RANK, broadcast_shapes, check_bool, check_number, check_support, lowering, register,
               row_strides, same_type, unidirectional)

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
    """The template's `sz`: WGSL text of each size, the name of its constant when static (the
    template declares `const M = 12u;`), else the expression reading it at dispatch."""
    return {n: wgsl(v) if isinstance(v, Sym) else n for n, v in sizes.items()}


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


def _tiled_launches(kc, name, template, params, bindings, args, M, N, K, batch, c, gate=None):
    """[(Kernel, args, groups)] of one configuration of the tiled path. Sizes may be Syms;
    `gate` (dual mode, gemm_launch): the Sym that is 1 when this path runs (M > GEMV_MAX_M at
    dispatch), else 0."""
    p = dict(params, M=M, N=N, K=K, batch=batch, path="tiled", **c)
    p.setdefault("vec_a", False)
    p.setdefault("vec_b", False)
    p.setdefault("a_kmajor", p["vec_a"])
    p.setdefault("b_kmajor", False)
    bm, bn, bk, split = c["TY"] * c["RM"], c["TX"] * c["RN"], c["BK"], c["SPLIT"]
    # the staging loops give each thread fixed m / k quads (setup_a, conv2d.wgsl's hoisting)
    assert (c["TX"] * c["TY"]) % (bm // 4) == 0 and bk % 4 == 0, c
    tiles_m, tiles_n = cdiv(M, bm), cdiv(N, bn)
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
    p["gate"] = f"{wgsl(M)} > {GEMV_MAX_M}u" if gate is not None else ""
    threads = "" if c["TX"] * c["TY"] == 64 else f"w{c['TX'] * c['TY']}"
    kname = f"{name}_t{bm}x{bn}k{bk}{threads}{'db' if c['DB'] else ''}"
    on = 1 if gate is None else gate
    if split > 1 and isinstance(kchunk, int):
        split = -(-K // kchunk)  # chunks actually used
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


def _nbytes(kc, a):
    from ..compiler.lower import Scratch

    return a.nbytes if isinstance(a, Scratch) else kc.nbytes(kc.root(a))


def gemm_launch(kc, name, template, params, bindings, args, M, N, K, batch):
    """Pick the path and configuration for an (M x K) * (K x N) GEMM over `batch` matrices and
    launch it. `params` are the template's loader parameters; the kernel name gets the path and
    configuration appended. The configuration is autotuned on hardware adapters (autotune.py).

    Sizes may be Syms (dynamic dimensions): configurations are chosen for their maximum sizes
    (tuned there too), and an M that may be on either side of GEMV_MAX_M gets both paths, each
    launched with a workgroup count that is 0 (1 workgroup returning at once) when M selects the
    other."""
    cpu = str(kc.device.adapter.info.get("adapter_type", "")).upper() == "CPU"
    gemv, tiled = high(M) <= GEMV_MAX_M, low(M) > GEMV_MAX_M
    if not (gemv or tiled):  # dynamic M on both sides: 1 when the tiled path runs
        big = smin(M // (GEMV_MAX_M + 1), 1)
        _gemm_path(kc, cpu, True, name, template, params, bindings, args, M, N, K, batch, 1 - big)
        _gemm_path(kc, cpu, False, name, template, params, bindings, args, M, N, K, batch, big)
    else:
        _gemm_path(kc, cpu, gemv, name, template, params, bindings, args, M, N, K, batch)


def _gemm_path(kc, cpu, gemv, name, template, params, bindings, args, M, N, K, batch, gate=None):
    hM, hN, hK, hb = high(M), high(N), high(K), high(batch)
    if gemv:
        # reduction in workgroup memory, or within subgroups first where the adapter has them
        cands = [{"SG": False}] + ([{"SG": True}] if "subgroup" in kc.device.features else [])
        launches = lambda c: _gemv_launches(name, template, params, bindings, args, M, N, K, batch, c, gate)  # noqa: E731
        heur = 0  # (the subgroup variant is unmeasured on GPUs; tuning decides there)
    else:
        lim = kc.device.limits.get("max-compute-workgroup-storage-size", WG_STORAGE)
        cands, heur = gemm_candidates(hM, hN, hK, hb, lim)
        launches = lambda c: _tiled_launches(kc, name, template, params, bindings, args, M, N, K, batch, c, gate)  # noqa: E731
        if cpu:
            heur = 0
    # Dynamic sizes: timed at their maximum (immediates and workgroup counts of those sizes); a
    # gated GEMV (M may exceed GEMV_MAX_M) is not timed: at the maximum it does nothing.
    values = None
    if any(isinstance(x, Sym) for x in (M, N, K, batch)):
        values = dict.fromkeys(kc.dims, 1)
        values.update(_dim_maxes(M, N, K, batch))

    def measure(i):
        from ..dynamic.kernels import concrete_groups, pack

        out = []
        slots = {}
        for k, a, g in launches(cands[i]):
            sizes = [(slots.setdefault(id(x), len(slots)), _nbytes(kc, x)) for x in a]
            if values is None:
                out.append((k, sizes, g))
                continue
            imm = None
            if kc.dims and k.reads_dims():
                k = dataclasses.replace(k, dims=kc.dims)
                imm = pack(kc.dims, values)
            out.append((k, sizes, concrete_groups(g, values), imm))
        return out

    sig = autotune.signature_of((template, M, N, K, batch, len(bindings),
                                 sorted((k, repr(v)) for k, v in params.items() if k != "act"), cands))
    if gemv and gate is not None:
        forced = autotune.forced_index(len(cands))
        best = heur if forced is None else forced
    else:
        best = autotune.choose(kc, sig, cands, measure, heur)
    for k, a, g in launches(cands[best]):
        kc.launch(k, a, g)


def _gemv_launches(name, template, params, bindings, args, M, N, K, batch, c, gate=None):
    p = dict(params, M=M, N=N, K=K, batch=batch, path="gemv", **c)
    p.setdefault("vec_a", False)
    p.setdefault("vec_b", False)
    cols = cdiv(N, 4)
    groups = batch * cols
    p.update(cols=cols, groups=groups, sz=_sizes(M=M, N=N, K=K, BATCH=batch, COLS=cols, GROUPS=groups))
    p.setdefault("check_a", isinstance(M, Sym) or M < 4)
    p.setdefault("check_b", N % 4 != 0)
    p.setdefault("check_out", N % 4 != 0)
    p.update(edge_a=False, edge_b=False)
    p["gate"] = f"{wgsl(M)} <= {GEMV_MAX_M}u" if gate is not None else ""
    on = 1 if gate is None else gate
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
    name = f"matmul_{t}_{f'b{batch}_' if isinstance(batch, Sym) or batch > 1 else ''}{M}x{K}x{N}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, batch)




# -- gemm -----------------------------------------------------------------------------------

register(
    "gemm",
    {"a": FLOAT, "b": FLOAT, "c": FLOAT, "output": FLOAT},
    ranks={"a": (2, 2), "b": (2, 2), "c": (0, 2)},
)


@builder_op
def gemm(b, a, bb, *, c=None, alpha=1.0, beta=1.0, a_transpose=False, b_transpose=False, label=None):
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


