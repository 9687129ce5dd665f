"""ONNX If whose condition is only known at run time (both branches, selected with where) or
decided by a small integer input (the session specializes to its value), against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _if_model(else_shape=(2, 3), cond_from="x"):
    """y = x * 2 if cond else x - 1, cond = sum(x) > 0 (or k > 0 for an int64 input k)."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])],
        [two],
    )
    else_nodes = [helper.make_node("Sub", ["x", "one"], ["e0"])]
    if else_shape != (2, 3):
        shp = helper.make_tensor("shp", TensorProto.INT64, [len(else_shape)], list(else_shape))
        else_nodes.append(helper.make_node("Reshape", ["e0", "shp"], ["e"]))
        inits = [one, shp]
    else:
        else_nodes.append(helper.make_node("Identity", ["e0"], ["e"]))
        inits = [one]
    else_g = helper.make_graph(
        else_nodes, "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, list(else_shape))], inits
    )
    zero_f = helper.make_tensor("zf", TensorProto.FLOAT, [], [0.0])
    zero_i = helper.make_tensor("zi", TensorProto.INT64, [], [0])
    if cond_from == "x":
        pre = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Greater", ["s", "zf"], ["c"])]
    else:
        pre = [helper.make_node("Greater", ["k", "zi"], ["c"])]
    nodes = pre + [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    if cond_from == "k":
        ins.append(helper.make_tensor_value_info("k", TensorProto.INT64, []))
    g = helper.make_graph(
        nodes, "g", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [zero_f, zero_i]
    )
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


def test_if_with_branches_of_different_shapes_reads_the_condition_back(ctx, rng):
    """The branches give [2, 3] and [3, 2]: the condition is read back (1 byte) at run time and
    the rest of the graph built for the branch taken, once per branch."""
    m = _if_model(else_shape=(3, 2))
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(m, ctx, cache=False)
    for sign in (1, -1, 1, -1):
        x = (np.abs(rng.standard_normal((2, 3))) * sign).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        (want,) = ref.run(None, {"x": x})
        assert y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-6)
    st = sess.stats
    assert st["stage_builds"] == 2 and st["stage_hits"] == 2
    assert st["readback_bytes"] == 4 * 1  # the condition (a uint8) of each of the 4 runs


def _ort_check(ctx, m, feeds, rtol=1e-5):
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = InferenceSession(m, ctx).run(None, feeds)
    want = ref.run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)


def test_loop_with_trip_count_known_at_load_is_unrolled(ctx, rng):
    """v <- v * 2 + i for i in range(3), on a computed v, with a scan output of every v."""
    body = helper.make_graph(
        [
            helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["v_in", "two"], ["v2"]),
            helper.make_node("Add", ["v2", "fi"], ["v_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Identity", ["v_out"], ["scan"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("scan", TensorProto.FLOAT, [2, 3]),
        ],
    )
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Loop", ["M", "", "r"], ["v", "all"], body=body)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("all", TensorProto.FLOAT, [3, 2, 3]),
        ],
        [helper.make_tensor("M", TensorProto.INT64, [], [3]), helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _ort_check(ctx, m, {"x": rng.standard_normal((2, 3)).astype(np.float32)})


@pytest.mark.parametrize("reverse", [0, 1])
def test_scan_is_unrolled(ctx, rng, reverse):
    """Running sum over the rows of a computed input, forward and reversed."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body",
        [
            helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("x_t", TensorProto.FLOAT, [4]),
        ],
        [
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("y_t", TensorProto.FLOAT, [4]),
        ],
    )
    g = helper.make_graph(
        [
            helper.make_node("Abs", ["x"], ["a"]),
            helper.make_node(
                "Scan",
                ["s0", "a"],
                ["s", "ys"],
                body=body,
                num_scan_inputs=1,
                scan_input_directions=[reverse],
                scan_output_directions=[reverse],
            ),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 4])],
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("ys", TensorProto.FLOAT, [5, 4]),
        ],
        [helper.make_tensor("s0", TensorProto.FLOAT, [4], [0.0, 1.0, 2.0, 3.0])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _ort_check(ctx, m, {"x": rng.standard_normal((5, 4)).astype(np.float32)})


def test_loop_with_run_time_exit_condition_runs_on_the_gpu(ctx, rng):
    """v doubles while sum(v) < 100, at most 5 times: executed, the condition read back."""
    body = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["v_in"], ["s"], keepdims=0),
            helper.make_node("Less", ["s", "lim"], ["c_out"]),
            helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [2]),
        ],
    )
    g = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "x"], ["v"], body=body)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor("M", TensorProto.INT64, [], [5]),
            helper.make_tensor("lim", TensorProto.FLOAT, [], [100.0]),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    for scale in (1.0, 30.0, 200.0, 0.01):
        x = (np.abs(rng.standard_normal(2)) * scale).astype(np.float32)
        _ort_check(ctx, m, {"x": x})
