"""Elementwise ONNX operators: arithmetic, activations, Clip, Mod, Cast."""

import math

import numpy as np
from onnx import TensorProto

from ..types import WEBNN_TYPE
from ..errors import unsupported
from ._helpers import is_float, mark_bool, scalar, X
from ._registry import op

# -- elementwise -----------------------------------------------------------------------------

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow"}


@op("Add", "Sub", "Mul", "Div", attrs=("broadcast", "axis", "consumed_inputs"))
def _binary(im, node, ins, attrs):
    a, c = ins
    if attrs.get("broadcast") and "axis" in attrs:
        unsupported("legacy broadcast with axis is not supported")
    xa = X(im, a, c if not isinstance(c, np.ndarray) else None)
    xc = X(im, c, xa)
    if xa.data_type != xc.data_type:
        xc = im.b.cast(xc, xa.data_type)
    return getattr(im.b, _BINARY[node.op_type])(xa, xc)


@op("Pow")
def _pow(im, node, ins, attrs):
    a, e = ins
    xa = X(im, a)
    if isinstance(e, np.ndarray) and e.size == 1:
        v = float(e.reshape(-1)[0])
        if v == 2.0:
            return im.b.mul(xa, xa)
        if v == 1.0:
            return im.b.identity(xa)
        if v == 0.5 and is_float(xa):
            return im.b.sqrt(xa)
        if is_float(xa):
            return im.b.pow(xa, scalar(im, v, xa))
    xe = X(im, e)
    if not is_float(xa):
        # WebNN pow is float-only: compute in float32, cast back (exact for small integers)
        fe = xe if xe.data_type == "float32" else im.b.cast(xe, "float32")
        y = im.b.pow(im.b.cast(xa, "float32"), fe)
        return im.b.cast(im.b.round_even(y), xa.data_type)
    if xe.data_type != xa.data_type:
        xe = im.b.cast(xe, xa.data_type)
    return im.b.pow(xa, xe)


@op("Max", "Min", "Sum", "Mean", attrs=("consumed_inputs",))
def _variadic(im, node, ins, attrs):
    fn = {"Max": "max", "Min": "min", "Sum": "add", "Mean": "add"}[node.op_type]
    xs = [X(im, v) for v in ins if v is not None]
    y = xs[0]
    for x in xs[1:]:
        y = getattr(im.b, fn)(y, x if x.data_type == y.data_type else im.b.cast(x, y.data_type))
    if node.op_type == "Mean":
        y = im.b.div(y, scalar(im, len(xs), y))
    elif len(xs) == 1:
        y = im.b.identity(y)
    return y


_UNARY = {
    "Abs": "abs",
    "Ceil": "ceil",
    "Cos": "cos",
    "Erf": "erf",
    "Exp": "exp",
    "Floor": "floor",
    "Log": "log",
    "Neg": "neg",
    "Reciprocal": "reciprocal",
    "Sign": "sign",
    "Sin": "sin",
    "Sqrt": "sqrt",
    "Tan": "tan",
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Softplus": "softplus",
    "Softsign": "softsign",
    "HardSwish": "hard_swish",
    "Round": "round_even",
    "IsNaN": "is_nan",
    "Not": "logical_not",
    "Identity": "identity",
}


@op(*_UNARY, attrs=("consumed_inputs",))
def _unary(im, node, ins, attrs):
    x = X(im, ins[0])
    y = getattr(im.b, _UNARY[node.op_type])(x)
    if node.op_type in ("IsNaN", "Not"):
        mark_bool(im, y)
    elif node.op_type == "Identity" and id(x) in im.bools:
        mark_bool(im, y)
    return y


@op("IsInf", attrs=("detect_negative", "detect_positive"))
def _isinf(im, node, ins, attrs):
    x = X(im, ins[0])
    neg, pos = attrs.get("detect_negative", 1), attrs.get("detect_positive", 1)
    b = im.b
    if neg and pos:
        return mark_bool(im, b.is_infinite(x))
    inf = b.is_infinite(x)
    zero = scalar(im, 0, x)
    side = b.greater(x, zero) if pos else b.lesser(x, zero)
    if not neg and not pos:
        return mark_bool(im, b.logical_and(inf, b.logical_not(inf)))
    return mark_bool(im, b.logical_and(inf, side))


@op("Elu", attrs=("alpha", "consumed_inputs"))
def _elu(im, node, ins, attrs):
    return im.b.elu(X(im, ins[0]), alpha=attrs.get("alpha", 1.0))


