"""Full-integer TFLite (mltensor/tflite/quantized.py): int8 models written with ModelWriter
(per-channel int8 weights, int32 biases, int8 or float graph inputs and outputs), against LiteRT:
int8 outputs equal or one quantum apart, float outputs behind DEQUANTIZE within one step. Each
model is one or two operators deep: a one-step difference in a chain grows by the ratio of the
scales downstream, which says nothing about either operator."""

import numpy as np
import pytest

from tflite_reference import litert_outputs as _litert
from tflite_reference import run_model as _run

from mltensor.tflite import import_model
from mltensor.tflite.writer import ModelWriter

pytest.importorskip("ai_edge_litert")

I8 = np.int8
SAME, VALID = 0, 1
RELU6 = 3


def _q8(rng, shape):
    return rng.integers(-128, 128, size=shape).astype(I8)


def _weights(rng, w, name, shape, axis, n):
    scales = rng.uniform(0.005, 0.02, n).astype(np.float32)
    return w.const(
        name, rng.integers(-127, 128, size=shape).astype(I8), quant=(scales, np.zeros(n, np.int64), axis)
    ), scales


def _conv(rng):
    """int8 input -> CONV_2D (per-channel weights, int32 bias, RELU6) -> DEPTHWISE_CONV_2D -> int8."""
    w = ModelWriter()
    s_in = 0.05
    x = w.input("x", [1, 8, 8, 3], I8, quant=(s_in, -3))
    k, ks = _weights(rng, w, "k", (4, 3, 3, 3), 0, 4)
    bias = w.const("bias", rng.integers(-500, 500, 4).astype(np.int32), quant=(s_in * ks, np.zeros(4, np.int64), 0))
    y = w.tensor("y", [1, 8, 8, 4], I8, quant=(0.03, -128))
    w.op("CONV_2D", [x, k, bias], [y], "Conv2DOptions", version=3, Padding=SAME, StrideW=1, StrideH=1,
         FusedActivationFunction=RELU6)  # fmt: skip
    dk, dks = _weights(rng, w, "dk", (1, 3, 3, 4), 3, 4)
    db = w.const("db", rng.integers(-300, 300, 4).astype(np.int32), quant=(0.03 * dks, np.zeros(4, np.int64), 0))
    z = w.tensor("z", [1, 4, 4, 4], I8, quant=(0.02, 5))
    w.op("DEPTHWISE_CONV_2D", [y, dk, db], [z], "DepthwiseConv2DOptions", version=3, Padding=SAME, StrideW=2,
         StrideH=2, DepthMultiplier=1)  # fmt: skip
    return w.finish([x], [z]), [_q8(rng, (1, 8, 8, 3))]


def _fc_softmax(rng):
    """float input -> QUANTIZE -> FULLY_CONNECTED -> SOFTMAX -> DEQUANTIZE -> float."""
    w = ModelWriter()
    x = w.input("x", [2, 16])
    xq = w.tensor("xq", [2, 16], I8, quant=(0.02, 1))
    w.op("QUANTIZE", [x], [xq], version=2)
    k = w.const("k", rng.integers(-127, 128, (10, 16)).astype(I8), quant=(0.01, 0))
    bias = w.const("bias", rng.integers(-200, 200, 10).astype(np.int32), quant=(0.02 * 0.01, 0))
    y = w.tensor("y", [2, 10], I8, quant=(0.05, -2))
    w.op("FULLY_CONNECTED", [xq, k, bias], [y], "FullyConnectedOptions", version=4)
    p = w.tensor("p", [2, 10], I8, quant=(1 / 256, -128))
    w.op("SOFTMAX", [y], [p], "SoftmaxOptions", version=2, Beta=1.0)
    out = w.tensor("out", [2, 10])
    w.op("DEQUANTIZE", [p], [out], version=2)
    return w.finish([x], [out]), [np.random.default_rng(2).standard_normal((2, 16)).astype(np.float32)]


def _single(op, ins, out, consts=(), opts=None, version=2):
    """One int8 operator: `ins` = [(shape, (scale, zero point))] graph inputs, then `consts`
    (arrays), `out` = (shape, (scale, zero point))."""

    def make(rng):
        w = ModelWriter()
        xs = [w.input(f"x{k}", list(shape), I8, quant=q) for k, (shape, q) in enumerate(ins)]
        cs = [w.const(f"c{k}", c) for k, c in enumerate(consts)]
        y = w.tensor("y", list(out[0]), I8, quant=out[1])
        otype, o = opts if opts else (None, {})
        w.op(op, xs + cs, [y], otype, version=version, **o)
        return w.finish(xs, [y]), [_q8(rng, shape) for shape, _ in ins]

    return make


