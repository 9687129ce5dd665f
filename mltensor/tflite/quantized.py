"""Full-integer TFLite models (int8 / uint8 activations with a scale and zero point), computed as
their real values: every quantized tensor of the graph is a float32 operand that holds exactly
scale * (q - zero_point), so each operator's float form (the converters of importer.py and
general_ops.py) reads it unchanged, and each operator's quantized output is put back on its grid
(`requantize`: q = clamp(round(y / scale) + zero_point), half to even as XNNPACK's fp32
requantization). Quantized constants (int8 weights with per-channel scales, int32 biases) are
dequantized at load; int8 / uint8 graph inputs and outputs keep their type at the edges.

LiteRT computes the same sums in int32 and rescales them with fixed-point multipliers (or, in
XNNPACK, float ones), so a value a float rounding away from a rounding boundary may land one step
apart: outputs equal LiteRT's or differ by one quantum per operator.
"""

import numpy as np

from ..errors import NotSupportedError

QUANT_TYPES = ("int8", "uint8")
_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


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
    scale, zp = _per_tensor(t, "output")
    lo, hi = _RANGE[t.data_type]
    q = b.clamp(b.add(b.round_even(b.div(v, _c(b, scale))), _c(b, zp)), min_value=float(lo), max_value=float(hi))
    return b.cast(q, t.data_type)
