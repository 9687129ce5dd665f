"""Gate fusion (compiler/fusion/gate.py fuse_gates): a global average pool and the fully connected 1x1
convolutions after it (squeeze-and-excitation: pool -> FC -> relu -> FC -> sigmoid) run as one
kernel, one workgroup per batch item, reading the pool's input through the elementwise step that
produces it (a decoder's skip + upsampled sum). Checked against float64 numpy in both layouts,
every filter layout, odd channel counts and planes, batches, float16; and the cases that must not
fuse (shared intermediates, big planes, fusion switched off)."""

import numpy as np
import pytest
from helpers import FUSION, run_graph

import mltensor
from mltensor.compiler.fusion import gate

FILTER_PERM = {"oihw": (0, 1, 2, 3), "ohwi": (0, 2, 3, 1), "hwio": (2, 3, 1, 0), "ihwo": (1, 2, 3, 0)}


def _fc_weights(rng, o, i, fl):
    W = (rng.standard_normal((o, i, 1, 1)) / np.sqrt(i)).astype(np.float32)
    return W, np.ascontiguousarray(W.transpose(FILTER_PERM[fl]))


def _se(
    rng,
    N,
    C,
    H,
    W_,
    hidden,
    layout="nhwc",
    fl="ohwi",
    bias=True,
    source=False,
    acts=("relu", "sigmoid"),
    dtype="float32",
    outputs_extra=False,
    mean=False,
):
    """(graph fn, feeds, numpy reference of the gate [N, C]) for pool -> FC -> act -> FC -> act."""
    shape = (N, H, W_, C) if layout == "nhwc" else (N, C, H, W_)
    X = rng.standard_normal(shape).astype(dtype)
    Y = rng.standard_normal(shape).astype(dtype)
    W1, W1l = _fc_weights(rng, hidden, C, fl)
    W2, W2l = _fc_weights(rng, C, hidden, fl)
    B1 = rng.standard_normal(hidden).astype(np.float32)
    B2 = rng.standard_normal(C).astype(np.float32)
    act = {
        "relu": lambda b, v: b.relu(v),
        "sigmoid": lambda b, v: b.sigmoid(v),
        "hard_sigmoid": lambda b, v: b.hard_sigmoid(v, alpha=1 / 6, beta=0.5),
        "none": lambda b, v: v,
    }
    ref_act = {
        "relu": lambda v: np.maximum(v, 0),
        "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
        "hard_sigmoid": lambda v: np.clip(v / 6 + 0.5, 0, 1),
        "none": lambda v: v,
    }

    def graph(b):
        x = b.input("x", data_type=dtype, shape=shape)
        src = x
        if source:
            src = b.add(b.input("y", data_type=dtype, shape=shape), x)
        if mean:  # TFLite's MEAN over the plane, keeping it
            s = b.reduce_mean(src, axes=[1, 2] if layout == "nhwc" else [2, 3], keep_dimensions=True)
        else:
            s = b.average_pool2d(src, layout=layout)
        kw = dict(input_layout=layout, filter_layout=fl)

        def c(a):
            return b.constant(a.astype(dtype))

        h = act[acts[0]](b, b.conv2d(s, c(W1l), bias=c(B1) if bias else None, **kw))
        g = act[acts[1]](b, b.conv2d(h, c(W2l), bias=c(B2) if bias else None, **kw))
        outs = {"g": g}
        if outputs_extra:
            outs["h"] = h
        return outs

    def ref():
        axes = (1, 2) if layout == "nhwc" else (2, 3)
        src = X.astype(np.float64) + (Y if source else 0)
        p = src.mean(axis=axes)
        h = ref_act[acts[0]](p @ W1[:, :, 0, 0].T + (B1 if bias else 0))
        return ref_act[acts[1]](h @ W2[:, :, 0, 0].T + (B2 if bias else 0))

    feeds = {"x": X, "y": Y} if source else {"x": X}
    return graph, feeds, ref


