"""ONNX integer operators: DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul and
QLinearConv (what onnxruntime.quantization's dynamic and QOperator models are made of), and the
com.microsoft fusions onnxruntime's graph optimizer writes for them (DynamicQuantizeMatMul,
MatMulIntegerToFloat: the optimized model it saves with optimized_model_filepath).

The integer products go through the exact i32 GEMMs of mltensor/ops/integer.py; constant int8/uint8
weights are uploaded packed (one byte an element). Parameter shapes
follow the ONNX specification: zero points (and QLinearMatMul's scales) per tensor, per row of A
([M], or [..., M, 1] for N-D A) or per column of B ([N], or [..., 1, N]); ConvInteger /
QLinearConv's input and output zero points per tensor, filter zero point and scale per tensor or per
output channel. Requantization multipliers (a_scale * b_scale / y_scale, in that order, as
onnxruntime computes them) are folded on the host in float32 when the scales are constants.
"""

import numpy as np

from ..errors import unsupported
from ._helpers import X, prod
from ._registry import op
from ._window import explicit_pads

_INT8 = ("int8", "uint8")


def _int8_operand(im, v, what, op_type):
    x = X(im, v)
    if x.data_type not in _INT8:
        unsupported(f"{op_type}: {what} data type {x.data_type} is not supported (int8 and uint8 are)")
    return x


def _shape(v):
    return tuple(v.shape)


class Weight:
    """B of a matmul or a convolution's filter: an operand, or an int8/uint8 constant (the model's
    weights) uploaded packed, four bytes to a uint32 word (ops/integer.py: one byte an element on
    the GPU, not a 32-bit word)."""

    def __init__(self, im, v, what, op_type):
        self.im = im
        if isinstance(v, np.ndarray) and v.dtype in (np.int8, np.uint8) and v.size:
            self.data_type, self.shape = v.dtype.name, tuple(v.shape)
            a = np.ascontiguousarray(v).view(np.uint8).reshape(-1)
            if a.size % 4:
                a = np.concatenate([a, np.zeros(4 - a.size % 4, np.uint8)])
            # a view of the weights read in place from the model file where no padding was needed
            self.words = im.b._constant_nocopy(a.view("<u4"))
            self.operand = None
        else:
            self.operand = _int8_operand(im, v, what, op_type)
            self.data_type, self.shape = self.operand.data_type, tuple(self.operand.shape)

    def reshape(self, shape):
        shape = tuple(shape)
        if self.operand is not None:
            self.operand = self.im.b.reshape(self.operand, list(shape))
        self.shape = shape
        return self

    def args(self):
        """(operand, packed) for the builder operators."""
        if self.operand is not None:
            return self.operand, None
        return self.words, (self.data_type, self.shape)


def _row_param(im, v, a_shape, what, op_type):
    """A per-tensor or per-row parameter of A ([..., M, K]) shaped to broadcast against the
    output [..., M, N]: size 1 as it is, [M] -> [M, 1], [..., M, 1] as it is."""
    if v is None:
        return None
    s, M = _shape(v), a_shape[-2]
    if prod(s) == 1:
        return v
    if len(s) == 1 and s[0] == M:
        return v.reshape(M, 1) if isinstance(v, np.ndarray) else im.b.reshape(v, [M, 1])
    if len(s) == len(a_shape) and s[-2:] == (M, 1):
        return v
    unsupported(
        f"{op_type}: {what} shape {list(s)} is not supported for A of shape {list(a_shape)} "
        f"(per tensor, per row [M] or [..., M, 1])"
    )


def col_param(im, v, b_shape, what, op_type):
    """A per-tensor or per-column parameter of B ([..., K, N]): size 1, [N], or [..., 1, N]."""
    if v is None:
        return None
    s, N = _shape(v), b_shape[-1]
    if prod(s) == 1 or (len(s) == 1 and s[0] == N):
        return v
    if len(s) == len(b_shape) and s[-2:] == (1, N):
        return v
    unsupported(
        f"{op_type}: {what} shape {list(s)} is not supported for B of shape {list(b_shape)} "
        f"(per tensor, per column [N] or [..., 1, N])"
    )


def _zp_operand(im, v, like, what, op_type):
    if v is None:
        return None
    z = X(im, v)
    if z.data_type != like.data_type:
        unsupported(f"{op_type}: {what} data type {z.data_type} differs from its input's {like.data_type}")
    return z


