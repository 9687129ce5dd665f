"""Transformer fusions (issue 28, compiler/plan.py `rewrite_nodes`, `fuse_dag_epilogues`,
`fuse_grouped_heads`): RMSNorm chains as one normalization kernel; GEMMs that write their views
(head split transposes, a fused QKV split, the identity copies of a present cache) and read one
(the head merge); rotary embeddings, gated units (SwiGLU / GeGLU) and merged projections in the
GEMM's store; DAG epilogues (GELU chains); grouped K/V heads read by the attention kernel without
the repeat copies. Each against float64 numpy and against the same graph built with
MLTENSOR_NO_FUSION=1; kernel counts asserted with fusion on; float16 where the kernels apply;
static, ragged and dynamic sizes, the GEMV path (M <= 4) and the tiled one, every GEMM candidate
of the fused kernels; whole BERT- and Llama-shaped exports against onnxruntime."""

import numpy as np
import pytest
from helpers import FUSION, dispatch_at, launches_run
from helpers import fusion as _fusion

import mltensor
from mltensor.compiler.fusion import grouped, norm, rms
from mltensor.dynamic.dims import MLDynamicDimension as Dyn
from mltensor.ops import _gemm as gemm_engine
from mltensor.ops._gemm import gemm_candidates, no_split
from mltensor.runtime import autotune

NP = {"float32": np.float32, "float16": np.float16}
TOL = {"float32": 2e-5, "float16": 1.5e-2}  # relative to the largest reference value


def _build(ctx, specs, fn, dt, fused=True):
    """Graph of fn(builder, {name: input}) -> {name: operand}, inputs of `specs` ({name: shape})."""
    with _fusion(fused):
        b = mltensor.MLGraphBuilder(ctx)
        ins = {n: b.input(n, data_type=dt, shape=list(s)) for n, s in specs.items()}
        return b.build_sync(fn(b, ins))


def _compute(names):
    return [n for n in names if not n.startswith(("pack_", "unpack_"))]


def _close(got, want, dt, what=""):
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == NP[dt], (what, got.dtype)
    scale = max(float(np.abs(want).max(initial=0)), 1e-30)
    err = float(np.abs(got.astype(np.float64) - want).max(initial=0)) / scale
    assert err <= TOL[dt], (what, err)


def _check(ctx, specs, fn, ref, feeds, dt="float32", kernels=None, sizes=None):
    """Build fused and unfused; for each feed set compare the fused graph with float64 `ref` and
    with the unfused graph; assert the fused graph's compute kernels (fusion on): `kernels` a
    count or a predicate on the names. Returns the fused graph's kernel names."""
    g = _build(ctx, specs, fn, dt)
    u = _build(ctx, specs, fn, dt, fused=False)
    names = _compute(g.kernel_names)
    if FUSION and kernels is not None:
        assert (len(names) == kernels) if isinstance(kernels, int) else kernels(names), names
    for f in feeds:
        f = {k: v.astype(NP[dt]) if v.dtype.kind == "f" else v for k, v in f.items()}
        got = dispatch_at(ctx, g, f)
        unf = dispatch_at(ctx, u, f)
        want = ref({k: v.astype(np.float64) for k, v in f.items()})
        for k, w in want.items():
            _close(got[k], w, dt, k)
            _close(got[k], unf[k], dt, k + " vs unfused")
    g.destroy()
    u.destroy()
    return names


def _w(rng, *shape, scale=None):
    return (rng.standard_normal(shape) * (scale or 1 / np.sqrt(shape[0]))).astype(np.float32)


def _c(b, a, dt):
    return b.constant(np.asarray(a).astype(NP[dt]))


def _s(b, v, dt):
    return b.constant(data_type=dt, value=float(v))


# -- RMSNorm ----------------------------------------------------------------------------------

RMS_FORMS = ["reciprocal", "div", "pow_half", "div_one", "pow2", "scale_first", "scale_3d", "no_scale"]


def _rms(b, x, w, form, dt, eps=1e-5):
    sq = b.pow(x, _s(b, 2.0, dt)) if form == "pow2" else b.mul(x, x)
    v = b.add(b.reduce_mean(sq, axes=[x.rank - 1], keep_dimensions=True), _s(b, eps, dt))
    if form == "div":
        y = b.div(x, b.sqrt(v))
    elif form == "pow_half":
        y = b.mul(x, b.pow(v, _s(b, -0.5, dt)))
    elif form == "div_one":
        y = b.mul(b.div(_s(b, 1.0, dt), b.sqrt(v)), x)
    else:
        y = b.mul(x, b.reciprocal(b.sqrt(v)))
    if form == "no_scale":
        return y
    if form == "scale_3d":
        return b.mul(y, _c(b, w.reshape(1, 1, -1), dt))
    return b.mul(_c(b, w, dt), y) if form == "scale_first" else b.mul(y, _c(b, w, dt))


def _rms_ref(x, w, form, eps=1e-5):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y if form == "no_scale" else y * w


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("form", RMS_FORMS)
def test_rms_norm_chain_is_one_kernel(ctx, rng, form, dt):
    w = (1 + 0.1 * rng.standard_normal(96)).astype(np.float32)
    feeds = [{"x": rng.standard_normal((2, 5, 96)).astype(np.float32)}]
    names = _check(
        ctx,
        {"x": (2, 5, 96)},
        lambda b, i: {"y": _rms(b, i["x"], w, form, dt)},
        lambda f: {"y": _rms_ref(f["x"], w, form)},
        feeds,
        dt,
        kernels=1,
    )
    assert not FUSION or names[0].startswith("rmsnorm"), names


def test_rms_norm_with_residual_epilogue_and_dynamic_rows(ctx, rng):
    """x -> RMSNorm -> + residual: one kernel (the add is its epilogue), rows known at dispatch."""
    w = (1 + 0.1 * rng.standard_normal(64)).astype(np.float32)
    S = Dyn("seq", 40)
    fn = lambda b, i: {"y": b.add(_rms(b, i["x"], w, "reciprocal", "float32"), i["r"])}  # noqa: E731
    feeds = [
        {
            "x": rng.standard_normal((1, s, 64)).astype(np.float32),
            "r": rng.standard_normal((1, s, 64)).astype(np.float32),
        }
        for s in (1, 17, 40)
    ]
    _check(
        ctx, {"x": (1, S, 64), "r": (1, S, 64)}, fn, lambda f: {"y": _rms_ref(f["x"], w, "") + f["r"]}, feeds, kernels=1
    )


def test_rms_chain_with_intermediate_output_stays(ctx, rng):
    """An intermediate of the chain that is a graph output keeps the chain unfused (same values)."""
    w = (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)

    def fn(b, i):
        x = i["x"]
        ms = b.reduce_mean(b.mul(x, x), axes=[2], keep_dimensions=True)
        r = b.reciprocal(b.sqrt(b.add(ms, _s(b, 1e-5, "float32"))))
        return {"y": b.mul(b.mul(x, r), _c(b, w, "float32")), "ms": ms}

    def ref(f):
        ms = (f["x"] ** 2).mean(-1, keepdims=True)
        return {"y": f["x"] / np.sqrt(ms + 1e-5) * w, "ms": ms}

    names = _check(ctx, {"x": (1, 3, 32)}, fn, ref, [{"x": rng.standard_normal((1, 3, 32)).astype(np.float32)}])
    assert not any(n.startswith("rmsnorm") for n in names), names


# -- GEMMs writing their views (head split), reading one (head merge) --------------------------


def _heads(b, t, S, H, D, perm=(0, 2, 1, 3)):
    """[1, S, H*D] -> heads (S: the operand's own size, a dynamic one included)."""
    return b.transpose(b.reshape(t, [1, t.shape[1], H, D]), permutation=list(perm))