_X = ((1, 6, 6, 4), (0.04, 2))
_POOL = {"Padding": SAME, "StrideW": 2, "StrideH": 2, "FilterWidth": 3, "FilterHeight": 3}
SINGLE = {
    "add": _single("ADD", [_X, ((1, 6, 6, 4), (0.03, -7))], ((1, 6, 6, 4), (0.06, 0)), opts=("AddOptions", {})),
    "sub": _single("SUB", [_X, ((1, 1, 1, 4), (0.03, -7))], ((1, 6, 6, 4), (0.06, 0)), opts=("SubOptions", {})),
    "mul": _single("MUL", [_X, ((1, 6, 6, 4), (0.03, -7))], ((1, 6, 6, 4), (0.1, -1)), opts=("MulOptions", {})),
    "average_pool": _single("AVERAGE_POOL_2D", [_X], ((1, 3, 3, 4), (0.04, 2)), opts=("Pool2DOptions", _POOL)),
    "max_pool": _single("MAX_POOL_2D", [_X], ((1, 3, 3, 4), (0.04, 2)), opts=("Pool2DOptions", _POOL)),
    "concatenation": _single(
        "CONCATENATION", [_X, _X], ((1, 6, 6, 8), (0.04, 2)), opts=("ConcatenationOptions", {"Axis": 3})
    ),  # fmt: skip
    "pad": _single("PAD", [_X], ((1, 8, 7, 4), (0.04, 2)), [np.array([[0, 0], [1, 1], [0, 1], [0, 0]], np.int32)]),
    "mean": _single("MEAN", [_X], ((1, 4), (0.01, -5)), [np.array([1, 2], np.int32)], ("ReducerOptions", {})),
    "logistic": _single("LOGISTIC", [_X], ((1, 6, 6, 4), (1 / 256, -128))),
    "tanh": _single("TANH", [_X], ((1, 6, 6, 4), (1 / 128, 0))),
    "softmax": _single(
        "SOFTMAX", [((3, 10), (0.1, 4))], ((3, 10), (1 / 256, -128)), opts=("SoftmaxOptions", {"Beta": 1.0})
    ),
    "reshape": _single("RESHAPE", [_X], ((1, 36, 4), (0.04, 2)), [np.array([1, 36, 4], np.int32)], version=1),
    "resize_bilinear": _single(
        "RESIZE_BILINEAR",
        [_X],
        ((1, 12, 12, 4), (0.04, 2)),
        [np.array([12, 12], np.int32)],
        ("ResizeBilinearOptions", {"HalfPixelCenters": True}),
        version=3,
    ),  # fmt: skip
    "hard_swish": _single("HARD_SWISH", [_X], ((1, 6, 6, 4), (0.02, -60)), version=1),
}


CASES = {"conv_depthwise": _conv, "quantize_fc_softmax_dequantize": _fc_softmax, **SINGLE}
# computed in LiteRT's integer arithmetic (quantized.py): equal, not one quantum apart
# (the others compute in float and round onto the grid: equal here, one quantum apart at worst)
EXACT = ("conv_depthwise", "add", "sub", "mul", "average_pool", "mean", "logistic", "tanh", "softmax", "hard_swish",
         "resize_bilinear")  # fmt: skip


def _random_binary(op, seed):
    """ADD / SUB with random scales (ratios across XNNPACK's range) and zero points, broadcast or not."""
    rng = np.random.default_rng(seed)
    sa, sb = np.exp(rng.uniform(np.log(0.002), np.log(0.2), 2))
    so = np.exp(rng.uniform(np.log(0.004), np.log(0.4)))
    za, zb, zo = (int(v) for v in rng.integers(-100, 100, 3))
    bshape = (1, 6, 6, 4) if seed % 2 else (1, 1, 6, 1)
    return _single(op, [((1, 6, 6, 4), (sa, za)), (bshape, (sb, zb))], ((1, 6, 6, 4), (so, zo)),
                   opts=(op.title() + "Options", {}))(rng)  # fmt: skip


@pytest.mark.parametrize("op", ["ADD", "SUB"])
def test_xnn_add_reference_matches_litert(op):
    """The numpy form of XNNPACK's integer add (quantized.xnn_add_reference) is what LiteRT's default
    CPU path computes, bit for bit, over random scales and zero points (no GPU)."""
    from mltensor.tflite.quantized import xnn_add_reference
    from mltensor.tflite.reader import read

    for seed in range(12):
        data, feeds = _random_binary(op, seed)
        ref = _litert(data, feeds)[0]
        m = read(bytes(data))
        ta, tb = (m.tensors[i] for i in m.inputs)
        got = xnn_add_reference(feeds[0], feeds[1], ta, tb, m.tensors[m.outputs[0]], op == "SUB")
        assert got is not None
        np.testing.assert_array_equal(got, ref)


def _random_hard_swish(seed):
    rng = np.random.default_rng(seed)
    si, so = float(np.exp(rng.uniform(np.log(0.005), np.log(0.1)))), float(rng.uniform(0.005, 0.05))
    zi, zo = int(rng.integers(-60, 60)), int(rng.integers(-128, -90))
    return _single("HARD_SWISH", [((1, 16, 16, 4), (si, zi))], ((1, 16, 16, 4), (so, zo)), version=1)(rng)


def test_hard_swish_reference_matches_litert():
    """quantized.hard_swish_reference (TFLite's fixed-point HARD_SWISH in numpy) equals LiteRT's
    int8 outputs over random scales, where computing it in float differs (no GPU)."""
    from mltensor.tflite.quantized import hard_swish_reference
    from mltensor.tflite.reader import read

    off = 0
    for seed in range(12):
        data, feeds = _random_hard_swish(seed)
        ref = _litert(data, feeds)[0]
        m = read(bytes(data))
        tx, to = m.tensors[m.inputs[0]], m.tensors[m.outputs[0]]
        np.testing.assert_array_equal(hard_swish_reference(feeds[0], tx, to), ref)
        x = (feeds[0].astype(np.float32) - tx.zero_point[0]) * tx.scale[0]
        y = x * np.clip(x + 3, 0, 6) / 6
        off += int((np.clip(np.rint(y / to.scale[0]) + to.zero_point[0], -128, 127) != ref).sum())
    assert off > 0  # the float form is one quantum off somewhere: these cases test the integer path


