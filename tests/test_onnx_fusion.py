"""ONNX import folds inference BatchNormalization into the Conv before it, so a
Conv -> BatchNormalization -> Add(residual) -> Relu block runs as one kernel."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from helpers import FUSION
from onnx import TensorProto, helper, numpy_helper

import mltensor


def _block(with_bias, rng):
    c = 8
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 6, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 6, 6])
    inits = [
        numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32), "W"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "mean"),
        numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), "var"),
    ]
    conv_in = ["x", "W"]
    if with_bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "B"))
        conv_in.append("B")
    nodes = [
        helper.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"], epsilon=1e-3),
        helper.make_node("Add", ["n", "x"], ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    g = helper.make_graph(nodes, "block", [x], [y], inits)
    # IR version 8: what the installed onnxruntime reads (newer onnx writes a newer one by default)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("with_bias", [False, True])
def test_conv_batchnorm_residual_relu_is_one_kernel(with_bias):
    rng = np.random.default_rng(3)
    model = _block(with_bias, rng)
    onnx.checker.check_model(model)
    x = rng.standard_normal((1, 8, 6, 6)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sess = mltensor.InferenceSession(model)
    (out,) = sess.run(None, {"x": x})
    assert out.shape == ref.shape
    assert out.dtype == ref.dtype
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
    names = sess.graph.kernel_names
    assert not FUSION or (len(names) == 1 and names[0].startswith("conv2d")), names
