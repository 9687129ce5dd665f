"""Fewer and cheaper launches (issue 15): copy-free concat placement and graph replay.

Values are checked against numpy; kernel counts against MLTENSOR_NO_PLACEMENT=1-style builds
(compile_graph(placement=False)), which copy every concat input.
"""

import os

import numpy as np
import pytest

import mltensor
from mltensor.compiler.build import compile_graph
from mltensor.front.graph import MLGraph

NO_FUSION = os.environ.get("MLTENSOR_NO_FUSION", "") not in ("", "0")


def _conv(b, x, cin, cout, rng, k=1):
    w = rng.standard_normal((cout, cin, k, k)).astype(np.float32) * 0.3
    pad = [k // 2] * 4
    return b.relu(b.conv2d(x, b.constant(w), padding=pad)), w


def _np_conv1x1(x, w):
    return np.maximum(np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]), 0)


def _run(ctx, g, feeds):
    """Dispatch a built graph with numpy feeds; returns its outputs as numpy (then destroys it)."""
    ins = {}
    for name, arr in feeds.items():
        dt, shape = g.input_descriptors[name]
        ins[name] = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
        ctx.write_tensor(ins[name], arr)
    outs = {
        n: ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True)
        for n, (dt, shape) in g.output_descriptors.items()
    }
    ctx.dispatch(g, ins, outs)
    res = {n: ctx.read_tensor_sync(t) for n, t in outs.items()}
    g.destroy()
    return res


def _concat_kernels(g):
    return [k for k in g.kernel_names if k.startswith("concat")]


def test_channel_concat_launches_nothing(ctx):
    """squeezenet's fire module: two convs of one input, concatenated along channels (NCHW, batch
    1): each conv writes its slab of the concat output directly."""
    rng = np.random.default_rng(0)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 8, 8, 8])
    s, ws = _conv(b, x, 8, 4, rng)
    e1, w1 = _conv(b, s, 4, 16, rng)
    e2, w2 = _conv(b, s, 4, 16, rng)
    y = b.relu(b.concat([e1, e2], 1))  # read by a kernel after the concat, not a graph output
    g = b.build_sync({"y": y})
    if not NO_FUSION:
        assert _concat_kernels(g) == [], g.kernel_names
    xv = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)
    got = _run(ctx, g, {"x": xv})["y"]
    sv = _np_conv1x1(xv, ws)
    want = np.concatenate([_np_conv1x1(sv, w1), _np_conv1x1(sv, w2)], 1)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("between", [True, False])
def test_densenet_style_growing_concats(ctx, between):
    """Every concat extends the previous one (densenet): the earlier concat's storage is moved
    into the later one's. As in densenet a kernel (there BatchNormalization) reads the concat
    before the conv writing the next slab: one kernel may not read and write one buffer."""
    rng = np.random.default_rng(1)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 4, 4, 4])  # 64 floats = 256 bytes a slab
    feats, ws = [b.relu(x)], []
    cur = feats[0]
    for _ in range(3):
        src = b.mul(cur, b.constant(data_type="float32", value=0.5)) if between else cur
        f, w = _conv(b, src, cur.shape[1], 4, rng)
        ws.append(w)
        feats.append(f)
        cur = b.concat(feats, 1)
    y = b.sigmoid(cur)
    off = MLGraph(ctx, compile_graph(b, {"y": y}, placement=False))  # (before build_sync, which spends the builder)
    g = b.build_sync({"y": y})
    if not NO_FUSION and between:
        assert _concat_kernels(g) == [], g.kernel_names
    assert len(_concat_kernels(off)) == 2 + 3 + 4
    xv = rng.standard_normal((1, 4, 4, 4)).astype(np.float32)
    got = _run(ctx, g, {"x": xv})["y"]
    np.testing.assert_array_equal(_run(ctx, off, {"x": xv})["y"], got)
    fs = [np.maximum(xv, 0)]
    c = fs[0]
    for w in ws:
        fs.append(_np_conv1x1(c * np.float32(0.5 if between else 1), w))
        c = np.concatenate(fs, 1)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-c)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["misaligned", "repeated", "output", "batch2", "input"])
