"""Shapes as values at import: ONNX shape arithmetic on dynamic dimensions.

With dynamic dimensions (mltensor/dynamic/) `Shape(x)` is a vector holding Syms. The shape
subgraph exporters put after it (Gather, Concat, Unsqueeze, Add, Mul, Div, Slice, Equal/Where
for -1 handling, ReduceProd...) is evaluated here on numpy object arrays, so that Reshape, Expand,
Slice, ConstantOfShape and Range get Sym sizes and the model stays one build for every size.
Anything this evaluator does not know, or a comparison whose answer depends on the sizes (is
`seq == 1`?), leaves the node to its handler, which fails on a Sym: InferenceSession then builds
the model once per size, as without dynamic dimensions.
"""

import numpy as np
from onnx import TensorProto

from ..dynamic.dims import Sym, exact_div, smax, smin

_INT_TYPES = {
    TensorProto.INT64,
    TensorProto.INT32,
    TensorProto.INT16,
    TensorProto.INT8,
    TensorProto.UINT64,
    TensorProto.UINT32,
    TensorProto.UINT16,
    TensorProto.UINT8,
}


class Undecided(Exception):
    """A value depends on the sizes given at dispatch."""


def is_symbolic(v):
    return isinstance(v, np.ndarray) and v.dtype == object


def array(values, shape=None):
    """An object array of sizes, or an int64 array when none is a Sym."""
    a = np.empty(len(values), dtype=object)
    a[:] = list(values)
    if shape is not None:
        a = a.reshape(shape)
    if all(not isinstance(x, Sym) for x in a.reshape(-1)):
        return a.astype(np.int64)
    return a


def _obj(v):
    a = np.asarray(v)
    if a.dtype == object:
        return a
    if a.dtype.kind not in "iub":
        raise Undecided  # float arithmetic on sizes: left to the handler
    return a.astype(object)


def _as_obj(x):
    """An object array of a numpy result (a lone Sym, from np.take of one index, included)."""
    if isinstance(x, np.ndarray):
        return x.astype(object)
    a = np.empty((), dtype=object)
    a[()] = x
    return a


