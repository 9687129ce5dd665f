"""Real-time video segmentation (MediaPipe selfie segmentation), all on the GPU.

One wgpu.GPUDevice does everything; the ML context is created on it, so its tensors can be lent
to the device's own WGSL work without copies. Per frame:

1. upload      the frame's rgb24 bytes, once, with queue.write_buffer (no host-side repacking);
2. preprocess  import the model's input tensor, a compute pass resizes (bilinear) and normalizes
               the frame into it (256x256x3 float32 in [0, 1], NHWC), release;
3. inference   ctx.dispatch of the selfie segmentation graph;
4. composite   import the mask tensor, a pass folds it into an exponential moving average kept in
               a GPU buffer (temporal smoothing), release; the full-resolution composite keeps the
               person and blurs the background (box downsample + separable Gaussian, upsampled
               bilinearly) or replaces it with an image;
5. present     draw the result in a window (rendercanvas), or read it back once and encode it to
               H.264 with PyAV: the only readback of the whole pipeline.

The ML context's counters prove it: no ML tensor is ever read by the host (the input and mask
tensors are not even readable), nothing is copied between devices, and the frames never pass
through write_tensor.

`CopyingPipeline` does the same work the usual way (numpy frame -> InferenceSession with numpy in
and out -> composite with numpy); the benchmark compares the two.

This module is the command line (`run`, `main`); the parts live beside it: video_frames.py (the
sources and the .mp4/.png outputs), video_gpu.py (`GpuPipeline`, the Python side of
shaders/video_*.wgsl, and `load_model`), video_copy.py (`CopyingPipeline`), video_composite.py
(the blur and mask parameters both pipelines share).

Run: `mltensor-selfie --frames 30 --output out.mp4 --snapshot out.png` (or
`python examples/selfie_segmentation.py ...`); `--help` lists the options. Needs the examples extra
(`pip install 'mltensor[examples]'`); without it, or with a missing or unreadable input, or no
adapter, the command prints one line on stderr and exits with status 2 (cli.py). stdout holds the
summary; the model's first download, its progress and the encoding's progress bar go to stderr.
"""

import argparse
import os
import sys
import time

import numpy as np

import mltensor  # its models, tflite and InferenceSession load on first use (mltensor/__init__.py)

from ..errors import DOMException
from .cli import (
    AppError,
    check_adapter,
    create_context,
    existing_file,
    fetched,
    one_line,
    readable_image,
    require_extra,
    run_entry,
    writable_output,
)
from .video_copy import CopyingPipeline
from .video_frames import Mp4Writer, open_source, save_png
from .video_gpu import GpuPipeline, load_model

PROG = "mltensor-selfie"


