"""quantize_linear and dequantize_linear (shaders/quantize.wgsl), with the spec's blockwise
broadcasting of scale and zero point: each has the input's rank and every input dimension is a
whole multiple of theirs (each scale element covers a block of input elements).

Dynamic dimensions (mltensor/dynamic/): any dimension of the input, scale and zero point may be a
size known at dispatch. Scale and zero point broadcast structurally (a dimension equal to the
input's, 1, or a whole divisor of it as expressions); where only the sizes given at dispatch can
tell whether an input dimension is a multiple of the scale's, every dispatch checks it (TypeError
naming the operator). Block sizes and the element count are then read at dispatch."""

from __future__ import annotations

from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import cdiv, exact_div, wgsl
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, lowering, register
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, f32_lit, lit, store_fn
from ._checks import check_support, same_type
from .layout import coords, flat
from .movement import Checks
from .reduce import groups

DYNAMIC_OPS = frozenset({"quantize_linear", "dequantize_linear"})

FLOAT = dtypes.FLOATS
QUANT = ("uint8", "int8", "uint32", "int32")
# Saturation bounds, as f32 values that convert exactly (2**31 - 1 is not an f32).
RANGE = {
    "uint8": (0.0, 255.0),
    "int8": (-128.0, 127.0),
    "int32": (-2147483648.0, 2147483520.0),
    "uint32": (0.0, 4294967040.0),
}

register("quantize_linear", {"input": FLOAT, "scale": FLOAT, "zero_point": QUANT, "output": QUANT})
register("dequantize_linear", {"input": QUANT, "scale": FLOAT, "zero_point": QUANT, "output": FLOAT})


def _check(where, b, x, scale, zero_point):
    for what, v in (("input", x), ("scale", scale), ("zero_point", zero_point)):
        b._operand(v, where, what)
    check_support(where, input=x, scale=scale, zero_point=zero_point)
    if scale.rank != x.rank or zero_point.rank != x.rank:
        raise TypeError(
            f"[{where}] scale and zero_point must have the input's rank {x.rank}, got "
            f"{scale.rank} and {zero_point.rank}"
        )
    if scale.shape != zero_point.shape:
        raise TypeError(
            f"[{where}] zero_point shape {list(zero_point.shape)} differs from scale shape {list(scale.shape)}"
        )
    chk = Checks(b)
    if not all(_multiple(chk, where, d, s) for d, s in zip(x.shape, scale.shape)):
        raise TypeError(
            f"[{where}] scale shape {list(scale.shape)} is not blockwise broadcastable to "
            f"the input shape {list(x.shape)} (each input dimension must be a multiple)"
        )
    return chk


