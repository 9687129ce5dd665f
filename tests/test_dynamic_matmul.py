"""matmul and gemm with dynamic dimensions (mltensor/dynamic/): one build serves every size up to
the maxima. Each case builds once and runs at several sizes (1, the maxima, ragged ones) against
float64 numpy and bit for bit against a static build of the same graph at that size (the tiled
path accumulates every output in k order whatever its tile, and an M on both sides of the GEMV
bound runs the path a static build of that M runs). Also: every autotuning candidate with dynamic
sizes, tuning at the maxima, vec4 loads, float16, and the checks (sizes past a maximum, K)."""

import numpy as np
import pytest
from helpers import FUSION, context_with_env

import mltensor
from mltensor.dynamic.dims import MLDynamicDimension as D
from mltensor.dynamic.dims import high
from mltensor.ops import _gemm as gemm_engine
from mltensor.ops._gemm import gemm_candidates
from mltensor.runtime import autotune

NP = {"float32": np.float32, "float16": np.float16}


def _concrete(spec, sizes):
    return tuple(sizes[d.name] if isinstance(d, D) else d for d in spec)


def _build(ctx, specs, fn, dt="float32"):
    """A graph of fn(builder, {name: operand}) over inputs named by specs ({name: shape})."""
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type=dt, shape=list(s)) for n, s in specs.items()}
    return b.build_sync({"z": fn(b, ins)})


def _run(ctx, g, feeds, dt="float32"):
    ins = {}
    for n, a in feeds.items():
        t = ctx.create_tensor_sync(data_type=dt, shape=a.shape, writable=True)
        ctx.write_tensor(t, a)
        ins[n] = t
    shape = g.compute_shapes({n: a.shape for n, a in feeds.items()})["z"]
    out = ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True)
    ctx.dispatch(g, ins, {"z": out})
    r = ctx.read_tensor_sync(out)
    for t in [*ins.values(), out]:
        t.destroy()
    return r


def _check(ctx, rng, specs, fn, ref, size_sets, dt="float32", static=True, rtol=1e-4):
    """Build once with dynamic dimensions; at each size set compare with float64 numpy `ref(feeds)`
    (tolerance relative to the largest |reference|) and, if static, bit for bit with a static build."""
    g = _build(ctx, specs, fn, dt)
    assert g.dynamic_dimensions
    for sizes in size_sets:
        feeds = {n: rng.standard_normal(_concrete(s, sizes)).astype(NP[dt]) for n, s in specs.items()}
        got = _run(ctx, g, feeds, dt)
        want = ref({n: a.astype(np.float64) for n, a in feeds.items()})
        assert got.shape == want.shape, (sizes, got.shape, want.shape)
        scale = max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * scale, err_msg=str(sizes))
        if static:
            gs = _build(ctx, {n: _concrete(s, sizes) for n, s in specs.items()}, fn, dt)
            want = _run(ctx, gs, feeds, dt)
            if _same_order(g, gs):
                np.testing.assert_array_equal(got, want, err_msg=f"static build, {sizes}")
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale, err_msg=f"static build, {sizes}")
            gs.destroy()
    return g


def _same_order(*graphs):
    """The graphs sum every output in the same order (bit for bit): tiled kernels do whatever
    their tiles, GEMV kernels too; split-K (a GPU heuristic for small grids) and the subgroup
    GEMV (chosen by tuning) sum in another order."""
    return not any("_reduce" in n or n.endswith("_sg") for g in graphs for n in g.kernel_names)


@pytest.fixture(autouse=True)
def _heuristic(monkeypatch):
    # the heuristic's configurations (no tuning, which hardware adapters do by default: it would
    # time every build); test_tuning_at_the_maximum turns it on
    monkeypatch.setenv("MLTENSOR_AUTOTUNE", "0")


def _mm(b, x):
    return b.matmul(x["a"], x["b"])


def _mm_ref(f):
    return f["a"] @ f["b"]


# -- 2-D ------------------------------------------------------------------------------------------

MAXS = {"m": 70, "k": 66, "n": 68}
SIZES_2D = [
    dict(m=1, k=1, n=1),
    dict(MAXS),
    dict(m=7, k=33, n=65),
    dict(m=65, k=7, n=33),
    dict(m=4, k=65, n=7),
    dict(m=5, k=2, n=1),
]


