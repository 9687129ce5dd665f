"""Issue 29, memory: weights held once.

- Peak resident memory above start of one process that loads a ViT-B/16-shaped model (344 MB
  of float32 weights, random, mltensor.models_synthetic.vit) and computes one result, as a
  multiple of the weights, beside onnxruntime CPU in its own process on the same file
  (bench/one_process.py). On lavapipe GPU buffers are host memory, so the figure includes the
  weights' one GPU copy. Target <= 2x.
- Constant bytes a further input size adds to a session (per-size builds forced with
  dynamic=False, the case dynamic dimensions do not cover): target 0.

MLTENSOR_BENCH_VIT_LAYERS (default 12) shrinks the model for a quick run.
"""

import os
import tempfile

import numpy as np
import pytest

import mltensor
from mltensor.models_synthetic import vit

from .test_bench_startup import _median, one_process
from .timing import adapter_name

LAYERS = int(os.environ.get("MLTENSOR_BENCH_VIT_LAYERS", "12"))


@pytest.fixture(scope="module")
def vit_file():
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "vit.onnx")
        with open(p, "wb") as f:
            f.write(vit(layers=LAYERS))
        yield p


def test_peak_rss_vs_weights(benchmark, ctx, vit_file):
    import onnx
    from onnx import numpy_helper

    m = onnx.load(vit_file)
    weights = sum(numpy_helper.to_array(t).nbytes for t in m.graph.initializer)
    del m
    shape = [1, 3, 224, 224]
    with tempfile.TemporaryDirectory() as cache:
        ours = [one_process("mltensor", vit_file, "pixel_values", shape, {"MLTENSOR_CACHE": cache}, runs=1)]
        warm = [one_process("mltensor", vit_file, "pixel_values", shape, {"MLTENSOR_CACHE": cache}, runs=1)]
    ref = [one_process("onnxruntime", vit_file, "pixel_values", shape, runs=1)]
    a, w, b = (_median(r, "rss_peak_above_start") for r in (ours, warm, ref))
    info = benchmark.extra_info
    info.update(
        group="memory: peak RSS above start / weights (one process, one result)",
        adapter=adapter_name(ctx),
        weights_bytes=weights,
        layers=LAYERS,
        ours_total_s=None,
        ours_x_weights=a / weights,
        ours_graph_cache_warm_x_weights=w / weights,
        ref_name="onnxruntime CPU, same file",
        ref_x_weights=b / weights,
        ratio=b / a,
        ours_rss_peak=a,
        ref_rss_peak=b,
        same_result=abs(ours[0]["checksum"] - ref[0]["checksum"]) <= 1e-3 * ref[0]["checksum"],
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(
        f"\nViT ({LAYERS} layers, {weights / 1e6:.0f} MB of weights): peak RSS above start "
        f"{a / weights:.2f}x the weights (graph cache warm {w / weights:.2f}x), onnxruntime {b / weights:.2f}x"
    )
    assert info["same_result"]


def test_constant_bytes_per_further_size(benchmark, ctx):
    model = vit(layers=2)
    sess = mltensor.InferenceSession(model, ctx, dynamic=False, cache=False)
    rng = np.random.default_rng(0)
    added = []
    for batch in (1, 2, 3):
        before = ctx._counters["constant_bytes"]
        sess.run(None, {"pixel_values": rng.random((batch, 3, 224, 224), dtype=np.float32)})
        added.append(ctx._counters["constant_bytes"] - before)
    info = benchmark.extra_info
    info.update(
        group="memory: constant bytes a further input size adds",
        adapter=adapter_name(ctx),
        ours_total_s=None,
        first_size_bytes=added[0],
        second_size_bytes=added[1],
        third_size_bytes=added[2],
        builds=sess.stats["builds"],
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(f"\nconstant bytes added: first size {added[0]}, second {added[1]}, third {added[2]}")
    assert sess.stats["builds"] == 3
