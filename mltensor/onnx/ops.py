"""ONNX operator handlers: each maps one ONNX node onto MLGraphBuilder calls.

A handler `fn(im, node, ins, attrs) -> output value(s)` gets the Importer, the NodeProto, its input
values (numpy arrays for host constants, MLOperands, None for absent optional inputs) and its
parsed attributes. It returns MLOperands or numpy arrays. `@op(names, attrs=...)` registers it; an
attribute outside `attrs` fails at load. Version differences (attribute vs input, defaults) are
resolved with `im.cur_opset`.
"""

import math

import numpy as np
from onnx import TensorProto, helper

from .importer import WEBNN_TYPE, NeedsValue, _Unsupported


class Handler:
    __slots__ = ("fn", "attrs")

    def __init__(self, fn, attrs):
        self.fn, self.attrs = fn, attrs


HANDLERS = {}


def op(*names, attrs=()):
    def deco(fn):
        for n in names:
            HANDLERS[n] = Handler(fn, set(attrs) if attrs is not None else None)
        return fn

    return deco


def supported_ops():
    return sorted(HANDLERS)


def unsupported(msg):
    raise _Unsupported(msg)


# -- small helpers ---------------------------------------------------------------------------


def const(im, v, what):
    if v is None:
        return None
    if not isinstance(v, np.ndarray):
        # a value computed from graph inputs decides a shape or an attribute: InferenceSession
        # binds those inputs' values at the first run and specializes the graph to them
        names = _input_leaves(v)
        if names:
            raise NeedsValue(names[0], what)
        unsupported(f"{what} must be a constant (known at load), got a computed tensor")
    return v


def _input_leaves(v):
    """Names of the graph inputs an operand is computed from."""
    seen, out, stack = set(), [], [v]
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        kind = getattr(o, "_kind", None)
        if kind == "input":
            out.append(o._name)
        elif kind == "op":
            stack.extend(o._node.inputs)
    return out


def ints(im, v, what):
    c = const(im, v, what)
    return None if c is None else [int(i) for i in np.asarray(c).reshape(-1)]


def norm_axis(axis, rank, what="axis"):
    a = int(axis)
    if a < 0:
        a += rank
    if not 0 <= a < max(rank, 1):
        unsupported(f"{what} {axis} is out of range for rank {rank}")
    return a


def prod(xs):
    n = 1
    for x in xs:
        n *= int(x)
    return n


def B(im):
    return im.b


def X(im, v, like=None):
    return im.operand(v, like)


def scalar(im, value, like):
    """A scalar constant operand of `like`'s data type."""
    from .. import dtypes

    return im.b.constant(np.array(value, dtype=dtypes.NUMPY[like.data_type]))


def reshape(im, x, shape):
    shape = [int(s) for s in shape]
    if tuple(shape) == tuple(x.shape) and x._kind == "op":
        return x
    return im.b.reshape(x, shape)


def is_float(x):
    return x.data_type in ("float32", "float16")


def mark_bool(im, x):
    im.bools.add(id(x))
    return x


def to_float(im, x):
    return x if is_float(x) else im.b.cast(x, "float32")


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
    "Abs": "abs", "Ceil": "ceil", "Cos": "cos", "Erf": "erf", "Exp": "exp", "Floor": "floor",
    "Log": "log", "Neg": "neg", "Reciprocal": "reciprocal", "Sign": "sign", "Sin": "sin",
    "Sqrt": "sqrt", "Tan": "tan", "Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh",
    "Softplus": "softplus", "Softsign": "softsign", "HardSwish": "hard_swish", "Round": "round_even",
    "IsNaN": "is_nan", "Not": "logical_not", "Identity": "identity",
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
def _gelu(im, node, ins, attrs):
    x = X(im, ins[0])
    if attrs.get("approximate", "none") == "none":
        return im.b.gelu(x)
    b = im.b
    inner = b.mul(b.add(x, b.mul(b.mul(b.mul(x, x), x), scalar(im, 0.044715, x))),
                  scalar(im, math.sqrt(2 / math.pi), x))
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
        return im.b.clamp(x, **({"min_value": lo} if lo is not None else {}),
                          **({"max_value": hi} if hi is not None else {}))
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


# -- comparison and logic --------------------------------------------------------------------

_COMPARE = {"Equal": "equal", "Greater": "greater", "GreaterOrEqual": "greater_or_equal",
            "Less": "lesser", "LessOrEqual": "lesser_or_equal"}
