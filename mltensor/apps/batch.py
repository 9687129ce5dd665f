"""Batch segmentation on Ray Data: folders of images and videos, one InferenceSession per worker.

    mltensor-batch photos/ clips/*.mp4 --output out/                 # local Ray, this machine
    mltensor-batch s3-mounted/day1/ --output /shared/out --address auto   # join a Ray cluster

Ray Data streams the list of input files through a pool of actors (`map_batches` with a
class-based worker, one file per call). Each actor holds one mltensor context and one
InferenceSession for its whole life, so the model is imported, compiled and its tensors
allocated once per worker, not per file; with GPUs, each actor asks Ray for one (`num_gpus=1`)
and its context runs there, without GPUs the actors run on CPUs (lavapipe). Files, not frames,
are the unit of work: a video streams frame by frame from disk inside its actor (its frames
depend on each other through the mask's temporal smoothing), and no decoded frame crosses Ray's
object store. On a cluster, inputs and the output folder must be on storage every node sees.

Per input `a/b.jpg` (relative to the folder or glob it came from) the outputs are
`OUT/a/b.png` (composited: the person kept, the background blurred or replaced) and
`OUT/a/b_mask.png` (the person probability, 8-bit); per video `c.mp4`, `OUT/c.mp4` and
`OUT/c_mask.mp4` (H.264). Unreadable or unsupported files are reported and skipped, never fatal.

The default model is MediaPipe's selfie segmentation; `--model` takes any .onnx or .tflite with
an rgb input (NHWC or NCHW) and a mask-like first output, with `--preprocess` / `--postprocess`
naming its input normalization and output decoding (see video_copy.PREPROCESS).

Needs the ray extra (`pip install 'mltensor[ray]'`: Ray Data, Pillow and PyAV). Without it, with a
missing model or background file, no image or video among the inputs, or (on a local Ray) no
adapter, the command prints one line on stderr and exits with status 2 (cli.py). stdout holds the
summary.
"""

import argparse
import glob
import os
import sys
import time

import numpy as np

import mltensor  # its models and InferenceSession load on first use (mltensor/__init__.py)

from .cli import AppError, check_adapter, existing_file, one_line, readable_image, require_extra, run_entry
from .video_copy import POSTPROCESS, PREPROCESS, CopyingPipeline
from .video_frames import AVSource, Mp4Writer, save_png

IMAGE_EXT = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
VIDEO_EXT = (".mp4", ".mov", ".mkv", ".avi", ".webm", ".m4v", ".mpg", ".mpeg")
MIN_SIZE = 16  # smaller frames are rejected as input errors (the blur needs a few pixels)

PROG = "mltensor-batch"


def _kind(path):
    ext = os.path.splitext(path)[1].lower()
    return "image" if ext in IMAGE_EXT else "video" if ext in VIDEO_EXT else None


def expand_inputs(specs):
    """(files, rejected): files as dicts {path, rel, kind} from file paths, folders (recursive)
    and globs; `rel` is the path relative to the folder or the glob's fixed prefix (so outputs
    keep the inputs' names and folder structure). `rejected`: (spec or path, reason) for specs that
    match nothing and explicitly named files of an unknown type. Duplicates are dropped."""
    files, rejected, seen = [], [], set()

    def add(path, root, explicit):
        path = os.path.abspath(path)
        kind = _kind(path)
        if kind is None:
            if explicit:
                rejected.append((path, "not an image or video file extension"))
            return
        if path in seen:
            return
        seen.add(path)
        rel = os.path.relpath(path, root) if root else os.path.basename(path)
        files.append({"path": path, "rel": rel, "kind": kind})

    for spec in specs:
        if os.path.isdir(spec):
            for d, subdirs, names in os.walk(spec):
                subdirs.sort()
                for n in sorted(names):
                    add(os.path.join(d, n), spec, False)
        elif os.path.isfile(spec):
            add(spec, None, True)
        elif glob.has_magic(spec):
            matches = sorted(glob.glob(spec, recursive=True))
            root = spec[: min(spec.index(c) for c in "*?[" if c in spec)]
            root = root if root.endswith(os.sep) or not root else os.path.dirname(root)
            hits = [m for m in matches if os.path.isfile(m)]
            if not hits:
                rejected.append((spec, "the pattern matches no file"))
            for m in hits:
                add(m, root or None, False)
        else:
            rejected.append((spec, "no such file or folder"))
    return files, rejected


def output_paths(out_dir, rel, kind):
    """(composite path, mask path) of an input with relative name `rel`."""
    stem = os.path.splitext(rel)[0]
    ext = ".png" if kind == "image" else ".mp4"
    return os.path.join(out_dir, stem + ext), os.path.join(out_dir, stem + "_mask" + ext)


