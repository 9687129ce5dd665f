"""Scans along one axis: arg_min, arg_max and cumulative_sum (shaders/scan.wgsl).

One thread per line along the axis, walking it serially: the outputs of these operators depend on
every earlier element of the line, and lines are many where tensors are large.

Dynamic dimensions (mltensor/dynamic/): the axis and the others may be sizes known at dispatch;
the kernel reads them there (wgsl(); constants when static) and is otherwise the static kernel.
"""

import math

from .. import dtypes
from ..front.builder import builder_op
from ..dynamic.dims import cdiv, wgsl
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, binop, compare, convert, ld_st, lit
from . import check_axis, check_bool, check_support, lowering, register
from .reduce import groups

ALL = dtypes.ALL
INDEX_OUT = ("int32", "int64")
# Builder methods taking operands with dynamic dimensions (mltensor/dynamic/)
DYNAMIC_OPS = frozenset({"arg_min", "arg_max", "cumulative_sum"})


def _split(shape, axis):
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _sizes(outer, n, inner):
    """Template sizes of a scan over `outer` x `n` x `inner` (WGSL u32 expressions)."""
    return {"lines": wgsl(outer * inner), "len": wgsl(n), "inner": wgsl(inner), "stride": wgsl(n * inner),
            "last": wgsl(n - 1)}


# -- arg_min / arg_max ------------------------------------------------------------------------


def _arg_op(name, cmp):
    register(name, {"input": ALL, "output": INDEX_OUT}, ranks={"input": (1, 8)}, lower=_lower_arg)

    def op(b, x, axis, *, keep_dimensions=False, output_data_type="int32", label=None):
        # IDL: MLOperand argMin/argMax(MLOperand input, [EnforceRange] unsigned long axis,
        #                               optional MLArgMinMaxOptions options = {});
        b._operand(x, name, "input")
        check_support(name, input=x)
        axis = check_axis(name, axis, x.rank)
        odt = dtypes.normalize(output_data_type, name)
        if odt not in INDEX_OUT:
            raise TypeError(f"[{name}] output_data_type must be one of {', '.join(INDEX_OUT)}, got {odt}")
        check_bool(name, "keep_dimensions", keep_dimensions)
        shape = list(x.shape)
        if keep_dimensions:
            shape[axis] = 1
        else:
            del shape[axis]
        return b._emit1(name, [x], {"axis": axis, "cmp": cmp}, odt, tuple(shape), label)

    op.__name__ = name
    builder_op(op)


def _lower_arg(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    outer, n, inner = _split(x.shape, node.attrs["axis"])
    t = kc.wtype(x)
    lines = outer * inner
    k = Kernel(
        f"{node.op}_{t}_o{outer}_n{n}_i{inner}",
        "scan.wgsl",
        {"mode": "arg", **_sizes(outer, n, inner), "wtype": t,
         "better": compare(node.attrs["cmp"], t, "v", "best"), "result": convert("best_k", "u32", kc.wtype(out))},
        (Binding("x", t), Binding("out", kc.wtype(out), True)),
    )
    kc.launch(k, [x, out], groups(node.op, cdiv(lines, WORKGROUP)))


_arg_op("arg_min", "<")
_arg_op("arg_max", ">")


# -- cumulative_sum ---------------------------------------------------------------------------

register("cumulative_sum", {"input": ALL, "output": ALL}, ranks={"input": (1, 8)})


@builder_op
def cumulative_sum(b, x, axis, *, exclusive=False, reversed=False, label=None):
    # IDL: MLOperand cumulativeSum(MLOperand input, unsigned long axis,
    #                              optional MLCumulativeSumOptions options = {});
    b._operand(x, "cumulative_sum", "input")
    check_support("cumulative_sum", input=x)
    axis = check_axis("cumulative_sum", axis, x.rank)
    check_bool("cumulative_sum", "exclusive", exclusive)
    check_bool("cumulative_sum", "reversed", reversed)
    attrs = {"axis": axis, "exclusive": exclusive, "reversed": reversed}
    return b._emit1("cumulative_sum", [x], attrs, x.data_type, x.shape, label)


@lowering("cumulative_sum")
def _lower_cumsum(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    a = node.attrs
    outer, n, inner = _split(x.shape, a["axis"])
    st = kc.wtype(x)
    t = "f32" if st == "f16" else st  # running sums of f16 values are f32
    lines = outer * inner
    k = Kernel(
        f"cumulative_sum_{st}_o{outer}_n{n}_i{inner}" + ("_excl" if a["exclusive"] else "")
        + ("_rev" if a["reversed"] else ""),
        "scan.wgsl",
        {"mode": "cumsum", **_sizes(outer, n, inner), "zero": lit(0, t),
         "add": binop("+", t, "acc", "v"), **ld_st(st),
         "exclusive": a["exclusive"], "reversed": a["reversed"]},
        (Binding("x", st), Binding("out", st, True)),
    )
    kc.launch(k, [x, out], groups("cumulative_sum", cdiv(lines, WORKGROUP)))

