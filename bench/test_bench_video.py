"""The video segmentation example end to end: frames per second and time per stage.

Ours: mltensor/apps/video_gpu.GpuPipeline, everything on one device (frame uploaded
once, preprocess into the lent input tensor, dispatch, EMA + composite from the lent mask, one
readback of the composited frame). Reference, same frames, same run: the copying way
(CopyingPipeline: numpy resize, InferenceSession with numpy in and out, numpy composite).

End to end = a uint8 frame in host memory -> the composited uint8 frame in host memory, ready to
encode (encoding costs the same for both and is left out). FPS is measured without fences between
stages; the per-stage split comes from a second pass with a GPU fence after each stage. Few frames:
a software adapter (lavapipe) is slow.
"""

import time

import numpy as np
import pytest
import wgpu

import mltensor
from mltensor import ml
from mltensor.apps.video_copy import CopyingPipeline
from mltensor.apps.video_frames import DemoSource
from mltensor.apps.video_gpu import GpuPipeline, load_model

from .timing import adapter_name, measure, record

SIZES = [(640, 360), (1280, 720)]
ROUNDS = 4


@pytest.fixture(scope="module")
def setup():
    try:
        path = mltensor.models.fetch("selfie_segmentation")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"model not available: {e}")
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync(label="bench-video")
    ctx = ml.create_context_sync(device)
    try:
        graph, mi, mo, _ = load_model(ctx, path)
    except (AttributeError, mltensor.NotSupportedError) as e:
        pytest.skip(f"model does not build yet: {e}")
    sess = mltensor.InferenceSession(path, context=ctx)
    return ctx, graph, mi, mo, sess


def _frames(w, h, n):
    src = DemoSource(w, h, frames=n)
    return [src.frame(i) for i in range(n)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_video_pipeline(benchmark, setup, size):
    ctx, graph, mi, mo, sess = setup
    w, h = size
    frames = _frames(w, h, 8)
    it = {"i": 0}

    def next_frame():
        f = frames[it["i"] % len(frames)]
        it["i"] += 1
        return f

    # ours, unfenced: the FPS figure
    fps_gpu = GpuPipeline(ctx, graph, mi, mo, w, h, stage_sync=False)
    out = np.empty((h, w, 4), np.uint8)
    before = ctx.counters
    ours = measure(lambda: fps_gpu.process(next_frame()), lambda: fps_gpu.read_frame(out), rounds=ROUNDS, warmup=1)
    after = ctx.counters
    moved = {k: after[k] - before[k] for k in ("bytes_uploaded", "bytes_downloaded", "bytes_copied_between_devices")}
    assert moved == dict.fromkeys(moved, 0), moved

    # ours, fenced per stage: where the time goes
    gpu = GpuPipeline(ctx, graph, mi, mo, w, h, stage_sync=True)
    rb = []

    def fenced():
        gpu.process(next_frame())
        t = time.perf_counter()
        gpu.read_frame(out)
        rb.append(time.perf_counter() - t)

    for _ in range(ROUNDS + 1):
        fenced()
    stages = {k: 1e3 * float(np.median(v[1:])) for k, v in gpu.times.items()}
    stages["readback"] = 1e3 * float(np.median(rb[1:]))
    gpu.close()

    # the copying way, same frames
    cpu = CopyingPipeline(sess, w, h)
    ref = measure(lambda: cpu.process(next_frame()), rounds=ROUNDS, warmup=1)
    ref_stages = {k: 1e3 * float(np.median(v[1:])) for k, v in cpu.times.items()}

    info = record(
        benchmark,
        ours,
        f"video selfie segmentation {w}x{h} (frame in -> composited frame out)",
        ref=ref,
        ref_name="copying way (numpy resize + InferenceSession numpy in/out + numpy composite)",
        fps=1 / ours["total_s"],
        ref_fps=1 / ref["total_s"],
        stages_ms=stages,
        ref_stages_ms=ref_stages,
        ml_bytes_moved=moved,
        adapter=adapter_name(ctx),
    )
    fps_gpu.close()  # after record(), which times one more run of it
    print(
        f"\n[video {w}x{h}] ours {info['fps']:.2f} FPS ({1e3 * ours['total_s']:.1f} ms, enqueue "
        f"{1e3 * ours['enqueue_s']:.1f} ms) vs copying way {info['ref_fps']:.2f} FPS: x{info['ratio']:.2f}\n"
        f"  ours per stage (fenced): " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()) + "\n"
        "  copying way per stage:   " + ", ".join(f"{k} {v:.1f}" for k, v in ref_stages.items())
    )
