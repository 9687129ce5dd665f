"""The video app's pipeline done the usual way: numpy frame -> InferenceSession with numpy in and
out -> composite with numpy on the CPU. The video app's point of comparison, and the per-file
engine of the batch app (mltensor/apps/batch.py), hence any rgb segmentation model.
"""

import time

import numpy as np

from .video_composite import MASK_HI, MASK_LO, blur_params, load_background


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
    "unit": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # [0, 1] (MediaPipe)
    "signed": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),  # [-1, 1]
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # torchvision models
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

    def __init__(
        self,
        session,
        width,
        height,
        *,
        effect="blur",
        background=None,
        smoothing=0.5,
        blur_sigma=None,
        preprocess="unit",
        postprocess="mask",
    ):
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
            self.background = (
                background if isinstance(background, np.ndarray) else load_background(background, W, H)
            ).astype(np.float32) / 255
        self.times = {k: [] for k in ("preprocess", "inference", "composite")}

    def _blurred(self, f):
        F, SW, SH, R, w = self.blur
        H, W = f.shape[:2]
        s = np.add.reduceat(np.add.reduceat(f, np.arange(0, H, F), axis=0), np.arange(0, W, F), axis=1)
        ny = np.minimum(F, H - np.arange(0, H, F))[:, None, None]
        nx = np.minimum(F, W - np.arange(0, W, F))[None, :, None]
        small = s / (ny * nx)
        p = np.pad(small, ((0, 0), (R, R), (0, 0)), mode="edge")
        h = sum(w[k] * p[:, k : k + SW] for k in range(2 * R + 1))
        p = np.pad(h, ((R, R), (0, 0), (0, 0)), mode="edge")
        v = sum(w[k] * p[k : k + SH] for k in range(2 * R + 1))
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