def test_fixed_point_helpers():
    """TFLite's fixed-point helpers (quantized.py) on values worked by hand."""
    from mltensor.tflite import quantized as q

    assert q.quantize_multiplier(0.5) == (1 << 30, 0)
    assert q.quantize_multiplier(0.75) == (3 << 29, 0)
    assert q.quantize_multiplier(3.0) == (3 << 29, 2)
    assert q.quantize_multiplier(1 - 2.0**-40) == (1 << 30, 1)  # rounds up to 2^31: halved, shift + 1
    assert q.quantize_multiplier(0.0) == (0, 0)
    i = np.array
    np.testing.assert_array_equal(q.rounding_divide_by_pot(i([5, -5, 6, -6, 7, -7]), 1), [3, -3, 3, -3, 4, -4])
    np.testing.assert_array_equal(q.rounding_divide_by_pot(i([2, -2, 3, -3]), 2), [1, -1, 1, -1])
    # 2 a b / 2^16 with rounding (half away from zero), saturating at (-2^15)^2
    np.testing.assert_array_equal(q.srdhm16(i([16384, -16384, -32768, 3]), i([16384, 16384, -32768, 5461])),
                                  [8192, -8192, 32767, 0])  # fmt: skip
    np.testing.assert_array_equal(q.sdhm16(i([3, -3, 32767]), i([16384, 16384, 32767])), [1, -1, 32766])
    # x * 0.75 * 2^-3 = x * 3 / 32: 16 -> 1.5 -> 2, -16 -> -1.5 -> -2; 5 -> 0.47 -> 1: the high-mul
    # rounds 3.75 to 4, then 4 / 8 rounds half away (TFLite's two roundings)
    np.testing.assert_array_equal(q.multiply_by_quantized_multiplier(i([16, -16, 5, 32]), 3 << 29, -3), [2, -2, 1, 3])
    np.testing.assert_array_equal(q.multiply_by_quantized_multiplier(i([3, -3]), 3 << 29, 2), [9, -9])  # x * 3
    assert q.downscale_int16_multiplier(1 << 30) == 1 << 14
    assert q.downscale_int16_multiplier((1 << 31) - 1) == (1 << 15) - 1
    ta, tb, to = (_T(s, z) for s, z in ((0.02, 3), (0.02, 3), (0.04, 0)))  # y = (a - 3) / 2 + (b - 3) / 2
    got = q.xnn_add_reference(i([3, 4, 5, 2]), i([3, 3, 4, 3]), ta, tb, to)
    np.testing.assert_array_equal(got, [0, 1, 2, 0])  # 0, 0.5, 1.5, -0.5: halves up (+ 1/2, then floor)


class _T:
    def __init__(self, scale, zp):
        self.scale, self.zero_point, self.data_type = np.array([scale], np.float32), np.array([zp]), "int8"


def _random_leaky_relu(seed, alpha=None):
    """LEAKY_RELU with random scales; `alpha` (input / output scale * alpha under 2^-8): outside
    XNNPACK's range, LiteRT's own kernel runs it."""
    rng = np.random.default_rng(seed)
    si = float(np.exp(rng.uniform(np.log(0.005), np.log(0.2))))
    so = si * float(rng.uniform(0.3, 1.0))
    zi, zo = (int(v) for v in rng.integers(-50, 50, 2))
    alpha = alpha or float(rng.uniform(0.05, 0.5))
    shape = (1, 16, 16, 4)
    return _single("LEAKY_RELU", [(shape, (si, zi))], (shape, (so, zo)), (), ("LeakyReluOptions", {"Alpha": alpha}))(
        rng
    )


@pytest.mark.parametrize("alpha", [None, 0.001])
def test_leaky_relu_reference_matches_litert(alpha):
    """quantized.leaky_relu_reference equals LiteRT's int8 LEAKY_RELU: XNNPACK's kernel in its
    scale range, TFLite's QuantizeLeakyRelu (two-rounding fixed point) outside it (no GPU)."""
    from mltensor.tflite.quantized import leaky_relu_reference
    from mltensor.tflite.reader import read

    for seed in range(8):
        data, feeds = _random_leaky_relu(seed, alpha)
        ref = _litert(data, feeds)[0]
        assert np.ptp(ref.astype(np.int32)) > 0
        m = read(bytes(data))
        tx, to = m.tensors[m.inputs[0]], m.tensors[m.outputs[0]]
        alpha = m.operators[0].options.Alpha()
        np.testing.assert_array_equal(leaky_relu_reference(feeds[0], tx, to, alpha), ref)


def test_integer_leaky_relu_exact(ctx):
    for seed, alpha in ((0, None), (1, None), (2, 0.001)):
        data, feeds = _random_leaky_relu(seed, alpha)
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], _litert(data, feeds)[0])