_LOGIC = {"And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}


@op(*_COMPARE, *_LOGIC, attrs=("broadcast", "axis"))
def _compare(im, node, ins, attrs):
    a, c = ins
    xa = X(im, a, c if not isinstance(c, np.ndarray) else None)
    xc = X(im, c, xa)
    if xa.data_type != xc.data_type:
        xc = im.b.cast(xc, xa.data_type)
    fn = _COMPARE.get(node.op_type) or _LOGIC[node.op_type]
    return mark_bool(im, getattr(im.b, fn)(xa, xc))


@op("Where")
def _where(im, node, ins, attrs):
    c, a, d = ins
    xa = X(im, a, d if not isinstance(d, np.ndarray) else None)
    xd = X(im, d, xa)
    if xa.data_type != xd.data_type:
        xd = im.b.cast(xd, xa.data_type)
    y = im.b.where(X(im, c), xa, xd)
    if id(xa) in im.bools:
        mark_bool(im, y)
    return y


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


# -- shape-only ops (folded at load on operands) ------------------------------------------------


@op("Shape", attrs=("start", "end"))
def _shape(im, node, ins, attrs):
    s = list(ins[0].shape)
    r = len(s)
    start = attrs.get("start", 0)
    end = attrs.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return np.array(s[start:end], dtype=np.int64)


@op("Size")
def _size(im, node, ins, attrs):
    return np.array(prod(ins[0].shape), dtype=np.int64)


@op("EyeLike", attrs=("dtype", "k"))
def _eyelike(im, node, ins, attrs):
    x = ins[0]
    shape = x.shape
    et = attrs.get("dtype", im.onnx_type(x, node.input[0]))
    return np.eye(shape[0], shape[1], k=attrs.get("k", 0)).astype(helper.tensor_dtype_to_np_dtype(et))


@op("ConstantOfShape", attrs=("value",))
def _constant_of_shape(im, node, ins, attrs):
    shape = ints(im, ins[0], "shape")
    v = attrs.get("value", np.zeros(1, np.float32))
    return np.full(shape, v.reshape(-1)[0], dtype=v.dtype)


@op("Constant", attrs=None)
def _constant(im, node, ins, attrs):
    for k in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if k in attrs:
            v = attrs[k]
            dt = np.float32 if "float" in k else (np.int64 if "int" in k else None)
            return np.asarray(v, dtype=dt) if dt else np.asarray(v)
    unsupported(f"attributes {sorted(attrs)}")


@op("Dropout", attrs=("ratio", "seed", "is_test", "consumed_inputs"))
def _dropout(im, node, ins, attrs):
    if len(ins) > 2 and ins[2] is not None:
        tm = const(im, ins[2], "training_mode")
        if bool(tm.reshape(-1)[0]):
            unsupported("training_mode=True is not supported")
    x = X(im, ins[0])
    outs = [im.b.identity(x)]
    if len(node.output) > 1 and node.output[1]:
        outs.append(np.ones(x.shape, dtype=np.bool_))
    return outs


# -- movement ---------------------------------------------------------------------------------


def _reshape_shape(in_shape, shape, allowzero=False):
    out = []
    for i, s in enumerate(shape):
        if s == 0 and not allowzero:
            out.append(in_shape[i])
        else:
            out.append(s)
    if -1 in out:
        k = out.index(-1)
        rest = prod(d for j, d in enumerate(out) if j != k)
        out[k] = prod(in_shape) // rest if rest else 0
    if prod(out) != prod(in_shape):
        unsupported(f"cannot reshape {list(in_shape)} to {shape}")
    return out


@op("Reshape", attrs=("allowzero", "shape", "consumed_inputs"))
def _reshape(im, node, ins, attrs):
    shape = attrs.get("shape") if im.cur_opset < 5 else ints(im, ins[1], "shape")
    x = X(im, ins[0])
    out = _reshape_shape(x.shape, list(shape), attrs.get("allowzero", 0))
    return _keep_bool(im, x, im.b.reshape(x, out))


def _keep_bool(im, src, y):
    if id(src) in im.bools:
        mark_bool(im, y)
    return y


@op("Flatten", attrs=("axis",))
def _flatten(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    axis = attrs.get("axis", 1)
    axis = axis + r if axis < 0 else axis
    return _keep_bool(im, x, im.b.reshape(x, [prod(x.shape[:axis]), prod(x.shape[axis:])]))


def _axes_arg(im, node, ins, attrs, idx=1):
    if "axes" in attrs:
        return list(attrs["axes"])
    if len(ins) > idx and ins[idx] is not None:
        return ints(im, ins[idx], "axes")
    return None


@op("Squeeze", attrs=("axes",))
def _squeeze(im, node, ins, attrs):
    x = X(im, ins[0])
    axes = _axes_arg(im, node, ins, attrs)
    r = len(x.shape)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {norm_axis(a, r) for a in axes}
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return _keep_bool(im, x, im.b.reshape(x, shape))


@op("Unsqueeze", attrs=("axes",))
def _unsqueeze(im, node, ins, attrs):
    x = X(im, ins[0])
    axes = _axes_arg(im, node, ins, attrs)
    r = len(x.shape) + len(axes)
    axes = sorted(norm_axis(a, r) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return _keep_bool(im, x, im.b.reshape(x, shape))


@op("Transpose", attrs=("perm",))
def _transpose(im, node, ins, attrs):
    x = X(im, ins[0])
    perm = attrs.get("perm")
    if perm is None:
        perm = list(range(len(x.shape)))[::-1]
    return _keep_bool(im, x, im.b.transpose(x, permutation=list(perm)))


@op("Concat", attrs=("axis",))
def _concat(im, node, ins, attrs):
    vals = [v for v in ins if v is not None and not (isinstance(v, np.ndarray) and v.size == 0)]
    first = next((v for v in vals if not isinstance(v, np.ndarray)), None)
    xs = [X(im, v, first) for v in vals]
    r = len(xs[0].shape)
    axis = norm_axis(attrs.get("axis", 1 if im.cur_opset < 4 else 0), r)
    xs = [x for x in xs if x.shape[axis] != 0]
    if len(xs) == 1:
        return _keep_bool(im, xs[0], im.b.identity(xs[0]))
    dt = xs[0].data_type
    xs = [x if x.data_type == dt else im.b.cast(x, dt) for x in xs]
    return _keep_bool(im, xs[0], im.b.concat(xs, axis))


@op("Split", attrs=("axis", "split", "num_outputs"))
def _split(im, node, ins, attrs):
    if len(ins) > 1 and ins[1] is not None:
        ints(im, ins[1], "split")
    x = X(im, ins[0])
    r = len(x.shape)
    axis = norm_axis(attrs.get("axis", 0), r)
    n_out = len(node.output)
    sizes = attrs.get("split")
    if sizes is None and len(ins) > 1 and ins[1] is not None:
        sizes = ints(im, ins[1], "split")
    d = x.shape[axis]
    if sizes is None:
        if "num_outputs" in attrs:
            n = attrs["num_outputs"]
            k = -(-d // n)
            sizes = [k] * (d // k) + ([d - k * (d // k)] if d % k else [])
        else:
            if d % n_out:
                unsupported(f"dimension {d} does not split evenly into {n_out} outputs")
            sizes = [d // n_out] * n_out
    sizes = list(sizes)
    if len(sizes) == 1:
        return [im.b.identity(x)]
    nz = [s for s in sizes if s]
    outs = iter(im.b.split(x, nz, axis=axis) if len(nz) > 1 else [im.b.identity(x)])
    res = []
    for sz in sizes:
        if sz:
            res.append(_keep_bool(im, x, next(outs)))
        else:  # WebNN has no zero-sized tensors: an empty piece is an (empty) host constant
            shp = list(x.shape)
            shp[axis] = 0
            res.append(np.zeros(shp, dtype=helper.tensor_dtype_to_np_dtype(im.onnx_type(x))))
    return res


def _slice_params(shape, starts, ends, axes, steps):
    r = len(shape)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    st, sz, stride, rev = [0] * r, list(shape), [1] * r, []
    for s, e, a, k in zip(starts, ends, axes, steps):
        a = norm_axis(a, r)
        d = shape[a]
        if k == 0:
            unsupported("slice step 0")
        lo, hi, step = slice(max(min(s, 2**62), -(2**62)), max(min(e, 2**62), -(2**62)), k).indices(d)
        idx = range(lo, hi, step)
        n = len(idx)
        if n == 0:
            raise _Empty()
        if step < 0:
            rev.append(a)
            lo = d - 1 - lo
            step = -step
        st[a], sz[a], stride[a] = lo, n, step
    return st, sz, stride, rev


class _Empty(Exception):
    pass


@op("Slice", attrs=("starts", "ends", "axes"))
def _slice(im, node, ins, attrs):
    x = X(im, ins[0])
    if im.cur_opset < 10:
        starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
    else:
        starts = ints(im, ins[1], "starts")
        ends = ints(im, ins[2], "ends")
        axes = ints(im, ins[3], "axes") if len(ins) > 3 else None
        steps = ints(im, ins[4], "steps") if len(ins) > 4 else None
    try:
        st, sz, stride, rev = _slice_params(x.shape, list(starts), list(ends), axes and list(axes), steps)
    except _Empty:
        # empty result: WebNN has no zero-sized tensors, so it is an (empty) host constant
        ref = np.zeros(x.shape, dtype=helper.tensor_dtype_to_np_dtype(im.onnx_type(x)))
        sl = [slice(None)] * len(x.shape)
        for i, (s0, e0) in enumerate(zip(starts, ends)):
            a = norm_axis(axes[i], len(x.shape)) if axes else i
            sl[a] = slice(s0, e0, steps[i] if steps else 1)
        return ref[tuple(sl)]
    if rev:
        x2 = im.b.reverse(x, axes=rev)
    else:
        x2 = x
    if list(st) == [0] * len(st) and list(sz) == list(x.shape) and all(s == 1 for s in stride):
        return _keep_bool(im, x, im.b.identity(x2))
    kw = {"strides": stride} if any(s != 1 for s in stride) else {}
    # WebNN sizes count input elements spanned (the output has ceil(size / stride))
    span = [(n - 1) * k + 1 for n, k in zip(sz, stride)]
    return _keep_bool(im, x, im.b.slice(x2, st, span, **kw))


@op("Pad", attrs=("mode", "pads", "value", "paddings"))
def _pad(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    mode = attrs.get("mode", "constant")
    if im.cur_opset < 11:
        pads = list(attrs.get("pads", attrs.get("paddings")))
        value = attrs.get("value", 0.0)
    else:
        pads = ints(im, ins[1], "pads")
        cv = ins[2] if len(ins) > 2 else None
        if cv is not None and not isinstance(cv, np.ndarray) and getattr(cv, "_kind", None) != "input":
            value = cv  # computed: applied through a mask below
        else:
            value = float(const(im, cv, "constant_value").reshape(-1)[0]) if cv is not None and cv.size else 0
        axes = ints(im, ins[3], "axes") if len(ins) > 3 and ins[3] is not None else None
        if axes is not None:
            full = [0] * (2 * r)
            n = len(axes)
            for i, a in enumerate(axes):
                a = norm_axis(a, r)
                full[a], full[a + r] = pads[i], pads[i + n]
            pads = full
    begin, end = pads[:r], pads[r:]
    modes = {"constant": "constant", "edge": "edge", "reflect": "reflection", "wrap": "wrap"}
    if mode not in modes:
        unsupported(f"pad mode {mode!r} is not supported (constant, edge, reflect, wrap)")
    # negative pads crop
    if any(p < 0 for p in begin + end):
        st = [max(-p, 0) for p in begin]
        sz = [d - max(-b, 0) - max(-e, 0) for d, b, e in zip(x.shape, begin, end)]
        x = im.b.slice(x, st, sz)
        begin = [max(p, 0) for p in begin]
        end = [max(p, 0) for p in end]
    if not any(begin) and not any(end):
        return im.b.identity(x)
    b = im.b
    if mode == "wrap":
        for a in range(r):
            p, q = begin[a], end[a]
            if not p and not q:
                continue
            d = x.shape[a]
            if p > d or q > d:
                unsupported("wrap padding larger than the dimension")
            parts = []
            if p:
                parts.append(b.slice(x, [0] * a + [d - p] + [0] * (r - a - 1),
                                     [*x.shape[:a], p, *x.shape[a + 1:]]))
            parts.append(x)
            if q:
                parts.append(b.slice(x, [0] * r, [*x.shape[:a], q, *x.shape[a + 1:]]))
            x = b.concat(parts, a)
        return x
    kw = {"mode": modes[mode]}
    if mode == "constant" and not isinstance(value, (int, float)):
        # constant value computed in the graph: pad with 0, then select it where the padding is
        mask = np.pad(np.ones(x.shape, np.uint8), list(zip(begin, end)))
        cv = X(im, value, x)
        if cv.shape:
            cv = b.reshape(cv, [])
        return b.where(X(im, mask), b.pad(x, begin, end), cv)
    if mode == "constant":
        kw["value"] = value
    return b.pad(x, begin, end, **kw)


def _broadcast(a, c):
    n = max(len(a), len(c))
    a = [1] * (n - len(a)) + list(a)
    c = [1] * (n - len(c)) + list(c)
    out = []
    for p, q in zip(a, c):
        if p != q and p != 1 and q != 1:
            unsupported(f"shapes {a} and {c} do not broadcast")
        out.append(q if p == 1 else p)
    return out


@op("Expand")
def _expand(im, node, ins, attrs):
    x = X(im, ins[0])
    shape = _broadcast(x.shape, ints(im, ins[1], "shape"))
    if tuple(shape) == tuple(x.shape):
        return _keep_bool(im, x, im.b.identity(x))
    return _keep_bool(im, x, im.b.expand(x, shape))


@op("Tile")
def _tile(im, node, ins, attrs):
    x = X(im, ins[0])
    reps = ints(im, ins[1], "repeats")
    return _keep_bool(im, x, im.b.tile(x, reps))


def _indices(im, idx):
    """ONNX indices as an operand. Negative ones need no fixing: the WebNN gather/scatter kernels
    count them from the end of the dimension. int64 indices known at load that fit are narrowed
    to int32 (cheaper to read, and not 64-bit arithmetic where that is emulated)."""
    if isinstance(idx, np.ndarray) and idx.dtype.kind == "i" and idx.size and np.abs(idx).max() < 2**31:
        idx = idx.astype(np.int32)
    return X(im, idx)


@op("Gather", "GatherElements", attrs=("axis",))
def _gather(im, node, ins, attrs):
    x = X(im, ins[0])
    axis = norm_axis(attrs.get("axis", 0), len(x.shape))
    fn = im.b.gather if node.op_type == "Gather" else im.b.gather_elements
    return _keep_bool(im, x, fn(x, _indices(im, ins[1]), axis=axis))


@op("GatherND", attrs=("batch_dims",))
def _gather_nd(im, node, ins, attrs):
    if attrs.get("batch_dims", 0):
        unsupported("batch_dims != 0 is not supported")
    x = X(im, ins[0])
    return _keep_bool(im, x, im.b.gather_nd(x, _indices(im, ins[1])))


@op("ScatterElements", "Scatter", attrs=("axis", "reduction"))
def _scatter_elements(im, node, ins, attrs):
    if attrs.get("reduction", "none") != "none":
        unsupported(f"reduction {attrs['reduction']!r} is not supported")
    x = X(im, ins[0])
    axis = norm_axis(attrs.get("axis", 0), len(x.shape))
    return im.b.scatter_elements(x, _indices(im, ins[1]), X(im, ins[2], x), axis=axis)


@op("ScatterND", attrs=("reduction",))
def _scatter_nd(im, node, ins, attrs):
    if attrs.get("reduction", "none") != "none":
        unsupported(f"reduction {attrs['reduction']!r} is not supported")
    x = X(im, ins[0])
    return im.b.scatter_nd(x, _indices(im, ins[1]), X(im, ins[2], x))


@op("Trilu", attrs=("upper",))
def _trilu(im, node, ins, attrs):
    k = ints(im, ins[1], "k")[0] if len(ins) > 1 and ins[1] is not None else 0
    x = X(im, ins[0])
    return im.b.triangular(x, upper=bool(attrs.get("upper", 1)), diagonal=k)


@op("DepthToSpace", attrs=("blocksize", "mode"))
def _depth_to_space(im, node, ins, attrs):
    x = X(im, ins[0])
    n, c, h, w = x.shape
    bs = attrs["blocksize"]
    b = im.b
    if attrs.get("mode", "DCR") == "DCR":
        t = b.reshape(x, [n, bs, bs, c // bs // bs, h, w])
        t = b.transpose(t, permutation=[0, 3, 4, 1, 5, 2])
    else:
        t = b.reshape(x, [n, c // bs // bs, bs, bs, h, w])
        t = b.transpose(t, permutation=[0, 1, 4, 2, 5, 3])
    return b.reshape(t, [n, c // bs // bs, h * bs, w * bs])


@op("SpaceToDepth", attrs=("blocksize", "mode"))
def _space_to_depth(im, node, ins, attrs):
    x = X(im, ins[0])
    n, c, h, w = x.shape
    bs = attrs["blocksize"]
    b = im.b
    t = b.reshape(x, [n, c, h // bs, bs, w // bs, bs])
    crd = attrs.get("mode", "DCR") == "CRD"
    t = b.transpose(t, permutation=[0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4])
    return b.reshape(t, [n, c * bs * bs, h // bs, w // bs])


@op("OneHot", attrs=("axis",))
def _onehot(im, node, ins, attrs):
    idx, depth, values = ins
    depth = int(const(im, depth, "depth").reshape(-1)[0])
    vals = X(im, values)
    b = im.b
    x = X(im, idx)
    if is_float(x):
        x = b.cast(x, "int32")
    x = b.where(b.lesser(x, scalar(im, 0, x)), b.add(x, scalar(im, depth, x)), x)
    r = len(x.shape) + 1
    axis = norm_axis(attrs.get("axis", -1), r)
    shape = list(x.shape)
    shape.insert(axis, 1)
    xr = b.reshape(x, shape)
    ar_shape = [1] * r
    ar_shape[axis] = depth
    ar = X(im, np.arange(depth).reshape(ar_shape).astype(np.dtype(x.data_type)))
    hit = b.equal(xr, ar)
    off = b.reshape(b.slice(vals, [0], [1]), [])
    on = b.reshape(b.slice(vals, [1], [1]), [])
    out_shape = list(x.shape)
    out_shape.insert(axis, depth)
    return b.where(b.expand(hit, out_shape), on, off)


@op("Compress", attrs=("axis",))
def _compress(im, node, ins, attrs):
    x = X(im, ins[0])
    cond = const(im, ins[1], "condition").astype(bool)
    idx = np.nonzero(cond)[0].astype(np.int32)
    if "axis" not in attrs:
        x = im.b.reshape(x, [prod(x.shape)])
        axis = 0
    else:
        axis = norm_axis(attrs["axis"], len(x.shape))
    idx = idx[idx < x.shape[axis]]
    return im.b.gather(x, X(im, idx), axis=axis)


@op("Range")
def _range(im, node, ins, attrs):
    start, limit, delta = (const(im, v, w) for v, w in zip(ins, ("start", "limit", "delta")))
    n = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + np.arange(n) * delta).astype(start.dtype)


@op("If", attrs=("then_branch", "else_branch"))
def _if(im, node, ins, attrs):
    cond = const(im, ins[0], "cond (the branch must be chosen at load)")
    g = attrs["then_branch"] if bool(cond.reshape(-1)[0]) else attrs["else_branch"]
    for init in g.initializer:
        im.env[init.name] = im._tensor(init)
    im.run_nodes(g.node, im.cur_opset)
    return [im.env[o.name] for o in g.output]


# -- reductions -------------------------------------------------------------------------------

_REDUCE = {
    "ReduceSum": "reduce_sum", "ReduceMean": "reduce_mean", "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min", "ReduceProd": "reduce_product", "ReduceL1": "reduce_l1",
    "ReduceL2": "reduce_l2", "ReduceLogSum": "reduce_log_sum", "ReduceLogSumExp": "reduce_log_sum_exp",
    "ReduceSumSquare": "reduce_sum_square",
}


@op(*_REDUCE, attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(im, node, ins, attrs):
    axes = _axes_arg(im, node, ins, attrs)
    x = X(im, ins[0])
    keep = bool(attrs.get("keepdims", 1))
    r = len(x.shape)
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return im.b.identity(x)
        axes = list(range(r))
    axes = sorted({norm_axis(a, r) for a in axes})
    fn = _REDUCE[node.op_type]
    if x.data_type == "uint8" and id(x) in im.bools:
        x = im.b.cast(x, "int32")
    return getattr(im.b, fn)(x, axes=axes, keep_dimensions=keep)


@op("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def _argminmax(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    axis = norm_axis(attrs.get("axis", 0), r)
    keep = bool(attrs.get("keepdims", 1))
    fn = "arg_max" if node.op_type == "ArgMax" else "arg_min"
    if attrs.get("select_last_index", 0):
        xr = im.b.reverse(x, axes=[axis])
        i = getattr(im.b, fn)(xr, axis, keep_dimensions=keep, output_data_type="int64")
        return im.b.sub(scalar(im, x.shape[axis] - 1, i), i)
    return getattr(im.b, fn)(x, axis, keep_dimensions=keep, output_data_type="int64")


@op("CumSum", attrs=("exclusive", "reverse"))
def _cumsum(im, node, ins, attrs):
    x = X(im, ins[0])
    axis = norm_axis(ints(im, ins[1], "axis")[0], len(x.shape))
    return im.b.cumulative_sum(x, axis, exclusive=bool(attrs.get("exclusive", 0)),
                               reversed=bool(attrs.get("reverse", 0)))


# -- softmax family ------------------------------------------------------------------------------


def _softmax_2d(im, x, attrs, fn):
    """opset < 13: coerce to 2D at `axis` (default 1), normalize rows, restore the shape."""
    r = len(x.shape)
    axis = norm_axis(attrs.get("axis", 1), r)
    if axis == r - 1:
        return fn(x, r - 1)
    x2 = im.b.reshape(x, [prod(x.shape[:axis]), prod(x.shape[axis:])])
    return im.b.reshape(fn(x2, 1), list(x.shape))


def _log_softmax(im, x, axis):
    b = im.b
    m = b.reduce_max(x, axes=[axis], keep_dimensions=True)
    s = b.sub(x, m)
    return b.sub(s, b.log(b.reduce_sum(b.exp(s), axes=[axis], keep_dimensions=True)))


def _hardmax(im, x, axis):
    b = im.b
    i = b.arg_max(x, axis, keep_dimensions=True, output_data_type="int32")
    shp = [1] * len(x.shape)
    shp[axis] = x.shape[axis]
    ar = X(im, np.arange(x.shape[axis], dtype=np.int32).reshape(shp))
    hit = b.equal(i, ar)
    return b.where(hit, scalar(im, 1, x), scalar(im, 0, x))


@op("Softmax", "LogSoftmax", "Hardmax", attrs=("axis",))
def _softmax(im, node, ins, attrs):
    x = X(im, ins[0])
    fn = {
        "Softmax": lambda t, a: im.b.softmax(t, a),
        "LogSoftmax": lambda t, a: _log_softmax(im, t, a),
        "Hardmax": lambda t, a: _hardmax(im, t, a),
    }[node.op_type]
    if im.cur_opset < 13:
        return _softmax_2d(im, x, attrs, fn)
    return fn(x, norm_axis(attrs.get("axis", -1), len(x.shape)))


# -- matmul ---------------------------------------------------------------------------------------


@op("MatMul")
def _matmul(im, node, ins, attrs):
    a = X(im, ins[0])
    w = ins[1]
    b = im.b
    if isinstance(w, np.ndarray) and w.ndim == 2 and w.size * 4 > im.ctx._max_bytes and len(a.shape) >= 2:
        # a weight above the largest binding: split along N, concat the partial products
        n = w.shape[1]
        step = -(-n // -(-w.size * 4 // im.ctx._max_bytes))
        outs = [b.matmul(a, X(im, np.ascontiguousarray(w[:, lo:lo + step]), a)) for lo in range(0, n, step)]
        return b.concat(outs, len(a.shape) - 1)
    c = X(im, w, a)
    ra, rc = len(a.shape), len(c.shape)
    a2 = b.reshape(a, [1, a.shape[0]]) if ra == 1 else a
    c2 = b.reshape(c, [c.shape[0], 1]) if rc == 1 else c
    y = b.matmul(a2, c2)
    if ra == 1 or rc == 1:
        shape = list(y.shape)
        if rc == 1:
            shape.pop(-1)
        if ra == 1:
            shape.pop(-2 if rc != 1 else -1)
        y = b.reshape(y, shape)
    return y


@op("Gemm", attrs=("alpha", "beta", "transA", "transB", "broadcast"))
def _gemm(im, node, ins, attrs):
    a = X(im, ins[0])
    kw = {}
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        kw["alpha"] = alpha
    if attrs.get("transA", 0):
        kw["a_transpose"] = True
    tb = bool(attrs.get("transB", 0))
    if tb:
        kw["b_transpose"] = True
    if beta != 1.0 and len(ins) > 2 and ins[2] is not None:
        kw["beta"] = beta
    w = ins[1]
    c = ins[2] if len(ins) > 2 else None
    limit = im.ctx._max_bytes
    if isinstance(w, np.ndarray) and w.ndim == 2 and w.size * 4 > limit:
        # a weight above the largest binding: split it along N, one gemm per slice, concat
        n = w.shape[0] if tb else w.shape[1]
        pieces = -(-w.size * 4 // limit)
        step = -(-n // pieces)
        outs = []
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            wi = np.ascontiguousarray(w[lo:hi] if tb else w[:, lo:hi])
            kwi = dict(kw)
            if c is not None:
                ci = c
                if isinstance(c, np.ndarray) and c.ndim and c.shape[-1] == n:
                    ci = np.ascontiguousarray(c[..., lo:hi])
                elif not isinstance(c, np.ndarray) or (c.ndim and c.shape[-1] != 1):
                    unsupported("a split weight with a computed or full-size C")
                kwi["c"] = X(im, ci, a)
            outs.append(im.b.gemm(a, X(im, wi, a), **kwi))
        return im.b.concat(outs, 1)
    bb = X(im, w, a)
    if c is not None:
        kw["c"] = X(im, c, a)
    return im.b.gemm(a, bb, **kw)


# -- convolution and pooling ---------------------------------------------------------------------


def _explicit_pads(attrs, in_sp, k, s, d, transposed=False):
    """ONNX pads / auto_pad -> [begin..., end...] for the spatial dims."""
    n = len(in_sp)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        p = list(attrs.get("pads", [0] * (2 * n)))
        return p[:n], p[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        unsupported(f"auto_pad {auto!r}")
    begin, end = [], []
    for i in range(n):
        ek = (k[i] - 1) * d[i] + 1
        out = -(-in_sp[i] // s[i])
        total = max(0, (out - 1) * s[i] + ek - in_sp[i])
        small = total // 2
        if auto == "SAME_UPPER":
            begin.append(small)
            end.append(total - small)
        else:
            begin.append(total - small)
            end.append(small)
    return begin, end


def _to2d(im, x, sp_rank):
    """1D convolution/pool: [N, C, L] -> [N, C, 1, L]."""
    if sp_rank == 2:
        return x
    if sp_rank == 1:
        return im.b.reshape(x, list(x.shape[:2]) + [1, x.shape[2]])
    unsupported(f"{sp_rank}D spatial inputs are not supported (WebNN is 2D)")


def _webnn_pad(begin, end):
    return [begin[0], end[0], begin[1], end[1]]


@op("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def _conv(im, node, ins, attrs):
    x = X(im, ins[0])
    w = X(im, ins[1], x)
    sp = len(x.shape) - 2
    k = attrs.get("kernel_shape") or list(w.shape[2:])
    s = attrs.get("strides") or [1] * sp
    d = attrs.get("dilations") or [1] * sp
    begin, end = _explicit_pads(attrs, list(x.shape[2:]), k, s, d)
    if sp == 1:
        k, s, d, begin, end = [1] + list(k), [1] + list(s), [1] + list(d), [0] + begin, [0] + end
        w = im.b.reshape(w, list(w.shape[:2]) + [1, w.shape[2]])
    x2 = _to2d(im, x, sp)
    kw = dict(padding=_webnn_pad(begin, end), strides=list(s), dilations=list(d),
              groups=attrs.get("group", 1))
    if len(ins) > 2 and ins[2] is not None:
        kw["bias"] = X(im, ins[2], x)
    y = im.b.conv2d(x2, w, **kw)
    if sp == 1:
        y = im.b.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
    return y


@op("ConvTranspose", attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                            "output_shape", "pads", "strides"))
def _conv_transpose(im, node, ins, attrs):
    x = X(im, ins[0])
    w = X(im, ins[1], x)
    sp = len(x.shape) - 2
    if sp not in (1, 2):
        unsupported(f"{sp}D ConvTranspose is not supported")
    in_sp = list(x.shape[2:])
    k = list(attrs.get("kernel_shape") or w.shape[2:])
    s = list(attrs.get("strides") or [1] * sp)
    d = list(attrs.get("dilations") or [1] * sp)
    op_ = list(attrs.get("output_padding") or [0] * sp)
    auto = attrs.get("auto_pad", "NOTSET")
    out_shape = attrs.get("output_shape")
    if out_shape is not None:
        out_shape = list(out_shape)[-sp:]
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            out_shape = [in_sp[i] * s[i] for i in range(sp)]
        begin, end = [], []
        for i in range(sp):
            total = s[i] * (in_sp[i] - 1) + op_[i] + (k[i] - 1) * d[i] + 1 - out_shape[i]
            if total < 0:
                # extra output rows come from output padding
                op_[i] -= total
                total = 0
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
    elif auto == "VALID":
        begin, end = [0] * sp, [0] * sp
    else:
        p = list(attrs.get("pads", [0] * (2 * sp)))
        begin, end = p[:sp], p[sp:]
    if sp == 1:
        k, s, d, op_, begin, end = [1] + k, [1] + s, [1] + d, [0] + op_, [0] + begin, [0] + end
        w = im.b.reshape(w, list(w.shape[:2]) + [1, w.shape[2]])
    x2 = _to2d(im, x, sp)
    kw = dict(padding=_webnn_pad(begin, end), strides=s, dilations=d, groups=attrs.get("group", 1))
    if any(op_):
        kw["output_padding"] = op_
    if len(ins) > 2 and ins[2] is not None:
        kw["bias"] = X(im, ins[2], x)
    y = im.b.conv_transpose2d(x2, w, **kw)
    if sp == 1:
        y = im.b.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
    return y


def _pool_out(in_sp, k, s, d, begin, end, ceil):
    out = []
    for i in range(len(in_sp)):
        ek = (k[i] - 1) * d[i] + 1
        span = in_sp[i] + begin[i] + end[i] - ek
        if ceil:
            o = -(-span // s[i]) + 1
            if (o - 1) * s[i] >= in_sp[i] + begin[i]:  # last window would start in the padding
                o -= 1
        else:
            o = span // s[i] + 1
        out.append(o)
    return out


@op("MaxPool", "AveragePool", "LpPool",
    attrs=("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads",
           "storage_order", "strides", "p"))
def _pool(im, node, ins, attrs):
    if len(node.output) > 1 and node.output[1]:
        unsupported("the Indices output of MaxPool is not supported")
    x = X(im, ins[0])
    sp = len(x.shape) - 2
    k = list(attrs["kernel_shape"])
    s = list(attrs.get("strides") or [1] * sp)
    d = list(attrs.get("dilations") or [1] * sp)
    in_sp = list(x.shape[2:])
    auto = attrs.get("auto_pad", "NOTSET")
    ceil = bool(attrs.get("ceil_mode", 0))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = _explicit_pads(attrs, in_sp, k, s, d)
        out = [-(-in_sp[i] // s[i]) for i in range(sp)]
    else:
        begin, end = _explicit_pads(attrs, in_sp, k, s, d)
        out = _pool_out(in_sp, k, s, d, begin, end, ceil)
    b = im.b
    t = node.op_type
    p = attrs.get("p", 2)
    if t == "LpPool" and p != 2:
        # (sum |x|^p)^(1/p): zero-pad explicitly, average without padding, times the window size
        xp = b.pow(b.abs(x), scalar(im, float(p), x))
        if any(begin + end):
            xp = b.pad(xp, [0, 0] + begin, [0, 0] + end)
        if sp == 1:
            k1, s1, d1, o1 = [1] + k, [1] + s, [1] + d, [1] + out
        else:
            k1, s1, d1, o1 = k, s, d, out
        x2 = _to2d(im, xp, sp)
        kw = dict(window_dimensions=k1, strides=s1, dilations=d1)
        if list(o1) != _pool_out(x2.shape[2:], k1, s1, d1, [0, 0], [0, 0], False):
            kw["output_sizes"] = list(o1)
        avg = b.average_pool2d(x2, **kw)
        y = b.pow(b.mul(avg, scalar(im, float(prod(k)), x)), scalar(im, 1.0 / p, x))
        if sp == 1:
            y = b.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
        return y
    if t == "AveragePool" and attrs.get("count_include_pad", 0) and any(begin + end):
        # WebNN averages over the window without the padding: pad explicitly with zeros
        x = b.pad(x, [0, 0] + begin, [0, 0] + end)
        in_sp = list(x.shape[2:])
        begin, end = [0] * sp, [0] * sp
    if sp == 1:
        k, s, d, begin, end, out = [1] + k, [1] + s, [1] + d, [0] + begin, [0] + end, [1] + out
    x2 = _to2d(im, x, sp)
    fn = {"MaxPool": "max_pool2d", "AveragePool": "average_pool2d", "LpPool": "l2_pool2d"}[t]
    kw = dict(window_dimensions=k, padding=_webnn_pad(begin, end), strides=s, dilations=d)
    floor_out = _pool_out(x2.shape[2:], k, s, d, begin, end, False)
    if list(out) != floor_out:
        kw["output_sizes"] = list(out)
    y = getattr(b, fn)(x2, **kw)
    if sp == 1:
        y = b.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
    return y


@op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool", attrs=("p",))
def _global_pool(im, node, ins, attrs):
    x = X(im, ins[0])
    axes = list(range(2, len(x.shape)))
    if node.op_type == "GlobalLpPool":
        if attrs.get("p", 2) != 2:
            unsupported("GlobalLpPool with p != 2")
        return im.b.reduce_l2(x, axes=axes, keep_dimensions=True)
    fn = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return getattr(im.b, fn)(x, axes=axes, keep_dimensions=True)


@op("LRN", attrs=("alpha", "beta", "bias", "size"))
def _lrn(im, node, ins, attrs):
    x = X(im, ins[0])
    size = attrs["size"]
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    b = im.b
    n, c = x.shape[:2]
    rest = prod(x.shape[2:])
    sq = b.reshape(b.mul(x, x), [n, 1, c, rest])
    lo, hi = (size - 1) // 2, -(-(size - 1) // 2)
    sq = b.pad(sq, [0, 0, lo, 0], [0, 0, hi, 0])
    avg = b.average_pool2d(sq, window_dimensions=[size, 1])
    # bias + alpha/size * sum == bias + alpha * avg (the window always holds `size` values)
    den = b.pow(b.add(b.mul(avg, scalar(im, alpha, x)), scalar(im, bias, x)), scalar(im, beta, x))
    return b.div(x, b.reshape(den, list(x.shape)))


# -- normalization ---------------------------------------------------------------------------------


@op("BatchNormalization", attrs=("epsilon", "momentum", "spatial", "training_mode", "is_test",
                                 "consumed_inputs"))
def _batchnorm(im, node, ins, attrs):
    if attrs.get("training_mode", 0):
        unsupported("training_mode=1 is not supported")
    if attrs.get("spatial", 1) != 1:
        unsupported("spatial=0 is not supported")
    if len([o for o in node.output if o]) > 1:
        unsupported("the training outputs (running mean/var) are not supported")
    x = X(im, ins[0])
    scale, bias, mean, var = (X(im, v, x) for v in ins[1:5])
    return im.b.batch_normalization(x, mean, var, scale=scale, bias=bias, axis=1,
                                    epsilon=attrs.get("epsilon", 1e-5))


@op("InstanceNormalization", attrs=("epsilon",))
def _instnorm(im, node, ins, attrs):
    x = X(im, ins[0])
    scale, bias = X(im, ins[1], x), X(im, ins[2], x)
    sp = len(x.shape) - 2
    eps = attrs.get("epsilon", 1e-5)
    if sp == 2:
        return im.b.instance_normalization(x, scale=scale, bias=bias, epsilon=eps)
    # any rank: normalize over the spatial axes, then scale/shift per channel
    axes = list(range(2, len(x.shape)))
    shp = [1, x.shape[1]] + [1] * sp
    y = im.b.layer_normalization(x, axes=axes, epsilon=eps)
    return im.b.add(im.b.mul(y, im.b.reshape(scale, shp)), im.b.reshape(bias, shp))


@op("LayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _layernorm(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    axis = norm_axis(attrs.get("axis", -1), r)
    axes = list(range(axis, r))
    if len([o for o in node.output if o]) > 1:
        # Mean and InvStdDev requested too: decompose
        b = im.b
        mean = b.reduce_mean(x, axes=axes, keep_dimensions=True)
        c = b.sub(x, mean)
        var = b.reduce_mean(b.mul(c, c), axes=axes, keep_dimensions=True)
        inv = b.reciprocal(b.sqrt(b.add(var, scalar(im, attrs.get("epsilon", 1e-5), x))))
        y = b.mul(b.mul(c, inv), X(im, ins[1], x))
        if len(ins) > 2 and ins[2] is not None:
            y = b.add(y, X(im, ins[2], x))
        return [y, mean, inv]
    kw = {"axes": axes, "epsilon": attrs.get("epsilon", 1e-5)}
    norm_shape = list(x.shape[axis:])
    for v, key in ((ins[1], "scale"), (ins[2] if len(ins) > 2 else None, "bias")):
        if v is None:
            continue
        t = X(im, v, x)
        if list(t.shape) != norm_shape:
            t = im.b.expand(t, norm_shape) if len(t.shape) <= len(norm_shape) else t
        kw[key] = t
    return im.b.layer_normalization(x, **kw)


@op("MeanVarianceNormalization", attrs=("axes",))
def _mvn(im, node, ins, attrs):
    x = X(im, ins[0])
    axes = [norm_axis(a, len(x.shape)) for a in attrs.get("axes", [0, 2, 3])]
    b = im.b
    mean = b.reduce_mean(x, axes=axes, keep_dimensions=True)
    c = b.sub(x, mean)
    var = b.reduce_mean(b.mul(c, c), axes=axes, keep_dimensions=True)
    return b.div(c, b.add(b.sqrt(var), scalar(im, 1e-9, x)))


@op("LpNormalization", attrs=("axis", "p"))
def _lpnorm(im, node, ins, attrs):
    x = X(im, ins[0])
    axis = norm_axis(attrs.get("axis", -1), len(x.shape))
    p = attrs.get("p", 2)
    fn = {1: "reduce_l1", 2: "reduce_l2"}.get(p)
    if fn is None:
        unsupported(f"p={p}")
    n = getattr(im.b, fn)(x, axes=[axis], keep_dimensions=True)
    b = im.b
    zero = scalar(im, 0, x)
    return b.where(b.equal(n, zero), zero, b.div(x, n))


# -- resize ----------------------------------------------------------------------------------------


@op("Resize", "Upsample", attrs=("mode", "coordinate_transformation_mode", "nearest_mode",
                                 "cubic_coeff_a", "exclude_outside", "extrapolation_value",
                                 "antialias", "axes", "keep_aspect_ratio_policy", "scales",
                                 "height_scale", "width_scale"))
def _resize(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    mode = attrs.get("mode", "nearest")
    if isinstance(mode, bytes):
        mode = mode.decode()
    scales = sizes = None
    if node.op_type == "Upsample" or im.cur_opset < 11:
        if "scales" in attrs:
            scales = list(attrs["scales"])
        elif "height_scale" in attrs:
            scales = [1.0, 1.0, attrs["height_scale"], attrs["width_scale"]]
        else:
            scales = [float(v) for v in const(im, ins[1], "scales").reshape(-1)]
        ctm = "asymmetric"
        nearest = "floor"
    else:
        sc = ins[2] if len(ins) > 2 else None
        sz = ins[3] if len(ins) > 3 else None
        if sc is not None and const(im, sc, "scales").size:
            scales = [float(v) for v in sc.reshape(-1)]
        if sz is not None and const(im, sz, "sizes").size:
            sizes = [int(v) for v in sz.reshape(-1)]
        ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
        nearest = attrs.get("nearest_mode", "round_prefer_floor")
    axes = attrs.get("axes")
    axes = list(range(r)) if axes is None else [norm_axis(a, r) for a in axes]
    full_scales = [1.0] * r
    full_sizes = list(x.shape)
    if sizes is not None:
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            sel = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
            f = min(sel) if policy == "not_larger" else max(sel)
            sizes = [int(math.floor(x.shape[a] * f + 0.5)) for a in axes]
        for a, v in zip(axes, sizes):
            full_sizes[a] = v
            full_scales[a] = v / x.shape[a]
    elif scales is not None:
        for a, v in zip(axes, scales):
            full_scales[a] = v
            full_sizes[a] = int(math.floor(x.shape[a] * v))
    changed = [a for a in range(r) if full_sizes[a] != x.shape[a] or full_scales[a] != 1.0]
    if not changed:
        return im.b.identity(x)
    if r == 4 and set(changed) <= {2, 3}:
        changed = [2, 3]
    wmode = {"nearest": "nearest-neighbor", "linear": "linear", "bilinear": "linear"}.get(mode)
    ok = wmode is not None and not attrs.get("antialias", 0) and r == 4 and changed == [2, 3]
    if ok and wmode == "linear":
        if ctm == "pytorch_half_pixel" and all(full_sizes[a] > 1 for a in changed):
            ctm = "half_pixel"
        ok = ctm == "half_pixel"
    elif ok:
        integer_up = all(float(full_scales[a]).is_integer() and full_scales[a] >= 1 and
                         full_sizes[a] == x.shape[a] * full_scales[a] for a in changed)
        ok = integer_up and ((ctm == "asymmetric" and nearest == "floor") or (
            ctm in ("half_pixel", "pytorch_half_pixel") and nearest in ("round_prefer_floor", "round_prefer_ceil")))
    if sizes is None and any(not float(full_scales[a] * x.shape[a]).is_integer() for a in changed):
        ok = False  # ONNX maps coordinates with the given scale, WebNN with out/in: differ
    if ok and hasattr(im.b, "resample2d"):
        kw = {"mode": wmode, "axes": changed}
        if sizes is not None:
            kw["sizes"] = [full_sizes[a] for a in changed]
        else:
            kw["scales"] = [float(full_scales[a]) for a in changed]
        return im.b.resample2d(x, **kw)
    # Anything else (cubic, other coordinate modes, antialias, more axes): every ONNX resize
    # mode is separable and linear in the input, so resize axis by axis as a matmul with an
    # interpolation matrix computed at load by the ONNX reference implementation.
    if not is_float(x):
        unsupported(f"{mode} resize of {x.data_type} data")
    roi = None
    if ctm == "tf_crop_and_resize":
        roi = [float(v) for v in const(im, ins[1], "roi").reshape(-1)]
        n = len(roi) // 2
        roi_axes = axes if n == len(axes) else list(range(r))
        roi = {a: (roi[i], roi[i + n]) for i, a in enumerate(roi_axes)}
    y = x
    for a in changed:
        mat, fill = _interp_matrix(im, node, attrs, x.shape[a], full_sizes[a], full_scales[a], mode, ctm,
                                   nearest, roi and roi.get(a, (0.0, 1.0)))
        y = _apply_along(im, y, a, mat)
        if fill is not None and fill.any():
            shp = [1] * r
            shp[a] = fill.size
            ev = attrs.get("extrapolation_value", 0.0)
            y = im.b.add(y, X(im, (fill * ev).reshape(shp).astype(np.dtype(x.data_type))))
    return y


def _interp_matrix(im, node, attrs, n_in, n_out, scale, mode, ctm, nearest, roi=None):
    """[n_in, n_out] matrix M with resize(v) == v @ M along one axis, and for
    tf_crop_and_resize the 0/1 vector of outputs that take the extrapolation value."""
    from onnx import helper as h

    keep = {k: v for k, v in attrs.items() if k in ("cubic_coeff_a", "exclude_outside", "antialias")}
    roi_arr = np.array([0.0, roi[0], 1.0, roi[1]], dtype=np.float32) if roi else None

    def run(data, extrapolation):
        use_sizes = n_out != int(np.floor(n_in * scale))
        names = ["x", "roi" if roi else "", "" if use_sizes else "scales"] + (["sizes"] if use_sizes else [])
        node2 = h.make_node("Resize", names, ["y"], mode=mode, coordinate_transformation_mode=ctm,
                            nearest_mode=nearest, extrapolation_value=extrapolation, **keep)
        args = [data, roi_arr, None if use_sizes else np.array([1.0, scale], dtype=np.float32)]
        if use_sizes:
            args.append(np.array([data.shape[0], n_out], dtype=np.int64))
        (m,) = im.evaluate(node2, args)
        return np.asarray(m, dtype=np.float32)

    saved = im.cur_opset
    im.cur_opset = max(saved, 19 if keep.get("antialias") else 13)
    try:
        m = run(np.eye(n_in, dtype=np.float32), 0.0)
        fill = run(np.zeros((1, n_in), np.float32), 1.0).reshape(-1) if roi else None
    finally:
        im.cur_opset = saved
    return m, fill


def _apply_along(im, x, axis, mat):
    b = im.b
    r = len(x.shape)
    perm = [i for i in range(r) if i != axis] + [axis]
    t = b.transpose(x, permutation=perm) if axis != r - 1 else x
    rest = list(t.shape[:-1])
    y = b.matmul(b.reshape(t, [prod(rest), t.shape[-1]]), X(im, mat.astype(np.dtype(x.data_type))))
    y = b.reshape(y, rest + [mat.shape[1]])
    if axis != r - 1:
        inv = [perm.index(i) for i in range(r)]
        y = b.transpose(y, permutation=inv)
    return y


# -- quantization ---------------------------------------------------------------------------------


def _q_axis(attrs, scale, r):
    n = prod(scale.shape)
    if n == 1 or not r:
        return 0
    return norm_axis(attrs.get("axis", 1), r)


def _q_param(im, p, x, axis, block_size):
    """Scale / zero point shaped to broadcast against x (per tensor, per axis or blocked)."""
    r = len(x.shape)
    t = X(im, p)
    if len(t.shape) == 0 or prod(t.shape) == 1:
        return im.b.reshape(t, [1] * r) if r else t
    if len(t.shape) == 1 and not block_size:
        shp = [1] * r
        shp[axis] = t.shape[0]
        return im.b.reshape(t, shp)
    return t  # blocked: the parameter has x's rank and WebNN broadcasts it blockwise


def _q_inputs(im, ins, attrs):
    """(x, axis, block size, scale operand) of QuantizeLinear / DequantizeLinear."""
    x = X(im, ins[0])
    axis = _q_axis(attrs, ins[1], len(x.shape))
    bs = attrs.get("block_size", 0)
    return x, axis, bs, _q_param(im, ins[1], x, axis, bs)


@op("QuantizeLinear", attrs=("axis", "saturate", "block_size", "output_dtype", "precision"))
def _quantize(im, node, ins, attrs):
    x, axis, bs, scale = _q_inputs(im, ins, attrs)
    zp = ins[2] if len(ins) > 2 else None
    if zp is None:
        od = attrs.get("output_dtype", 0) or TensorProto.UINT8
        if od not in (TensorProto.UINT8, TensorProto.INT8):
            unsupported(f"output type {TensorProto.DataType.Name(od)}")
        zp = np.zeros(ins[1].shape if isinstance(ins[1], np.ndarray) else scale.shape,
                      dtype=helper.tensor_dtype_to_np_dtype(od))
    zdt = zp.dtype if isinstance(zp, np.ndarray) else np.dtype(
        helper.tensor_dtype_to_np_dtype(im.onnx_type(zp, node.input[2])))
    if zdt not in (np.uint8, np.int8):
        if zdt not in (np.int16, np.uint16, np.int32, np.uint32) or bs:
            unsupported(f"zero point type {zdt}")
        # wider integer types: round(x / scale) + zero point, saturated, in float32
        b = im.b
        info = np.iinfo(zdt)
        zf = b.cast(_q_param(im, zp, x, axis, bs), "float32")
        q = b.add(b.round_even(b.div(to_float(im, x), to_float(im, scale))), zf)
        q = b.clamp(q, min_value=float(info.min), max_value=float(info.max))
        return b.cast(q, WEBNN_TYPE[helper.np_dtype_to_tensor_dtype(zdt)])
    zpo = _q_param(im, zp, x, axis, bs)
    return im.b.quantize_linear(x, scale, zpo)


@op("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"))
def _dequantize(im, node, ins, attrs):
    x, axis, bs, scale = _q_inputs(im, ins, attrs)
    zp = ins[2] if len(ins) > 2 else None
    if zp is None:
        zp = np.zeros(ins[1].shape if isinstance(ins[1], np.ndarray) else scale.shape,
                      dtype=np.dtype(x.data_type))
    zpo = _q_param(im, zp, x, axis, bs)
    return im.b.dequantize_linear(x, scale, zpo)


# -- recurrent --------------------------------------------------------------------------------------

_DIRECTION = {"forward": "forward", "reverse": "backward", "bidirectional": "both"}
_ACT = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu"}


def _rnn_common(im, node, ins, attrs, gates):
    if "clip" in attrs:
        unsupported("clip is not supported")
    x = X(im, ins[0])
    if attrs.get("layout", 0):  # batch-first: [batch, seq, in] -> [seq, batch, in]
        x = im.b.transpose(x, permutation=[1, 0, 2])
    steps = x.shape[0]
    if len(ins) > 4 and ins[4] is not None:
        sl = const(im, ins[4], "sequence_lens")
        if not np.all(sl == steps):
            unsupported("sequence_lens shorter than the sequence")
    hidden = attrs.get("hidden_size") or ins[2].shape[-1]
    direction = _DIRECTION[attrs.get("direction", "forward")]
    acts = attrs.get("activations")
    kw = {"direction": direction}
    if acts is not None:
        n = len(acts) // (2 if direction == "both" else 1)
        if direction == "both" and acts[:n] != acts[n:]:
            unsupported("different activations per direction")
        if any(a not in _ACT for a in acts):
            unsupported(f"activations {acts}")
        kw["activations"] = [_ACT[a] for a in acts[:n]]
    if attrs.get("activation_alpha") or attrs.get("activation_beta"):
        unsupported("activation_alpha/beta")
    w = X(im, ins[1], x)
    r = X(im, ins[2], x)
    if len(ins) > 3 and ins[3] is not None:
        bias = X(im, ins[3], x)
        wb, rb = im.b.split(bias, 2, axis=1)
        kw["bias"], kw["recurrent_bias"] = wb, rb
    if len(ins) > 5 and ins[5] is not None:
        kw["initial_hidden_state"] = _state_in(im, X(im, ins[5], x), attrs)
    kw["return_sequence"] = bool(node.output and node.output[0])
    return x, w, r, steps, hidden, kw


def _state_in(im, s, attrs):
    return im.b.transpose(s, permutation=[1, 0, 2]) if attrs.get("layout", 0) else s


def _rnn_outs(im, attrs, y, states):
    """WebNN [steps, dirs, batch, hidden] / [dirs, batch, hidden] to ONNX layout=1 if asked."""
    if not attrs.get("layout", 0):
        return [y] + states
    b = im.b
    y = b.transpose(y, permutation=[2, 0, 1, 3]) if y is not None else None
    return [y] + [b.transpose(s, permutation=[1, 0, 2]) for s in states]


@op("LSTM", attrs=("activation_alpha", "activation_beta", "activations", "clip", "direction",
                   "hidden_size", "input_forget", "layout"))
def _lstm(im, node, ins, attrs):
    if attrs.get("input_forget", 0):
        unsupported("input_forget=1")
    x, w, r, steps, hidden, kw = _rnn_common(im, node, ins, attrs, 4)
    if len(ins) > 6 and ins[6] is not None:
        kw["initial_cell_state"] = _state_in(im, X(im, ins[6], x), attrs)
    if len(ins) > 7 and ins[7] is not None:
        kw["peephole_weight"] = X(im, ins[7], x)
    if "activations" in kw and len(kw["activations"]) != 3:
        unsupported("activations")
    outs = im.b.lstm(x, w, r, steps, hidden, **kw)
    # WebNN: [hidden state, cell state, sequence?]; ONNX: [Y, Y_h, Y_c]
    h, c = outs[0], outs[1]
    y = outs[2] if kw["return_sequence"] else None
    return _rnn_outs(im, attrs, y, [h, c])


@op("GRU", attrs=("activation_alpha", "activation_beta", "activations", "clip", "direction",
                  "hidden_size", "layout", "linear_before_reset"))
def _gru(im, node, ins, attrs):
    x, w, r, steps, hidden, kw = _rnn_common(im, node, ins, attrs, 3)
    if attrs.get("linear_before_reset", 0):
        kw["reset_after"] = True
    else:
        kw["reset_after"] = False
    if "activations" in kw and len(kw["activations"]) != 2:
        unsupported("activations")
    outs = im.b.gru(x, w, r, steps, hidden, **kw)
    h = outs[0]
    y = outs[1] if kw["return_sequence"] else None
    return _rnn_outs(im, attrs, y, [h])


@op("RNN", attrs=("activation_alpha", "activation_beta", "activations", "clip", "direction",
                  "hidden_size", "layout"))
def _rnn(im, node, ins, attrs):
    """Simple RNN, unrolled: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    if "clip" in attrs:
        unsupported("clip")
    x = X(im, ins[0])
    if attrs.get("layout", 0):
        x = im.b.transpose(x, permutation=[1, 0, 2])
    steps, batch, _ = x.shape
    w, r = X(im, ins[1], x), X(im, ins[2], x)
    nd, hidden = w.shape[0], w.shape[1]
    direction = attrs.get("direction", "forward")
    acts = attrs.get("activations") or ["Tanh"] * nd
    if any(a not in _ACT for a in acts) or attrs.get("activation_alpha"):
        unsupported(f"activations {acts}")
    if len(ins) > 4 and ins[4] is not None and not np.all(const(im, ins[4], "sequence_lens") == steps):
        unsupported("sequence_lens shorter than the sequence")
    b = im.b
    ys, hs = [], []
    for dnum in range(nd):
        wd = b.reshape(b.slice(w, [dnum, 0, 0], [1] + list(w.shape[1:])), list(w.shape[1:]))
        rd = b.reshape(b.slice(r, [dnum, 0, 0], [1] + list(r.shape[1:])), list(r.shape[1:]))
        bias = None
        if len(ins) > 3 and ins[3] is not None:
            bb = X(im, ins[3], x)
            bd = b.reshape(b.slice(bb, [dnum, 0], [1, 2 * hidden]), [2 * hidden])
            wb, rb = b.split(bd, 2, axis=0)
            bias = b.add(wb, rb)
        if len(ins) > 5 and ins[5] is not None:
            h0 = _state_in(im, X(im, ins[5], x), attrs)
            h = b.reshape(b.slice(h0, [dnum, 0, 0], [1, batch, hidden]), [batch, hidden])
        else:
            h = None
        act = getattr(b, _ACT[acts[dnum]])
        back = direction == "reverse" or (direction == "bidirectional" and dnum == 1)
        order = range(steps - 1, -1, -1) if back else range(steps)
        outs = [None] * steps
        for t in order:
            xt = b.reshape(b.slice(x, [t, 0, 0], [1, batch, x.shape[2]]), [batch, x.shape[2]])
            g = b.gemm(xt, wd, b_transpose=True, **({"c": bias} if bias is not None else {}))
            if h is not None:
                g = b.add(g, b.gemm(h, rd, b_transpose=True))
            h = act(g)
            outs[t] = b.reshape(h, [1, 1, batch, hidden])
        ys.append(b.concat(outs, 0) if steps > 1 else outs[0])
        hs.append(b.reshape(h, [1, batch, hidden]))
    y = b.concat(ys, 1) if nd > 1 else ys[0]
    yh = b.concat(hs, 0) if nd > 1 else hs[0]
    return _rnn_outs(im, attrs, y, [yh])


# -- misc -----------------------------------------------------------------------------------------


@op("Einsum", attrs=("equation",))
def _einsum(im, node, ins, attrs):
    """The contractions that are a transpose/matmul: 'bij,bjk->bik', 'ij,jk', 'ij->ji', 'ii->i' no."""
    eq = attrs["equation"].replace(" ", "")
    if "->" not in eq:
        letters = eq.replace(",", "")
        eq = eq + "->" + "".join(sorted(ch for ch in set(letters) if letters.count(ch) == 1))
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    xs = [X(im, v) for v in ins]
    b = im.b
    if "..." in eq:
        # ellipsis: name the broadcast dims with letters the equation does not use
        free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
        n_ell = max(len(x.shape) - (len(t) - 3) for t, x in zip(terms, xs) if "..." in t)
        ell = "".join(free[:n_ell])
        terms = [t.replace("...", ell[n_ell - (len(x.shape) - (len(t) - 3)):]) if "..." in t else t
                 for t, x in zip(terms, xs)]
        out = out.replace("...", ell)
    if "." in "".join(terms) + out:
        unsupported(f"equation {eq!r}")
    if len(terms) == 1:
        (t,) = terms
        x = xs[0]
        while len(set(t)) != len(t):  # repeated letter: take the diagonal
            ch = next(c for c in t if t.count(c) > 1)
            p = t.index(ch)
            q = t.index(ch, p + 1)
            shp = [1] * len(t)
            shp[p] = shp[q] = x.shape[p]
            eye = np.eye(x.shape[p]).reshape(shp).astype(np.dtype(x.data_type))
            x = b.reduce_sum(b.mul(x, X(im, eye)), axes=[q], keep_dimensions=False)
            t = t[:q] + t[q + 1:]
        red = [i for i, c in enumerate(t) if c not in out]
        if red:
            x = b.reduce_sum(x, axes=red, keep_dimensions=False)
            t = "".join(c for c in t if c in out)
        perm = [t.index(c) for c in out]
        return b.transpose(x, permutation=perm) if perm != list(range(len(perm))) else b.identity(x)
    if len(terms) != 2:
        unsupported(f"equation {eq!r}")
    ta, tb = terms
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb):
        unsupported(f"equation {eq!r}")
    a, c = xs
    contract = [ch for ch in ta if ch in tb and ch not in out]
    batch = [ch for ch in ta if ch in tb and ch in out]
    only_a = [ch for ch in ta if ch not in tb]
    only_b = [ch for ch in tb if ch not in ta]
    if any(ch not in out for ch in only_a + only_b):
        # summed over a single operand first
        ra = [ta.index(ch) for ch in only_a if ch not in out]
        if ra:
            a = b.reduce_sum(a, axes=ra, keep_dimensions=False)
            ta = "".join(ch for ch in ta if ch in out or ch in tb)
        rb = [tb.index(ch) for ch in only_b if ch not in out]
        if rb:
            c = b.reduce_sum(c, axes=rb, keep_dimensions=False)
            tb = "".join(ch for ch in tb if ch in out or ch in ta)
        only_a = [ch for ch in ta if ch not in tb]
        only_b = [ch for ch in tb if ch not in ta]
    dims = {}
    for t, v in ((ta, a), (tb, c)):
        for ch, d in zip(t, v.shape):
            dims[ch] = d
    pa = b.transpose(a, permutation=[ta.index(ch) for ch in batch + only_a + contract])
    pb = b.transpose(c, permutation=[tb.index(ch) for ch in batch + contract + only_b])
    nb = [dims[ch] for ch in batch]
    ma, kk, nn = prod(dims[ch] for ch in only_a), prod(dims[ch] for ch in contract), prod(dims[ch] for ch in only_b)
    y = b.matmul(b.reshape(pa, nb + [ma, kk]), b.reshape(pb, nb + [kk, nn]))
    order = batch + only_a + only_b
    y = b.reshape(y, [dims[ch] for ch in order])
    perm = [order.index(ch) for ch in out]
    return b.transpose(y, permutation=perm) if perm != list(range(len(perm))) else y


@op("Loop", "Scan", attrs=None)
def _control_flow(im, node, ins, attrs):
    """Loops run at load, on values known then (trip counts and carried values included)."""
    vals = [const(im, v, f"{node.op_type} input") for v in ins]
    try:
        return im.evaluate(node, vals)
    except ValueError as e:
        unsupported(f"the loop body reads a value computed in the graph ({e})")
