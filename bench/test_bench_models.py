"""Every MediaPipe model of the `mltensor.models` registry through InferenceSession (numpy in, numpy
out, as an application calls it) against LiteRT's CPU interpreter on the same photo, same run.
The README's `## Real models` latencies come from here. The model with MediaPipe's custom ops has
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
    info = record(benchmark, ours, f"MediaPipe {name} (InferenceSession, numpy in/out)", ref=ref,
                  ref_name="LiteRT CPU (XNNPACK, 2 threads)" if ref else "LiteRT cannot run its custom ops",
                  adapter=adapter_name(ctx))
    ref_ms = f"{1e3 * ref['total_s']:.1f} ms" if ref else "n/a"
    print(f"\n[{name}] ours {1e3 * ours['total_s']:.1f} ms, LiteRT {ref_ms}, ratio {info.get('ratio', float('nan')):.3f}")