def _multiplier(im, a_scale, b_scale, y_scale, op_type, float16=False):
    """a_scale * b_scale / y_scale (broadcast; without y_scale when it is None) as float32,
    computed in the scales' type (float32, or with float16=True float16, as the ONNX reference
    computes it: each step rounded to float16): on the host when all are constants."""
    scales = [("a_scale", a_scale), ("b_scale", b_scale)] + ([("y_scale", y_scale)] if y_scale is not None else [])
    types = {np.dtype(s.dtype).name if isinstance(s, np.ndarray) else s.data_type for _, s in scales}
    allowed = ("float32", "float16") if float16 else ("float32",)
    if len(types) != 1 or not types <= set(allowed):
        unsupported(
            f"{op_type}: scale data types {sorted(types)} are not supported (one of {', '.join(allowed)} for all)"
        )
    if all(isinstance(s, np.ndarray) for _, s in scales):
        with np.errstate(all="ignore"):
            p = a_scale * b_scale  # numpy rounds each step to the scales' type, as onnxruntime
            p = p if y_scale is None else p / y_scale
        return np.asarray(p, np.float32)  # (float16 -> float32 is exact)
    b = im.b
    like = next(s for _, s in scales if not isinstance(s, np.ndarray))
    p = b.mul(X(im, a_scale, like), X(im, b_scale, like))
    p = p if y_scale is None else b.div(p, X(im, y_scale, like))
    return p if p.data_type == "float32" else b.cast(p, "float32")


def integer_matmul(im, a, bb, za, zb, requant=None, post=None):
    """(A - za) x (B - zb) with ONNX MatMul's 1-D rules (bb: a Weight); requant: (scale, y zero point) shaped
    against the 2-D+ operands, or None for int32; post: a function applied to the 2-D+ result
    (parameters shaped against it broadcast before a vector operand's axis is dropped)."""
    b = im.b
    ra, rb = len(a.shape), len(bb.shape)
    a2 = b.reshape(a, [1, a.shape[0]]) if ra == 1 else a
    if rb == 1:
        bb.reshape([bb.shape[0], 1])
    b2, packed = bb.args()
    kw = {}
    if requant is not None:
        kw["scale"], kw["output_zero_point"] = requant
    y = b._int_matmul(a2, b2, a_zero_point=za, b_zero_point=zb, b_packed=packed, **kw)
    if post is not None:
        y = post(y)
    if ra == 1 or rb == 1:
        shape = list(y.shape)
        if rb == 1:
            shape.pop(-1)
        if ra == 1:
            shape.pop(-2 if rb != 1 else -1)
        y = b.reshape(y, shape)
    return y


@op("MatMulInteger")
def _matmul_integer(im, node, ins, attrs):
    t = "MatMulInteger"
    a = _int8_operand(im, ins[0], "A", t)
    bb = Weight(im, ins[1], "B", t)
    a_shape = (1,) + _shape(a) if len(a.shape) == 1 else _shape(a)
    b_shape = _shape(bb) + (1,) if len(bb.shape) == 1 else _shape(bb)
    za = _row_param(im, ins[2] if len(ins) > 2 else None, a_shape, "a_zero_point", t)
    zb = col_param(im, ins[3] if len(ins) > 3 else None, b_shape, "b_zero_point", t)
    return integer_matmul(
        im, a, bb, _zp_operand(im, za, a, "a_zero_point", t), _zp_operand(im, zb, bb, "b_zero_point", t)
    )


@op("QLinearMatMul")
def _qlinear_matmul(im, node, ins, attrs):
    t = "QLinearMatMul"
    if len(ins) < 8 or any(v is None for v in ins[:8]):
        unsupported(f"{t}: every scale and zero point input is required")
    a = _int8_operand(im, ins[0], "a", t)
    bb = Weight(im, ins[3], "b", t)
    a_shape = (1,) + _shape(a) if len(a.shape) == 1 else _shape(a)
    b_shape = _shape(bb) + (1,) if len(bb.shape) == 1 else _shape(bb)
    za = _zp_operand(im, _row_param(im, ins[2], a_shape, "a_zero_point", t), a, "a_zero_point", t)
    zb = _zp_operand(im, col_param(im, ins[5], b_shape, "b_zero_point", t), bb, "b_zero_point", t)
    a_scale = _row_param(im, ins[1], a_shape, "a_scale", t)
    b_scale = col_param(im, ins[4], b_shape, "b_scale", t)
    y_scale = _row_param(im, ins[6], a_shape, "y_scale", t)
    zy = X(im, _row_param(im, ins[7], a_shape, "y_zero_point", t))
    if zy.data_type not in _INT8:
        unsupported(f"{t}: output data type {zy.data_type} is not supported (int8 and uint8 are)")
    mult = X(im, _multiplier(im, a_scale, b_scale, y_scale, t, float16=True))
    return integer_matmul(im, a, bb, za, zb, (mult, zy))


