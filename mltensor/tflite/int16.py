"""16x8 TFLite models (int16 activations with zero point 0, int8 weights, int64 biases) in LiteRT's
own integer arithmetic, operator by operator, as ai-edge-litert 2.3 runs them on x86 (XNNPACK does
not take int16, so TFLite's kernels run: the reference ones wherever its optimized ones are
skipped for int16):

- CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED (per-channel int8 weights, int64 or int32 bias):
  reference_integer_ops' int64 sums, then the 64-bit MultiplyByQuantizedMultiplier (the 32-bit
  multiplier rounded to 16 bits, one rounding shift). On the GPU the int16 input is split into
  its high byte (int8) and low byte (uint8), each summed exactly in int32 by the integer conv /
  matmul kernels (ops/integer.py: K * 255 * 127 < 2^31 for K < 66000), and the two sums joined
  in int64 (256 * high + low, plus the bias): no product is ever rounded.
- ADD, SUB: TFLite's general int16 path (left shift 15): both inputs rescaled to twice the larger
  scale, summed (subtracted), rescaled (the roundings as LiteRT 2.3 makes them: add_reference,
  sub_reference, whose inputs are rounded twice; on the GPU one ADD output in a few thousand is
  still a quantum off at some scales).
- MUL: the int32 product, MultiplyByQuantizedMultiplier (mul_reference).
- MEAN: reference_ops::QuantizedMeanOrSum: the int32 sum, the multiplier divided by the count.
- QUANTIZE (float32 -> int16): the input times float32(1 / scale), rounded half to even.

- LOGISTIC, TANH: reference_integer_ops' interpolation of TFLite's 256-entry 16-bit sigmoid table
  (sigmoid_table_uint16), the input first rescaled to 1 / (3 * 4096) by the multiplier and shift
  its Prepare computes; the table is generated here (sigmoid_table) and checked against LiteRT's
  outputs. The 65536 outputs are computed on the host (logistic_reference, tanh_reference) and
  gathered on the GPU at the input's integer. At an input scale of 2^-12 (TANH: 2^-11 too), where
  LiteRT's optimized kernel runs instead, gemmlowp's 16-bit fixed-point logistic / tanh
  (fixedpoint.py) gives the 65536 outputs the same way.

- SOFTMAX: SoftmaxInt16's 513-entry exp and 1 / (1 + x) tables (int16_lut: generated from their
  formula) and its fixed-point normalization, in int32 on the GPU.

Fused activations clamp in integers (CalculateActivationRangeQuantized). Every other int16
operator keeps quantized.py's real-value form (within a quantum of LiteRT's). Each function returns
None where it does not apply (another type, float16 mode, a bound the exact path cannot keep),
and the caller's float form runs.
"""

import functools

import numpy as np

from . import fixedpoint, quantized
from .common import ACT, PAD, opt

_LO, _HI = -(1 << 15), (1 << 15) - 1


def is_int16(t):
    """A 16x8 model's activation: int16, one scale, zero point 0."""
    return (
        quantized.is_quantized(t) and t.data_type == "int16" and t.scale.size == 1 and int(t.zero_point[0]) == 0
    )  # fmt: skip


def _i32(b, v):
    return quantized.integer_constant(b, v)


def _i64(b, v):
    return quantized.integer_constant(b, v, np.int64)


def _real(b, q, t):
    """int32 q as the real values of int16 tensor t (exact: |q| < 2^15 in float32)."""
    return quantized.real_values(b, q, t)


def activation_range(op, t):
    """CalculateActivationRangeQuantized of the operator's fused activation on int16 tensor t, or
    None for one it has no integer range for (TANH...)."""
    code = opt(op, "FusedActivationFunction", ACT.NONE)
    s = np.float32(t.scale[0])

    def q(f):  # TfLiteRound(f / scale): float32, half away from zero
        v = np.float32(np.float32(f) / s)
        return int(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)))

    if code == ACT.NONE:
        return _LO, _HI
    if code == ACT.RELU:
        return max(_LO, q(0.0)), _HI
    if code == ACT.RELU6:
        return max(_LO, q(0.0)), min(_HI, q(6.0))
    if code == ACT.RELU_N1_TO_1:
        return max(_LO, q(-1.0)), min(_HI, q(1.0))
    return None


# -- the 64-bit MultiplyByQuantizedMultiplier ---------------------------------------------------


def reduced_multiplier(qm):
    """The 64-bit MultiplyByQuantizedMultiplier's 16-bit multiplier (qm rounded, saturated)."""
    return (qm + (1 << 15)) >> 16 if qm < 0x7FFF0000 else 0x7FFF


def mbqm64_reference(x, qm, shift):
    """numpy: MultiplyByQuantizedMultiplier(int64 x, qm, shift) (TFLite's common.cc, both rounding
    modes): (x * reduced multiplier + 2^(14 - shift)) >> (15 - shift)."""
    total = 15 - np.asarray(shift, np.int64)
    rm = np.vectorize(reduced_multiplier)(np.asarray(qm, np.int64))
    return (np.asarray(x, np.int64) * rm + (np.int64(1) << (total - 1))) >> total