@pytest.mark.parametrize("dyn", ["m", "k", "n", "mkn"])
def test_matmul_2d(ctx, rng, dyn):
    dims = {d: D(d, MAXS[d]) if d in dyn else None for d in "mkn"}
    static = {"m": 37, "k": 45, "n": 29}
    sizes = [{d: (s[d] if dims[d] else static[d]) for d in "mkn"} for s in SIZES_2D]
    sizes = [dict(t) for t in sorted({tuple(sorted(s.items())) for s in sizes})]  # no repeats
    spec = {d: dims[d] or static[d] for d in "mkn"}
    g = _check(ctx, rng, {"a": (spec["m"], spec["k"]), "b": (spec["k"], spec["n"])}, _mm, _mm_ref, sizes)
    # M on both sides of the GEMV bound: both paths, each gated on M at dispatch, the tiled one
    # in up to two buckets of M (here: the 32- and 64-row tiles lavapipe's heuristic picks below
    # and above 64 rows); K alone: one kernel
    names = g.kernel_names
    if "m" in dyn:
        assert 2 <= len(names) <= gemm_engine.MAX_VARIANTS and sum(n.endswith("_gemv") for n in names) == 1, names
    elif "n" not in dyn:
        assert len(names) == 1, names
    g.destroy()


def test_matmul_gemv_only_and_tiled_only(ctx, rng):
    # M's maximum within the GEMV bound: the GEMV kernel alone; a static M past it, the tiled one
    g = _check(
        ctx,
        rng,
        {"a": (D("m", 4), 40), "b": (40, D("n", 30))},
        _mm,
        _mm_ref,
        [dict(m=1, n=1), dict(m=4, n=30), dict(m=3, n=17)],
    )
    assert [n.rsplit("_", 1)[1] for n in g.kernel_names] == ["gemv"]
    g.destroy()
    g = _check(
        ctx,
        rng,
        {"a": (9, D("k", 50)), "b": (D("k", 50), D("n", 30))},
        _mm,
        _mm_ref,
        [dict(k=1, n=1), dict(k=50, n=30), dict(k=17, n=3)],
    )
    assert len(g.kernel_names) == 1 and "gemv" not in g.kernel_names[0]
    g.destroy()


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
def test_matmul_vec4_loads(ctx, rng, monkeypatch, vec):
    # 16-byte loads of A (K % 4 == 0) and B (N % 4 == 0) stay valid for every M: only M is dynamic
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    g = _check(
        ctx,
        rng,
        {"a": (2, D("m", 70), 64), "b": (2, 64, 48)},
        _mm,
        _mm_ref,
        [dict(m=1), dict(m=70), dict(m=33), dict(m=4), dict(m=5)],
    )
    g.destroy()


# -- size buckets: a configuration per range of M (or N) -----------------------------------------


def _kc(ctx):
    import types

    return types.SimpleNamespace(device=ctx.device)


def _bucket_configs(ctx, M, N, K, batch):
    """[(gemv, bucket, the configuration the heuristic picks at the bucket's maximum)] on a CPU
    adapter (lavapipe's configuration)."""
    out = []
    for gemv, bk in gemm_engine._variants(_kc(ctx), True, M, N, K, batch):
        m, n = bk.at if bk is not None else (M, N)
        out.append((gemv, bk, None if gemv else gemm_engine.lavapipe_config(m, n, high(K))))
    return out


