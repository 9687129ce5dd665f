"""ONNX reductions, ArgMax/ArgMin, CumSum."""

from ._helpers import ints, norm_axis, scalar, X
from ._registry import op
from .movement import axes_arg

# -- reductions -------------------------------------------------------------------------------

_REDUCE = {
    "ReduceSum": "reduce_sum",
    "ReduceMean": "reduce_mean",
    "ReduceMax": "reduce_max",
    "ReduceMin": "reduce_min",
    "ReduceProd": "reduce_product",
    "ReduceL1": "reduce_l1",
    "ReduceL2": "reduce_l2",
    "ReduceLogSum": "reduce_log_sum",
    "ReduceLogSumExp": "reduce_log_sum_exp",
    "ReduceSumSquare": "reduce_sum_square",
}


@op(*_REDUCE, attrs=("axes", "keepdims", "noop_with_empty_axes"))
def _reduce(im, node, ins, attrs):
    axes = axes_arg(im, node, ins, attrs)
    x = X(im, ins[0])
    keep = bool(attrs.get("keepdims", 1))
    r = len(x.shape)
    if not axes:
        if attrs.get("noop_with_empty_axes", 0):
            return im.b.identity(x)
        axes = list(range(r))
    axes = sorted({norm_axis(a, r) for a in axes})
    fn = _REDUCE[node.op_type]
    if x.data_type == "uint8" and id(x) in im.bools:
        x = im.b.cast(x, "int32")
    return getattr(im.b, fn)(x, axes=axes, keep_dimensions=keep)


@op("ArgMax", "ArgMin", attrs=("axis", "keepdims", "select_last_index"))
def _argminmax(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    axis = norm_axis(attrs.get("axis", 0), r)
    keep = bool(attrs.get("keepdims", 1))
    fn = "arg_max" if node.op_type == "ArgMax" else "arg_min"
    if attrs.get("select_last_index", 0):
        xr = im.b.reverse(x, axes=[axis])
        i = getattr(im.b, fn)(xr, axis, keep_dimensions=keep, output_data_type="int64")
        return im.b.sub(scalar(im, x.shape[axis] - 1, i), i)
    return getattr(im.b, fn)(x, axis, keep_dimensions=keep, output_data_type="int64")


@op("CumSum", attrs=("exclusive", "reverse"))
def _cumsum(im, node, ins, attrs):
    x = X(im, ins[0])
    axis = norm_axis(ints(im, ins[1], "axis")[0], len(x.shape))
    return im.b.cumulative_sum(
        x, axis, exclusive=bool(attrs.get("exclusive", 0)), reversed=bool(attrs.get("reverse", 0))
    )
