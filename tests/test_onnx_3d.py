"""3-D (NCDHW) Conv, ConvTranspose and pools through the ONNX importer (mltensor/onnx/ops/conv3d.py:
lowered onto WebNN's 2-D operators), each case against onnxruntime's CPU provider, plus a small 3-D
CNN run at two input sizes in one InferenceSession."""

import zlib

import numpy as np
import onnxruntime as ort
import pytest
from helpers import FUSION, one_node_model
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import mltensor
from mltensor import InferenceSession

ATOL = 1e-4


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _compare(ctx, model, feeds, atol=ATOL):
    ref = _ort(model, feeds)
    s = InferenceSession(model, ctx)
    try:
        got = s.run(None, feeds)
        names = list(s.graph.kernel_names)
    finally:
        s.close()
    for g, r in zip(got, ref):
        assert g.shape == r.shape, (g.shape, r.shape)
        assert g.dtype == r.dtype, (g.dtype, r.dtype)
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=atol)
    return names


def _arr(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _seed(case):
    """A seed per case, the same in every process (str hashes are salted per process)."""
    return zlib.crc32(repr(case).encode())


# -- Conv ------------------------------------------------------------------------------------------

# (x shape [N, C, D, H, W], filter [O, C/group, KD, KH, KW], bias, attributes)
CONV = [
    ((1, 3, 5, 6, 7), (4, 3, 3, 3, 3), True, {}),
    ((2, 4, 5, 6, 7), (6, 4, 3, 3, 2), True, dict(pads=[1, 0, 1, 1, 1, 0], strides=[2, 1, 2])),
    ((1, 2, 7, 5, 5), (3, 2, 3, 2, 2), False, dict(dilations=[2, 1, 2], pads=[2, 1, 0, 1, 0, 1])),
    ((1, 2, 9, 5, 6), (3, 2, 3, 3, 3), True, dict(dilations=[3, 2, 1], strides=[2, 1, 1])),
    ((2, 4, 6, 5, 5), (6, 2, 3, 3, 3), True, dict(group=2, pads=[1] * 6)),
    ((1, 4, 5, 6, 6), (4, 1, 3, 3, 3), True, dict(group=4, pads=[1] * 6)),  # depthwise
    ((1, 4, 5, 6, 6), (8, 1, 3, 1, 3), False, dict(group=4, strides=[2, 2, 1], pads=[0, 1, 1, 2, 0, 1])),
    ((1, 3, 5, 6, 7), (2, 3, 1, 3, 3), True, dict(pads=[0, 1, 1, 0, 1, 1])),  # kernel depth 1
    ((2, 3, 4, 6, 7), (2, 3, 1, 1, 1), False, dict(strides=[2, 2, 3])),  # 1x1x1, strided
    ((1, 3, 1, 6, 7), (4, 3, 1, 3, 3), True, {}),  # D = 1
    ((2, 3, 1, 6, 7), (4, 3, 3, 3, 3), True, dict(pads=[1] * 6)),  # D = 1, depth all padding but one
    ((1, 2, 4, 5, 5), (3, 2, 4, 2, 2), True, {}),  # kernel depth = input depth: no gather
    ((1, 3, 5, 6, 7), (4, 3, 2, 3, 3), True, dict(auto_pad="SAME_UPPER")),
    ((1, 3, 6, 6, 7), (4, 3, 2, 3, 2), True, dict(auto_pad="SAME_LOWER", strides=[2, 2, 3])),
    ((1, 3, 5, 7, 6), (4, 3, 3, 2, 3), False, dict(auto_pad="SAME_UPPER", strides=[2, 3, 2])),
    ((1, 3, 5, 6, 7), (4, 3, 3, 3, 3), True, dict(auto_pad="VALID", strides=[1, 2, 2])),
    ((1, 3, 8, 5, 5), (4, 3, 3, 3, 3), True, dict(strides=[3, 1, 1], pads=[2, 2, 0, 0, 2, 0])),
    (
        (1, 6, 5, 4, 4),
        (6, 2, 2, 2, 2),
        True,
        dict(group=3, dilations=[2, 2, 1], strides=[1, 1, 2], pads=[1, 0, 1, 0, 1, 0], kernel_shape=[2, 2, 2]),
    ),
]


@pytest.mark.parametrize("case", CONV, ids=[f"conv{i}" for i in range(len(CONV))])
def test_conv3d(ctx, case):
    xs, ws, bias, attrs = case
    rng = np.random.default_rng(_seed(case))
    inputs = [
        ("x", _arr(rng, *xs), True),
        ("w", _arr(rng, *ws), False),
        ("b", _arr(rng, ws[0]) if bias else None, False),
    ]
    names = _compare(ctx, one_node_model("Conv", inputs, [("y", TP.FLOAT)], attrs), {"x": inputs[0][1]})
    # one conv2d for all the depth taps; the depth im2col is one gather
    assert sum(n.startswith("conv2d") for n in names) == 1, names
    assert sum(n.startswith("gather") for n in names) <= 1, names


def test_conv3d_filter_as_input(ctx):
    """A filter (and bias) that are graph inputs, not initializers."""
    rng = np.random.default_rng(5)
    x, w, b = _arr(rng, 1, 4, 5, 5, 6), _arr(rng, 4, 2, 3, 3, 2), _arr(rng, 4)
    inputs = [("x", x, True), ("w", w, True), ("b", b, True)]
    m = one_node_model("Conv", inputs, [("y", TP.FLOAT)], dict(group=2, pads=[1, 1, 0, 1, 1, 1], strides=[2, 1, 1]))
    _compare(ctx, m, {"x": x, "w": w, "b": b})


def test_conv3d_launches(ctx):
    """Launches: [pad (depth padding)] + gather + conv2d + transpose back; none of the KD taps
    is a launch of its own."""
    rng = np.random.default_rng(6)
    x = _arr(rng, 1, 4, 6, 8, 8)
    inputs = [("x", x, True), ("w", _arr(rng, 8, 4, 3, 3, 3), False), ("b", _arr(rng, 8), False)]
    names = _compare(ctx, one_node_model("Conv", inputs, [("y", TP.FLOAT)], dict(pads=[1] * 6)), {"x": x})
    kinds = [n.split("_")[0] for n in names]
    assert kinds == ["pad", "gather", "conv2d", "transpose"], names
    names = _compare(ctx, one_node_model("Conv", inputs, [("y", TP.FLOAT)], dict(pads=[0, 1, 1, 0, 1, 1])), {"x": x})
    assert [n.split("_")[0] for n in names] == ["gather", "conv2d", "transpose"], names


# -- ConvTranspose ----------------------------------------------------------------------------------

# (x shape, filter [C, O/group, KD, KH, KW], bias, attributes)
CONV_T = [
    ((1, 3, 3, 4, 5), (3, 2, 3, 3, 3), True, {}),
    (
        (2, 4, 3, 4, 3),
        (4, 3, 3, 2, 3),
        True,
        dict(strides=[2, 2, 1], pads=[1, 0, 0, 0, 1, 1], output_padding=[1, 1, 0]),
    ),
    (
        (1, 4, 3, 3, 4),
        (4, 3, 2, 3, 3),
        False,
        dict(strides=[3, 2, 2], dilations=[2, 1, 1], group=2, auto_pad="SAME_UPPER"),
    ),
    ((1, 2, 4, 3, 3), (2, 2, 3, 3, 2), True, dict(strides=[2, 1, 2], auto_pad="SAME_LOWER")),
    ((1, 2, 3, 4, 4), (2, 3, 3, 3, 3), True, dict(strides=[2, 2, 2], output_shape=[6, 8, 8])),
    ((1, 2, 3, 4, 4), (2, 3, 3, 3, 3), False, dict(strides=[2, 2, 2], output_shape=[8, 9, 9])),
    ((1, 2, 4, 3, 3), (2, 3, 2, 2, 2), True, dict(dilations=[3, 2, 1], pads=[2, 1, 1, 1, 0, 0])),
    ((1, 4, 3, 3, 3), (4, 1, 3, 3, 3), True, dict(group=4, strides=[2, 2, 2], pads=[1] * 6)),  # depthwise
    ((1, 3, 1, 4, 4), (3, 2, 3, 3, 3), True, dict(strides=[2, 2, 2])),  # D = 1
    ((1, 3, 4, 4, 4), (3, 2, 1, 3, 3), True, dict(strides=[2, 1, 1], pads=[0, 1, 1, 0, 1, 1])),  # KD = 1
    ((1, 3, 3, 3, 3), (3, 2, 2, 2, 2), True, dict(strides=[2, 2, 2], auto_pad="VALID", output_padding=[1, 0, 1])),
    (
        (2, 2, 3, 2, 3),
        (2, 2, 4, 3, 2),
        True,
        dict(strides=[3, 1, 1], pads=[3, 0, 1, 1, 0, 0], output_padding=[2, 0, 0]),
    ),
]


@pytest.mark.parametrize("case", CONV_T, ids=[f"convt{i}" for i in range(len(CONV_T))])
def test_conv_transpose3d(ctx, case):
    xs, ws, bias, attrs = case
    rng = np.random.default_rng(_seed(case))
    g = attrs.get("group", 1)
    inputs = [
        ("x", _arr(rng, *xs), True),
        ("w", _arr(rng, *ws), False),
        ("b", _arr(rng, ws[1] * g) if bias else None, False),
    ]
    names = _compare(ctx, one_node_model("ConvTranspose", inputs, [("y", TP.FLOAT)], attrs), {"x": inputs[0][1]})
    assert sum(n.startswith("conv_transpose2d") for n in names) == 1, names


def test_conv_transpose3d_filter_as_input(ctx):
    rng = np.random.default_rng(7)
    x, w = _arr(rng, 1, 4, 3, 3, 4), _arr(rng, 4, 2, 2, 3, 3)
    m = one_node_model(
        "ConvTranspose",
        [("x", x, True), ("w", w, True)],
        [("y", TP.FLOAT)],
        dict(group=2, strides=[2, 2, 1], pads=[0, 1, 1, 1, 0, 1]),
    )
    _compare(ctx, m, {"x": x, "w": w})


# -- pools ------------------------------------------------------------------------------------------

POOL = [
    dict(kernel_shape=[2, 2, 2]),
    dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
    dict(kernel_shape=[3, 3, 3], pads=[1] * 6),
    dict(kernel_shape=[2, 3, 2], strides=[2, 2, 1], pads=[1, 1, 0, 0, 1, 1]),
    dict(kernel_shape=[3, 3, 2], strides=[2, 2, 2], pads=[1, 1, 0, 1, 1, 1], ceil_mode=1),
    dict(kernel_shape=[3, 2, 3], strides=[3, 2, 2], ceil_mode=1),
    dict(kernel_shape=[2, 3, 3], strides=[2, 2, 2], dilations=[2, 1, 2], pads=[1, 1, 1, 0, 1, 1]),
    dict(kernel_shape=[3, 2, 2], strides=[2, 2, 3], dilations=[2, 2, 1], ceil_mode=1),
    dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], auto_pad="SAME_UPPER"),
    dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], auto_pad="SAME_LOWER"),
    dict(kernel_shape=[2, 2, 3], strides=[1, 2, 2], auto_pad="VALID"),
    dict(kernel_shape=[1, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1]),  # kernel depth 1
    dict(kernel_shape=[3, 1, 1], strides=[2, 1, 1], pads=[1, 0, 0, 1, 0, 0]),  # depth only
    dict(kernel_shape=[1, 1, 1], strides=[1, 1, 1]),
]
POOL_OPS = [
    ("MaxPool", {}),
    ("AveragePool", {}),
    ("AveragePool", dict(count_include_pad=1)),
    ("LpPool", {}),
    ("LpPool", dict(p=3)),
    ("LpPool", dict(p=1)),
]


