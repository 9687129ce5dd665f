"""Frames in and out of the video apps (mltensor-selfie, mltensor-batch).

Sources yield uint8 (H, W, 3) rgb frames: the built-in demo scene (DemoSource, numpy on the CPU)
or a video file or the first webcam (AVSource, decoded by PyAV). Outputs: H.264 through PyAV
(Mp4Writer) and PNG through Pillow (save_png).
"""

import math
import os
import sys

import numpy as np

DEMO_FRAMES = 150  # 5 s at 30 fps of synthetic camera motion when --frames is not given


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
        [
            (210, 320),
            (320, 320),
            (350, 370),
            (460, 390),
            (512, 450),
            (512, 600),
            (0, 600),
            (0, 460),
            (70, 390),
            (190, 370),
        ],
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
        bg = np.stack(
            [0.25 + 0.6 * checker * stripes, 0.2 + 0.7 * rings * (1 - 0.5 * checker), 0.3 + 0.5 * stripes * rings], -1
        )
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
        crop = self._bg[by : by + h, bx : bx + w]
        for c in range(3):
            out[..., c] = lut[crop[..., c], c]
        # Paste the portrait (clipped to the frame) with its soft alpha.
        x0, y0 = max(px, 0), max(py, 0)
        x1, y1 = min(px + self.pw, w), min(py + self.ph, h)
        if x1 > x0 and y1 > y0:
            fg = self._fg[y0 - py : y1 - py, x0 - px : x1 - px]
            a = self._alpha[y0 - py : y1 - py, x0 - px : x1 - px]
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
