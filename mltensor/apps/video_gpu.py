"""The GPU pipeline of the video app (see selfie_segmentation.py for its per-frame steps): one wgpu
device shared with the ML context, and the Python side of the app's hand-written shaders
(shaders/video_{preprocess,mask,blur,composite,present}.wgsl): their template parameters, bind
group layouts and dispatch sizes. load_model builds the selfie segmentation model on that context.
"""

import time

import numpy as np

import mltensor  # its tflite and import_external_buffer_sync load on first use (mltensor/__init__.py)

from ..runtime import wgsl
from .video_composite import MASK_HI, MASK_LO, blur_params, load_background

STAGES_GPU = ("upload", "preprocess", "inference", "composite")


# -- model -----------------------------------------------------------------------------------------


def load_model(ctx, model=None):
    """(graph, (input name, shape), (output name, shape)) of the selfie segmentation model, built
    on `ctx`. `model`: a .tflite path, or None for mltensor.models.fetch("selfie_segmentation")."""
    path = model or mltensor.models.fetch("selfie_segmentation")
    graph, inputs, outputs = mltensor.tflite.import_model(path, ctx)
    (iname, itype, ishape), (oname, otype, oshape) = inputs[0], outputs[0]
    if itype != "float32" or len(ishape) != 4 or ishape[-1] != 3:
        raise ValueError(f"expected a float32 NHWC RGB model input, got {itype} {list(ishape)}")
    if otype != "float32" or len(oshape) != 4:
        raise ValueError(f"expected a float32 NHWC mask output, got {otype} {list(oshape)}")
    return graph, (iname, tuple(ishape)), (oname, tuple(oshape)), path


# -- the GPU pipeline ------------------------------------------------------------------------------


