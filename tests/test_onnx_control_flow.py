"""ONNX If whose condition is only known at run time (both branches, selected with where) or
decided by a small integer input (the session specializes to its value), against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import mltensor
from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _if_model(else_shape=(2, 3), cond_from="x"):
    """y = x * 2 if cond else x - 1, cond = sum(x) > 0 (or k > 0 for an int64 input k)."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])], [two])
    else_nodes = [helper.make_node("Sub", ["x", "one"], ["e0"])]
    if else_shape != (2, 3):
        shp = helper.make_tensor("shp", TensorProto.INT64, [len(else_shape)], list(else_shape))
        else_nodes.append(helper.make_node("Reshape", ["e0", "shp"], ["e"]))
        inits = [one, shp]
    else:
        else_nodes.append(helper.make_node("Identity", ["e0"], ["e"]))
        inits = [one]
    else_g = helper.make_graph(else_nodes, "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, list(else_shape))], inits)
    zero_f = helper.make_tensor("zf", TensorProto.FLOAT, [], [0.0])
    zero_i = helper.make_tensor("zi", TensorProto.INT64, [], [0])
    if cond_from == "x":
        pre = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
               helper.make_node("Greater", ["s", "zf"], ["c"])]
    else:
        pre = [helper.make_node("Greater", ["k", "zi"], ["c"])]
    nodes = pre + [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    if cond_from == "k":
        ins.append(helper.make_tensor_value_info("k", TensorProto.INT64, []))
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [zero_f, zero_i])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_if_on_a_run_time_condition_selects_between_both_branches(ctx, rng):
    m = _if_model()
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(m, ctx)
    for sign in (1, -1, 1):
        x = (np.abs(rng.standard_normal((2, 3))) * sign).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        (want,) = ref.run(None, {"x": x})
        assert y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-6)
    assert sess.stats["builds"] == 1  # one graph serves both conditions


def test_if_on_a_small_int_input_specializes(ctx, rng):
    m = _if_model(cond_from="k")
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(m, ctx)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    for k in (1, 0, 1):
        feeds = {"x": x, "k": np.array(k, np.int64)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-6)
    assert sess.stats["builds"] == 2 and sess.stats["hits"] == 1


def test_if_with_branches_of_different_shapes_is_not_supported(ctx):
    with pytest.raises(mltensor.NotSupportedError, match=r"differs between the branches.*\[2, 3\] vs.*\[3, 2\]"):
        InferenceSession(_if_model(else_shape=(3, 2)), ctx)
