"""Sizes as values: tensors whose contents are dynamic dimensions (internal operators).

ONNX graphs compute with their own shapes: `Shape -> Gather -> Cast` feeds a division, `Range(0,
seq)` makes position ids, `ConstantOfShape` a mask. With dynamic dimensions those values are Syms
at import (onnx/symbolic.py); where one has to become a tensor, these operators make it on the
GPU from the sizes of the dispatch (dynamic/kernels.py), so the graph stays one build for every
size. Neither exists in WebNN; the ONNX importer is their only caller.

- `_size(ref, value, data_type)`: a 0-D tensor holding `value` (an int or a Sym).
- `_range(ref, start, delta, count, data_type)`: [start, start + delta, ...], `count` elements
  (start and count may be Syms: position ids from `past` to `past + seq`).
`ref` is an operand the value depends on (a graph input with the dimension): it makes the node a
computation of the dispatch rather than a constant folded at build; the kernel does not read it.
"""

from .. import dtypes
from ..dynamic.dims import Sym, wgsl
from ..dynamic.kernels import grid
from ..ir.registry import builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, convert, lit

TYPES = ("float32", "int32", "int64", "uint32")
DYNAMIC_OPS = frozenset({"_size", "_range"})


def _value(v, t):
    """WGSL of a size or number in compute type t (a Sym is a u32 read at dispatch)."""
    if isinstance(v, Sym):
        return convert(wgsl(v), "u32", t)
    return lit(v, t)


def _lower_size(kc, node):
    out = kc.out(node)
    t = kc.wtype(out)
    k = Kernel(
        f"size_{t}",
        "sizes.wgsl",
        {"n": 1, "body": f"    dst[0] = {_value(node.attrs['value'], t)};"},
        (Binding("anchor", kc.move_type(node.inputs[0])), Binding("dst", t, True)),
    )
    kc.launch(k, [node.inputs[0], out], (1, 1, 1))


def _lower_range(kc, node):
    out = kc.out(node)
    t = kc.wtype(out)
    a = node.attrs
    i = convert("i", "u32", t)
    body = f"    dst[i] = {_value(a['start'], t)} + {i} * {_value(a['delta'], t)};"
    count = a["count"]
    k = Kernel(
        f"range_{t}",
        "sizes.wgsl",
        {"n": count, "body": body},
        (Binding("anchor", kc.move_type(node.inputs[0])), Binding("dst", t, True)),
    )
    kc.launch(k, [node.inputs[0], out], grid(-(-count // WORKGROUP)))


register("_size", {"ref": dtypes.ALL, "output": TYPES}, lower=_lower_size)
register("_range", {"ref": dtypes.ALL, "output": TYPES}, lower=_lower_range)


def _check(where, data_type, *numbers):
    if data_type not in TYPES:
        raise TypeError(f"[{where}] data type {data_type} is not one of {', '.join(TYPES)}")
    for v in numbers:
        if not isinstance(v, (int, float, Sym)) or isinstance(v, bool):
            raise TypeError(f"[{where}] expected a number or a size, got {v!r}")


@builder_op
def _size(b, ref, value, data_type):
    b._operand(ref, "_size", "ref")
    _check("_size", data_type, value)
    return b._emit1("_size", [ref], {"value": value}, data_type, ())


@builder_op
def _range(b, ref, start, delta, count, data_type):
    b._operand(ref, "_range", "ref")
    _check("_range", data_type, start, delta, count)
    return b._emit1("_range", [ref], {"start": start, "delta": delta, "count": count}, data_type, (count,))
