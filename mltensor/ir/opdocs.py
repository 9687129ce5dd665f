"""The parameter reference of the WebNN builder methods (issue 46): one table of descriptions per
operator family, from which `registry.builder_op` completes each public method's docstring in
numpydoc form (rendered as tables by the docs' napoleon):

- Parameters: every parameter after `self`, its type and default read from the function's
  signature (the annotations are the source of both), its description from PARAMS[op] or, for
  names every family means the same way, SHARED;
- Returns: RETURNS[op] or one MLOperand;
- Raises: TypeError, InvalidStateError and NotSupportedError as the builder raises them.

The method's own docstring (written above the code, in ops/<family>.py) stays the summary; where
an operator is generated (unary, binary, reduce and pool families) SUMMARY gives it. A parameter
found in neither table is left out of the docstring, and the docs check (docs/_ext/
mltensor_params.py, tests/test_docs.py) fails the build naming it. Pure data: no imports.
"""

import inspect

SHARED = {
    "input": "The input operand.",
    "a": "The first operand.",
    "b": "The second operand (broadcast against `a` numpy-style).",
    "label": "A name for the node, shown in error messages about it.",
    "axes": "The dimensions to work on: distinct ints in [0, rank). None: every dimension.",
    "keep_dimensions": "Keep each reduced dimension with size 1 (else it is removed).",
    "axis": "The dimension to work along, an int in [0, rank).",
    "layout": 'The input\'s layout: "nchw" or "nhwc".',
    "padding": "Padding added to the spatial dimensions: [top, bottom, left, right]. None: zeros.",
    "strides": "The step between windows: [height, width]. None: [1, 1].",
    "dilations": "The spacing between window elements: [height, width]. None: [1, 1].",
    "scale": "An optional operand multiplied into the normalized values.",
    "bias": "An optional operand added to the result.",
    "epsilon": "Added to the variance before its square root, so it is never 0.",
    "indices": 'The indices, an operand of "int32", "uint32" or "int64" (negative ones count from the end).',
    "updates": "The values written at `indices`.",
    "zero_point": "The zero point, broadcast to the input's shape; its data type is the quantized one.",
    "weight": "The input weights, [num_directions, gates * hidden_size, input_size].",
    "recurrent_weight": "The recurrent weights, [num_directions, gates * hidden_size, hidden_size].",
    "recurrent_bias": "An optional recurrent bias, [num_directions, gates * hidden_size].",
    "hidden_size": "The size of the hidden state.",
    "steps": "The number of time steps (the input's first dimension).",
    "activations": 'The gate activations by name ("sigmoid", "tanh", "relu"). None: the spec\'s defaults.',
    "hidden_state": "The previous hidden state, [batch, hidden_size].",
    "cell_state": "The previous cell state, [batch, hidden_size].",
    "peephole_weight": "An optional peephole weight, [num_directions, 3 * hidden_size].",
    "initial_hidden_state": "An optional initial hidden state, [num_directions, batch, hidden_size]. None: zeros.",
    "return_sequence": "Also return every step's hidden state.",
    "direction": '"forward", "backward" or "both".',
}

_REDUCE = {
    "reduce_l1": "Sum of absolute values",
    "reduce_l2": "Square root of the sum of squares",
    "reduce_log_sum": "Natural logarithm of the sum",
    "reduce_log_sum_exp": "log(sum(exp(x))), computed without overflow,",
    "reduce_max": "Largest element",
    "reduce_min": "Smallest element",
    "reduce_mean": "Mean",
    "reduce_product": "Product",
    "reduce_sum": "Sum",
    "reduce_sum_square": "Sum of squares",
}
_POOL = {
    "average_pool2d": "Average",
    "l2_pool2d": "L2 norm (square root of the sum of squares)",
    "max_pool2d": "Largest element",
}