def test_bucket_choice(ctx):
    from mltensor.dynamic.dims import Sym

    s, p = Sym.dim("S", 128), Sym.dim("P", 512)
    # attention values [1, 4, S, P] x [1, 4, P, 16]: the GEMV for S <= 4, then the 64-row tile
    # below 128 rows and the 128-row one from there (lavapipe: 8 rows a thread from 8 * TY)
    v = _bucket_configs(ctx, s, 16, p, 4)
    assert [(g, b.condition().wgsl()) for g, b, _ in v] == [
        (True, "(dims.d_S) <= 4u"),
        (False, "(dims.d_S) >= 5u && (dims.d_S) <= 127u"),
        (False, "(dims.d_S) >= 128u"),
    ]
    assert [c["TY"] * c["RM"] for _, _, c in v[1:]] == [64, 128]
    # each bucket's configuration is the one a static build picks at any of its sizes
    for gemv, b, c in v[1:]:
        ((_, lo, hi),) = b.conds
        for m in (lo, (lo + hi) // 2, hi):
            assert gemm_engine.lavapipe_config(m, 16, 512) == c
    # the workgroup counts' factor is 1 inside a bucket, 0 outside
    for m in (1, 4, 5, 64, 127, 128):
        assert [b.sym().eval({"S": m}) if isinstance(b.sym(), Sym) else b.sym() for _, b, _ in v] == [
            int(m <= 4),
            int(5 <= m <= 127),
            int(m >= 128),
        ]
    # static sizes: one ungated variant; M above the GEMV bound and one configuration: ungated
    assert gemm_engine._variants(_kc(ctx), True, 70, 48, s, 1) == [(False, None)]
    assert gemm_engine._variants(_kc(ctx), True, Sym.dim("m", 40) + 8, 64, 64, 1) == [(False, None)]
    # N where M is static: lavapipe's tile narrows for N <= 16 and widens from 64; at most
    # MAX_VARIANTS in all, the cheapest boundaries merged
    v = _bucket_configs(ctx, 100, Sym.dim("n", 80), 64, 1)
    assert len(v) == gemm_engine.MAX_VARIANTS and not any(g for g, _, _ in v)
    assert [c["TX"] * c["RN"] for _, _, c in v] == [16, 32, 64]


@pytest.mark.parametrize("cpu", [True, False], ids=["cpu", "gpu_heuristic"])
def test_buckets_partition_the_sizes(ctx, cpu):
    # whatever the adapter's heuristic: at most MAX_VARIANTS variants, and at every size exactly
    # one of them runs (its workgroup-count factor 1, the others 0)
    from mltensor.dynamic.dims import Sym

    m, n = Sym.dim("m", 3000), Sym.dim("n", 700)
    for M, N, K, batch in [(m, 64, 512, 1), (m, n, 64, 2), (37, n, 300, 1), (m, 8, 4096, 1), (m + 2, n, 32, 4)]:
        v = gemm_engine._variants(_kc(ctx), cpu, M, N, K, batch)
        assert 1 <= len(v) <= gemm_engine.MAX_VARIANTS, v
        if len(v) == 1:
            assert v[0][1] is None
            continue
        for mv in (1, 2, 4, 5, 63, 64, 65, 127, 128, 129, 1000, 3000):
            for nv in (1, 8, 16, 17, 64, 128, 700):
                vals = {"m": mv, "n": nv}
                on = [b.sym().eval(vals) if isinstance(b.sym(), Sym) else b.sym() for _, b in v]
                assert sorted(on) == [0] * (len(v) - 1) + [1], (M, N, vals, on)
                # the active one is the GEMV exactly when M <= GEMV_MAX_M
                gemv = v[on.index(1)][0]
                assert gemv == ((M.eval(vals) if isinstance(M, Sym) else M) <= gemm_engine.GEMV_MAX_M)


VALUE_SIZES = [
    dict(S=1, P=1),
    dict(S=4, P=300),
    dict(S=5, P=7),
    dict(S=64, P=256),
    dict(S=127, P=512),
    dict(S=128, P=512),
    dict(S=100, P=33),
]


def _cpu(ctx):
    return str(ctx.device.adapter.info.get("adapter_type", "")).upper() == "CPU"


# The bucket tests below count the variants the CPU heuristic's tile changes make: the staged
# tiles (MLTENSOR_NO_DIRECT_GEMM=1) change at more sizes than the DIRECT one; values are checked
# with both.
@pytest.mark.parametrize("direct", ["1", "0"])
def test_buckets_attention_values(ctx, rng, monkeypatch, direct):
    # one build, sizes in every bucket; bit for bit with the static build of each size (the
    # static build picks the same configuration: test_bucket_choice)
    monkeypatch.setenv("MLTENSOR_NO_DIRECT_GEMM", "0" if direct == "1" else "1")
    S, P = D("S", 128), D("P", 512)
    g = _check(ctx, rng, {"a": (1, 4, S, P), "b": (1, 4, P, 16)}, _mm, _mm_ref, VALUE_SIZES)
    want = ["gemv", "t8x32k4w8d"] if direct == "1" else ["gemv", "t64x16k32", "t128x16k32"]
    if _cpu(ctx):
        assert [n.rsplit("_", 1)[1] for n in g.kernel_names] == want, g.kernel_names
    g.destroy()


def test_buckets_along_n(ctx, rng, monkeypatch):
    monkeypatch.setenv("MLTENSOR_NO_DIRECT_GEMM", "1")
    g = _check(
        ctx,
        rng,
        {"a": (100, 24), "b": (24, D("n", 80))},
        _mm,
        _mm_ref,
        [dict(n=1), dict(n=8), dict(n=16), dict(n=17), dict(n=63), dict(n=64), dict(n=80)],
    )
    assert len(g.kernel_names) == 3, g.kernel_names
    g.destroy()


@pytest.mark.parametrize("direct", ["1", "0"])
def test_buckets_fused_epilogue_and_gemm(ctx, rng, monkeypatch, direct):
    # gemm with a transposed A, a bias row and relu: every bucket stores through the epilogue
    monkeypatch.setenv("MLTENSOR_NO_DIRECT_GEMM", "0" if direct == "1" else "1")
    M, K = D("m", 300), D("k", 40)

    def fn(b, x):
        return b.relu(b.gemm(x["a"], x["b"], c=x["c"], a_transpose=True))

    g = _check(
        ctx,
        rng,
        {"a": (K, M), "b": (K, 72), "c": (72,)},
        fn,
        lambda f: np.maximum(f["a"].T @ f["b"] + f["c"], 0),
        [
            dict(m=1, k=1),
            dict(m=4, k=40),
            dict(m=5, k=9),
            dict(m=63, k=40),
            dict(m=64, k=17),
            dict(m=300, k=40),
            dict(m=129, k=3),
        ],
    )
    assert len(g.kernel_names) == (2 if direct == "1" else 3) or not _cpu(ctx), g.kernel_names
    g.destroy()


# -- batched, broadcast ---------------------------------------------------------------------------

B, S, P = D("B", 3), D("S", 70), D("P", 66)
ATTN_SIZES = [
    dict(B=1, S=1, P=1),
    dict(B=3, S=70, P=66),
    dict(B=2, S=7, P=33),
    dict(B=1, S=65, P=5),
    dict(B=2, S=3, P=65),
]


def test_matmul_attention_scores(ctx, rng):
    # q [B, H, S, 64] x k^T [B, H, 64, P]
    _check(ctx, rng, {"a": (B, 2, S, 64), "b": (B, 2, 64, P)}, _mm, _mm_ref, ATTN_SIZES).destroy()


def test_matmul_attention_values(ctx, rng):
    # probabilities [B, H, S, P] x v [B, H, P, 64]: K dynamic
    _check(ctx, rng, {"a": (B, 2, S, P), "b": (B, 2, P, 64)}, _mm, _mm_ref, ATTN_SIZES).destroy()


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((S, 40), (B, 40, 24)),  # a broadcast along the batch
        ((B, 1, S, 24), (1, 3, 24, P)),  # both broadcast, a static batch dimension
        ((2, B, S, 24), (B, 24, P)),  # b broadcast along a leading dimension: index modulo B
    ],
    ids=["a_bcast", "both_bcast", "mod_B"],
)
def test_matmul_broadcast_batch(ctx, rng, sa, sb):
    _check(ctx, rng, {"a": sa, "b": sb}, _mm, _mm_ref, ATTN_SIZES[:4]).destroy()


