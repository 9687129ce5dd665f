"""average_pool2d, l2_pool2d, max_pool2d against float64 numpy references."""

import numpy as np
import pytest
from helpers import run_graph

import mltensor


def pool_ref(x, mode, win, pad=(0, 0, 0, 0), st=(1, 1), dil=(1, 1), out_hw=None):
    """x NCHW. Padding never counts: averages divide by the number of real elements."""
    x = x.astype(np.float64)
    n, c, h, w = x.shape
    oh, ow = out_hw
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            rows = [i * st[0] - pad[0] + k * dil[0] for k in range(win[0])]
            cols = [j * st[1] - pad[2] + k * dil[1] for k in range(win[1])]
            rows = [r for r in rows if 0 <= r < h]
            cols = [q for q in cols if 0 <= q < w]
            patch = x[:, :, rows][:, :, :, cols].reshape(n, c, -1)
            if patch.shape[-1] == 0:
                continue
            if mode == "max":
                out[:, :, i, j] = patch.max(-1)
            elif mode == "avg":
                out[:, :, i, j] = patch.mean(-1)
            else:
                out[:, :, i, j] = np.sqrt((patch**2).sum(-1))
    return out


OPS = {"avg": "average_pool2d", "l2": "l2_pool2d", "max": "max_pool2d"}


def _run(ctx, rng, mode, xshape, layout="nchw", dtype="float32", **opts):
    if dtype in ("int32", "uint32", "int8", "uint8"):
        X = rng.integers(0 if dtype.startswith("u") else -100, 100, xshape).astype(dtype)
    else:
        X = rng.standard_normal(xshape).astype(dtype)
    Xl = np.ascontiguousarray(X.transpose(0, 2, 3, 1)) if layout == "nhwc" else X
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dtype, shape=Xl.shape)
    y = getattr(b, OPS[mode])(x, layout=layout, **opts)
    got = run_graph(ctx, {"y": y}, {"x": Xl}, b)["y"]
    assert got.shape == y.shape
    assert got.dtype == np.dtype(dtype)
    if layout == "nhwc":
        got = got.transpose(0, 3, 1, 2)
    win = opts.get("window_dimensions", xshape[2:])
    ref = pool_ref(
        X,
        mode,
        win,
        opts.get("padding", (0, 0, 0, 0)),
        opts.get("strides", (1, 1)),
        opts.get("dilations", (1, 1)),
        got.shape[2:],
    )
    return got, ref


@pytest.mark.parametrize("mode", ["avg", "l2", "max"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize(
    "xshape,opts",
    [
        ((1, 3, 5, 5), {"window_dimensions": [3, 3]}),
        ((2, 3, 7, 6), {"window_dimensions": [3, 2], "strides": [2, 2], "padding": [1, 1, 0, 1]}),
        ((1, 2, 7, 7), {"window_dimensions": [2, 3], "dilations": [2, 1], "padding": [1, 0, 1, 1]}),
        ((1, 2, 6, 6), {"window_dimensions": [3, 3], "strides": [2, 2], "rounding_type": "ceil"}),
        ((1, 2, 6, 6), {"window_dimensions": [3, 3], "strides": [2, 2], "output_sizes": [3, 3]}),
        ((2, 3, 4, 5), {}),  # global (window = whole plane)
        ((1, 5, 16, 12), {}),  # global, large plane: workgroup reduction path
    ],
)
def test_pool(ctx, rng, mode, layout, xshape, opts):
    got, ref = _run(ctx, rng, mode, xshape, layout, **opts)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_pool_shapes(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 2, 6, 6])
    assert b.max_pool2d(x).shape == (1, 2, 1, 1)
    assert b.max_pool2d(x, window_dimensions=[3, 3], strides=[2, 2]).shape == (1, 2, 2, 2)
    assert b.max_pool2d(x, window_dimensions=[3, 3], strides=[2, 2], rounding_type="ceil").shape == (1, 2, 3, 3)
    assert b.max_pool2d(x, window_dimensions=[3, 3], strides=[2, 2], output_sizes=[2, 2]).shape == (1, 2, 2, 2)
    y = b.average_pool2d(
        b.input("n", data_type="float16", shape=[1, 6, 6, 2]), layout="nhwc", window_dimensions=[2, 2], strides=[2, 2]
    )
    assert y.shape == (1, 3, 3, 2) and y.data_type == "float16"


def test_pool_float16(ctx, rng):
    got, ref = _run(ctx, rng, "avg", (1, 3, 6, 6), dtype="float16", window_dimensions=[3, 3], padding=[1, 1, 1, 1])
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=2e-3, atol=2e-3)
    got, ref = _run(ctx, rng, "max", (1, 3, 6, 6), "nhwc", dtype="float16", window_dimensions=[2, 2], strides=[2, 2])
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "int8"])
def test_max_pool_integers(ctx, rng, dtype):
    got, ref = _run(ctx, rng, "max", (1, 2, 5, 5), dtype=dtype, window_dimensions=[2, 2], padding=[1, 1, 1, 1])
    np.testing.assert_array_equal(got, ref.astype(dtype))


