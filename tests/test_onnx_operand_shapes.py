"""Gemm/MatMul operand shapes onnxruntime accepts (vector A, broadcast C, broadcast batch dims,
vectors on either side of MatMul), fed through an input declared without a shape (any rank, which
the session takes from the feed), each against onnxruntime."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")

CASES = [
    ("Gemm", (4,), (4, 2), None, {}),
    ("Gemm", (4,), (4, 2), (2,), {}),
    ("Gemm", (4,), (2, 4), (2,), {"transB": 1}),
    ("Gemm", (3, 4), (4, 2), (3, 1), {}),
    ("Gemm", (3, 4), (4, 2), (1,), {}),
    ("Gemm", (3, 4), (4, 2), (), {}),
    ("Gemm", (4, 3), (4, 2), (2,), {"transA": 1}),
    ("MatMul", (2, 1, 3, 4), (5, 4, 6), None, {}),
    ("MatMul", (4,), (2, 4, 6), None, {}),
    ("MatMul", (2, 3, 4), (4,), None, {}),
    ("MatMul", (1, 3, 4), (2, 4, 6), None, {}),
    ("MatMul", (4,), (4,), None, {}),
]


@pytest.mark.parametrize("op,ash,bsh,csh,kw", CASES)
def test_operand_shapes_like_onnxruntime(ctx, rng, op, ash, bsh, csh, kw):
    ins = ["a", "b"] + (["c"] if csh is not None else [])
    inits = [onnx.numpy_helper.from_array(rng.standard_normal(bsh).astype(np.float32), "b")]
    if csh is not None:
        inits.append(onnx.numpy_helper.from_array(np.asarray(rng.standard_normal(csh), np.float32), "c"))
    g = helper.make_graph(
        [helper.make_node(op, ins, ["y"], **kw)],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    a = rng.standard_normal(ash).astype(np.float32)
    (want,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})
    sess = InferenceSession(m, ctx)
    assert sess.get_inputs()[0].shape is None
    (got,) = sess.run(None, {"a": a})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
