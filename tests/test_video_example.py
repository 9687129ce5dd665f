"""The video segmentation example (mltensor/apps/selfie_segmentation.py, video_*.py), headless, a few frames.

- The shaders (resize into the lent input, mask EMA, blur, composite, present) against the same
  pipeline in numpy, with a stand-in model so the comparison does not depend on the real one.
- The real run: a few demo frames to .mp4 + PNG; the person keeps its pixels, the background
  changes, and the ML counters show that no ML tensor went back to the host.
"""

import os

import numpy as np
import pytest

import mltensor
from mltensor import ml
from mltensor.apps import selfie_segmentation as app
from mltensor.apps.video_copy import CopyingPipeline
from mltensor.apps.video_frames import DemoSource, Mp4Writer, open_source
from mltensor.apps.video_gpu import GpuPipeline, load_model

SIZE = (256, 144)


def _standin_graph(ctx):
    """Model stand-in: mask = sigmoid(40 * (mean(rgb) - 0.35)), NHWC 256x256x3 -> 256x256x1."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 256, 256, 3])
    m = b.reduce_mean(x, axes=[3], keep_dimensions=True)
    k = b.constant(data_type="float32", value=40.0)
    c = b.constant(data_type="float32", value=0.35)
    y = b.sigmoid(b.mul(b.sub(m, c), k))
    return b.build_sync({"y": y}), ("x", (1, 256, 256, 3)), ("y", (1, 256, 256, 1))


class _NumpyStandin:
    """The stand-in model for CopyingPipeline, with onnxruntime's session shape."""

    class _Arg:
        def __init__(self, name, shape):
            self.name, self.shape, self.type = name, shape, "tensor(float)"

    def get_inputs(self):
        return [self._Arg("x", [1, 256, 256, 3])]

    def get_outputs(self):
        return [self._Arg("y", [1, 256, 256, 1])]

    def run(self, names, feeds):
        m = feeds["x"].mean(axis=3, keepdims=True)
        return [(1 / (1 + np.exp(-40 * (m - 0.35)))).astype(np.float32)]


@pytest.fixture(scope="module")
def shared_ctx():
    import wgpu

    device = wgpu.gpu.request_adapter_sync().request_device_sync()
    return ml.create_context_sync(device)