def _multiple(chk, where, n, s):
    """Input dimension n is a whole multiple of scale dimension s: True when it is, or may be
    (then checked at dispatch), False when it never is."""
    if isinstance(n, int) and isinstance(s, int):
        return n % s == 0
    if s == 1 or exact_div(n, s) is not None:
        return True
    if isinstance(n, int) and n < s.lo:
        return False
    what = f"[{where}] input dimension {n} must be a whole multiple of scale dimension {s}; the remainder"
    return chk.same(n - (n // s) * s, 0, what)


@builder_op(renamed={"x": "input"})
def quantize_linear(
    self: Any,
    input: MLOperand,
    scale: MLOperand,
    zero_point: MLOperand,
    *,
    label: str | None = None,
    _saturate: Any = None,
    _half_quotient: Any = False,
) -> MLOperand:
    """Quantize: saturate(round_half_to_even(x / scale) + zero_point) into the zero point's data
    type (int8, uint8, int32, uint32). `scale` and `zero_point` have the input's rank and
    broadcast blockwise (every input dimension a whole multiple of theirs)."""
    # IDL: MLOperand quantizeLinear(MLOperand input, MLOperand scale, MLOperand zeroPoint,
    #                               optional MLOperatorOptions options = {});
    # Two importer-only options (not WebNN; the ONNX importer's QuantizeLinear, which must match
    # the ONNX reference bit for bit):
    #  _saturate=(lo, hi): saturate into a narrower integer range than the output type's (ONNX
    #    int16/uint16, carried as int32/uint32 operands);
    #  _half_quotient=True: round x / scale to float16 before rounding to an integer, since ONNX
    #    divides in the scale's type and a float16 quotient can land on a tie (k + 0.5) that the
    #    f32 quotient misses. WebNN's own semantics keep the f32 quotient.
    chk = _check("quantize_linear", self, input, scale, zero_point)
    same_type("quantize_linear", ("input", input), ("scale", scale))
    attrs = {}
    if _saturate is not None:
        lo, hi = (int(v) for v in _saturate)
        tlo, thi = dtypes.INT_RANGE[dtypes.COMPUTE[zero_point.data_type]]
        if not (tlo <= lo <= hi <= thi and abs(lo) <= 2**24 and abs(hi) <= 2**24):
            raise TypeError(
                f"[quantize_linear] saturation range {(lo, hi)} is not within "
                f"{zero_point.data_type} (and |bound| <= 2**24)"
            )
        attrs["saturate"] = (lo, hi)
    if _half_quotient:
        if input.data_type != "float16":
            raise TypeError("[quantize_linear] a float16 quotient needs a float16 input")
        attrs["half_quotient"] = True
    y = self._emit1("quantize_linear", [input, scale, zero_point], attrs, zero_point.data_type, input.shape, label)
    chk.commit()
    return y


@builder_op(renamed={"x": "input"})
def dequantize_linear(
    self: Any, input: MLOperand, scale: MLOperand, zero_point: MLOperand, *, label: str | None = None
) -> MLOperand:
    """Dequantize: (x - zero_point) * scale, in the scale's data type. `scale` and `zero_point`
    broadcast blockwise as in quantize_linear."""
    # IDL: MLOperand dequantizeLinear(MLOperand input, MLOperand scale, MLOperand zeroPoint,
    #                                 optional MLOperatorOptions options = {});
    chk = _check("dequantize_linear", self, input, scale, zero_point)
    same_type("dequantize_linear", ("input", input), ("zero_point", zero_point))
    y = self._emit1("dequantize_linear", [input, scale, zero_point], {}, scale.data_type, input.shape, label)
    chk.commit()
    return y


def _index(x_shape, s_shape):
    if math.prod(s_shape) == 1:
        return "    let sidx = 0u;"
    if tuple(s_shape) == tuple(x_shape):
        return "    let sidx = i;"
    lines = coords(x_shape)
    terms = [f"c{d}" if n == s else f"c{d} / {wgsl(n // s)}" for d, (n, s) in enumerate(zip(x_shape, s_shape))]
    lines.append(f"    let sidx = {flat(terms, s_shape)};")
    return "\n".join(lines)


def _lower(kc, node, mode):
    x, scale, zp = node.inputs
    out = kc.out(node)
    n = math.prod(x.shape)
    params = {
        "mode": mode,
        "n": n,
        "index": _index(x.shape, scale.shape),
        "itype": kc.wtype(x),
        "ST": store_fn(kc.wtype(out)),
        "half": False,
    }
    if mode == "quantize":
        lo, hi = RANGE[out.data_type]
        top = {"uint8": 255, "int8": 127, "int32": 2**31 - 1, "uint32": 2**32 - 1}[out.data_type]
        if "saturate" in node.attrs:  # a narrower range, exact in f32 (checked at build)
            lo, hi = (float(v) for v in node.attrs["saturate"])
            top = int(hi)
        params.update(
            lo=f32_lit(lo),
            hi=f32_lit(hi),
            otype=kc.wtype(out),
            top=lit(top, kc.wtype(out)),
            bottom=lit(int(lo), kc.wtype(out)),
            half=bool(node.attrs.get("half_quotient")),
        )
    name = (
        f"{mode}_linear_{x.data_type}_{out.data_type}_{'x'.join(map(str, x.shape)) or 's'}"
        f"_b{'x'.join(map(str, scale.shape)) or 's'}"
    )
    if mode == "quantize" and "saturate" in node.attrs:
        name += "_r{}_{}".format(*node.attrs["saturate"]).replace("-", "m")
    if mode == "quantize" and node.attrs.get("half_quotient"):
        name += "_hq"
    k = Kernel(
        name,
        "quantize.wgsl",
        params,
        (
            Binding("x", kc.wtype(x)),
            Binding("scale", kc.wtype(scale)),
            Binding("zp", kc.wtype(zp)),
            Binding("out", kc.wtype(out), True),
        ),
    )
    kc.launch(k, [x, scale, zp, out], groups(node.op, cdiv(n, WORKGROUP)))


lowering("quantize_linear")(lambda kc, node: _lower(kc, node, "quantize"))
lowering("dequantize_linear")(lambda kc, node: _lower(kc, node, "dequantize"))
