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

Run: `mltensor-selfie --frames 30 --output out.mp4 --snapshot out.png` (or
`python examples/selfie_segmentation.py ...`); `--help` lists the options.
"""

import argparse
import math
import os
import sys
import time

import numpy as np

STAGES_GPU = ("upload", "preprocess", "inference", "composite")
DEMO_FRAMES = 150  # 5 s at 30 fps of synthetic camera motion when --frames is not given


def has_display():
    """True when a window can be opened (with glfw installed and no display, rendercanvas.auto
    would abort the process)."""
    if sys.platform in ("win32", "darwin"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


# -- sources ---------------------------------------------------------------------------------------


def _grace_hopper():
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        return Image.open(f).convert("RGB")


def _silhouette(size):
    """A soft alpha that cuts Grace Hopper (512x600 photo) out of her studio backdrop: head and hat
    as an ellipse, neck and shoulders as a polygon. Coordinates are those of the photo."""
    from PIL import Image, ImageDraw, ImageFilter

    a = Image.new("L", (512, 600), 0)
    d = ImageDraw.Draw(a)
    d.ellipse((148, 12, 380, 345), fill=255)
    d.polygon(
        [(210, 320), (320, 320), (350, 370), (460, 390), (512, 450), (512, 600), (0, 600),
         (0, 460), (70, 390), (190, 370)],
        fill=255,
    )
    a = a.filter(ImageFilter.GaussianBlur(4))
    return a.resize(size, Image.BILINEAR)


class DemoSource:
    """The built-in source: the matplotlib sample portrait (grace_hopper.jpg) in front of a moving,
    colour-changing synthetic background, with a few seconds of synthetic camera motion (pan, bob,
    parallax). Generated on the CPU with numpy so it runs anywhere; frames are uint8 (H, W, 3)."""

    name = "demo"

    def __init__(self, width=640, height=360, frames=DEMO_FRAMES, fps=30):
        from PIL import Image

        if width < 16 or height < 16:
            raise ValueError(f"--size must be at least 16x16, got {width}x{height}")
        self.width, self.height, self.frames, self.fps = width, height, frames, fps
        # Portrait: 88% of the frame height, standing on the bottom edge.
        ph = max(8, int(round(height * 0.88)))
        pw = max(8, int(round(ph * 512 / 600)))
        self.pw, self.ph = pw, ph
        self._fg = np.asarray(_grace_hopper().resize((pw, ph), Image.LANCZOS), dtype=np.float32)
        self._alpha = np.asarray(_silhouette((pw, ph)), dtype=np.float32)[..., None] / 255.0
        # Background world: wider and taller than the frame so the camera can pan over it.
        self._mx, self._my = width // 3 + 2, height // 8 + 2
        bw, bh = width + 2 * self._mx, height + 2 * self._my
        y, x = np.mgrid[0:bh, 0:bw].astype(np.float32)
        cell = max(4, height // 12)
        checker = ((x // cell + y // cell) % 2).astype(np.float32)
        stripes = 0.5 + 0.5 * np.sin((x + 0.6 * y) * (2 * np.pi / (cell * 1.7)))
        rings = 0.5 + 0.5 * np.cos(np.hypot(x - bw * 0.3, y - bh * 0.6) * (2 * np.pi / (cell * 2.3)))
        bg = np.stack([0.25 + 0.6 * checker * stripes, 0.2 + 0.7 * rings * (1 - 0.5 * checker),
                       0.3 + 0.5 * stripes * rings], -1)
        self._bg = np.clip(bg * 255, 0, 255).astype(np.uint8)

    def __len__(self):
        return self.frames

    def layout(self, i):
        """Camera motion at frame i: background crop origin and portrait top-left in the frame."""
        t = i / self.fps
        bx = int(round(self._mx * (1 + 0.9 * math.sin(2 * math.pi * t / 4.0))))
        by = int(round(self._my * (1 + 0.8 * math.sin(2 * math.pi * t / 2.5))))
        px = int(round((self.width - self.pw) / 2 + self.width * 0.14 * math.sin(2 * math.pi * t / 4.0 + 0.5)))
        py = int(round(self.height - self.ph + self.height * 0.04 * (1 + math.sin(2 * math.pi * t / 1.7))))
        return bx, by, px, py

    def person_points(self, i):
        """Frame coordinates (x, y) surely inside the person at frame i: forehead, cheek, chest."""
        _, _, px, py = self.layout(i)
        pts = [(0.52, 0.24), (0.42, 0.36), (0.5, 0.72)]
        return [(px + int(fx * self.pw), py + int(fy * self.ph)) for fx, fy in pts]

    def background_points(self, i):
        """Frame coordinates surely in the synthetic background at frame i (the corners)."""
        w, h = self.width, self.height
        return [(2, 2), (w - 3, 2), (2, h // 3), (w - 3, h // 3)]

    def frame(self, i):
        w, h = self.width, self.height
        bx, by, px, py = self.layout(i)
        t = i / self.fps
        # Colour drift of the background: a per-channel gain table (cheap on uint8).
        gains = 0.75 + 0.25 * np.sin(2 * math.pi * (t / 3.0 + np.array([0.0, 1 / 3, 2 / 3])))
        lut = np.clip(np.arange(256)[:, None] * gains[None, :], 0, 255).astype(np.uint8)
        out = np.empty((h, w, 3), np.uint8)
        crop = self._bg[by:by + h, bx:bx + w]
        for c in range(3):
            out[..., c] = lut[crop[..., c], c]
        # Paste the portrait (clipped to the frame) with its soft alpha.
        x0, y0 = max(px, 0), max(py, 0)
        x1, y1 = min(px + self.pw, w), min(py + self.ph, h)
        if x1 > x0 and y1 > y0:
            fg = self._fg[y0 - py:y1 - py, x0 - px:x1 - px]
            a = self._alpha[y0 - py:y1 - py, x0 - px:x1 - px]
            region = out[y0:y1, x0:x1].astype(np.float32)
            out[y0:y1, x0:x1] = (fg * a + region * (1 - a) + 0.5).astype(np.uint8)
        return out

    def __iter__(self):
        i = 0
        while self.frames is None or i < self.frames:
            yield self.frame(i)
            i += 1

    def close(self):
        pass


class AVSource:
    """Frames of a video file or of the first webcam, decoded by PyAV as uint8 (H, W, 3); odd
    sizes are cropped to even ones (H.264 in yuv420p needs them)."""

    def __init__(self, source):
        import av

        if source == "webcam":
            if sys.platform.startswith("linux"):
                self.container = av.open("/dev/video0", format="v4l2")
            elif sys.platform == "darwin":
                self.container = av.open("0", format="avfoundation", options={"framerate": "30"})
            elif sys.platform == "win32":
                self.container = av.open("video=0", format="dshow")
            else:  # pragma: no cover
                raise RuntimeError(f"no webcam support on {sys.platform}")
            self.name = "webcam"
        else:
            if not os.path.exists(source):
                raise FileNotFoundError(f"--source: no such video file: {source}")
            self.container = av.open(source)
            self.name = os.path.basename(source)
        self.stream = self.container.streams.video[0]
        self.stream.thread_type = "AUTO"
        cc = self.stream.codec_context
        self.width, self.height = cc.width - cc.width % 2, cc.height - cc.height % 2
        rate = self.stream.average_rate or self.stream.guessed_rate
        self.fps = float(rate) if rate else 30.0
        self.frames = self.stream.frames or None

    def __len__(self):
        return self.frames or 0

    def __iter__(self):
        w, h = self.width, self.height
        for f in self.container.decode(self.stream):
            a = f.to_ndarray(format="rgb24")
            if a.shape[0] != h or a.shape[1] != w:
                a = np.ascontiguousarray(a[:h, :w])
            yield a

    def close(self):
        self.container.close()


def open_source(source, size=(640, 360), frames=None):
    if source == "demo":
        return DemoSource(size[0], size[1], frames=frames or DEMO_FRAMES)
    return AVSource(source)


# -- model -----------------------------------------------------------------------------------------


def load_model(ctx, model=None):
    """(graph, (input name, shape), (output name, shape)) of the selfie segmentation model, built
    on `ctx`. `model`: a .tflite path, or None for mltensor.models.fetch("selfie_segmentation")."""
    import mltensor

    path = model or mltensor.models.fetch("selfie_segmentation")
    graph, inputs, outputs = mltensor.tflite.import_model(path, ctx)
    (iname, itype, ishape), (oname, otype, oshape) = inputs[0], outputs[0]
    if itype != "float32" or len(ishape) != 4 or ishape[-1] != 3:
        raise ValueError(f"expected a float32 NHWC RGB model input, got {itype} {list(ishape)}")
    if otype != "float32" or len(oshape) != 4:
        raise ValueError(f"expected a float32 NHWC mask output, got {otype} {list(oshape)}")
    return graph, (iname, tuple(ishape)), (oname, tuple(oshape)), path


# -- shared parameters -----------------------------------------------------------------------------


def blur_params(width, height, sigma=None):
    """Downsample factor F, small size (SW, SH), Gaussian radius R and weights for a background
    blur of `sigma` frame pixels (default: height / 30)."""
    sigma = float(sigma) if sigma else height / 30.0
    f = max(1, int(sigma // 3))
    s = max(sigma / f, 0.5)
    r = max(1, int(math.ceil(3 * s)))
    k = np.arange(-r, r + 1, dtype=np.float64)
    w = np.exp(-0.5 * (k / s) ** 2)
    w = (w / w.sum()).astype(np.float32)
    return f, -(-width // f), -(-height // f), r, w


MASK_LO, MASK_HI = 0.3, 0.7  # smoothstep of the mask: confident person / background become 1 / 0


def load_background(path, width, height):
    """A background image cover-resized to the frame: uint8 (H, W, 3)."""
    from PIL import Image

    im = Image.open(path).convert("RGB")
    s = max(width / im.width, height / im.height)
    im = im.resize((max(width, round(im.width * s)), max(height, round(im.height * s))), Image.BILINEAR)
    x0, y0 = (im.width - width) // 2, (im.height - height) // 2
    return np.asarray(im.crop((x0, y0, x0 + width, y0 + height)), dtype=np.uint8)


# -- the GPU pipeline ------------------------------------------------------------------------------


class GpuPipeline:
    """The whole per-frame pipeline on one wgpu device shared with the ML context.

    `process(frame)` uploads, preprocesses, runs the model and composites into `out_buffer`
    (W x H packed rgba8); `read_frame()` is the single readback, `present()` draws into a canvas.
    With `stage_sync` every stage ends with a GPU fence so `times` attributes GPU time to stages
    (a fence is an empty submit + map, no data); without it, stages only enqueue and the GPU
    overlaps them.
    """

    def __init__(self, ctx, graph, model_in, model_out, width, height, *, effect="blur",
                 background=None, smoothing=0.5, blur_sigma=None, stage_sync=True):
        import wgpu

        from ..runtime import wgsl

        self.ctx, self.graph = ctx, graph
        self.device = device = ctx.device
        self.queue = device.queue
        self.width, self.height = W, H = width, height
        self.effect = effect
        self.stage_sync = stage_sync
        (self.in_name, in_shape), (self.out_name, out_shape) = model_in, model_out
        _, MH, MW, _ = in_shape
        _, OH, OW, MC = out_shape
        self.model_size = (MW, MH)
        # ML tensors: importable, never readable or writable by the host.
        self.t_in = ctx.create_tensor_sync(data_type="float32", shape=in_shape, importable_to_webgpu=True)
        self.t_mask = ctx.create_tensor_sync(data_type="float32", shape=out_shape, importable_to_webgpu=True)
        self.imports = 0

        B = wgpu.BufferUsage
        self.frame_bytes = W * H * 3
        self.frame_buf = device.create_buffer(label="video-frame-rgb24", size=_pad4(self.frame_bytes),
                                              usage=B.STORAGE | B.COPY_DST)
        self.ema_buf = device.create_buffer(label="video-mask-ema", size=OH * OW * 4, usage=B.STORAGE)
        self.out_bytes = W * H * 4
        self.out_buffer = device.create_buffer(label="video-composite-rgba8", size=self.out_bytes,
                                               usage=B.STORAGE | B.COPY_SRC)
        self._readback = device.create_buffer(label="video-readback", size=self.out_bytes,
                                              usage=B.MAP_READ | B.COPY_DST)
        self._fence_buf = device.create_buffer(label="video-fence", size=4, usage=B.MAP_READ | B.COPY_DST)
        self.bytes_uploaded = 0  # frames (and a replacement background, once) by queue.write_buffer
        self.bytes_read_back = 0  # composited frames, for encoding / snapshot only

        env = wgsl.template_env()
        common = dict(W=W, H=H, MW=MW, MH=MH)

        def compute(template, entry, params, layout, label):
            src = env.get_template(template).render(**params)
            module = device.create_shader_module(label=label, code=src)
            return device.create_compute_pipeline(
                label=label, layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": entry})

        self._layouts = {}

        def layout(*kinds):
            key = kinds
            if key not in self._layouts:
                entries = []
                for i, k in enumerate(kinds):
                    t = {"r": wgpu.BufferBindingType.read_only_storage, "w": wgpu.BufferBindingType.storage}[k]
                    entries.append({"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": t}})
                self._layouts[key] = device.create_bind_group_layout(entries=entries)
            return self._layouts[key]

        # preprocess: frame -> imported model input
        self._pre_layout = layout("r", "w")
        self._pre = compute("video_preprocess.wgsl", "main", common, self._pre_layout,
                            f"video_preprocess_{W}x{H}_to_{MW}x{MH}")
        self._pre_groups = ((MW + 7) // 8, (MH + 7) // 8, 1)
        # mask EMA: imported mask -> ema (alpha 1 on the first frame)
        self._ema_layout = layout("r", "w")
        mp = dict(MH=OH, MW=OW, MC=MC)
        alpha = min(1.0, max(0.0, 1.0 - float(smoothing)))
        self._ema_first = compute("video_mask.wgsl", "main", dict(mp, ALPHA=_flit(1.0)),
                                  self._ema_layout, f"video_mask_ema_{OW}x{OH}_init")
        self._ema = compute("video_mask.wgsl", "main", dict(mp, ALPHA=_flit(alpha)),
                            self._ema_layout, f"video_mask_ema_{OW}x{OH}")
        self._ema_groups = (-(-OH * OW // 64), 1, 1)
        self._frames_done = 0
        # background: blur chain, or an uploaded image
        cp = dict(W=W, H=H, MW=OW, MH=OH, EFFECT=effect, LO=_flit(MASK_LO), HI=_flit(MASK_HI))
        if effect == "blur":
            F, SW, SH, R, weights = blur_params(W, H, blur_sigma)
            self.blur = dict(F=F, SW=SW, SH=SH, R=R)
            small = [device.create_buffer(label=f"video-blur-{i}", size=SW * SH * 16, usage=B.STORAGE)
                     for i in range(2)]
            bl = layout("r", "w", "w")
            bp = dict(W=W, H=H, F=F, SW=SW, SH=SH, R=R, SIGMA=f"{(blur_sigma or H / 30.0) / F:.2f}",
                      weights=", ".join(_flit(x) for x in weights))
            self._blur = [compute("video_blur.wgsl", e, bp, bl, f"video_blur_{e}_{SW}x{SH}_f{F}_r{R}")
                          for e in ("down", "blur_h", "blur_v")]
            self._blur_bg = device.create_bind_group(layout=bl, entries=[
                {"binding": 0, "resource": {"buffer": self.frame_buf}},
                {"binding": 1, "resource": {"buffer": small[0]}},
                {"binding": 2, "resource": {"buffer": small[1]}}])
            self._blur_groups = ((SW + 7) // 8, (SH + 7) // 8, 1)
            back = small[0]
            cp.update(F=F, SW=SW, SH=SH)
        elif effect == "replace":
            if background is None:
                raise ValueError("--effect replace needs --background IMAGE")
            img = background if isinstance(background, np.ndarray) else load_background(background, W, H)
            rgba = np.concatenate([img, np.full((H, W, 1), 255, np.uint8)], -1)
            back = device.create_buffer(label="video-background-rgba8", size=W * H * 4, usage=B.STORAGE | B.COPY_DST)
            self.queue.write_buffer(back, 0, np.ascontiguousarray(rgba))
            self.background_bytes = rgba.nbytes
            self._blur = None
        else:
            raise ValueError(f"--effect must be 'blur' or 'replace', got {effect!r}")
        cl = layout("r", "r", "r", "w")
        cp["QUAD"] = quad = W % 4 == 0
        self._comp = compute("video_composite.wgsl", "main", cp, cl, f"video_composite_{effect}_{W}x{H}")
        self._comp_bg = device.create_bind_group(layout=cl, entries=[
            {"binding": 0, "resource": {"buffer": self.frame_buf}},
            {"binding": 1, "resource": {"buffer": self.ema_buf}},
            {"binding": 2, "resource": {"buffer": back}},
            {"binding": 3, "resource": {"buffer": self.out_buffer}}])
        self._comp_groups = ((W // 4 + 15) // 16, (H + 3) // 4, 1) if quad else ((W + 7) // 8, (H + 7) // 8, 1)
        self._present = None
        self.times = {k: [] for k in STAGES_GPU}
        self.counters_start = ctx.counters

    # -- helpers -------------------------------------------------------------------------------

    def fence(self):
        """Wait for all work submitted to the queue so far (an empty clear + map; no data read)."""
        import wgpu

        enc = self.device.create_command_encoder()
        enc.clear_buffer(self._fence_buf)
        self.queue.submit([enc.finish()])
        self._fence_buf.map_sync(wgpu.MapMode.READ)
        self._fence_buf.unmap()

    def _stage(self, name, t0):
        if self.stage_sync:
            self.fence()
        t1 = time.perf_counter()
        self.times[name].append(t1 - t0)
        return t1

    def _import(self, tensor):
        import mltensor

        self.imports += 1
        return mltensor.import_external_buffer_sync(self.device, tensor)

    # -- the frame -----------------------------------------------------------------------------

    def process(self, frame):
        """Run one uint8 (H, W, 3) frame through the pipeline into `out_buffer`."""
        if frame.shape != (self.height, self.width, 3) or frame.dtype != np.uint8:
            raise ValueError(f"expected a uint8 frame of shape {(self.height, self.width, 3)}, "
                             f"got {frame.dtype} {frame.shape}")
        device, queue = self.device, self.queue
        t = time.perf_counter()
        # 1. upload: the rgb24 bytes, once
        queue.write_buffer(self.frame_buf, 0, _as_bytes(frame, self.frame_bytes))
        self.bytes_uploaded += self.frame_bytes
        t = self._stage("upload", t)

        # 2. preprocess into the lent model input (and the blur chain, which needs only the frame)
        buf = self._import(self.t_in)
        bg = device.create_bind_group(layout=self._pre_layout, entries=[
            {"binding": 0, "resource": {"buffer": self.frame_buf}},
            {"binding": 1, "resource": {"buffer": buf}}])
        enc = device.create_command_encoder(label="video-preprocess")
        cp = enc.begin_compute_pass()
        cp.set_pipeline(self._pre)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(*self._pre_groups)
        if self._blur is not None:
            cp.set_bind_group(0, self._blur_bg)
            for p in self._blur:
                cp.set_pipeline(p)
                cp.dispatch_workgroups(*self._blur_groups)
        cp.end()
        queue.submit([enc.finish()])
        buf.release()
        t = self._stage("preprocess", t)

        # 3. inference
        self.ctx.dispatch(self.graph, {self.in_name: self.t_in}, {self.out_name: self.t_mask})
        mask = self._import(self.t_mask)  # submits the ML work; the queue orders the rest
        t = self._stage("inference", t)

        # 4. temporal smoothing of the mask, then the full-resolution composite
        bg = device.create_bind_group(layout=self._ema_layout, entries=[
            {"binding": 0, "resource": {"buffer": mask}},
            {"binding": 1, "resource": {"buffer": self.ema_buf}}])
        enc = device.create_command_encoder(label="video-composite")
        cp = enc.begin_compute_pass()
        cp.set_pipeline(self._ema if self._frames_done else self._ema_first)
        cp.set_bind_group(0, bg)
        cp.dispatch_workgroups(*self._ema_groups)
        cp.set_pipeline(self._comp)
        cp.set_bind_group(0, self._comp_bg)
        cp.dispatch_workgroups(*self._comp_groups)
        cp.end()
        queue.submit([enc.finish()])
        mask.release()
        self._frames_done += 1
        self._stage("composite", t)

    def read_frame(self, out=None):
        """The composited frame as uint8 (H, W, 4) rgba: the pipeline's only readback."""
        import wgpu

        enc = self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(self.out_buffer, 0, self._readback, 0, self.out_bytes)
        self.queue.submit([enc.finish()])
        self._readback.map_sync(wgpu.MapMode.READ)
        try:
            view = np.frombuffer(self._readback.read_mapped(copy=False), np.uint8)
            if out is None:
                out = np.empty((self.height, self.width, 4), np.uint8)
            out.reshape(-1)[:] = view  # the one host copy
        finally:
            self._readback.unmap()
        self.bytes_read_back += self.out_bytes
        return out

    def present(self, canvas_context):
        """Draw the composited frame into a rendercanvas wgpu context (no readback)."""
        import wgpu

        from ..runtime import wgsl

        tex = canvas_context.get_current_texture()
        fmt = tex.format
        if self._present is None or self._present[0] != fmt:
            src = wgsl.template_env().get_template("video_present.wgsl").render(
                W=self.width, H=self.height, SRGB=fmt.endswith("srgb"))
            module = self.device.create_shader_module(label="video_present", code=src)
            pipe = self.device.create_render_pipeline(
                label="video_present", layout="auto",
                vertex={"module": module, "entry_point": "vs_main"},
                primitive={"topology": wgpu.PrimitiveTopology.triangle_list},
                fragment={"module": module, "entry_point": "fs_main", "targets": [{"format": fmt}]})
            ubuf = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
            bg = self.device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[
                {"binding": 0, "resource": {"buffer": self.out_buffer}},
                {"binding": 1, "resource": {"buffer": ubuf}}])
            self._present = [fmt, pipe, bg, ubuf, None]
        _, pipe, bg, ubuf, size = self._present
        if size != tex.size[:2]:
            self.queue.write_buffer(ubuf, 0, np.array([tex.size[0], tex.size[1], 0, 0], np.float32))
            self._present[4] = tex.size[:2]
        enc = self.device.create_command_encoder()
        rp = enc.begin_render_pass(color_attachments=[{
            "view": tex.create_view(), "load_op": wgpu.LoadOp.clear, "store_op": wgpu.StoreOp.store,
            "clear_value": (0, 0, 0, 1)}])
        rp.set_pipeline(pipe)
        rp.set_bind_group(0, bg)
        rp.draw(3)
        rp.end()
        self.queue.submit([enc.finish()])

    def traffic(self):
        """ML counters since the pipeline was created, and this pipeline's own host<->GPU bytes."""
        now = self.ctx.counters
        delta = {k: now[k] - self.counters_start[k] for k in
                 ("bytes_uploaded", "bytes_downloaded", "bytes_copied_between_devices", "submits",
                  "kernel_launches")}
        return {"ml": delta, "frame_bytes_uploaded": self.bytes_uploaded,
                "frame_bytes_read_back": self.bytes_read_back, "imports": self.imports,
                "ml_tensors_readable": self.t_in.readable or self.t_mask.readable}

    def close(self):
        self.t_in.destroy()
        self.t_mask.destroy()
        for b in (self.frame_buf, self.ema_buf, self.out_buffer, self._readback, self._fence_buf):
            b.destroy()