def has_display():
    """True when a window can be opened (with glfw installed and no display, rendercanvas.auto
    would abort the process)."""
    if sys.platform in ("win32", "darwin"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


# -- driver ----------------------------------------------------------------------------------------


def _parse_size(s):
    try:
        w, h = (int(v) for v in s.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size must look like 640x360, got {s!r}") from None
    if w < 16 or h < 16:
        raise argparse.ArgumentTypeError(f"--size must be at least 16x16, got {s!r}")
    return w - w % 2, h - h % 2


def build_parser():
    p = argparse.ArgumentParser(
        prog="mltensor-selfie",
        description="Real-time selfie segmentation (background blur or replacement), all on the GPU.",
    )
    p.add_argument(
        "--source", default="demo", help="'demo' (built-in synthetic scene, default), 'webcam', or a video file path"
    )
    p.add_argument("--size", type=_parse_size, default=(640, 360), help="WxH of the demo source (default 640x360)")
    p.add_argument("--frames", type=int, default=None, help="stop after N frames")
    p.add_argument(
        "--output",
        default=None,
        help="write H.264 to this .mp4 instead of opening a window (default without a display: "
        "selfie_segmentation.mp4)",
    )
    p.add_argument("--snapshot", default=None, help="also write the last composited frame as PNG")
    p.add_argument("--effect", choices=("blur", "replace"), default="blur")
    p.add_argument("--background", default=None, help="background image for --effect replace")
    p.add_argument("--blur", type=float, default=None, help="blur sigma in frame pixels (default height/30)")
    p.add_argument(
        "--smoothing", type=float, default=0.5, help="temporal smoothing of the mask, 0 (none) .. <1 (default 0.5)"
    )
    p.add_argument("--model", default=None, help="a selfie segmentation .tflite (default: fetched once)")
    p.add_argument(
        "--pipeline",
        choices=("gpu", "copy"),
        default="gpu",
        help="'gpu' (default) or 'copy': numpy + InferenceSession + numpy composite, for comparison",
    )
    p.add_argument(
        "--no-stage-sync",
        dest="stage_sync",
        action="store_false",
        help="do not fence between stages (stage times become enqueue times)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar and no summary")
    return p


def run(args=None, *, device=None, log=print):
    """Run the example; `args` is a list of command-line arguments or a parsed namespace. Returns a
    summary dict (frames, fps, per-stage ms, traffic, paths, and `last_frame`/`source` for tests)."""
    if args is None or isinstance(args, (list, tuple)):
        args = build_parser().parse_args(args)
    if not args.quiet:
        log = log or print
    else:
        log = lambda *a, **k: None  # noqa: E731
    window = args.output is None and has_display()
    # the extra first: every module this run imports (the window's toolkit only for a window)
    demo = args.source == "demo"
    modules = ["PIL"] + (["matplotlib"] if demo else []) + (["av"] if not (window and demo) else [])
    require_extra("examples", modules + (["rendercanvas", "glfw"] if window else []))
    if args.effect == "replace" and not args.background:
        raise AppError("--effect replace needs --background IMAGE")
    if not 0 <= args.smoothing < 1:
        raise AppError(f"--smoothing must be in [0, 1), got {args.smoothing}")
    if args.frames is not None and args.frames < 1:
        raise AppError(f"--frames must be at least 1, got {args.frames}")
    if args.model is not None:
        existing_file(args.model, "--model")
    if args.background is not None:
        readable_image(args.background, "--background")
    if not demo and args.source != "webcam":
        existing_file(args.source, "--source")
    if not has_display():
        os.environ.setdefault("RENDERCANVAS_FORCE_OFFSCREEN", "1")
    output = args.output
    if output is None and not window:
        output = "selfie_segmentation.mp4"
    if output is not None:
        writable_output(output, "--output")
    if args.snapshot is not None:
        writable_output(args.snapshot, "--snapshot")

    import wgpu

    t_setup = time.perf_counter()
    try:
        source = open_source(args.source, args.size, args.frames)
    except Exception as e:  # PyAV's errors for what it cannot open or decode
        if demo:
            raise
        raise AppError(f"--source: cannot read {args.source} as a video ({one_line(e)})") from None
    W, H = source.width, source.height
    if device is None:
        adapter = check_adapter(wgpu.gpu.request_adapter_sync(power_preference="high-performance"))
        features = [f for f in ("shader-f16", "subgroup") if f in adapter.features]
        lim = adapter.limits
        limits = {
            k: lim[k]
            for k in (
                "max-buffer-size",
                "max-storage-buffer-binding-size",
                "max-compute-workgroup-storage-size",
                "max-compute-invocations-per-workgroup",
                "max-storage-buffers-per-shader-stage",
            )
            if k in lim
        }
        device = adapter.request_device_sync(label="selfie", required_features=features, required_limits=limits)
    ctx = create_context(device)
    adapter_info = device.adapter.info
    n_total = args.frames if args.frames is not None else (len(source) or None)

    model = args.model or fetched(mltensor.models.fetch, "selfie_segmentation")
    if args.pipeline == "gpu":
        try:
            graph, model_in, model_out, model_path = load_model(ctx, model)
        except (OSError, ValueError, DOMException) as e:
            raise AppError(f"cannot use the model {model}: {one_line(e)}") from None
        pipe = GpuPipeline(
            ctx,
            graph,
            model_in,
            model_out,
            W,
            H,
            effect=args.effect,
            background=args.background,
            smoothing=args.smoothing,
            blur_sigma=args.blur,
            stage_sync=args.stage_sync,
        )
    else:
        model_path = model
        try:
            sess = mltensor.InferenceSession(model_path, context=ctx)
        except (OSError, ValueError, DOMException) as e:
            raise AppError(f"cannot use the model {model}: {one_line(e)}") from None
        pipe = CopyingPipeline(
            sess, W, H, effect=args.effect, background=args.background, smoothing=args.smoothing, blur_sigma=args.blur
        )
        model_in = (pipe.in_name, tuple(int(d) for d in sess.get_inputs()[0].shape))
        model_out = (sess.get_outputs()[0].name, tuple(int(d) for d in sess.get_outputs()[0].shape))
        counters0 = ctx.counters
    setup_s = time.perf_counter() - t_setup

    last = np.empty((H, W, 4), np.uint8) if args.pipeline == "gpu" else None
    frame_times, present_times, readback_times, source_times = [], [], [], []
    snapshot_frame = None
    writer = None
    n = 0
    frames = iter(source)
    if n_total is not None:
        frames = (f for _, f in zip(range(n_total), frames))

    if window:
        present_label = "present"
        _run_window(args, pipe, frames, frame_times, present_times)
        n = len(frame_times)
        if args.snapshot and n and args.pipeline == "gpu":
            snapshot_frame = pipe.read_frame(last)
    else:
        present_label = "encode"
        writer = Mp4Writer(output, W, H, fps=getattr(source, "fps", 30))
        bar = None
        if not args.quiet:
            from tqdm import tqdm

            bar = tqdm(
                total=n_total,
                unit="frame",
                desc=f"encoding {os.path.basename(output)}",
                file=sys.stderr,
                dynamic_ncols=True,
            )
        try:
            while True:
                ts = time.perf_counter()
                frame = next(frames, None)
                if frame is None:
                    break
                t0 = time.perf_counter()
                source_times.append(t0 - ts)
                if args.pipeline == "gpu":
                    pipe.process(frame)
                    t1 = time.perf_counter()
                    pipe.read_frame(last)
                else:
                    last = pipe.process(frame)
                    t1 = time.perf_counter()
                t2 = time.perf_counter()
                writer.write(last)
                t3 = time.perf_counter()
                frame_times.append(t3 - t0)
                readback_times.append(t2 - t1)
                present_times.append(t3 - t2)
                n += 1
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            writer.close()
            source.close()
        snapshot_frame = last
    if args.snapshot and snapshot_frame is not None:
        save_png(args.snapshot, snapshot_frame)

    # -- summary
    steady = frame_times[1:] if len(frame_times) > 2 else frame_times
    fps = len(steady) / sum(steady) if steady and sum(steady) > 0 else 0.0

    def ms(v):
        return 1e3 * float(np.mean(v[1:] if len(v) > 2 else v))

    stages = {k: ms(v) for k, v in pipe.times.items() if v}
    if readback_times and args.pipeline == "gpu":
        stages["readback"] = ms(readback_times)
    if present_times:
        stages[present_label] = ms(present_times)
    if args.pipeline == "gpu":
        traffic = pipe.traffic()
    else:
        now = ctx.counters
        traffic = {
            "ml": {
                k: now[k] - counters0[k]
                for k in (
                    "bytes_uploaded",
                    "bytes_downloaded",
                    "bytes_copied_between_devices",
                    "submits",
                    "kernel_launches",
                )
            }
        }
    summary = {
        "pipeline": args.pipeline,
        "frames": n,
        "size": (W, H),
        "source": source,
        "model_input": model_in,
        "model_output": model_out,
        "model_path": model_path,
        "fps": fps,
        "ms_per_frame": 1e3 / fps if fps else float("nan"),
        "first_frame_ms": 1e3 * frame_times[0] if frame_times else float("nan"),
        "setup_s": setup_s,
        "stages_ms": stages,
        "source_ms": ms(source_times) if source_times else None,
        "stage_sync": getattr(args, "stage_sync", True),
        "traffic": traffic,
        "output": None if window else output,
        "snapshot": args.snapshot,
        "adapter": f"{adapter_info.get('device', '?')} ({adapter_info.get('backend_type', '?')}, "
        f"{adapter_info.get('adapter_type', '?')})",
        "last_frame": last,
    }
    for line in format_summary(summary):
        log(line)
    if args.pipeline == "gpu":
        pipe.close()
        graph.destroy()
    return summary


def _run_window(args, pipe, frames, frame_times, present_times):
    from rendercanvas.auto import RenderCanvas, loop

    W, H = pipe.width, pipe.height
    canvas = RenderCanvas(size=(W, H), title="mltensor selfie segmentation", update_mode="continuous", max_fps=240)
    gpu = args.pipeline == "gpu"
    if gpu:
        context = canvas.get_wgpu_context()
        context.configure(device=pipe.device, format=context.get_preferred_format(pipe.device.adapter))
    else:  # the copying way shows its numpy frame through rendercanvas' bitmap upload
        context = canvas.get_bitmap_context()
    state = {"done": False}

    def draw():
        if state["done"]:
            return
        try:
            frame = next(frames)
        except StopIteration:
            state["done"] = True
            canvas.close()
            return
        t0 = time.perf_counter()
        if gpu:
            pipe.process(frame)
            t1 = time.perf_counter()
            pipe.present(context)
        else:
            out = pipe.process(frame)
            t1 = time.perf_counter()
            context.set_bitmap(np.concatenate([out, np.full((H, W, 1), 255, np.uint8)], -1))
        t2 = time.perf_counter()
        frame_times.append(t2 - t0)
        present_times.append(t2 - t1)

    canvas.request_draw(draw)
    loop.run()


def format_summary(s):
    W, H = s["size"]
    (_, ishape), (_, oshape) = s["model_input"], s["model_output"]
    yield (
        f"selfie segmentation [{s['pipeline']}]: {s['frames']} frames {W}x{H} from "
        f"{getattr(s['source'], 'name', '?')} on {s['adapter']}"
    )
    yield f"  model {os.path.basename(str(s['model_path']))}: {list(ishape)} -> {list(oshape)}"
    yield (
        f"  {s['fps']:.2f} FPS end to end ({s['ms_per_frame']:.1f} ms/frame; first frame "
        f"{s['first_frame_ms']:.0f} ms; setup {s['setup_s']:.1f} s)"
    )
    how = "GPU time, fenced per stage" if s["stage_sync"] else "enqueue time, unfenced"
    if s["pipeline"] == "copy":
        how = "wall time"
    yield "  per stage (ms/frame, " + how + "): " + ", ".join(f"{k} {v:.2f}" for k, v in s["stages_ms"].items())
    if s.get("source_ms") is not None:
        yield f"  (frame source: {s['source_ms']:.2f} ms/frame on the CPU, not counted in the FPS)"
    t = s["traffic"]
    ml = t["ml"]
    yield (
        f"  ML context counters over the run: bytes_uploaded {ml['bytes_uploaded']}, "
        f"bytes_downloaded {ml['bytes_downloaded']}, bytes_copied_between_devices "
        f"{ml['bytes_copied_between_devices']}, submits {ml['submits']}"
    )
    if s["pipeline"] == "gpu":
        n = max(s["frames"], 1)
        yield (
            f"  host -> GPU: {t['frame_bytes_uploaded']} B of frames ({t['frame_bytes_uploaded'] // n} B/frame, "
            f"queue.write_buffer, once each)"
        )
        yield (
            f"  GPU -> host: {t['frame_bytes_read_back']} B, composited frames for "
            f"{'encoding' if s['output'] else 'the snapshot'} only"
        )
        ok = (
            ml["bytes_downloaded"] == 0
            and ml["bytes_copied_between_devices"] == 0
            and ml["bytes_uploaded"] == 0
            and not t["ml_tensors_readable"]
        )
        yield (
            f"  zero-copy check: {'OK' if ok else 'FAILED'} - input and mask tensors not readable, "
            f"lent {t['imports']} times to the device, never read back or copied"
        )
    if s["output"]:
        yield f"  wrote {s['output']}" + (f" and {s['snapshot']}" if s["snapshot"] else "")
    elif s["snapshot"]:
        yield f"  wrote {s['snapshot']}"


def main(argv=None):
    """The console entry: returns the exit status (0; 1 when no frame was made; 2 for a failure
    the user can mend, as one line on stderr; argparse's usage errors exit with 2 too)."""
    args = build_parser().parse_args(argv)
    return run_entry(PROG, _main, args)


def _main(args):
    summary = run(args)
    return 0 if summary["frames"] else 1


if __name__ == "__main__":
    sys.exit(main())
