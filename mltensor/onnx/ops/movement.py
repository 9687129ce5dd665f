"""ONNX operators that move elements: reshape family, transpose, concat, split, slice, pad,
expand, tile, depth/space rearrangement."""

import numpy as np
from onnx import helper

from ...dynamic.dims import exact_div, is_static
from .. import symbolic
from ..errors import unsupported
from ._offsets import offset_slice
from ._helpers import const, ints, mark_bool, norm_axis, prod, sizes, X
from ._registry import op

# -- movement ---------------------------------------------------------------------------------


def _reshape_shape(in_shape, shape, allowzero=False):
    out = []
    for i, s in enumerate(shape):
        if isinstance(s, int) and s == 0 and not allowzero:
            out.append(in_shape[i])
        else:
            out.append(s)
    minus = [j for j, d in enumerate(out) if isinstance(d, int) and d == -1]
    if minus:
        k = minus[0]
        rest = prod(d for j, d in enumerate(out) if j != k)
        if not is_static(out) or not is_static(in_shape):  # sizes: the quotient must be exact
            q = exact_div(prod(in_shape), rest)
            if q is None:
                unsupported(f"cannot infer -1 in reshape of {list(in_shape)} to {list(out)} for every size")
            out[k] = q
        else:
            out[k] = prod(in_shape) // rest if rest else 0
    if is_static(out) and is_static(in_shape) and prod(out) != prod(in_shape):
        unsupported(f"cannot reshape {list(in_shape)} to {shape}")
    return out


@op("Reshape", attrs=("allowzero", "shape", "consumed_inputs"))
def _reshape(im, node, ins, attrs):
    shape = attrs.get("shape") if im.cur_opset < 5 else sizes(im, ins[1], "shape")
    x = X(im, ins[0])
    if not attrs.get("allowzero", 0):
        past = [i for i, d in enumerate(shape) if isinstance(d, int) and d == 0 and i >= len(x.shape)]
        if past:
            im.malformed(f"shape {list(shape)} copies dimension {past[0]} (a 0) of an input of rank {len(x.shape)}")
    out = _reshape_shape(x.shape, list(shape), attrs.get("allowzero", 0))
    return keep_bool(im, x, im.b.reshape(x, out))


def keep_bool(im, src, y):
    if id(src) in im.bools:
        mark_bool(im, y)
    return y


@op("Flatten", attrs=("axis",))
def _flatten(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    axis = attrs.get("axis", 1)
    axis = axis + r if axis < 0 else axis
    return keep_bool(im, x, im.b.reshape(x, [prod(x.shape[:axis]), prod(x.shape[axis:])]))


def axes_arg(im, node, ins, attrs, idx=1):
    if "axes" in attrs:
        return list(attrs["axes"])
    if len(ins) > idx and ins[idx] is not None:
        return ints(im, ins[idx], "axes")
    return None


@op("Squeeze", attrs=("axes",))
def _squeeze(im, node, ins, attrs):
    x = X(im, ins[0])
    axes = axes_arg(im, node, ins, attrs)
    r = len(x.shape)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {norm_axis(a, r) for a in axes}
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return keep_bool(im, x, im.b.reshape(x, shape))


@op("Unsqueeze", attrs=("axes",))
def _unsqueeze(im, node, ins, attrs):
    x = X(im, ins[0])
    axes = axes_arg(im, node, ins, attrs)
    r = len(x.shape) + len(axes)
    axes = sorted(norm_axis(a, r) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return keep_bool(im, x, im.b.reshape(x, shape))


@op("Transpose", attrs=("perm",))
def _transpose(im, node, ins, attrs):
    x = X(im, ins[0])
    perm = attrs.get("perm")
    if perm is None:
        perm = list(range(len(x.shape)))[::-1]
    return keep_bool(im, x, im.b.transpose(x, permutation=list(perm)))


@op("Concat", attrs=("axis",))
def _concat(im, node, ins, attrs):
    vals = [v for v in ins if v is not None and not (isinstance(v, np.ndarray) and v.size == 0)]
    first = next((v for v in vals if not isinstance(v, np.ndarray)), None)
    xs = [X(im, v, first) for v in vals]
    r = len(xs[0].shape)
    axis = norm_axis(attrs.get("axis", 1 if im.cur_opset < 4 else 0), r)
    xs = [x for x in xs if x.shape[axis] != 0]
    if len(xs) == 1:
        return keep_bool(im, xs[0], im.b.identity(xs[0]))
    dt = xs[0].data_type
    xs = [x if x.data_type == dt else im.b.cast(x, dt) for x in xs]
    return keep_bool(im, xs[0], im.b.concat(xs, axis))


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
            res.append(keep_bool(im, x, next(outs)))
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
        axes = ints(im, ins[3], "axes") if len(ins) > 3 else None
        steps = ints(im, ins[4], "steps") if len(ins) > 4 else None
        if not (isinstance(ins[1], np.ndarray) and isinstance(ins[2], np.ndarray)):
            # starts computed on the GPU from an offset whose range is known (a Loop's iteration
            # number), the size constant: gathered at that offset, never read back
            y = offset_slice(im, x, ins[1], ins[2], axes, steps)
            if y is not None:
                return keep_bool(im, x, y)
        starts = sizes(im, ins[1], "starts")
        ends = sizes(im, ins[2], "ends")
    if not (is_static(x.shape) and is_static(starts) and is_static(ends)):
        # dynamic dimensions (onnx/symbolic.py): unit steps, bounds placed for every size
        p = symbolic.slice_params(list(x.shape), list(starts), list(ends), axes and list(axes), steps)
        if p is None:
            unsupported(f"slice of {list(x.shape)} from {starts} to {ends} (steps {steps}) for every size")
        st, sz, checks = p
        for size, what in checks:  # bounds ONNX would clamp for these sizes: beyond the model
            im.b._require_positive(size, f"[onnx Slice {node.name!r}] {what}")
        if all(isinstance(v, int) and v == 0 for v in st) and list(sz) == list(x.shape):
            return keep_bool(im, x, im.b.identity(x))
        return keep_bool(im, x, im.b.slice(x, st, sz))
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
        return keep_bool(im, x, im.b.identity(x2))
    kw = {"strides": stride} if any(s != 1 for s in stride) else {}
    # WebNN sizes count input elements spanned (the output has ceil(size / stride))
    span = [(n - 1) * k + 1 for n, k in zip(sz, stride)]
    return keep_bool(im, x, im.b.slice(x2, st, span, **kw))


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
                parts.append(b.slice(x, [0] * a + [d - p] + [0] * (r - a - 1), [*x.shape[:a], p, *x.shape[a + 1 :]]))
            parts.append(x)
            if q:
                parts.append(b.slice(x, [0] * r, [*x.shape[:a], q, *x.shape[a + 1 :]]))
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
        out.append(q if (isinstance(p, int) and p == 1) else p)
    return out


@op("Expand")
def _expand(im, node, ins, attrs):
    x = X(im, ins[0])
    shape = _broadcast(x.shape, sizes(im, ins[1], "shape"))
    if tuple(shape) == tuple(x.shape):
        return keep_bool(im, x, im.b.identity(x))
    return keep_bool(im, x, im.b.expand(x, shape))


@op("Tile")
def _tile(im, node, ins, attrs):
    x = X(im, ins[0])
    reps = ints(im, ins[1], "repeats")
    return keep_bool(im, x, im.b.tile(x, reps))


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
