"""Every MediaPipe model of the `mltensor.models` registry through InferenceSession (numpy in, numpy
out, as an application calls it) against LiteRT's CPU interpreter on the same photo, same run.
The latencies in docs/reference/real-models.md come from here. The model with MediaPipe's custom ops has
no LiteRT figure (LiteRT cannot run them)."""

import numpy as np
import pytest

import mltensor
from mltensor import models

from .timing import adapter_name, measure, record

litert = pytest.importorskip("ai_edge_litert.interpreter")

ROUNDS = 7
CUSTOM_OPS = {"face_landmark_with_attention"}


def _photo(height, width):
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = Image.open(f).convert("RGB").resize((width, height), Image.BILINEAR)
    return (np.asarray(img, dtype=np.float32) / 255.0)[None]


# the .tflite entries of the registry (the MediaPipe models)
@pytest.mark.parametrize("name", sorted(n for n, entry in models.MODELS.items() if str(entry[0]).endswith(".tflite")))
def test_mediapipe_model_latency(benchmark, ctx, name):
    try:
        path = models.fetch(name, progress=False)
    except models.FetchError as e:
        pytest.skip(f"model unavailable: {e}")
    sess = mltensor.InferenceSession(path, context=ctx)
    inp = sess.get_inputs()[0]
    x = _photo(*[int(d) for d in inp.shape[1:3]])  # NHWC rgb: the model says its size
    feed = {inp.name: x}
    ours = measure(lambda: sess.run(None, feed), rounds=ROUNDS, warmup=1)
    ref = None
    if name not in CUSTOM_OPS:
        it = litert.Interpreter(model_path=path, num_threads=2)
        it.allocate_tensors()
        i_in = it.get_input_details()[0]["index"]
        outs = [d["index"] for d in it.get_output_details()]

        def run_litert():
            it.set_tensor(i_in, x)
            it.invoke()
            return [it.get_tensor(k) for k in outs]

        ref = measure(run_litert, rounds=ROUNDS, warmup=1)
    info = record(
        benchmark,
        ours,
        f"MediaPipe {name} (InferenceSession, numpy in/out)",
        ref=ref,
        ref_name="LiteRT CPU (XNNPACK, 2 threads)" if ref else "LiteRT cannot run its custom ops",
        adapter=adapter_name(ctx),
    )
    ref_ms = f"{1e3 * ref['total_s']:.1f} ms" if ref else "n/a"
    print(
        f"\n[{name}] ours {1e3 * ours['total_s']:.1f} ms, LiteRT {ref_ms}, ratio {info.get('ratio', float('nan')):.3f}"
    )


# -- real ONNX models from PyPI wheels (models.ONNX_MODELS) against onnxruntime CPU ------------------
ort = pytest.importorskip("onnxruntime")


def _onnx_feeds(name, rng):
    """One real-looking feed per model: speech-like noise for the VADs, a text-like page for OCR
    (shapes as docs/reference/real-models.md lists them)."""
    t = np.arange(576) / 16000
    voice = (0.2 * np.sin(2 * np.pi * 140 * t) + rng.normal(0, 0.005, t.shape)).astype(np.float32)[None]
    if name == "silero_vad_16k_sequence":
        z = np.zeros((1, 1, 128), np.float32)
        return {"input": np.repeat(voice, 6, axis=0), "h": z, "c": z}
    if name.startswith("silero_vad"):
        n = 576 if "openvino" in name else 512
        f = {"input": voice[:, :n], "state": np.zeros((2, 1, 128), np.float32)}
        if name in ("silero_vad", "silero_vad_16k_op15", "silero_vad_op18_ifless"):
            f["sr"] = np.array(16000, np.int64)
        return f
    h, w = (96, 128) if name.endswith("det") else (48, 192)
    page = np.full((1, 3, h, w), 0.84, np.float32) - (rng.random((1, 3, h, w)) < 0.1).astype(np.float32)
    return {"x": page}


@pytest.mark.parametrize("name", sorted(models.ONNX_MODELS))
def test_onnx_model_latency(benchmark, ctx, name):
    try:
        path = models.fetch_onnx(name, progress=False)
    except models.FetchError as e:
        pytest.skip(f"model unavailable: {e}")
    feeds = _onnx_feeds(name, np.random.default_rng(0))
    sess = mltensor.InferenceSession(path, context=ctx)
    ours = measure(lambda: sess.run(None, feeds), rounds=ROUNDS, warmup=1)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    ref_sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ref = measure(lambda: ref_sess.run(None, feeds), rounds=ROUNDS, warmup=1)
    info = record(
        benchmark,
        ours,
        f"ONNX {name} (InferenceSession, numpy in/out)",
        ref=ref,
        ref_name="onnxruntime CPU (2 threads)",
        adapter=adapter_name(ctx),
    )
    print(
        f"\n[{name}] ours {1e3 * ours['total_s']:.1f} ms, onnxruntime {1e3 * ref['total_s']:.1f} ms, "
        f"ratio {info['ratio']:.3f}"
    )
