"""MediaPipe's custom TFLite operators of face_landmark_with_attention, composed from builder ops.

Semantics follow MediaPipe's reference kernels (mediapipe/util/tflite/operations/*.cc; versions 1
and 2, the model uses 2); options are flexbuffer maps in the operator's custom_options.

- Landmarks2TransformMatrix: landmarks [1, N, 3] (v1: [1, 1, 1, 3N]) -> [1, 4, 4], the affine
  matrix that maps an output crop onto the rotated box around a landmark subset.
- TransformTensorBilinear: features [1, H, W, C] and that matrix -> [1, oh, ow, C] bilinear samples
  (zero outside the input), with version 2's half-pixel correction of the matrix.
- TransformLandmarks: landmarks [1, N, 2|3] (v1: [1, H, W, C], translation times `scale`) and the
  matrix -> x, y transformed (z kept).

Everything the kernels compute from the matrix is a handful of scalars, so these are small graphs
of elementwise ops, gathers and reductions; no new kernel is needed.
"""

import math

import numpy as np

from ..errors import DataError, NotSupportedError


def _fail(op, msg, cls=DataError):
    return cls(f"[tflite] operator {op.index} ({op.display}): {msg}")


def options(op, required):
    """The flexbuffer map of custom options, with `required` keys present and numeric."""
    from flatbuffers import flexbuffers

    if not op.custom_options:
        opts = {}
    else:
        try:
            opts = flexbuffers.Loads(op.custom_options)
        except Exception as e:  # flexbuffers raises bare IndexError/ValueError/struct.error on garbage
            raise _fail(op, f"custom options are not a valid flexbuffer ({type(e).__name__}: {e})") from None
    if not isinstance(opts, dict):
        raise _fail(op, f"custom options must be a flexbuffer map, got {type(opts).__name__}")
    missing = [k for k in required if k not in opts]
    if missing:
        raise _fail(op, f"custom options lack {', '.join(missing)}")
    return opts


def _num(op, opts, key, kind=float, positive=False):
    v = opts.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _fail(op, f"custom option {key} must be a number, got {v!r}")
    if kind is int and v != int(v):
        raise _fail(op, f"custom option {key} must be an integer, got {v!r}")
    if positive and v <= 0:
        raise _fail(op, f"custom option {key} must be positive, got {v!r}")
    return kind(v)


def _version(op, supported=(2,)):
    if op.version not in supported:
        raise _fail(op, f"version {op.version} is not supported (only {supported})", NotSupportedError)


def _matrix_rows(b, m):
    """[1, 4, 4] matrix -> the eight entries of its first two rows as [1]-shaped operands."""
    flat = b.reshape(m, [16])
    return [b.slice(flat, [k], [1]) for k in range(8)]


def _const(b, v):
    return b.constant(np.asarray([v], np.float32))


def _int_list(op, opts, key):
    v = opts.get(key)
    if not isinstance(v, list) or not v or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise _fail(op, f"custom option {key} must be a non-empty list of integers, got {v!r}")
    return v


def _check_indices(op, n, named):
    for name, i in named:
        if not 0 <= i < n:
            raise _fail(op, f"{name} {i} is outside the {n} landmarks")


def _box(b, c, s, px, py, clamp=None):
    """Rotate points (px, py) by the angle with cosine c and sine s; their bounding box as
    ([1]-shaped) hi_x, lo_x, hi_y, lo_y. `clamp`: the kernel's +-clamp start values (version 1)."""
    rx = b.sub(b.mul(c, px), b.mul(s, py))
    ry = b.add(b.mul(s, px), b.mul(c, py))
    hi_x, lo_x = b.reduce_max(rx, axes=[0], keep_dimensions=True), b.reduce_min(rx, axes=[0], keep_dimensions=True)
    hi_y, lo_y = b.reduce_max(ry, axes=[0], keep_dimensions=True), b.reduce_min(ry, axes=[0], keep_dimensions=True)
    if clamp is not None:
        hi_x, hi_y = b.max(hi_x, _const(b, -clamp)), b.max(hi_y, _const(b, -clamp))
        lo_x, lo_y = b.min(lo_x, _const(b, clamp)), b.min(lo_y, _const(b, clamp))
    return hi_x, lo_x, hi_y, lo_y


def _matrix_4x4(b, rows):
    """16 [1]-shaped operands or floats, row-major -> [1, 4, 4]."""
    parts = [_const(b, v) if isinstance(v, float) else v for v in rows]
    return b.reshape(b.concat(parts, 0), [1, 4, 4])