@pytest.mark.parametrize("m", [2, 5], ids=["gemv", "tiled"])
def test_batch_past_a_grid_dimension(ctx, rng, m):
    # a batch maximum past 65535 workgroups along one dimension: the folded 1-D grid of the
    # static kernels (the tile from the linear workgroup index) instead of (columns, rows, batch)
    # (70000 workgroups of a few outputs each are slow on lavapipe: one large size, no static build)
    g = _check(
        ctx,
        rng,
        {"a": (D("B", 70000), m, 3), "b": (D("B", 70000), 3, 2)},
        _mm,
        _mm_ref,
        [dict(B=1), dict(B=65536)],
        static=False,
    )
    g.destroy()


# -- gemm -----------------------------------------------------------------------------------------

M, K, N = D("m", 70), D("k", 66), D("n", 68)


@pytest.mark.parametrize("at,bt,c", [(False, False, "n"), (True, False, "mn"), (False, True, "m1"), (True, True, None)])
def test_gemm(ctx, rng, at, bt, c):
    specs = {"a": (K, M) if at else (M, K), "b": (N, K) if bt else (K, N)}
    if c:
        specs["c"] = {"n": (N,), "mn": (M, N), "m1": (M, 1)}[c]

    def fn(b, x):
        return b.gemm(x["a"], x["b"], c=x.get("c"), alpha=0.5, beta=2.0, a_transpose=at, b_transpose=bt)

    def ref(f):
        r = 0.5 * ((f["a"].T if at else f["a"]) @ (f["b"].T if bt else f["b"]))
        return r + 2.0 * f["c"] if c else r

    _check(ctx, rng, specs, fn, ref, SIZES_2D[:4]).destroy()


