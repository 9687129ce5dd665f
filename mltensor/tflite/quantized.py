"""Full-integer TFLite models (int8 / uint8 activations with a scale and zero point), computed as
their real values: every quantized tensor of the graph is a float32 operand that holds exactly
scale * (q - zero_point), so each operator's float form (the converters of importer.py and
general_ops.py) reads it unchanged, and each operator's quantized output is put back on its grid
(`requantize`: q = clamp(round(y / scale) + zero_point), half to even as XNNPACK's fp32
requantization). Quantized constants (int8 weights with per-channel scales, int32 biases) are
dequantized at load; int8 / uint8 graph inputs and outputs keep their type at the edges.

Where that float form could round differently from LiteRT, the operator is computed in LiteRT's
own integer arithmetic instead, as its default CPU path runs it (ai-edge-litert 2.3, measured:
XNNPACK where its delegate takes the operator, else TFLite's kernels, whose
MultiplyByQuantizedMultiplier rounds twice: not TFLITE_SINGLE_ROUNDING): INTEGER_OPS. Sums are
exact (integer-valued float32 under 2^24, or int32 graph operands, the doubling high-mul in
int64); an operator of one int8 input (or two) whose kernel is a fixed-point function of q is
computed here in numpy (`*_reference`, tested against LiteRT) into a 256 (or 256 x 256) table the
GPU gathers from (LOGISTIC and TANH: TFLite's own float32 tables). SOFTMAX sums its row's table
values with reduce_sum where LiteRT adds them in order: the same outputs on every case tried. The
other int8 operators compute on real values and round (the operator moves or selects values
unchanged: MAX_POOL_2D, CONCATENATION, PAD, RESHAPE...), or are one quantum apart at worst.

16x8 models (int16 activations, zero point 0; int8 weights, int64 biases): int16.py computes
QUANTIZE, CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, SUB, MUL, MEAN, LOGISTIC, TANH and SOFTMAX
in LiteRT's int16 arithmetic; the other int16 operators take the real-value form here, within a
quantum. int16 graph inputs and outputs are refused (WebNN has no int16).
"""

import numpy as np

from .. import dtypes

from ..errors import NotSupportedError

QUANT_TYPES = ("int8", "uint8", "int16")  # int16: 16x8 models' activations (zero point 0)

# int8 / uint8 operators computed in LiteRT's own integer arithmetic (as its default CPU path runs
# them: XNNPACK where its delegate takes the operator, else TFLite's kernels), equal to LiteRT's
# outputs; the docs' operator table reads this
INTEGER_OPS = {
    "ADD": "XNNPACK's qs8 add: 20-bit multipliers, one arithmetic shift",
    "SUB": "XNNPACK's qs8 add with the second multiplier negated",
    "CONV_2D": "XNNPACK: exact int32 sums, fp32 requantization (half to even)",
    "DEPTHWISE_CONV_2D": "XNNPACK: exact int32 sums, fp32 requantization (half to even)",
    "FULLY_CONNECTED": "XNNPACK: exact int32 sums, fp32 requantization (half to even)",
    "AVERAGE_POOL_2D": "TFLite's kernel: the sum over the count, half away from zero",
    "RESIZE_BILINEAR": "XNNPACK: 11-bit weights, int32 blend, >> 22",
    "HARD_SWISH": "TFLite's int16 fixed-point kernel, as a 256-entry table",
    "LEAKY_RELU": "XNNPACK's 1/256 multipliers (TFLite's fixed point outside its range), as a table",
    "SQUARED_DIFFERENCE": "TFLite's fixed-point kernel, as a 256 x 256 table",
    "BATCH_MATMUL": "TFLite's kernel: int32 sums, MultiplyByQuantizedMultiplier (int64 high-mul)",
    "MUL": "XNNPACK: exact int32 products, fp32 requantization (half to even)",
    "MEAN": "XNNPACK: the int32 sum, one float32 scale and bias, half to even",
    "LOGISTIC": "TFLite's float32 table (LUTPopulate), 256 entries",
    "TANH": "TFLite's float32 table (LUTPopulate), 256 entries",
    "SOFTMAX": "TFLite's expf table, float32 sum and rescale",
}
_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767)}


def is_quantized(t):
    """An activation tensor stored as int8 / uint8 with a scale and zero point."""
    return t.scale is not None and t.data_type in QUANT_TYPES


def dequantize_array(arr, t):
    """A quantized constant as float32 values (per-tensor or per-channel)."""
    shape = [1] * arr.ndim
    if t.scale.size > 1:
        shape[t.quantized_dimension] = -1
    zp = t.zero_point.reshape(shape).astype(np.float64)
    return ((arr.astype(np.float64) - zp) * t.scale.reshape(shape).astype(np.float64)).astype(np.float32)


def _per_tensor(t, what):
    if t.scale.size != 1:
        raise NotSupportedError(
            f"[tflite] {what} tensor '{t.name}' has {t.scale.size} per-channel scales; quantized activations "
            f"with one scale are supported"
        )
    return float(t.scale[0]), float(t.zero_point[0])


