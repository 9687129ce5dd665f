"""gather_elements, gather_nd, scatter_elements, scatter_nd (shaders/indexing.wgsl).

Indices may be negative (counted from the end of the dimension); indices out of range are clamped
into it, so a bad index never reads or writes outside a tensor. Scatters copy the input to the
output, then one thread per update element writes it; where several updates hit the same element
the one that lands is unspecified (the WebNN spec leaves duplicates undefined too).

Dynamic dimensions (mltensor/dynamic/): shapes may hold Syms (sizes read at dispatch through
`wgsl()`), except the last dimension of gather_nd/scatter_nd indices (it sets the output's rank).
Shape rules that the builder cannot decide are checked at every dispatch.
"""

from __future__ import annotations

from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import wgsl
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, lowering, register
from ..runtime.wgsl import Binding, Kernel
from ._checks import check_axis, check_support, same_type
from ._index import row_strides
from .layout import coords, flat
from .movement import Checks, launch_1d

DYNAMIC_OPS = frozenset({"gather_elements", "gather_nd", "scatter_elements", "scatter_nd"})

ALL = dtypes.ALL
INDEX = ("int32", "uint32", "int64")


def _same_shape(checks, a, b, what):
    """Shapes a and b are equal (entries checked at dispatch where the build cannot decide)."""
    return len(a) == len(b) and all(checks.same(x, y, f"{what} dimension {d}") for d, (x, y) in enumerate(zip(a, b)))


def _static_last(where, indices):
    k = indices.shape[-1]
    if not isinstance(k, int):
        raise TypeError(f"[{where}] indices.shape[-1] ({k}) must be static (it sets the output's rank)")
    return k


def _elements_axis(where, x, indices, axis, checks):
    """The axis of gather_elements/scatter_elements, checked with their shared indices rule:
    indices has the input's shape except along `axis`."""
    axis = check_axis(where, axis, x.rank)
    expected = list(x.shape)
    if indices.rank == x.rank:
        expected[axis] = indices.shape[axis]
    if not _same_shape(checks, list(indices.shape), expected, f"[{where}] indices"):
        raise TypeError(
            f"[{where}] indices shape {list(indices.shape)} must equal the input shape "
            f"{list(x.shape)} except along axis {axis}"
        )
    return axis


def _wrap(kc, indices, expr, n):
    return f"wrap_{kc.wtype(indices)}({expr}, {wgsl(n)})"


def _launch(kc, name, n, body, args, names):
    """indexing.wgsl over n threads; args are bound as `names` (the last one is the output)."""
    bindings = [Binding(nm, kc.wtype(a), k == len(args) - 1) for k, (nm, a) in enumerate(zip(names, args))]
    k = Kernel(name, "indexing.wgsl", {"n": n, "body": "\n".join(body)}, bindings)
    launch_1d(kc, k, args, n)


def _shape_name(*shapes):
    return "_".join("x".join(map(str, s)) or "s" for s in shapes)


# -- gather_elements ----------------------------------------------------------------------------

register("gather_elements", {"input": ALL, "indices": INDEX, "output": ALL}, ranks={"input": (1, 8), "indices": (1, 8)})


@builder_op(renamed={"x": "input"})
def gather_elements(
    self: Any, input: MLOperand, indices: MLOperand, *, axis: int = 0, label: str | None = None
) -> MLOperand:
    """Element-wise gather along `axis`: output[i][j][k] = input[indices[i][j][k]][j][k] for axis 0
    (likewise for other axes). `indices` has the input's rank; the output has its shape."""
    # IDL: MLOperand gatherElements(MLOperand input, MLOperand indices,
    #                               optional MLGatherOptions options = {});
    where = "gather_elements"
    self._operand(input, where, "input")
    self._operand(indices, where, "indices")
    check_support(where, input=input, indices=indices)
    checks = Checks(self)
    axis = _elements_axis(where, input, indices, axis, checks)
    checks.commit()
    return self._emit1(where, [input, indices], {"axis": axis}, input.data_type, indices.shape, label)


