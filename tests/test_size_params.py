"""Static sizes as launch parameters (dynamic/kernels.py SizeParams, issue 29): kernels that differ
only in sizes share one pipeline, each launch passing its own sizes as immediate data, where
that costs nothing (elementwise chains without broadcasting; broadcasting ones and NCHW
resampling as grid launches, which divide by nothing; whole-plane pools on their global path;
squeeze-and-excitation gates); flat kernels that divide every index by sizes keep constants.
Checked: the number of distinct pipelines a graph launches (MLGraph.pipelines) drops against a
build with every size a WGSL constant (MLTENSOR_NO_SIZE_PARAMS=1), the results are bit-identical
to that build and match numpy, in float32, float16 and emulated int64, through the graph cache,
from two threads, and (slow) past 65535 workgroups."""

import numpy as np
import pytest

import mltensor
from mltensor import ml

from helpers import FUSION, context_with_env, dispatch_at, in_threads


@pytest.fixture
def no_params(monkeypatch):
    """A context manager: builds inside it keep every size a WGSL constant."""
    import contextlib

    @contextlib.contextmanager
    def off():
        with monkeypatch.context() as m:
            m.setenv("MLTENSOR_NO_SIZE_PARAMS", "1")
            yield

    return off


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _max_pool(x, k, s, p):
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * p, w + 2 * p), -np.inf)
    xp[:, :, p : p + h, p : p + w] = x
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = xp[:, :, i * s : i * s + k, j * s : j * s + k].max(axis=(2, 3))
    return out


def _linear2x(x):
    """Bilinear x2 upsampling of the last two axes, half-pixel centres, edges clamped."""

    def axis(a, n, ax):
        o = np.arange(2 * n)
        c = np.clip((o + 0.5) / 2 - 0.5, 0, n - 1)
        i0 = np.floor(c).astype(int)
        i1 = np.minimum(i0 + 1, n - 1)
        t = c - i0
        shape = [1] * a.ndim
        shape[ax] = -1
        return np.take(a, i0, axis=ax) * (1 - t).reshape(shape) + np.take(a, i1, axis=ax) * t.reshape(shape)

    x = x.astype(np.float64)
    return axis(axis(x, x.shape[2], 2), x.shape[3], 3)


# Same-family layers at several sizes, odd ones (tails of a workgroup, of a vec4) included.
EW = [(1, 3, 5, 7), (2, 3, 9, 11), (1, 3, 4, 13)]  # add a bias along the last axis, sigmoid: 1 pipeline (grid)
CH = [(1, 4, 17, 19), (2, 3, 16, 16)]  # a per-channel scale, planes of >= 256: 1 pipeline (grid)
VEC = [(4, 8), (2, 3, 16), (1000,)]  # vec4 multiply by a scalar: 1 pipeline
# (A size of 1 is structural, a batch of 1 or 2 two different kernels: a model's layers share theirs.)
POOL = [(1, 2, 15, 17), (1, 3, 32, 32)]  # max 3x3 s2 p1: flat, divides by sizes: constants, 2 pipelines
GAP = [(1, 4, 7, 9), (1, 3, 11, 5)]  # whole-plane average, small planes (the window path): 2 pipelines
GAP_BIG = [(1, 3, 16, 16), (1, 2, 13, 17)]  # whole-plane average, >= 128 elements (global path): 1 pipeline
NEAR = [(1, 2, 5, 7), (1, 3, 6, 3)]  # nearest x2: 1 pipeline (grid)
LIN = [(1, 2, 5, 7), (1, 3, 3, 8)]  # linear x2: 1 pipeline (grid)
SHARED = 10