def _c(b, v):
    return b.constant(np.array(v, np.float32))


def requantize(b, v, t):
    """v (float32 real values) rounded onto tensor t's grid, as real values again."""
    scale, zp = _per_tensor(t, "activation")
    lo, hi = _RANGE[t.data_type]
    q = b.clamp(b.add(b.round_even(b.div(v, _c(b, scale))), _c(b, zp)), min_value=float(lo), max_value=float(hi))
    return b.mul(b.sub(q, _c(b, zp)), _c(b, scale))


def from_integer(b, x, t, data_type="float32"):
    """An int8 / uint8 graph input as its real values (in `data_type`: float16 in float16 mode,
    whose builder makes every float constant float16)."""
    scale, zp = _per_tensor(t, "input")
    return b.mul(b.sub(b.cast(x, data_type), _c(b, zp)), _c(b, scale))


def to_integer(b, v, t):
    """Real values as the int8 / uint8 tensor t stores them (a graph output)."""
    if t.data_type == "int16":
        raise NotSupportedError(
            f"[tflite] output '{t.name}' is int16 (a 16x8 model's activation); WebNN has no int16 type: convert "
            f"with float outputs (inference_output_type float32)"
        )
    scale, zp = _per_tensor(t, "output")
    lo, hi = _RANGE[t.data_type]
    q = b.clamp(b.add(b.round_even(b.div(v, _c(b, scale))), _c(b, zp)), min_value=float(lo), max_value=float(hi))
    return b.cast(q, t.data_type)


# -- LiteRT's integer arithmetic, exactly -----------------------------------------------------------


def is_int8(t):
    """An int8 / uint8 activation: the integer paths below reproduce LiteRT's 8-bit kernels (its
    int16 ones, 16x8 models, differ and take the float form)."""
    return is_quantized(t) and t.data_type in ("int8", "uint8")


def _f32(v):
    return np.float32(v)


def xnn_add_params(sa, sb, so, subtract=False):
    """XNNPACK's qs8/qu8 add (and subtract) requantization (xnn_init_qs8_add_minmax_scalar_params):
    (a_multiplier, b_multiplier, shift) with out = (bias + a * a_mult + b * b_mult) >> shift, the
    shift arithmetic (floor). None where the scale ratios are outside the range XNNPACK's TFLite
    delegate takes ([2^-10, 2^8)): LiteRT's own kernel runs those."""
    a_scale, b_scale = _f32(_f32(sa) / _f32(so)), _f32(_f32(sb) / _f32(so))
    for r in (a_scale, b_scale):
        if not 2.0**-10 <= r < 2.0**8:
            return None
    top = max(a_scale, b_scale)
    exponent = int(np.array(top, np.float32).view(np.uint32) >> 23) - 127
    shift = 20 - exponent
    a_mult = int(np.rint(_f32(a_scale * _f32(2.0**shift))))  # lrintf: half to even
    b_mult = int(np.rint(_f32(b_scale * _f32(2.0**shift))))
    return a_mult, -b_mult if subtract else b_mult, shift


def xnn_add_reference(a, b, ta, tb, to, subtract=False):
    """numpy: XNNPACK's integer add of int8 / uint8 arrays a, b (numpy broadcasting), unclamped by
    an activation; None where xnn_add_params is."""
    p = xnn_add_params(float(ta.scale[0]), float(tb.scale[0]), float(to.scale[0]), subtract)
    if p is None:
        return None
    am, bm, shift = p
    za, zb, zo = int(ta.zero_point[0]), int(tb.zero_point[0]), int(to.zero_point[0])
    acc = (1 << (shift - 1)) - am * za - bm * zb + a.astype(np.int64) * am + b.astype(np.int64) * bm
    lo, hi = _RANGE[to.data_type]
    return np.clip((acc >> shift) + zo, lo, hi)


def integer_constant(b, v, dtype=np.int32):
    """A constant of integer value(s) v (int32, or `dtype`)."""
    return b.constant(np.asarray(v, dtype))


def integers(b, v, t):
    """The real values v of quantized tensor t (exactly scale * (q - zero_point) as float) as their
    int32 q: v / scale is within a rounding of the integer q - zero_point."""
    scale, zp = _per_tensor(t, "activation")
    return b.cast(b.add(b.round_even(b.div(v, _c(b, scale))), _c(b, zp)), "int32")


def real_values(b, q, t, data_type="float32"):
    """Integers q of quantized tensor t as its real values, scale * (q - zero point)."""
    scale, zp = _per_tensor(t, "output")
    x = b.cast(q, data_type)
    return b.mul(b.sub(x, _c(b, zp)) if zp else x, _c(b, scale))


def floor_div(b, x, d):
    """floor(x / d) for integer x and a positive integer constant d of x's type (a power of two:
    an arithmetic shift), with WebNN's truncating division: one less where the remainder is
    negative."""
    q = b.div(x, d)
    neg = b.lesser(b.sub(x, b.mul(q, d)), integer_constant(b, 0, dtypes.NUMPY[x.data_type]))
    return b.sub(q, b.cast(neg, x.data_type))