def _mbqm64(b, acc, qm, shift, shape):
    """The 64-bit MultiplyByQuantizedMultiplier of int64 acc, per channel (qm, shift: numpy arrays
    reshaped to `shape`, broadcasting over acc)."""
    total = (15 - shift).astype(np.int64)
    rm = np.array([reduced_multiplier(int(m)) for m in qm], np.int64)
    p = b.add(b.mul(acc, _i64(b, rm.reshape(shape))), _i64(b, (np.int64(1) << (total - 1)).reshape(shape)))
    return quantized.floor_div(b, p, _i64(b, (np.int64(1) << total).reshape(shape)))


def fc_scales(ti, tw, to, n):
    """FULLY_CONNECTED's int16 output scale per channel (reference_integer_ops' float form): double
    input scale * double filter scale / double output scale."""
    sw = np.broadcast_to(tw.scale.astype(np.float64), (n,))
    return np.float64(np.float32(ti.scale[0])) * sw / np.float64(np.float32(to.scale[0]))


def fc_reference(acc, scales):
    """numpy: round(double(acc) * scale), half away from zero (std::round)."""
    p = np.asarray(acc, np.int64).astype(np.float64) * scales
    return (np.sign(p) * np.floor(np.abs(p) + 0.5)).astype(np.int64)


def _round_scaled(b, acc, scales, shape):
    """round(acc * scale) half away from zero for int64 acc (|acc| < 2^36) and float64 scales
    (per channel, reshaped to `shape`), in int64: scale = M * 2^-S with M its 53-bit integer
    significand split as Mh * 2^27 + Ml, so |acc| * M + 2^(S - 1) is summed in parts that stay
    under 2^63 and shifted right by S exactly. (std::round rounds the double product first; that
    changes the result only for a product within 2^-37 of a half-integer, not reproduced.)"""
    frac, ex = np.frexp(scales)
    m = np.round(frac * 2.0**53).astype(np.int64)
    s = (53 - ex).astype(np.int64)
    mh, ml = m >> 27, m & ((1 << 27) - 1)
    c = lambda v: _i64(b, np.asarray(v, np.int64).reshape(shape))  # noqa: E731
    neg = b.lesser(acc, _i64(b, 0))
    u = b.where(neg, b.neg(acc), acc)
    low = b.div(b.mul(u, c(ml)), _i64(b, 1 << 27))  # nonnegative: division is floor
    y = b.add(b.add(b.mul(u, c(mh)), c(np.int64(1) << (s - 28))), low)
    r = b.div(y, c(np.int64(1) << (s - 27)))
    return b.where(neg, b.neg(r), r)


def _clamp_to_real(b, q64, lo, hi, t):
    q = b.cast(b.min(b.max(q64, _i64(b, lo)), _i64(b, hi)), "int32")
    return _real(b, q, t)


# -- CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED -------------------------------------------------


def _channel_multipliers(ti, tw, to, n):
    """PopulateConvolutionQuantizationParams: per output channel QuantizeMultiplier(double input
    scale * double filter scale / double output scale)."""
    sw = np.broadcast_to(tw.scale.astype(np.float64), (n,))
    pairs = [quantized.quantize_multiplier(float(np.float64(ti.scale[0]) * s / np.float64(to.scale[0]))) for s in sw]
    return np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64)


def _split(b, x, ti):
    """int16 real values as (high byte int8, low byte uint8): q = 256 * high + low."""
    q = quantized.integers(b, x, ti)
    hi = quantized.floor_shift(b, q, 8)
    lo = b.sub(q, b.mul(hi, _i32(b, 256)))
    return b.cast(hi, "int8"), b.cast(lo, "uint8")