def _flit(x):
    """A WGSL f32 literal usable in const expressions (bitcast is not)."""
    r = repr(float(np.float32(x)))
    return r if any(c in r for c in ".e") else r + ".0"


def _pad4(n):
    return (n + 3) & ~3


def _as_bytes(frame, nbytes):
    a = np.ascontiguousarray(frame)
    if nbytes % 4:
        b = np.zeros(_pad4(nbytes), np.uint8)
        b[:nbytes] = a.reshape(-1)
        return b
    return a


# -- the same pipeline, the copying way ------------------------------------------------------------


def _bilinear_taps(src, dst, scale=None):
    """Indices and weights of a half-pixel-centre bilinear resize along one axis."""
    s = src / dst if scale is None else scale
    q = np.clip((np.arange(dst) + 0.5) * s - 0.5, 0, src - 1)
    i0 = np.floor(q).astype(np.intp)
    i1 = np.minimum(i0 + 1, src - 1)
    return i0, i1, (q - i0).astype(np.float32)


def _resize(img, taps_y, taps_x):
    y0, y1, fy = taps_y
    x0, x1, fx = taps_x
    fx = fx[:, None] if img.ndim == 3 else fx
    a = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    b = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    fy = fy[:, None, None] if img.ndim == 3 else fy[:, None]
    return a * (1 - fy) + b * fy