def floor_shift(b, acc, shift):
    """acc >> shift (arithmetic, int32; 0 < shift < 31)."""
    return floor_div(b, acc, integer_constant(b, 1 << shift))


def add_sub(b, x, y, tx, ty, to, subtract):
    """ADD / SUB of int8 / uint8 tensors as XNNPACK computes them (xnn_add_params), as real values
    of the output's grid; None where the float form (one quantum) has to do."""
    if not (is_int8(tx) and is_int8(ty) and is_int8(to)):
        return None
    if any(t.scale.size != 1 for t in (tx, ty, to)):
        return None
    p = xnn_add_params(float(tx.scale[0]), float(ty.scale[0]), float(to.scale[0]), subtract)
    if p is None:
        return None
    am, bm, shift = p
    za, zb, zo = int(tx.zero_point[0]), int(ty.zero_point[0]), int(to.zero_point[0])
    # |q * mult| < 2^8 * 2^21 and the bias < 2^30: the sum stays within int32
    acc = b.add(b.mul(integers(b, x, tx), integer_constant(b, am)), b.mul(integers(b, y, ty), integer_constant(b, bm)))
    acc = b.add(acc, integer_constant(b, (1 << (shift - 1)) - am * za - bm * zb))
    lo, hi = _RANGE[to.data_type]
    q = b.clamp(b.add(floor_shift(b, acc, shift), integer_constant(b, zo)), min_value=float(lo), max_value=float(hi))
    return real_values(b, q, to, x.data_type)


def average_pool(b, x, tx, to, pool):
    """AVERAGE_POOL_2D of an int8 / uint8 tensor as TFLite's integer kernel: the window's sum of q
    (zero point included: input and output share their quantization) over the count of in-bounds
    pixels, rounded half away from zero. `pool(v)` is the float average pool (padding excluded from
    the count), exact here: sums of at most 2^16 int8 values. None where input and output differ."""
    if x.data_type != "float32" or not (is_int8(tx) and is_int8(to)) or tx.scale.size != 1 or to.scale.size != 1:
        return None  # (float16 mode: its averages would not be exact)
    if (float(tx.scale[0]), int(tx.zero_point[0])) != (float(to.scale[0]), int(to.zero_point[0])):
        return None
    scale, zp = _per_tensor(tx, "activation")
    q = b.add(b.round_even(b.div(x, _c(b, scale))), _c(b, zp))
    avg = pool(q)
    r = b.mul(b.sign(avg), b.floor(b.add(b.abs(avg), _c(b, 0.5))))
    return b.mul(b.sub(r, _c(b, zp)), _c(b, scale))


# TFLite's fixed-point helpers (tensorflow/lite/kernels/internal/common.h, gemmlowp), on numpy int64
# arrays holding int16 / int32 values


def quantize_multiplier(m):
    """QuantizeMultiplier: m (a double) as (int32 q_fixed, shift) with m = q_fixed * 2^(shift - 31),
    q_fixed rounded half away from zero."""
    if m == 0.0:
        return 0, 0
    q, shift = np.frexp(np.float64(m))
    q_fixed = int(np.sign(q) * np.floor(abs(q) * 2.0**31 + 0.5))
    shift = int(shift)
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q_fixed, shift


def downscale_int16_multiplier(m32):
    """DownScaleInt32ToInt16Multiplier."""
    if m32 >= (1 << 31) - 1 - (1 << 15):
        return (1 << 15) - 1
    return (m32 + (1 << 15)) >> 16