def _model(ctx, rng):
    """(graph, feeds, numpy references) of the layers above."""
    b = mltensor.MLGraphBuilder(ctx)
    outs, feeds, refs = {}, {}, {}

    def inp(name, shape):
        a = rng.standard_normal(shape).astype(np.float32)
        feeds[name] = a
        return b.input(name, data_type="float32", shape=list(shape)), a

    for k, s in enumerate(EW):
        x, a = inp(f"ew{k}", s)
        c = rng.standard_normal(s[-1:]).astype(np.float32)
        outs[f"ew{k}"] = b.sigmoid(b.add(x, b.constant(c)))
        refs[f"ew{k}"] = _sigmoid(a + c)
    for k, s in enumerate(CH):
        x, a = inp(f"ch{k}", s)
        c = rng.standard_normal((s[1], 1, 1)).astype(np.float32)
        outs[f"ch{k}"] = b.add(b.mul(x, b.constant(c)), x)
        refs[f"ch{k}"] = a * c + a
    for k, s in enumerate(VEC):
        x, a = inp(f"vec{k}", s)
        outs[f"vec{k}"] = b.mul(x, b.constant(data_type="float32", value=1.5))
        refs[f"vec{k}"] = a * 1.5
    for k, s in enumerate(POOL):
        x, a = inp(f"pool{k}", s)
        outs[f"pool{k}"] = b.max_pool2d(x, window_dimensions=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
        refs[f"pool{k}"] = _max_pool(a, 3, 2, 1)
    for k, s in enumerate(GAP + GAP_BIG):
        x, a = inp(f"gap{k}", s)
        outs[f"gap{k}"] = b.average_pool2d(x)
        refs[f"gap{k}"] = a.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    for k, s in enumerate(NEAR):
        x, a = inp(f"near{k}", s)
        outs[f"near{k}"] = b.resample2d(x, scales=[2.0, 2.0])
        refs[f"near{k}"] = a.repeat(2, axis=2).repeat(2, axis=3)
    for k, s in enumerate(LIN):
        x, a = inp(f"lin{k}", s)
        outs[f"lin{k}"] = b.resample2d(x, scales=[2.0, 2.0], mode="linear")
        refs[f"lin{k}"] = _linear2x(a)
    return b.build_sync(outs), feeds, refs


def test_layers_of_one_family_at_several_sizes_share_a_pipeline(ctx, no_params):
    if ctx.device.limits.get("max-immediate-size", 0) < 16 or "immediates" not in ctx.device.features:
        pytest.skip("the adapter passes no immediate data: sizes stay constants")
    g, feeds, refs = _model(ctx, np.random.default_rng(0))
    with no_params():
        g0, _, _ = _model(ctx, np.random.default_rng(0))
    launches = len(g.kernel_names)
    assert g0.kernel_names == g.kernel_names  # names still spell each launch's sizes
    assert g0.pipelines == launches, g0.kernel_names
    if FUSION:  # (counts of fused kernels; without fusion only that they drop)
        assert launches == 18 and g.pipelines == SHARED, g.kernel_names
    assert g.pipelines < launches, g.kernel_names
    got, want = dispatch_at(ctx, g, feeds), dispatch_at(ctx, g0, feeds)
    for name, ref in refs.items():
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)  # the constants' arithmetic
        np.testing.assert_allclose(got[name], ref, rtol=2e-6, atol=1e-6, err_msg=name)


def test_squeeze_and_excitation_gates_at_two_planes_share_a_pipeline(ctx, rng):
    """The gate kernel (a global average pool and the fully connected layers after it) reads its
    plane's size as a launch parameter: one pipeline for a block's width at every resolution."""
    C, hidden = 8, 4
    w1 = (rng.standard_normal((hidden, C, 1, 1)) / 3).astype(np.float32)
    w2 = (rng.standard_normal((C, hidden, 1, 1)) / 2).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    outs, feeds, refs = {}, {}, {}
    for k, (h, w) in enumerate([(8, 8), (10, 12), (6, 7)]):  # (planes of >= 32: one lane layout)
        x = b.input(f"x{k}", data_type="float32", shape=[1, C, h, w])
        s = b.average_pool2d(x)
        g = b.sigmoid(b.conv2d(b.relu(b.conv2d(s, b.constant(w1))), b.constant(w2)))
        outs[f"g{k}"] = g
        a = rng.standard_normal((1, C, h, w)).astype(np.float32)
        p = a.astype(np.float64).mean(axis=(2, 3))
        feeds[f"x{k}"] = a
        refs[f"g{k}"] = _sigmoid(np.maximum(p @ w1[:, :, 0, 0].T, 0) @ w2[:, :, 0, 0].T).reshape(1, C, 1, 1)
    g = b.build_sync(outs)
    if FUSION:
        assert len(g.kernel_names) == 3 and all(n.startswith("gate_") for n in g.kernel_names), g.kernel_names
        assert g.pipelines == 1, g.kernel_names
    got = dispatch_at(ctx, g, feeds)
    for k, ref in refs.items():
        np.testing.assert_allclose(got[k], ref, rtol=1e-5, atol=1e-6, err_msg=k)


def test_one_pipeline_back_to_back_at_three_sizes(ctx, rng):
    """Consecutive launches of one shared pipeline: each sets its own sizes although the pass
    keeps the pipeline (in the compiled replay loop), and so does the first launch of the next
    dispatch, which finds the pipeline set with the last launch's sizes."""
    b = mltensor.MLGraphBuilder(ctx)
    outs, feeds, refs = {}, {}, {}
    for k, s in enumerate([(3, 7), (5, 9), (2, 5)]):
        x = b.input(f"x{k}", data_type="float32", shape=list(s))
        c = rng.standard_normal(s[-1:]).astype(np.float32)
        outs[f"y{k}"] = b.sigmoid(b.add(x, b.constant(c)))
        feeds[f"x{k}"] = rng.standard_normal(s).astype(np.float32)
        refs[f"y{k}"] = _sigmoid(feeds[f"x{k}"] + c)
    g = b.build_sync(outs)
    assert g.pipelines == (1 if FUSION else 2) and len(set(g.kernel_names)) == len(g.kernel_names), g.kernel_names
    for _ in range(3):
        got = dispatch_at(ctx, g, feeds)
        for k, ref in refs.items():
            np.testing.assert_allclose(got[k], ref, rtol=1e-6, err_msg=k)