def _cmp(a, b, op):
    if isinstance(a, Sym) or isinstance(b, Sym):
        if op == "==":
            if isinstance(a, Sym) and isinstance(b, Sym) and a == b:
                return True
        try:
            d = a - b
            lo, hi = (d, d) if isinstance(d, int) else (d.lo, d.hi)
        except TypeError:
            raise Undecided from None
        res = {
            "==": (lo == hi == 0, lo > 0 or hi < 0),
            "<": (hi < 0, lo >= 0),
            "<=": (hi <= 0, lo > 0),
            ">": (lo > 0, hi <= 0),
            ">=": (lo >= 0, hi < 0),
        }[op]
        if res[0]:
            return True
        if res[1]:
            return False
        raise Undecided
    return {"==": a == b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return int(a / b) if b else 0  # ONNX integer Div truncates toward zero
    q = exact_div(a, b)
    if q is not None:
        return q
    if (isinstance(a, int) and a < 0) or (isinstance(b, int) and b <= 0):
        raise Undecided
    return a // b


def _binary(fn, a, b):
    a, b = np.broadcast_arrays(_obj(a), _obj(b))
    out = [fn(x, y) for x, y in zip(a.reshape(-1), b.reshape(-1))]
    return array(out, a.shape)


def _bools(fn, a, b):
    a, b = np.broadcast_arrays(_obj(a), _obj(b))
    return np.array([fn(x, y) for x, y in zip(a.reshape(-1), b.reshape(-1))], dtype=bool).reshape(a.shape)


def _ints(v):
    return [int(x) for x in np.asarray(v).reshape(-1)]


def fold(node, ins, attrs, opset):
    """The outputs of `node` on host values some of which hold Syms, or None when this node is not
    one this evaluator handles (its handler then sees the object arrays)."""
    t = node.op_type
    try:
        if t == "Identity":
            return [ins[0]]
        if t == "Cast":
            if attrs.get("to") in _INT_TYPES:
                return [ins[0]]
            return None
        if t == "Concat":
            parts = [_obj(v) for v in ins if v is not None and np.asarray(v).size]
            return [
                array(
                    np.concatenate(parts, axis=attrs.get("axis", 0)).reshape(-1),
                    np.concatenate(parts, axis=attrs.get("axis", 0)).shape,
                )
            ]
        if t == "Gather":
            if is_symbolic(ins[1]):
                return None
            a = _as_obj(np.take(_obj(ins[0]), np.asarray(ins[1]), axis=attrs.get("axis", 0)))
            return [array(a.reshape(-1), a.shape)]
        if t in ("Unsqueeze", "Squeeze", "Reshape", "Flatten"):
            a = _obj(ins[0])
            if t == "Flatten":
                ax = attrs.get("axis", 1)
                ax = ax + a.ndim if ax < 0 else ax
                shape = (int(np.prod(a.shape[:ax])), int(np.prod(a.shape[ax:])))
            elif t == "Reshape":
                shape = [
                    a.shape[i] if s == 0 and not attrs.get("allowzero", 0) else s for i, s in enumerate(_ints(ins[1]))
                ]
            else:
                axes = attrs.get("axes")
                if axes is None and len(ins) > 1 and ins[1] is not None:
                    axes = _ints(ins[1])
                if t == "Squeeze":
                    axes = [
                        x + a.ndim if x < 0 else x
                        for x in (axes if axes is not None else [i for i, d in enumerate(a.shape) if d == 1])
                    ]
                    shape = [d for i, d in enumerate(a.shape) if i not in axes]
                else:
                    r = a.ndim + len(axes)
                    shape = list(a.shape)
                    for x in sorted(x + r if x < 0 else x for x in axes):
                        shape.insert(x, 1)
            return [array(a.reshape(-1), tuple(shape) if -1 not in shape else a.reshape(shape).shape)]
        if t == "Slice":
            a = _obj(ins[0])
            if opset < 10:
                starts, ends, axes, steps = attrs["starts"], attrs["ends"], attrs.get("axes"), None
            else:
                if any(is_symbolic(v) for v in ins[1:] if v is not None):
                    return None
                starts, ends = _ints(ins[1]), _ints(ins[2])
                axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else None
                steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else None
            sl = [slice(None)] * a.ndim
            for i, (s, e) in enumerate(zip(starts, ends)):
                ax = axes[i] if axes else i
                sl[ax] = slice(max(min(s, 2**62), -(2**62)), max(min(e, 2**62), -(2**62)), steps[i] if steps else 1)
            r = a[tuple(sl)]
            return [array(r.reshape(-1), r.shape)]
        if t in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min"):
            fn = {
                "Add": lambda x, y: x + y,
                "Sub": lambda x, y: x - y,
                "Mul": lambda x, y: x * y,
                "Div": _div,
                "Mod": lambda x, y: x % y,
                "Max": smax,
                "Min": smin,
            }[t]
            if t in ("Max", "Min") and len(ins) != 2:
                return None
            return [_binary(fn, ins[0], ins[1])]
        if t == "Neg":
            a = _obj(ins[0])
            return [array([-x for x in a.reshape(-1)], a.shape)]
        if t == "Abs":
            a = _obj(ins[0])
            out = []
            for x in a.reshape(-1):
                if isinstance(x, Sym):
                    if x.lo >= 0:
                        out.append(x)
                    elif x.hi <= 0:
                        out.append(-x)
                    else:
                        raise Undecided
                else:
                    out.append(abs(x))
            return [array(out, a.shape)]
        if t in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"):
            op = {"Equal": "==", "Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">="}[t]
            return [_bools(lambda x, y: _cmp(x, y, op), ins[0], ins[1])]
        if t == "Where":
            c = np.asarray(ins[0])
            if c.dtype == object:
                return None
            a, b, c = np.broadcast_arrays(_obj(ins[1]), _obj(ins[2]), c.astype(bool))
            out = _as_obj(np.where(c, a, b))
            return [array(out.reshape(-1), out.shape)]
        if t in ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"):
            a = _obj(ins[0])
            axes = attrs.get("axes")
            if axes is None and len(ins) > 1 and ins[1] is not None:
                axes = _ints(ins[1])
            if not axes:
                axes = None if not attrs.get("noop_with_empty_axes", 0) else ()
            if axes == ():
                return [ins[0]]
            keep = attrs.get("keepdims", 1)
            moved = np.moveaxis(
                a, [x % a.ndim for x in (axes or range(a.ndim))], list(range(-len(axes or range(a.ndim)), 0))
            )
            n = len(axes or range(a.ndim))
            flat = moved.reshape(moved.shape[: moved.ndim - n] + (-1,))
            out = []
            for row in flat.reshape(-1, flat.shape[-1]):
                v = row[0]
                for x in row[1:]:
                    v = {
                        "ReduceProd": lambda p, q: p * q,
                        "ReduceSum": lambda p, q: p + q,
                        "ReduceMax": smax,
                        "ReduceMin": smin,
                    }[t](v, x)
                out.append(v)
            shape = list(a.shape)
            for x in sorted((x % a.ndim for x in (axes or range(a.ndim))), reverse=True):
                if keep:
                    shape[x] = 1
                else:
                    shape.pop(x)
            return [array(out, tuple(shape))]
    except Undecided:
        return None
    except (TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError):
        return None
    return None


def slice_params(shape, starts, ends, axes, steps):
    """WebNN slice (starts, sizes, checks) for ONNX Slice on a shape with Syms, unit steps only;
    None when a step is not 1 or a bound can never be placed. A clamp ONNX would apply only for
    some sizes (an end of `past + seq` on a position table of 256 rows) is assumed not to apply,
    and `checks` lists (size, what) that must then be >= 1 at dispatch (the caller defers them to
    it: TypeError for inputs that would need the clamp)."""
    r = len(shape)
    axes = list(range(len(starts))) if axes is None else [a + r if a < 0 else a for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    st, sz, checks = [0] * r, list(shape), []
    for s_, e, a, k in zip(starts, ends, axes, steps):
        if k != 1:
            return None
        d = shape[a]
        try:
            s_ = _index(s_, d, checks)
            e = _index(e, d, checks)
            size = e - s_
            if not isinstance(size, Sym) and size <= 0:
                return None
        except Undecided:
            return None
        st[a], sz[a] = s_, size
    return st, sz, checks


def _index(i, d, checks):
    """An ONNX slice bound (negative: from the end; clamped into [0, d]), as a size."""
    if isinstance(i, int) and i < 0:
        i = d + max(i, -(2**62))
    if isinstance(i, int) and isinstance(d, int):
        return max(0, min(i, d))
    try:
        if i <= d:
            pass
        else:
            return d  # past the end for every size: the end itself
    except TypeError:  # past the end for some sizes only: not clamped, checked at dispatch
        checks.append((d - i + 1, f"the room for bound {i} in a dimension of {d} ({d} - ({i}) + 1)"))
    if isinstance(i, Sym) and i.lo < 0:
        checks.append((i + 1, f"bound {i} + 1"))
    return max(i, 0) if isinstance(i, int) else i
