"""torch.roll as exporters write it: Swin's cyclic shift of the feature map before its shifted
windows (and back after) is, per rolled axis, concat(x[.., s:, ..], x[.., :s, ..]) along that
axis: two slice copies and two concat copies. rewrite_rolls makes it one gather of x along the
axis by the constant indices s .. n - 1, 0 .. s - 1: one kernel, each element moved once.
Runs in plan.rewrite_nodes before the GEMM views (a roll is not a view they express).

Emitter: ops/movement.py `gather`.
"""

import numpy as np

from ...ir.graph import Node
from ..steps import host_constant, replace_each


def _block(v, x, axis, uses, n):
    """(start, size) along `axis` when v is a stride-1 slice of x whole on every other axis and
    read only by node n; else None."""
    p = uses.prod.get(id(v))
    if p is None or p.op != "slice" or p.inputs[0] is not x or not uses.only(v, n):
        return None
    st, sz, step = p.attrs["starts"], p.attrs["sizes"], p.attrs["strides"]
    if any(k != 1 for k in step) or any(st[d] != 0 or sz[d] != x.shape[d] for d in range(x.rank) if d != axis):
        return None
    if not (isinstance(st[axis], int) and isinstance(sz[axis], int)):
        return None
    return st[axis], sz[axis]


def _roll(n, uses):
    """(x, indices, the slices) when concat node n is a roll of x along its axis (module doc)."""
    if len(n.inputs) != 2 or n.inputs[0] is n.inputs[1]:
        return None
    a, b = n.inputs
    pa = uses.prod.get(id(a))
    if pa is None or pa.op != "slice":
        return None
    x, axis = pa.inputs[0], n.attrs["axis"]
    size = x.shape[axis] if x.rank > axis else None
    first, second = _block(a, x, axis, uses, n), _block(b, x, axis, uses, n)
    if not isinstance(size, int) or first is None or second is None:
        return None
    (s, k), (s2, k2) = first, second
    if s2 != 0 or k2 != s or s + k != size or s == 0:
        return None
    return x, np.concatenate([np.arange(s, size), np.arange(0, s)]).astype(np.int32), [pa, uses.prod[id(b)]]


def rewrite_rolls(nodes, uses):
    """concat(x[s:], x[:s]) along an axis -> gather(x, [s .. n - 1, 0 .. s - 1]) (module doc)."""

    def replace(n, hit):
        x, idx, slices = hit
        g = Node("gather", [x, host_constant(x, "int32", idx)], {"axis": n.attrs["axis"]}, n.label)
        g.outputs = list(n.outputs)
        return [g], slices

    return replace_each(nodes, lambda n: _roll(n, uses) if n.op == "concat" else None, replace)