def _pool_cases():
    out = []
    for op, extra in POOL_OPS:
        for i, a in enumerate(POOL):
            if op == "LpPool" and "dilations" in a:
                continue  # (onnxruntime's LpPool takes no dilations)
            name = op + "".join(f"_{k}{v}" for k, v in extra.items())
            out.append(pytest.param(op, {**a, **extra}, id=f"{name}-{i}"))
    return out


@pytest.mark.parametrize("op,attrs", _pool_cases())
def test_pool3d(ctx, op, attrs):
    rng = np.random.default_rng(_seed((op, attrs)))
    x = _arr(rng, 2, 3, 5, 6, 7)
    # (AveragePool's dilations are opset 19+)
    names = _compare(ctx, one_node_model(op, [("x", x, True)], [("y", TP.FLOAT)], attrs, opset=19), {"x": x})
    assert sum("pool2d" in n for n in names) <= 2, names


def test_pool3d_depth_one(ctx):
    rng = np.random.default_rng(8)
    x = _arr(rng, 1, 3, 1, 6, 7)
    for op, a in (
        ("MaxPool", dict(kernel_shape=[1, 3, 3])),
        ("AveragePool", dict(kernel_shape=[3, 2, 2], pads=[1, 0, 0, 1, 1, 1], count_include_pad=1)),
        ("AveragePool", dict(kernel_shape=[3, 2, 2], pads=[1, 0, 0, 1, 1, 1], ceil_mode=1)),
        ("MaxPool", dict(kernel_shape=[2, 2, 2], pads=[1, 0, 0, 0, 0, 0], strides=[1, 2, 2])),
    ):
        _compare(ctx, one_node_model(op, [("x", x, True)], [("y", TP.FLOAT)], a), {"x": x})