# -- convolutions ----------------------------------------------------------------------------

_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


def _conv(im, node, attrs, x, w, zx, zw, requant=None, bias=None):
    """The convolution of x by w (a Weight), 1-D as 2-D."""
    t = node.op_type
    sp = len(x.shape) - 2
    if sp not in (1, 2) or len(w.shape) != len(x.shape):
        unsupported(f"{t}: {sp}-D convolutions are not supported (1-D and 2-D are)")
    k = list(w.shape[2:])
    if attrs.get("kernel_shape") and list(attrs["kernel_shape"]) != k:
        unsupported(f"{t}: attribute kernel_shape={list(attrs['kernel_shape'])} differs from the filter's {k}")
    s = list(attrs.get("strides") or [1] * sp)
    d = list(attrs.get("dilations") or [1] * sp)
    begin, end = explicit_pads(attrs, list(x.shape[2:]), k, s, d)
    b = im.b
    if sp == 1:
        s, d, begin, end = [1] + s, [1] + d, [0] + list(begin), [0] + list(end)
        x = b.reshape(x, list(x.shape[:2]) + [1, x.shape[2]])
        w.reshape(list(w.shape[:2]) + [1, w.shape[2]])
    w, packed = w.args()
    kw = dict(
        input_zero_point=zx,
        filter_zero_point=zw,
        bias=bias,
        filter_packed=packed,
        padding=[begin[0], end[0], begin[1], end[1]],
        strides=s,
        dilations=d,
        groups=attrs.get("group", 1),
    )
    if requant is not None:
        kw["scale"], kw["output_zero_point"] = requant
    y = b._int_conv2d(x, w, **kw)
    if sp == 1:
        y = b.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
    return y


def _per_tensor(v, what, t):
    if v is not None and prod(_shape(v)) != 1:
        unsupported(f"{t}: {what} of shape {list(_shape(v))} is not supported (one element, per tensor)")
    return v


def _per_channel(v, oc, what, t):
    if v is not None and prod(_shape(v)) not in (1, oc):
        unsupported(
            f"{t}: {what} of shape {list(_shape(v))} is not supported (one element or one per output channel, {oc})"
        )
    return v


@op("ConvInteger", attrs=_CONV_ATTRS)
def _conv_integer(im, node, ins, attrs):
    t = "ConvInteger"
    x = _int8_operand(im, ins[0], "x", t)
    w = Weight(im, ins[1], "w", t)
    zx = _per_tensor(ins[2] if len(ins) > 2 else None, "x_zero_point", t)
    zw = _per_channel(ins[3] if len(ins) > 3 else None, w.shape[0], "w_zero_point", t)
    return _conv(
        im, node, attrs, x, w, _zp_operand(im, zx, x, "x_zero_point", t), _zp_operand(im, zw, w, "w_zero_point", t)
    )


@op("QLinearConv", attrs=_CONV_ATTRS)
def _qlinear_conv(im, node, ins, attrs):
    t = "QLinearConv"
    if len(ins) < 8 or any(v is None for v in ins[:8]):
        unsupported(f"{t}: every scale and zero point input is required")
    x = _int8_operand(im, ins[0], "x", t)
    w = Weight(im, ins[3], "w", t)
    oc = w.shape[0]
    zx = _zp_operand(im, _per_tensor(ins[2], "x_zero_point", t), x, "x_zero_point", t)
    zw = _zp_operand(im, _per_channel(ins[5], oc, "w_zero_point", t), w, "w_zero_point", t)
    x_scale = _per_tensor(ins[1], "x_scale", t)
    w_scale = _per_channel(ins[4], oc, "w_scale", t)
    y_scale = _per_tensor(ins[6], "y_scale", t)
    zy = X(im, _per_tensor(ins[7], "y_zero_point", t))
    if zy.data_type not in _INT8:
        unsupported(f"{t}: output data type {zy.data_type} is not supported (int8 and uint8 are)")
    mult = _multiplier(im, x_scale, w_scale, y_scale, t, float16=True)
    mult = X(im, mult.reshape(-1) if isinstance(mult, np.ndarray) else mult)
    if len(mult.shape) != 1:
        mult = im.b.reshape(mult, [prod(mult.shape)])
    bias = ins[8] if len(ins) > 8 else None
    if bias is not None:
        bias = X(im, _per_channel(bias, oc, "B", t))
        if bias.data_type != "int32":
            unsupported(f"{t}: B data type {bias.data_type} is not supported (int32 is)")
    return _conv(im, node, attrs, x, w, zx, zw, (mult, zy), bias)