@op("LeakyRelu", attrs=("alpha", "consumed_inputs"))
def _leaky(im, node, ins, attrs):
    return im.b.leaky_relu(X(im, ins[0]), alpha=attrs.get("alpha", 0.01))


@op("HardSigmoid", attrs=("alpha", "beta", "consumed_inputs"))
def _hsig(im, node, ins, attrs):
    return im.b.hard_sigmoid(X(im, ins[0]), alpha=attrs.get("alpha", 0.2), beta=attrs.get("beta", 0.5))


@op("Selu", attrs=("alpha", "gamma", "consumed_inputs"))
def _selu(im, node, ins, attrs):
    x = X(im, ins[0])
    alpha = attrs.get("alpha", 1.67326319217681884765625)
    gamma = attrs.get("gamma", 1.05070102214813232421875)
    return im.b.mul(im.b.elu(x, alpha=alpha), scalar(im, gamma, x))


@op("Celu", attrs=("alpha",))
def _celu(im, node, ins, attrs):
    x = X(im, ins[0])
    a = attrs.get("alpha", 1.0)
    return im.b.mul(im.b.elu(im.b.div(x, scalar(im, a, x)), alpha=1.0), scalar(im, a, x))


@op("ThresholdedRelu", attrs=("alpha",))
def _trelu(im, node, ins, attrs):
    x = X(im, ins[0])
    a = attrs.get("alpha", 1.0)
    return im.b.where(im.b.greater(x, scalar(im, a, x)), x, scalar(im, 0, x))


@op("Shrink", attrs=("bias", "lambd"))
def _shrink(im, node, ins, attrs):
    x = X(im, ins[0])
    bias, lambd = attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
    b = im.b
    lo = b.where(b.lesser(x, scalar(im, -lambd, x)), b.add(x, scalar(im, bias, x)), scalar(im, 0, x))
    return b.where(b.greater(x, scalar(im, lambd, x)), b.sub(x, scalar(im, bias, x)), lo)


@op("Gelu", attrs=("approximate",))
def gelu(im, node, ins, attrs):
    x = X(im, ins[0])
    if attrs.get("approximate", "none") == "none":
        return im.b.gelu(x)
    b = im.b
    inner = b.mul(
        b.add(x, b.mul(b.mul(b.mul(x, x), x), scalar(im, 0.044715, x))), scalar(im, math.sqrt(2 / math.pi), x)
    )
    return b.mul(b.mul(x, scalar(im, 0.5, x)), b.add(b.tanh(inner), scalar(im, 1.0, x)))


@op("Mish")
def _mish(im, node, ins, attrs):
    x = X(im, ins[0])
    return im.b.mul(x, im.b.tanh(im.b.softplus(x)))


@op("Swish", attrs=("alpha",))
def _swish(im, node, ins, attrs):
    x = X(im, ins[0])
    a = attrs.get("alpha", 1.0)
    return im.b.mul(x, im.b.sigmoid(im.b.mul(x, scalar(im, a, x)) if a != 1.0 else x))


@op("Sinh", "Cosh", "Asinh", "Acosh", "Atanh")
def _hyperbolic(im, node, ins, attrs):
    x = X(im, ins[0])
    b = im.b
    one = scalar(im, 1.0, x)
    half = scalar(im, 0.5, x)
    t = node.op_type
    if t in ("Sinh", "Cosh"):
        e, ie = b.exp(x), b.exp(b.neg(x))
        return b.mul(b.sub(e, ie) if t == "Sinh" else b.add(e, ie), half)
    if t == "Asinh":
        return b.log(b.add(x, b.sqrt(b.add(b.mul(x, x), one))))
    if t == "Acosh":
        return b.log(b.add(x, b.sqrt(b.sub(b.mul(x, x), one))))
    return b.mul(b.log(b.div(b.add(one, x), b.sub(one, x))), half)


def _atan(im, x):
    """atan with |x| > 1 folded by atan(x) = pi/2 - atan(1/x); minimax polynomial
    (max error ~1e-5 rad)."""
    b = im.b
    ax = b.abs(x)
    big = b.greater(ax, scalar(im, 1.0, x))
    t = b.where(big, b.reciprocal(b.max(ax, scalar(im, 1e-30, x))), ax)
    t2 = b.mul(t, t)
    p = scalar(im, -0.0117212, x)
    for c in (0.05265332, -0.11643287, 0.19354346, -0.33262347, 0.99997726):
        p = b.add(b.mul(p, t2), scalar(im, c, x))
    r = b.mul(p, t)
    r = b.where(big, b.sub(scalar(im, math.pi / 2, x), r), r)
    return b.mul(r, b.sign(x))