# Summaries of methods whose function has no docstring of its own (generated families).
SUMMARY = {
    **{k: f"{v} over `axes` of the input (every element when `axes` is None)." for k, v in _REDUCE.items()},
    **{
        k: f"{v} of each window of the spatial dimensions of a 4-D input (padding never counts)."
        for k, v in _POOL.items()
    },
    "arg_min": "Index of the smallest element along `axis` (the first on ties; a NaN wins).",
    "arg_max": "Index of the largest element along `axis` (the first on ties; a NaN wins).",
    "cumulative_sum": "Running sum along `axis`.",
}

_POOL_PARAMS = {
    "window_dimensions": "The window's [height, width]. None: the whole spatial extent (global pooling).",
    "rounding_type": 'How output sizes round when the windows do not fit exactly: "floor" or "ceil".',
    "output_sizes": "The output's [height, width], instead of computing them with `rounding_type`.",
}
_CONV = {
    "filter": "The filter, 4-D, laid out as `filter_layout` says.",
    "groups": "Input channels split into this many groups (depthwise when it equals the channels).",
    "input_layout": 'The input\'s layout: "nchw" or "nhwc"; the output has the same.',
    "bias": "An optional 1-D operand of output-channel size added to the result.",
}
_RNN_CELL = {"layout": "The order of the gates in the weights."}