def weighted(imp, op, conv_padding):
    """CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED of int16 activations as TFLite's
    reference_integer_ops kernels (the module docstring), as real values of the output's int16
    grid, the fused activation applied; None where the float form has to do."""
    ti, tw, to = imp.tensor(op.inputs[0]), imp.tensor(op.inputs[1]), imp.tensor(op.outputs[0])
    if imp.float16 or not (is_int16(ti) and is_int16(to)):
        return None
    if op.inputs[1] not in imp.consts or tw.scale is None or tw.data_type != "int8" or np.any(tw.zero_point != 0):
        return None
    rng = activation_range(op, to)
    if rng is None:
        return None
    w = imp.consts[op.inputs[1]].astype(np.int8)
    bias = None
    if len(op.inputs) > 2 and op.inputs[2] >= 0:
        if op.inputs[2] not in imp.consts or imp.consts[op.inputs[2]].dtype not in (np.int64, np.int32):
            return None
        bias = imp.consts[op.inputs[2]].astype(np.int64).reshape(-1)
    b = imp.b
    x = imp.operand(op, op.inputs[0])
    if op.name == "FULLY_CONNECTED":
        if opt(op, "WeightsFormat", 0) != 0 or w.ndim != 2:
            return None
        n, k = w.shape
        batch = int(np.prod(x.shape)) // k
        if k >= 66000:
            return None
        x2 = x if tuple(x.shape) == (batch, k) else b.reshape(x, [batch, k])
        hi, lo = _split(b, x2, ti)
        wt = b.constant(np.ascontiguousarray(w.T))
        sums = [b._int_matmul(v, wt) for v in (hi, lo)]
        shape = (1, n)
    else:
        sh, sw = opt(op, "StrideH", 1), opt(op, "StrideW", 1)
        dh, dw = opt(op, "DilationHFactor", 1), opt(op, "DilationWFactor", 1)
        if op.name == "DEPTHWISE_CONV_2D":
            wf = np.ascontiguousarray(w.transpose(3, 0, 1, 2))  # [1, kh, kw, C * m] -> OIHW, groups = C
            groups = int(x.shape[3])
        else:
            wf = np.ascontiguousarray(w.transpose(0, 3, 1, 2))  # OHWI -> OIHW
            groups = int(x.shape[3]) // int(w.shape[3])
        n, _, kh, kw = wf.shape
        if wf.shape[1] * kh * kw >= 66000:
            return None
        pad = conv_padding(opt(op, "Padding", PAD.SAME), x.shape[1:3], (kh, kw), (sh, sw), (dh, dw))
        hi, lo = _split(b, b.transpose(x, permutation=[0, 3, 1, 2]), ti)
        wc = b.constant(wf)
        kwargs = {"padding": pad, "strides": [sh, sw], "dilations": [dh, dw], "groups": groups}
        sums = [b._int_conv2d(v, wc, **kwargs) for v in (hi, lo)]
        shape = (1, n, 1, 1)
    acc = b.add(b.mul(b.cast(sums[0], "int64"), _i64(b, 256)), b.cast(sums[1], "int64"))
    if bias is not None:
        acc = b.add(acc, _i64(b, bias.reshape(shape)))
    bound = int(np.abs(w.astype(np.int64)).reshape(n, -1).sum(axis=1).max()) << 15
    bound += int(np.abs(bias).max()) if bias is not None else 0
    if op.name == "FULLY_CONNECTED":
        scales = fc_scales(ti, tw, to, n)
        if bound >= 1 << 36 or not np.all(scales > 0) or np.any(np.abs(np.frexp(scales)[1]) > 20):
            return None
        q = _round_scaled(b, acc, scales, shape)
    else:
        qm, shift = _channel_multipliers(ti, tw, to, n)
        if np.any(qm <= 0) or np.any(shift >= 8) or np.any(shift < -31) or bound >= 1 << 47:
            return None
        q = _mbqm64(b, acc, qm, shift, shape)
    y = _clamp_to_real(b, q, *rng, to)
    if op.name == "FULLY_CONNECTED":
        out_shape = list(to.shape)
        if opt(op, "KeepNumDims", False):
            out_shape = list(x.shape[:-1]) + [n]
        if len(out_shape) and int(np.prod(out_shape)) == batch * n and tuple(out_shape) != (batch, n):
            y = b.reshape(y, out_shape)
        return y
    return b.transpose(y, permutation=[0, 2, 3, 1])


# -- ADD / SUB -----------------------------------------------------------------------------------


def add_params(s1, s2, so):
    """TFLite's int16 ADD with general scales (add.cc Prepare, left shift 15): twice the larger
    input scale (float32, then double), each input's multiplier and the output's
    (QuantizeMultiplierSmallerThanOneExp of double quotients): ((m1, e1), (m2, e2), (mo, eo))."""
    twice_max = np.float64(np.float32(2) * np.float32(max(np.float32(s1), np.float32(s2))))
    m1 = quantized.quantize_multiplier(float(np.float64(np.float32(s1)) / twice_max))
    m2 = quantized.quantize_multiplier(float(np.float64(np.float32(s2)) / twice_max))
    mo = quantized.quantize_multiplier(float(twice_max / np.float64(np.float32(32768) * np.float32(so))))
    return m1, m2, mo


def add_rounds_once(shape_a, shape_c, subtract):
    """Whether LiteRT 2.3's general int16 ADD / SUB rescales its inputs with one rounding, (x * m +
    2^(30 - e)) >> (31 - e): an ADD of two inputs of one shape (its optimized kernel); a broadcast
    ADD and every SUB run reference kernels, which round twice (MultiplyByQuantizedMultiplier).
    Measured: either rounding in the other's place differs on about 1 output in 160000."""
    return not subtract and tuple(shape_a) == tuple(shape_c)