def _trunc_div(a, d):
    return np.sign(a) * (np.abs(a) // d)


def srdhm16(a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul for int16."""
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    r = _trunc_div(ab + nudge, 1 << 15)
    return np.where((a == b) & (a == -(1 << 15)), (1 << 15) - 1, r)


def sdhm16(a, b):
    """TFLite's SaturatingDoublingHighMul for int16 (truncating, no rounding)."""
    r = _trunc_div(a * b, 1 << 15)
    return np.where((a == b) & (a == -(1 << 15)), (1 << 15) - 1, r)


def rounding_divide_by_pot(x, exponent):
    """gemmlowp's RoundingDivideByPOT: x / 2^exponent rounded half away from zero."""
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def _sat16(v):
    return np.clip(v, -(1 << 15), (1 << 15) - 1)


def hard_swish_reference(q, tx, to):
    """TFLite's int8 / uint8 HARD_SWISH (reference_ops::HardSwish and its Prepare) on numpy q."""
    si, so = np.float32(tx.scale[0]), np.float32(to.scale[0])
    hires = np.float32(np.float32(1.0 / 128.0) * si)
    out_m, out_e = quantize_multiplier(float(np.float32(hires / so)))
    rel_m, rel_e = quantize_multiplier(float(np.float32(hires / np.float32(3.0 / 32768.0))))
    out_m16, rel_m16 = downscale_int16_multiplier(out_m), downscale_int16_multiplier(rel_m)
    if out_e > 0:
        return None
    v = (q.astype(np.int64) - int(tx.zero_point[0])) * (1 << 7)
    pre_out = srdhm16(v, np.int64(out_m16))
    r = v
    if rel_e > 0:
        r = _sat16(r * (1 << (rel_e - 1)))
    r = srdhm16(r, np.int64(rel_m16))
    if rel_e > 0:
        r = _sat16(r * 2)
    if rel_e < 0:
        r = rounding_divide_by_pot(r, -rel_e)
    r = (r + (1 << 15)) >> 1
    out = rounding_divide_by_pot(sdhm16(r, pre_out), -out_e) + int(to.zero_point[0])
    lo, hi = _RANGE[to.data_type]
    return np.clip(out, lo, hi)


def lookup(b, x, tx, to, table):
    """An operator of one int8 / uint8 input as a table of its 256 outputs (`table(q)`: numpy, q
    every value of the input's type), gathered on the GPU, as real values of the output's grid;
    None where `table` is."""
    if not (is_int8(tx) and is_int8(to)) or tx.scale.size != 1 or to.scale.size != 1:
        return None
    lo, hi = _RANGE[tx.data_type]
    out = table(np.arange(lo, hi + 1, dtype=np.int64))
    if out is None:
        return None
    real = (out.astype(np.float64) - int(to.zero_point[0])) * np.float64(np.float32(to.scale[0]))
    dt = np.float16 if x.data_type == "float16" else np.float32
    idx = b.sub(integers(b, x, tx), integer_constant(b, lo))
    return b.gather(b.constant(real.astype(dt)), idx, axis=0)


def srdhm32(a, b):
    """gemmlowp's SaturatingRoundingDoublingHighMul for int32 (int64 numpy arrays)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b  # |ab| <= 2^62
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    r = _trunc_div(ab + nudge, 1 << 31)
    return np.where((a == b) & (a == -(1 << 31)), (1 << 31) - 1, r)


def multiply_by_quantized_multiplier(x, qm, shift):
    """MultiplyByQuantizedMultiplier as this LiteRT's kernels compute it (two roundings: the
    doubling high-mul, then RoundingDivideByPOT; not TFLITE_SINGLE_ROUNDING, measured)."""
    x = np.clip(np.asarray(x, np.int64) * (1 << max(shift, 0)), -(1 << 31), (1 << 31) - 1)
    return rounding_divide_by_pot(srdhm32(x, qm), max(-shift, 0))


def leaky_relu_reference(q, tx, to, alpha):
    """int8 / uint8 LEAKY_RELU as LiteRT runs it: XNNPACK's qs8/qu8 kernel (multipliers of 1/256,
    rounding half up) where its delegate takes the scales, else TFLite's QuantizeLeakyRelu."""
    si, so, zi, zo = np.float32(tx.scale[0]), np.float32(to.scale[0]), int(tx.zero_point[0]), int(to.zero_point[0])
    x = np.asarray(q, np.int64) - zi
    pos = np.float32(si / so)
    neg = np.float32(pos * np.float32(alpha))
    if 2.0**-8 <= pos <= 2.0**7 and -(2.0**7) < neg <= 2.0**7 and abs(neg) >= 2.0**-8:
        pm, nm = int(np.rint(np.float32(-256.0) * pos)), int(np.rint(np.float32(-256.0) * neg))
        out = ((zo << 8) + 0x80 - x * np.where(x >= 0, pm, nm)) >> 8
    else:
        am, ash = quantize_multiplier(float(np.float32(np.float32(si * np.float32(alpha)) / so)))
        im, ish = quantize_multiplier(float(np.float64(si) / np.float64(so)))
        out = zo + np.where(
            x >= 0, multiply_by_quantized_multiplier(x, im, ish), multiply_by_quantized_multiplier(x, am, ash)
        )
    lo, hi = _RANGE[to.data_type]
    return np.clip(out, lo, hi)


def xnn_resize_weights(in_size, out_size, align_corners, half_pixel):
    """XNNPACK's bilinear resize along one axis (xnn_indirection_init_resize_bilinear2d_hwc_q11):
    (first index, second index, weight of the second in 1/2048) per output position, in float32
    as XNNPACK computes them. Neither flag: TensorFlow's legacy mode (asymmetric)."""
    f = np.float32
    ac = 1 if align_corners and out_size != 1 else 0
    scale = f(f(in_size - ac) / f(out_size - ac))
    first, second, alpha = [], [], []
    for o in range(out_size):
        if half_pixel and not align_corners:
            v = f(f(o) * scale + f(f(0.5) * scale - f(0.5)))
            v = min(max(v, f(0)), f(in_size - 1))
        else:
            v = f(f(o) * scale)
        top = int(v)
        first.append(top)
        second.append(min(top + 1, in_size - 1))
        alpha.append(int(np.rint(f(f(v - f(top)) * f(2048)))))
    return np.array(first, np.int32), np.array(second, np.int32), np.array(alpha, np.int32)