def test_two_graphs_sharing_a_pipeline_dispatched_in_turn(ctx, rng):
    """Graphs with one shared pipeline at different sizes, dispatched in turn into one pass: each
    dispatch finds the pipeline set with the other graph's sizes and sets its own, and one
    repeated finds its own still set."""
    graphs, feeds, refs = [], [], []
    for s in [(3, 7), (5, 9)]:
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=list(s))
        graphs.append(b.build_sync({"y": b.sigmoid(b.mul(x, b.constant(data_type="float32", value=0.5)))}))
        a = rng.standard_normal(s).astype(np.float32)
        feeds.append(a)
        refs.append(_sigmoid(a * 0.5))
    assert graphs[0]._kernels[0].key == graphs[1]._kernels[0].key  # one pipeline
    ins = [ctx.create_tensor_sync(data_type="float32", shape=list(a.shape), writable=True) for a in feeds]
    for t, a in zip(ins, feeds):
        ctx.write_tensor(t, a)
    order = [0, 1, 1, 0, 1, 0, 0]
    outs = [ctx.create_tensor_sync(data_type="float32", shape=list(feeds[k].shape), readable=True) for k in order]
    for k, o in zip(order, outs):  # (no read in between: one pass)
        ctx.dispatch(graphs[k], {"x": ins[k]}, {"y": o})
    for k, o in zip(order, outs):
        np.testing.assert_allclose(ctx.read_tensor_sync(o), refs[k], rtol=1e-6)


def test_float16_and_emulated_int64_share_pipelines_across_sizes(rng):
    for env, dt, np_dt in ((dict(), "float16", np.float16), (dict(MLTENSOR_DISABLE_INT64="1"), "int64", np.int64)):
        c = context_with_env(**env)
        try:
            b = mltensor.MLGraphBuilder(c)
            outs, feeds, refs = {}, {}, {}
            for k, s in enumerate([(3, 5, 7), (2, 9, 11), (5, 3)]):
                a = (rng.standard_normal(s) * 50).astype(np_dt)
                v = (rng.standard_normal(s[-1:]) * 50).astype(np_dt)
                x = b.input(f"x{k}", data_type=dt, shape=list(s))
                three = b.constant(data_type=dt, shape=[1], data=np.array([3], np_dt))
                outs[f"y{k}"] = b.mul(b.add(x, b.constant(v)), three)
                feeds[f"x{k}"], refs[f"y{k}"] = a, (a + v) * np_dt(3)
            g = b.build_sync(outs)
            assert g.pipelines == (1 if FUSION else 2), (dt, g.kernel_names)
            got = dispatch_at(c, g, feeds)
            for k, ref in refs.items():
                np.testing.assert_array_equal(got[k], ref, err_msg=f"{dt} {k}")
        finally:
            c.destroy()


