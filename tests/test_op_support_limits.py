"""`ctx.op_support_limits()` reports exactly what works.

For every operator it lists, and every data type it lists for an operand, a small graph builds and
runs; for a data type it does not list, the builder call raises TypeError. Operators are driven
generically from the limits dict: each has a recipe (how to call it on small shapes) and groups of
operands that share one data type. Operators not registered yet simply do not appear. One graph per
(operator, group) holds a subgraph per data type, so each is one build, one dispatch, one read.
"""

import numpy as np
import pytest
from helpers import run_graph

import mltensor
from mltensor import dtypes

ALL = dtypes.ALL


def _binary(op):
    return [("a", "b")], lambda b, T, inp: getattr(b, op)(inp("a", [2, 3]), inp("b", [3]))


def _unary(op, key="input", **kw):
    return [(key,)], lambda b, T, inp: getattr(b, op)(inp(key, [2, 3]), **kw)


def _one(op, shape, *args, **kw):
    return [("input",)], lambda b, T, inp: getattr(b, op)(inp("input", shape), *args, **kw)


RECIPES = {}
for _op in (
    "add",
    "sub",
    "mul",
    "div",
    "max",
    "min",
    "pow",
    "equal",
    "not_equal",
    "greater",
    "greater_or_equal",
    "lesser",
    "lesser_or_equal",
    "logical_and",
    "logical_or",
    "logical_xor",
):
    RECIPES[_op] = _binary(_op)
for _op in (
    "abs",
    "ceil",
    "cos",
    "erf",
    "exp",
    "floor",
    "identity",
    "log",
    "neg",
    "reciprocal",
    "round_even",
    "sign",
    "sin",
    "sqrt",
    "tan",
    "elu",
    "gelu",
    "hard_sigmoid",
    "hard_swish",
    "leaky_relu",
    "linear",
    "relu",
    "sigmoid",
    "softplus",
    "softsign",
    "tanh",
    "is_nan",
    "is_infinite",
):
    RECIPES[_op] = _unary(_op)
RECIPES["logical_not"] = _unary("logical_not", key="a")
RECIPES["clamp"] = _unary("clamp", min_value=0, max_value=3)
for _op in (
    "reduce_l1",
    "reduce_l2",
    "reduce_log_sum",
    "reduce_log_sum_exp",
    "reduce_max",
    "reduce_mean",
    "reduce_min",
    "reduce_product",
    "reduce_sum",
    "reduce_sum_square",
):
    RECIPES[_op] = _one(_op, [2, 3], axes=[1])
for _op in ("average_pool2d", "l2_pool2d", "max_pool2d"):
    RECIPES[_op] = _one(_op, [1, 1, 2, 2])

