"""reverse, tile and triangular (shaders/layout.wgsl): one thread per output element, with the
coordinate arithmetic generated from the shapes: static sizes are WGSL constants, dynamic ones
(Syms, mltensor/dynamic/) are read at dispatch through `wgsl()`. triangular's diagonal may be a
Sym too (a causal mask over [seq, past + seq] keeps c - r <= past)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import Sym, is_static, wgsl
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, lowering, register
from ..runtime.wgsl import Binding, Kernel, lit
from ._checks import check_axes, check_bool, check_support, int_list
from ._index import row_strides
from .movement import check_syms, coords_at, launch_1d

DYNAMIC_OPS = frozenset({"reverse", "tile", "triangular"})

ALL = dtypes.ALL


def coords(shape, var="i", prefix="c"):
    """WGSL lines: `let c{d} = ...` for every dimension of `shape`, from the flat index `var`."""
    if not is_static(shape):
        return [f"    let {prefix}{d} = {e};" for d, e in enumerate(coords_at(var, list(shape)))]
    st = row_strides(shape)
    lines = []
    for d, n in enumerate(shape):
        e = f"{var} / {st[d]}u" if st[d] != 1 else var
        if d > 0:
            e = f"({e}) % {n}u"
        lines.append(f"    let {prefix}{d} = {e};")
    return lines


def flat(terms, shape):
    """WGSL u32 expression: flat row-major index of coordinate expressions `terms` in `shape`."""
    st = row_strides(shape)
    parts = [f"({t}) * {wgsl(s)}" if s != 1 else f"({t})" for t, s in zip(terms, st)]
    return " + ".join(parts) if parts else "0u"


def launch_body(kc, name, node, body, extra_bindings=()):
    """Launch layout.wgsl over the node's output with generated `body` lines."""
    x = node.inputs[0]
    out = kc.out(node)
    n = math.prod(out.shape)
    t = kc.wtype(out)
    k = Kernel(
        name,
        "layout.wgsl",
        {"n": n, "body": "\n".join(body)},
        (Binding("x", kc.wtype(x)), *extra_bindings, Binding("out", t, True)),
    )
    return k, out, n


# -- reverse ------------------------------------------------------------------------------------

register("reverse", {"input": ALL, "output": ALL})


@builder_op(renamed={"x": "input"})
def reverse(self: Any, input: MLOperand, *, axes: Sequence[int] | None = None, label: str | None = None) -> MLOperand:
    """Reverse the order of elements along `axes` (default: every axis; `[]` reverses none)."""
    # IDL: MLOperand reverse(MLOperand input, optional MLReverseOptions options = {});
    self._operand(input, "reverse", "input")
    check_support("reverse", input=input)
    axes = check_axes("reverse", axes, input.rank)
    return self._emit1("reverse", [input], {"axes": tuple(sorted(axes))}, input.data_type, input.shape, label)


@lowering("reverse")
def _lower_reverse(kc, node):
    x = node.inputs[0]
    axes = node.attrs["axes"]
    if not axes or all(x.shape[a] == 1 for a in axes):
        kc.alias(kc.out(node), x)
        return
    shape = x.shape
    body = coords(shape)
    terms = [f"{wgsl(shape[d] - 1)} - c{d}" if d in axes else f"c{d}" for d in range(len(shape))]
    body.append(f"    out[i] = x[{flat(terms, shape)}];")
    name = f"reverse_{kc.wtype(x)}_{'x'.join(map(str, shape))}_a{''.join(map(str, axes))}"
    k, out, n = launch_body(kc, name, node, body)
    launch_1d(kc, k, [x, out], n)


# -- tile ---------------------------------------------------------------------------------------

register("tile", {"input": ALL, "output": ALL})