def read_image(path):
    """uint8 (H, W, 3) rgb of an image file; ValueError for what cannot be decoded or is too small."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"cannot decode the image: {e}") from None
    if rgb.shape[0] < MIN_SIZE or rgb.shape[1] < MIN_SIZE:
        raise ValueError(f"the image is {rgb.shape[1]}x{rgb.shape[0]}; at least {MIN_SIZE}x{MIN_SIZE} is needed")
    return rgb


class Segmenter:
    """The per-worker state: one context and one InferenceSession for any number of files.
    `process(item, out_dir)` segments one image or video into its two outputs and returns its
    row of the summary; it never raises for a bad input (the row says what went wrong)."""

    def __init__(
        self,
        model=None,
        *,
        preprocess="unit",
        postprocess="mask",
        effect="blur",
        background=None,
        smoothing=0.5,
        blur_sigma=None,
        lossless=False,
        context=None,
    ):
        if preprocess not in PREPROCESS or postprocess not in POSTPROCESS:
            raise ValueError(
                f"preprocess must be one of {', '.join(PREPROCESS)} and postprocess one of "
                f"{', '.join(POSTPROCESS)}, got {preprocess!r} / {postprocess!r}"
            )
        self.ctx = context or mltensor.ml.create_context_sync(power_preference="high-performance")
        self.session = mltensor.InferenceSession(
            model or mltensor.models.fetch("selfie_segmentation"), context=self.ctx
        )
        self.options = dict(
            effect=effect, background=background, blur_sigma=blur_sigma, preprocess=preprocess, postprocess=postprocess
        )
        self.smoothing = smoothing
        # x264 at crf 0 is lossless: decoded output frames are exactly what the pipeline made
        # (lossy encodes of the same frames differ run to run, so only lossless is reproducible)
        self.crf = 0 if lossless else 23
        self.adapter = self.ctx.device.adapter.info.get("device", "?")
        self.worker = f"{os.uname().nodename}:{os.getpid()}"

    def pipeline(self, width, height, smoothing=0.0):
        return CopyingPipeline(self.session, width, height, smoothing=smoothing, **self.options)

    def process(self, item, out_dir):
        row = {
            "path": item["path"],
            "kind": item["kind"],
            "status": "ok",
            "error": "",
            "frames": 0,
            "seconds": 0.0,
            "worker": self.worker,
            "adapter": self.adapter,
            "outputs": "",
        }
        t = time.perf_counter()
        try:
            outs = output_paths(out_dir, item["rel"], item["kind"])
            for p in outs:
                os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
            run = self._image if item["kind"] == "image" else self._video
            row["frames"] = run(item["path"], *outs)
            row["outputs"] = os.pathsep.join(outs)
        except Exception as e:  # a bad input is one failed row, never the batch's end
            row["status"], row["error"] = "failed", f"{type(e).__name__}: {e}"
        row["seconds"] = time.perf_counter() - t
        return row

    def _image(self, path, out_path, mask_path):
        rgb = read_image(path)
        pipe = self.pipeline(rgb.shape[1], rgb.shape[0])  # one picture: no temporal smoothing
        save_png(out_path, pipe.process(rgb))
        save_png(mask_path, mask_rgb(pipe.mask))
        return 1

    def _video(self, path, out_path, mask_path):
        try:
            src = AVSource(path)
        except Exception as e:
            raise ValueError(f"cannot open the video: {e}") from None
        writers = []
        n = 0
        try:
            if src.width < MIN_SIZE or src.height < MIN_SIZE:
                raise ValueError(f"the video is {src.width}x{src.height}; at least {MIN_SIZE}x{MIN_SIZE} is needed")
            pipe = self.pipeline(src.width, src.height, self.smoothing)
            writers = [Mp4Writer(p, src.width, src.height, fps=src.fps, crf=self.crf) for p in (out_path, mask_path)]
            for frame in src:
                writers[0].write(pipe.process(frame))
                writers[1].write(mask_rgb(pipe.mask))
                n += 1
        finally:
            for w in writers:
                w.close()
            src.close()
        if n == 0:
            raise ValueError("the video has no decodable frame")
        return n


def mask_rgb(mask):
    """A [0, 1] probability map as 8-bit gray rgb (H, W, 3)."""
    g = (np.clip(mask, 0, 1) * 255 + 0.5).astype(np.uint8)
    return np.repeat(g[..., None], 3, axis=2)


def context_for_ray_gpu(label="mltensor-batch"):
    """An ML context on the GPU Ray assigned to this actor, or None to let mltensor choose (also
    used by mltensor serve's Ray deployment, mltensor/serve/ray.py). Ray
    hides other GPUs from CUDA (CUDA_VISIBLE_DEVICES), which Vulkan ignores, so with several
    GPUs every actor would take the same default adapter: pick the assigned one by its index
    among the hardware adapters instead."""
    import ray

    ids = ray.get_gpu_ids()
    if not ids:
        return None
    import wgpu

    hw = [
        a
        for a in wgpu.gpu.enumerate_adapters_sync()
        if a.info.get("adapter_type") in ("DiscreteGPU", "IntegratedGPU") and a.info.get("backend_type") != "OpenGL"
    ]
    if len(hw) < 2:
        return None
    adapter = hw[int(ids[0]) % len(hw)]
    features = [f for f in ("shader-f16", "subgroup", "timestamp-query", "shader-int64") if f in adapter.features]
    limits = {
        k: adapter.limits[k]
        for k in (
            "max-buffer-size",
            "max-storage-buffer-binding-size",
            "max-compute-workgroup-storage-size",
            "max-compute-invocations-per-workgroup",
            "max-storage-buffers-per-shader-stage",
        )
        if k in adapter.limits
    }
    device = adapter.request_device_sync(label=label, required_features=features, required_limits=limits)
    return mltensor.ml.create_context_sync(device)


class RayWorker:
    """The Ray Data actor: `map_batches` calls it with a batch of file rows (dict of arrays)."""

    def __init__(self, model, out_dir, options):
        self.out_dir = out_dir
        self.seg = Segmenter(model, context=context_for_ray_gpu(), **options)

    def __call__(self, batch):
        items = [dict(zip(batch, vals)) for vals in zip(*(batch[k] for k in batch))]
        rows = [self.seg.process({k: str(v) for k, v in it.items()}, self.out_dir) for it in items]
        return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}


def run_batch(
    inputs,
    out_dir,
    *,
    model=None,
    workers=None,
    address=None,
    preprocess="unit",
    postprocess="mask",
    effect="blur",
    background=None,
    smoothing=0.5,
    blur_sigma=None,
    lossless=False,
    ray_init=None,
):
    """Segment every image and video of `inputs` into `out_dir` on Ray Data; returns the summary
    dict (see format_summary). `workers`: actors (default: one per GPU Ray sees, else 1);
    `address`: a Ray cluster to join (default: start a local Ray with this machine's resources);
    `ray_init`: extra keyword arguments for ray.init."""
    require_extra("ray")  # AppError naming pip install 'mltensor[ray]'
    import ray
    import ray.data

    files, rejected = expand_inputs(inputs)
    os.makedirs(out_dir, exist_ok=True)
    out_dir = os.path.abspath(out_dir)
    if background is not None:
        background = os.path.abspath(background)
    # the model travels as bytes through the object store: workers on other nodes need no copy
    if model is not None:
        with open(model, "rb") as f:
            model = f.read()
    options = dict(
        preprocess=preprocess,
        postprocess=postprocess,
        effect=effect,
        background=background,
        smoothing=smoothing,
        blur_sigma=blur_sigma,
        lossless=lossless,
    )

    started_here = not ray.is_initialized()
    if started_here:
        kw = dict(ray_init or {})
        if address:
            kw["address"] = address
        kw.setdefault("log_to_driver", False)
        kw.setdefault("include_dashboard", False)
        ray.init(**kw)
    t0 = time.perf_counter()
    try:
        res = ray.cluster_resources()
        gpus, cpus = int(res.get("GPU", 0)), max(1, int(res.get("CPU", 1)))
        n = workers or max(1, gpus)
        # one GPU (or CPU) per actor; more actors than devices share them rather than waiting
        # forever for resources that do not exist
        per_actor = {"num_gpus": min(1.0, gpus / n)} if gpus else {"num_cpus": min(1.0, cpus / n)}
        rows = []
        if files:
            ds = ray.data.from_items(files, override_num_blocks=len(files))
            ds = ds.map_batches(
                RayWorker,
                batch_size=1,
                compute=ray.data.ActorPoolStrategy(size=n),
                fn_constructor_args=(model, out_dir, options),
                **per_actor,
            )
            rows = ds.take_all()
    finally:
        if started_here:
            ray.shutdown()
    wall = time.perf_counter() - t0
    rows += [
        {
            "path": p,
            "kind": _kind(p) or "?",
            "status": "failed",
            "error": why,
            "frames": 0,
            "seconds": 0.0,
            "worker": "",
            "adapter": "",
            "outputs": "",
        }
        for p, why in rejected
    ]
    return summarize(rows, wall, n_workers=n, resources=("GPU" if gpus else "CPU"))


def summarize(rows, wall, *, n_workers, resources):
    ok = [r for r in rows if r["status"] == "ok"]
    frames = sum(int(r["frames"]) for r in ok)
    per_worker = {}
    for r in ok:
        w = per_worker.setdefault(r["worker"], {"files": 0, "frames": 0, "seconds": 0.0, "adapter": r["adapter"]})
        w["files"] += 1
        w["frames"] += int(r["frames"])
        w["seconds"] += float(r["seconds"])
    for w in per_worker.values():
        w["frames_per_s"] = w["frames"] / w["seconds"] if w["seconds"] else 0.0
    return {
        "files": len(rows),
        "ok": len(ok),
        "failed": [(r["path"], r["error"]) for r in rows if r["status"] != "ok"],
        "frames": frames,
        "seconds": wall,
        "frames_per_s": frames / wall if wall else 0.0,
        "workers": n_workers,
        "resources": resources,
        "per_worker": per_worker,
        "rows": rows,
    }


def format_summary(s):
    lines = [
        f"{s['ok']} of {s['files']} files done, {s['frames']} frames in {s['seconds']:.1f} s "
        f"({s['frames_per_s']:.1f} frames/s) on {s['workers']} {s['resources']} worker(s)"
    ]
    for name, w in sorted(s["per_worker"].items()):
        lines.append(
            f"  {name} ({w['adapter']}): {w['files']} files, {w['frames']} frames, "
            f"{w['seconds']:.1f} s busy, {w['frames_per_s']:.1f} frames/s"
        )
    if s["failed"]:
        lines.append(f"skipped {len(s['failed'])}:")
        lines += [f"  {p}: {why}" for p, why in s["failed"]]
    return "\n".join(lines)


def build_parser():
    p = argparse.ArgumentParser(
        prog="mltensor-batch",
        description=__doc__.split("\n\n")[0],
        epilog="Outputs: OUT/<name>.png|.mp4 (composited) and OUT/<name>_mask.png|.mp4.",
    )
    p.add_argument("inputs", nargs="+", help="image/video files, folders (recursive) or globs")
    p.add_argument("-o", "--output", required=True, help="output folder")
    p.add_argument("--model", default=None, help="a .onnx or .tflite segmentation model (default: MediaPipe selfie)")
    p.add_argument(
        "--preprocess",
        choices=tuple(PREPROCESS),
        default="unit",
        help="the model's input normalization (default: unit, rgb in [0, 1])",
    )
    p.add_argument(
        "--postprocess",
        choices=POSTPROCESS,
        default="mask",
        help="how the first output becomes a person probability (default: mask)",
    )
    p.add_argument("--effect", choices=("blur", "replace"), default="blur")
    p.add_argument("--background", default=None, help="background image for --effect replace")
    p.add_argument("--blur", type=float, default=None, help="blur sigma in frame pixels (default height/30)")
    p.add_argument("--smoothing", type=float, default=0.5, help="temporal smoothing of video masks, 0 .. <1")
    p.add_argument("--lossless", action="store_true", help="lossless H.264 video outputs (reproducible, larger)")
    p.add_argument("--workers", type=int, default=None, help="actors (default: one per GPU Ray sees, else 1)")
    p.add_argument("--address", default=None, help="join this Ray cluster ('auto' or host:port) instead of a local Ray")
    return p


def main(argv=None):
    """The console entry: returns the exit status (0; 1 when every file failed; 2 for a failure
    the user can mend, as one line on stderr; argparse's usage errors exit with 2 too)."""
    args = build_parser().parse_args(argv)
    return run_entry(PROG, _main, args)


def _main(args):
    require_extra("ray")
    if args.effect == "replace" and not args.background:
        raise AppError("--effect replace needs --background IMAGE")
    if not 0 <= args.smoothing < 1:
        raise AppError(f"--smoothing must be in [0, 1), got {args.smoothing}")
    if args.workers is not None and args.workers < 1:
        raise AppError(f"--workers must be at least 1, got {args.workers}")
    if args.model is not None:
        existing_file(args.model, "--model")
    if args.background is not None:
        readable_image(args.background, "--background")
    files, rejected = expand_inputs(args.inputs)
    if not files:
        why = "; ".join(f"{p}: {reason}" for p, reason in rejected[:3]) + ("; ..." if len(rejected) > 3 else "")
        raise AppError(f"no image or video file among the inputs ({why})")
    try:
        os.makedirs(args.output, exist_ok=True)
    except OSError as e:
        raise AppError(f"--output: cannot create the folder {args.output} ({one_line(e)})") from None
    if args.address is None:  # a local Ray: its workers take this machine's adapter
        import wgpu

        check_adapter(wgpu.gpu.request_adapter_sync(power_preference="high-performance"))
    s = run_batch(
        args.inputs,
        args.output,
        model=args.model,
        workers=args.workers,
        address=args.address,
        preprocess=args.preprocess,
        postprocess=args.postprocess,
        effect=args.effect,
        background=args.background,
        smoothing=args.smoothing,
        blur_sigma=args.blur,
        lossless=args.lossless,
    )
    print(format_summary(s))
    return 0 if s["ok"] or not s["files"] else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