def add_reference(a, c, ta, tc, to, subtract=False, rng=(_LO, _HI)):
    """numpy: int16 ADD / SUB on TFLite's general path (left shift 15) as LiteRT 2.3 computes them
    (measured on its x86 wheel): each input shifted left by 15 and rescaled to twice the larger
    scale (one rounding or two: add_rounds_once), the sum (difference) rescaled by
    MultiplyByQuantizedMultiplier's two roundings, clamped."""
    (m1, e1), (m2, e2), (mo, eo) = add_params(ta.scale[0], tc.scale[0], to.scale[0])
    a, c = np.asarray(a, np.int64), np.asarray(c, np.int64)
    if add_rounds_once(a.shape, c.shape, subtract):
        x1 = ((a << 15) * m1 + (1 << (30 - e1))) >> (31 - e1)
        x2 = ((c << 15) * m2 + (1 << (30 - e2))) >> (31 - e2)
    else:
        x1 = quantized.multiply_by_quantized_multiplier(a << 15, m1, e1)
        x2 = quantized.multiply_by_quantized_multiplier(c << 15, m2, e2)
    return np.clip(quantized.multiply_by_quantized_multiplier(x1 - x2 if subtract else x1 + x2, mo, eo), *rng)


def pot_shifts(ta, tc, to, pot_flag):
    """add.cc / sub.cc Prepare's choice for int16: the power-of-two path runs where the operator's
    PotScaleInt16 is set (the schema's default where the operator has options; false where it
    has none, measured) and all three scales are powers of two by CheckedLog2 (zero points are 0
    in a 16x8 model); then (input 1's shift, input 2's shift), each log2(input scale) -
    log2(output scale). None: the general path (add_reference: this, not the flag alone, decides;
    refusing every flagged operator left ADD and SUB on the real-value form, a quantum off on
    some outputs)."""
    if not pot_flag:
        return None
    logs = [_checked_log2(t.scale[0]) for t in (ta, tc, to)]
    if not all(pot for _, pot in logs):
        return None
    return logs[0][0] - logs[2][0], logs[1][0] - logs[2][0]


def pot_add_sub_reference(a, c, shifts, subtract=False, rng=(_LO, _HI)):
    """numpy: int16 ADD / SUB on the power-of-two path (reference_ops Add / Sub16, their broadcast
    form for SUB; LiteRT 2.3 aborts on a broadcast ADD there): the input whose shift is nonzero divided by 2^-shift (RoundingDivideByPOT), the
    other taken as it is, summed (subtracted), saturated to int16 and clamped to the activation
    range."""
    a, c = np.asarray(a, np.int64), np.asarray(c, np.int64)
    x1 = quantized.rounding_divide_by_pot(a, -shifts[0])
    x2 = quantized.rounding_divide_by_pot(c, -shifts[1])
    return np.clip(x1 - x2 if subtract else x1 + x2, *rng)


def _pot_add_sub(b, qa, qc, shifts, subtract, rng):
    """pot_add_sub_reference on int32 graph operands."""
    x1, x2 = (quantized.rounding_divide_by_pot_graph(b, q, -s) for q, s in ((qa, shifts[0]), (qc, shifts[1])))
    s = b.sub(x1, x2) if subtract else b.add(x1, x2)
    return b.clamp(s, min_value=float(rng[0]), max_value=float(rng[1]))


def add_sub(imp, op, subtract):
    """ADD / SUB of int16 tensors as LiteRT runs them (pot_add_sub_reference where pot_shifts
    chooses the power-of-two path, else add_reference), as real values; None
    where it does not apply (shifts LiteRT's Prepare refuses, a scale ratio outside the general
    path's range, float16 mode)."""
    ta, tc, to = (imp.tensor(i) for i in (op.inputs[0], op.inputs[1], op.outputs[0]))
    if imp.float16 or not all(is_int16(t) for t in (ta, tc, to)):
        return None
    rng = activation_range(op, to)
    if rng is None:
        return None
    b = imp.b
    shifts = pot_shifts(ta, tc, to, opt(op, "PotScaleInt16", False))
    if shifts is not None:  # Prepare: one input at the output's scale, the other's no larger
        xa, xc = imp.operand(op, op.inputs[0]), imp.operand(op, op.inputs[1])
        broadcast_add = not subtract and tuple(xa.shape) != tuple(xc.shape)
        if max(shifts) > 0 or min(shifts) <= -31 or 0 not in shifts or broadcast_add:
            return None
        qa, qc = quantized.integers(b, xa, ta), quantized.integers(b, xc, tc)
        return _real(b, _pot_add_sub(b, qa, qc, shifts, subtract, rng), to)
    params = add_params(ta.scale[0], tc.scale[0], to.scale[0])
    if any(m <= 0 or e > 0 or e <= -31 for m, e in params):
        return None
    (m1, e1), (m2, e2), (mo, eo) = params
    xa, xc = imp.operand(op, op.inputs[0]), imp.operand(op, op.inputs[1])
    once = add_rounds_once(xa.shape, xc.shape, subtract)
    xs = []
    for x, t, m, e in ((xa, ta, m1, e1), (xc, tc, m2, e2)):
        if not once:  # two roundings: |q * 2^15| <= 2^30, multiplier < 1
            q = b.mul(quantized.integers(b, x, t), _i32(b, 1 << 15))
            xs.append(quantized.multiply_by_quantized_multiplier_graph(b, q, m, e))
            continue
        q = b.cast(quantized.integers(b, x, t), "int64")
        p = b.add(b.mul(q, _i64(b, m << 15)), _i64(b, 1 << (30 - e)))  # |.| < 2^61
        xs.append(b.cast(quantized.floor_div(b, p, _i64(b, 1 << (31 - e))), "int32"))  # |.| <= 2^29
    s = b.sub(*xs) if subtract else b.add(*xs)
    out = quantized.multiply_by_quantized_multiplier_graph(b, s, mo, eo)
    return _real(b, b.clamp(out, min_value=float(rng[0]), max_value=float(rng[1])), to)