@op("Atan", "Asin", "Acos")
def _inverse_trig(im, node, ins, attrs):
    x = X(im, ins[0])
    b = im.b
    if node.op_type == "Atan":
        return _atan(im, x)
    # asin(x) = atan(x / sqrt(1 - x^2))
    c = b.sqrt(b.max(b.sub(scalar(im, 1.0, x), b.mul(x, x)), scalar(im, 0.0, x)))
    ax = b.abs(x)
    s = _atan(im, b.div(ax, b.max(c, scalar(im, 1e-30, x))))
    s = b.where(b.greater_or_equal(ax, scalar(im, 1.0, x)), scalar(im, math.pi / 2, x), s)
    s = b.mul(s, b.sign(x))
    if node.op_type == "Asin":
        return s
    return b.sub(scalar(im, math.pi / 2, x), s)


@op("PRelu", attrs=("consumed_inputs",))
def _prelu(im, node, ins, attrs):
    x = X(im, ins[0])
    s = X(im, ins[1], x)
    return im.b.prelu(x, s)


@op("Clip", attrs=("min", "max", "consumed_inputs"))
def _clip(im, node, ins, attrs):
    x = X(im, ins[0])
    if im.cur_opset < 11:
        lo, hi = attrs.get("min"), attrs.get("max")
        return im.b.clamp(
            x, **({"min_value": lo} if lo is not None else {}), **({"max_value": hi} if hi is not None else {})
        )
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    opts = {}
    y = x
    for v, key, fn in ((lo, "min_value", "max"), (hi, "max_value", "min")):
        if v is None:
            continue
        if isinstance(v, np.ndarray) and v.size == 1:
            opts[key] = float(v.reshape(-1)[0])
        else:
            y = getattr(im.b, fn)(y, X(im, v, x))
    if opts.get("min_value", -math.inf) > opts.get("max_value", math.inf):
        c = opts["max_value"]  # ONNX: min > max gives max everywhere
        return im.b.clamp(y, min_value=c, max_value=c)
    if opts or y is x:
        y = im.b.clamp(y, **opts)
    return y


# -- modulo ------------------------------------------------------------------------------------


@op("Mod", attrs=("fmod",))
def _mod(im, node, ins, attrs):
    a, c = X(im, ins[0]), X(im, ins[1])
    b = im.b
    if attrs.get("fmod", 0):
        if not is_float(a):
            return b.sub(a, b.mul(b.div(a, c), c))  # C remainder (sign of the dividend)
        q = b.div(a, c)
        tq = b.where(b.lesser(q, scalar(im, 0, q)), b.ceil(q), b.floor(q))
        return b.sub(a, b.mul(tq, c))
    if is_float(a):
        return b.sub(a, b.mul(b.floor(b.div(a, c)), c))
    # integer: Python-style modulo (sign of the divisor) from a truncating remainder
    r = b.sub(a, b.mul(b.div(a, c), c))
    zero = scalar(im, 0, r)
    fix = b.logical_and(b.not_equal(r, zero), b.not_equal(b.lesser(r, zero), b.lesser(c, zero)))
    return b.where(fix, b.add(r, c), r)


# -- cast -------------------------------------------------------------------------------------


def _cast_to(im, x, et):
    if et not in WEBNN_TYPE:
        unsupported(f"cast to {TensorProto.DataType.Name(et)} is not supported")
    b = im.b
    if et == TensorProto.BOOL:
        if id(x) in im.bools:
            return mark_bool(im, b.identity(x))
        return mark_bool(im, b.not_equal(x, scalar(im, 0, x)))
    dt = WEBNN_TYPE[et]
    src_float = is_float(x)
    if src_float and dt not in ("float32", "float16"):
        # ONNX casts float -> int by truncation toward zero; nan/inf are undefined.
        pass
    return b.cast(x, dt) if dt != x.data_type else b.identity(x)


@op("Cast", attrs=("to", "saturate", "round_mode"))
def _cast(im, node, ins, attrs):
    to = attrs["to"]
    if isinstance(to, str):
        to = TensorProto.DataType.Value(to.upper())
    return _cast_to(im, X(im, ins[0]), to)


@op("CastLike", attrs=("saturate", "round_mode"))
def _castlike(im, node, ins, attrs):
    return _cast_to(im, X(im, ins[0]), im.onnx_type(ins[1], node.input[1]))