def _heads_ref(t, H, D, perm=(0, 2, 1, 3)):
    return t.reshape(1, t.shape[1], H, D).transpose(perm)


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("S", [3, 37], ids=["gemv", "tiled"])
def test_projection_writes_head_layouts(ctx, rng, S, dt):
    """BERT's Q/K/V: matmul + bias -> reshape -> transpose ([0,2,1,3]; K as [0,2,3,1]): the
    GEMM writes each layout; the three with their biases, 10 bindings apart, are one matmul over
    the weights side by side (fusion/siblings.py): one GEMM writing the three layouts."""
    E, H = 64, 4
    D = E // H
    W = {k: _w(rng, E, E) for k in "qkv"}
    B = {k: (0.1 * rng.standard_normal(E)).astype(np.float32) for k in "qkv"}
    perms = {"q": (0, 2, 1, 3), "k": (0, 2, 3, 1), "v": (0, 2, 1, 3)}

    def fn(b, i):
        return {
            k: _heads(b, b.add(b.matmul(i["x"], _c(b, W[k], dt)), _c(b, B[k], dt)), S, H, D, perms[k]) for k in "qkv"
        }

    def ref(f):
        return {k: _heads_ref(f["x"] @ W[k] + B[k], H, D, perms[k]) for k in "qkv"}

    names = _check(
        ctx, {"x": (1, S, E)}, fn, ref, [{"x": rng.standard_normal((1, S, E)).astype(np.float32)}], dt, kernels=1
    )
    assert not FUSION or all(n.startswith("matmul") for n in names), names


def test_fused_qkv_split_and_dynamic_rows(ctx, rng):
    """ViT's one QKV matmul + bias, split in three, each reshaped and transposed: one GEMM writing
    three head layouts, with the sequence known at dispatch."""
    E, H = 48, 3
    D = E // H
    W, Bq = _w(rng, E, 3 * E), (0.1 * rng.standard_normal(3 * E)).astype(np.float32)
    S = Dyn("seq", 50)

    def fn(b, i):
        qkv = b.add(b.matmul(i["x"], _c(b, W, "float32")), _c(b, Bq, "float32"))
        parts = b.split(qkv, 3, axis=2)
        return {
            k: b.transpose(b.reshape(p, [1, p.shape[1], H, D]), permutation=[0, 2, 1, 3]) for k, p in zip("qkv", parts)
        }

    def ref(f):
        qkv = f["x"] @ W + Bq
        return {k: _heads_ref(qkv[..., j * E : (j + 1) * E], H, D) for j, k in enumerate("qkv")}

    feeds = [{"x": rng.standard_normal((1, s, E)).astype(np.float32)} for s in (1, 4, 5, 50)]
    _check(
        ctx, {"x": (1, S, E)}, fn, ref, feeds, kernels=lambda n: len(n) <= 3 and all(k.startswith("matmul") for k in n)
    )


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("S", [3, 37], ids=["gemv", "tiled"])
def test_sibling_projections_past_the_cap(ctx, rng, S, dt):
    """fusion/siblings.py: Whisper's self-attention projections ((x Wq + bq) * s, x Wk, x Wv + bv:
    9 bindings apart) and two layers' cross-attention K and V of one encoder output (x Wk0, ..,
    x Wv1: 9) are one GEMM each, over the weights side by side, writing every head layout; the
    scores scale and the missing biases exact (* 1, + 0)."""
    E, H, T = 32, 4, 5
    D = E // H
    W = {k: _w(rng, E, E) for k in ("q", "k", "v", "k0", "v0", "k1", "v1")}
    B = {k: (0.1 * rng.standard_normal(E)).astype(np.float32) for k in "qv"}
    sc = D**-0.5
    cross = ("k0", "v0", "k1", "v1")

    def fn(b, i):
        x = i["x"]
        out = {
            "q": _heads(b, b.mul(b.add(b.matmul(x, _c(b, W["q"], dt)), _c(b, B["q"], dt)), _s(b, sc, dt)), S, H, D),
            "k": _heads(b, b.matmul(x, _c(b, W["k"], dt)), S, H, D),
            "v": _heads(b, b.add(_c(b, B["v"], dt), b.matmul(x, _c(b, W["v"], dt))), S, H, D),
        }
        return out | {k: _heads(b, b.matmul(i["e"], _c(b, W[k], dt)), T, H, D) for k in cross}

    def ref(f):
        x = f["x"]
        out = {"q": _heads_ref((x @ W["q"] + B["q"]) * sc, H, D), "k": _heads_ref(x @ W["k"], H, D)}
        out["v"] = _heads_ref(x @ W["v"] + B["v"], H, D)
        return out | {k: _heads_ref(f["e"] @ W[k], H, D) for k in cross}

    feeds = [{"x": rng.standard_normal((1, S, E)).astype(np.float32), "e": rng.standard_normal((1, T, E))}]
    names = _check(ctx, {"x": (1, S, E), "e": (1, T, E)}, fn, ref, feeds, dt, kernels=2)
    assert not FUSION or sorted(n.split("_")[2] for n in names) == sorted([f"{S}x{E}x{3 * E}", f"{T}x{E}x{4 * E}"])


def test_sibling_projections_left_apart(ctx, rng):
    """Not merged by siblings.py: two projections within the cap (gemm_views binds their own
    weights: no copy), and four past it whose outputs feed an activation (not views): their
    matmuls stay (gemm_views merges what fits)."""
    E, H, S = 32, 4, 6
    D = E // H
    W = [_w(rng, E, E) for _ in range(6)]

    def fn(b, i):
        x = i["x"]
        views = {f"h{j}": _heads(b, b.matmul(x, b.constant(W[j])), S, H, D) for j in range(2)}
        return views | {f"r{j}": b.relu(b.matmul(i["e"], b.constant(W[j]))) for j in range(2, 6)}

    def ref(f):
        views = {f"h{j}": _heads_ref(f["x"] @ W[j], H, D) for j in range(2)}
        return views | {f"r{j}": np.maximum(f["e"] @ W[j], 0) for j in range(2, 6)}

    feeds = [{"x": rng.standard_normal((1, S, E)).astype(np.float32), "e": rng.standard_normal((1, 4, E))}]
    names = _check(ctx, {"x": (1, S, E), "e": (1, 4, E)}, fn, ref, feeds)
    # (the merged copy would be one GEMM of 2E or 4E columns reading a side-by-side weight)
    assert not FUSION or not any(f"x{E}x{4 * E}" in n for n in names), names
    assert not FUSION or any("plain+plain" in n for n in names), names  # (two weights bound)


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("S", [2, 29])
def test_head_merge_read_in_place(ctx, rng, S, dt):
    """transpose([0,2,1,3]) -> reshape -> matmul + bias + residual: the GEMM reads the heads
    through the view, one kernel."""
    H, D = 4, 16
    W, Bo = _w(rng, H * D, 40), (0.1 * rng.standard_normal(40)).astype(np.float32)

    def fn(b, i):
        a = b.reshape(b.transpose(i["a"], permutation=[0, 2, 1, 3]), [1, S, H * D])
        return {"y": b.add(b.add(b.matmul(a, _c(b, W, dt)), _c(b, Bo, dt)), i["r"])}

    def ref(f):
        return {"y": f["a"].transpose(0, 2, 1, 3).reshape(1, S, H * D) @ W + Bo + f["r"]}

    feeds = [
        {
            "a": rng.standard_normal((1, H, S, D)).astype(np.float32),
            "r": rng.standard_normal((1, S, 40)).astype(np.float32),
        }
    ]
    names = _check(ctx, {"a": (1, H, S, D), "r": (1, S, 40)}, fn, ref, feeds, dt, kernels=1)
    assert not FUSION or "aview" in names[0], names


# -- LayerNorm after the GEMM producing its input (post-LN BERT: fuse_post_norms) ----------------