# -- MUL -----------------------------------------------------------------------------------------


def mul_params(ta, tc, to):
    """int16 MUL's multiplier (mul.cc Prepare): QuantizeMultiplier of the input scales' product
    over the output scale, in float32 (measured: the double quotient differs on some scales)."""
    f = np.float32
    return quantized.quantize_multiplier(float(f(f(f(ta.scale[0]) * f(tc.scale[0])) / f(to.scale[0]))))


def mul_reference(a, c, ta, tc, to, rng=(_LO, _HI)):
    """numpy: int16 MUL as reference_integer_ops::MulElementwise (numpy broadcasting): the int32
    product rescaled by MultiplyByQuantizedMultiplier (two roundings), clamped. A multiplier of 1
    or more shifts the product left in int32 first, wrapping as LiteRT's x86 build does (measured:
    saturating instead differs on about half the outputs of such a MUL)."""
    qm, shift = mul_params(ta, tc, to)
    p = np.asarray(a, np.int64) * np.asarray(c, np.int64)
    if shift > 0:
        p = ((p << shift) + (1 << 31)) % (1 << 32) - (1 << 31)
        shift = 0
    return np.clip(quantized.multiply_by_quantized_multiplier(p, qm, shift), *rng)


def mul(imp, op):
    """MUL of int16 tensors as mul_reference, as real values: the product of two int16 values fits
    int32 (|.| <= 2^30), and its left shift by a multiplier of 1 or more wraps in int32 on the GPU
    as in LiteRT; None where it does not apply (a shift past 30, float16 mode)."""
    ta, tc, to = (imp.tensor(i) for i in (op.inputs[0], op.inputs[1], op.outputs[0]))
    if imp.float16 or not all(is_int16(t) for t in (ta, tc, to)):
        return None
    rng = activation_range(op, to)
    qm, shift = mul_params(ta, tc, to)
    if rng is None or qm <= 0 or shift > 30 or -shift >= 31:
        return None
    b = imp.b
    p = b.mul(*(quantized.integers(b, imp.operand(op, i), t) for i, t in ((op.inputs[0], ta), (op.inputs[1], tc))))
    out = quantized.multiply_by_quantized_multiplier_graph(b, p, qm, shift)
    return _real(b, b.clamp(out, min_value=float(rng[0]), max_value=float(rng[1])), to)


# -- MEAN ----------------------------------------------------------------------------------------


def mean_params(n, ti, to):
    """reference_ops::QuantizedMeanOrSum's multiplier for a mean over n elements: QuantizeMultiplier
    of the scale ratio (double), then shifted left by min(floor(log2 n), 32, 31 + shift) and
    divided by n."""
    qm, shift = quantized.quantize_multiplier(float(np.float64(ti.scale[0]) / np.float64(to.scale[0])))
    s = min(n.bit_length() - 1, 32, 31 + shift)
    return (qm << s) // n, shift - s


def mean_reference(q, axes, ti, to):
    """numpy: int16 MEAN over `axes` as reference_ops::QuantizedMeanOrSum (the int32 sum, the
    32-bit MultiplyByQuantizedMultiplier)."""
    n = int(np.prod([q.shape[a] for a in axes]))
    qm, shift = mean_params(n, ti, to)
    acc = np.asarray(q, np.int64).sum(axis=tuple(axes))
    return np.clip(quantized.multiply_by_quantized_multiplier(acc, qm, shift), _LO, _HI)


def mean(imp, op, x, axes, keep):
    """MEAN of an int16 tensor as mean_reference, as real values; None where it does not apply."""
    ti, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
    if imp.float16 or not (is_int16(ti) and is_int16(to)):
        return None
    n = int(np.prod([int(x.shape[a]) for a in axes]))
    qm, shift = mean_params(n, ti, to)
    if qm <= 0 or (n << 15 << max(shift, 0)) >= 1 << 31 or -shift >= 31:
        return None
    b = imp.b
    acc = b.reduce_sum(quantized.integers(b, x, ti), axes=axes, keep_dimensions=keep)
    out = quantized.multiply_by_quantized_multiplier_graph(b, acc, qm, shift)
    return _real(b, b.clamp(out, min_value=float(_LO), max_value=float(_HI)), to)