@builder_op(renamed={"x": "input"})
def tile(self: Any, input: MLOperand, repetitions: Sequence[int], *, label: str | None = None) -> MLOperand:
    """Repeat the input `repetitions[i]` times along each dimension i (one entry per dimension)."""
    # IDL: MLOperand tile(MLOperand input, sequence<unsigned long> repetitions,
    #                     optional MLOperatorOptions options = {});
    self._operand(input, "tile", "input")
    check_support("tile", input=input)
    reps = int_list("tile", "repetitions", repetitions, length=input.rank, minimum=1)
    shape = tuple(d * r for d, r in zip(input.shape, reps))
    self._context._tensor_args("tile", input.data_type, shape)  # byte length limit
    return self._emit1("tile", [input], {"repetitions": tuple(reps)}, input.data_type, shape, label)


@lowering("tile")
def _lower_tile(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    if out.shape == x.shape:
        kc.alias(out, x)
        return
    body = coords(out.shape)
    terms = [f"c{d}" if r == 1 else f"c{d} % {wgsl(x.shape[d])}" for d, r in enumerate(node.attrs["repetitions"])]
    body.append(f"    out[i] = x[{flat(terms, x.shape)}];")
    name = f"tile_{kc.wtype(x)}_{'x'.join(map(str, x.shape))}_r{'x'.join(map(str, node.attrs['repetitions']))}"
    k, out, n = launch_body(kc, name, node, body)
    launch_1d(kc, k, [x, out], n)


# -- triangular ---------------------------------------------------------------------------------

register("triangular", {"input": ALL, "output": ALL}, ranks={"input": (2, 8)})


@builder_op(renamed={"x": "input"})
def triangular(
    self: Any, input: MLOperand, *, upper: bool = True, diagonal: int = 0, label: str | None = None
) -> MLOperand:
    """Keep the upper (`upper=True`) or lower triangle of the last two dimensions, the rest set to
    zero; `diagonal` shifts the boundary (positive: above the main diagonal)."""
    # IDL: MLOperand triangular(MLOperand input, optional MLTriangularOptions options = {});
    self._operand(input, "triangular", "input")
    check_support("triangular", input=input)
    check_bool("triangular", "upper", upper)
    if isinstance(diagonal, Sym):  # a size from an operand's shape (past), read at dispatch
        check_syms(self, "triangular", "diagonal", [diagonal])
        if not -(2**31) <= diagonal.lo <= diagonal.hi < 2**31:
            raise TypeError(f"[triangular] diagonal {diagonal} must be a 32-bit integer for every size")
    elif isinstance(diagonal, bool) or not isinstance(diagonal, int) or not -(2**31) <= diagonal < 2**31:
        raise TypeError(f"[triangular] diagonal must be a 32-bit integer, got {diagonal!r}")
    attrs = {"upper": upper, "diagonal": diagonal}
    return self._emit1("triangular", [input], attrs, input.data_type, input.shape, label)


@lowering("triangular")
def _lower_triangular(kc, node):
    x = node.inputs[0]
    rows, cols = x.shape[-2:]
    t = kc.wtype(x)
    up, dg = node.attrs["upper"], node.attrs["diagonal"]
    # keep element (r, c) when c - r >= diagonal (upper) or c - r <= diagonal (lower); a dynamic
    # diagonal wraps in u32 arithmetic and i32() reinterprets the bits (so -past works too)
    diag = lit(dg, "i32") if isinstance(dg, int) else f"i32({wgsl(dg)})"
    if is_static(x.shape):
        r, c = f"(i / {cols}u) % {rows}u", f"i % {cols}u"
    else:
        r, c = coords_at("i", list(x.shape))[-2:]
    body = [
        f"    let r = i32({r});",
        f"    let c = i32({c});",
        f"    let keep = (c - r) {'>=' if up else '<='} {diag};",
        f"    out[i] = select({lit(0, t)}, x[i], keep);",
    ]
    name = f"triangular_{t}_n{math.prod(x.shape)}_{rows}x{cols}_{'u' if up else 'l'}{dg}"
    k, out, n = launch_body(kc, name, node, body)
    launch_1d(kc, k, [x, out], n)