# -- fused epilogue, float16 ------------------------------------------------------------------------


def test_fused_bias_relu_epilogue(ctx, rng):
    def fn(b, x):
        return b.relu(b.add(b.matmul(x["a"], x["b"]), x["bias"]))

    g = _check(
        ctx,
        rng,
        {"a": (B, S, 40), "b": (40, P), "bias": (P,)},
        fn,
        lambda f: np.maximum(f["a"] @ f["b"] + f["bias"], 0),
        ATTN_SIZES,
    )
    if FUSION:  # add and relu are stored by the matmul kernels: no elementwise kernel
        assert all(n.startswith("matmul") for n in g.kernel_names), g.kernel_names
    g.destroy()


@pytest.fixture(scope="module")
def f16off_ctx():
    c = context_with_env(MLTENSOR_DISABLE_F16="1")
    yield c
    c.destroy()


@pytest.mark.parametrize("mode", ["f16", "f32"])
def test_float16(ctx, f16off_ctx, rng, mode):
    c = f16off_ctx if mode == "f32" else ctx
    if mode == "f16" and not ctx._f16:
        pytest.skip("the adapter has no shader-f16")

    def fn(b, x):
        return b.relu(b.add(b.matmul(x["a"], x["b"]), x["r"]))

    g = _check(
        c,
        rng,
        {"a": (S, K), "b": (K, N), "r": (S, N)},
        fn,
        lambda f: np.maximum(f["a"] @ f["b"] + f["r"], 0),
        [dict(S=1, k=1, n=1), dict(S=70, k=66, n=68), dict(S=7, k=33, n=65), dict(S=3, k=9, n=2)],
        dt="float16",
        rtol=1e-2,
    )
    g.destroy()


# -- every candidate, tuning --------------------------------------------------------------------------


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
def test_every_candidate(ctx, rng, monkeypatch, vec):
    # the tuner may pick any candidate for the maximum sizes (split-K here: deep K, few tiles);
    # each must be right at every size. Not bit for bit: split-K sums its chunks separately.
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    sm, sk = D("m", 96), D("k", 600)
    cands, _ = gemm_candidates(96, 72, 600, 2)
    assert any(c["SPLIT"] > 1 for c in cands)
    sizes = [dict(m=96, k=600), dict(m=1, k=1), dict(m=37, k=333), dict(m=3, k=70), dict(m=5, k=9)]
    for i in range(len(cands)):
        with autotune.force(i):
            _check(ctx, rng, {"a": (2, sm, sk), "b": (2, sk, 72)}, _mm, _mm_ref, sizes, static=False).destroy()


def test_every_gemm_candidate(ctx, rng):
    cands, _ = gemm_candidates(67, 90, 530, 1, direct=True)
    for i in range(len(cands)):
        with autotune.force(i):
            _check(
                ctx,
                rng,
                {"a": (K, D("m", 67)), "b": (90, K), "c": (90,)},
                lambda b, x: b.gemm(x["a"], x["b"], c=x["c"], alpha=0.5, a_transpose=True, b_transpose=True),
                lambda f: 0.5 * (f["a"].T @ f["b"].T) + f["c"],
                [dict(m=67, k=66), dict(m=1, k=1), dict(m=30, k=17)],
                static=False,
            ).destroy()


