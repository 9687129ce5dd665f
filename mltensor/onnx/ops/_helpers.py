"""Helpers the handlers share: host constants of a node's inputs (`const`, `ints`, `sizes`: a value
only a run gives cuts the graph there, onnx/resume.py), operands (`X`, `scalar`, `reshape`), axes,
and the bool marking of operands that carry ONNX bool."""

import numpy as np

from ... import dtypes
from ...dynamic.dims import Sym
from .. import resume
from ..errors import NeedsValue, unsupported
from ..types import prod  # product of a shape (one helper for importer and ops)


def const(im, v, what):
    if v is None:
        return None
    if not isinstance(v, np.ndarray):
        # A value computed only from small graph inputs (a size, a flag) decides a shape or an
        # attribute: InferenceSession binds those inputs' values at the first run and specializes
        # the graph to them. Any other (computed from an image's values, say) is read back at run
        # time: the graph is cut there (mltensor/stages/)
        leaves = input_leaves(v)
        if (
            im.values_bindable
            and leaves
            and all(prod(x.shape) <= SMALL_INPUT and id(x) not in im.stage_inputs for x in leaves)
        ):
            raise NeedsValue(leaves[0]._name, what)
        return np.asarray(resume.read(im, v, what))
    return v


# Graph inputs of at most this many elements may be bound by value at the first run (NeedsValue)
SMALL_INPUT = 16


def input_leaves(v):
    """The graph input operands an operand is computed from."""
    seen, out, stack = set(), [], [v]
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        kind = getattr(o, "_kind", None)
        if kind == "input":
            out.append(o)
        elif kind == "op":
            stack.extend(o._node.inputs)
    return out


def ints(im, v, what):
    c = const(im, v, what)
    return None if c is None else [int(i) for i in np.asarray(c).reshape(-1)]


def sizes(im, v, what):
    """ints(), but entries may be Syms (a shape computed from dynamic dimensions, onnx/symbolic.py):
    for the inputs that take sizes (Reshape, Expand, Slice, ConstantOfShape, Range)."""
    c = const(im, v, what)
    if c is None:
        return None
    return [i if isinstance(i, Sym) else int(i) for i in np.asarray(c).reshape(-1)]


def norm_axis(axis, rank, what="axis"):
    a = int(axis)
    if a < 0:
        a += rank
    if not 0 <= a < max(rank, 1):
        unsupported(f"{what} {axis} is out of range for rank {rank}")
    return a


def B(im):
    return im.b


def X(im, v, like=None):
    return im.operand(v, like)


def scalar(im, value, like):
    """A scalar constant operand of `like`'s data type."""
    return im.b.constant(np.array(value, dtype=dtypes.NUMPY[like.data_type]))


def reshape(im, x, shape):
    shape = [s if isinstance(s, Sym) else int(s) for s in shape]
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