@pytest.fixture
def post_norm(monkeypatch):
    """The fusion on whatever the adapter (off by default on GPUs: norm.POST_NORM)."""
    monkeypatch.setattr(norm, "POST_NORM", True)


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize(
    "M,K,N,params",
    [(1, 37, 100, "sb"), (5, 64, 64, "s"), (70, 37, 100, "sb"), (131, 96, 68, "b"), (33, 24, 128, "")],
    ids=["1row", "5rows_scale", "70rows_ragged", "131rows_bias", "33rows_plain"],
)
def test_layer_norm_after_gemm(ctx, rng, post_norm, M, K, N, params, dt):
    """LayerNorm(x W + bias + residual) over the last axis: one GEMM kernel whose workgroups own
    whole rows (tiles of rows ragged at M, of columns at N) and normalize them after storing the
    sums; rows offset by 30 with a spread near 1, where E[x^2] - E[x]^2 in float32 would lose
    about 3 digits (the kernel subtracts the mean first)."""
    W, Bo = _w(rng, K, N), (0.1 * rng.standard_normal(N)).astype(np.float32)
    G = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32) if "s" in params else None
    Be = (0.1 * rng.standard_normal(N)).astype(np.float32) if "b" in params else None

    def fn(b, i):
        y = b.add(b.add(b.matmul(i["x"], _c(b, W, dt)), _c(b, Bo, dt)), i["r"])
        return {
            "y": b.layer_normalization(
                y,
                scale=None if G is None else _c(b, G, dt),
                bias=None if Be is None else _c(b, Be, dt),
                axes=[1],
                epsilon=1e-5,
            )
        }

    def ref(f):
        return {"y": _ln_ref(f["x"] @ W + Bo + f["r"], 1.0 if G is None else G, 0.0 if Be is None else Be, 1e-5)}

    feeds = [
        {
            "x": rng.standard_normal((M, K)).astype(np.float32),
            "r": (30 + rng.standard_normal((M, N))).astype(np.float32),
        }
    ]
    names = _check(ctx, {"x": (M, K), "r": (M, N)}, fn, ref, feeds, dt, kernels=1)
    assert not FUSION or "_ln_" in names[0], names


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_layer_norm_after_head_merge_gemm_dynamic_rows(ctx, rng, post_norm, dt):
    """BERT's attention output: the heads merged (read through the view) -> projection + bias +
    residual -> LayerNorm, one kernel; a dynamic sequence length run at 1 (the GEMV range of a
    plain GEMM: this one stays tiled), 3, 64 and 97 rows."""
    H, D, E = 4, 16, 64
    S = Dyn("seq", 128)
    W, Bo = _w(rng, E, E), (0.1 * rng.standard_normal(E)).astype(np.float32)
    G, Be = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32), (0.1 * rng.standard_normal(E)).astype(np.float32)

    def fn(b, i):
        a = b.reshape(b.transpose(i["a"], permutation=[0, 2, 1, 3]), [1, i["a"].shape[2], E])
        y = b.add(b.add(b.matmul(a, _c(b, W, dt)), _c(b, Bo, dt)), i["r"])
        return {"y": b.layer_normalization(y, scale=_c(b, G, dt), bias=_c(b, Be, dt), axes=[2], epsilon=1e-12)}

    def ref(f):
        s = f["a"].shape[2]
        return {"y": _ln_ref(f["a"].transpose(0, 2, 1, 3).reshape(1, s, E) @ W + Bo + f["r"], G, Be, 1e-12)}

    feeds = [
        {
            "a": rng.standard_normal((1, H, s, D)).astype(np.float32),
            "r": rng.standard_normal((1, s, E)).astype(np.float32),
        }
        for s in (1, 3, 64, 97)
    ]
    names = _check(ctx, {"a": (1, H, S, D), "r": (1, S, E)}, fn, ref, feeds, dt, kernels=1)
    assert not FUSION or ("aview" in names[0] and "_ln_" in names[0]), names


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("sum_out", [False, True], ids=["sum_read_again", "sum_is_output"])
@pytest.mark.parametrize("M", [3, 70])
def test_layer_norm_after_gemm_keeps_the_sum(ctx, rng, post_norm, M, sum_out, dt):
    """Pre-LN (ViT's residual stream): s = x W1 + bias + r, then LayerNorm(s) W2 + s. The first
    GEMM stores s and the normalized rows (two outputs), the second reads both: 2 kernels; s
    also a graph output, or not."""
    K, N = 40, 96
    W1, W2 = _w(rng, K, N), _w(rng, N, N)
    Bo = (0.1 * rng.standard_normal(N)).astype(np.float32)
    G, Be = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32), (0.1 * rng.standard_normal(N)).astype(np.float32)

    def fn(b, i):
        sm = b.add(b.add(b.matmul(i["x"], _c(b, W1, dt)), _c(b, Bo, dt)), i["r"])
        z = b.layer_normalization(sm, scale=_c(b, G, dt), bias=_c(b, Be, dt), axes=[1], epsilon=1e-6)
        out = {"y": b.add(b.matmul(z, _c(b, W2, dt)), sm)}
        return dict(out, s=sm) if sum_out else out

    def ref(f):
        sm = f["x"] @ W1 + Bo + f["r"]
        out = {"y": _ln_ref(sm, G, Be, 1e-6) @ W2 + sm}
        return dict(out, s=sm) if sum_out else out

    feeds = [{"x": rng.standard_normal((M, K)).astype(np.float32), "r": rng.standard_normal((M, N)).astype(np.float32)}]
    names = _check(ctx, {"x": (M, K), "r": (M, N)}, fn, ref, feeds, dt, kernels=2)
    assert not FUSION or "_ln2_" in names[0], names


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
def test_layer_norm_after_gemm_every_candidate(ctx, rng, post_norm, monkeypatch, vec, kind):
    """Each tile configuration the tuner may pick for a GEMM + LayerNorm or RMSNorm (split-K
    excluded: matmul._post_norm_cands; 256-thread and double-buffered tiles walking the column
    tiles), at ragged M and N, the sum kept as an output and normalized in place, vec4 loads on
    and off."""
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    M, K, N = 150, 40, 136
    W, W2 = _w(rng, K, N), _w(rng, K, N)
    G = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32)
    x = rng.standard_normal((M, K)).astype(np.float32)
    r = (5 + rng.standard_normal((M, N))).astype(np.float32)
    rms_ = kind == "rms"

    def nrm(b, v, scale):
        if rms_:
            return _rms(b, v, G, "reciprocal" if scale else "no_scale", "float32")
        return b.layer_normalization(v, scale=b.constant(G) if scale else None, axes=[1])

    def nrm_ref(v, scale):
        if rms_:
            return _rms_ref(v, G, "" if scale else "no_scale")
        return _ln_ref(v, G if scale else 1.0, 0.0, 1e-5)

    def fn(b, i):
        s = b.add(b.matmul(i["x"], b.constant(W)), i["r"])
        return {"z": nrm(b, s, True), "s": s, "z2": nrm(b, b.add(b.matmul(i["x"], b.constant(W2)), i["r"]), False)}

    s64 = x.astype(np.float64) @ W + r
    want = {"z": nrm_ref(s64, True), "s": s64, "z2": nrm_ref(x.astype(np.float64) @ W2 + r, False)}
    n = len(gemm_engine._post_norm_cands(*gemm_candidates(M, N, K, 1), N, K)[0])
    assert n >= 3
    tag = "_rmsn" if rms_ else "_ln"
    for i in range(n):
        with autotune.force(i):
            g = _build(ctx, {"x": x.shape, "r": r.shape}, fn, "float32")
            assert not FUSION or sum(tag in k for k in g.kernel_names) == 2, g.kernel_names
            got = dispatch_at(ctx, g, {"x": x, "r": r})
            g.destroy()
        for k, w in want.items():
            _close(got[k], w, "float32", f"{k} candidate {i}")


@pytest.mark.parametrize("K,N,fused", [(4096, 1024, True), (8192, 2048, False)], ids=["bert_large", "too_long"])
def test_layer_norm_after_long_gemm(ctx, rng, post_norm, K, N, fused):
    """A workgroup of the GEMM + LayerNorm walks N x K of its rows in one invocation, past
    llvmpipe's 65535 loop iterations (silently cut: wrong sums) with BERT-large's FFN (K 4096,
    N 1024) on the 64x64 tile; a tile that fits is taken (its compute loop KU steps of k at
    a time), and where none fits the normalization stays a kernel of its own."""
    M = 6
    W = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    assert gemm_engine.post_norm_fits(M, N, K) == fused

    def fn(b, i):
        return {"z": b.layer_normalization(b.add(b.matmul(i["x"], b.constant(W)), i["r"]), axes=[1])}

    def ref(f):
        return {"z": _ln_ref(f["x"].astype(np.float64) @ W + f["r"], 1.0, 0.0, 1e-5)}

    feeds = [{"x": rng.standard_normal((M, K)).astype(np.float32), "r": rng.standard_normal((M, N)).astype(np.float32)}]
    names = _check(ctx, {"x": (M, K), "r": (M, N)}, fn, ref, feeds, kernels=1 if fused else 2)
    assert not FUSION or any("_ln" in n for n in names) == fused, names