def landmarks_to_transform_matrix(imp, op):
    _version(op, (1, 2))
    x = imp.operand(op, op.inputs[0])
    return (_l2t_v1 if op.version == 1 else _l2t_v2)(imp, op, x)


def _l2t_v2(imp, op, x):
    keys = ("left_rotation_idx", "right_rotation_idx", "output_height", "output_width", "scale_x", "scale_y",
            "subset_idxs")  # fmt: skip
    o = options(op, keys)
    if x.rank != 3 or x.shape[0] != 1 or x.shape[2] < 2:
        raise _fail(op, f"landmarks must have shape [1, N, 2 or more], got {list(x.shape)}")
    n, dims = x.shape[1], x.shape[2]
    left, right = _num(op, o, "left_rotation_idx", int), _num(op, o, "right_rotation_idx", int)
    oh, ow = _num(op, o, "output_height", int, True), _num(op, o, "output_width", int, True)
    scale_x, scale_y = _num(op, o, "scale_x", positive=True), _num(op, o, "scale_y", positive=True)
    target = _num(op, {"t": o.get("target_rotation_radians", 0.0)}, "t")
    subset = _int_list(op, o, "subset_idxs")
    # The kernel reads subset_idxs as (a, b) pairs (an odd last one paired with itself) and uses both
    # members of every pair, so the box covers exactly the landmarks listed.
    named = [("left_rotation_idx", left), ("right_rotation_idx", right)] + [("subset_idxs", i) for i in subset]
    _check_indices(op, n, named)
    b = imp.b
    xy = b.slice(b.reshape(x, [n, dims]), [0, 0], [n, 2])  # [N, 2]
    # Rotation r = target - atan2(dy, dx) between the two rotation landmarks, kept as cos / sin:
    # cos(t - a) = cos t cos a + sin t sin a, sin(t - a) = sin t cos a - cos t sin a, with
    # cos a = dx / h, sin a = dy / h; atan2(0, 0) = 0 gives cos a = 1, sin a = 0.
    d = b.reshape(b.sub(b.slice(xy, [right, 0], [1, 2]), b.slice(xy, [left, 0], [1, 2])), [2])
    dx, dy = b.slice(d, [0], [1]), b.slice(d, [1], [1])
    h = b.sqrt(b.add(b.mul(dx, dx), b.mul(dy, dy)))
    nonzero = b.greater(h, _const(b, 0.0))
    h_safe = b.where(nonzero, h, _const(b, 1.0))
    cos_a = b.where(nonzero, b.div(dx, h_safe), _const(b, 1.0))
    sin_a = b.where(nonzero, b.div(dy, h_safe), _const(b, 0.0))
    ct, st = math.cos(target), math.sin(target)
    c = b.add(b.mul(cos_a, _const(b, ct)), b.mul(sin_a, _const(b, st)))
    s = b.sub(b.mul(cos_a, _const(b, st)), b.mul(sin_a, _const(b, ct)))
    # Rotate the subset by r, take its bounding box, rotate the box centre back.
    k = len(subset)
    pts = b.gather(xy, b.constant(np.asarray(subset, np.int32)), axis=0)  # [K, 2]
    px, py = b.reshape(b.slice(pts, [0, 0], [k, 1]), [k]), b.reshape(b.slice(pts, [0, 1], [k, 1]), [k])
    hi_x, lo_x, hi_y, lo_y = _box(b, c, s, px, py)
    half = _const(b, 0.5)
    mx, my = b.mul(b.add(lo_x, hi_x), half), b.mul(b.add(lo_y, hi_y), half)
    cx = b.add(b.mul(c, mx), b.mul(s, my))  # rotation by -r: [[c, s], [-s, c]]
    cy = b.sub(b.mul(c, my), b.mul(s, mx))
    # T = shift(cx, cy) * rot(-r) * scale(sx, sy) * shift(-ow / 2, -oh / 2)
    sx = b.mul(b.sub(hi_x, lo_x), _const(b, scale_x / ow))
    sy = b.mul(b.sub(hi_y, lo_y), _const(b, scale_y / oh))
    a00, a01 = b.mul(c, sx), b.mul(s, sy)
    a10, a11 = b.neg(b.mul(s, sx)), b.mul(c, sy)
    hx, hy = _const(b, -ow / 2.0), _const(b, -oh / 2.0)
    t0 = b.add(cx, b.add(b.mul(a00, hx), b.mul(a01, hy)))
    t1 = b.add(cy, b.add(b.mul(a10, hx), b.mul(a11, hy)))
    return _matrix_4x4(b, [a00, a01, 0.0, t0, a10, a11, 0.0, t1, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])