def test_pool3d_padding_only_windows(ctx):
    """A dilated window can hold padding only: onnxruntime's MaxPool gives the lowest float there,
    its AveragePool 0 (both count_include_pad modes)."""
    rng = np.random.default_rng(15)
    x = _arr(rng, 1, 2, 3, 1, 4)
    a = dict(kernel_shape=[2, 2, 2], dilations=[1, 2, 1], pads=[0, 1, 0, 0, 1, 0])
    for op, extra in (("MaxPool", {}), ("AveragePool", {}), ("AveragePool", dict(count_include_pad=1))):
        _compare(ctx, one_node_model(op, [("x", x, True)], [("y", TP.FLOAT)], {**a, **extra}, opset=19), {"x": x})


F16 = [
    ("Conv", (6, 2, 3, 3, 3), dict(pads=[1] * 6, group=2)),
    ("ConvTranspose", (4, 2, 3, 3, 3), dict(strides=[2, 2, 1], pads=[1, 0, 0, 0, 1, 1])),
    (
        "AveragePool",
        None,
        dict(kernel_shape=[3, 3, 3], pads=[1] * 6, count_include_pad=1, ceil_mode=1, strides=[2, 2, 2]),
    ),
    ("MaxPool", None, dict(kernel_shape=[2, 3, 3], dilations=[2, 2, 2], pads=[1] * 6)),
    ("LpPool", None, dict(kernel_shape=[3, 3, 3], pads=[1] * 6, p=3)),
]