@pytest.mark.parametrize("what", ["two_axes", "norm_epilogue", "late_scale"])
def test_layer_norm_after_gemm_not_fused(ctx, rng, post_norm, what):
    """Left as a normalization kernel: it spans two axes, has an epilogue of its own, or its
    scale is computed after the GEMM (the kernel would read it before it exists)."""
    M, K, N = 6, 16, 32
    W = _w(rng, K, N)

    def fn(b, i):
        y = b.add(b.matmul(i["x"], b.constant(W)), i["r"])
        if what == "two_axes":
            return {"z": b.layer_normalization(b.reshape(y, [M, 4, 8]), axes=[1, 2])}
        if what == "late_scale":
            return {"z": b.layer_normalization(y, scale=b.abs(i["g"]), axes=[1])}
        return {"z": b.relu(b.layer_normalization(y, axes=[1]))}

    def ref(f):
        y = f["x"] @ W + f["r"]
        if what == "two_axes":
            return {"z": _ln_ref(y, 1.0, 0.0, 1e-5).reshape(M, 4, 8)}
        if what == "late_scale":
            return {"z": _ln_ref(y, np.abs(f["g"]), 0.0, 1e-5)}
        return {"z": np.maximum(_ln_ref(y, 1.0, 0.0, 1e-5), 0)}

    feeds = [
        {
            "x": rng.standard_normal((M, K)).astype(np.float32),
            "r": rng.standard_normal((M, N)).astype(np.float32),
            "g": rng.standard_normal(N).astype(np.float32),
        }
    ]
    specs = {"x": (M, K), "r": (M, N), "g": (N,)}
    names = _check(ctx, specs, fn, ref, feeds)
    assert not FUSION or not any("_ln" in n for n in names), names
    assert not FUSION or any(n.startswith("layernorm") for n in names), names


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("form", ["reciprocal", "no_scale"])
@pytest.mark.parametrize("reuse", [False, True], ids=["in_place", "sum_read_again"])
@pytest.mark.parametrize("M", [1, 5, 70])
def test_rms_norm_after_gemm(ctx, rng, post_norm, M, reuse, form, dt):
    """T5's residual stream: s = x W1 + r, then RMSNorm(s) (the exporter's chain) joins the GEMM
    (matmul.wgsl post_ln, ln_rms: the mean of the squares, no mean subtracted). In place where
    nothing else reads s (one kernel); where the next GEMM adds s back the kernel stores s and the
    normalized rows (two kernels, no rmsnorm). Rows offset by 3 (a mean the kernel must not
    subtract)."""
    K, N = 40, 96
    W1, W2 = _w(rng, K, N), _w(rng, N, N)
    g = (1 + 0.1 * rng.standard_normal(N)).astype(np.float32)

    def fn(b, i):
        sm = b.add(b.matmul(i["x"], _c(b, W1, dt)), i["r"])
        z = _rms(b, sm, g, form, dt)
        if not reuse:
            return {"y": z}
        return {"y": b.add(b.matmul(z, _c(b, W2, dt)), sm)}

    def ref(f):
        sm = f["x"] @ W1 + f["r"]
        z = _rms_ref(sm, g, form)
        return {"y": z @ W2 + sm} if reuse else {"y": z}

    feeds = [
        {
            "x": rng.standard_normal((M, K)).astype(np.float32),
            "r": (3 + rng.standard_normal((M, N))).astype(np.float32),
        }
    ]
    names = _check(ctx, {"x": (M, K), "r": (M, N)}, fn, ref, feeds, dt, kernels=2 if reuse else 1)
    assert not FUSION or ("_rmsn2_" if reuse else "_rmsn_") in names[0], names
    assert not FUSION or not any(n.startswith("rmsnorm") for n in names), names


def test_rms_norm_after_gemm_not_fused(ctx, rng, post_norm):
    """An RMSNorm over two axes stays a normalization kernel (the GEMM's rows are one axis)."""
    M, K, N = 6, 16, 32
    W = _w(rng, K, N)

    def fn(b, i):
        y = b.reshape(b.add(b.matmul(i["x"], b.constant(W)), i["r"]), [M, 4, 8])
        ms = b.reduce_mean(b.mul(y, y), axes=[1, 2], keep_dimensions=True)
        return {"z": b.mul(y, b.reciprocal(b.sqrt(b.add(ms, _s(b, 1e-5, "float32")))))}

    def ref(f):
        y = (f["x"] @ W + f["r"]).reshape(M, 4, 8)
        return {"z": y / np.sqrt((y * y).mean(axis=(1, 2), keepdims=True) + 1e-5)}

    feeds = [{"x": rng.standard_normal((M, K)).astype(np.float32), "r": rng.standard_normal((M, N)).astype(np.float32)}]
    names = _check(ctx, {"x": (M, K), "r": (M, N)}, fn, ref, feeds)
    assert not FUSION or not any("_rmsn" in n for n in names), names
    assert not FUSION or any(n.startswith("rmsnorm") for n in names), names


# -- rotary embeddings in the projection's store ---------------------------------------------