def resize_bilinear(b, x, tx, to, size, align_corners, half_pixel):
    """int8 / uint8 RESIZE_BILINEAR (NHWC) as XNNPACK computes it: 11-bit weights, the int32 blend
    of the raw q values ((top << 11) + (bottom - top) * alpha, twice) rounded half up by >> 22. None
    where input and output quantizations differ (TFLite requires them equal)."""
    if not (is_int8(tx) and is_int8(to)) or tx.scale.size != 1 or to.scale.size != 1:
        return None
    if (float(tx.scale[0]), int(tx.zero_point[0])) != (float(to.scale[0]), int(to.zero_point[0])):
        return None
    n, h, w, c = (int(d) for d in x.shape)
    q = integers(b, x, tx)
    ty, by, ay = xnn_resize_weights(h, size[0], align_corners, half_pixel)
    lx, rx, ax = xnn_resize_weights(w, size[1], align_corners, half_pixel)
    top, bottom = b.gather(q, b.constant(ty), axis=1), b.gather(q, b.constant(by), axis=1)
    tl, tr = b.gather(top, b.constant(lx), axis=2), b.gather(top, b.constant(rx), axis=2)
    bl, br = b.gather(bottom, b.constant(lx), axis=2), b.gather(bottom, b.constant(rx), axis=2)
    alpha_h = b.constant(ax.reshape(1, 1, -1, 1))
    alpha_v = b.constant(ay.reshape(1, -1, 1, 1))
    k = integer_constant(b, 2048)
    vt = b.add(b.mul(tl, k), b.mul(b.sub(tr, tl), alpha_h))  # |.| < 2^19
    vb = b.add(b.mul(bl, k), b.mul(b.sub(br, bl), alpha_h))
    acc = b.add(b.add(b.mul(vt, k), b.mul(b.sub(vb, vt), alpha_v)), integer_constant(b, 1 << 21))  # |.| < 2^31
    return real_values(b, floor_shift(b, acc, 22), to, x.data_type)


def integer_weighted(imp, op):
    """CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED of int8 / uint8 activations as XNNPACK's
    qs8/qc8 kernels compute them: (input, weight, bias, rescale) where input, weight and bias are
    the integer values q - zero point as float32 (every partial sum an integer under 2^24, so the
    float convolution is exact in any order) and `rescale(acc)` is XNNPACK's fp32 requantization:
    acc * (input scale * weight scale / output scale) in float32, rounded half to even, plus the
    output zero point, as real values of the output's grid. None where the float form has to do
    (float16 mode, a sum that may reach 2^24, a weight that is not a quantized constant)."""
    ti, tw, to = imp.tensor(op.inputs[0]), imp.tensor(op.inputs[1]), imp.tensor(op.outputs[0])
    if imp.float16 or not (is_int8(ti) and is_int8(to)) or ti.scale.size != 1 or to.scale.size != 1:
        return None
    if op.inputs[1] not in imp.consts or not is_int8(tw):
        return None
    w = imp.consts[op.inputs[1]].astype(np.int64)
    shape = [1] * w.ndim
    if tw.scale.size > 1:
        shape[tw.quantized_dimension] = -1
    w = w - tw.zero_point.reshape(shape).astype(np.int64)
    bias = None
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        if op.inputs[2] not in imp.consts or imp.consts[op.inputs[2]].dtype != np.int32:
            return None
        bias = imp.consts[op.inputs[2]].astype(np.int64).reshape(-1)
    out_axis = 3 if op.name == "DEPTHWISE_CONV_2D" else 0  # where the output channels are
    per_out = np.abs(np.moveaxis(w, out_axis, 0)).reshape(w.shape[out_axis], -1).sum(axis=1)
    lo, hi = _RANGE[ti.data_type]
    zi = int(ti.zero_point[0])
    bound = per_out * max(hi - zi, zi - lo) + (np.abs(bias) if bias is not None else 0)
    if bound.max() >= 1 << 24:
        return None
    si, so = np.float32(ti.scale[0]), np.float32(to.scale[0])
    scales = (np.float32(si) * tw.scale.astype(np.float32)) / so  # float32, in XNNPACK's order
    if scales.max() >= 256:
        return None
    b = imp.b
    x = b.round_even(b.div(imp.operand(op, op.inputs[0]), _c(b, si)))
    wc = b.constant(np.ascontiguousarray(w, np.float32))
    bc = b.constant(bias.astype(np.float32)) if bias is not None else None
    scale_c = b.constant(np.ascontiguousarray(scales.reshape(-1), np.float32))
    zo = int(to.zero_point[0])
    olo, ohi = _RANGE[to.data_type]

    def rescale(acc):
        q = b.clamp(b.round_even(b.mul(acc, scale_c)), min_value=float(olo - zo), max_value=float(ohi - zo))
        return b.mul(q, _c(b, so))

    return x, wc, bc, rescale