# -- QUANTIZE ------------------------------------------------------------------------------------


def quantize_scale(to):
    """LiteRT's float32 -> int16 multiplier: 1 / scale in double, then float32."""
    return np.float32(1.0 / np.float64(np.float32(to.scale[0])))


def quantize_reference(v, to):
    """numpy: float32 -> int16 as LiteRT 2.3 quantizes on x86 (measured; its vectorized
    AffineQuantize): v times float32(1 / scale) in float32, rounded half to even, clamped (the
    scalar kernels' double division rounded half away from zero differs on 7 of MobileNetV2's
    27648 inputs)."""
    t = np.asarray(v, np.float32) * quantize_scale(to)
    return np.clip(np.rint(t), _LO, _HI).astype(np.int64)


def quantize(imp, op):
    """QUANTIZE float32 -> int16 as quantize_reference, as real values; None where it does not
    apply (float16 mode: its products would round differently)."""
    ti, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
    x = imp.operand(op, op.inputs[0])
    if imp.float16 or ti.data_type != "float32" or x.data_type != "float32" or not is_int16(to):
        return None
    b = imp.b
    t = b.round_even(b.mul(x, b.constant(np.array(quantize_scale(to), np.float32))))
    q = b.cast(b.clamp(t, min_value=float(_LO), max_value=float(_HI)), "int32")
    return _real(b, q, to)


# -- LOGISTIC and TANH: TFLite's 16-bit sigmoid table, interpolated -------------------------------


def sigmoid_table():
    """TFLite's sigmoid_table_uint16 (reference_integer_ops' int16 LOGISTIC and TANH): at x_i = i /
    24, 65536 * sigmoid(x_i) less h^2 / 16 times sigmoid's second derivative (h = 1 / 24: half the
    largest error of interpolating linearly between the entries, so that the interpolation errs
    evenly either side), rounded; the last entry 65535. This reproduces all 256 published entries
    (44 of them one above the plain rounding of 65536 * sigmoid(x_i); the nearest to a rounding tie
    is 0.004 away), and the int16 LOGISTIC and TANH built on it equal LiteRT's outputs
    (tests/test_tflite_quantized.py)."""
    x = np.arange(256, dtype=np.float64) / 24.0
    f = 1.0 / (1.0 + np.exp(-x))
    f2 = f * (1.0 - f) * (1.0 - 2.0 * f)
    t = np.minimum(np.round(65536.0 * (f - f2 / (16.0 * 24.0 * 24.0))), 65535.0).astype(np.int64)
    t[255] = 65535
    return t


def _checked_log2(x):
    """TFLite's CheckedLog2 (in float32): (log2 rounded, whether x is a power of two)."""
    v = np.float32(np.log(np.float32(x))) * np.float32(1.0 / np.log(np.float32(2.0)))
    r = np.float32(np.round(v))
    return int(r), abs(float(v - r)) < 1e-3


def lut_params(ti, logistic=False):
    """(input_multiplier, input_left_shift) of TFLite's int16 LOGISTIC / TANH Prepare; multiplier
    0 for a power-of-two scale whose shift the optimized kernel takes: 0 or 1 for TANH, 0 for
    LOGISTIC (measured on LiteRT 2.3: at scales within CheckedLog2's tolerance of 2^-11 its
    LOGISTIC uses the multiplier of the scale itself)."""
    log2, pot = _checked_log2(ti.scale[0])
    shift = (15 - 3) + log2
    if pot and shift in ((0,) if logistic else (0, 1)):
        return 0, shift
    m, shift = float(np.float32(ti.scale[0])) * 4096.0 * 3.0, 0
    while m <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        m *= 2.0
    return int(m), shift


def _interpolate(q, ti, frac_bits):
    """The table interpolated at the rescaled |input| (frac_bits: 9 LOGISTIC, 8 TANH): (the sum
    before rounding, input >= 0), as int64 arrays."""
    mult, shift = lut_params(ti, frac_bits == 9)  # mult > 0: the callers take the power-of-two path
    rnd = (1 << (shift - 1)) if shift > 0 else 0
    x = (np.asarray(q, np.int64) * mult + rnd) >> shift
    a = np.abs(x)
    uh = a >> frac_bits
    t = sigmoid_table()
    lo = t[np.minimum(uh, 254)]
    hi = t[np.minimum(uh, 254) + 1]
    r = (lo << frac_bits) + (a & ((1 << frac_bits) - 1)) * (hi - lo)
    top = (0x7FFF << 10) if frac_bits == 9 else (0xFFFF << 8)
    return np.where(uh >= 255, top, r), x >= 0


