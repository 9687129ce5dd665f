"""gemmlowp's 16-bit fixed-point logistic and tanh (fixedpoint.h), on numpy int64 arrays holding
int16 raw values: what LiteRT's optimized int16 LOGISTIC and TANH kernels compute for an input
scale of 2^-12 or 2^-11 (the power-of-two path of their Prepare). Every step keeps the C++ int16
semantics: plain adds, subtractions and negations wrap, the products are the rounding doubling
high-mul, rescalings saturate, and gemmlowp's 32-bit constants are rounded to 16 bits
(RescaleConstantInitializer). A type FixedPoint<int16, I> is its raw value here; the integer bits
I are the caller's bookkeeping (named in the comments)."""

import numpy as np

from . import quantized

_MIN, _MAX = -(1 << 15), (1 << 15) - 1


def _wrap(v):
    """int16 wrap-around of a C++ int16 add / subtract / negate."""
    return ((np.asarray(v, np.int64) - _MIN) & 0xFFFF) + _MIN


def _const(raw32):
    """RescaleConstantInitializer: a 32-bit constant as its 16-bit raw value (RoundingDivideByPOT
    by 16)."""
    return int(quantized.rounding_divide_by_pot(np.int64(raw32), 16))


def _mul(a, b):
    """FixedPoint product: SaturatingRoundingDoublingHighMul (integer bits add up)."""
    return quantized.srdhm16(np.asarray(a, np.int64), np.asarray(b, np.int64))


def _by_pot(x, exponent):
    """SaturatingRoundingMultiplyByPOT<exponent>: a saturating left shift, or RoundingDivideByPOT."""
    if exponent >= 0:
        return np.clip(np.asarray(x, np.int64) << exponent, _MIN, _MAX)
    return quantized.rounding_divide_by_pot(np.asarray(x, np.int64), -exponent)


def _exp_quarter(a):
    """exp_on_interval_between_negative_one_quarter_and_0_excl of F0 a: a Taylor expansion around
    -1/8 (F0 throughout; the last add saturates, AddSaturatingIf16Bit)."""
    constant_term, one_third = _const(1895147668), _const(715827883)  # exp(-1/8), 1/3
    x = _wrap(a + (1 << 12))  # + ConstantPOT<-3>
    x2 = _mul(x, x)
    x3 = _mul(x2, x)
    x4 = _mul(x2, x2)
    inner = _by_pot(_wrap(_mul(_wrap(_by_pot(x4, -2) + x3), one_third) + x2), -1)
    return np.clip(constant_term + _mul(constant_term, _wrap(x + inner)), _MIN, _MAX)


def exp_on_negative_values(a, integer_bits):
    """exp(a) for a <= 0 held in F<integer_bits> (integer_bits <= 5: no clamp), as F0: exp of a's
    part in [-1/4, 0) times exp(-2^k) for each set bit k of the rest (the barrel shifter)."""
    frac = 15 - integer_bits
    quarter = 1 << (frac - 2)
    a = np.asarray(a, np.int64)
    a_mod = _wrap((a & (quarter - 1)) - quarter)
    result = _exp_quarter(_by_pot(a_mod, integer_bits))  # Rescale<0>
    remainder = _wrap(a_mod - a)
    multipliers = {-2: 1672461947, -1: 1302514674, 0: 790015084, 1: 290630308, 2: 39332535, 3: 720401, 4: 242}
    for exponent, m in multipliers.items():
        if integer_bits > exponent:
            bit = (remainder & (1 << (frac + exponent))) != 0
            result = np.where(bit, _mul(result, _const(m)), result)
    return np.where(a == 0, _MAX, result)  # One() of F0


def _newton_reciprocal(a):
    """one_over_one_plus_x_for_x_in_0_1's Newton-Raphson iterate (F2) of 1 / (half of 1 + a), with
    the half denominator (F0)."""
    total = np.asarray(a, np.int64) + _MAX  # RoundingHalfSum(a, One()): (sum + sign) / 2, truncating
    v = total + np.where(total >= 0, 1, -1)
    half = np.sign(v) * (np.abs(v) // 2)
    x = _wrap(_const(1515870810) + _mul(half, _const(-1010580540)))  # 48/17 - 32/17 * half (F2)
    for _ in range(3):
        one_minus = _wrap((1 << 13) - _mul(half, x))  # F2::One() - half * x
        x = _wrap(x + _by_pot(_mul(x, one_minus), 2))  # + Rescale<2>(F4 product)
    return x


def logistic(q):
    """gemmlowp::logistic of F3 q (int16 raw values), as F0 raw values (scale 2^-15)."""
    q = np.asarray(q, np.int64)
    positive = q > 0
    magnitude = np.where(positive, q, _wrap(-q))
    on_positive = _by_pot(_newton_reciprocal(exp_on_negative_values(_wrap(-magnitude), 3)), 1)  # F2 as F1 -> F0
    result = np.where(positive, on_positive, _wrap(_MAX - on_positive))
    return np.where(q == 0, 1 << 14, result)


def tanh(q):
    """gemmlowp::tanh of F3 q (int16 raw values), as F0 raw values (scale 2^-15)."""
    q = np.asarray(q, np.int64)
    negative = q < 0
    n = np.where(negative, q, _wrap(-q))
    e = exp_on_negative_values(n, 4)  # ExactMulByPot<1>: the raw value as F4
    t = _by_pot(_wrap(_newton_reciprocal(e) - (1 << 13)), 2)  # Rescale<0>(x - F2::One())
    return np.where(q == 0, 0, np.where(negative, _wrap(-t), t))
