"""The composite's parameters, shared by both pipelines of the video apps (video_gpu.GpuPipeline
and its shaders, video_copy.CopyingPipeline in numpy): the background blur's downsample factor and
Gaussian, the mask's smoothstep edges, the replacement background image.
"""

import math

import numpy as np


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