@pytest.mark.parametrize("op,ws,attrs", F16, ids=[c[0] for c in F16])
def test_float16(ctx, op, ws, attrs):
    """float16 models (f16 compute where the adapter has it) against onnxruntime on float32."""
    rng = np.random.default_rng(16)
    x = _arr(rng, 1, 4, 5, 6, 7)
    w = [("w", _arr(rng, *ws) * 0.3, False)] if ws else []
    m32 = one_node_model(op, [("x", x, True)] + w, [("y", TP.FLOAT)], attrs, opset=19)
    m16 = one_node_model(
        op,
        [("x", x.astype(np.float16), True)] + [(n, v.astype(np.float16), f) for n, v, f in w],
        [("y", TP.FLOAT16)],
        attrs,
        opset=19,
    )
    (want,) = _ort(m32, {"x": x})
    s = InferenceSession(m16, ctx)
    try:
        (got,) = s.run(None, {"x": x.astype(np.float16)})
    finally:
        s.close()
    assert got.shape == want.shape
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())


def test_maxpool3d_int8(ctx):
    rng = np.random.default_rng(9)
    x = rng.integers(-128, 128, (1, 2, 4, 5, 5), dtype=np.int8)
    m = one_node_model(
        "MaxPool",
        [("x", x, True)],
        [("y", TP.INT8)],
        dict(kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[0, 1, 1, 1, 1, 1]),
    )
    _compare(ctx, m, {"x": x}, atol=0)