# Input normalizations a segmentation model may expect (`CopyingPipeline(..., preprocess=)`):
# rgb in [0, 1] minus mean, over std, per channel.
PREPROCESS = {
    "unit": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),                        # [0, 1] (MediaPipe)
    "signed": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),                      # [-1, 1]
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),        # torchvision models
}
# How the model's first output becomes a person probability in [0, 1] (`postprocess=`): the mask
# itself (one channel), a sigmoid of logits (one channel), or the softmax probability of the last
# class (background/person logits, channel axis as the input's layout).
POSTPROCESS = ("mask", "sigmoid", "softmax")


def _model_layout(shape):
    """('nhwc' | 'nchw', H, W) of a 4-D rgb model input."""
    if len(shape) == 4 and shape[-1] == 3:
        return "nhwc", int(shape[1]), int(shape[2])
    if len(shape) == 4 and shape[1] == 3:
        return "nchw", int(shape[2]), int(shape[3])
    raise ValueError(f"expected a 4-D rgb model input (NHWC or NCHW with 3 channels), got {list(shape)}")


class CopyingPipeline:
    """The same pipeline done the usual way: frame to numpy, InferenceSession with numpy in and out
    (upload and readback every frame), composite with numpy on the CPU. Also the per-file engine
    of the batch app (mltensor/apps/batch.py), hence any rgb model: `preprocess` names the input
    normalization (PREPROCESS), `postprocess` how the output becomes a mask (POSTPROCESS)."""

    def __init__(self, session, width, height, *, effect="blur", background=None, smoothing=0.5,
                 blur_sigma=None, preprocess="unit", postprocess="mask"):
        self.sess = session
        self.width, self.height = W, H = width, height
        inp = session.get_inputs()[0]
        self.in_name = inp.name
        self.layout, MH, MW = _model_layout([int(d) for d in inp.shape])
        self.model_size = (MW, MH)
        if preprocess not in PREPROCESS:
            raise ValueError(f"preprocess must be one of {', '.join(PREPROCESS)}, got {preprocess!r}")
        if postprocess not in POSTPROCESS:
            raise ValueError(f"postprocess must be one of {', '.join(POSTPROCESS)}, got {postprocess!r}")
        mean, std = (np.array(v, np.float32) for v in PREPROCESS[preprocess])
        self._norm = None if preprocess == "unit" else (mean, 1 / std)
        self.postprocess = postprocess
        self.mask = None  # the last frame's smoothed person probability, frame resolution
        self._pre_taps = (_bilinear_taps(H, MH), _bilinear_taps(W, MW))
        self.effect = effect
        self.alpha = min(1.0, max(0.0, 1.0 - float(smoothing)))
        self.ema = None
        if effect == "blur":
            F, SW, SH, R, w = blur_params(W, H, blur_sigma)
            self.blur = (F, SW, SH, R, w)
            self._up_taps = (_bilinear_taps(SH, H, 1 / F), _bilinear_taps(SW, W, 1 / F))
        else:
            self.background = (background if isinstance(background, np.ndarray)
                               else load_background(background, W, H)).astype(np.float32) / 255
        self.times = {k: [] for k in ("preprocess", "inference", "composite")}

    def _blurred(self, f):
        F, SW, SH, R, w = self.blur
        H, W = f.shape[:2]
        s = np.add.reduceat(np.add.reduceat(f, np.arange(0, H, F), axis=0), np.arange(0, W, F), axis=1)
        ny = np.minimum(F, H - np.arange(0, H, F))[:, None, None]
        nx = np.minimum(F, W - np.arange(0, W, F))[None, :, None]
        small = s / (ny * nx)
        p = np.pad(small, ((0, 0), (R, R), (0, 0)), mode="edge")
        h = sum(w[k] * p[:, k:k + SW] for k in range(2 * R + 1))
        p = np.pad(h, ((R, R), (0, 0), (0, 0)), mode="edge")
        v = sum(w[k] * p[k:k + SH] for k in range(2 * R + 1))
        return _resize(v, *self._up_taps)

    def _person(self, out):
        """The model's first output as a (h, w) person probability in [0, 1]."""
        y = np.asarray(out, np.float32)
        if y.ndim != 4:
            raise ValueError(f"expected a 4-D mask output, got shape {list(y.shape)}")
        ch = 1 if self.layout == "nchw" else 3
        if self.postprocess == "softmax":
            z = np.exp(y - y.max(axis=ch, keepdims=True))
            y = z / z.sum(axis=ch, keepdims=True)
            y = np.take(y, -1, axis=ch)[0]
        else:
            y = np.take(y, 0, axis=ch)[0]
            if self.postprocess == "sigmoid":
                y = 1 / (1 + np.exp(-y))
        return np.clip(y, 0, 1)

    def process(self, frame):
        t = time.perf_counter()
        f = frame.astype(np.float32) * (1 / 255)
        x = _resize(f, *self._pre_taps)
        if self._norm is not None:
            x = (x - self._norm[0]) * self._norm[1]
        x = x[None] if self.layout == "nhwc" else x.transpose(2, 0, 1)[None]
        x = np.ascontiguousarray(x, np.float32)
        t1 = time.perf_counter()
        self.times["preprocess"].append(t1 - t)
        mask = self.sess.run(None, {self.in_name: x})[0]
        t2 = time.perf_counter()
        self.times["inference"].append(t2 - t1)
        m = self._person(mask)
        self.ema = m if self.ema is None else self.ema + (m - self.ema) * self.alpha
        H, W = self.height, self.width
        mm = _resize(self.ema, _bilinear_taps(m.shape[0], H), _bilinear_taps(m.shape[1], W))
        self.mask = mm
        u = np.clip((mm - MASK_LO) / (MASK_HI - MASK_LO), 0, 1)
        mm = (u * u * (3 - 2 * u))[..., None]
        back = self._blurred(f) if self.effect == "blur" else self.background
        out = (np.clip(back + (f - back) * mm, 0, 1) * 255 + 0.5).astype(np.uint8)
        self.times["composite"].append(time.perf_counter() - t2)
        return out