@lowering("gather_elements")
def _lower_gather_elements(kc, node):
    x, ind = node.inputs
    out = kc.out(node)
    axis = node.attrs["axis"]
    shape = out.shape
    body = coords(shape)
    body.append(f"    let k = {_wrap(kc, ind, 'ind[i]', x.shape[axis])};")
    terms = ["k" if d == axis else f"c{d}" for d in range(len(shape))]
    body.append(f"    out[i] = x[{flat(terms, x.shape)}];")
    name = f"gather_elements_{kc.wtype(x)}_{kc.wtype(ind)}_{_shape_name(x.shape, shape)}_a{axis}"
    _launch(kc, name, math.prod(shape), body, [x, ind, out], ("x", "ind", "out"))


# -- gather_nd ----------------------------------------------------------------------------------

register("gather_nd", {"input": ALL, "indices": INDEX, "output": ALL}, ranks={"input": (1, 8), "indices": (1, 8)})


@builder_op(renamed={"x": "input"})
def gather_nd(self: Any, input: MLOperand, indices: MLOperand, *, label: str | None = None) -> MLOperand:
    """Gather slices addressed by the last dimension of `indices`: each index tuple of length k
    selects input[t0, ..., tk-1, ...]. Output shape: indices.shape[:-1] + input.shape[k:]."""
    # IDL: MLOperand gatherND(MLOperand input, MLOperand indices, optional MLOperatorOptions options = {});
    where = "gather_nd"
    self._operand(input, where, "input")
    self._operand(indices, where, "indices")
    check_support(where, input=input, indices=indices)
    k = _static_last(where, indices)
    if k > input.rank:
        raise TypeError(f"[{where}] indices.shape[-1] ({k}) must not exceed the input rank ({input.rank})")
    shape = tuple(indices.shape[:-1]) + tuple(input.shape[k:])
    if len(shape) > 8:
        raise TypeError(f"[{where}] output rank {len(shape)} exceeds the maximum rank 8")
    return self._emit1(where, [input, indices], {}, input.data_type, shape, label)


def _nd_offset(kc, ind, in_shape, k, inner):
    """WGSL lines computing `q` (which coordinate tuple), `r` (offset inside the slice) and
    `off` (flat index of the slice start in a tensor of in_shape) from `i`."""
    strides = row_strides(in_shape)
    body = [f"    let q = i / {wgsl(inner)};", f"    let r = i % {wgsl(inner)};", "    var off = r;"]
    for j in range(k):
        body.append(f"    off = off + {_wrap(kc, ind, f'ind[q * {k}u + {j}u]', in_shape[j])} * {wgsl(strides[j])};")
    return body


@lowering("gather_nd")
def _lower_gather_nd(kc, node):
    x, ind = node.inputs
    out = kc.out(node)
    k = ind.shape[-1]
    inner = math.prod(x.shape[k:])
    body = _nd_offset(kc, ind, x.shape, k, inner)
    body.append("    out[i] = x[off];")
    name = f"gather_nd_{kc.wtype(x)}_{kc.wtype(ind)}_{_shape_name(x.shape, ind.shape)}"
    _launch(kc, name, math.prod(out.shape), body, [x, ind, out], ("x", "ind", "out"))


# -- scatter_elements ---------------------------------------------------------------------------

register(
    "scatter_elements",
    {"input": ALL, "indices": INDEX, "updates": ALL, "output": ALL},
    ranks={"input": (1, 8), "indices": (1, 8), "updates": (1, 8)},
)