@pytest.mark.parametrize(
    "size, flags",
    [((13, 17), {}), ((13, 17), {"AlignCorners": True}), ((13, 17), {"HalfPixelCenters": True}),
     ((4, 3), {"HalfPixelCenters": True}), ((4, 3), {"AlignCorners": True}), ((12, 12), {})],
)  # fmt: skip
def test_integer_resize_bilinear_exact(ctx, size, flags):
    """RESIZE_BILINEAR of int8 equals LiteRT's (XNNPACK's 11-bit weights and integer blend): up,
    down, odd ratios, the three coordinate modes."""
    shape = (1, 6, 7, 3)
    data, feeds = _single("RESIZE_BILINEAR", [(shape, (0.05, -9))], ((1, *size, 3), (0.05, -9)),
                          [np.array(size, np.int32)], ("ResizeBilinearOptions", flags), version=3)(
        np.random.default_rng(3))  # fmt: skip
    np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], _litert(data, feeds)[0])


def _fc(rng):
    """int8 [64, 256] -> FULLY_CONNECTED (per-channel int8 weights, int32 bias, RELU) -> int8."""
    w = ModelWriter()
    s_in = float(rng.uniform(0.01, 0.05))
    x = w.input("x", [64, 256], I8, quant=(s_in, int(rng.integers(-20, 20))))
    k, ks = _weights(rng, w, "k", (64, 256), 0, 64)
    bias = w.const("bias", rng.integers(-900, 900, 64).astype(np.int32), quant=(s_in * ks, np.zeros(64, np.int64), 0))
    y = w.tensor("y", [64, 64], I8, quant=(float(rng.uniform(0.3, 0.6)), int(rng.integers(-20, 20))))
    w.op("FULLY_CONNECTED", [x, k, bias], [y], "FullyConnectedOptions", version=5, FusedActivationFunction=1)
    return w.finish([x], [y]), [_q8(rng, (64, 256))]


def _conv_wide(rng):
    """int8 [1, 16, 16, 32] -> CONV_2D 3x3 (per-channel weights) -> int8 [1, 16, 16, 32]."""
    w = ModelWriter()
    s_in = float(rng.uniform(0.01, 0.05))
    x = w.input("x", [1, 16, 16, 32], I8, quant=(s_in, int(rng.integers(-20, 20))))
    k, ks = _weights(rng, w, "k", (32, 3, 3, 32), 0, 32)
    bias = w.const("bias", rng.integers(-900, 900, 32).astype(np.int32), quant=(s_in * ks, np.zeros(32, np.int64), 0))
    y = w.tensor("y", [1, 16, 16, 32], I8, quant=(float(rng.uniform(0.3, 0.6)), int(rng.integers(-20, 20))))
    w.op("CONV_2D", [x, k, bias], [y], "Conv2DOptions", version=3, Padding=SAME, StrideW=1, StrideH=1)
    return w.finish([x], [y]), [_q8(rng, (1, 16, 16, 32))]


@pytest.mark.parametrize("make", [_conv, _conv_wide, _fc], ids=["conv_depthwise", "conv", "fully_connected"])
def test_integer_conv_fc_exact(ctx, make):
    """CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED of int8 equal LiteRT's (XNNPACK's int32 sums
    and fp32 requantization, quantized.integer_weighted) over random weights and scales."""
    for seed in range(4):
        data, feeds = make(np.random.default_rng(seed))
        ref = _litert(data, feeds)[0]
        assert np.ptp(ref.astype(np.int32)) > 0
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], ref)


def _uint8_weighted(op):
    """uint8 input, per-tensor uint8 weights with a zero point far from 0 (90-170: what legacy
    quantization-aware models carry), int32 bias -> CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED
    -> uint8."""
    u8 = np.uint8

    def make(rng):
        w = ModelWriter()
        si, zi = float(rng.uniform(0.01, 0.05)), int(rng.integers(100, 156))
        sw, zw = float(rng.uniform(0.005, 0.02)), int(rng.integers(90, 170))
        shape, kshape, oshape, n, opts = {
            "FULLY_CONNECTED": ((8, 64), (16, 64), (8, 16), 16, ("FullyConnectedOptions", {})),
            "CONV_2D": ((1, 8, 8, 8), (6, 3, 3, 8), (1, 8, 8, 6), 6,
                        ("Conv2DOptions", {"Padding": SAME, "StrideW": 1, "StrideH": 1})),
            "DEPTHWISE_CONV_2D": ((1, 8, 8, 8), (1, 3, 3, 8), (1, 8, 8, 8), 8,
                                  ("DepthwiseConv2DOptions", {"Padding": SAME, "StrideW": 1, "StrideH": 1,
                                                              "DepthMultiplier": 1})),
        }[op]  # fmt: skip
        x = w.input("x", list(shape), u8, quant=(si, zi))
        k = w.const("k", rng.integers(0, 256, kshape).astype(u8), quant=(sw, zw))
        bias = w.const("b", rng.integers(-900, 900, n).astype(np.int32), quant=(si * sw, 0))
        so = float(rng.uniform(0.1, 0.3) if op == "DEPTHWISE_CONV_2D" else rng.uniform(0.3, 0.6))
        y = w.tensor("y", list(oshape), u8, quant=(so, int(rng.integers(100, 156))))
        w.op(op, [x, k, bias], [y], opts[0], version=1, **opts[1])
        return w.finish([x], [y]), [rng.integers(0, 256, shape).astype(u8)]

    return make


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"])
def test_uint8_weights_zero_point_exact(ctx, op):
    """uint8 activations and uint8 weights with a non-zero zero point (XNNPACK's qu8 kernels): the
    integer path subtracts the weights' zero point and equals LiteRT's outputs."""
    for seed in range(3):
        data, feeds = _uint8_weighted(op)(np.random.default_rng(seed))
        ref = _litert(data, feeds)[0]
        assert np.ptp(ref.astype(np.int32)) > 50
        got = _run(ctx, data, feeds)[1][0]
        assert got.dtype == np.uint8
        np.testing.assert_array_equal(got, ref)


