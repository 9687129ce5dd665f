"""batch_normalization, instance_normalization, layer_normalization against float64 numpy."""

import numpy as np
import pytest
from helpers import run_graph

import mltensor

TOL = {"float32": dict(rtol=1e-4, atol=1e-5), "float16": dict(rtol=5e-3, atol=5e-3)}


def check(r, e, dt):
    assert r.shape == e.shape
    assert r.dtype == np.dtype(dt)
    np.testing.assert_allclose(r.astype(np.float64), e, **TOL[dt])


def f64(*arrays):
    return [None if a is None else a.astype(np.float64) for a in arrays]


# -- batch_normalization ----------------------------------------------------------------------


def batch_ref(x, mean, var, scale, bias, axis, eps):
    x, mean, var, scale, bias = f64(x, mean, var, scale, bias)
    sh = [1] * x.ndim
    sh[axis] = x.shape[axis]
    y = (x - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + eps)
    if scale is not None:
        y = y * scale.reshape(sh)
    if bias is not None:
        y = y + bias.reshape(sh)
    return y


BATCH_CASES = [
    ((2, 3, 4, 5), 1, True, True),
    ((2, 3, 4, 5), 3, True, False),
    ((2, 3, 4, 5), 0, False, True),
    ((5, 7), 1, False, False),
    ((6,), 0, True, True),
    ((1, 4, 3, 2, 3), 4, True, True),
]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("shape,axis,has_scale,has_bias", BATCH_CASES)
def test_batch_normalization(ctx, rng, dt, shape, axis, has_scale, has_bias):
    c = shape[axis]
    x = rng.standard_normal(shape).astype(dt)
    mean = rng.standard_normal(c).astype(dt)
    var = rng.uniform(0.1, 2.0, c).astype(dt)
    scale = rng.standard_normal(c).astype(dt) if has_scale else None
    bias = rng.standard_normal(c).astype(dt) if has_bias else None
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type=dt, shape=shape)
    opt = {k: b.constant(v) for k, v in (("scale", scale), ("bias", bias)) if v is not None}
    y = b.batch_normalization(xi, b.constant(mean), b.constant(var), axis=axis, epsilon=1e-3, **opt)
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    check(r, batch_ref(x, mean, var, scale, bias, axis, 1e-3), dt)


def test_batch_normalization_runtime_statistics(ctx, rng):
    # mean and variance as graph inputs (not constants), default axis and epsilon
    x = rng.standard_normal((2, 3, 2)).astype(np.float32)
    mean = rng.standard_normal(3).astype(np.float32)
    var = rng.uniform(0.5, 1.5, 3).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=a.shape) for n, a in (("x", x), ("m", mean), ("v", var))}
    y = b.batch_normalization(ins["x"], ins["m"], ins["v"])
    r = run_graph(ctx, {"y": y}, {"x": x, "m": mean, "v": var}, b)["y"]
    check(r, batch_ref(x, mean, var, None, None, 1, 1e-5), "float32")


def test_batch_normalization_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3, 4])
    m3 = b.input("m3", data_type="float32", shape=[3])
    m4 = b.input("m4", data_type="float32", shape=[4])
    m33 = b.input("m33", data_type="float32", shape=[3, 3])
    h3 = b.input("h3", data_type="float16", shape=[3])
    bn = b.batch_normalization
    with pytest.raises(TypeError, match=r"\[batch_normalization\] mean shape must be \[3\], got \[4\]"):
        bn(x, m4, m3)
    with pytest.raises(TypeError, match="variance shape"):
        bn(x, m3, m33)
    with pytest.raises(TypeError, match="scale shape"):
        bn(x, m3, m3, scale=m4)
    with pytest.raises(TypeError, match="bias shape"):
        bn(x, m3, m3, bias=m4)
    with pytest.raises(TypeError, match="mean shape must be \\[4\\]"):
        bn(x, m3, m3, axis=2)
    with pytest.raises(TypeError, match="axis must be in"):
        bn(x, m3, m3, axis=3)
    with pytest.raises(TypeError, match="axis must be an integer"):
        bn(x, m3, m3, axis=1.0)
    with pytest.raises(TypeError, match="data type float16 differs"):
        bn(x, h3, m3)
    with pytest.raises(TypeError, match="epsilon"):
        bn(x, m3, m3, epsilon="small")
    with pytest.raises(TypeError, match="MLOperand"):
        bn(x, np.zeros(3, np.float32), m3)
    xi = b.input("xi", data_type="int32", shape=[2, 3])
    with pytest.raises(TypeError, match="input data type int32"):
        bn(xi, m3, m3)
    other = mltensor.MLGraphBuilder(ctx).input("m", data_type="float32", shape=[3])
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        bn(x, other, m3)


