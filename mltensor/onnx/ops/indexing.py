"""ONNX indexing operators: gather, scatter, Trilu, OneHot, Range (Compress: select.py)."""

import numpy as np

from ...dynamic.dims import Sym
from .. import symbolic
from ..errors import unsupported
from ._blocks import gather_rows, oversize
from ._helpers import const, ints, is_float, mark_bool, norm_axis, scalar, X
from ._registry import op
from .movement import keep_bool


def _indices(im, idx):
    """ONNX indices as an operand. Negative ones need no fixing: the WebNN gather/scatter kernels
    count them from the end of the dimension. int64 indices known at load that fit are narrowed
    to int32 (cheaper to read, and not 64-bit arithmetic where that is emulated)."""
    if isinstance(idx, np.ndarray) and idx.dtype.kind == "i" and idx.size and np.abs(idx).max() < 2**31:
        idx = idx.astype(np.int32)
    return X(im, idx)


@op("Gather", "GatherElements", attrs=("axis",))
def _gather(im, node, ins, attrs):
    t = ins[0]
    if node.op_type == "Gather" and oversize(im, t) and t.ndim >= 1 and norm_axis(attrs.get("axis", 0), t.ndim) == 0:
        # an embedding table above the largest tensor: row blocks (_blocks.py)
        y = gather_rows(im, t, _indices(im, ins[1]))
        return mark_bool(im, y) if t.dtype == np.bool_ else y
    x = X(im, t)
    axis = norm_axis(attrs.get("axis", 0), len(x.shape))
    fn = im.b.gather if node.op_type == "Gather" else im.b.gather_elements
    return keep_bool(im, x, fn(x, _indices(im, ins[1]), axis=axis))


@op("GatherND", attrs=("batch_dims",))
def _gather_nd(im, node, ins, attrs):
    if attrs.get("batch_dims", 0):
        unsupported("batch_dims != 0 is not supported")
    x = X(im, ins[0])
    return keep_bool(im, x, im.b.gather_nd(x, _indices(im, ins[1])))


@op("ScatterElements", "Scatter", attrs=("axis", "reduction"))
def _scatter_elements(im, node, ins, attrs):
    if attrs.get("reduction", "none") != "none":
        unsupported(f"reduction {attrs['reduction']!r} is not supported")
    if _nothing_to_scatter(ins):
        return ins[0]
    x = X(im, ins[0])
    axis = norm_axis(attrs.get("axis", 0), len(x.shape))
    return im.b.scatter_elements(x, _indices(im, ins[1]), X(im, ins[2], x), axis=axis)


def _nothing_to_scatter(ins):
    """Empty updates (a selection that found nothing, as torchvision's per-level RoIAlign merge
    meets): the data comes out unchanged."""
    return any(isinstance(v, np.ndarray) and v.size == 0 for v in ins[1:3])


@op("ScatterND", attrs=("reduction",))
def _scatter_nd(im, node, ins, attrs):
    if attrs.get("reduction", "none") != "none":
        unsupported(f"reduction {attrs['reduction']!r} is not supported")
    if _nothing_to_scatter(ins):
        return ins[0]
    x = X(im, ins[0])
    return im.b.scatter_nd(x, _indices(im, ins[1]), X(im, ins[2], x))


@op("Trilu", attrs=("upper",))
def _trilu(im, node, ins, attrs):
    k = ints(im, ins[1], "k")[0] if len(ins) > 1 and ins[1] is not None else 0
    x = X(im, ins[0])
    return im.b.triangular(x, upper=bool(attrs.get("upper", 1)), diagonal=k)


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


@op("Range")
def _range(im, node, ins, attrs):
    start, limit, delta = (const(im, v, w) for v, w in zip(ins, ("start", "limit", "delta")))
    d0 = np.asarray(delta).reshape(-1)[:1]
    if d0.size and not isinstance(d0[0], Sym) and d0[0] == 0:
        im.malformed("delta is 0")
    if any(symbolic.is_symbolic(v) for v in (start, limit, delta)):
        # position ids from `past` to `past + seq`: computed at dispatch (ops/sizes.py)
        s, l, d = (np.asarray(v).reshape(-1)[0] for v in (start, limit, delta))
        if isinstance(d, Sym) or not isinstance(d, (int, np.integer)) or d == 0:
            unsupported("Range over dynamic dimensions needs a constant integer delta")
        d = int(d)
        n = (l - s) if d == 1 else symbolic._div(l - s + (d - 1 if d > 0 else d + 1), d)
        if isinstance(n, int) and n <= 0:
            unsupported("an empty Range")
        s = s if isinstance(s, Sym) else int(s)
        ref = im.ref(next(v for v in (s, n, l) if isinstance(v, Sym)))
        dt = {np.dtype(np.int32): "int32"}.get(np.asarray(start).dtype, "int64")
        return im.b._range(ref, s, d, n, dt)
    n = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + np.arange(n) * delta).astype(start.dtype)