def test_pool3d_launches(ctx):
    """Separable: a pool over (H, W) then one over depth, no data movement; count_include_pad's
    correction is the second pool's epilogue."""
    rng = np.random.default_rng(10)
    x = _arr(rng, 1, 3, 5, 6, 7)
    w = _arr(rng, 2, 3, 1, 1, 1)
    for op, a in (
        ("MaxPool", dict(kernel_shape=[3, 3, 3], strides=[2, 2, 2], pads=[1] * 6)),
        ("AveragePool", dict(kernel_shape=[3, 3, 3], pads=[1] * 6, count_include_pad=1)),
    ):
        # a 1x1x1 Conv after the pool reads it through a free reshape
        nodes = [h.make_node(op, ["x"], ["p"], **a), h.make_node("Conv", ["p", "w"], ["y"])]
        g = h.make_graph(
            nodes,
            "g",
            [h.make_tensor_value_info("x", TP.FLOAT, x.shape)],
            [h.make_tensor_value_info("y", TP.FLOAT, None)],
            [nh.from_array(w, "w")],
        )
        names = _compare(ctx, h.make_model(g, opset_imports=[h.make_opsetid("", 21)], ir_version=10), {"x": x})
        pools = [n for n in names if "pool2d" in n]
        assert len(pools) == 2, names
        assert not FUSION or not any(n.startswith(("ew_", "mul", "pad", "copy")) for n in names), names


GLOBAL = [
    ("GlobalAveragePool", {}),
    ("GlobalMaxPool", {}),
    ("GlobalLpPool", {}),
    ("GlobalLpPool", dict(p=1)),
    ("GlobalLpPool", dict(p=3)),
]


@pytest.mark.parametrize("op,attrs", GLOBAL, ids=[f"{o}{a.get('p', '')}" for o, a in GLOBAL])
def test_global_pool3d(ctx, op, attrs):
    rng = np.random.default_rng(11)
    x = _arr(rng, 2, 3, 4, 5, 6)
    _compare(ctx, one_node_model(op, [("x", x, True)], [("y", TP.FLOAT)], attrs), {"x": x})


# -- the other layers of a 3-D CNN on 5-D tensors ------------------------------------------------------