PARAMS = {
    "cast": {"type": 'The data type to convert to, such as "float16" (a numpy dtype works too).'},
    "clamp": {
        "min_value": "The lower bound. None: no lower bound (-inf).",
        "max_value": "The upper bound. None: no upper bound (+inf).",
    },
    "elu": {"alpha": "The scale of the negative part."},
    "hard_sigmoid": {"alpha": "The slope.", "beta": "The offset."},
    "leaky_relu": {"alpha": "The slope of the negative part."},
    "linear": {"alpha": "The factor.", "beta": "The offset."},
    "prelu": {"slope": "The slope of the negative part, broadcast against the input."},
    "logical_not": {"a": 'The operand, of data type "uint8".'},
    "softmax": {"axis": "The dimension the values are normalized along, an int in [0, rank)."},
    "arg_min": {"output_data_type": 'The data type of the indices: "int32" or "int64".'},
    "arg_max": {"output_data_type": 'The data type of the indices: "int32" or "int64".'},
    "cumulative_sum": {
        "exclusive": "Leave each element out of its own sum (the first output is 0).",
        "reversed": "Sum from the end of the axis.",
    },
    "reshape": {"new_shape": "The new shape: sizes whose product equals the input's element count."},
    "expand": {"new_shape": "The shape to broadcast to (each input dimension 1 or equal to its size)."},
    "where": {
        "condition": 'The condition, "uint8": non-zero selects `true_value`.',
        "true_value": "The values taken where the condition is non-zero.",
        "false_value": "The values taken where it is 0 (the three operands broadcast numpy-style).",
    },
    "transpose": {"permutation": "Output dimension i is input dimension permutation[i]. None: reversed."},
    "slice": {
        "starts": "The first index in each dimension.",
        "sizes": "The number of elements taken in each dimension.",
        "strides": "The step in each dimension (positive). None: ones.",
    },
    "split": {
        "splits": "The number of equal parts, or the size of each part (summing to the axis' size).",
        "axis": "The dimension to split.",
    },
    "concat": {"inputs": "The operands to join: one data type and rank, equal sizes but along `axis`."},
    "pad": {
        "beginning_padding": "The number of elements added before each dimension.",
        "ending_padding": "The number of elements added after each dimension.",
        "mode": '"constant", "edge", "reflection" or "symmetric".',
        "value": 'The value of added elements in "constant" mode.',
    },
    "gather": {"axis": "The dimension `indices` index."},
    "resample2d": {
        "mode": '"nearest-neighbor" or "linear".',
        "scales": "The two scale factors (for `axes`). None: from `sizes`, else [1.0, 1.0].",
        "sizes": "The two output sizes (for `axes`), instead of `scales`.",
        "axes": "The two dimensions resampled. None: [2, 3].",
        "coordinate_transformation": 'How output coordinates map to input ones (ONNX\'s names, default "half_pixel").',
        "nearest_rounding": 'How "nearest-neighbor" rounds (ONNX\'s names, default "round_prefer_floor").',
    },
    "conv2d": {**_CONV, "filter_layout": '"oihw", "hwio", "ohwi" or "ihwo".'},
    "conv_transpose2d": {
        **_CONV,
        "filter_layout": '"iohw", "hwoi" or "ohwi".',
        "output_padding": "Added to the end of each spatial output dimension: [height, width].",
        "output_sizes": "The spatial output sizes [height, width], instead of computing them.",
    },
    "reverse": {"axes": "The dimensions reversed. None: every one; [] reverses nothing."},
    "tile": {"repetitions": "How many times the input repeats along each dimension."},
    "triangular": {
        "upper": "Keep the upper triangle (else the lower).",
        "diagonal": "The diagonal that bounds it: 0 the main one, > 0 above, < 0 below.",
    },
    "gather_elements": {"axis": "The dimension `indices` index."},
    "scatter_elements": {"axis": "The dimension `indices` index."},
    "matmul": {"a": "The left operand, [..., M, K].", "b": "The right operand, [..., K, N]."},
    "gemm": {
        "a": "The left operand, 2-D.",
        "b": "The right operand, 2-D.",
        "c": "An optional operand that broadcasts to the [M, N] output, added to it (times `beta`).",
        "alpha": "The factor of the product.",
        "beta": "The factor of `c`.",
        "a_transpose": "Use `a` transposed.",
        "b_transpose": "Use `b` transposed.",
    },
    "batch_normalization": {
        "mean": "The mean of each channel, 1-D.",
        "variance": "The variance of each channel, 1-D.",
        "scale": "An optional 1-D scale per channel.",
        "bias": "An optional 1-D bias per channel.",
        "axis": "The channel dimension.",
    },
    "instance_normalization": {
        "scale": "An optional 1-D scale per channel.",
        "bias": "An optional 1-D bias per channel.",
    },
    "layer_normalization": {"axes": "The dimensions normalized over. None: every dimension but the first."},
    **{k: dict(_POOL_PARAMS) for k in _POOL},
    "quantize_linear": {"scale": "The scale, broadcast to the input's shape."},
    "dequantize_linear": {
        "input": "The quantized input.",
        "scale": "The scale, broadcast to the input's shape; the output has its data type.",
    },
    "gru": {
        "input": "The input sequence, [steps, batch, input_size].",
        "bias": "An optional bias, [num_directions, 3 * hidden_size].",
        "reset_after": "Apply the reset gate after the recurrent matrix product (as cuDNN).",
        "layout": 'The order of the gates in the weights: "zrn" or "rzn".',
    },
    "gru_cell": {
        "input": "The input, [batch, input_size].",
        "weight": "The input weights, [3 * hidden_size, input_size].",
        "recurrent_weight": "The recurrent weights, [3 * hidden_size, hidden_size].",
        "bias": "An optional bias, [3 * hidden_size].",
        "recurrent_bias": "An optional recurrent bias, [3 * hidden_size].",
        "reset_after": "Apply the reset gate after the recurrent matrix product (as cuDNN).",
        "layout": 'The order of the gates in the weights: "zrn" or "rzn".',
    },
    "lstm": {
        "input": "The input sequence, [steps, batch, input_size].",
        "bias": "An optional bias, [num_directions, 4 * hidden_size].",
        "initial_cell_state": "An optional initial cell state, [num_directions, batch, hidden_size]. None: zeros.",
        "layout": 'The order of the gates in the weights: "iofg" or "ifgo".',
    },
    "lstm_cell": {
        "input": "The input, [batch, input_size].",
        "weight": "The input weights, [4 * hidden_size, input_size].",
        "recurrent_weight": "The recurrent weights, [4 * hidden_size, hidden_size].",
        "bias": "An optional bias, [4 * hidden_size].",
        "recurrent_bias": "An optional recurrent bias, [4 * hidden_size].",
        "peephole_weight": "An optional peephole weight, [3 * hidden_size].",
        "layout": 'The order of the gates in the weights: "iofg" or "ifgo".',
    },
}