def _run(ctx, graph, feeds):
    """(results, kernel names less the float16 edge conversions a context without shader-f16 adds)."""
    b = mltensor.MLGraphBuilder(ctx)
    names = [n for n in b.build_sync(graph(b)).kernel_names if not n.startswith(("pack_", "unpack_"))]
    b = mltensor.MLGraphBuilder(ctx)
    return run_graph(ctx, graph(b), feeds, b), names


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize(
    "N,C,H,W,hidden",
    [
        (1, 16, 8, 8, 8),
        (2, 24, 7, 7, 6),
        (3, 100, 5, 3, 25),
        (1, 96, 16, 16, 24),
        (2, 3, 17, 19, 300),
        (1, 3, 128, 128, 8),
        (1, 480, 6, 48, 120),
        (1, 1024, 9, 9, 16),
    ],
)
def test_squeeze_excitation_gate_is_one_kernel(ctx, rng, layout, N, C, H, W, hidden):
    graph, feeds, ref = _se(rng, N, C, H, W, hidden, layout=layout, fl="ohwi" if layout == "nhwc" else "oihw")
    res, names = _run(ctx, graph, feeds)
    assert not FUSION or (len(names) == 1 and names[0].startswith("gate_") and "_pool_" in names[0]), names
    g = res["g"].reshape(N, C)
    np.testing.assert_allclose(g, ref(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_reduce_mean_heads_a_gate(ctx, rng, layout):
    graph, feeds, ref = _se(rng, 2, 20, 6, 5, 8, layout=layout, fl="ohwi", mean=True, source=True)
    res, names = _run(ctx, graph, feeds)
    assert not FUSION or (len(names) == 1 and names[0] == f"gate_{layout}_f32_pool_20x8_8x20_src"), names
    np.testing.assert_allclose(res["g"].reshape(2, 20), ref(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fl", ["oihw", "ohwi", "hwio", "ihwo"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("acts", [("relu", "sigmoid"), ("relu", "hard_sigmoid"), ("none", "none")])
def test_gate_filter_layouts_bias_activations(ctx, rng, fl, bias, acts):
    graph, feeds, ref = _se(rng, 2, 12, 5, 6, 4, fl=fl, bias=bias, acts=acts)
    res, names = _run(ctx, graph, feeds)
    assert not FUSION or (len(names) == 1), names
    np.testing.assert_allclose(res["g"].reshape(2, 12), ref(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_gate_reads_through_its_source(ctx, rng, layout):
    # a decoder: pool(skip + upsampled) -> FC -> FC, the sum never written
    graph, feeds, ref = _se(rng, 2, 16, 9, 8, 16, layout=layout, fl="ohwi", source=True)
    res, names = _run(ctx, graph, feeds)
    assert not FUSION or (len(names) == 1 and names[0].endswith("_src")), names
    np.testing.assert_allclose(res["g"].reshape(2, 16), ref(), rtol=1e-4, atol=1e-5)


def test_gate_float16(ctx, rng):
    graph, feeds, ref = _se(rng, 2, 24, 8, 8, 8, dtype="float16", source=True)
    res, names = _run(ctx, graph, feeds)
    assert not FUSION or (len(names) == 1), names
    np.testing.assert_allclose(res["g"].reshape(2, 24).astype(np.float64), ref(), rtol=1e-2, atol=5e-3)


def test_fully_connected_chain_without_pool(ctx, rng):
    # FC -> relu -> FC -> relu -> FC on one pixel (a classifier head): one kernel
    N, C = 3, 40
    X = rng.standard_normal((N, 1, 1, C)).astype(np.float32)
    Ws = [_fc_weights(rng, o, i, "ohwi") for o, i in ((64, C), (32, 64), (10, 32))]

    def graph(b):
        v = b.input("x", data_type="float32", shape=X.shape)
        for k, (_, Wl) in enumerate(Ws):
            v = b.conv2d(v, b.constant(Wl), input_layout="nhwc", filter_layout="ohwi")
            v = b.relu(v) if k < 2 else v
        return {"g": v}

    res, names = _run(ctx, graph, {"x": X})
    assert not FUSION or (len(names) == 1 and names[0].startswith("gate_") and "_fc_" in names[0]), names
    v = X.reshape(N, C).astype(np.float64)
    for k, (W, _) in enumerate(Ws):
        v = v @ W[:, :, 0, 0].T
        v = np.maximum(v, 0) if k < 2 else v
    np.testing.assert_allclose(res["g"].reshape(N, 10), v, rtol=1e-4, atol=1e-4)


def test_gate_not_fused_across_shared_values(ctx, rng):
    # the hidden layer is also a graph output: the chain stops before it is hidden; the source
    # is read twice: the sum is written
    graph, feeds, ref = _se(rng, 1, 8, 4, 4, 4, outputs_extra=True)
    res, names = _run(ctx, graph, feeds)
    assert not FUSION or (len(names) == 2 and not any(n.startswith("gate_") for n in names[1:])), names
    np.testing.assert_allclose(res["g"].reshape(1, 8), ref(), rtol=1e-4, atol=1e-5)

    X = rng.standard_normal((1, 6, 6, 8)).astype(np.float32)
    W1, W1l = _fc_weights(rng, 4, 8, "ohwi")
    W2, W2l = _fc_weights(rng, 8, 4, "ohwi")

    def graph2(b):
        x = b.input("x", data_type="float32", shape=X.shape)
        s = b.relu(x)
        kw = dict(input_layout="nhwc", filter_layout="ohwi")
        g = b.conv2d(b.conv2d(b.average_pool2d(s, layout="nhwc"), b.constant(W1l), **kw), b.constant(W2l), **kw)
        return {"g": g, "s": s}

    res, names = _run(ctx, graph2, {"x": X})
    assert not FUSION or (
        any(n.startswith("ew_") for n in names) and any(n.startswith("gate_") and not n.endswith("_src") for n in names)
    ), names
    want = np.maximum(X, 0).astype(np.float64).mean(axis=(1, 2)) @ W1[:, :, 0, 0].T @ W2[:, :, 0, 0].T
    np.testing.assert_allclose(res["g"].reshape(1, 8), want, rtol=1e-4, atol=1e-5)


def test_big_plane_keeps_its_pool_kernel(ctx, rng, monkeypatch):
    # a plane too big for one workgroup keeps the multi-workgroup pool; the FCs still merge
    monkeypatch.setattr(gate, "GATE_MAX_POOL", 8 * 8 * 16 - 1)
    graph, feeds, ref = _se(rng, 2, 16, 8, 8, 4)
    res, names = _run(ctx, graph, feeds)
    assert not FUSION or (len(names) == 2 and names[0].startswith("average_pool2d") and "_fc_" in names[1]), names
    np.testing.assert_allclose(res["g"].reshape(2, 16), ref(), rtol=1e-4, atol=1e-5)


def test_gate_switched_off(ctx, rng, monkeypatch):
    graph, feeds, ref = _se(rng, 2, 16, 4, 4, 8, source=True)
    monkeypatch.setenv("MLTENSOR_NO_FUSION", "1")
    res, names = _run(ctx, graph, feeds)
    assert not any(n.startswith("gate_") for n in names) and len(names) == 6, names
    np.testing.assert_allclose(res["g"].reshape(2, 16), ref(), rtol=1e-4, atol=1e-5)