class GpuPipeline:
    """The whole per-frame pipeline on one wgpu device shared with the ML context.

    `process(frame)` uploads, preprocesses, runs the model and composites into `out_buffer`
    (W x H packed rgba8); `read_frame()` is the single readback, `present()` draws into a canvas.
    With `stage_sync` every stage ends with a GPU fence so `times` attributes GPU time to stages
    (a fence is an empty submit + map, no data); without it, stages only enqueue and the GPU
    overlaps them.
    """

    def __init__(
        self,
        ctx,
        graph,
        model_in,
        model_out,
        width,
        height,
        *,
        effect="blur",
        background=None,
        smoothing=0.5,
        blur_sigma=None,
        stage_sync=True,
    ):
        import wgpu

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
        self.frame_buf = device.create_buffer(
            label="video-frame-rgb24", size=_pad4(self.frame_bytes), usage=B.STORAGE | B.COPY_DST
        )
        self.ema_buf = device.create_buffer(label="video-mask-ema", size=OH * OW * 4, usage=B.STORAGE)
        self.out_bytes = W * H * 4
        self.out_buffer = device.create_buffer(
            label="video-composite-rgba8", size=self.out_bytes, usage=B.STORAGE | B.COPY_SRC
        )
        self._readback = device.create_buffer(
            label="video-readback", size=self.out_bytes, usage=B.MAP_READ | B.COPY_DST
        )
        self._fence_buf = device.create_buffer(label="video-fence", size=4, usage=B.MAP_READ | B.COPY_DST)
        self.bytes_uploaded = 0  # frames (and a replacement background, once) by queue.write_buffer
        self.bytes_read_back = 0  # composited frames, for encoding / snapshot only

        env = wgsl.template_env()
        common = dict(W=W, H=H, MW=MW, MH=MH)

        def compute(template, entry, params, layout, label):
            src = env.get_template(template).render(**params)
            module = device.create_shader_module(label=label, code=src)
            return device.create_compute_pipeline(
                label=label,
                layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": entry},
            )

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
        self._pre = compute(
            "video_preprocess.wgsl", "main", common, self._pre_layout, f"video_preprocess_{W}x{H}_to_{MW}x{MH}"
        )
        self._pre_groups = ((MW + 7) // 8, (MH + 7) // 8, 1)
        # mask EMA: imported mask -> ema (alpha 1 on the first frame)
        self._ema_layout = layout("r", "w")
        mp = dict(MH=OH, MW=OW, MC=MC)
        alpha = min(1.0, max(0.0, 1.0 - float(smoothing)))
        self._ema_first = compute(
            "video_mask.wgsl", "main", dict(mp, ALPHA=_flit(1.0)), self._ema_layout, f"video_mask_ema_{OW}x{OH}_init"
        )
        self._ema = compute(
            "video_mask.wgsl", "main", dict(mp, ALPHA=_flit(alpha)), self._ema_layout, f"video_mask_ema_{OW}x{OH}"
        )
        self._ema_groups = (-(-OH * OW // 64), 1, 1)
        self._frames_done = 0
        # background: blur chain, or an uploaded image
        cp = dict(W=W, H=H, MW=OW, MH=OH, EFFECT=effect, LO=_flit(MASK_LO), HI=_flit(MASK_HI))
        if effect == "blur":
            F, SW, SH, R, weights = blur_params(W, H, blur_sigma)
            self.blur = dict(F=F, SW=SW, SH=SH, R=R)
            small = [
                device.create_buffer(label=f"video-blur-{i}", size=SW * SH * 16, usage=B.STORAGE) for i in range(2)
            ]
            bl = layout("r", "w", "w")
            bp = dict(
                W=W,
                H=H,
                F=F,
                SW=SW,
                SH=SH,
                R=R,
                SIGMA=f"{(blur_sigma or H / 30.0) / F:.2f}",
                weights=", ".join(_flit(x) for x in weights),
            )
            self._blur = [
                compute("video_blur.wgsl", e, bp, bl, f"video_blur_{e}_{SW}x{SH}_f{F}_r{R}")
                for e in ("down", "blur_h", "blur_v")
            ]
            self._blur_bg = device.create_bind_group(
                layout=bl,
                entries=[
                    {"binding": 0, "resource": {"buffer": self.frame_buf}},
                    {"binding": 1, "resource": {"buffer": small[0]}},
                    {"binding": 2, "resource": {"buffer": small[1]}},
                ],
            )
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
        self._comp_bg = device.create_bind_group(
            layout=cl,
            entries=[
                {"binding": 0, "resource": {"buffer": self.frame_buf}},
                {"binding": 1, "resource": {"buffer": self.ema_buf}},
                {"binding": 2, "resource": {"buffer": back}},
                {"binding": 3, "resource": {"buffer": self.out_buffer}},
            ],
        )
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
        self.imports += 1
        return mltensor.import_external_buffer_sync(self.device, tensor)

    # -- the frame -----------------------------------------------------------------------------

    def process(self, frame):
        """Run one uint8 (H, W, 3) frame through the pipeline into `out_buffer`."""
        if frame.shape != (self.height, self.width, 3) or frame.dtype != np.uint8:
            raise ValueError(
                f"expected a uint8 frame of shape {(self.height, self.width, 3)}, got {frame.dtype} {frame.shape}"
            )
        device, queue = self.device, self.queue
        t = time.perf_counter()
        # 1. upload: the rgb24 bytes, once
        queue.write_buffer(self.frame_buf, 0, _as_bytes(frame, self.frame_bytes))
        self.bytes_uploaded += self.frame_bytes
        t = self._stage("upload", t)

        # 2. preprocess into the lent model input (and the blur chain, which needs only the frame)
        buf = self._import(self.t_in)
        bg = device.create_bind_group(
            layout=self._pre_layout,
            entries=[
                {"binding": 0, "resource": {"buffer": self.frame_buf}},
                {"binding": 1, "resource": {"buffer": buf}},
            ],
        )
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
        bg = device.create_bind_group(
            layout=self._ema_layout,
            entries=[
                {"binding": 0, "resource": {"buffer": mask}},
                {"binding": 1, "resource": {"buffer": self.ema_buf}},
            ],
        )
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

        tex = canvas_context.get_current_texture()
        fmt = tex.format
        if self._present is None or self._present[0] != fmt:
            src = (
                wgsl.template_env()
                .get_template("video_present.wgsl")
                .render(W=self.width, H=self.height, SRGB=fmt.endswith("srgb"))
            )
            module = self.device.create_shader_module(label="video_present", code=src)
            pipe = self.device.create_render_pipeline(
                label="video_present",
                layout="auto",
                vertex={"module": module, "entry_point": "vs_main"},
                primitive={"topology": wgpu.PrimitiveTopology.triangle_list},
                fragment={"module": module, "entry_point": "fs_main", "targets": [{"format": fmt}]},
            )
            ubuf = self.device.create_buffer(size=16, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
            bg = self.device.create_bind_group(
                layout=pipe.get_bind_group_layout(0),
                entries=[
                    {"binding": 0, "resource": {"buffer": self.out_buffer}},
                    {"binding": 1, "resource": {"buffer": ubuf}},
                ],
            )
            self._present = [fmt, pipe, bg, ubuf, None]
        _, pipe, bg, ubuf, size = self._present
        if size != tex.size[:2]:
            self.queue.write_buffer(ubuf, 0, np.array([tex.size[0], tex.size[1], 0, 0], np.float32))
            self._present[4] = tex.size[:2]
        enc = self.device.create_command_encoder()
        rp = enc.begin_render_pass(
            color_attachments=[
                {
                    "view": tex.create_view(),
                    "load_op": wgpu.LoadOp.clear,
                    "store_op": wgpu.StoreOp.store,
                    "clear_value": (0, 0, 0, 1),
                }
            ]
        )
        rp.set_pipeline(pipe)
        rp.set_bind_group(0, bg)
        rp.draw(3)
        rp.end()
        self.queue.submit([enc.finish()])

    def traffic(self):
        """ML counters since the pipeline was created, and this pipeline's own host<->GPU bytes."""
        now = self.ctx.counters
        delta = {
            k: now[k] - self.counters_start[k]
            for k in (
                "bytes_uploaded",
                "bytes_downloaded",
                "bytes_copied_between_devices",
                "submits",
                "kernel_launches",
            )
        }
        return {
            "ml": delta,
            "frame_bytes_uploaded": self.bytes_uploaded,
            "frame_bytes_read_back": self.bytes_read_back,
            "imports": self.imports,
            "ml_tensors_readable": self.t_in.readable or self.t_mask.readable,
        }

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
