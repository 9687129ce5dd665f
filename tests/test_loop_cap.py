"""Sizes past llvmpipe's loop cap (runtime/wgsl.py LOOP_BUDGET): Mesa's lavapipe silently ends an
invocation's loops after 65535 iterations in total, so a kernel with one invocation walking a
long group, plane or K axis returns wrong values without an error. Each test runs an operator at a
size where its single-invocation kernel loops past the cap (it failed there before the split
variants) against float64 numpy, with tolerances that a sum cut short would fail by far. Shapes
are large along the walked axis only, so each test stays cheap on lavapipe."""

import numpy as np
import pytest
from helpers import run_graph

import mltensor
from mltensor import MLDynamicDimension as D
from mltensor.errors import NotSupportedError
from mltensor.runtime.wgsl import LOOP_BUDGET, loop_guard

R = np.random.default_rng(11)
BIG = 1_500_000  # one group / row: 3 loops of BIG / 64 in a workgroup-per-group kernel > 65535


def _layer(a, axes, scale=None, bias=None, eps=1e-5):
    a = a.astype(np.float64)
    m = a.mean(axis=axes, keepdims=True)
    v = ((a - m) ** 2).mean(axis=axes, keepdims=True)
    r = (a - m) / np.sqrt(v + eps)
    return r * (1 if scale is None else scale) + (0 if bias is None else bias)


# -- the guard ------------------------------------------------------------------------------------


def test_guard_refuses_a_declared_count_past_the_budget(ctx):
    loop_guard("some_op", LOOP_BUDGET)
    with pytest.raises(NotSupportedError, match=r"\[some_op\].*65535"):
        loop_guard("some_op", LOOP_BUDGET + 1)
    # a size known at dispatch counts at its largest allowed value
    k = mltensor.MLGraphBuilder(ctx).input("x", data_type="float32", shape=[D("k", 30_000)]).shape[0]
    loop_guard("some_op", 2 * k)
    with pytest.raises(NotSupportedError, match="some_op"):
        loop_guard("some_op", 3 * k)


def test_guard_fires_in_a_lowering(ctx, monkeypatch):
    """A kernel declaring more iterations than the budget fails the build with the operator's
    name (here: the normalization's split threshold moved past the cap, so the one-workgroup
    kernel would be used for a group it cannot walk)."""
    from mltensor.ops import normalization

    monkeypatch.setattr(normalization, "SPLIT_K_CPU", 1 << 30)
    monkeypatch.setattr(normalization, "SPLIT_K", 1 << 30)
    monkeypatch.setenv("MLTENSOR_LOOP_CAP", "1")  # (on a GPU too: refused where the cap may apply)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, BIG])
    with pytest.raises(NotSupportedError, match="layer_normalization"):
        b.build_sync({"y": b.layer_normalization(x)})


# -- normalizations -------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_layer_normalization_long_group(ctx, dt):
    x = (R.standard_normal((1, BIG)) * 2 + 3).astype(dt)
    scale = R.uniform(0.5, 1.5, BIG).astype(dt)
    bias = R.standard_normal(BIG).astype(dt)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type=dt, shape=x.shape)
    y = b.relu(b.layer_normalization(xi, scale=b.constant(scale), bias=b.constant(bias)))
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    want = np.maximum(_layer(x, (1,), scale.astype(np.float64), bias.astype(np.float64)), 0)
    tol = dict(rtol=1e-4, atol=1e-4) if dt == "float32" else dict(rtol=5e-3, atol=5e-3)
    np.testing.assert_allclose(r.astype(np.float64), want, **tol)


