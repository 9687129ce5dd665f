"""ONNX RoiAlign (average mode, a fixed sampling ratio), as the two-stage detectors export it
(torchvision's MultiScaleRoIAlign: 7x7 or 14x14 bins, sampling_ratio 2).

Bilinear sampling is separable: the sample rows of a region depend on its y extent only, the
columns on its x extent. So the average over a bin's sampling_ratio x sampling_ratio samples is
Ay @ X @ Ax^T, where Ay [R, out_h, H] holds each output row's interpolation weights over the
feature map's rows, averaged over the bin's samples (two nonzero weights a sample: the rows
around it, zero for a sample outside [-1, H]), and Ax likewise for the columns. Ay and Ax are
built from the boxes with elementwise operators against a row / column index, and the pooling is
two batched matmuls: no gather, any number of regions (a count read at run time included).
"""

import numpy as np

from ._helpers import X
from ._registry import op


def _axis_weights(im, start, length, out, sr, size, dt):
    """[R, out, size]: for each output bin, the mean over its sr samples of their bilinear
    weights over the `size` positions of one axis (ONNX's rules: samples outside [-1, size]
    weigh nothing, others are clamped at 0 and at size - 1)."""
    b = im.b

    def c(v):
        return b.constant(np.asarray(v, dtype=dt))

    # sample i of bin p lies at start + (p + (i + 0.5) / sr) / out * length
    frac = np.array([(p + (i + 0.5) / sr) / out for p in range(out) for i in range(sr)], dt).reshape(1, out * sr)
    pos = b.add(start, b.mul(length, c(frac)))  # [R, out * sr]
    valid = b.logical_and(b.greater_or_equal(pos, c(-1.0)), b.lesser_or_equal(pos, c(float(size))))
    pos = b.max(pos, c(0.0))
    low = b.floor(pos)
    last = c(float(size - 1))
    at_end = b.greater_or_equal(low, last)
    low = b.where(at_end, last, low)
    high = b.where(at_end, last, b.add(low, c(1.0)))
    frac_hi = b.where(at_end, c(0.0), b.sub(pos, low))  # the weight of `high`
    frac_lo = b.sub(c(1.0), frac_hi)
    zero = c(0.0)
    frac_hi = b.where(valid, frac_hi, zero)
    frac_lo = b.where(valid, frac_lo, zero)
    n = low.shape[0]

    def col(t):
        return b.reshape(t, [n, out * sr, 1])

    grid = c(np.arange(size, dtype=dt).reshape(1, 1, size))
    w = b.add(
        b.where(b.equal(grid, col(low)), col(frac_lo), zero),
        b.where(b.equal(grid, col(high)), col(frac_hi), zero),
    )  # [R, out * sr, size]
    return b.reduce_mean(b.reshape(w, [n, out, sr, size]), axes=[2])


@op(
    "RoiAlign",
    attrs=(
        "coordinate_transformation_mode",
        "mode",
        "output_height",
        "output_width",
        "sampling_ratio",
        "spatial_scale",
    ),
)
def _roi_align(im, node, ins, attrs):
    b = im.b
    x = X(im, ins[0])
    if len(x.shape) != 4:
        im.malformed(f"X has shape {list(x.shape)}, not [N, C, H, W]")
    rois = X(im, ins[1], x)
    if len(rois.shape) != 2 or rois.shape[1] != 4:
        im.malformed(f"rois has shape {list(rois.shape)}, not [num_rois, 4]")
    mode = attrs.get("mode", "avg")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "avg":
        im.fail(f"mode {mode!r} is not supported (only 'avg')")
    sr = int(attrs.get("sampling_ratio", 0))
    if sr <= 0:
        im.fail(
            "sampling_ratio 0 (an adaptive sample count computed from each region's size) is not "
            "supported; torchvision's exports use 2"
        )
    ctm = attrs.get("coordinate_transformation_mode", "half_pixel" if im.cur_opset >= 16 else "output_half_pixel")
    ctm = ctm.decode() if isinstance(ctm, bytes) else ctm
    oh, ow = int(attrs.get("output_height", 1)), int(attrs.get("output_width", 1))
    n, ch, h, w = x.shape
    dt = np.float16 if x.data_type == "float16" else np.float32
    scale = float(attrs.get("spatial_scale", 1.0))
    offset = 0.5 if ctm == "half_pixel" else 0.0
    x1, y1, x2, y2 = (
        b.sub(b.mul(t, b.constant(np.asarray(scale, dt))), b.constant(np.asarray(offset, dt)))
        for t in b.split(rois, 4, axis=1)
    )
    rw, rh = b.sub(x2, x1), b.sub(y2, y1)
    if ctm != "half_pixel":  # (output_half_pixel: regions at least one pixel wide)
        one = b.constant(np.asarray(1.0, dt))
        rw, rh = b.max(rw, one), b.max(rh, one)
    ay = _axis_weights(im, y1, rh, oh, sr, h, dt)  # [R, oh, H]
    ax = _axis_weights(im, x1, rw, ow, sr, w, dt)  # [R, ow, W]
    r = ay.shape[0]
    idx = None
    if n > 1:
        idx = X(im, ins[2])
        if idx.data_type != "int32":
            idx = b.cast(idx, "int32")
    # regions in chunks whose intermediate [k, C, oh, W] (and gathered images) stay under CHUNK_BYTES
    per_region = ch * max(oh * w, h * w if n > 1 else 0) * np.dtype(dt).itemsize
    k = max(1, CHUNK_BYTES // per_region)
    if not isinstance(r, int) or r <= k:
        return _pool(im, ay, ax, x, idx, r)
    sizes = [k] * (r // k) + ([r % k] if r % k else [])
    parts = zip(
        b.split(ay, sizes, axis=0), b.split(ax, sizes, axis=0), b.split(idx, sizes) if idx else [None] * len(sizes)
    )
    return b.concat([_pool(im, a, c, x, i, m) for (a, c, i), m in zip(parts, sizes)], 0)


# The largest intermediate a RoiAlign chunk of regions makes (a ResNet FPN's first level holds
# 256 x 80 x 80 floats; Mask R-CNN pools up to 1000 regions)
CHUNK_BYTES = 64 << 20


def _pool(im, ay, ax, x, idx, r):
    """[r, C, oh, ow] = Ay @ X[image] @ Ax^T for r regions."""
    b = im.b
    _, oh, h = ay.shape
    _, ow, w = ax.shape
    xb = x if idx is None else b.gather(x, idx, axis=0)  # [1 or r, C, H, W]
    t = b.matmul(b.reshape(ay, [r, 1, oh, h]), xb)  # [r, C, oh, W]
    return b.matmul(t, b.transpose(b.reshape(ax, [r, 1, ow, w]), permutation=[0, 1, 3, 2]))