def test_concat_fallbacks_copy(ctx, case):
    """Where a slab cannot be placed (offset not a multiple of minStorageBufferOffsetAlignment,
    the same value twice, non-contiguous slabs, a graph input), concat copies. A concat that is a
    graph output is placed too: its producers write into the caller's tensor."""
    rng = np.random.default_rng(2)
    shape = {"misaligned": [1, 3, 5], "batch2": [2, 4, 16]}.get(case, [1, 4, 16])
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=shape)
    a, c = b.neg(x), b.abs(x)
    parts = {"repeated": [a, a, c], "input": [x, a]}.get(case, [a, c])
    cat = b.concat(parts, 1)
    y = cat if case == "output" else b.mul(cat, b.constant(data_type="float32", value=2.0))
    g = b.build_sync({"y": y})
    if not NO_FUSION and case in ("misaligned", "batch2"):
        assert len(_concat_kernels(g)) == 2, g.kernel_names
    if not NO_FUSION and case == "output":
        assert len(_concat_kernels(g)) == 0 and len(g.kernel_names) == 2, g.kernel_names
    xv = rng.standard_normal(shape).astype(np.float32)
    ref = {"x": xv}
    want = np.concatenate([{id(x): xv, id(a): -xv, id(c): np.abs(xv)}[id(p)] for p in parts], 1)
    if case != "output":
        want = want * 2
    got = _run(ctx, g, ref)["y"]
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_concat_output_written_into_callers_tensors(ctx, rng):
    """Producers of a concat that is a graph output write their slabs straight into the caller's
    output tensor (a view bound per tensor set): two output tensors, alternately, each gets the
    whole result, and a second output reads the concat back from the caller's tensor."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 8, 16])
    cat = b.concat([b.relu(x), b.neg(x), b.sigmoid(x)], 1)
    g = b.build_sync({"y": cat, "z": b.mul(cat, b.constant(data_type="float32", value=3.0))})
    if not NO_FUSION:
        assert not _concat_kernels(g) and len(g.kernel_names) == 4, g.kernel_names
    xt = ctx.create_tensor_sync(data_type="float32", shape=[1, 8, 16], writable=True)
    outs = [
        {k: ctx.create_tensor_sync(data_type="float32", shape=[1, 24, 16], readable=True) for k in "yz"}
        for _ in range(2)
    ]
    for rnd in range(4):
        xv = rng.standard_normal((1, 8, 16)).astype(np.float32)
        ctx.write_tensor(xt, xv)
        o = outs[rnd % 2]
        ctx.dispatch(g, {"x": xt}, o)
        want = np.concatenate([np.maximum(xv, 0), -xv, 1 / (1 + np.exp(-xv))], 1)
        np.testing.assert_allclose(ctx.read_tensor_sync(o["y"]), want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ctx.read_tensor_sync(o["z"]), want * 3, rtol=1e-6, atol=1e-6)


def test_replay_state_skipping_across_graphs(ctx):
    """Back-to-back dispatches skip re-setting the pass's pipeline and bind group: interleaving
    two graphs and changing tensors must still bind the right ones."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[64])
    one = b.constant(data_type="float32", value=1.0)
    g_add = b.build_sync({"y": b.add(x, one)})
    b2 = mltensor.MLGraphBuilder(ctx)
    x2 = b2.input("x", data_type="float32", shape=[64])
    g_mul = b2.build_sync({"y": b2.mul(x2, b2.constant(data_type="float32", value=3.0))})
    ts = [ctx.create_tensor_sync(data_type="float32", shape=[64], readable=True, writable=True) for _ in range(3)]
    ctx.write_tensor(ts[0], np.arange(64, dtype=np.float32))
    want = np.arange(64, dtype=np.float32)
    seq = [(g_add, 0, 1), (g_add, 1, 2), (g_mul, 2, 1), (g_mul, 2, 1), (g_add, 1, 0), (g_add, 1, 0), (g_mul, 0, 2)]
    vals = {0: want.copy()}
    for g, i, o in seq:
        ctx.dispatch(g, {"x": ts[i]}, {"y": ts[o]})
        vals[o] = vals[i] + 1 if g is g_add else vals[i] * 3
    for k, t in enumerate(ts):
        np.testing.assert_array_equal(ctx.read_tensor_sync(t), vals[k])