@builder_op(renamed={"x": "input"})
def scatter_elements(
    self: Any, input: MLOperand, indices: MLOperand, updates: MLOperand, *, axis: int = 0, label: str | None = None
) -> MLOperand:
    """A copy of the input with `updates` written at `indices` along `axis` (the inverse of
    gather_elements); `indices` and `updates` share a shape."""
    # IDL: MLOperand scatterElements(MLOperand input, MLOperand indices, MLOperand updates,
    #                                optional MLScatterOptions options = {});
    where = "scatter_elements"
    for what, v in (("input", input), ("indices", indices), ("updates", updates)):
        self._operand(v, where, what)
    check_support(where, input=input, indices=indices, updates=updates)
    same_type(where, ("input", input), ("updates", updates))
    checks = Checks(self)
    axis = _elements_axis(where, input, indices, axis, checks)
    if not _same_shape(checks, updates.shape, indices.shape, f"[{where}] updates"):
        raise TypeError(f"[{where}] updates shape {list(updates.shape)} must equal indices shape {list(indices.shape)}")
    checks.commit()
    return self._emit1(where, [input, indices, updates], {"axis": axis}, input.data_type, input.shape, label)


@lowering("scatter_elements")
def _lower_scatter_elements(kc, node):
    x, ind, upd = node.inputs
    out = kc.out(node)
    axis = node.attrs["axis"]
    kc.copy(x, out)
    body = coords(upd.shape)
    body.append(f"    let k = {_wrap(kc, ind, 'ind[i]', x.shape[axis])};")
    terms = ["k" if d == axis else f"c{d}" for d in range(len(upd.shape))]
    body.append(f"    out[{flat(terms, x.shape)}] = upd[i];")
    name = f"scatter_elements_{kc.wtype(x)}_{kc.wtype(ind)}_{_shape_name(x.shape, upd.shape)}_a{axis}"
    _launch(kc, name, math.prod(upd.shape), body, [ind, upd, out], ("ind", "upd", "out"))


# -- scatter_nd ---------------------------------------------------------------------------------

register(
    "scatter_nd",
    {"input": ALL, "indices": INDEX, "updates": ALL, "output": ALL},
    ranks={"input": (1, 8), "indices": (1, 8)},
)


@builder_op(renamed={"x": "input"})
def scatter_nd(
    self: Any, input: MLOperand, indices: MLOperand, updates: MLOperand, *, label: str | None = None
) -> MLOperand:
    """A copy of the input with the slices of `updates` written where the index tuples of the last
    dimension of `indices` point (the inverse of gather_nd)."""
    # IDL: MLOperand scatterND(MLOperand input, MLOperand indices, MLOperand updates,
    #                          optional MLOperatorOptions options = {});
    where = "scatter_nd"
    for what, v in (("input", input), ("indices", indices), ("updates", updates)):
        self._operand(v, where, what)
    check_support(where, input=input, indices=indices, updates=updates)
    same_type(where, ("input", input), ("updates", updates))
    k = _static_last(where, indices)
    if k > input.rank:
        raise TypeError(f"[{where}] indices.shape[-1] ({k}) must not exceed the input rank ({input.rank})")
    expected = tuple(indices.shape[:-1]) + tuple(input.shape[k:])
    checks = Checks(self)
    if not _same_shape(checks, tuple(updates.shape), expected, f"[{where}] updates"):
        raise TypeError(
            f"[{where}] updates shape {list(updates.shape)} must be indices.shape[:-1] + "
            f"input.shape[{k}:] = {list(expected)}"
        )
    checks.commit()
    return self._emit1(where, [input, indices, updates], {}, input.data_type, input.shape, label)


@lowering("scatter_nd")
def _lower_scatter_nd(kc, node):
    x, ind, upd = node.inputs
    out = kc.out(node)
    k = ind.shape[-1]
    inner = math.prod(x.shape[k:])
    kc.copy(x, out)
    body = _nd_offset(kc, ind, x.shape, k, inner)
    body.append("    out[off] = upd[i];")
    name = f"scatter_nd_{kc.wtype(x)}_{kc.wtype(ind)}_{_shape_name(x.shape, ind.shape)}"
    _launch(kc, name, math.prod(upd.shape), body, [ind, upd, out], ("ind", "upd", "out"))
