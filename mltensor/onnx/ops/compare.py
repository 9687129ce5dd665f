"""Comparison and logic ONNX operators, and Where."""

import numpy as np

from ._helpers import mark_bool, X
from ._registry import op

# -- comparison and logic --------------------------------------------------------------------

_COMPARE = {
    "Equal": "equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_or_equal",
    "Less": "lesser",
    "LessOrEqual": "lesser_or_equal",
}
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