def _random_squared_difference(seed):
    rng = np.random.default_rng(seed)
    sa, sb = np.exp(rng.uniform(np.log(0.005), np.log(0.05), 2))
    so = float(np.exp(rng.uniform(np.log(0.01), np.log(0.5))))
    (za, zb), zo = (int(v) for v in rng.integers(-60, 60, 2)), -128
    return _single("SQUARED_DIFFERENCE", [((1, 8, 8, 16), (sa, za)), ((1, 1, 8, 16), (sb, zb))],
                   ((1, 8, 8, 16), (so, zo)), version=2)(rng)  # fmt: skip


def test_squared_difference_reference_matches_litert():
    """quantized.squared_difference_reference (TFLite's fixed-point kernel) equals LiteRT (no GPU)."""
    from mltensor.tflite.quantized import squared_difference_reference
    from mltensor.tflite.reader import read

    for seed in range(10):
        data, feeds = _random_squared_difference(seed)
        ref = _litert(data, feeds)[0]
        assert np.ptp(ref.astype(np.int32)) > 0
        m = read(bytes(data))
        ta, tb = (m.tensors[i] for i in m.inputs)
        got = squared_difference_reference(feeds[0], feeds[1], ta, tb, m.tensors[m.outputs[0]])
        np.testing.assert_array_equal(got, ref)


def test_integer_squared_difference_exact(ctx):
    """SQUARED_DIFFERENCE of int8 (a 256 x 256 table of TFLite's kernel, broadcast) equals LiteRT's."""
    for seed in range(3):
        data, feeds = _random_squared_difference(seed)
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], _litert(data, feeds)[0])


@pytest.mark.parametrize("adj", [(False, False), (False, True), (True, False)])
def test_integer_batch_matmul_exact(ctx, adj):
    """BATCH_MATMUL of int8 equals LiteRT's (TFLite's kernel: int32 sums, MultiplyByQuantizedMultiplier
    with its two roundings, the high-mul in int64); XNNPACK-style fp32 rescaling would differ."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        sa, sb = np.exp(rng.uniform(np.log(0.005), np.log(0.05), 2))
        so = float(rng.uniform(0.05, 0.5))
        za, zb, zo = (int(v) for v in rng.integers(-30, 30, 3))
        ashape = (4, 128, 32) if adj[0] else (4, 32, 128)
        bshape = (4, 64, 128) if adj[1] else (4, 128, 64)
        data, feeds = _single("BATCH_MATMUL", [(ashape, (sa, za)), (bshape, (sb, zb))], ((4, 32, 64), (so, zo)),
                              opts=("BatchMatMulOptions", {"AdjX": adj[0], "AdjY": adj[1]}), version=4)(rng)  # fmt: skip
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], _litert(data, feeds)[0])


def test_integer_hard_swish_exact(ctx):
    for seed in range(3):
        data, feeds = _random_hard_swish(seed)
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], _litert(data, feeds)[0])


@pytest.mark.parametrize("op", ["ADD", "SUB"])
def test_integer_add_sub_exact(ctx, op):
    """ADD / SUB on the GPU equal LiteRT's int8 outputs over random scales and zero points."""
    for seed in range(4):
        data, feeds = _random_binary(op, seed)
        ref = _litert(data, feeds)[0]
        got = _run(ctx, data, feeds)[1][0]
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("name", list(CASES))
def test_full_integer_matches_litert(ctx, name):
    data, feeds = CASES[name](np.random.default_rng(5))
    ref = _litert(data, feeds)
    inputs, got = _run(ctx, data, feeds)
    assert [dt for _, dt, _ in inputs] == [str(f.dtype) for f in feeds]  # int8 inputs stay int8
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        assert g.dtype == r.dtype
        assert np.ptp(r.astype(np.float64)) > 0  # outputs that are all one value would test little
        if r.dtype == I8 and name in EXACT:
            np.testing.assert_array_equal(g, r)
        elif r.dtype == I8:
            assert np.abs(g.astype(np.int32) - r).max() <= 1
        else:  # float behind DEQUANTIZE of a 1/256 grid
            assert np.abs(g - r).max() <= 1 / 256 + 1e-6