RETURNS = {
    "split": ("list[MLOperand]", "The parts, in order along `axis`."),
    "gru": ("list[MLOperand]", "The last hidden state, then (with `return_sequence`) every step's."),
    "lstm": (
        "list[MLOperand]",
        "The last hidden state, the last cell state, then (with `return_sequence`) every step's hidden state.",
    ),
    "lstm_cell": ("list[MLOperand]", "The new hidden state and the new cell state."),
    "gru_cell": ("MLOperand", "The new hidden state, [batch, hidden_size]."),
}

RAISES = [
    (
        "TypeError",
        "An operand that is not an MLOperand of this builder, a data type or rank the operator does "
        "not take (see the operator table), shapes that do not fit, or an invalid option.",
    ),
    ("InvalidStateError", "The builder has started a build, or its context is lost."),
    ("NotSupportedError", "An operand has dynamic dimensions and the operator does not take them."),
]


def description(op, param):
    """The description of `op`'s parameter `param`, or None where the tables have none."""
    return PARAMS.get(op, {}).get(param) or SHARED.get(param)


def _type(annotation):
    if annotation is inspect.Parameter.empty:
        return None
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def compose(name, fn, renamed):
    """`fn`'s docstring completed with the Parameters, Returns and Raises sections."""
    summary = inspect.cleandoc(fn.__doc__ or SUMMARY.get(name, ""))
    if summary.startswith("IDL:"):  # a generated method's IDL line: not for users
        summary = SUMMARY.get(name, "")
    out = [summary, ""]
    if renamed:
        old = ", ".join(f"``{k}=`` (now ``{v}=``)" for k, v in renamed.items())
        out += [f"Deprecated keywords, accepted with a DeprecationWarning until the next release: {old}.", ""]
    out += ["Parameters", "----------"]
    for p in list(inspect.signature(fn).parameters.values())[1:]:
        if p.name.startswith("_") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue  # internal keywords (importers' options) and `**options` read as keywords
        text = description(name, p.name)
        if text is None:
            continue  # the docs check names it
        head = p.name
        t = _type(p.annotation)
        if t:
            head += f" : {t}"
        if p.default is not p.empty:
            head += f", default {p.default!r}" if t else f" : default {p.default!r}"
        out += [head, f"    {text}"]
    rtype, rtext = RETURNS.get(name, ("MLOperand", "The result."))
    out += ["", "Returns", "-------", rtype, f"    {rtext}", "", "Raises", "------"]
    for exc, text in RAISES:
        out += [exc, f"    {text}"]
    return "\n".join(out) + "\n"


STUB_HEAD = '''"""The WebNN operator methods of MLGraphBuilder, for type checkers and IDEs: they are attached at
import time (ir/registry.py builder_op), so no checker sees them in builder.py. Generated from the
annotated operator functions (mltensor/ops/) by mltensor.ir.opdocs.stub_text; tests/test_types.py
fails when it is stale (regenerate: the command
that test prints).
"""

from collections.abc import Sequence
from typing import Any

from mltensor.ir.graph import MLOperand

class BuilderOps:
'''


def stub_text(methods):
    """The text of front/_builder_ops.pyi for the public builder methods in `methods`."""
    out = [STUB_HEAD.rstrip("\n")]
    for name in sorted(n for n in methods if not n.startswith("_")):
        sig = inspect.signature(methods[name])
        params = []
        star = False
        for i, p in enumerate(sig.parameters.values()):
            if i == 0:
                params.append("self")
                continue
            if p.kind == p.VAR_KEYWORD:
                params.append(f"**{p.name}: Any")
                continue
            if p.kind == p.KEYWORD_ONLY and not star:
                params.append("*")
                star = True
            t = _type(p.annotation) or "Any"
            params.append(f"{p.name}: {t}" + ("" if p.default is p.empty else f" = {p.default!r}"))
        ret = _type(sig.return_annotation) or "Any"
        out.append(f"    def {name}({', '.join(params)}) -> {ret}: ...")
    return "\n".join(out) + "\n"