def test_5d_normalization_resize_elementwise(ctx):
    rng = np.random.default_rng(12)
    x = _arr(rng, 2, 3, 4, 5, 6)
    c = 3
    params = [
        ("s", rng.uniform(0.5, 1.5, c).astype(np.float32), False),
        ("bb", _arr(rng, c), False),
        ("m", _arr(rng, c), False),
        ("v", rng.uniform(0.5, 2, c).astype(np.float32), False),
    ]
    _compare(
        ctx,
        one_node_model("BatchNormalization", [("x", x, True)] + params, [("y", TP.FLOAT)], dict(epsilon=1e-3)),
        {"x": x},
    )
    _compare(ctx, one_node_model("InstanceNormalization", [("x", x, True)] + params[:2], [("y", TP.FLOAT)]), {"x": x})
    for mode in ("nearest", "linear"):
        scales = np.array([1, 1, 2, 1.5, 2], np.float32)
        m = one_node_model(
            "Resize", [("x", x, True), ("roi", None, False), ("sc", scales, False)], [("y", TP.FLOAT)], dict(mode=mode)
        )
        _compare(ctx, m, {"x": x})
    y = _arr(rng, 1, 3, 1, 5, 1)
    _compare(ctx, one_node_model("Add", [("x", x, True), ("y", y, True)], [("z", TP.FLOAT)]), {"x": x, "y": y})
    _compare(ctx, one_node_model("Relu", [("x", x, True)], [("z", TP.FLOAT)]), {"x": x})


# -- refused and malformed -----------------------------------------------------------------------------


def test_refusals(ctx):
    rng = np.random.default_rng(13)
    x4 = _arr(rng, 1, 2, 3, 3, 3, 3)  # 4 spatial dimensions
    m = one_node_model("Conv", [("x", x4, True), ("w", _arr(rng, 2, 2, 1, 1, 1, 1), False)], [("y", TP.FLOAT)])
    with pytest.raises(mltensor.NotSupportedError, match="4-D spatial convolutions are not supported"):
        InferenceSession(m, ctx)
    m = one_node_model("MaxPool", [("x", x4, True)], [("y", TP.FLOAT)], dict(kernel_shape=[1, 1, 1, 1]))
    with pytest.raises(mltensor.NotSupportedError, match="4-D spatial pools are not supported"):
        InferenceSession(m, ctx)
    x = _arr(rng, 1, 2, 3, 4, 4)
    m = one_node_model("MaxPool", [("x", x, True)], [("y", TP.FLOAT), ("i", TP.INT64)], dict(kernel_shape=[2, 2, 2]))
    with pytest.raises(mltensor.NotSupportedError, match="Indices output"):
        InferenceSession(m, ctx)
    bad = [  # (filter shape, attributes, message)
        ((3, 1, 3, 3, 3), dict(group=3), "divisible by group"),
        ((4, 1, 3, 3, 3), {}, "must equal the filter's input channels"),
        ((4, 2, 3, 3, 3), dict(kernel_shape=[2, 3, 3]), "does not match the filter"),
        ((4, 2, 5, 3, 3), {}, "dilated filter depth"),
        ((4, 2, 2, 3, 3), dict(strides=[0, 1, 1]), "strides must be >= 1"),
    ]
    for ws, attrs, msg in bad:
        m = one_node_model("Conv", [("x", x, True), ("w", _arr(rng, *ws), False)], [("y", TP.FLOAT)], attrs)
        with pytest.raises(mltensor.NotSupportedError, match=msg):
            InferenceSession(m, ctx)
    m = one_node_model(
        "ConvTranspose",
        [("x", x, True), ("w", _arr(rng, 2, 2, 2, 2, 2), False)],
        [("y", TP.FLOAT)],
        dict(pads=[3, 0, 0, 3, 0, 0]),
    )
    with pytest.raises(mltensor.NotSupportedError, match="output depth would be"):
        InferenceSession(m, ctx)


# -- a small 3-D CNN, two input sizes in one session ---------------------------------------------------