def _random_table_op(op, dtype, seed):
    """MUL, MEAN, LOGISTIC, TANH or SOFTMAX of int8 / uint8 with random scales and zero points
    (MUL broadcast on odd seeds; MEAN over H and W, the last axis, or a 3-D input's middle axis,
    into the input's quantization on odd seeds; SOFTMAX rows of 512, 10 or 1000, one of them
    constant, beta 1 or random): (model, feeds, reference function of the
    model's tensors)."""
    from mltensor.tflite import quantized as qz

    rng = np.random.default_rng(seed)
    lo, hi = (-128, 127) if dtype == I8 else (0, 255)

    def zp():
        return int(rng.integers(lo + 20, hi - 19))

    def sc(a, b):
        return float(np.exp(rng.uniform(np.log(a), np.log(b))))

    w = ModelWriter()
    if op == "MUL":
        shapes = [(1, 8, 8, 4), (1, 8, 8, 4) if seed % 2 else (1, 1, 1, 4)]
        xs = [w.input(f"x{k}", list(s), dtype, quant=(sc(0.002, 0.2), zp())) for k, s in enumerate(shapes)]
        y = w.tensor("y", [1, 8, 8, 4], dtype, quant=(sc(0.001, 0.1), zp()))
        w.op(op, xs, [y], "MulOptions", version=2)
        ref = qz.mul_reference
    elif op == "MEAN":
        shape, axes = [((2, 6, 6, 16), [1, 2]), ((2, 7, 5, 6), [3]), ((3, 50, 16), [1])][seed % 3]
        si, zi = sc(0.005, 0.2), zp()
        xs = [w.input("x0", list(shape), dtype, quant=(si, zi))]
        oshape = [d for k, d in enumerate(shape) if k not in axes]
        r, mid = float(rng.uniform(0.2, 1.5)), (lo + hi) / 2
        oq = (si, zi) if seed % 2 else (si / r, round(mid - (mid - zi) * r) + int(rng.integers(-5, 6)))
        y = w.tensor("y", oshape, dtype, quant=oq)  # odd seeds: the input's (ties the float form rounds to even)
        w.op(op, [*xs, w.const("axes", np.array(axes, np.int32))], [y], "ReducerOptions", version=2)

        def ref(q, tx, to):
            return qz.mean_reference(q, axes, tx, to)

        shapes = [shape]
    elif op == "SOFTMAX":
        shapes = [(4, [512, 10, 1000][seed % 3])]  # 512: a row of equal values gives 0.5 (rounded away)
        xs = [w.input("x0", list(shapes[0]), dtype, quant=(sc(0.01, 0.5), zp()))]
        y = w.tensor("y", list(shapes[0]), dtype, quant=(1 / 256, lo))
        beta = 1.0 if seed % 3 else float(rng.uniform(0.3, 2.0))
        w.op(op, xs, [y], "SoftmaxOptions", version=2, Beta=beta)

        def ref(q, tx, to):
            return qz.softmax_reference(q, tx, to, beta)

    else:  # LOGISTIC, TANH: the output scales the converter gives
        shapes = [(1, 16, 16, 1)]
        xs = [w.input("x0", list(shapes[0]), dtype, quant=(sc(0.005, 0.2), zp()))]
        oq = (1 / 256, lo) if op == "LOGISTIC" else (1 / 128, (lo + hi + 1) // 2)
        y = w.tensor("y", list(shapes[0]), dtype, quant=oq)
        w.op(op, xs, [y], version=2)
        ref = qz.logistic_reference if op == "LOGISTIC" else qz.tanh_reference
    feeds = [rng.integers(lo, hi + 1, size=s).astype(dtype) for s in shapes]
    if op == "SOFTMAX":
        feeds[0][0] = feeds[0][0, 0]  # one row of equal values
    return w.finish(xs, [y]), feeds, ref


TABLE_OPS = [(op, dt) for op in ("MUL", "MEAN", "LOGISTIC", "TANH", "SOFTMAX") for dt in (I8, np.uint8)]


@pytest.mark.parametrize("op,dtype", TABLE_OPS, ids=[f"{o}-{d.__name__}" for o, d in TABLE_OPS])
def test_integer_references_match_litert(op, dtype):
    """quantized.py's numpy forms of LiteRT's int8 / uint8 MUL (XNNPACK), MEAN (XNNPACK),
    LOGISTIC, TANH and SOFTMAX (TFLite's tables) equal LiteRT's outputs over random scales and
    zero points (no GPU)."""
    from mltensor.tflite.reader import read

    for seed in range(12):
        data, feeds, ref = _random_table_op(op, dtype, seed)
        want = _litert(data, feeds)[0]
        assert np.ptp(want.astype(np.int32)) > 0
        m = read(bytes(data))
        ts = [m.tensors[i] for i in m.inputs] + [m.tensors[m.outputs[0]]]
        np.testing.assert_array_equal(ref(*feeds, *ts), want)


@pytest.mark.parametrize("op,dtype", TABLE_OPS, ids=[f"{o}-{d.__name__}" for o, d in TABLE_OPS])
def test_integer_table_ops_exact(ctx, op, dtype):
    """The same operators on the GPU equal LiteRT's int8 / uint8 outputs."""
    for seed in range(3):
        data, feeds, _ = _random_table_op(op, dtype, seed)
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], _litert(data, feeds)[0])


# -- dynamic range: int8 weights, float activations (mltensor/tflite/hybrid.py) -------------------