def _mbqm_smaller_than_one(x, qm, shift):
    """MultiplyByQuantizedMultiplierSmallerThanOneExp (shift <= 0)."""
    return rounding_divide_by_pot(srdhm32(x, qm), -shift)


def squared_difference_reference(a, c, ta, tc, to):
    """TFLite's int8 SQUARED_DIFFERENCE (squared_difference.cc): inputs shifted left by 7,
    rescaled to twice the larger scale, the int32 difference squared and rescaled; numpy a, c."""
    sa, sc, so = (float(np.float32(t.scale[0])) for t in (ta, tc, to))
    twice_max = 2.0 * max(sa, sc)
    m1, s1 = quantize_multiplier(sa / twice_max)
    m2, s2 = quantize_multiplier(sc / twice_max)
    mo, so_shift = quantize_multiplier(twice_max * twice_max / ((1 << 14) * so))
    x1 = _mbqm_smaller_than_one((np.asarray(a, np.int64) - int(ta.zero_point[0])) * (1 << 7), m1, s1)
    x2 = _mbqm_smaller_than_one((np.asarray(c, np.int64) - int(tc.zero_point[0])) * (1 << 7), m2, s2)
    d = x1 - x2
    out = multiply_by_quantized_multiplier(d * d, mo, so_shift) + int(to.zero_point[0])
    lo, hi = _RANGE[to.data_type]
    return np.clip(out, lo, hi)


def lookup2(b, x, y, tx, ty, to, table):
    """A binary operator of two int8 / uint8 inputs (numpy broadcasting) as a 256 x 256 table of
    its outputs (`table(qx, qy)`), gathered on the GPU, as real values of the output's grid."""
    ts = (tx, ty, to)
    if not all(is_int8(t) and t.scale.size == 1 for t in ts) or tx.data_type != ty.data_type:
        return None
    lo, hi = _RANGE[tx.data_type]
    qs = np.arange(lo, hi + 1, dtype=np.int64)
    out = table(qs[:, None], qs[None, :]).reshape(-1)
    real = (out.astype(np.float64) - int(to.zero_point[0])) * np.float64(np.float32(to.scale[0]))
    dt = np.float16 if x.data_type == "float16" else np.float32
    idx = b.add(
        b.mul(b.sub(integers(b, x, tx), integer_constant(b, lo)), integer_constant(b, 256)),
        b.sub(integers(b, y, ty), integer_constant(b, lo)),
    )
    return b.gather(b.constant(real.astype(dt)), idx, axis=0)


def rounding_divide_by_pot_graph(b, x, exponent):
    """RoundingDivideByPOT on int32 operands (0 <= exponent < 31)."""
    if exponent == 0:
        return x
    fl = floor_shift(b, x, exponent)
    rem = b.sub(x, b.mul(fl, integer_constant(b, 1 << exponent)))  # in [0, 2^exponent)
    mask = (1 << exponent) - 1
    threshold = b.add(integer_constant(b, mask >> 1), b.cast(b.lesser(x, integer_constant(b, 0)), "int32"))
    return b.add(fl, b.cast(b.greater(rem, threshold), "int32"))


def multiply_by_quantized_multiplier_graph(b, x, qm, shift):
    """MultiplyByQuantizedMultiplier (two roundings) on int32 operands: the left shift of a
    positive `shift` (at most 30) wraps in int32 as TFLite's C++ does (the caller bounds the value
    where it must not wrap), then the doubling high-mul in int64."""
    if shift > 0:
        x = b.mul(x, integer_constant(b, 1 << shift))
    x64 = b.cast(x, "int64")
    nudge = b.where(
        b.lesser(x, integer_constant(b, 0)),
        b.constant(np.array(1 - (1 << 30), np.int64)),
        b.constant(np.array(1 << 30, np.int64)),
    )  # fmt: skip  (qm > 0: the product's sign is x's)
    p = b.add(b.mul(x64, b.constant(np.array(qm, np.int64))), nudge)
    high = b.cast(b.div(p, b.constant(np.array(1 << 31, np.int64))), "int32")  # truncating, as C++
    return rounding_divide_by_pot_graph(b, high, max(-shift, 0))