@pytest.mark.parametrize("effect", ["blur", "replace"])
def test_shaders_match_numpy(shared_ctx, effect):
    ctx = shared_ctx
    W, H = SIZE
    graph, mi, mo = _standin_graph(ctx)
    src = DemoSource(W, H, frames=3)
    back = None
    if effect == "replace":
        yy, xx = np.mgrid[0:H, 0:W]
        back = np.stack([xx * 255 // W, yy * 255 // H, np.full_like(xx, 128)], -1).astype(np.uint8)
    gpu = GpuPipeline(ctx, graph, mi, mo, W, H, effect=effect, background=back, smoothing=0.5)
    cpu = CopyingPipeline(_NumpyStandin(), W, H, effect=effect, background=back, smoothing=0.5)
    before = ctx.counters
    for frame in src:
        gpu.process(frame)
        ref = cpu.process(frame)
    out = gpu.read_frame()
    after = ctx.counters
    assert out.shape == (H, W, 4)
    assert out.dtype == np.uint8
    diff = np.abs(out[..., :3].astype(int) - ref.astype(int))
    assert diff.max() <= 3, f"max diff {diff.max()} at {np.unravel_index(diff.argmax(), diff.shape)}"
    assert (out[..., 3] == 255).all()
    # the ML side never saw frame bytes and never gave any back
    for k in ("bytes_uploaded", "bytes_downloaded", "bytes_copied_between_devices"):
        assert after[k] == before[k], k
    t = gpu.traffic()
    assert t["imports"] == 6 and not t["ml_tensors_readable"]
    assert t["frame_bytes_uploaded"] == 3 * W * H * 3
    assert t["frame_bytes_read_back"] == W * H * 4
    gpu.close()
    graph.destroy()


def test_present_to_canvas(shared_ctx):
    """The window path draws the composited buffer with no readback: offscreen canvas here."""
    from rendercanvas.offscreen import RenderCanvas

    ctx = shared_ctx
    W, H = 128, 72
    graph, mi, mo = _standin_graph(ctx)
    gpu = GpuPipeline(ctx, graph, mi, mo, W, H)
    gpu.process(DemoSource(W, H).frame(0))
    canvas = RenderCanvas(size=(W, H), pixel_ratio=1)
    context = canvas.get_wgpu_context()
    context.configure(device=ctx.device, format=context.get_preferred_format(ctx.device.adapter))
    canvas.request_draw(lambda: gpu.present(context))
    shown = np.asarray(canvas.draw())
    out = gpu.read_frame()
    assert shown.shape[:2] == (H, W)
    assert np.abs(shown[..., :3].astype(int) - out[..., :3].astype(int)).max() <= 2
    gpu.close()
    graph.destroy()


def test_demo_source_moves():
    src = DemoSource(*SIZE, frames=30)
    a, b = src.frame(0), src.frame(15)
    assert a.shape == (SIZE[1], SIZE[0], 3) and a.dtype == np.uint8
    assert src.layout(0) != src.layout(15)  # camera motion
    (x0, y0), (x1, y1) = src.background_points(0)[0], src.background_points(15)[0]
    assert not np.array_equal(a[y0, x0], b[y1, x1])  # changing background


def test_run_headless_defaults_to_mp4(tmp_path, monkeypatch):
    """No display and no --output: the run writes selfie_segmentation.mp4 instead of opening a
    window (rendercanvas.auto would abort the process with glfw and no display)."""
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setattr(app, "has_display", lambda: False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(app, "load_model", lambda ctx, model=None: (*_standin_graph(ctx), "standin"))
    s = app.run(["--frames", "2", "--size", "128x72", "--quiet"])
    assert s["frames"] == 2 and s["output"] == "selfie_segmentation.mp4"
    assert (tmp_path / "selfie_segmentation.mp4").stat().st_size > 0


def test_video_file_source(tmp_path):
    """A video file source (PyAV) yields the frames that were written, at their size."""
    W, H = 96, 64
    demo = DemoSource(W, H, frames=3)
    w = Mp4Writer(str(tmp_path / "in.mp4"), W, H, fps=30)
    for f in demo:
        w.write(f)
    w.close()
    src = open_source(str(tmp_path / "in.mp4"))
    frames = list(src)
    src.close()
    assert (src.width, src.height) == (W, H)
    assert len(frames) == 3 and frames[0].shape == (H, W, 3) and frames[0].dtype == np.uint8
    # lossy H.264 (yuv420p halves the chroma of a busy 96x64 pattern): compare grey levels
    assert abs(frames[0].mean() - demo.frame(0).mean()) < 3


# -- the real model --------------------------------------------------------------------------------


def _model_or_skip():
    try:
        path = mltensor.models.fetch("selfie_segmentation")
        c = ml.create_context_sync()
        g, _, _, _ = load_model(c, path)
        g.destroy()
        c.destroy()
    except (ImportError, AttributeError, mltensor.NotSupportedError, RuntimeError, OSError) as e:
        pytest.skip(f"selfie segmentation model not available here: {type(e).__name__}: {e}")
    return path


@pytest.fixture(scope="module")
def model_path():
    return _model_or_skip()


def test_example_headless(tmp_path, model_path):
    import av

    W, H = SIZE
    mp4, png = tmp_path / "out.mp4", tmp_path / "out.png"
    s = app.run(
        [
            "--frames",
            "3",
            "--size",
            f"{W}x{H}",
            "--output",
            str(mp4),
            "--snapshot",
            str(png),
            "--model",
            model_path,
            "--quiet",
        ]
    )
    assert s["frames"] == 3
    src = s["source"]
    out = s["last_frame"]
    frame = src.frame(2)
    assert out.shape == (H, W, 4)
    # the person keeps its pixels exactly (mask saturates to 1 there) ...
    for x, y in src.person_points(2):
        assert np.abs(out[y, x, :3].astype(int) - frame[y, x].astype(int)).max() <= 1, (x, y)
    # ... the background is blurred: its pixels change
    changed = [np.abs(out[y, x, :3].astype(int) - frame[y, x].astype(int)).max() for x, y in src.background_points(2)]
    assert max(changed) > 20 and np.mean(changed) > 8, changed
    # no ML tensor went back to the host; frames never went through write_tensor
    t = s["traffic"]
    assert t["ml"]["bytes_downloaded"] == 0
    assert t["ml"]["bytes_copied_between_devices"] == 0
    assert t["ml"]["bytes_uploaded"] == 0
    assert not t["ml_tensors_readable"]
    assert t["imports"] == 2 * 3
    assert t["frame_bytes_read_back"] == 3 * W * H * 4  # the encoded frames, nothing else
    # the outputs
    assert os.path.getsize(png) > 0
    with av.open(str(mp4)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == 3 and frames[0].shape == (H, W, 3)


def test_example_replace(tmp_path, model_path):
    from PIL import Image

    W, H = SIZE
    bg = np.zeros((H, W, 3), np.uint8)
    bg[..., 2] = 200
    bg[:, : W // 2, 0] = 90
    Image.fromarray(bg).save(tmp_path / "bg.png")
    s = app.run(
        [
            "--frames",
            "2",
            "--size",
            f"{W}x{H}",
            "--output",
            str(tmp_path / "r.mp4"),
            "--effect",
            "replace",
            "--background",
            str(tmp_path / "bg.png"),
            "--model",
            model_path,
            "--quiet",
        ]
    )
    out, src = s["last_frame"], s["source"]
    for x, y in src.background_points(1):
        assert np.abs(out[y, x, :3].astype(int) - bg[y, x].astype(int)).max() <= 1, (x, y)
    frame = src.frame(1)
    for x, y in src.person_points(1):
        assert np.abs(out[y, x, :3].astype(int) - frame[y, x].astype(int)).max() <= 1, (x, y)