def _hybrid(op, k=3):
    def make(rng):
        w = ModelWriter()
        if op == "FULLY_CONNECTED":
            x = w.input("x", [3, 40])
            kern, _ = _weights(rng, w, "k", (12, 40), 0, 12)
            y = w.tensor("y", [3, 12])
            w.op(op, [x, kern, w.const("b", rng.standard_normal(12).astype(np.float32))], [y], "FullyConnectedOptions",
                 version=12, AsymmetricQuantizeInputs=True)  # fmt: skip
            return w.finish([x], [y]), [rng.standard_normal((3, 40)).astype(np.float32)]
        x = w.input("x", [1, 9, 9, 8])
        if op == "CONV_2D":
            kern, _ = _weights(rng, w, "k", (6, k, k, 8), 0, 6)
            y = w.tensor("y", [1, 9, 9, 6])
            opts = ("Conv2DOptions", {"Padding": SAME, "StrideW": 1, "StrideH": 1, "FusedActivationFunction": RELU6})
            version = 5
        else:
            kern, _ = _weights(rng, w, "k", (1, k, k, 8), 3, 8)
            y = w.tensor("y", [1, 5, 5, 8])
            opts = ("DepthwiseConv2DOptions", {"Padding": SAME, "StrideW": 2, "StrideH": 2, "DepthMultiplier": 1})
            version = 6
        b = w.const("b", rng.standard_normal(6 if op == "CONV_2D" else 8).astype(np.float32))
        w.op(op, [x, kern, b], [y], opts[0], version=version, **opts[1])
        return w.finish([x], [y]), [rng.standard_normal((1, 9, 9, 8)).astype(np.float32)]

    return make


@pytest.mark.parametrize("op,k", [("FULLY_CONNECTED", 0), ("CONV_2D", 1), ("CONV_2D", 3), ("DEPTHWISE_CONV_2D", 3)])
def test_dynamic_range_matches_litert(ctx, op, k):
    """LiteRT quantizes the float input at run time (per row for FULLY_CONNECTED and 1x1 CONV_2D,
    which XNNPACK runs; per image for other convolutions, which LiteRT's own kernels run); the
    importer does the same."""
    data, feeds = _hybrid(op, k)(np.random.default_rng(9))
    ref = _litert(data, feeds)
    _, got = _run(ctx, data, feeds)
    np.testing.assert_allclose(got[0], ref[0], atol=1e-4, rtol=1e-4)


def test_dynamic_range_elsewhere_refused(ctx):
    """BATCH_MATMUL with int8 weights and a float input: LiteRT quantizes its input too, which the
    importer does not reproduce there; refused rather than computed differently."""
    from mltensor.errors import NotSupportedError

    w = ModelWriter()
    x = w.input("x", [2, 3, 8])
    k = w.const("k", np.ones((8, 4), I8), quant=(0.1, 0))
    y = w.tensor("y", [2, 3, 4])
    w.op("BATCH_MATMUL", [x, k], [y])
    with pytest.raises(NotSupportedError, match=r"operator 0 \(BATCH_MATMUL\).*dynamic range"):
        import_model(w.finish([x], [y]), ctx)


def test_session_int8_edges(ctx):
    """InferenceSession lists an int8 model's int8 input and output and runs it on int8 arrays."""
    import mltensor

    data, feeds = _conv(np.random.default_rng(5))
    sess = mltensor.InferenceSession(bytes(data))
    assert [i.type for i in sess.get_inputs()] == ["tensor(int8)"]
    assert [o.type for o in sess.get_outputs()] == ["tensor(int8)"]
    (got,) = sess.run(None, {sess.get_inputs()[0].name: feeds[0]})
    assert got.dtype == np.int8
    assert np.abs(got.astype(np.int32) - _litert(data, feeds)[0]).max() <= 1


def _int16_add(int16_out=False):
    """float -> QUANTIZE (int16, zero point 0) -> ADD (int16) -> DEQUANTIZE -> float: a 16x8 graph."""
    w = ModelWriter()
    x = w.input("x", [2, 64])
    y = w.input("y", [2, 64])
    xq = w.tensor("xq", [2, 64], np.int16, quant=(3 / 32768, 0))
    yq = w.tensor("yq", [2, 64], np.int16, quant=(2 / 32768, 0))
    w.op("QUANTIZE", [x], [xq], version=2)
    w.op("QUANTIZE", [y], [yq], version=2)
    s = w.tensor("s", [2, 64], np.int16, quant=(5 / 32768, 0))
    w.op("ADD", [xq, yq], [s], "AddOptions", version=3)
    if int16_out:
        return w.finish([x, y], [s])
    out = w.tensor("out", [2, 64])
    w.op("DEQUANTIZE", [s], [out], version=2)
    return w.finish([x, y], [out])


def test_int16_activations(ctx):
    """16x8: int16 activations are computed as their real values on the int16 grid: within one
    quantum of LiteRT; an int16 graph output (WebNN has no int16) is refused, naming the fix."""
    from mltensor.errors import NotSupportedError

    rng = np.random.default_rng(4)
    feeds = [rng.uniform(-2.5, 2.5, (2, 64)).astype(np.float32) for _ in range(2)]
    data = _int16_add()
    ref = _litert(data, feeds)[0]
    got = _run(ctx, data, feeds)[1][0]
    assert np.ptp(ref) > 1
    assert np.abs(got - ref).max() <= 5 / 32768 * 1.0001
    with pytest.raises(NotSupportedError, match="int16"):
        import_model(_int16_add(int16_out=True), ctx)