def batch_matmul(b, x, y, tx, ty, to, matmul):
    """int8 BATCH_MATMUL as TFLite's kernel (LiteRT runs its own, not XNNPACK's): the int32 sums of
    (q - zero point) products (integer-valued float32, exact under 2^24) rescaled by
    MultiplyByQuantizedMultiplier(input scale * rhs scale / output scale). `matmul(x, y)` applies
    the operator's adjoints. None where the float form has to do."""
    ts = (tx, ty, to)
    if x.data_type != "float32" or not all(is_int8(t) and t.scale.size == 1 for t in ts):
        return None  # (float16 mode: its sums would not be exact)
    (lo, hi), zx, zy = _RANGE[tx.data_type], int(tx.zero_point[0]), int(ty.zero_point[0])
    k = max(int(d) for d in x.shape[-2:])  # the contracted dimension, either adjoint
    bound = k * max(hi - zx, zx - lo) * max(_RANGE[ty.data_type][1] - zy, zy - _RANGE[ty.data_type][0])
    m = float(np.float64(np.float32(np.float32(tx.scale[0]) * np.float32(ty.scale[0]))) / np.float64(to.scale[0]))
    qm, shift = quantize_multiplier(m)
    if qm <= 0 or bound >= 1 << 24 or bound << max(shift, 0) >= 1 << 31 or -shift >= 31:
        return None
    xi = b.round_even(b.div(x, _c(b, float(tx.scale[0]))))  # q - zero point, as float
    yi = b.round_even(b.div(y, _c(b, float(ty.scale[0]))))
    acc = b.cast(matmul(xi, yi), "int32")
    out = b.add(multiply_by_quantized_multiplier_graph(b, acc, qm, shift), integer_constant(b, int(to.zero_point[0])))
    olo, ohi = _RANGE[to.data_type]
    return real_values(b, b.clamp(out, min_value=float(olo), max_value=float(ohi)), to, x.data_type)


def _f32_exp(v):
    """expf, correctly rounded: float32 v's exponential computed in float64, rounded once."""
    return np.exp(np.asarray(v, np.float32).astype(np.float64)).astype(np.float32)


def round_away(v):
    """std::round / TfLiteRound of float32 v: half away from zero (exact: v - trunc(v) is)."""
    t = np.trunc(v)
    return t + np.sign(v) * (np.abs(v - t) >= 0.5)


def xnn_mul_scale(sa, sb, so):
    """XNNPACK's qs8/qu8 multiply requantization scale (product scale over the output scale, in
    float32), None outside [2^-16, 2^8) where its TFLite delegate leaves MUL to LiteRT's kernel."""
    s = _f32(_f32(_f32(sa) * _f32(sb)) / _f32(so))
    return s if 2.0**-16 <= s < 2.0**8 else None


def mul_reference(a, c, ta, tc, to):
    """numpy: XNNPACK's integer MUL of int8 / uint8 arrays (numpy broadcasting): the int32 product
    of (q - zero point), times xnn_mul_scale in float32, rounded half to even; None where
    xnn_mul_scale is."""
    s = xnn_mul_scale(float(ta.scale[0]), float(tc.scale[0]), float(to.scale[0]))
    if s is None:
        return None
    acc = (np.asarray(a, np.int64) - int(ta.zero_point[0])) * (np.asarray(c, np.int64) - int(tc.zero_point[0]))
    lo, hi = _RANGE[to.data_type]
    return np.clip(np.rint(acc.astype(np.float32) * s) + int(to.zero_point[0]), lo, hi).astype(np.int64)


def mul(b, x, y, tx, ty, to):
    """MUL of int8 / uint8 tensors as XNNPACK computes them (mul_reference), as real values of the
    output's grid: the product of (q - zero point) is an integer under 2^16, exact in float32, so
    one float32 multiply and a half-to-even rounding follow XNNPACK's. None where the float form
    has to do."""
    ts = (tx, ty, to)
    if x.data_type != "float32" or not all(is_int8(t) and t.scale.size == 1 for t in ts):
        return None
    s = xnn_mul_scale(float(tx.scale[0]), float(ty.scale[0]), float(to.scale[0]))
    if s is None:
        return None
    acc = b.mul(b.round_even(b.div(x, _c(b, float(tx.scale[0])))), b.round_even(b.div(y, _c(b, float(ty.scale[0])))))
    zo, (lo, hi) = int(to.zero_point[0]), _RANGE[to.data_type]
    q = b.clamp(b.round_even(b.mul(acc, _c(b, s))), min_value=float(lo - zo), max_value=float(hi - zo))
    return b.mul(q, _c(b, float(to.scale[0])))


def xnn_mean_params(n, ti, to):
    """XNNPACK's qs8/qu8 MEAN over n elements (reduce-nd.c): the int32 sum of q converted with
    (scale, bias) in float32: out = nearbyint(sum * scale + bias), scale = (input scale / output
    scale) * (1 / n), bias = output zero point - (n * input zero point) * scale."""
    s = _f32(_f32(_f32(ti.scale[0]) / _f32(to.scale[0])) * _f32(_f32(1.0) / _f32(n)))
    bias = _f32(_f32(int(to.zero_point[0])) - _f32(_f32(n * int(ti.zero_point[0])) * s))
    return s, bias


def mean_reference(q, axes, ti, to):
    """numpy: MEAN of an int8 / uint8 array over `axes` as LiteRT runs it (XNNPACK's kernel)."""
    axes = tuple(axes)
    n = int(np.prod([q.shape[a] for a in axes]))
    s, bias = xnn_mean_params(n, ti, to)
    acc = np.asarray(q, np.int64).sum(axis=axes).astype(np.float32)
    lo, hi = _RANGE[to.data_type]
    return np.clip(np.rint(_f32(acc * s) + bias), lo, hi).astype(np.int64)