RECIPES.update(
    {
        "prelu": ([("input", "slope")], lambda b, T, inp: b.prelu(inp("input", [2, 3]), inp("slope", [3]))),
        "cast": ([("input",), ("output",)], lambda b, T, inp: b.cast(inp("input", [2, 3]), T["output"])),
        "arg_min": (
            [("input",), ("output",)],
            lambda b, T, inp: b.arg_min(inp("input", [2, 3]), 1, output_data_type=T["output"]),
        ),
        "arg_max": (
            [("input",), ("output",)],
            lambda b, T, inp: b.arg_max(inp("input", [2, 3]), 1, output_data_type=T["output"]),
        ),
        "cumulative_sum": _one("cumulative_sum", [2, 3], 1),
        "softmax": _one("softmax", [2, 3], 1),
        "batch_normalization": (
            [("input", "mean", "variance", "scale", "bias")],
            lambda b, T, inp: b.batch_normalization(
                inp("input", [1, 2, 3]),
                inp("mean", [2]),
                inp("variance", [2]),
                scale=inp("scale", [2]),
                bias=inp("bias", [2]),
            ),
        ),
        "instance_normalization": (
            [("input", "scale", "bias")],
            lambda b, T, inp: b.instance_normalization(
                inp("input", [1, 2, 2, 2]), scale=inp("scale", [2]), bias=inp("bias", [2])
            ),
        ),
        "layer_normalization": (
            [("input", "scale", "bias")],
            lambda b, T, inp: b.layer_normalization(
                inp("input", [2, 3]), scale=inp("scale", [3]), bias=inp("bias", [3]), axes=[1]
            ),
        ),
        "matmul": ([("a", "b")], lambda b, T, inp: b.matmul(inp("a", [2, 3]), inp("b", [3, 2]))),
        "gemm": ([("a", "b", "c")], lambda b, T, inp: b.gemm(inp("a", [2, 3]), inp("b", [3, 2]), c=inp("c", [2]))),
        "conv2d": (
            [("input", "filter", "bias")],
            lambda b, T, inp: b.conv2d(inp("input", [1, 1, 3, 3]), inp("filter", [1, 1, 2, 2]), bias=inp("bias", [1])),
        ),
        "conv_transpose2d": (
            [("input", "filter", "bias")],
            lambda b, T, inp: b.conv_transpose2d(
                inp("input", [1, 1, 2, 2]), inp("filter", [1, 1, 2, 2]), bias=inp("bias", [1])
            ),
        ),
        "resample2d": _one("resample2d", [1, 1, 2, 2], sizes=[4, 4]),
        "reshape": _one("reshape", [2, 3], [3, 2]),
        "expand": _one("expand", [3], [2, 3]),
        "transpose": _one("transpose", [2, 3]),
        "slice": _one("slice", [2, 3], [0, 1], [2, 2]),
        "split": _one("split", [2, 4], 2, axis=1),
        "concat": ([("inputs",)], lambda b, T, inp: b.concat([inp("inputs", [2, 3]), inp("inputs", [2, 1])], 1)),
        "pad": _one("pad", [2, 3], [1, 0], [0, 1]),
        "reverse": _one("reverse", [2, 3]),
        "tile": _one("tile", [2, 3], [2, 1]),
        "triangular": _one("triangular", [2, 3]),
        "where": (
            [("condition",), ("true_value", "false_value")],
            lambda b, T, inp: b.where(inp("condition", [2, 3]), inp("true_value", [2, 3]), inp("false_value", [3])),
        ),
        "gather": ([("input",), ("indices",)], lambda b, T, inp: b.gather(inp("input", [3, 2]), inp("indices", [2]))),
        "gather_elements": (
            [("input",), ("indices",)],
            lambda b, T, inp: b.gather_elements(inp("input", [3, 2]), inp("indices", [2, 2])),
        ),
        "gather_nd": (
            [("input",), ("indices",)],
            lambda b, T, inp: b.gather_nd(inp("input", [3, 2]), inp("indices", [2, 1])),
        ),
        "scatter_elements": (
            [("input", "updates"), ("indices",)],
            lambda b, T, inp: b.scatter_elements(inp("input", [3, 2]), inp("indices", [2, 2]), inp("updates", [2, 2])),
        ),
        "scatter_nd": (
            [("input", "updates"), ("indices",)],
            lambda b, T, inp: b.scatter_nd(inp("input", [3, 2]), inp("indices", [2, 1]), inp("updates", [2, 2])),
        ),
        "quantize_linear": (
            [("input", "scale"), ("zero_point",)],
            lambda b, T, inp: b.quantize_linear(inp("input", [2, 4]), inp("scale", [1, 2]), inp("zero_point", [1, 2])),
        ),
        "dequantize_linear": (
            [("input", "zero_point"), ("scale",)],
            lambda b, T, inp: b.dequantize_linear(
                inp("input", [2, 4]), inp("scale", [1, 2]), inp("zero_point", [1, 2])
            ),
        ),
        "gru": (
            [("input", "weight", "recurrent_weight", "bias", "recurrent_bias", "initial_hidden_state")],
            lambda b, T, inp: b.gru(
                inp("input", [2, 1, 2]),
                inp("weight", [1, 6, 2]),
                inp("recurrent_weight", [1, 6, 2]),
                2,
                2,
                bias=inp("bias", [1, 6]),
                recurrent_bias=inp("recurrent_bias", [1, 6]),
                initial_hidden_state=inp("initial_hidden_state", [1, 1, 2]),
                return_sequence=True,
            ),
        ),
        "gru_cell": (
            [("input", "weight", "recurrent_weight", "hidden_state", "bias", "recurrent_bias")],
            lambda b, T, inp: b.gru_cell(
                inp("input", [1, 2]),
                inp("weight", [6, 2]),
                inp("recurrent_weight", [6, 2]),
                inp("hidden_state", [1, 2]),
                2,
                bias=inp("bias", [6]),
                recurrent_bias=inp("recurrent_bias", [6]),
            ),
        ),
        "lstm": (
            [
                (
                    "input",
                    "weight",
                    "recurrent_weight",
                    "bias",
                    "recurrent_bias",
                    "peephole_weight",
                    "initial_hidden_state",
                    "initial_cell_state",
                )
            ],
            lambda b, T, inp: b.lstm(
                inp("input", [2, 1, 2]),
                inp("weight", [1, 8, 2]),
                inp("recurrent_weight", [1, 8, 2]),
                2,
                2,
                bias=inp("bias", [1, 8]),
                recurrent_bias=inp("recurrent_bias", [1, 8]),
                peephole_weight=inp("peephole_weight", [1, 6]),
                initial_hidden_state=inp("initial_hidden_state", [1, 1, 2]),
                initial_cell_state=inp("initial_cell_state", [1, 1, 2]),
                return_sequence=True,
            ),
        ),
        "lstm_cell": (
            [
                (
                    "input",
                    "weight",
                    "recurrent_weight",
                    "hidden_state",
                    "cell_state",
                    "bias",
                    "recurrent_bias",
                    "peephole_weight",
                )
            ],
            lambda b, T, inp: b.lstm_cell(
                inp("input", [1, 2]),
                inp("weight", [8, 2]),
                inp("recurrent_weight", [8, 2]),
                inp("hidden_state", [1, 2]),
                inp("cell_state", [1, 2]),
                2,
                bias=inp("bias", [8]),
                recurrent_bias=inp("recurrent_bias", [8]),
                peephole_weight=inp("peephole_weight", [6]),
            ),
        ),
    }
)

