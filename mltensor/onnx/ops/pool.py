"""ONNX pooling: Max/Average/Lp pools and their global forms."""

from ..errors import unsupported
from ._helpers import prod, scalar, X
from ._registry import op
from ._window import explicit_pads, pool_out, spatial_rank, to2d, webnn_pad
from .conv3d import pool3d


@op(
    "MaxPool",
    "AveragePool",
    "LpPool",
    attrs=(
        "auto_pad",
        "ceil_mode",
        "count_include_pad",
        "dilations",
        "kernel_shape",
        "pads",
        "storage_order",
        "strides",
        "p",
    ),
)
def _pool(im, node, ins, attrs):
    if len(node.output) > 1 and node.output[1]:
        unsupported("the Indices output of MaxPool is not supported")
    x = X(im, ins[0])
    sp = len(x.shape) - 2
    spatial_rank(sp, "pools")
    if "kernel_shape" not in attrs:
        im.malformed("the kernel_shape attribute is required")
    k = list(attrs["kernel_shape"])
    s = list(attrs.get("strides") or [1] * sp)
    d = list(attrs.get("dilations") or [1] * sp)
    in_sp = list(x.shape[2:])
    auto = attrs.get("auto_pad", "NOTSET")
    ceil = bool(attrs.get("ceil_mode", 0))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = explicit_pads(attrs, in_sp, k, s, d)
        out = [-(-in_sp[i] // s[i]) for i in range(sp)]
    else:
        begin, end = explicit_pads(attrs, in_sp, k, s, d)
        out = pool_out(in_sp, k, s, d, begin, end, ceil)
    b = im.b
    t = node.op_type
    p = attrs.get("p", 2)
    if t == "LpPool" and not p > 0:
        unsupported(f"LpPool with p={p} (p must be positive)")
    if sp == 3:
        return pool3d(im, t, x, k, s, d, begin, end, out, bool(attrs.get("count_include_pad", 0)), p)
    if t == "LpPool" and p != 2:
        # (sum |x|^p)^(1/p): zero-pad explicitly, average without padding, times the window size
        xp = b.pow(b.abs(x), scalar(im, float(p), x))
        if any(begin + end):
            xp = b.pad(xp, [0, 0] + begin, [0, 0] + end)
        if sp == 1:
            k1, s1, d1, o1 = [1] + k, [1] + s, [1] + d, [1] + out
        else:
            k1, s1, d1, o1 = k, s, d, out
        x2 = to2d(im, xp, sp)
        kw = dict(window_dimensions=k1, strides=s1, dilations=d1)
        if list(o1) != pool_out(x2.shape[2:], k1, s1, d1, [0, 0], [0, 0], False):
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
    x2 = to2d(im, x, sp)
    fn = {"MaxPool": "max_pool2d", "AveragePool": "average_pool2d", "LpPool": "l2_pool2d"}[t]
    kw = dict(window_dimensions=k, padding=webnn_pad(begin, end), strides=s, dilations=d)
    floor_out = pool_out(x2.shape[2:], k, s, d, begin, end, False)
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
        p = attrs.get("p", 2)
        if p in (1, 2):
            return getattr(im.b, f"reduce_l{p}")(x, axes=axes, keep_dimensions=True)
        if not p > 0:
            unsupported(f"GlobalLpPool with p={p} (p must be positive)")
        s = im.b.reduce_sum(im.b.pow(im.b.abs(x), scalar(im, float(p), x)), axes=axes, keep_dimensions=True)
        return im.b.pow(s, scalar(im, 1.0 / p, x))
    fn = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return getattr(im.b, fn)(x, axes=axes, keep_dimensions=True)