def test_shared_pipelines_through_the_graph_cache(ctx, rng, tmp_path, monkeypatch):
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    g, feeds, refs = _model(ctx, rng)
    want = dispatch_at(ctx, g, feeds)
    ctx.save_graph_sync("sizes", g)
    other = ml.create_context_sync()  # compiles from the stored WGSL, sizes from the recipe
    try:
        h = other.load_graph_sync("sizes")
        assert h.pipelines == g.pipelines and h.kernel_names == g.kernel_names
        got = dispatch_at(other, h, feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    finally:
        other.destroy()


def test_builds_and_dispatches_from_two_threads(ctx):
    results = {}

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(3):
            g, feeds, refs = _model(ctx, rng)
            got = dispatch_at(ctx, g, feeds)
            for k, ref in refs.items():
                np.testing.assert_allclose(got[k], ref, rtol=2e-6, atol=1e-6, err_msg=k)
            g.destroy()
        results[seed] = True

    in_threads(work, [(s,) for s in (1, 2)])
    assert len(results) == 2


@pytest.mark.slow
def test_past_65535_workgroups(ctx):
    """Two sizes past 65535 workgroups of 256 (folded into 2-D) through one pipeline, odd sizes
    (not vec4: the scalar kernel, whose bound check reads the size)."""
    b = mltensor.MLGraphBuilder(ctx)
    sizes = [65535 * 256 + 5, 65536 * 256 + 3]
    outs, feeds = {}, {}
    for k, n in enumerate(sizes):
        x = b.input(f"x{k}", data_type="float32", shape=[n])
        outs[f"y{k}"] = b.add(x, b.constant(data_type="float32", value=float(k + 1)))
        feeds[f"x{k}"] = np.arange(n, dtype=np.float32) % 1000
    g = b.build_sync(outs)
    assert g.pipelines == 1, g.kernel_names
    got = dispatch_at(ctx, g, feeds)
    for k, n in enumerate(sizes):
        np.testing.assert_array_equal(got[f"y{k}"], feeds[f"x{k}"] + (k + 1))


def _affine_convs(ctx, shape, pairs, rng):
    """A chain of 1x1 convolutions, each followed by a learnable affine (scale, bias scalars: the
    fused epilogue's constants), PP-OCRv4's blocks; (graph, float64 reference function)."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(shape))
    c = shape[1]
    ws = [rng.standard_normal((c, c, 1, 1)).astype(np.float32) / 3 for _ in pairs]
    y = x
    for w, (s, t) in zip(ws, pairs):
        z = b.conv2d(y, b.constant(w))
        y = b.relu(b.add(b.mul(z, b.constant(data_type="float32", value=s)), b.constant(data_type="float32", value=t)))

    def ref(a):
        r = a.astype(np.float64)
        for w, (s, t) in zip(ws, pairs):
            r = np.einsum("oi,nihw->nohw", w[:, :, 0, 0].astype(np.float64), r)
            r = np.maximum(r * np.float32(s) + np.float32(t), 0)
        return r

    return b.build_sync({"y": y}), ref


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_epilogue_constants_share_a_pipeline(ctx, rng, no_params, dynamic):
    """Layers that differ only in their fused epilogue's float constants read them from the
    immediate data: one pipeline for the chain, each launch its own constants, in static and
    dynamic builds; bit-identical to the build with literals (MLTENSOR_NO_SIZE_PARAMS=1)."""
    from mltensor.dynamic.dims import MLDynamicDimension as D

    pairs = [(1.25, -0.5), (0.75, 0.125), (1.5, 0.25), (0.5, -0.25)]
    shape = (1, 16, D("H", 24), D("W", 24)) if dynamic else (1, 16, 12, 10)
    g, ref = _affine_convs(ctx, shape, pairs, np.random.default_rng(3))
    with no_params():
        g0, _ = _affine_convs(ctx, shape, pairs, np.random.default_rng(3))
    # (one fused kernel per layer; with dynamic dimensions, a variant per size bucket)
    assert len(g.kernel_names) == len(g0.kernel_names) == len(pairs) * (3 if dynamic else 1)
    assert all(k.consts for k in g._kernels) and not any(k.consts for k in g0._kernels)
    for a_shape in [(1, 16, 12, 10)] if not dynamic else [(1, 16, 24, 24), (1, 16, 5, 17)]:
        a = rng.standard_normal(a_shape).astype(np.float32)
        got, want = dispatch_at(ctx, g, {"x": a})["y"], dispatch_at(ctx, g0, {"x": a})["y"]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, ref(a), rtol=1e-4, atol=1e-4)
    assert g0.pipelines_created == len(pairs) * g.pipelines_created and g.pipelines_created <= 3
    g.destroy()
    g0.destroy()


def test_epilogue_constants_of_a_static_layer_in_a_dynamic_graph(ctx, rng):
    """A layer of fixed size with epilogue constants in a graph with dynamic dimensions (a
    decoder's MLP beside its attention over the past): its constants sit in the dispatch's
    blocks of immediate data like the dynamic kernels' sizes (the decode loops read garbage
    when they did not)."""
    from mltensor.dynamic.dims import MLDynamicDimension as D

    w = rng.standard_normal((16, 32)).astype(np.float32) / 4
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 16])
    p = b.input("p", data_type="float32", shape=[D("past", 40), 32])
    y = b.mul(
        b.add(b.matmul(x, b.constant(w)), b.constant(data_type="float32", value=3.0)),
        b.constant(data_type="float32", value=0.5),
    )
    g = b.build_sync({"y": y, "s": b.reduce_sum(b.add(p, y), axes=[0])})
    assert any(k.consts for k in g._kernels)
    xv = rng.standard_normal((1, 16)).astype(np.float32)
    for n in (1, 7, 40):
        pv = rng.standard_normal((n, 32)).astype(np.float32)
        got = dispatch_at(ctx, g, {"x": xv, "p": pv})
        yv = (xv.astype(np.float64) @ w + 3.0) * 0.5
        np.testing.assert_allclose(got["y"], yv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["s"], (pv + yv).sum(axis=0), rtol=1e-4, atol=1e-4)
    g.destroy()