def logistic_reference(q, ti):
    """numpy: TFLite's int16 LOGISTIC, output scale 1 / 32768: gemmlowp's fixed-point logistic
    (fixedpoint.logistic) for an input scale of 2^-12 (its optimized kernel: lut_params), else
    reference_integer_ops::Logistic (the table)."""
    if lut_params(ti, logistic=True)[0] == 0:
        return fixedpoint.logistic(q)
    r, pos = _interpolate(q, ti, 9)
    return np.where(pos, r + (1 << 9), (1 << 25) - r + (1 << 9) - 1) >> 10


def tanh_reference(q, ti):
    """numpy: TFLite's int16 TANH, output scale 1 / 32768: gemmlowp's fixed-point tanh
    (fixedpoint.tanh) of the input saturated left by its shift for an input scale of 2^-12 or
    2^-11 (its optimized kernel), else reference_integer_ops::Tanh (the table)."""
    mult, shift = lut_params(ti)
    if mult == 0:
        return fixedpoint.tanh(np.clip(np.asarray(q, np.int64) << shift, _LO, _HI))
    r, pos = _interpolate(q, ti, 8)
    return np.where(pos, r - (1 << 23) + (1 << 7), -r + (1 << 23) + (1 << 7) - 1) >> 8


def lut(imp, op, reference):
    """LOGISTIC / TANH of an int16 tensor as `reference` gives it, its 65536 outputs gathered at
    the input's integer; None where it does not apply (not 16x8, output scale not 1 / 32768, or
    float16 mode)."""
    ti, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
    if imp.float16 or not (is_int16(ti) and is_int16(to)):
        return None
    if float(to.scale[0]) != 1.0 / 32768:
        return None
    q = np.arange(_LO, _HI + 1, dtype=np.int64)
    real = (reference(q, ti).astype(np.float64) / 32768.0).astype(np.float32)
    b = imp.b
    idx = b.sub(quantized.integers(b, imp.operand(op, op.inputs[0]), ti), _i32(b, _LO))
    return b.gather(b.constant(real), idx, axis=0)


# -- SOFTMAX -------------------------------------------------------------------------------------


def int16_lut(func, lo, hi):
    """TFLite's 513-entry int16 table of func over [lo, hi] (Q0.15, 512 steps; the last entry
    only gives the last slope), each entry the rounded sample lowered by half the rounded error
    of the linear interpolation at the step's midpoint; every rounding half away from zero, in
    float64 (SOFTMAX's tables: its outputs equal softmax_reference's, which uses these)."""
    rnd = quantized.round_away
    step = (hi - lo) / 512.0
    x = lo + np.arange(512, dtype=np.float64) * step
    sample = rnd(func(x) * 32768.0)
    interp = rnd((func(lo + (np.arange(512) + 1) * step) * 32768.0 + sample) / 2.0)
    bias = rnd((interp - rnd(func(x + step / 2.0) * 32768.0)) / 2.0)
    last = rnd(np.array([func(np.float64(hi)) * 32768.0]))
    return np.clip(np.concatenate([sample - bias, last]), _LO, _HI).astype(np.int64)


@functools.cache
def softmax_tables():
    """SOFTMAX's int16 tables: exp over [-10, 0] and 1 / (1 + x) over [0, 1]."""
    return int16_lut(np.exp, -10.0, 0.0), int16_lut(lambda v: 1.0 / (1.0 + v), 0.0, 1.0)


def lut16_reference(v, table):
    """numpy: TFLite's int16 table lookup of v in [-32768, 32767]: entry 256 + (v >> 7) plus the
    slope to the next times the low 7 bits, rounded (>> 7 after + 64)."""
    i = 256 + (v >> 7)
    base = table[i]
    return base + (((table[i + 1] - base) * (v & 127) + 64) >> 7)


def softmax_params(ti, beta):
    """SOFTMAX Prepare's int16 input multiplier: QuantizeMultiplier of float32(scale * beta) over
    10 / 65535 (double), so a difference of -65535 is -10."""
    m = float(np.float32(np.float32(ti.scale[0]) * np.float32(beta))) / (10.0 / 65535.0)
    return quantized.quantize_multiplier(m)


def softmax_reference(q, ti, beta):
    """numpy: TFLite's int16 SOFTMAX over the last axis (SoftmaxInt16): differences from the row
    max rescaled (MultiplyByQuantizedMultiplier) onto the exp table's [-10, 0], the int32 sum of
    the Q0.15 exponentials normalized to [1, 2) by its leading zeros and looked up in the
    1 / (1 + x) table, each exponential times that reciprocal shifted back, rounded. Output
    scale 1 / 32768."""
    exp_t, recip_t = softmax_tables()
    q = np.asarray(q, np.int64)
    qm, shift = softmax_params(ti, beta)
    d = quantized.multiply_by_quantized_multiplier(q - q.max(axis=-1, keepdims=True), qm, shift)
    e = lut16_reference(np.clip(d + 32767, _LO, _HI), exp_t)
    total = e.sum(axis=-1, keepdims=True)
    k = np.frexp(total.astype(np.float64))[1] - 1  # floor(log2(total)): 31 - leading zeros
    shifted = ((total << (30 - k)) + (1 << 13)) >> 14
    r = lut16_reference(np.clip(shifted - (1 << 15) - (1 << 16), _LO, _HI), recip_t)
    return np.clip((e * r + (1 << (k - 1))) >> k, _LO, _HI)


