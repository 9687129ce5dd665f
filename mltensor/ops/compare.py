"""Comparison and logical operators, is_nan / is_infinite, round_even.

All are elementwise WGSL expressions, so the compiler fuses them with their neighbours (a
comparison feeding a `where`-free chain of casts/logicals is one kernel). Comparisons and logical
operators produce "uint8" 0/1 values (computed as u32, packed at the graph's edges). NaN follows
IEEE: every ordered comparison with NaN is false, `not_equal` is true.
"""

from __future__ import annotations

from typing import Any

from .. import dtypes
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, register
from ..runtime.wgsl import compare, from_f32, to_f32
from ._checks import check_support
from .elementwise import binary_op

ALL = dtypes.ALL
FLOAT = dtypes.FLOATS
U8 = ("uint8",)

# Elementwise expressions (fused by elementwise.lower_group, which indexes with sizes read at
# dispatch): every operator here takes dynamic dimensions (mltensor/dynamic/).
DYNAMIC_OPS = frozenset(
    (
        "equal not_equal greater greater_or_equal lesser lesser_or_equal logical_and logical_or "
        "logical_xor logical_not is_nan is_infinite round_even"
    ).split()
)


def _b(cond):
    return f"select(0u, 1u, {cond})"


def _cmp(op):
    return lambda kc, n, a, b: _b(compare(op, kc.wtype(n.inputs[0]), a, b))


COMPARE = {
    "equal": _cmp("=="),
    # !(a == b) rather than `!=`: true for NaN whatever the driver's ordered/unordered choice
    "not_equal": lambda kc, n, a, b: _b("!" + compare("==", kc.wtype(n.inputs[0]), a, b)),
    "greater": _cmp(">"),
    "greater_or_equal": _cmp(">="),
    "lesser": _cmp("<"),
    "lesser_or_equal": _cmp("<="),
}

LOGICAL = {
    "logical_and": lambda kc, n, a, b: _b(f"({a} != 0u) && ({b} != 0u)"),
    "logical_or": lambda kc, n, a, b: _b(f"({a} != 0u) || ({b} != 0u)"),
    "logical_xor": lambda kc, n, a, b: _b(f"({a} != 0u) != ({b} != 0u)"),
}


def _binary(name, types, fn):
    register(name, {"a": types, "b": types, "output": U8}, expr=fn)
    binary_op(name, "uint8", doc=_BINARY_DOCS[name])


# Docstrings of the generated binary methods (what MLGraphBuilder.<name> shows).
_BINARY_DOCS = {
    "equal": "1 (uint8) where a == b, else 0; the operands broadcast numpy-style.",
    "not_equal": "1 (uint8) where a != b (NaN included), else 0; the operands broadcast numpy-style.",
    "greater": "1 (uint8) where a > b, else 0; the operands broadcast numpy-style.",
    "greater_or_equal": "1 (uint8) where a >= b, else 0; the operands broadcast numpy-style.",
    "lesser": "1 (uint8) where a < b, else 0; the operands broadcast numpy-style.",
    "lesser_or_equal": "1 (uint8) where a <= b, else 0; the operands broadcast numpy-style.",
    "logical_and": "1 (uint8) where the uint8 operands a and b are both non-zero, else 0 (broadcast numpy-style).",
    "logical_or": "1 (uint8) where either of the uint8 operands a and b is non-zero, else 0 (broadcast numpy-style).",
    "logical_xor": "1 (uint8) where exactly one of the uint8 operands a and b is non-zero, else 0 (broadcast "
    "numpy-style).",
}


for _name, _fn in COMPARE.items():
    _binary(_name, ALL, _fn)
for _name, _fn in LOGICAL.items():
    _binary(_name, U8, _fn)


# -- unary ----------------------------------------------------------------------------------


def _unary(name, types, out_type, fn, what="input"):
    """out_type None: same as the input. fn sees float inputs as f32 (an f16 input is widened
    exactly, NaN and inf included) and a same-type float result is rounded back (from_f32)."""

    def expr(kc, n, x):
        t = kc.wtype(n.inputs[0])
        r = fn(to_f32(x, t))
        return from_f32(r, t) if out_type is None else r

    register(name, {what: types, "output": (out_type,) if out_type else types}, expr=expr)

    def emit(self: Any, x: MLOperand, label: str | None) -> MLOperand:
        self._operand(x, name, what)
        check_support(name, **{what: x})
        return self._emit1(name, [x], {}, out_type or x.data_type, x.shape, label)

    if what == "a":  # logicalNot(a)

        def op(self: Any, a: MLOperand, *, label: str | None = None) -> MLOperand:
            return emit(self, a, label)

        renamed = {"x": "a"}
    else:

        def op(self: Any, input: MLOperand, *, label: str | None = None) -> MLOperand:
            return emit(self, input, label)

        renamed = {"x": "input"}
    op.__name__ = op.__qualname__ = name
    op.__doc__ = _UNARY_DOCS.get(name)
    builder_op(op, renamed=renamed)


# Docstrings of the generated methods (what MLGraphBuilder.<name> shows).
_UNARY_DOCS = {
    "logical_not": "1 (uint8) where the uint8 input `a` is 0, else 0.",
    "is_nan": "1 (uint8) where the float input is NaN, else 0.",
    "is_infinite": "1 (uint8) where the float input is +inf or -inf, else 0.",
    "round_even": "Round to the nearest integer, ties to even (as numpy.rint).",
}


# IDL: MLOperand logicalNot(MLOperand a, optional MLOperatorOptions options = {});
_unary("logical_not", U8, "uint8", lambda x: _b(f"{x} == 0u"), what="a")
# IDL: MLOperand isNaN(MLOperand input, optional MLOperatorOptions options = {});
# Bit tests: robust where the driver's float compares assume no NaN.
_unary("is_nan", FLOAT, "uint8", lambda x: _b(f"(bitcast<u32>({x}) & 0x7fffffffu) > 0x7f800000u"))
# IDL: MLOperand isInfinite(MLOperand input, optional MLOperatorOptions options = {});
_unary("is_infinite", FLOAT, "uint8", lambda x: _b(f"(bitcast<u32>({x}) & 0x7fffffffu) == 0x7f800000u"))
# IDL: MLOperand roundEven(MLOperand input, optional MLOperatorOptions options = {});
_unary("round_even", FLOAT, None, lambda x: f"round_even_f32({x})")