def mean(b, x, tx, to, axes, keep):
    """MEAN of an int8 / uint8 tensor as mean_reference, as real values of the output's grid: the
    sum of q is exact in float32 (under 2^24), then one multiply, one add, a half-to-even rounding.
    None where the float form has to do (float16 mode, a sum that may reach 2^24)."""
    if x.data_type != "float32" or not (is_int8(tx) and is_int8(to)) or tx.scale.size != 1 or to.scale.size != 1:
        return None
    n = int(np.prod([int(x.shape[a]) for a in axes]))
    if n * 256 >= 1 << 24:
        return None
    s, bias = xnn_mean_params(n, tx, to)
    acc = b.reduce_sum(b.cast(integers(b, x, tx), "float32"), axes=axes, keep_dimensions=keep)
    lo, hi = _RANGE[to.data_type]
    q = b.clamp(b.round_even(b.add(b.mul(acc, _c(b, s)), _c(b, bias))), min_value=float(lo), max_value=float(hi))
    return real_values(b, q, to, "float32")


def _lut_table(q, ti, to, fn):
    """TFLite's LUTPopulate (int8 / uint8 LOGISTIC, TANH): fn of the float32 dequantized value,
    times 1 / output scale, rounded half away from zero, plus the output zero point."""
    d = _f32(ti.scale[0]) * (np.asarray(q, np.int64) - int(ti.zero_point[0])).astype(np.float32)
    r = round_away(fn(d.astype(np.float32)) * _f32(_f32(1.0) / _f32(to.scale[0])))
    lo, hi = _RANGE[to.data_type]
    return np.clip(r + int(to.zero_point[0]), lo, hi).astype(np.int64)


def logistic_reference(q, ti, to):
    """TFLite's int8 / uint8 LOGISTIC table: 1 / (1 + expf(-x)) in float32."""
    return _lut_table(q, ti, to, lambda d: _f32(1.0) / (_f32(1.0) + _f32_exp(-d)))


def tanh_reference(q, ti, to):
    """TFLite's int8 / uint8 TANH table: tanhf, correctly rounded."""
    return _lut_table(q, ti, to, lambda d: np.tanh(d.astype(np.float64)).astype(np.float32))


def softmax_table(ti, beta):
    """TFLite's int8 / uint8 SOFTMAX table (PopulateSoftmaxLookupTable): expf(-scale * beta * d)
    for d = row max - q in [0, 255]."""
    return _f32_exp(_f32(-_f32(ti.scale[0]) * _f32(beta)) * np.arange(256, dtype=np.float32))


def softmax_reference(q, ti, to, beta):
    """numpy: TFLite's int8 / uint8 SOFTMAX over the last axis (optimized_ops::Softmax with its
    table): the float32 sum of the row's table values in order, probabilities times 1 / (sum *
    output scale), rounded (int8: half away from zero; uint8: + 0.5, truncated)."""
    q = np.asarray(q, np.int64)
    e = softmax_table(ti, beta)[q.max(axis=-1, keepdims=True) - q]
    total = np.zeros(q.shape[:-1], np.float32)
    for j in range(q.shape[-1]):
        total = total + e[..., j]
    p = e * (_f32(1.0) / (total * _f32(to.scale[0])))[..., None]
    r = round_away(p) if to.data_type == "int8" else np.floor(p + _f32(0.5))
    lo, hi = _RANGE[to.data_type]
    return np.clip(r + int(to.zero_point[0]), lo, hi).astype(np.int64)


def softmax(b, x, tx, to, beta):
    """SOFTMAX (last axis) of an int8 / uint8 tensor as softmax_reference, as real values of the
    output's grid: the table gathered at (row max - q), summed (reduce_sum, whose order is not
    LiteRT's in-order float32 sum: numpy's pairwise order against it changed none of 930000
    outputs tried), scaled, rounded as TFLite rounds. None in float16 mode."""
    if x.data_type != "float32" or not (is_int8(tx) and is_int8(to)) or tx.scale.size != 1 or to.scale.size != 1:
        return None
    axis = x.rank - 1
    q = integers(b, x, tx)
    d = b.sub(b.reduce_max(q, axes=[axis], keep_dimensions=True), q)  # in [0, 255]
    e = b.gather(b.constant(softmax_table(tx, beta)), d, axis=0)
    total = b.reduce_sum(e, axes=[axis], keep_dimensions=True)
    p = b.mul(e, b.div(_c(b, 1.0), b.mul(total, _c(b, float(to.scale[0])))))  # p >= 0
    if to.data_type == "int8":
        fl = b.floor(p)
        r = b.add(fl, b.cast(b.greater_or_equal(b.sub(p, fl), _c(b, 0.5)), "float32"))
    else:
        r = b.floor(b.add(p, _c(b, 0.5)))
    lo, hi = _RANGE[to.data_type]
    zo = int(to.zero_point[0])
    return b.mul(b.clamp(r, min_value=float(lo - zo), max_value=float(hi - zo)), _c(b, float(to.scale[0])))