def test_layer_normalization_residual_source(ctx):
    """A residual sum read by the normalization (fused as its source) and also a graph output:
    the split path's apply pass writes it once."""
    n = BIG
    a = R.standard_normal((2, n)).astype(np.float32)
    c = R.standard_normal((2, n)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    ai, ci = b.input("a", data_type="float32", shape=a.shape), b.input("c", data_type="float32", shape=c.shape)
    s = b.add(ai, ci)
    r = run_graph(ctx, {"y": b.layer_normalization(s, axes=[1]), "s": s}, {"a": a, "c": c}, b)
    np.testing.assert_allclose(r["y"], _layer(a.astype(np.float64) + c, (1,)), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(r["s"], a + c)


def test_rms_normalization_long_group(ctx):
    n = 2_200_000  # (two loops of n / 64: past the cap from ~2.1M)
    x = (R.standard_normal((1, n)) + 1).astype(np.float32)
    scale = R.uniform(0.5, 1.5, n).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=x.shape)
    y = b._rms_normalization(xi, scale=b.constant(scale), axes=[1], epsilon=1e-6)
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * scale
    np.testing.assert_allclose(r, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_instance_normalization_large_plane(ctx, layout):
    """A GroupNorm of a Stable Diffusion VAE decoder at 512x512 normalizes groups of 1M-4M
    elements; here two planes of 1.44M (past the cap with the one-workgroup kernel: 3 loops of
    1.44M / 64 plus its trees) and a mean far from 0 (a variance computed carelessly loses it)."""
    c, h, w = 2, 1200, 1200
    shape = (1, c, h, w) if layout == "nchw" else (1, h, w, c)
    x = (R.standard_normal(shape) * 0.5 + 10).astype(np.float32)
    scale = R.uniform(0.5, 1.5, c).astype(np.float32)
    bias = R.standard_normal(c).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=shape)
    y = b.instance_normalization(xi, scale=b.constant(scale), bias=b.constant(bias), layout=layout)
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    sh = (1, c, 1, 1) if layout == "nchw" else (1, 1, 1, c)
    want = _layer(x, (2, 3) if layout == "nchw" else (1, 2), scale.reshape(sh), bias.reshape(sh))
    np.testing.assert_allclose(r, want, rtol=1e-3, atol=1e-3)


def test_layer_normalization_dynamic_group(ctx):
    """A dynamic normalized axis crossing the split threshold: the split launches are sized at
    dispatch, each size computes what its static build computes, bit for bit."""
    from test_dynamic_reduce import check

    specs = {"x": ("float32", [2, D("n", BIG)])}
    sizes = [{"n": 1}, {"n": 3000}, {"n": BIG}, {"n": 700_001}]
    check(
        ctx,
        specs,
        lambda b, x: b.layer_normalization(x, axes=[1]),
        sizes,
        lambda a: _layer(a, (1,)),
        rtol=1e-4,
        atol=1e-4,
    )


# -- pools ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_global_pools_large_plane(ctx, layout):
    """Global average / max / l2 pools of a 2048x2048 plane (64 threads walking it loop 65536
    times each), two channels, a mean far from 0."""
    c, h = 2, 2048
    shape = (1, c, h, h) if layout == "nchw" else (1, h, h, c)
    x = (R.standard_normal(shape) + 3).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=shape)
    outs = {
        "avg": b.average_pool2d(xi, layout=layout),
        "max": b.max_pool2d(xi, layout=layout),
        "l2": b.relu(b.l2_pool2d(xi, layout=layout)),
    }
    r = run_graph(ctx, outs, {"x": x}, b)
    ax = (2, 3) if layout == "nchw" else (1, 2)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(r["avg"].ravel(), x64.mean(axis=ax).ravel(), rtol=1e-5)
    np.testing.assert_array_equal(r["max"].ravel(), x.max(axis=ax).ravel())
    np.testing.assert_allclose(r["l2"].ravel(), np.sqrt((x64**2).sum(axis=ax)).ravel(), rtol=1e-5)


def test_global_max_pool_int8_and_float16(ctx):
    h = 2100
    xi8 = R.integers(-128, 127, (1, 1, h, h)).astype(np.int8)
    xi8[0, 0, -1, -1] = 127  # the maximum in the plane's last element: a walk cut short misses it
    x16 = (R.standard_normal((1, 1, h, h)) + 3).astype(np.float16)
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="int8", shape=xi8.shape)
    f = b.input("f", data_type="float16", shape=x16.shape)
    r = run_graph(ctx, {"m": b.max_pool2d(a), "avg": b.average_pool2d(f)}, {"a": xi8, "f": x16}, b)
    assert r["m"].ravel().tolist() == [127]
    np.testing.assert_allclose(r["avg"].ravel(), [x16.astype(np.float64).mean()], rtol=2e-3)


def test_global_pool_dynamic_plane(ctx):
    """A dynamic plane crossing the split threshold: bit for bit its static build."""
    from test_dynamic_reduce import check

    specs = {"x": ("float32", [D("n", 2), 3, D("h", 2100), D("w", 2100)])}
    sizes = [{"n": 1, "h": 5, "w": 7}, {"n": 2, "h": 200, "w": 300}, {"n": 1, "h": 2100, "w": 2050}]
    check(
        ctx,
        specs,
        lambda b, x: b.average_pool2d(x),
        sizes,
        lambda a: a.astype(np.float64).mean(axis=(2, 3), keepdims=True),
        rtol=1e-5,
        atol=1e-6,
    )


# -- GEMM family ----------------------------------------------------------------------------------


