"""Validation helpers shared by the operator families' builder methods."""

from ..dynamic.dims import Sym
from ..ir.registry import MAX_RANK, OPS


def check_type(where, what, operand, allowed):
    if operand.data_type not in allowed:
        raise TypeError(
            f"[{where}] {what} data type {operand.data_type} is not supported; expected one of {', '.join(allowed)}"
        )


def check_support(name, **operands):
    """Validate operands against the registered support of operator `name`."""
    op = OPS[name]
    for what, x in operands.items():
        if x is None:
            continue
        check_type(name, what, x, op.support[what])
        lo, hi = op.ranks.get(what, (0, MAX_RANK))
        if not lo <= x.rank <= hi:
            want = f"{lo}" if lo == hi else f"between {lo} and {hi}"
            raise TypeError(f"[{name}] {what} rank must be {want}, got {x.rank} (shape {list(x.shape)})")


def same_type(where, *pairs):
    """pairs of (what, operand): all must share the first one's data type."""
    (w0, x0), *rest = pairs
    for w, x in rest:
        if x is not None and x.data_type != x0.data_type:
            raise TypeError(f"[{where}] {w} data type {x.data_type} differs from {w0} data type {x0.data_type}")


def broadcast_shapes(where, a, b, builder=None):
    """Numpy-style bidirectional broadcasting of two shapes. With a `builder`, dynamic dimensions
    unify: two different sizes of which one is dynamic (`total` against `past + seq`, `seq`
    against 5) broadcast as equal, and every dispatch checks that they are (TypeError naming
    `where` otherwise); a dynamic size that is 1 at dispatch is not broadcast then, it must equal
    the other."""
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y or (isinstance(y, int) and y == 1):
            out.append(x)
        elif isinstance(x, int) and x == 1:
            out.append(y)
        elif builder is not None and (isinstance(x, Sym) or isinstance(y, Sym)) and _may_equal(x, y):
            builder._require_equal(x, y, f"[{where}] broadcast dimensions of shapes {list(a)} and {list(b)}")
            out.append(y if isinstance(y, int) else x)
        else:
            raise TypeError(f"[{where}] shapes {list(a)} and {list(b)} are not broadcastable")
    return tuple(out)


def _may_equal(x, y):
    d = x - y
    return isinstance(d, Sym) and d.lo <= 0 <= d.hi


def unidirectional(where, shape, target):
    """True if `shape` broadcasts to `target` (unidirectionally), else TypeError."""
    shape, target = tuple(shape), tuple(target)
    if len(shape) > len(target):
        raise TypeError(f"[{where}] shape {list(shape)} cannot broadcast to {list(target)}")
    s = (1,) * (len(target) - len(shape)) + shape
    for x, y in zip(s, target):
        if x != y and x != 1:
            raise TypeError(f"[{where}] shape {list(shape)} cannot broadcast to {list(target)}")
    return True


def check_bool(where, what, v):
    """A boolean option (a bool, not merely truthy)."""
    if not isinstance(v, bool):
        raise TypeError(f"[{where}] {what} must be a bool, got {v!r}")
    return v


def check_number(where, what, v):
    """A numeric option (int or float, not bool) as a float."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"[{where}] {what} must be a number, got {v!r}")
    return float(v)


def check_axis(where, axis, rank):
    """A single integer axis in [0, rank) (gather/scatter_elements, cumulative_sum, arg_min/max)."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"[{where}] axis must be an integer, got {axis!r}")
    if not 0 <= axis < rank:
        raise TypeError(f"[{where}] axis {axis} is out of range for input rank {rank}")
    return axis


def check_axes(where, axes, rank, what="axes", unique=True):
    if axes is None:
        return list(range(rank))
    try:
        axes = [int(a) for a in axes]
    except (TypeError, ValueError):
        raise TypeError(f"[{where}] {what} must be a sequence of integers, got {axes!r}") from None
    for a in axes:
        if not 0 <= a < rank:
            raise TypeError(f"[{where}] {what} value {a} is out of range for rank {rank}")
    if unique and len(set(axes)) != len(axes):
        raise TypeError(f"[{where}] {what} must not repeat, got {axes}")
    return axes


def int_list(where, what, value, length=None, minimum=None):
    try:
        vals = [int(v) for v in value]
        if any(isinstance(v, bool) for v in value):
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(f"[{where}] {what} must be a sequence of integers, got {value!r}") from None
    if length is not None and len(vals) != length:
        raise TypeError(f"[{where}] {what} must have {length} values, got {len(vals)}")
    if minimum is not None and any(v < minimum for v in vals):
        raise TypeError(f"[{where}] {what} values must be >= {minimum}, got {vals}")
    return vals