def _rope(b, t, cos, sin, D):
    r = t.rank
    st = [0] * r
    sz = list(t.shape)
    x1 = b.slice(t, st, sz[:-1] + [D // 2])
    x2 = b.slice(t, st[:-1] + [D // 2], sz[:-1] + [D // 2])
    rot = b.concat([b.neg(x2), x1], r - 1)
    return b.add(b.mul(t, cos), b.mul(rot, sin))


def _rope_ref(t, cos, sin):
    h = t.shape[-1] // 2
    return t * cos + np.concatenate([-t[..., h:], t[..., :h]], -1) * sin


def _cos_sin(rng, S, D):
    pos = np.arange(S)[:, None] * (1.0 / 10000 ** (np.arange(0, D, 2) / D))[None]
    emb = np.concatenate([pos, pos], -1)[None, None]
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("S", [1, 4, 45], ids=["decode", "gemv4", "tiled"])
def test_rotary_in_projection_store(ctx, rng, S, dt):
    """matmul -> reshape -> transpose -> rotate-half rotary (cos/sin inputs): one GEMM storing the
    rotated heads, and their identity copy (a present cache) beside them."""
    E, H = 64, 2
    D = E // H
    W = _w(rng, E, E)

    def fn(b, i):
        k = _rope(b, _heads(b, b.matmul(i["x"], _c(b, W, dt)), S, H, D), i["cos"], i["sin"], D)
        return {"k": k, "present": b.identity(k)}

    def ref(f):
        k = _rope_ref(_heads_ref(f["x"] @ W, H, D), f["cos"], f["sin"])
        return {"k": k, "present": k}

    cos, sin = _cos_sin(rng, S, D)
    feeds = [{"x": rng.standard_normal((1, S, E)).astype(np.float32), "cos": cos, "sin": sin}]
    names = _check(ctx, {"x": (1, S, E), "cos": cos.shape, "sin": sin.shape}, fn, ref, feeds, dt, kernels=1)
    assert not FUSION or "rope32" in names[0], names


@pytest.mark.parametrize("rope", [True, False], ids=["rotary", "plain"])
@pytest.mark.parametrize("S,P,dyn", [(1, 5, False), (7, 5, False), (1, 5, True), (7, 3, True), (70, 9, True)])
def test_projection_writes_the_cache_concat(ctx, rng, rope, S, P, dyn):
    """present = concat(past, rotated new heads) along the sequence: the GEMM writes the new rows
    at their place in present and copies the past rows itself (no concat kernel)."""
    E, H = 64, 2
    D = E // H
    W = _w(rng, E, E)
    Sd, Pd = (Dyn("seq", 80), Dyn("past", 20)) if dyn else (S, P)

    def fn(b, i):
        t = _heads(b, b.matmul(i["x"], _c(b, W, "float32")), None, H, D)
        if rope:
            t = _rope(b, t, i["cos"], i["sin"], D)
        return {"present": b.concat([i["past"], t], 2)}

    def ref(f):
        t = _heads_ref(f["x"] @ W, H, D)
        if rope:
            t = _rope_ref(t, f["cos"], f["sin"])
        return {"present": np.concatenate([f["past"], t], 2)}

    cos, sin = _cos_sin(rng, S, D)
    feeds = [
        {
            "x": rng.standard_normal((1, S, E)).astype(np.float32),
            "cos": cos,
            "sin": sin,
            "past": rng.standard_normal((1, H, P, D)).astype(np.float32),
        }
    ]
    specs = {"x": (1, Sd, E), "cos": (1, 1, Sd, D), "sin": (1, 1, Sd, D), "past": (1, H, Pd, D)}
    if not rope:
        for f in feeds:
            del f["cos"], f["sin"]
        del specs["cos"], specs["sin"]
    _check(ctx, specs, fn, ref, feeds, kernels=lambda n: all(k.startswith("matmul") for k in n))


def test_rotary_dynamic_sequence(ctx, rng):
    """The rotary projection with the sequence known at dispatch (the GEMV and tiled variants)."""
    E, H = 64, 4
    D = E // H
    W = _w(rng, E, E)
    S = Dyn("seq", 70)

    def fn(b, i):
        return {"q": _rope(b, _heads(b, b.matmul(i["x"], _c(b, W, "float32")), S, H, D), i["cos"], i["sin"], D)}

    feeds = []
    for s in (1, 3, 9, 70):
        cos, sin = _cos_sin(rng, s, D)
        feeds.append({"x": rng.standard_normal((1, s, E)).astype(np.float32), "cos": cos, "sin": sin})
    _check(
        ctx,
        {"x": (1, S, E), "cos": (1, 1, S, D), "sin": (1, 1, S, D)},
        fn,
        lambda f: {"q": _rope_ref(_heads_ref(f["x"] @ W, H, D), f["cos"], f["sin"])},
        feeds,
        kernels=lambda n: all(k.startswith("matmul") and "rope16" in k for k in n),
    )


def test_llama_attention_projections(ctx, rng):
    """Q (rotary), K (rotary) and V of one RMSNorm output: Q and K one GEMM (8 bindings with the
    cos/sin operands shared), V another, RMSNorm a third kernel; grouped heads."""
    E, H, Hkv, S = 64, 4, 2, 6
    D = E // H
    W = {"q": _w(rng, E, H * D), "k": _w(rng, E, Hkv * D), "v": _w(rng, E, Hkv * D)}
    g = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)

    def fn(b, i):
        h = _rms(b, i["x"], g, "reciprocal", "float32")
        out = {}
        for k, n in (("q", H), ("k", Hkv), ("v", Hkv)):
            t = _heads(b, b.matmul(h, _c(b, W[k], "float32")), S, n, D)
            out[k] = t if k == "v" else _rope(b, t, i["cos"], i["sin"], D)
        return out

    def ref(f):
        h = _rms_ref(f["x"], g, "")
        out = {}
        for k, n in (("q", H), ("k", Hkv), ("v", Hkv)):
            t = _heads_ref(h @ W[k], n, D)
            out[k] = t if k == "v" else _rope_ref(t, f["cos"], f["sin"])
        return out

    cos, sin = _cos_sin(rng, S, D)
    feeds = [{"x": rng.standard_normal((1, S, E)).astype(np.float32), "cos": cos, "sin": sin}]
    names = _check(ctx, {"x": (1, S, E), "cos": cos.shape, "sin": sin.shape}, fn, ref, feeds, kernels=3)
    assert not FUSION or sum("rope16+rope16" in n for n in names) == 1, names


def test_rotary_not_fused_when_the_rotation_is_partial(ctx, rng):
    """A rotation of half of each head (another graph): left as it was, same values."""
    E, H, S = 32, 2, 5
    D = E // H
    W = _w(rng, E, E)

    def fn(b, i):
        t = _heads(b, b.matmul(i["x"], _c(b, W, "float32")), S, H, D)
        x1 = b.slice(t, [0, 0, 0, 0], [1, H, S, 4])
        x2 = b.slice(t, [0, 0, 0, 4], [1, H, S, 4])
        rot = b.concat([b.neg(x2), x1, b.slice(t, [0, 0, 0, 8], [1, H, S, 8])], 3)
        return {"y": b.add(b.mul(t, i["cos"]), b.mul(rot, i["sin"]))}

    def ref(f):
        t = _heads_ref(f["x"] @ W, H, D)
        rot = np.concatenate([-t[..., 4:8], t[..., :4], t[..., 8:]], -1)
        return {"y": t * f["cos"] + rot * f["sin"]}

    cos, sin = _cos_sin(rng, S, D)
    names = _check(
        ctx,
        {"x": (1, S, E), "cos": cos.shape, "sin": sin.shape},
        fn,
        ref,
        [{"x": rng.standard_normal((1, S, E)).astype(np.float32), "cos": cos, "sin": sin}],
    )
    assert not any("rope" in n for n in names), names


# -- gated units -------------------------------------------------------------------------------

GLU = {
    "swiglu": (lambda b, g, u, dt: b.mul(b.mul(g, b.sigmoid(g)), u), lambda g, u: g / (1 + np.exp(-g)) * u),
    "swiglu_up_first": (lambda b, g, u, dt: b.mul(u, b.mul(b.sigmoid(g), g)), lambda g, u: g / (1 + np.exp(-g)) * u),
    "geglu": (
        lambda b, g, u, dt: b.mul(b.gelu(g), u),
        lambda g, u: 0.5 * g * (1 + np.vectorize(__import__("math").erf)(g / np.sqrt(2))) * u,
    ),
    "scaled": (lambda b, g, u, dt: b.mul(b.mul(b.relu(g), u), _s(b, 0.5, dt)), lambda g, u: np.maximum(g, 0) * u * 0.5),
}


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("M", [1, 3, 33])
@pytest.mark.parametrize("kind", list(GLU))
def test_gated_unit_is_one_gemm(ctx, rng, kind, M, dt):
    """gate = x Wg, up = x Wu, combined elementwise: one GEMM over both (columns interleaved), the
    combination in its store; then the down projection + residual: two kernels in all."""
    E, F = 48, 72
    Wg, Wu, Wd = _w(rng, E, F), _w(rng, E, F), _w(rng, F, E)
    fn_b, fn_r = GLU[kind]

    def fn(b, i):
        x = i["x"]
        y = fn_b(b, b.matmul(x, _c(b, Wg, dt)), b.matmul(x, _c(b, Wu, dt)), dt)
        return {"y": b.add(b.matmul(y, _c(b, Wd, dt)), x)}

    def ref(f):
        x = f["x"]
        return {"y": fn_r(x @ Wg, x @ Wu) @ Wd + x}

    names = _check(ctx, {"x": (M, E)}, fn, ref, [{"x": rng.standard_normal((M, E)).astype(np.float32)}], dt, kernels=2)
    assert not FUSION or "glu" in names[0], names


def test_gated_unit_outputs_used_elsewhere_stay(ctx, rng):
    """The gate's output also a graph output: the two GEMMs stay apart (same values)."""
    E, F = 16, 24
    Wg, Wu = _w(rng, E, F), _w(rng, E, F)

    def fn(b, i):
        g = b.matmul(i["x"], _c(b, Wg, "float32"))
        return {"y": b.mul(b.sigmoid(g), b.matmul(i["x"], _c(b, Wu, "float32"))), "g": g}

    def ref(f):
        g = f["x"] @ Wg
        return {"y": 1 / (1 + np.exp(-g)) * (f["x"] @ Wu), "g": g}

    names = _check(ctx, {"x": (5, E)}, fn, ref, [{"x": rng.standard_normal((5, E)).astype(np.float32)}])
    assert not any("glu" in n for n in names), names


@pytest.mark.parametrize("form", ["split", "slices"])
def test_fused_gate_up_weight_is_one_gated_gemm(ctx, rng, form):
    """Phi-3's gate_up_proj: one matmul by [Wg | Wu], its output split (or sliced) into gate and
    up (compiler/fusion/split.py): the gated unit fuses as with two weights."""
    E, F, M = 32, 40, 7
    W, Wd = _w(rng, E, 2 * F), _w(rng, F, E)

    def fn(b, i):
        y = b.matmul(i["x"], _c(b, W, "float32"))
        if form == "split":
            g, u = b.split(y, [F, F], axis=1)
        else:
            g, u = b.slice(y, [0, 0], [M, F]), b.slice(y, [0, F], [M, F])
        return {"y": b.matmul(b.mul(u, b.mul(b.sigmoid(g), g)), _c(b, Wd, "float32"))}

    def ref(f):
        g, u = f["x"] @ W[:, :F], f["x"] @ W[:, F:]
        return {"y": (u * g / (1 + np.exp(-g))) @ Wd}

    names = _check(ctx, {"x": (M, E)}, fn, ref, [{"x": rng.standard_normal((M, E)).astype(np.float32)}], kernels=2)
    assert not FUSION or "glu" in names[0], names


def test_overlapping_column_blocks_stay_one_matmul(ctx, rng):
    """Two slices of one matmul's output sharing columns: not split (split.py would compute the
    shared columns twice); values as numpy."""
    E, M = 16, 5
    W = _w(rng, E, 24)

    def fn(b, i):
        y = b.matmul(i["x"], _c(b, W, "float32"))
        return {"p": b.sigmoid(b.slice(y, [0, 0], [M, 16])), "q": b.relu(b.slice(y, [0, 8], [M, 16]))}

    def ref(f):
        y = f["x"] @ W
        return {"p": 1 / (1 + np.exp(-y[:, :16])), "q": np.maximum(y[:, 8:], 0)}

    names = _check(ctx, {"x": (M, E)}, fn, ref, [{"x": rng.standard_normal((M, E)).astype(np.float32)}])
    assert not FUSION or sum(n.startswith("matmul") for n in names) == 1, names


# -- DAG epilogues -------------------------------------------------------------------------------

ACTS = {
    "gelu_bert": (
        lambda b, f, dt: b.mul(b.mul(f, b.add(b.erf(b.div(f, _s(b, np.sqrt(2), dt))), _s(b, 1, dt))), _s(b, 0.5, dt)),
        lambda f: f * (1 + np.vectorize(__import__("math").erf)(f / np.sqrt(2))) * 0.5,
    ),
    "gelu_vit": (
        lambda b, f, dt: b.mul(b.mul(f, _s(b, 0.5, dt)), b.add(b.erf(b.div(f, _s(b, np.sqrt(2), dt))), _s(b, 1, dt))),
        lambda f: f * 0.5 * (1 + np.vectorize(__import__("math").erf)(f / np.sqrt(2))),
    ),
    "gelu_tanh": (
        lambda b, f, dt: b.mul(
            b.mul(_s(b, 0.5, dt), f),
            b.add(
                _s(b, 1, dt),
                b.tanh(
                    b.mul(_s(b, np.sqrt(2 / np.pi), dt), b.add(f, b.mul(_s(b, 0.044715, dt), b.mul(f, b.mul(f, f)))))
                ),
            ),
        ),
        lambda f: 0.5 * f * (1 + np.tanh(np.sqrt(2 / np.pi) * (f + 0.044715 * f**3))),
    ),
    "swish": (lambda b, f, dt: b.mul(f, b.sigmoid(f)), lambda f: f / (1 + np.exp(-f))),
}


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("act", list(ACTS))
def test_dag_epilogue(ctx, rng, act, dt):
    """matmul + bias, then an activation written as a DAG reading the GEMM's output several
    times: one kernel (the scalar constants inlined, not bound)."""
    E, F = 40, 64
    W, Bf = _w(rng, E, F), (0.1 * rng.standard_normal(F)).astype(np.float32)
    fb, fr = ACTS[act]

    def fn(b, i):
        return {"y": fb(b, b.add(b.matmul(i["x"], _c(b, W, dt)), _c(b, Bf, dt)), dt)}

    names = _check(
        ctx,
        {"x": (1, 21, E)},
        fn,
        lambda f: {"y": fr(f["x"] @ W + Bf)},
        [{"x": rng.standard_normal((1, 21, E)).astype(np.float32)}],
        dt,
        kernels=1,
    )
    assert not FUSION or names[0].startswith("matmul"), names


# -- grouped K/V heads ---------------------------------------------------------------------------


def test_grouped_heads_read_without_copies(ctx, rng, monkeypatch):
    """repeat_kv (reshape, expand, reshape) before a fused attention: with
    grouped.FUSE_GROUPED_HEADS the attention kernel reads the K/V heads as they are (no expand
    kernels), the same values."""
    monkeypatch.setattr(grouped, "FUSE_GROUPED_HEADS", True)
    B, H, Hkv, S, D = 1, 8, 2, 12, 16

    def fn(b, i):
        def rep(x):
            return b.reshape(b.expand(b.reshape(x, [B, Hkv, 1, S, D]), [B, Hkv, H // Hkv, S, D]), [B, H, S, D])

        s = b.mul(b.matmul(i["q"], b.transpose(rep(i["k"]), permutation=[0, 1, 3, 2])), _s(b, D**-0.5, "float32"))
        return {"o": b.matmul(b.softmax(s, 3), rep(i["v"]))}

    def ref(f):
        k, v = (np.repeat(f[n], H // Hkv, axis=1) for n in "kv")
        s = f["q"] @ k.transpose(0, 1, 3, 2) * D**-0.5
        p = np.exp(s - s.max(-1, keepdims=True))
        return {"o": p / p.sum(-1, keepdims=True) @ v}

    feeds = [
        {
            "q": rng.standard_normal((B, H, S, D)).astype(np.float32),
            "k": rng.standard_normal((B, Hkv, S, D)).astype(np.float32),
            "v": rng.standard_normal((B, Hkv, S, D)).astype(np.float32),
        }
    ]
    names = _check(ctx, {"q": (B, H, S, D), "k": (B, Hkv, S, D), "v": (B, Hkv, S, D)}, fn, ref, feeds, kernels=1)
    assert not FUSION or names[0].startswith("attention"), names


# -- every GEMM candidate of the fused kernels ----------------------------------------------------


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
def test_fused_gemm_every_candidate(ctx, rng, monkeypatch, vec):
    """Rotary + merged projections, a gated unit and a head merge at a ragged M, with each tile
    configuration the tuner may pick (split-K excluded for fused stores) and vec4 loads on/off."""
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    E, H, S = 64, 4, 70
    D = E // H
    Wq, Wk, Wg, Wu, Wo = (_w(rng, E, E) for _ in range(5))
    cos, sin = _cos_sin(rng, S, D)
    x = rng.standard_normal((1, S, E)).astype(np.float32)
    a = rng.standard_normal((1, H, S, D)).astype(np.float32)

    def fn(b, i):
        q = _rope(b, _heads(b, b.matmul(i["x"], b.constant(Wq)), S, H, D), i["cos"], i["sin"], D)
        k = _rope(b, _heads(b, b.matmul(i["x"], b.constant(Wk)), S, H, D), i["cos"], i["sin"], D)
        g = b.matmul(i["x"], b.constant(Wg))
        y = b.mul(b.mul(g, b.sigmoid(g)), b.matmul(i["x"], b.constant(Wu)))
        o = b.matmul(b.reshape(b.transpose(i["a"], permutation=[0, 2, 1, 3]), [1, S, E]), b.constant(Wo))
        return {"q": q, "k": k, "y": y, "o": o}

    g64 = lambda t: t.astype(np.float64)  # noqa: E731
    want = {
        "q": _rope_ref(_heads_ref(g64(x) @ Wq, H, D), cos, sin),
        "k": _rope_ref(_heads_ref(g64(x) @ Wk, H, D), cos, sin),
        "o": g64(a).transpose(0, 2, 1, 3).reshape(1, S, E) @ Wo,
    }
    gg = g64(x) @ Wg
    want["y"] = gg / (1 + np.exp(-gg)) * (g64(x) @ Wu)
    n = len(no_split(*gemm_candidates(S, 2 * E, E, 1))[0])
    for i in range(n):
        with autotune.force(i):
            got = dispatch_at(
                ctx,
                _build(ctx, {"x": x.shape, "a": a.shape, "cos": cos.shape, "sin": sin.shape}, fn, "float32"),
                {"x": x, "a": a, "cos": cos, "sin": sin},
            )
        for k, w in want.items():
            _close(got[k], w, "float32", f"{k} candidate {i}")


# -- whole exports against onnxruntime -----------------------------------------------------------


def _per_layer(ctx, make, feeds):
    """(launches of one run per layer (2 layers - 1 layer), errors against onnxruntime)."""
    ort = pytest.importorskip("onnxruntime")
    from mltensor import InferenceSession

    counts, err = [], 0.0
    for layers in (1, 2):
        model = make(layers)
        s = InferenceSession(model, ctx, cache=False)
        got = s.run(None, feeds)
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
        for g_, w_ in zip(got, want):
            err = max(err, float(np.abs(g_ - w_).max() / max(np.abs(w_).max(), 1e-30)))
        counts.append(launches_run(s.graph, feeds))
        s.close()
    return counts[1] - counts[0], err


@pytest.mark.parametrize("ln", [True, False], ids=["norm_in_gemm", "norm_kernels"])
def test_bert_layer_launches(ctx, rng, monkeypatch, ln):
    """A small BertModel export (the bench's builder): 5 launches per layer (the Q, K, V GEMM
    over their weights side by side: fusion/siblings.py, attention, output projection reading
    the heads + residual + LayerNorm, FFN1 + GELU, FFN2 + residual + LayerNorm); 7 with the
    LayerNorms as kernels (norm.POST_NORM off, GPUs' default); onnxruntime's values."""
    monkeypatch.setattr(norm, "POST_NORM", ln)
    bench = pytest.importorskip("bench.test_bench_transformer")
    feeds = {
        "input_ids": rng.integers(0, 500, (1, 24)).astype(np.int64),
        "attention_mask": np.ones((1, 24), np.int64),
        "token_type_ids": np.zeros((1, 24), np.int64),
    }
    feeds["attention_mask"][:, 20:] = 0
    per, err = _per_layer(
        ctx, lambda n: bench.bert(layers=n, hidden=64, heads=4, inter=128, vocab=500, max_pos=64)[0], feeds
    )
    assert err < 1e-4, err
    assert not FUSION or per == (5 if ln else 7), per


@pytest.mark.parametrize("ln", [True, False], ids=["norm_in_gemm", "norm_kernels"])
def test_vit_layer_launches(ctx, rng, monkeypatch, ln):
    """A small ViT export (pre-LN: each LayerNorm reads the residual stream, which the next
    residual add reads again): 5 launches per layer (QKV GEMM, attention, output projection +
    residual storing the stream and its LayerNorm, FFN1 + GELU, FFN2 + residual storing the
    stream and the next LayerNorm); 7 with the LayerNorms as kernels; onnxruntime's values."""
    from mltensor.models_synthetic import vit

    monkeypatch.setattr(norm, "POST_NORM", ln)
    feeds = {"pixel_values": rng.random((1, 3, 40, 40), dtype=np.float32)}
    per, err = _per_layer(
        ctx, lambda n: vit(layers=n, hidden=64, heads=4, mlp=128, image=40, patch=8, classes=10), feeds
    )
    assert err < 1e-4, err
    assert not FUSION or per == (5 if ln else 7), per


@pytest.mark.parametrize("ln", [True, False], ids=["norm_in_gemm", "norm_kernels"])
@pytest.mark.parametrize("seq", [9, 1], ids=["prefill", "decode"])
def test_llama_layer_launches(ctx, rng, monkeypatch, seq, ln):
    """A small Llama-style export (the bench's builder: RMSNorm chains, rotary, GQA repeat_kv,
    SwiGLU): per layer the Q+K GEMM with rotary, V GEMM writing the present cache, attention
    reading the shared K/V heads (no repeat copies), the output projection reading the heads and
    normalizing the residual sum it writes (the RMSNorm after the GEMM: norm.POST_NORM, CPU
    adapters' default), the SwiGLU GEMM, the down projection normalizing the next layer's input (6;
    8 with the RMSNorms as kernels, GPUs' default; for a decode step the K and V GEMMs write the
    present caches, past rows included, and a cache of at most attention.DECODE_SPLIT_MIN_SK
    keys is one attention kernel, not the split decode's two); onnxruntime's values."""
    monkeypatch.setattr(norm, "POST_NORM", ln)
    bench = pytest.importorskip("bench.test_bench_transformer")
    cfg = dict(hidden=128, heads=4, kv_heads=2, inter=352, vocab=512)
    hd = 32

    def feeds_for(layers):
        past = 0 if seq > 1 else 5
        f = {
            "input_ids": rng.integers(0, 512, (1, seq)).astype(np.int64),
            "attention_mask": np.ones((1, past + seq), np.int64),
            "position_ids": np.arange(past, past + seq, dtype=np.int64)[None],
        }
        for i in range(layers):
            for kv in ("key", "value"):
                f[f"past_key_values.{i}.{kv}"] = rng.standard_normal((1, 2, past, hd)).astype(np.float32)
        return f

    feeds = feeds_for(2)
    ort = pytest.importorskip("onnxruntime")
    from mltensor import InferenceSession

    counts = []
    for layers in (1, 2):
        model = bench.llama(layers=layers, **cfg)[0]
        f = {k: v for k, v in feeds.items() if not k.startswith("past_") or int(k.split(".")[1]) < layers}
        s = InferenceSession(model, ctx, cache=False)
        got = s.run(None, f)
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, f)
        for g_, w_ in zip(got, want):
            assert float(np.abs(g_ - w_).max() / max(np.abs(w_).max(), 1e-30)) < 1e-4
        counts.append(launches_run(s.graph, f))
        s.close()
    per = counts[1] - counts[0]
    assert not FUSION or per == (6 if ln else 8), (per, counts)


@pytest.mark.parametrize("sg", [0, 1], ids=["workgroup_memory", "subgroups"])
def test_fused_gemv_variants(ctx, rng, sg):
    """M <= 4: the fused GEMV (octets for rotary and gated segments, quads otherwise), reduced in
    workgroup memory or within subgroups first."""
    if sg and "subgroup" not in ctx.device.features:
        pytest.skip("the adapter has no subgroups")
    E, H, S = 64, 2, 3
    D = E // H
    Wq, Wv, Wg, Wu = (_w(rng, E, E) for _ in range(4))
    cos, sin = _cos_sin(rng, S, D)
    x = rng.standard_normal((1, S, E)).astype(np.float32)

    def fn(b, i):
        q = _rope(b, _heads(b, b.matmul(i["x"], b.constant(Wq)), S, H, D), i["cos"], i["sin"], D)
        v = _heads(b, b.matmul(i["x"], b.constant(Wv)), S, H, D)
        g = b.matmul(i["x"], b.constant(Wg))
        return {"q": q, "v": v, "y": b.mul(b.relu(g), b.matmul(i["x"], b.constant(Wu)))}

    x64 = x.astype(np.float64)
    want = {
        "q": _rope_ref(_heads_ref(x64 @ Wq, H, D), cos, sin),
        "v": _heads_ref(x64 @ Wv, H, D),
        "y": np.maximum(x64 @ Wg, 0) * (x64 @ Wu),
    }
    with autotune.force(sg):
        g = _build(ctx, {"x": x.shape, "cos": cos.shape, "sin": sin.shape}, fn, "float32")
        got = dispatch_at(ctx, g, {"x": x, "cos": cos, "sin": sin})
    assert not FUSION or all(n.endswith("_gemv_sg" if sg else "_gemv") for n in _compute(g.kernel_names)), (
        g.kernel_names
    )
    for k, w in want.items():
        _close(got[k], w, "float32", k)


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("M", [1, 3, 45])
@pytest.mark.parametrize("scale", [True, False], ids=["scale", "no_scale"])
def test_rms_prologue(ctx, rng, monkeypatch, M, scale, dt):
    """rms.RMS_PROLOGUE: an RMSNorm read only as GEMMs' A (a gated unit and a plain
    projection) is computed by them as they load A: two kernels, no rmsnorm."""
    monkeypatch.setattr(rms, "RMS_PROLOGUE", True)
    E, F = 64, 48
    g = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    Wg, Wu, Wp = _w(rng, E, F), _w(rng, E, F), _w(rng, E, 40)
    form = "reciprocal" if scale else "no_scale"

    def fn(b, i):
        h = _rms(b, i["x"], g, form, dt)
        gate = b.matmul(h, _c(b, Wg, dt))
        return {
            "y": b.mul(b.mul(gate, b.sigmoid(gate)), b.matmul(h, _c(b, Wu, dt))),
            "p": b.add(b.matmul(h, _c(b, Wp, dt)), _c(b, np.ones(40), dt)),
        }

    def ref(f):
        h = _rms_ref(f["x"], g, form)
        gg = h @ Wg
        return {"y": gg / (1 + np.exp(-gg)) * (h @ Wu), "p": h @ Wp + 1}

    names = _check(ctx, {"x": (M, E)}, fn, ref, [{"x": rng.standard_normal((M, E)).astype(np.float32)}], dt, kernels=2)
    assert not FUSION or all("rms+" in n for n in names), names


def test_rms_prologue_every_candidate(ctx, rng, monkeypatch):
    """The RMS prologue with merged rotary projections, each tile configuration, dynamic rows."""
    monkeypatch.setattr(rms, "RMS_PROLOGUE", True)
    E, H = 64, 2
    D = E // H
    g = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32)
    Wq, Wk = _w(rng, E, E), _w(rng, E, E)
    S = Dyn("seq", 80)

    def fn(b, i):
        h = _rms(b, i["x"], g, "reciprocal", "float32")
        return {
            k: _rope(b, _heads(b, b.matmul(h, b.constant(w)), None, H, D), i["cos"], i["sin"], D)
            for k, w in (("q", Wq), ("k", Wk))
        }

    n = len(no_split(*gemm_candidates(80, 2 * E, E, 1), 8)[0])
    for s in (2, 67):
        cos, sin = _cos_sin(rng, s, D)
        x = rng.standard_normal((1, s, E)).astype(np.float32)
        h = _rms_ref(x.astype(np.float64), g, "")
        want = {k: _rope_ref(_heads_ref(h @ w, H, D), cos, sin) for k, w in (("q", Wq), ("k", Wk))}
        for i in range(n):
            with autotune.force(i):
                gr = _build(ctx, {"x": (1, S, E), "cos": (1, 1, S, D), "sin": (1, 1, S, D)}, fn, "float32")
                got = dispatch_at(ctx, gr, {"x": x, "cos": cos, "sin": sin})
            assert not FUSION or all("rms+rope32+rope32" in k for k in gr.kernel_names), gr.kernel_names
            for k, w in want.items():
                _close(got[k], w, "float32", f"{k} s={s} candidate {i}")


# -- normalizations reading through the sum before them ------------------------------------------


def _ln_ref(x, g, bb, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + bb


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("reuse", [False, True], ids=["sum_read_once", "sum_read_again"])
def test_norm_reads_the_residual_sum(ctx, rng, norm, reuse, dt):
    """y = norm(a + b [+ c, broadcast]): one kernel, the sum evaluated as the norm reads it; where
    the sum is read again (a pre-norm residual stream, here a graph output and a later add) the
    normalization's kernel writes it too."""
    E = 96
    g, bb = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32), (0.1 * rng.standard_normal(E)).astype(np.float32)
    pos = rng.standard_normal((1, 1, E)).astype(np.float32)

    def fn(b, i):
        s = b.add(b.add(i["a"], i["b"]), _c(b, pos, dt))
        y = (
            b.layer_normalization(s, axes=[2], scale=_c(b, g, dt), bias=_c(b, bb, dt))
            if norm == "layer"
            else _rms(b, s, g, "reciprocal", dt)
        )
        out = {"y": y}
        if reuse:
            out["s"] = s
            out["z"] = b.add(y, s)
        return out

    def ref(f):
        s = f["a"] + f["b"] + pos
        y = _ln_ref(s, g, bb) if norm == "layer" else _rms_ref(s, g, "")
        return {"y": y, "s": s, "z": y + s} if reuse else {"y": y}

    feeds = [
        {"a": rng.standard_normal((2, 7, E)).astype(np.float32), "b": rng.standard_normal((2, 7, E)).astype(np.float32)}
    ]
    names = _check(ctx, {"a": (2, 7, E), "b": (2, 7, E)}, fn, ref, feeds, dt, kernels=2 if reuse else 1)
    assert not FUSION or names[0].endswith(("_src", "_src_f16")) or "_src" in names[0], names


def test_norm_source_dynamic_rows(ctx, rng):
    """The embedding sum before a LayerNorm, rows known at dispatch: one kernel."""
    E = 64
    g, bb = (1 + 0.1 * rng.standard_normal(E)).astype(np.float32), (0.1 * rng.standard_normal(E)).astype(np.float32)
    S = Dyn("seq", 50)

    def fn(b, i):
        return {
            "y": b.layer_normalization(
                b.add(i["a"], i["b"]), axes=[2], scale=_c(b, g, "float32"), bias=_c(b, bb, "float32")
            )
        }

    feeds = [
        {"a": rng.standard_normal((1, s, E)).astype(np.float32), "b": rng.standard_normal((1, s, E)).astype(np.float32)}
        for s in (1, 9, 50)
    ]
    _check(
        ctx, {"a": (1, S, E), "b": (1, S, E)}, fn, lambda f: {"y": _ln_ref(f["a"] + f["b"], g, bb)}, feeds, kernels=1
    )


def test_single_kv_head_attention_keeps_its_matmuls(ctx, rng):
    """One K/V head ([1, 1, S, D], broadcast over the query heads) and the head merge after the
    attention: the matmuls of the scores and of P @ V stay the attention pass's (one attention
    kernel), the output projection reads the merged heads: two kernels."""
    H, S, D = 4, 12, 16
    Wo = _w(rng, H * D, 32)

    def fn(b, i):
        s = b.mul(b.matmul(i["q"], b.transpose(i["k"], permutation=[0, 1, 3, 2])), _s(b, D**-0.5, "float32"))
        a = b.matmul(b.softmax(s, 3), i["v"])
        return {"y": b.matmul(b.reshape(b.transpose(a, permutation=[0, 2, 1, 3]), [1, S, H * D]), _c(b, Wo, "float32"))}

    def ref(f):
        s = f["q"] @ f["k"].transpose(0, 1, 3, 2) * D**-0.5
        p = np.exp(s - s.max(-1, keepdims=True))
        a = p / p.sum(-1, keepdims=True) @ f["v"]
        return {"y": a.transpose(0, 2, 1, 3).reshape(1, S, H * D) @ Wo}

    feeds = [
        {
            "q": rng.standard_normal((1, H, S, D)).astype(np.float32),
            "k": rng.standard_normal((1, 1, S, D)).astype(np.float32),
            "v": rng.standard_normal((1, 1, S, D)).astype(np.float32),
        }
    ]
    names = _check(ctx, {"q": (1, H, S, D), "k": (1, 1, S, D), "v": (1, 1, S, D)}, fn, ref, feeds, kernels=2)
    assert not FUSION or (names[0].startswith("attention") and "aview" in names[1]), names


def test_projection_view_feeding_another_projection(ctx, rng):
    """A projection's head-split view read as A by another projection through the head merge:
    the first GEMM writes the view, the second reads that written value (not the first's
    unwritten output)."""
    E, H, S = 32, 4, 5
    D = E // H
    W1, W2 = _w(rng, E, E), _w(rng, E, 24)

    def fn(b, i):
        t = _heads(b, b.matmul(i["x"], _c(b, W1, "float32")), S, H, D)
        t2 = b.reshape(b.transpose(t, permutation=[0, 2, 3, 1]), [1, S, E])  # channels d * H + h
        return {"y": b.matmul(t2, _c(b, W2, "float32"))}

    def ref(f):
        t = _heads_ref(f["x"] @ W1, H, D)
        return {"y": t.transpose(0, 2, 3, 1).reshape(1, S, E) @ W2}

    _check(ctx, {"x": (1, S, E)}, fn, ref, [{"x": rng.standard_normal((1, S, E)).astype(np.float32)}])


# -- linear layers written flat (fusion/linear.py) ------------------------------------------------


@pytest.mark.parametrize("M", [4, 16, 33])
@pytest.mark.parametrize("bias", [False, True])
def test_flat_gemm_with_transposed_constant_weight(ctx, rng, M, bias):
    """reshape [1, M, K] -> [M, K], gemm with a constant B read transposed, reshape back: the pass
    makes one matmul over a new, transposed constant, which the build must upload (it once bound
    an unwritten pool buffer instead: TFLite's FULLY_CONNECTED on a [1, 16, 32] input)."""
    K, N = 32, 24
    w = _w(rng, N, K)
    c = rng.standard_normal(N).astype(np.float32)

    def fn(b, i):
        y = b.gemm(b.reshape(i["x"], [M, K]), b.constant(w), c=b.constant(c) if bias else None, b_transpose=True)
        return {"y": b.reshape(y, [1, M, N])}

    feeds = [{"x": rng.standard_normal((1, M, K)).astype(np.float32)}]
    _check(ctx, {"x": (1, M, K)}, fn, lambda f: {"y": f["x"] @ w.T + (c if bias else 0)}, feeds)