def _cnn(rng, dims):
    """Conv3d+BN+Relu -> MaxPool3d -> Conv3d(+Relu) -> GlobalAveragePool -> Flatten -> Gemm."""
    init = [
        nh.from_array(_arr(rng, 8, 3, 3, 3, 3) * 0.3, "w1"),
        nh.from_array(_arr(rng, 8), "b1"),
        nh.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "g"),
        nh.from_array(_arr(rng, 8), "be"),
        nh.from_array(_arr(rng, 8) * 0.1, "mu"),
        nh.from_array(rng.uniform(0.5, 2, 8).astype(np.float32), "var"),
        nh.from_array(_arr(rng, 12, 4, 3, 3, 3) * 0.2, "w2"),
        nh.from_array(_arr(rng, 12), "b2"),
        nh.from_array(_arr(rng, 5, 12), "fw"),
        nh.from_array(_arr(rng, 5), "fb"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 6, strides=[1, 2, 2]),
        h.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"]),
        h.make_node("Relu", ["n1"], ["r1"]),
        h.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[0, 1, 1, 0, 1, 1]),
        h.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1] * 6, group=2),
        h.make_node("Relu", ["c2"], ["r2"]),
        h.make_node("GlobalAveragePool", ["r2"], ["gp"]),
        h.make_node("Flatten", ["gp"], ["f"]),
        h.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    g = h.make_graph(
        nodes,
        "cnn3d",
        [h.make_tensor_value_info("x", TP.FLOAT, dims)],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        init,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(
    "dims,sizes",
    [
        (["N", 3, "D", "H", "W"], [(1, 3, 4, 8, 8), (2, 3, 6, 10, 12)]),  # spatial sizes free
        (["N", 3, 4, 8, 8], [(2, 3, 4, 8, 8), (3, 3, 4, 8, 8)]),  # the batch free (dynamic build)
    ],
    ids=["spatial", "batch"],
)
def test_cnn3d_two_sizes(ctx, dims, sizes):
    rng = np.random.default_rng(14)
    model = _cnn(rng, dims)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    s = InferenceSession(model, ctx)
    try:
        for shape in sizes + sizes[:1]:
            x = _arr(rng, *shape)
            (got,) = s.run(None, {"x": x})
            (want,) = ref.run(None, {"x": x})
            assert got.shape == want.shape == (shape[0], 5)
            assert got.dtype == want.dtype
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=ATOL)
        st = s.stats
    finally:
        s.close()
    if "D" in dims:
        # the depth taps are indices computed at load: a build per size, with the reason kept
        assert not st["dynamic"] and st["specializations"] == 2, st
        assert any(m in st["static_reason"] for m in ("dynamic dimension (D)", "immediates")), st
    elif st["dynamic"]:  # (on adapters with "immediates"): one build serves both batch sizes
        assert st["specializations"] == 1 and st["builds"] == 1, st


# -- a torch export ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_torch_r3d_block(ctx, tmp_path):
    """An r3d-style stem and residual block (torchvision's video ResNet layout) exported by
    torch.onnx.export, against torch itself and onnxruntime."""
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv3d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm3d(cout)
            self.c2 = nn.Conv3d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm3d(cout)
            self.down = nn.Sequential(nn.Conv3d(cin, cout, 1, stride, bias=False), nn.BatchNorm3d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            return torch.relu(self.b2(self.c2(y)) + self.down(x))

    class R3D(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv3d(3, 8, (3, 7, 7), (1, 2, 2), (1, 3, 3), bias=False), nn.BatchNorm3d(8), nn.ReLU()
            )
            self.layer = Block(8, 16, 2)
            self.up = nn.ConvTranspose3d(16, 4, 2, 2)
            self.pool = nn.AdaptiveAvgPool3d(1)
            self.mp = nn.MaxPool3d(2, 2, ceil_mode=True)
            self.fc = nn.Linear(16 + 4, 6)

        def forward(self, x):
            y = self.layer(self.stem(x))
            u = self.pool(self.mp(self.up(y))).flatten(1)
            return self.fc(torch.cat([self.pool(y).flatten(1), u], 1))

    torch.manual_seed(0)
    net = R3D().eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm3d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 3, 8, 32, 32)
    path = tmp_path / "r3d.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["y"], opset_version=17, dynamo=False)
    with torch.no_grad():
        want = net(x).numpy()
    s = InferenceSession(str(path), ctx)
    try:
        (got,) = s.run(None, {"x": x.numpy()})
    finally:
        s.close()
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=ATOL)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
