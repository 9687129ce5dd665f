"""The builder methods' keywords are the WebNN spec's operand names (issue 46): `matmul(a, b)`,
`gemm(a, b, *, c=None, ...)`, `where(condition, true_value, false_value)`, `conv2d(input, filter)`;
the keywords they took before (`c=` for matmul's b, `bb=` for gemm's, `x=` for `input`) still
work for one release, with a DeprecationWarning naming the new one."""

import inspect

import numpy as np
import pytest
from helpers import run_graph

import mltensor
from mltensor.ir.registry import BUILDER_METHODS, OPS


def _public():
    return {n: m for n, m in BUILDER_METHODS.items() if not n.startswith("_")}


def test_first_parameter_is_self_and_operands_carry_the_spec_names():
    """Each operand parameter is named as the operator's support limits (op_support_limits())
    name it, and those come from the spec's IDL."""
    assert len(_public()) >= 95  # every WebNN operator of API.md
    for name, method in _public().items():
        params = list(inspect.signature(method).parameters.values())
        assert params[0].name == "self", name
        operands = [p.name for p in params if "MLOperand" in str(p.annotation)]
        assert operands, name
        assert set(operands) <= set(OPS[name].support) - {"output"}, (name, operands, sorted(OPS[name].support))


def test_spec_signatures():
    sig = {n: [p for p in inspect.signature(m).parameters][1:] for n, m in _public().items()}
    assert sig["matmul"] == ["a", "b", "label"]
    assert sig["gemm"][:3] == ["a", "b", "c"]
    assert sig["add"] == ["a", "b", "label"]
    assert sig["prelu"] == ["input", "slope", "label"]
    assert sig["where"] == ["condition", "true_value", "false_value", "label"]
    assert sig["logical_not"] == ["a", "label"]
    assert sig["cast"] == ["input", "type", "label"]
    assert sig["elu"] == ["input", "alpha", "label"]
    assert sig["clamp"] == ["input", "min_value", "max_value", "label"]
    assert sig["conv2d"][:2] == ["input", "filter"]
    assert sig["lstm"][:5] == ["input", "weight", "recurrent_weight", "steps", "hidden_size"]


def _mats(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    w = b.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    return b, x, w


def test_keywords_written_from_the_spec(ctx):
    b, x, w = _mats(ctx)
    bias = b.constant(np.ones(4, np.float32))
    outs = {
        "mm": b.matmul(a=x, b=w),
        "gemm": b.gemm(a=x, b=w, c=bias, alpha=2.0),
        "add": b.add(a=x, b=x),
        "relu": b.relu(input=x),
        "cast": b.cast(input=x, type="float16"),
        "pr": b.prelu(input=x, slope=b.constant(np.float32(0.5).reshape(1))),
    }
    X = np.array([[1, -2, 3], [-4, 5, 6]], np.float32)
    W = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = run_graph(ctx, outs, {"x": X}, b)
    np.testing.assert_allclose(got["mm"], X @ W)
    np.testing.assert_allclose(got["gemm"], 2 * X @ W + 1)
    np.testing.assert_allclose(got["add"], 2 * X)
    np.testing.assert_allclose(got["relu"], np.maximum(X, 0))
    assert got["cast"].dtype == np.float16
    np.testing.assert_allclose(got["pr"], np.where(X >= 0, X, 0.5 * X))


@pytest.mark.parametrize(
    "call,old,new",
    [
        (lambda b, x, w: b.matmul(x, c=w), "c", "b"),
        (lambda b, x, w: b.gemm(x, bb=w), "bb", "b"),
        (lambda b, x, w: b.add(x, c=x), "c", "b"),
        (lambda b, x, w: b.relu(x=x), "x", "input"),
        (lambda b, x, w: b.clamp(x=x, min_value=0), "x", "input"),
        (lambda b, x, w: b.reshape(x=x, new_shape=[3, 2]), "x", "input"),
        (lambda b, x, w: b.cast(x, data_type="float16"), "data_type", "type"),
        (lambda b, x, w: b.prelu(a=x, c=x), "a", "input"),
    ],
)
def test_old_keywords_warn_and_still_work(ctx, call, old, new):
    b, x, w = _mats(ctx)
    with pytest.warns(DeprecationWarning, match=rf"the keyword {old}= is deprecated: use {new}="):
        y = call(b, x, w)
    assert isinstance(y, mltensor.MLOperand)


def test_old_and_new_keyword_together_is_a_type_error(ctx):
    b, x, w = _mats(ctx)
    with pytest.raises(TypeError, match=r"\[matmul\] got both b= and its deprecated name c="):
        b.matmul(x, b=w, c=w)


def test_warning_points_at_the_caller(ctx):
    b, x, w = _mats(ctx)
    with pytest.warns(DeprecationWarning) as record:
        b.matmul(x, c=w)
    assert record[0].filename == __file__