def _mm_check(r, want):
    # relative to the result's scale: a K cut at ~40000 of 70000 is off by ~40%
    np.testing.assert_allclose(r, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("m,n", [(8, 8), (64, 64), (2, 3)])
def test_matmul_long_k(ctx, m, n):
    """K = 70000 (the tiled kernel's step loop, compute and staging loops pass the cap from
    K ~ 40000 on lavapipe's tile): split-K, at least enough chunks; (2, 3): the GEMV."""
    k = 70000
    a = R.standard_normal((m, k)).astype(np.float32)
    w = R.standard_normal((k, n)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    ai = b.input("a", data_type="float32", shape=a.shape)
    r = run_graph(ctx, {"y": b.matmul(ai, b.constant(w))}, {"a": a}, b)["y"]
    _mm_check(r, a.astype(np.float64) @ w)


def test_gemm_long_k_transposed_batched(ctx):
    k = 50000
    a = R.standard_normal((k, 5)).astype(np.float32)
    w = R.standard_normal((6, k)).astype(np.float32)
    c = R.standard_normal((5, 6)).astype(np.float32)
    x = R.standard_normal((3, 9, k)).astype(np.float32)
    y = R.standard_normal((3, k, 7)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    ai, xi, yi = (b.input(nm, data_type="float32", shape=v.shape) for nm, v in (("a", a), ("x", x), ("y", y)))
    g = b.gemm(ai, b.constant(w), c=b.constant(c), alpha=0.5, beta=2.0, a_transpose=True, b_transpose=True)
    r = run_graph(ctx, {"g": g, "mm": b.relu(b.matmul(xi, yi))}, {"a": a, "x": x, "y": y}, b)
    _mm_check(r["g"], 0.5 * a.T.astype(np.float64) @ w.T + 2.0 * c)
    _mm_check(r["mm"], np.maximum(x.astype(np.float64) @ y, 0))


def test_matmul_long_dynamic_k(ctx):
    """K known at dispatch: the split is chosen for the largest allowed K."""
    b = mltensor.MLGraphBuilder(ctx)
    ai = b.input("a", data_type="float32", shape=[8, D("k", 70000)])
    wi = b.input("w", data_type="float32", shape=[D("k", 70000), 8])
    g = b.build_sync({"y": b.matmul(ai, wi)})
    from helpers import dispatch_at

    for k in (5, 70000):
        a = R.standard_normal((8, k)).astype(np.float32)
        w = R.standard_normal((k, 8)).astype(np.float32)
        _mm_check(dispatch_at(ctx, g, {"a": a, "w": w})["y"], a.astype(np.float64) @ w)
    g.destroy()


@pytest.mark.parametrize("oc", [2, 8])
def test_conv2d_long_k(ctx, oc):
    """An implicit GEMM with K = 3 * 3 * 8000 = 72000 (oc 2: the direct kernel would loop over
    them; oc 8: the GEMM's tiles, 16 output pixels so not the GEMV)."""
    ic = 8000
    x = R.standard_normal((1, ic, 6, 6)).astype(np.float32)
    w = R.standard_normal((oc, ic, 3, 3)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=x.shape)
    r = run_graph(ctx, {"y": b.conv2d(xi, b.constant(w))}, {"x": x}, b)["y"]
    cols = np.lib.stride_tricks.sliding_window_view(x[0].astype(np.float64), (3, 3), axis=(1, 2))  # ic, 4, 4, 3, 3
    want = np.einsum("chwij,ocij->ohw", cols, w)[None]
    _mm_check(r, want)


@pytest.mark.slow
def test_gemv_very_long_k(ctx):
    """M <= 4 with K = 4.3M: the GEMV's 64 threads would loop 67188 times each, so the tiled path
    (split-K) computes it. (K = 70000 in test_matmul_long_k: the GEMV, under the cap.)"""
    k = 4_300_000
    a = R.standard_normal((1, k)).astype(np.float32)
    w = R.standard_normal((k, 2)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    ai = b.input("a", data_type="float32", shape=a.shape)
    g = b.build_sync({"y": b.matmul(ai, b.constant(w))})
    assert not any("gemv" in n for n in g.kernel_names), g.kernel_names
    from helpers import dispatch_at

    _mm_check(dispatch_at(ctx, g, {"a": a})["y"], a.astype(np.float64) @ w)
    g.destroy()


# -- attention ------------------------------------------------------------------------------------


def _attn_ref(q, k, v, scale, bias=None, causal=False):
    s = np.einsum("...qd,...kd->...qk", q.astype(np.float64), k.astype(np.float64)) * scale
    if bias is not None:
        s = s + bias
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None] + sk - sq, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("...qk,...kd->...qd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def _kv(sk, d, h=1, dt=np.float32):
    k = R.standard_normal((1, h, sk, d)).astype(dt)
    v = R.standard_normal((1, h, sk, d)).astype(dt)
    # the last keys matter: a walk over the keys cut short misses them
    k[..., -8:, :] *= 3
    v[..., -8:, :] += 5
    return k, v


@pytest.mark.parametrize("causal", [False, True])
def test_attention_tiles_long_keys(ctx, causal):
    """Prompt attention (the tiled kernel: a workgroup walks every key for its query rows) with
    16384 keys: lavapipe's tile loops ~158 times a tile of 32 keys, past the cap from ~13000."""
    sq, sk, d = 40, 16384, 64
    q = R.standard_normal((1, 1, sq, d)).astype(np.float32)
    k, v = _kv(sk, d)
    bias = R.standard_normal((sq, sk)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    qi = b.input("q", data_type="float32", shape=q.shape)
    y = b._attention(qi, b.constant(k), b.constant(v), scale=0.125, bias=b.constant(bias), causal=causal)
    r = run_graph(ctx, {"y": y}, {"q": q}, b)["y"]
    np.testing.assert_allclose(r, _attn_ref(q, k, v, 0.125, bias, causal), rtol=1e-4, atol=1e-4)


def test_attention_tiles_long_keys_float16_dynamic(ctx):
    """float16, and Sk known at dispatch: the key blocks are fixed, so every size computes what
    its static build computes, bit for bit."""
    from test_dynamic_reduce import check

    d = 32
    specs = {
        "q": ("float16", [1, 2, 16, d]),
        "k": ("float16", [1, 2, D("sk", 20000), d]),
        "v": ("float16", [1, 2, D("sk", 20000), d]),
    }
    check(
        ctx,
        specs,
        lambda b, q, k, v: b._attention(q, k, v, scale=0.17),
        [{"sk": 7}, {"sk": 20000}],
        lambda q, k, v: _attn_ref(q, k, v, 0.17),
        rtol=1e-2,
        atol=1e-2,
    )


def test_attention_decode_split_long_cache(ctx):
    """A decode step over 150000 cached keys: the split decode takes more blocks than its
    configuration's where a block would loop past the cap (by a safe over-estimate: the eight
    blocks of lavapipe's configuration measured right here too, llvmpipe unrolling the short
    constant loops the estimate counts)."""
    sk, d = 150_000, 8
    q = R.standard_normal((1, 2, 1, d)).astype(np.float32)
    k, v = _kv(sk, d, h=2)
    b = mltensor.MLGraphBuilder(ctx)
    qi = b.input("q", data_type="float32", shape=q.shape)
    y = b._attention(qi, b.constant(k), b.constant(v), scale=0.3)
    r = run_graph(ctx, {"y": y}, {"q": q}, b)["y"]
    np.testing.assert_allclose(r, _attn_ref(q, k, v, 0.3), rtol=1e-4, atol=1e-5)


# -- the rest -------------------------------------------------------------------------------------


def test_topk_long_row(ctx):
    """One row of 2.2M elements, k = 5: the one-workgroup plan's 32 threads would walk 68750
    elements each; chunks and merges instead. The largest value is near the end."""
    n = 2_200_000
    x = R.standard_normal((1, n)).astype(np.float32)
    x[0, -3] = 100.0
    x[0, -1000] = 50.0
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=x.shape)
    v, i = b._topk(xi, k=5, axis=1)
    r = run_graph(ctx, {"v": v, "i": i}, {"x": x}, b)
    order = np.argsort(-x[0], kind="stable")[:5]
    np.testing.assert_array_equal(r["i"][0], order)
    np.testing.assert_array_equal(r["v"][0], x[0, order])


def test_sampling_huge_vocabulary_refused(ctx, monkeypatch):
    """Top-k and top-p sampling walks the logits 66 times a thread: past the cap (a 300000-token
    vocabulary) the build is refused with the operator's name, not sampled from a prefix."""
    from mltensor.llm import sampling  # noqa: F401 - registers _sample_token

    monkeypatch.setenv("MLTENSOR_LOOP_CAP", "1")  # (on a GPU too)
    b = mltensor.MLGraphBuilder(ctx)
    logits = b.input("l", data_type="float32", shape=[1, 300_000])
    rnd = b.input("r", data_type="float32", shape=[1])
    with pytest.raises(NotSupportedError, match="_sample_token"):
        b.build_sync({"t": b._sample_token(logits, rnd, temperature=0.8, top_k=40, top_p=0.9)})
    b = mltensor.MLGraphBuilder(ctx)  # a Llama 3 vocabulary is fine
    logits = b.input("l", data_type="float32", shape=[1, 128_256])
    rnd = b.input("r", data_type="float32", shape=[1])
    b.build_sync({"t": b._sample_token(logits, rnd, temperature=0.8, top_k=40, top_p=0.9)}).destroy()


def test_int8_matmul_long_k(ctx):
    """The exact integer GEMM at K = 70000 (int8, zero points): wrapped i32 sums as onnxruntime."""
    k = 70000
    a = R.integers(-128, 128, (3, k)).astype(np.int8)
    w = R.integers(-128, 128, (k, 5)).astype(np.int8)
    b = mltensor.MLGraphBuilder(ctx)
    ai = b.input("a", data_type="int8", shape=a.shape)
    azp = b.constant(np.array(3, np.int8))
    y = b._int_matmul(ai, b.constant(w), a_zero_point=azp)
    r = run_graph(ctx, {"y": y}, {"a": a}, b)["y"]
    np.testing.assert_array_equal(r, (a.astype(np.int64) - 3) @ w.astype(np.int64))


def test_int8_conv_and_requantized_matmul_long_k(ctx):
    """QLinearMatMul-style requantization after the split (the reduce kernel stores), and the
    integer convolution's implicit GEMM with K = 3 * 3 * 4000."""
    k = 45000
    a = R.integers(0, 256, (2, k)).astype(np.uint8)
    w = R.integers(-128, 128, (k, 6)).astype(np.int8)
    b = mltensor.MLGraphBuilder(ctx)
    ai = b.input("a", data_type="uint8", shape=a.shape)
    scale = np.float32(2e-5)
    y = b._int_matmul(
        ai,
        b.constant(w),
        a_zero_point=b.constant(np.array(128, np.uint8)),
        scale=b.constant(np.array(scale, np.float32)),
        output_zero_point=b.constant(np.array(-3, np.int8)),
    )
    ic = 4000
    x = R.integers(-128, 128, (1, ic, 3, 3)).astype(np.int8)
    f = R.integers(-128, 128, (4, ic, 3, 3)).astype(np.int8)
    xi = b.input("x", data_type="int8", shape=x.shape)
    c = b._int_conv2d(xi, b.constant(f), padding=(1, 1, 1, 1))
    r = run_graph(ctx, {"y": y, "c": c}, {"a": a, "x": x}, b)
    acc = (a.astype(np.int64) - 128) @ w.astype(np.int64)
    want = np.clip(np.round(acc.astype(np.float32) * scale), -128 + 3, 127 + 3) - 3
    np.testing.assert_array_equal(r["y"], want.astype(np.int8))
    xp = np.pad(x[0].astype(np.int64), ((0, 0), (1, 1), (1, 1)))
    cols = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))  # ic, 3, 3, 3, 3
    np.testing.assert_array_equal(r["c"], np.einsum("chwij,ocij->ohw", cols, f.astype(np.int64))[None])


@pytest.mark.parametrize("m", [8, D("m", 40)])
def test_nbits_matmul_long_k(ctx, m):
    """8-bit packed weights, K = 40000 (lavapipe's 32x32 tile loops 56 times a 32-deep step: the
    old kernel summed the first 37441 of any longer K), with a bias; M static and dynamic (the
    tiled variant gated on M > 4)."""
    from helpers import dispatch_at

    k, n, bs = 40000, 12, 32  # (a multiple of the block)
    kb = k // bs
    q = R.integers(0, 256, (n, k)).astype(np.uint8)
    scales = R.uniform(0.01, 0.02, n * kb).astype(np.float32)
    bias = R.standard_normal(n).astype(np.float32)
    w = (q.astype(np.float64) - 128) * np.repeat(scales.reshape(n, kb), bs, axis=1)
    b = mltensor.MLGraphBuilder(ctx)
    ai = b.input("a", data_type="float32", shape=[m, k])
    y = b._matmul_nbits(
        ai,
        b.constant(q.view("<u4").ravel()),
        b.constant(scales),
        K=k,
        N=n,
        bits=8,
        block_size=bs,
        bias=b.constant(bias),
    )
    g = b.build_sync({"y": y})
    for rows in (8,) if isinstance(m, int) else (3, 40):
        a = R.standard_normal((rows, k)).astype(np.float32)
        _mm_check(dispatch_at(ctx, g, {"a": a})["y"], a.astype(np.float64) @ w.T + bias)
    g.destroy()