def test_pool_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 2, 6, 6])
    with pytest.raises(TypeError, match="rank"):
        b.max_pool2d(b.input("x3", data_type="float32", shape=[2, 6, 6]))
    with pytest.raises(TypeError, match=r"\[average_pool2d\] input data type int32"):
        b.average_pool2d(b.input("i", data_type="int32", shape=[1, 2, 6, 6]))
    with pytest.raises(TypeError, match="l2_pool2d"):
        b.l2_pool2d(b.input("u", data_type="uint8", shape=[1, 2, 6, 6]))
    with pytest.raises(TypeError, match="window_dimensions"):
        b.max_pool2d(x, window_dimensions=[0, 2])
    with pytest.raises(TypeError, match="window_dimensions"):
        b.max_pool2d(x, window_dimensions=[2])
    with pytest.raises(TypeError, match="padding"):
        b.max_pool2d(x, padding=[1, 1])
    with pytest.raises(TypeError, match="strides"):
        b.max_pool2d(x, strides=[0, 1])
    with pytest.raises(TypeError, match="dilations"):
        b.max_pool2d(x, window_dimensions=[2, 2], dilations=[1, 0])
    with pytest.raises(TypeError, match="layout"):
        b.max_pool2d(x, layout="nwhc")
    with pytest.raises(TypeError, match="rounding_type"):
        b.max_pool2d(x, rounding_type="round")
    with pytest.raises(TypeError, match="exceeds the padded input"):
        b.max_pool2d(x, window_dimensions=[7, 2])
    with pytest.raises(TypeError, match=r"output_sizes \[4, 4\] must be the floor \[2, 2\] or ceil \[3, 3\]"):
        b.max_pool2d(x, window_dimensions=[3, 3], strides=[2, 2], output_sizes=[4, 4])


# -- windows of padding only ---------------------------------------------------------------------
# (dilations that step over the input, large padding, ceil rounding). max_pool2d gives the data
# type's lowest value there, as onnxruntime (and TFLite's reference kernels) do: float32 -3.4e38,
# float16 -inf (-3.4e38 rounded), int8 -128, uint8 0; average and l2 give 0.

NP = mltensor.dtypes.NUMPY
LOWEST = {
    "float32": np.float32(-np.finfo(np.float32).max),
    "float16": np.float16(-np.inf),
    "int8": -128,
    "uint8": 0,
    "int32": -(2**31),
    "uint32": 0,
    "int64": -(2**63),
    "uint64": 0,
}


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", sorted(LOWEST))
def test_max_pool_padding_only_window(ctx, layout, dtype):
    # 3x5 input, window 2x2 with dilations (4, 2) and padding 1: every window of the first row
    # steps over the input rows (taps at rows -1 and 3), the others hold real elements
    x = (np.arange(15).reshape(1, 1, 3, 5) - (0 if dtype.startswith("uint") else 7)).astype(NP[dtype])
    x = np.concatenate([x, x + 1], axis=1)  # two channels
    xl = np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "nhwc" else x
    b = mltensor.MLGraphBuilder(ctx)
    v = b.input("x", data_type=dtype, shape=xl.shape)
    opts = dict(window_dimensions=[2, 2], padding=[1, 1, 1, 1], dilations=[4, 2], layout=layout)
    outs = {"max": b.max_pool2d(v, **opts)}
    if dtype in ("float32", "float16"):
        outs["avg"] = b.average_pool2d(v, **opts)
        outs["l2"] = b.l2_pool2d(v, **opts)
        outs["relu"] = b.relu(b.max_pool2d(v, **opts))  # a fused epilogue sees the lowest value
    res = run_graph(ctx, outs, {"x": xl}, b)
    for mode, got in res.items():
        got = got.transpose(0, 3, 1, 2) if layout == "nhwc" else got
        assert got.dtype == NP[dtype]
        ref = pool_ref(x, "max" if mode == "relu" else mode, [2, 2], (1, 1, 1, 1), (1, 1), (4, 2), got.shape[2:])
        empty = np.zeros(got.shape, bool)
        empty[:, :, 0, :] = True  # taps at rows -1 and 3: padding only
        if mode == "max":
            ref[empty] = LOWEST[dtype]
        if mode == "relu":
            ref = np.maximum(ref, 0)
        np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2 if dtype == "float16" else 1e-6)
        assert np.array_equal(got[empty], np.full(empty.sum(), ref[empty][0], NP[dtype])), (mode, got[empty])


@pytest.mark.parametrize("dtype", ["float32", "float16", "int8", "uint8"])
@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 2, 1, 1), dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1], dilations=[2, 2])),
        ((1, 1, 3, 5), dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1], dilations=[4, 2])),
        ((1, 1, 3, 7), dict(kernel_shape=[2, 3], pads=[1, 2, 1, 2], dilations=[4, 4], strides=[1, 2])),
        ((1, 1, 4, 4), dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1], strides=[4, 4], ceil_mode=1)),
    ],
)
def test_onnx_max_pool_padding_only_window(dtype, shape, attrs):
    """A one-node ONNX MaxPool against onnxruntime (opset 12: integer inputs)."""
    ort = pytest.importorskip("onnxruntime")
    from helpers import one_node_model

    x = (np.arange(np.prod(shape)).reshape(shape) - (0 if dtype == "uint8" else 3)).astype(NP[dtype])
    onnx_type = {"float32": 1, "uint8": 2, "int8": 3, "float16": 10}[dtype]
    model = one_node_model("MaxPool", [("x", x, True)], [("y", onnx_type)], attrs, opset=12).SerializeToString()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = mltensor.InferenceSession(model).run(None, {"x": x})[0]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