# -- outputs ---------------------------------------------------------------------------------------


class Mp4Writer:
    """H.264 (yuv420p) through PyAV; frames in as uint8 rgba or rgb arrays."""

    def __init__(self, path, width, height, fps=30, crf=23, preset="veryfast"):
        import av

        self.container = av.open(path, "w")
        self.stream = self.container.add_stream("libx264", rate=int(round(fps)) or 30)
        self.stream.width, self.stream.height = width, height
        self.stream.pix_fmt = "yuv420p"
        self.stream.options = {"crf": str(crf), "preset": preset}
        self.path = path
        self.frames = 0

    def write(self, rgb):
        import av

        fmt = "rgba" if rgb.shape[-1] == 4 else "rgb24"
        frame = av.VideoFrame.from_ndarray(rgb, format=fmt)
        for packet in self.stream.encode(frame):
            self.container.mux(packet)
        self.frames += 1

    def close(self):
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()


def save_png(path, rgba):
    from PIL import Image

    Image.fromarray(np.ascontiguousarray(rgba[..., :3])).save(path)


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
        description="Real-time selfie segmentation (background blur or replacement), all on the GPU.")
    p.add_argument("--source", default="demo",
                   help="'demo' (built-in synthetic scene, default), 'webcam', or a video file path")
    p.add_argument("--size", type=_parse_size, default=(640, 360), help="WxH of the demo source (default 640x360)")
    p.add_argument("--frames", type=int, default=None, help="stop after N frames")
    p.add_argument("--output", default=None,
                   help="write H.264 to this .mp4 instead of opening a window (default without a display: "
                        "selfie_segmentation.mp4)")
    p.add_argument("--snapshot", default=None, help="also write the last composited frame as PNG")
    p.add_argument("--effect", choices=("blur", "replace"), default="blur")
    p.add_argument("--background", default=None, help="background image for --effect replace")
    p.add_argument("--blur", type=float, default=None, help="blur sigma in frame pixels (default height/30)")
    p.add_argument("--smoothing", type=float, default=0.5,
                   help="temporal smoothing of the mask, 0 (none) .. <1 (default 0.5)")
    p.add_argument("--model", default=None, help="a selfie segmentation .tflite (default: fetched once)")
    p.add_argument("--pipeline", choices=("gpu", "copy"), default="gpu",
                   help="'gpu' (default) or 'copy': numpy + InferenceSession + numpy composite, for comparison")
    p.add_argument("--no-stage-sync", dest="stage_sync", action="store_false",
                   help="do not fence between stages (stage times become enqueue times)")
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
    if args.effect == "replace" and not args.background:
        raise SystemExit("--effect replace needs --background IMAGE")
    if not 0 <= args.smoothing < 1:
        raise SystemExit(f"--smoothing must be in [0, 1), got {args.smoothing}")
    window = args.output is None and has_display()
    if not has_display():
        os.environ.setdefault("RENDERCANVAS_FORCE_OFFSCREEN", "1")
    output = args.output
    if output is None and not window:
        output = "selfie_segmentation.mp4"

    import wgpu

    import mltensor
    from mltensor import ml

    t_setup = time.perf_counter()
    source = open_source(args.source, args.size, args.frames)
    W, H = source.width, source.height
    if device is None:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise SystemExit("no wgpu adapter (on Linux without a GPU: apt-get install mesa-vulkan-drivers)")
        features = [f for f in ("shader-f16", "subgroup") if f in adapter.features]
        lim = adapter.limits
        limits = {k: lim[k] for k in ("max-buffer-size", "max-storage-buffer-binding-size",
                                       "max-compute-workgroup-storage-size",
                                       "max-compute-invocations-per-workgroup",
                                       "max-storage-buffers-per-shader-stage") if k in lim}
        device = adapter.request_device_sync(label="selfie", required_features=features, required_limits=limits)
    ctx = ml.create_context_sync(device)
    adapter_info = device.adapter.info
    n_total = args.frames if args.frames is not None else (len(source) or None)

    if args.pipeline == "gpu":
        graph, model_in, model_out, model_path = load_model(ctx, args.model)
        pipe = GpuPipeline(ctx, graph, model_in, model_out, W, H, effect=args.effect,
                           background=args.background, smoothing=args.smoothing,
                           blur_sigma=args.blur, stage_sync=args.stage_sync)
    else:
        model_path = args.model or mltensor.models.fetch("selfie_segmentation")
        sess = mltensor.InferenceSession(model_path, context=ctx)
        pipe = CopyingPipeline(sess, W, H, effect=args.effect, background=args.background,
                               smoothing=args.smoothing, blur_sigma=args.blur)
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

            bar = tqdm(total=n_total, unit="frame", desc=f"encoding {os.path.basename(output)}",
                       file=sys.stderr, dynamic_ncols=True)
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
        traffic = {"ml": {k: now[k] - counters0[k] for k in ("bytes_uploaded", "bytes_downloaded",
                                                             "bytes_copied_between_devices", "submits",
                                                             "kernel_launches")}}
    summary = {
        "pipeline": args.pipeline, "frames": n, "size": (W, H), "source": source,
        "model_input": model_in, "model_output": model_out, "model_path": model_path,
        "fps": fps, "ms_per_frame": 1e3 / fps if fps else float("nan"),
        "first_frame_ms": 1e3 * frame_times[0] if frame_times else float("nan"),
        "setup_s": setup_s, "stages_ms": stages, "source_ms": ms(source_times) if source_times else None, "stage_sync": getattr(args, "stage_sync", True),
        "traffic": traffic, "output": None if window else output, "snapshot": args.snapshot,
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
    canvas = RenderCanvas(size=(W, H), title="mltensor selfie segmentation", update_mode="continuous",
                          max_fps=240)
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
    yield (f"selfie segmentation [{s['pipeline']}]: {s['frames']} frames {W}x{H} from "
           f"{getattr(s['source'], 'name', '?')} on {s['adapter']}")
    yield f"  model {os.path.basename(str(s['model_path']))}: {list(ishape)} -> {list(oshape)}"
    yield (f"  {s['fps']:.2f} FPS end to end ({s['ms_per_frame']:.1f} ms/frame; first frame "
           f"{s['first_frame_ms']:.0f} ms; setup {s['setup_s']:.1f} s)")
    how = "GPU time, fenced per stage" if s["stage_sync"] else "enqueue time, unfenced"
    if s["pipeline"] == "copy":
        how = "wall time"
    yield "  per stage (ms/frame, " + how + "): " + ", ".join(
        f"{k} {v:.2f}" for k, v in s["stages_ms"].items())
    if s.get("source_ms") is not None:
        yield f"  (frame source: {s['source_ms']:.2f} ms/frame on the CPU, not counted in the FPS)"
    t = s["traffic"]
    ml = t["ml"]
    yield (f"  ML context counters over the run: bytes_uploaded {ml['bytes_uploaded']}, "
           f"bytes_downloaded {ml['bytes_downloaded']}, bytes_copied_between_devices "
           f"{ml['bytes_copied_between_devices']}, submits {ml['submits']}")
    if s["pipeline"] == "gpu":
        n = max(s["frames"], 1)
        yield (f"  host -> GPU: {t['frame_bytes_uploaded']} B of frames ({t['frame_bytes_uploaded'] // n} B/frame, "
               f"queue.write_buffer, once each)")
        yield (f"  GPU -> host: {t['frame_bytes_read_back']} B, composited frames for "
               f"{'encoding' if s['output'] else 'the snapshot'} only")
        ok = (ml["bytes_downloaded"] == 0 and ml["bytes_copied_between_devices"] == 0
              and ml["bytes_uploaded"] == 0 and not t["ml_tensors_readable"])
        yield (f"  zero-copy check: {'OK' if ok else 'FAILED'} - input and mask tensors not readable, "
               f"lent {t['imports']} times to the device, never read back or copied")
    if s["output"]:
        yield f"  wrote {s['output']}" + (f" and {s['snapshot']}" if s["snapshot"] else "")
    elif s["snapshot"]:
        yield f"  wrote {s['snapshot']}"


def main(argv=None):
    summary = run(argv)
    return 0 if summary["frames"] else 1


if __name__ == "__main__":
    sys.exit(main())