# -- instance_normalization -------------------------------------------------------------------


def instance_ref(x, scale, bias, eps, layout):
    x, scale, bias = f64(x, scale, bias)
    ax, sh = ((2, 3), (1, -1, 1, 1)) if layout == "nchw" else ((1, 2), (1, 1, 1, -1))
    y = (x - x.mean(ax, keepdims=True)) / np.sqrt(x.var(ax, keepdims=True) + eps)
    if scale is not None:
        y = y * scale.reshape(sh)
    if bias is not None:
        y = y + bias.reshape(sh)
    return y


INSTANCE_CASES = [
    ((2, 3, 4, 5), "nchw", True, True),
    ((2, 4, 5, 3), "nhwc", True, True),
    ((1, 2, 9, 11), "nchw", False, True),  # one workgroup per (n, c)
    ((1, 9, 11, 2), "nhwc", True, False),  # strided spatial elements
    ((3, 1, 1, 1), "nchw", False, False),  # single element: output is bias (0 here)
]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("shape,layout,has_scale,has_bias", INSTANCE_CASES)
def test_instance_normalization(ctx, rng, dt, shape, layout, has_scale, has_bias):
    c = shape[1] if layout == "nchw" else shape[3]
    x = (rng.standard_normal(shape) * 2 + 1).astype(dt)
    scale = rng.standard_normal(c).astype(dt) if has_scale else None
    bias = rng.standard_normal(c).astype(dt) if has_bias else None
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type=dt, shape=shape)
    opt = {k: b.constant(v) for k, v in (("scale", scale), ("bias", bias)) if v is not None}
    y = b.instance_normalization(xi, layout=layout, **opt)
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    check(r, instance_ref(x, scale, bias, 1e-5, layout), dt)


def test_instance_normalization_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3, 4, 5])
    c3 = b.input("c3", data_type="float32", shape=[3])
    c5 = b.input("c5", data_type="float32", shape=[5])
    inorm = b.instance_normalization
    assert inorm(x, scale=c5, layout="nhwc").shape == (2, 3, 4, 5)
    with pytest.raises(TypeError, match=r"\[instance_normalization\] scale shape must be \[3\], got \[5\]"):
        inorm(x, scale=c5)
    with pytest.raises(TypeError, match="bias shape must be \\[5\\]"):
        inorm(x, bias=c3, layout="nhwc")
    with pytest.raises(TypeError, match="layout"):
        inorm(x, layout="nchwc")
    with pytest.raises(TypeError, match="rank must be 4"):
        inorm(b.input("x3", data_type="float32", shape=[2, 3, 4]))
    with pytest.raises(TypeError, match="input data type int32"):
        inorm(b.input("xi", data_type="int32", shape=[2, 3, 4, 5]))
    with pytest.raises(TypeError, match="differs from input data type"):
        inorm(x, scale=b.input("h", data_type="float16", shape=[3]))
    with pytest.raises(TypeError, match="epsilon"):
        inorm(x, epsilon=None)


# -- layer_normalization ----------------------------------------------------------------------


def layer_ref(x, scale, bias, axes, eps):
    x, scale, bias = f64(x, scale, bias)
    axes = list(range(1, x.ndim)) if axes is None else list(axes)
    ax = tuple(axes)
    y = (x - x.mean(ax, keepdims=True)) / np.sqrt(x.var(ax, keepdims=True) + eps)
    # scale/bias dims follow the order of `axes`: move them to input order, then broadcast
    full = [x.shape[d] if d in axes else 1 for d in range(x.ndim)]
    perm = np.argsort(axes)
    if scale is not None:
        y = y * np.transpose(scale, perm).reshape(full)
    if bias is not None:
        y = y + np.transpose(bias, perm).reshape(full)
    return y


