"""ONNX normalizations: softmax family, batch/instance/layer/MVN/Lp normalization, LRN."""

import numpy as np

from ..errors import unsupported
from ._helpers import norm_axis, prod, scalar, X
from ._registry import op

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


# -- normalization ---------------------------------------------------------------------------------


@op("BatchNormalization", attrs=("epsilon", "momentum", "spatial", "training_mode", "is_test", "consumed_inputs"))
def _batchnorm(im, node, ins, attrs):
    if attrs.get("training_mode", 0):
        unsupported("training_mode=1 is not supported")
    if attrs.get("spatial", 1) != 1:
        unsupported("spatial=0 is not supported")
    if len([o for o in node.output if o]) > 1:
        unsupported("the training outputs (running mean/var) are not supported")
    x = X(im, ins[0])
    scale, bias, mean, var = (X(im, v, x) for v in ins[1:5])
    return im.b.batch_normalization(x, mean, var, scale=scale, bias=bias, axis=1, epsilon=attrs.get("epsilon", 1e-5))


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