def test_tuning_at_the_maximum(ctx, rng, monkeypatch, tmp_path):
    # MLTENSOR_AUTOTUNE=1: candidates are timed with the sizes set to their maxima (immediates)
    monkeypatch.setenv("MLTENSOR_NO_DIRECT_GEMM", "1")  # (the staged tiles' buckets, see above)
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    monkeypatch.setenv("MLTENSOR_AUTOTUNE", "1")
    autotune._tables.clear()
    timed = []
    real = autotune.time_launches
    monkeypatch.setattr(autotune, "time_launches", lambda *a, **k: timed.append(real(*a, **k)) or timed[-1])
    # each size bucket tuned at its own maximum: record the M of every timed tiled launch
    seen = []
    real_groups = gemm_engine._tiled_launches

    def spy(*a, **k):
        out = real_groups(*a, **k)
        seen.append(k.get("gate") or a[-1])
        return out

    monkeypatch.setattr(gemm_engine, "_tiled_launches", spy)
    g = _check(ctx, rng, {"a": (S, 64), "b": (64, P)}, _mm, _mm_ref, ATTN_SIZES[:3], static=False)
    # the GEMV bucket (two candidates where the adapter has subgroups) and the two tiled ones
    # (M below and from 64): one signature each
    variants = len(g.kernel_names) - (0 if "subgroup" in ctx.device.features else 1)
    assert g.autotune["signatures_tuned"] == variants and timed and all(np.isfinite(timed)), timed
    assert sorted({b.at for b in seen if b is not None}) == [(63, 66), (70, 66)]
    g.destroy()
    autotune._tables.clear()


# -- checks ---------------------------------------------------------------------------------------


def test_size_beyond_maximum(ctx):
    g = _build(ctx, {"a": (S, 8), "b": (8, P)}, _mm)
    with pytest.raises(TypeError, match="outside"):
        _run(ctx, g, {"a": np.ones((71, 8), np.float32), "b": np.ones((8, 3), np.float32)})
    g.destroy()


def test_k_mismatch(ctx):
    one = lambda *s: np.ones(s, np.float32)  # noqa: E731
    # K of different names, ranges that meet: checked by each dispatch
    g = _build(ctx, {"a": (S, D("k1", 40)), "b": (D("k2", 30), 5)}, _mm)
    np.testing.assert_array_equal(_run(ctx, g, {"a": one(3, 20), "b": one(20, 5)}), np.full((3, 5), 20, np.float32))
    with pytest.raises(TypeError, match=r"\[matmul\] columns of a"):
        _run(ctx, g, {"a": one(3, 20), "b": one(21, 5)})
    g.destroy()
    # a dynamic K against a static one within its range: checked by each dispatch too
    g = _build(
        ctx,
        {"a": (D("k", 40), 3), "b": (6, 16)},
        lambda b, x: b.gemm(x["a"], x["b"], a_transpose=True, b_transpose=True),
    )
    np.testing.assert_array_equal(_run(ctx, g, {"a": one(16, 3), "b": one(6, 16)}), np.full((3, 6), 16, np.float32))
    with pytest.raises(TypeError, match=r"\[gemm\] K of a"):
        _run(ctx, g, {"a": one(15, 3), "b": one(6, 16)})
    g.destroy()
    # never equal: at build
    b = mltensor.MLGraphBuilder(ctx)
    with pytest.raises(TypeError, match=r"\[matmul\] columns of a \(k\) must equal rows of b \(9\)"):
        b.matmul(
            b.input("x", data_type="float32", shape=[2, D("k", 8)]), b.input("y", data_type="float32", shape=[9, 2])
        )
    with pytest.raises(TypeError, match=r"\[gemm\] K of a"):
        b.gemm(
            b.input("u", data_type="float32", shape=[2, D("k", 8)]),
            b.input("w", data_type="float32", shape=[3, 9]),
            b_transpose=True,
        )
