"""TFLite models computed in float16 (import_model(..., float16=True) / InferenceSession(...,
float16=True)): MediaPipe's float16-weight models keep their weights float16, the graph computes in
f16 where the context has "shader-f16" (else in f32 behind edge conversions), and the outputs stay
close to the float32 import: every element within 1e-2 of the output's range, or for a steep
mask a mean error under 1e-3 and every element within 5e-2 (selfie segmentation's mask is a sigmoid: at the few pixels where its logit is near 0, a
float16 logit moves the mask by up to ~2e-2; mean 5e-5 on lavapipe). Both modes run by default
(tests/test_f16.py's contexts), the larger hand landmark model under -m slow."""

import numpy as np
import pytest
from test_f16 import f16off_ctx, mctx  # noqa: F401  (fixtures: both float16 modes)
from test_tflite import _photo

from mltensor import InferenceSession, models
from mltensor.tflite import import_model


def _model(name):
    try:
        return models.fetch(name, progress=False)
    except models.FetchError as e:  # pragma: no cover
        pytest.skip(f"the model cannot be fetched: {e}")


@pytest.mark.parametrize("name", ["selfie_segmentation", pytest.param("hand_landmark_lite", marks=pytest.mark.slow)])
def test_float16_model_matches_float32(mctx, name):
    path = _model(name)
    s32 = InferenceSession(path, mctx)
    s16 = InferenceSession(path, mctx, float16=True)
    (inp,) = s32.get_inputs()
    _, h, w, _ = inp.shape
    x = _photo(h, w)
    assert [i.type for i in s16.get_inputs()] == [i.type for i in s32.get_inputs()]  # edges keep float32
    want, got = s32.run(None, {inp.name: x}), s16.run(None, {inp.name: x})
    for g, r in zip(got, want):
        assert g.dtype == r.dtype == np.float32 and g.shape == r.shape
        span = max(float(np.abs(r).max()), 1e-6)
        err = np.abs(g.astype(np.float64) - r) / span
        # within 1e-2 everywhere (hand landmarks: 5.5e-3), or a steep mask: 1e-3 mean, 5e-2 max
        assert err.max() < 1e-2 or (err.mean() < 1e-3 and err.max() < 5e-2), (err.mean(), err.max())
    s16.close()
    s32.close()


def test_float16_weights_stay_float16(mctx):
    """selfie_segmentation stores its weights as float16 behind DEQUANTIZE: with float16=True they
    become float16 constants (half the bytes uploaded), none float32."""
    path = _model("selfie_segmentation")
    graph32, *_ = import_model(path, mctx)
    graph16, ins, outs = import_model(path, mctx, float16=True)
    before = mctx.counters["bytes_uploaded"]
    graph32b, *_ = import_model(path, mctx)
    assert mctx.counters["bytes_uploaded"] == before  # the same weights again: shared, not uploaded
    up16, up32 = graph16.memory["constants"], graph32.memory["constants"]
    assert ins[0][1] == "float32" and outs[0][1] == "float32"
    if mctx._f16:
        assert up16 <= 0.55 * up32, (up16, up32)  # float16 constants: 2 bytes an element
    for g in (graph32, graph16, graph32b):
        g.destroy()


def test_float16_option_is_tflite_only(ctx):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(TypeError, match="float16"):
        InferenceSession(helper.make_model(g), ctx, float16=True)
    assert onnx  # the ONNX model itself is fine without the option