def _l2t_v1(imp, op, x):
    """Version 1: landmarks flattened to [1, 1, 1, 3N]; the crop's rotation is -atan(dy / dx) (not
    atan2: the box is never turned upside down) and the matrix maps output pixels, normalized by
    output_hw - 1, onto input pixels of an input_hw image whose landmarks span landmarks_range."""
    keys = ("input_hw", "output_hw", "dimensions", "landmarks_range", "bbox_size_multiplier", "left_rotation_idx",
            "right_rotation_idx", "subset")  # fmt: skip
    o = options(op, keys)
    if x.rank != 4 or list(x.shape[:3]) != [1, 1, 1]:
        raise _fail(op, f"version 1 takes landmarks of shape [1, 1, 1, 3N], got {list(x.shape)}")
    if _num(op, o, "dimensions", int) != 3 or x.shape[3] % 3:
        raise _fail(op, f"version 1 needs 3-D landmarks (dimensions {o['dimensions']}, {x.shape[3]} values)")
    in_hw, out_hw = _int_list(op, o, "input_hw"), _int_list(op, o, "output_hw")
    if len(in_hw) != 2 or len(out_hw) != 2 or min(in_hw) <= 0 or min(out_hw) <= 1:
        raise _fail(op, f"input_hw {o['input_hw']} must be positive and output_hw {o['output_hw']} above 1 "
                        f"(the kernel divides by output size - 1)")  # fmt: skip
    (ih, iw), (oh, ow) = in_hw, out_hw
    rng_ = _num(op, o, "landmarks_range", float, True)
    mult = _num(op, o, "bbox_size_multiplier")
    if mult == 0:
        raise _fail(op, "bbox_size_multiplier is 0")
    left, right = _num(op, o, "left_rotation_idx", int), _num(op, o, "right_rotation_idx", int)
    subset = _int_list(op, o, "subset")
    n = x.shape[3] // 3
    named = [("left_rotation_idx", left), ("right_rotation_idx", right)] + [("subset", i) for i in subset]
    _check_indices(op, n, named)
    b = imp.b
    xy = b.slice(b.reshape(x, [n, 3]), [0, 0], [n, 2])
    d = b.reshape(b.sub(b.slice(xy, [right, 0], [1, 2]), b.slice(xy, [left, 0], [1, 2])), [2])
    dx, dy = b.slice(d, [0], [1]), b.slice(d, [1], [1])
    # alpha = -atan(dy / dx): cos alpha = |dx| / h, sin alpha = -sign(dx) dy / h (dx = 0 counts as
    # positive; both landmarks equal, where the kernel produces NaN, gives the identity rotation).
    h = b.sqrt(b.add(b.mul(dx, dx), b.mul(dy, dy)))
    nonzero = b.greater(h, _const(b, 0.0))
    h_safe = b.where(nonzero, h, _const(b, 1.0))
    sgn = b.where(b.lesser(dx, _const(b, 0.0)), _const(b, -1.0), _const(b, 1.0))
    c = b.where(nonzero, b.div(b.abs(dx), h_safe), _const(b, 1.0))
    s = b.where(nonzero, b.neg(b.div(b.mul(sgn, dy), h_safe)), _const(b, 0.0))
    k = len(subset)
    pts = b.gather(xy, b.constant(np.asarray(subset, np.int32)), axis=0)
    px, py = b.reshape(b.slice(pts, [0, 0], [k, 1]), [k]), b.reshape(b.slice(pts, [0, 1], [k, 1]), [k])
    hi_x, lo_x, hi_y, lo_y = _box(b, c, s, px, py, clamp=100000.0)
    half = _const(b, 0.5)
    mx, my = b.mul(b.add(hi_x, lo_x), half), b.mul(b.add(hi_y, lo_y), half)
    # rotated_middle = rot(-alpha) middle; the rotation matrix's translation is 2 rm / range - 1.
    ux = b.sub(b.mul(b.add(b.mul(c, mx), b.mul(s, my)), _const(b, 2.0 / rng_)), _const(b, 1.0))
    uy = b.sub(b.mul(b.sub(b.mul(c, my), b.mul(s, mx)), _const(b, 2.0 / rng_)), _const(b, 1.0))
    sx = b.mul(b.sub(hi_x, lo_x), _const(b, mult / rng_))
    sy = b.mul(b.sub(hi_y, lo_y), _const(b, mult / rng_))
    # itm = to_absolute * [[c, s, ux], [-s, c, uy]] * diag(sx, sy) * to_relative, multiplied out.
    ax, ay = 2.0 / (ow - 1.0), 2.0 / (oh - 1.0)
    p, q = (iw - 1.0) / 2.0, (ih - 1.0) / 2.0
    csx, ssy, ssx, csy = b.mul(c, sx), b.mul(s, sy), b.mul(s, sx), b.mul(c, sy)
    r00, r01 = b.mul(csx, _const(b, p * ax)), b.mul(ssy, _const(b, p * ay))
    r02 = b.mul(b.add(b.sub(ux, b.add(csx, ssy)), _const(b, 1.0)), _const(b, p))
    r10, r11 = b.mul(b.neg(ssx), _const(b, q * ax)), b.mul(csy, _const(b, q * ay))
    r12 = b.mul(b.add(b.add(b.sub(ssx, csy), uy), _const(b, 1.0)), _const(b, q))
    return _matrix_4x4(b, [r00, r01, 0.0, r02, r10, r11, 0.0, r12, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])