def _lut16(b, v, table):
    """lut16_reference on int32 v already clamped to [-32768, 32767] (indices 0 to 512)."""
    hi = quantized.floor_shift(b, v, 7)
    i = b.add(hi, _i32(b, 256))
    t = b.constant(table.astype(np.int32))
    base = b.gather(t, i, axis=0)
    slope = b.sub(b.gather(t, b.add(i, _i32(b, 1)), axis=0), base)
    low = b.sub(v, b.mul(hi, _i32(b, 128)))
    return b.add(base, quantized.floor_shift(b, b.add(b.mul(slope, low), _i32(b, 64)), 7))


def softmax(imp, op):
    """SOFTMAX (last axis) of an int16 tensor as softmax_reference, as real values: int32
    throughout (sums of at most 65535 exponentials under 2^31, products under 2^30), the leading
    zeros counted by comparing the row sum with 2^1 ... 2^30. None where it does not apply."""
    ti, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
    if imp.float16 or not (is_int16(ti) and is_int16(to)) or np.float32(to.scale[0]) != np.float32(1 / 32768):
        return None
    x = imp.operand(op, op.inputs[0])
    qm, shift = softmax_params(ti, float(opt(op, "Beta", 1.0)))
    axis = x.rank - 1
    if x.rank == 0 or int(x.shape[axis]) >= 65536 or qm <= 0 or shift > 15 or -shift >= 31:
        return None
    exp_t, recip_t = softmax_tables()
    b = imp.b
    q = quantized.integers(b, x, ti)
    d = b.sub(q, b.reduce_max(q, axes=[axis], keep_dimensions=True))  # in [-65535, 0]
    d = quantized.multiply_by_quantized_multiplier_graph(b, d, qm, shift)
    e = _lut16(b, b.clamp(b.add(d, _i32(b, 32767)), min_value=float(_LO), max_value=float(_HI)), exp_t)
    total = b.reduce_sum(e, axes=[axis], keep_dimensions=True)  # >= 1
    powers = _i32(b, [1 << j for j in range(1, 31)])
    k = b.reduce_sum(b.cast(b.greater_or_equal(total, powers), "int32"), axes=[axis], keep_dimensions=True)
    pow2 = b.constant(np.array([1 << j for j in range(31)], np.int32))
    s = b.mul(total, b.gather(pow2, b.sub(_i32(b, 30), k), axis=0))  # in [2^30, 2^31)
    shifted = b.add(
        b.div(s, _i32(b, 1 << 14)), b.sub(b.div(s, _i32(b, 1 << 13)), b.mul(b.div(s, _i32(b, 1 << 14)), _i32(b, 2)))
    )
    xr = b.clamp(b.sub(shifted, _i32(b, (1 << 15) + (1 << 16))), min_value=float(_LO), max_value=float(_HI))
    r = _lut16(b, xr, recip_t)
    half = b.gather(pow2, b.max(b.sub(k, _i32(b, 1)), _i32(b, 0)), axis=0)
    out = b.div(b.add(b.mul(e, r), half), b.gather(pow2, k, axis=0))  # nonnegative: truncation is floor
    return _real(b, b.clamp(out, min_value=float(_LO), max_value=float(_HI)), to)


def converters(base, conv_padding):
    """The int16 forms of `base`'s converters (a dict by operator name): each tries its exact
    path above and falls back to the base converter."""

    def wrap(name, exact):
        fallback = base[name]

        def convert(imp, op):
            y = exact(imp, op)
            return fallback(imp, op) if y is None else y

        return convert

    return {
        "CONV_2D": wrap("CONV_2D", lambda imp, op: weighted(imp, op, conv_padding)),
        "DEPTHWISE_CONV_2D": wrap("DEPTHWISE_CONV_2D", lambda imp, op: weighted(imp, op, conv_padding)),
        "FULLY_CONNECTED": wrap("FULLY_CONNECTED", lambda imp, op: weighted(imp, op, conv_padding)),
        "ADD": wrap("ADD", lambda imp, op: add_sub(imp, op, False)),
        "SUB": wrap("SUB", lambda imp, op: add_sub(imp, op, True)),
        "MUL": wrap("MUL", mul),
        "QUANTIZE": wrap("QUANTIZE", quantize),
        "LOGISTIC": wrap("LOGISTIC", lambda imp, op: lut(imp, op, logistic_reference)),
        "TANH": wrap("TANH", lambda imp, op: lut(imp, op, tanh_reference)),
        "SOFTMAX": wrap("SOFTMAX", softmax),
    }