def _int16_lut(op, s_in):
    """float -> QUANTIZE (int16, scale s_in) -> LOGISTIC / TANH (int16, output scale 1 / 32768) ->
    DEQUANTIZE -> float, fed every int16 value once: (model, feeds, the int16 inputs)."""
    w = ModelWriter()
    n = 1 << 16
    x = w.input("x", [1, n])
    xq = w.tensor("xq", [1, n], np.int16, quant=(s_in, 0))
    w.op("QUANTIZE", [x], [xq], version=2)
    y = w.tensor("y", [1, n], np.int16, quant=(1 / 32768, 0))
    w.op(op, [xq], [y], version=3)
    out = w.tensor("out", [1, n])
    w.op("DEQUANTIZE", [y], [out], version=2)
    q = np.arange(-(1 << 15), 1 << 15, dtype=np.int64)
    return w.finish([x], [out]), [(q * np.float64(np.float32(s_in))).astype(np.float32)[None]], q


def _int16_lut_scales():
    rng = np.random.default_rng(16)
    return [float(np.exp(rng.uniform(np.log(1e-4), np.log(3e-3)))) for _ in range(5)] + [3.5 / 32768]


@pytest.mark.parametrize("op", ["LOGISTIC", "TANH"])
def test_int16_lut_references_match_litert(op):
    """int16.py's numpy LOGISTIC / TANH (TFLite's 16-bit sigmoid table, generated from its formula,
    interpolated as reference_integer_ops does) equal LiteRT's outputs for every int16 input, over
    random input scales (no GPU)."""
    from mltensor.tflite import int16
    from mltensor.tflite.reader import read

    ref = int16.logistic_reference if op == "LOGISTIC" else int16.tanh_reference
    for s in _int16_lut_scales():
        data, feeds, q = _int16_lut(op, s)
        want = np.rint(_litert(data, feeds)[0][0].astype(np.float64) * 32768).astype(np.int64)
        m = read(bytes(data))
        assert int16.lut_params(m.tensors[m.operators[1].inputs[0]])[0] > 0  # (not the power-of-two path)
        got = ref(q, m.tensors[m.operators[1].inputs[0]])
        assert np.ptp(want) > 30000
        np.testing.assert_array_equal(got, want, err_msg=f"{op}, input scale {s}")


@pytest.mark.parametrize("op", ["LOGISTIC", "TANH"])
def test_int16_lut_exact(ctx, op):
    """The same on the GPU: every int16 input's output equals LiteRT's (the real-value form this
    replaces was up to two quanta off)."""
    for s in _int16_lut_scales()[::2]:
        data, feeds, _ = _int16_lut(op, s)
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], _litert(data, feeds)[0], err_msg=f"scale {s}")


def _int16_binary(op, sx, sy, so, shape_y=(2, 64)):
    """float x, y -> QUANTIZE (int16) -> ADD / SUB (int16) -> DEQUANTIZE -> float."""
    w = ModelWriter()
    x = w.input("x", [2, 64])
    y = w.input("y", list(shape_y))
    xq = w.tensor("xq", [2, 64], np.int16, quant=(sx, 0))
    yq = w.tensor("yq", list(shape_y), np.int16, quant=(sy, 0))
    w.op("QUANTIZE", [x], [xq], version=2)
    w.op("QUANTIZE", [y], [yq], version=2)
    s = w.tensor("s", [2, 64], np.int16, quant=(so, 0))
    w.op(op, [xq, yq], [s], f"{op.capitalize()}Options", version=3)
    out = w.tensor("out", [2, 64])
    w.op("DEQUANTIZE", [s], [out], version=2)
    return w.finish([x, y], [out])


@pytest.mark.parametrize("op", ["ADD", "SUB"])
def test_int16_add_sub_match_litert(ctx, op):
    """16x8 ADD and SUB with their options' PotScaleInt16 left at the schema's default (true) and
    scales that are not powers of two, so that LiteRT takes its general int16 path (left shift 15;
    int16.add_reference) over 16 random scale draws, broadcasting too: the numpy reference and the
    GPU equal LiteRT's outputs. (Refusing every flagged operator left them on the real-value form:
    ADD's draw 12 was a quantum off on one output.)"""
    from mltensor.tflite import int16
    from mltensor.tflite.reader import read

    rng = np.random.default_rng(21 if op == "ADD" else 22)
    for k in range(16):
        sx, sy, so = (float(np.exp(rng.uniform(np.log(2e-5), np.log(2e-3)))) for _ in range(3))
        shape_y = (2, 64) if k % 2 else (1, 64)
        data = _int16_binary(op, sx, sy, so, shape_y)
        qa, qc = rng.integers(-30000, 30000, (2, 64)), rng.integers(-30000, 30000, shape_y)
        feeds = [
            (qa * np.float64(np.float32(sx))).astype(np.float32),
            (qc * np.float64(np.float32(sy))).astype(np.float32),
        ]
        want = _litert(data, feeds)[0]
        m = read(bytes(data))
        ta, tc, to = (m.tensors[i] for i in (*m.operators[2].inputs, m.operators[2].outputs[0]))
        assert int16.pot_shifts(ta, tc, to, True) is None
        ref = int16.add_reference(qa, qc, ta, tc, to, op == "SUB") * np.float64(np.float32(so))
        np.testing.assert_array_equal(ref.astype(np.float32), want, err_msg=f"{op} {k}: numpy reference")
        np.testing.assert_array_equal(_run(ctx, data, feeds)[1][0], want, err_msg=f"{op} {k}: GPU")