def _check_matrix(op, m):
    if tuple(m.shape) != (1, 4, 4):
        raise _fail(op, f"the transform matrix must have shape [1, 4, 4], got {list(m.shape)}")


def transform_tensor_bilinear(imp, op):
    _version(op, (1, 2))
    if op.version == 2:
        o = options(op, ("output_height", "output_width"))
        oh, ow = _num(op, o, "output_height", int, True), _num(op, o, "output_width", int, True)
    else:  # version 1: {"mode": "bilinear", "output_size": [h, w]}, both optional
        o = options(op, ())
        if o.get("mode", "bilinear") != "bilinear":
            raise _fail(op, f"mode {o['mode']!r} is not supported (only 'bilinear')", NotSupportedError)
        oh = ow = None
        if "output_size" in o:
            size = _int_list(op, o, "output_size")
            if len(size) != 2 or min(size) <= 0:
                raise _fail(op, f"custom option output_size must be [height, width], got {size}")
            oh, ow = size
    # MediaPipe's CPU kernel takes the size from the output tensor: it must agree with the options.
    declared = imp.tensor(op.outputs[0]).shape
    if len(declared) == 4:
        if oh is None:
            oh, ow = declared[1], declared[2]
        elif (declared[1], declared[2]) != (oh, ow):
            raise _fail(op, f"output size {[oh, ow]} in the options, {list(declared)} declared")
    if oh is None or oh <= 0 or ow <= 0:
        raise _fail(op, "the output size is neither in the options nor declared")
    x = imp.operand(op, op.inputs[0])
    m = imp.operand(op, op.inputs[1])
    _check_matrix(op, m)
    if x.rank != 4 or x.shape[0] != 1:
        raise _fail(op, f"the input must have shape [1, H, W, C], got {list(x.shape)}")
    _, hgt, wid, ch = x.shape
    if oh * ow > 1 << 24:
        raise _fail(op, f"output {oh} x {ow} is too large")
    b = imp.b
    m00, m01, _, m03, m10, m11, _, m13 = _matrix_rows(b, m)
    if op.version == 2:
        # Version 2 maps pixel centres: T -> S (T A) with A / S shifting by +-0.5, i.e.
        # m03 += 0.5 (m00 + m01) - 0.5 (and the same for row 1).
        half = _const(b, 0.5)
        m03 = b.add(m03, b.sub(b.mul(b.add(m00, m01), half), half))
        m13 = b.add(m13, b.sub(b.mul(b.add(m10, m11), half), half))
    gy, gx = np.meshgrid(np.arange(oh, dtype=np.float32), np.arange(ow, dtype=np.float32), indexing="ij")
    gx, gy = b.constant(gx.reshape(-1)), b.constant(gy.reshape(-1))  # [P] output pixel coordinates
    tx = b.add(b.add(b.mul(m00, gx), b.mul(m01, gy)), m03)
    ty = b.add(b.add(b.mul(m10, gx), b.mul(m11, gy)), m13)
    inside = b.logical_and(
        b.logical_and(b.greater_or_equal(tx, _const(b, 0.0)), b.lesser_or_equal(tx, _const(b, wid - 1.0))),
        b.logical_and(b.greater_or_equal(ty, _const(b, 0.0)), b.lesser_or_equal(ty, _const(b, hgt - 1.0))),
    )
    # Outside (or NaN) samples are 0; give them coordinate 0 so every index below is in range
    # before the float -> int conversion.
    tx = b.where(inside, tx, _const(b, 0.0))
    ty = b.where(inside, ty, _const(b, 0.0))
    fx, fy = b.floor(tx), b.floor(ty)
    wx, wy = b.sub(tx, fx), b.sub(ty, fy)
    # The kernel reads 0 past the last row / column; that only happens when the coordinate is
    # exactly W - 1 (or H - 1), where the weight of the far neighbour is 0, so clamping is the same.
    x0 = b.cast(fx, "int32")
    y0 = b.cast(fy, "int32")
    x1 = b.cast(b.min(b.add(fx, _const(b, 1.0)), _const(b, wid - 1.0)), "int32")
    y1 = b.cast(b.min(b.add(fy, _const(b, 1.0)), _const(b, hgt - 1.0)), "int32")
    w_ = b.constant(np.asarray([wid], np.int32))
    flat = b.reshape(x, [hgt * wid, ch])

    def read(yy, xx):
        return b.gather(flat, b.add(b.mul(yy, w_), xx), axis=0)  # [P, C]

    p = oh * ow
    wx, wy = b.reshape(wx, [p, 1]), b.reshape(wy, [p, 1])
    one = _const(b, 1.0)
    upper = b.add(b.mul(b.sub(one, wx), read(y0, x0)), b.mul(wx, read(y0, x1)))
    lower = b.add(b.mul(b.sub(one, wx), read(y1, x0)), b.mul(wx, read(y1, x1)))
    out = b.add(b.mul(wy, lower), b.mul(b.sub(one, wy), upper))
    out = b.where(b.reshape(inside, [p, 1]), out, _const(b, 0.0))
    return b.reshape(out, [1, oh, ow, ch])