NOT_OPERATORS = ("preferred_input_layout", "max_tensor_byte_length", "input", "constant", "output")


@pytest.fixture(scope="module")
def limits(ctx):
    return ctx.op_support_limits()


def _types(lim, op, key):
    return lim[op][key]["data_types"]


def _group_types(lim, op, group):
    """The data types listed for a group of operands sharing one type: all must list the same."""
    sets = [tuple(_types(lim, op, k)) for k in group]
    assert all(set(s) == set(sets[0]) for s in sets), f"{op}: operands {group} list different types {sets}"
    return list(sets[0])


def _defaults(lim, op, groups):
    T = {}
    for g in groups:
        t = _group_types(lim, op, g)[0]
        T.update({k: t for k in g})
    return T


class _Inputs:
    """inp(key, shape): a graph input of the key's current data type, fed with ones."""

    def __init__(self, b, T, tag):
        self.b, self.T, self.tag, self.feeds = b, T, tag, {}

    def __call__(self, key, shape):
        name = f"{key}_{self.tag}_{len(self.feeds)}"
        self.feeds[name] = np.ones(shape, dtypes.NUMPY[self.T[key]])
        return self.b.input(name, data_type=self.T[key], shape=shape)


def _outputs(result):
    return list(result) if isinstance(result, (list, tuple)) else [result]


def test_every_listed_operator_has_a_recipe(limits):
    ops = [k for k in limits if k not in NOT_OPERATORS]
    missing = sorted(set(ops) - set(RECIPES))
    assert not missing, f"operators without a recipe in this test: {missing}"
    for k in NOT_OPERATORS:
        assert k in limits
    assert limits["preferred_input_layout"] in ("nchw", "nhwc")


@pytest.mark.parametrize("op", sorted(RECIPES))
def test_listed_types_work_and_others_raise(ctx, limits, op):
    if op not in limits:
        pytest.skip(f"{op} is not registered")
    groups, recipe = RECIPES[op]
    out_key = "outputs" if "outputs" in limits[op] else "output"
    out_types = _types(limits, op, out_key)
    for g in groups:
        listed = _group_types(limits, op, g)
        # every listed type: one graph with a subgraph per type
        b = mltensor.MLGraphBuilder(ctx)
        outs, feeds = {}, {}
        for t in listed:
            T = _defaults(limits, op, groups)
            T.update({k: t for k in g})
            inp = _Inputs(b, T, t)
            for j, y in enumerate(_outputs(recipe(b, T, inp))):
                assert y.data_type in out_types, f"{op}: output type {y.data_type} not listed in {out_types}"
                outs[f"y_{t}_{j}"] = y
            feeds.update(inp.feeds)
        res = run_graph(ctx, outs, feeds, b)
        for name, y in outs.items():
            assert res[name].shape == y.shape and res[name].dtype == dtypes.NUMPY[y.data_type], name
        # every type not listed for the group raises TypeError at the call
        for t in ALL:
            if t in listed:
                continue
            b = mltensor.MLGraphBuilder(ctx)
            T = _defaults(limits, op, groups)
            T.update({k: t for k in g})
            with pytest.raises(TypeError):
                recipe(b, T, _Inputs(b, T, t))