LAYER_CASES = [
    ((2, 3, 4), None, True, True),
    ((2, 3, 4), [2], True, True),
    ((2, 3, 4), [0, 2], True, False),  # non-contiguous axes
    ((2, 3, 4), [2, 0], True, True),  # scale shape follows the axes' order: [4, 2]
    ((3, 100), [1], True, True),  # one workgroup per row
    ((5,), [0], False, True),
    ((2, 3), [], False, True),  # empty axes: every element is its own group -> bias
    ((2, 1, 3, 2, 3), [1, 3, 4], True, True),
]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("shape,axes,has_scale,has_bias", LAYER_CASES)
def test_layer_normalization(ctx, rng, dt, shape, axes, has_scale, has_bias):
    pshape = [shape[a] for a in (range(1, len(shape)) if axes is None else axes)]
    x = (rng.standard_normal(shape) * 3 - 1).astype(dt)
    scale = rng.standard_normal(pshape).astype(dt) if has_scale else None
    bias = rng.standard_normal(pshape).astype(dt) if has_bias else None
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type=dt, shape=shape)
    opt = {k: b.constant(v) for k, v in (("scale", scale), ("bias", bias)) if v is not None}
    y = b.layer_normalization(xi, axes=axes, epsilon=1e-4, **opt)
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    check(r, layer_ref(x, scale, bias, axes, 1e-4), dt)


def test_layer_normalization_scalar(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[])
    r = run_graph(ctx, {"y": b.layer_normalization(x)}, {"x": np.array(3.0, np.float32)}, b)["y"]
    check(r, np.array(0.0), "float32")


def test_layer_normalization_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3, 4])
    s34 = b.input("s34", data_type="float32", shape=[3, 4])
    s43 = b.input("s43", data_type="float32", shape=[4, 3])
    ln = b.layer_normalization
    assert ln(x, scale=s34).shape == (2, 3, 4)
    assert ln(x, scale=s43, axes=[2, 1]).shape == (2, 3, 4)
    with pytest.raises(TypeError, match=r"\[layer_normalization\] scale shape must be \[3, 4\], got \[4, 3\]"):
        ln(x, scale=s43)
    with pytest.raises(TypeError, match="bias shape must be \\[4\\]"):
        ln(x, bias=s34, axes=[2])
    with pytest.raises(TypeError, match="out of range"):
        ln(x, axes=[3])
    with pytest.raises(TypeError, match="duplicates"):
        ln(x, axes=[1, 1])
    with pytest.raises(TypeError, match="integers"):
        ln(x, axes="12")
    with pytest.raises(TypeError, match="input data type uint32"):
        ln(b.input("xu", data_type="uint32", shape=[2, 3]))
    with pytest.raises(TypeError, match="differs from input data type"):
        ln(x, bias=b.input("h", data_type="float16", shape=[3, 4]))
    other = mltensor.MLGraphBuilder(ctx).input("s", data_type="float32", shape=[3, 4])
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        ln(x, scale=other)


def test_folded_grids(ctx, rng, monkeypatch):
    # Past 65535 workgroups a launch is folded into 2-D; shrink the limit to test that cheaply.
    import mltensor.dynamic.kernels as dyn_kernels

    monkeypatch.setattr(dyn_kernels, "MAX_GROUPS", 3)
    for shape in [(50, 40), (700, 3)]:  # one workgroup per row, one thread per row
        x = rng.standard_normal(shape).astype(np.float32)
        b = mltensor.MLGraphBuilder(ctx)
        xi = b.input("x", data_type="float32", shape=shape)
        r = run_graph(ctx, {"y": b.layer_normalization(xi)}, {"x": x}, b)["y"]
        check(r, layer_ref(x, None, None, None, 1e-5), "float32")
    x = rng.standard_normal((2, 3, 10, 20)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=x.shape)
    y = b.batch_normalization(xi, b.constant(np.zeros(3, np.float32)), b.constant(np.ones(3, np.float32)))
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    check(r, x / np.sqrt(1 + 1e-5), "float32")