def transform_landmarks(imp, op):
    _version(op, (1, 2))
    x = imp.operand(op, op.inputs[0])
    m = imp.operand(op, op.inputs[1])
    _check_matrix(op, m)
    b = imp.b
    scale = 1.0
    if op.version == 2:
        if op.custom_options:
            options(op, ())  # validated; version 2 takes its dimensions from the input's shape
        if x.rank != 3 or x.shape[2] not in (2, 3):
            raise _fail(op, f"landmarks must have shape [B, N, 2 or 3], got {list(x.shape)}")
        dims = x.shape[2]
    else:  # version 1: [1, H, W, C] holding C / dimensions landmarks per pixel; translation scaled
        o = options(op, ("dimensions", "scale"))
        dims, scale = _num(op, o, "dimensions", int), _num(op, o, "scale")
        if dims not in (2, 3) or scale == 0:
            raise _fail(op, f"dimensions must be 2 or 3 and scale non-zero, got {dims} and {scale}")
        if x.rank != 4 or x.shape[0] != 1 or x.shape[3] % dims:
            raise _fail(op, f"landmarks must have shape [1, H, W, C] with C a multiple of {dims}, got {list(x.shape)}")
    shape = list(x.shape)
    n = int(np.prod(shape)) // dims
    pts = b.reshape(x, [n, dims])
    m00, m01, _, m03, m10, m11, _, m13 = _matrix_rows(b, m)
    if scale != 1.0:
        m03, m13 = b.mul(m03, _const(b, scale)), b.mul(m13, _const(b, scale))
    px = b.slice(pts, [0, 0], [n, 1])
    py = b.slice(pts, [0, 1], [n, 1])
    ox = b.add(b.add(b.mul(m00, px), b.mul(m01, py)), m03)
    oy = b.add(b.add(b.mul(m10, px), b.mul(m11, py)), m13)
    parts = [ox, oy] + ([b.slice(pts, [0, 2], [n, 1])] if dims == 3 else [])
    return b.reshape(b.concat(parts, 1), shape)


CONVERTERS = {
    "Landmarks2TransformMatrix": landmarks_to_transform_matrix,
    "TransformTensorBilinear": transform_tensor_bilinear,
    "TransformLandmarks": transform_landmarks,
}