def test_replay_hot_path_sees_destroyed_tensor(ctx):
    """The same-tensors fast path must not skip validation of a tensor destroyed since."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4])
    g = b.build_sync({"y": b.relu(x)})
    a = ctx.create_tensor_sync(data_type="float32", shape=[4], writable=True)
    c = ctx.create_tensor_sync(data_type="float32", shape=[4], readable=True)
    ins, outs = {"x": a}, {"y": c}
    ctx.dispatch(g, ins, outs)
    ctx.dispatch(g, ins, outs)
    a.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        ctx.dispatch(g, ins, outs)
    ins["x"] = ctx.create_tensor_sync(data_type="float32", shape=[4], writable=True)
    ctx.write_tensor(ins["x"], np.array([-1, 2, -3, 4], np.float32))
    ctx.dispatch(g, ins, outs)  # the caller's dict changed in place: not the cached call
    np.testing.assert_array_equal(ctx.read_tensor_sync(c), [0, 2, 0, 4])
    g.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        ctx.dispatch(g, ins, outs)


@pytest.mark.parametrize("pool", ["max_pool2d", "average_pool2d", "global"])
def test_pool_epilogue_fused(ctx, pool):
    """Pooling applies the activation / residual add after it as it stores: one kernel."""
    rng = np.random.default_rng(3)
    shape = [1, 3, 16, 16] if pool == "global" else [2, 3, 6, 6]
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=shape)
    if pool == "global":
        p = b.average_pool2d(x)  # whole plane: the workgroup-reduction path
    else:
        p = getattr(b, pool)(x, window_dimensions=[2, 2], strides=[2, 2])
    res = rng.standard_normal(p.shape).astype(np.float32)
    y = b.sigmoid(b.add(b.relu(p), b.constant(res)))
    g = b.build_sync({"y": y})
    assert len(g.kernel_names) == (4 if NO_FUSION else 1), g.kernel_names
    xv = rng.standard_normal(shape).astype(np.float32)
    got = _run(ctx, g, {"x": xv})["y"]
    if pool == "global":
        pv = xv.mean(axis=(2, 3), keepdims=True)
    else:
        blocks = xv.reshape(2, 3, 3, 2, 3, 2)
        pv = blocks.max(axis=(3, 5)) if pool == "max_pool2d" else blocks.mean(axis=(3, 5))
    want = 1 / (1 + np.exp(-(np.maximum(pv, 0) + res)))
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm", ["batch", "instance", "layer"])
def test_normalization_epilogue_fused(ctx, norm):
    """A normalization applies the activations / residual add after it as it stores (densenet's
    BatchNormalization -> Relu is one kernel)."""
    rng = np.random.default_rng(4)
    shape = [2, 4, 5, 6]
    xv = rng.standard_normal(shape).astype(np.float32)
    sc = rng.uniform(0.5, 2, 4).astype(np.float32)
    bi = rng.standard_normal(4).astype(np.float32)
    res = rng.standard_normal(shape).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=shape)
    if norm == "batch":
        mean = rng.standard_normal(4).astype(np.float32)
        var = rng.uniform(0.5, 2, 4).astype(np.float32)
        n = b.batch_normalization(x, b.constant(mean), b.constant(var), scale=b.constant(sc), bias=b.constant(bi))
        c = lambda v: v.reshape(1, 4, 1, 1)  # noqa: E731
        nv = (xv - c(mean)) / np.sqrt(c(var) + 1e-5) * c(sc) + c(bi)
    elif norm == "instance":
        n = b.instance_normalization(x, scale=b.constant(sc), bias=b.constant(bi))
        m, v = xv.mean(axis=(2, 3), keepdims=True), xv.var(axis=(2, 3), keepdims=True)
        nv = (xv - m) / np.sqrt(v + 1e-5) * sc.reshape(1, 4, 1, 1) + bi.reshape(1, 4, 1, 1)
    else:
        n = b.layer_normalization(x)
        m, v = xv.mean(axis=(1, 2, 3), keepdims=True), xv.var(axis=(1, 2, 3), keepdims=True)
        nv = (xv - m) / np.sqrt(v + 1e-5)
    y = b.add(b.relu(n), b.constant(res))
    g = b.build_sync({"y": y})
    assert len(g.kernel_names) == (3 if NO_FUSION else 1), g.kernel_names
    got = _run(ctx, g, {"x": xv})["y"]
    want = np.maximum(nv, 0) + res
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["lstm", "gru"])
def test_rnn_two_launches_per_step(ctx, op):
    """Each step after the first is a recurrent gemm + one gate kernel (values: test_ops_rnn.py,
    against numpy, in both modes)."""
    steps, batch, isz, hs = 4, 2, 3, 8
    g_ = 4 if op == "lstm" else 3
    rng = np.random.default_rng(5)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[steps, batch, isz])
    w = b.constant(rng.standard_normal((1, g_ * hs, isz)).astype(np.float32))
    r = b.constant(rng.standard_normal((1, g_ * hs, hs)).astype(np.float32))
    outs = getattr(b, op)(x, w, r, steps, hs)
    g = b.build_sync({"h": outs[0]})
    gates = [k for k in g.kernel_names if "_gates_" in k]
    if NO_FUSION:
        assert gates == []
    else:
        # the input projection gemm, then per step a gemm (folded away for the zero first state)
        # and the gate kernel, then a copy of the last state (reshaped to [1, batch, h]) into the
        # output tensor
        assert len(gates) == steps and len(g.kernel_names) == 1 + steps + (steps - 1) + 1, g.kernel_names
    g.destroy()


def test_concat_sharing_a_prefix_with_another(ctx):
    """c1 = [x0, x1] and c2 = [x0, y], both read afterwards: moving c1 into c2 would let y's
    slab overwrite x1, so it must not happen (values checked against numpy)."""
    rng = np.random.default_rng(6)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 2, 8, 8])
    x0, x1, yv = b.neg(x), b.abs(x), b.exp(x)
    c1 = b.concat([x0, x1], 1)
    c2 = b.concat([x0, yv], 1)
    g = b.build_sync({"a": b.relu(c1), "b": b.relu(c2)})
    xv = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    got = _run(ctx, g, {"x": xv})
    np.testing.assert_array_equal(got["a"], np.maximum(np.concatenate([-xv, np.abs(xv)], 1), 0))
    np.testing.assert_allclose(got["b"], np.maximum(np.concatenate([-xv, np.exp(xv)], 1), 0), rtol=1e-6)


def test_split_and_slice_views(ctx):
    """A channel split at batch 1 (each part one aligned contiguous range) and a slice of rows are
    read in place: no kernel."""
    rng = np.random.default_rng(7)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 4, 8, 8])
    h = b.neg(x)
    p0, p1 = b.split(h, 2, axis=1)
    s = b.slice(h, [0, 3, 0, 0], [1, 1, 8, 8])
    g = b.build_sync({"a": b.relu(p0), "b": b.exp(p1), "c": b.abs(s)})
    if not NO_FUSION:
        assert not [k for k in g.kernel_names if k.startswith(("split", "slice"))], g.kernel_names
    xv = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    got = _run(ctx, g, {"x": xv})
    np.testing.assert_array_equal(got["a"], np.maximum(-xv[:, :2], 0))
    np.testing.assert_allclose(got["b"], np.exp(-xv[:, 2:]), rtol=1e-6)
    np.testing.assert_array_equal(got["c"], np.abs(xv[:, 3:4]))


def test_replay_hot_path_rejects_non_tensors(ctx):
    """After a valid dispatch, a dict holding a numpy array under the same name gets the usual
    TypeError (not numpy's ambiguous-truth error from the same-tensors check)."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[8])
    g = b.build_sync({"y": b.relu(x)})
    a = ctx.create_tensor_sync(data_type="float32", shape=[8], writable=True)
    c = ctx.create_tensor_sync(data_type="float32", shape=[8], readable=True)
    ctx.dispatch(g, {"x": a}, {"y": c})
    with pytest.raises(TypeError, match="MLTensor"):
        ctx.dispatch(g, {"x": np.zeros(8, np.float32)}, {"y": c})
    g.destroy()