# -- dynamic quantization ----------------------------------------------------------------------


def dynamic_quantize(im, x, op_type):
    """(uint8 y, scale, zero point) of x as DynamicQuantizeLinear defines them: the range [min,
    max] of x widened to include 0, scale = (max - min) / 255 (1 when the range is empty: x all
    zeros), zero point = round_half_even(clamp(0 - min / scale, 0, 255)), y =
    saturate(round_half_even(x / scale) + zero point). onnxruntime computes the same float32
    operations in this order."""
    if x.data_type != "float32":
        unsupported(f"{op_type}: input data type {x.data_type} is not supported (float32 is)")
    b = im.b
    r = len(x.shape)

    def c(v):
        return b.constant(np.array(v, dtype=np.float32))

    zero = c(0.0)
    axes = list(range(r))
    lo = b.min(b.reduce_min(x, axes=axes, keep_dimensions=False), zero)
    hi = b.max(b.reduce_max(x, axes=axes, keep_dimensions=False), zero)
    scale = b.where(b.equal(hi, lo), c(1.0), b.div(b.sub(hi, lo), c(255.0)))
    zpf = b.round_even(b.clamp(b.sub(zero, b.div(lo, scale)), min_value=0.0, max_value=255.0))
    zp = b.cast(zpf, "uint8")  # an integer in [0, 255] already: the conversion is exact
    ones = [1] * r
    y = b.quantize_linear(x, b.reshape(scale, ones), b.reshape(zp, ones)) if r else b.quantize_linear(x, scale, zp)
    return y, scale, zp


@op("DynamicQuantizeLinear")
def _dynamic_quantize_linear(im, node, ins, attrs):
    return dynamic_quantize(im, X(im, ins[0]), "DynamicQuantizeLinear")


# -- onnxruntime's fusions (com.microsoft), as its graph optimizer writes them -------------------


def _integer_to_float(im, t, a, bb, a_scale, b_scale, za, zb, bias):
    """float32 (A - za)(B - zb) * (a_scale * b_scale) + bias: the exact int32 product, then the
    float steps in onnxruntime's order (one fused elementwise kernel)."""
    a_shape = (1,) + _shape(a) if len(a.shape) == 1 else _shape(a)
    b_shape = _shape(bb) + (1,) if len(bb.shape) == 1 else _shape(bb)
    za = _zp_operand(im, _row_param(im, za, a_shape, "a_zero_point", t), a, "a_zero_point", t)
    zb = _zp_operand(im, col_param(im, zb, b_shape, "b_zero_point", t), bb, "b_zero_point", t)
    a_scale = _row_param(im, a_scale, a_shape, "a_scale", t)
    b_scale = col_param(im, b_scale, b_shape, "b_scale", t)
    scale = X(im, _multiplier(im, a_scale, b_scale, None, t))
    b = im.b
    y = integer_matmul(im, a, bb, za, zb, post=lambda acc: b.mul(b.cast(acc, "float32"), scale))
    if bias is not None:
        bias = X(im, bias)
        if bias.data_type != "float32":
            unsupported(f"{t}: bias data type {bias.data_type} is not supported (float32 is)")
        y = b.add(y, bias)
    return y


@op("com.microsoft.MatMulIntegerToFloat")
def _matmul_integer_to_float(im, node, ins, attrs):
    t = "MatMulIntegerToFloat"
    ins = list(ins) + [None] * (7 - len(ins))
    a = _int8_operand(im, ins[0], "A", t)
    bb = Weight(im, ins[1], "B", t)
    return _integer_to_float(im, t, a, bb, ins[2], ins[3], ins[4], ins[5], ins[6])


@op("com.microsoft.DynamicQuantizeMatMul")
def _dynamic_quantize_matmul(im, node, ins, attrs):
    t = "DynamicQuantizeMatMul"
    ins = list(ins) + [None] * (5 - len(ins))
    a, a_scale, za = dynamic_quantize(im, X(im, ins[0]), t)
    bb = Weight(im, ins[1], "B", t)
    return _integer_to_float(im, t, a, bb, a_scale, ins[2], za, ins[3], ins[4])
