"""ONNX Resize / Upsample."""

import math
from fractions import Fraction

import numpy as np

from ...dynamic.dims import Sym
from ..errors import unsupported
from ._helpers import const, is_float, norm_axis, prod, X
from ._registry import op

# -- resize ----------------------------------------------------------------------------------------


def _scaled(n, v):
    """ONNX's output size floor(n * scale). With a dynamic size n (a Sym) only a scale that is a
    small exact fraction (2.0, 0.5, 1.5: the upsampling of detectors and FPNs) keeps one build
    for every size: floor(n * p / q) exactly, as the float product gives for such scales."""
    if not isinstance(n, Sym):
        return int(math.floor(n * v))
    f = Fraction(v)
    if f <= 0 or f.denominator > 64 or f.numerator > 1 << 16:
        unsupported(
            f"Resize with scale {v} of a dynamic dimension (only small exact fractions "
            "such as 2, 0.5 or 1.5 keep one build for every size)"
        )
    return n * f.numerator // f.denominator


def _whole(n, v):
    """n * scale is a whole number: WebNN's resample maps coordinates with out / in, ONNX with the
    given scale; they agree where that ratio is the scale (for a dynamic n: an integer scale)."""
    if isinstance(n, Sym):
        return float(v).is_integer()
    return float(v * n).is_integer()


@op(
    "Resize",
    "Upsample",
    attrs=(
        "mode",
        "coordinate_transformation_mode",
        "nearest_mode",
        "cubic_coeff_a",
        "exclude_outside",
        "extrapolation_value",
        "antialias",
        "axes",
        "keep_aspect_ratio_policy",
        "scales",
        "height_scale",
        "width_scale",
    ),
)
def _resize(im, node, ins, attrs):
    x = X(im, ins[0])
    r = len(x.shape)
    mode = attrs.get("mode", "nearest")
    if isinstance(mode, bytes):
        mode = mode.decode()
    scales = sizes = None
    if node.op_type == "Upsample" or im.cur_opset < 11:
        if "scales" in attrs:
            scales = list(attrs["scales"])
        elif "height_scale" in attrs:
            scales = [1.0, 1.0, attrs["height_scale"], attrs["width_scale"]]
        else:
            scales = [float(v) for v in const(im, ins[1], "scales").reshape(-1)]
        ctm = "asymmetric"
        nearest = "floor"
    else:
        sc = ins[2] if len(ins) > 2 else None
        sz = ins[3] if len(ins) > 3 else None
        sc = const(im, sc, "scales") if sc is not None else None
        if sc is not None and sc.size:
            scales = [float(v) for v in sc.reshape(-1)]
        sz = const(im, sz, "sizes") if sz is not None else None
        if sz is not None and sz.size:
            sizes = [int(v) for v in sz.reshape(-1)]
        ctm = attrs.get("coordinate_transformation_mode", "half_pixel")
        nearest = attrs.get("nearest_mode", "round_prefer_floor")
    axes = attrs.get("axes")
    axes = list(range(r)) if axes is None else [norm_axis(a, r) for a in axes]
    full_scales = [1.0] * r
    full_sizes = list(x.shape)
    if sizes is not None:
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            sel = [sizes[i] / x.shape[a] for i, a in enumerate(axes)]
            f = min(sel) if policy == "not_larger" else max(sel)
            sizes = [int(math.floor(x.shape[a] * f + 0.5)) for a in axes]
        for a, v in zip(axes, sizes):
            full_sizes[a] = v
            full_scales[a] = v / x.shape[a]
    elif scales is not None:
        for a, v in zip(axes, scales):
            full_scales[a] = v
            full_sizes[a] = _scaled(x.shape[a], v)
    changed = [a for a in range(r) if full_sizes[a] != x.shape[a] or full_scales[a] != 1.0]
    if not changed:
        return im.b.identity(x)
    if r == 4 and set(changed) <= {2, 3}:
        changed = [2, 3]
    wmode = {"nearest": "nearest-neighbor", "linear": "linear", "bilinear": "linear"}.get(mode)
    ok = wmode is not None and not attrs.get("antialias", 0) and r == 4 and changed == [2, 3]
    if ok and wmode == "linear":
        if ctm == "pytorch_half_pixel" and all(full_sizes[a] > 1 for a in changed):
            ctm = "half_pixel"
        ok = ctm == "half_pixel"
    elif ok:
        integer_up = all(
            float(full_scales[a]).is_integer()
            and full_scales[a] >= 1
            and full_sizes[a] == x.shape[a] * int(full_scales[a])
            for a in changed
        )
        ok = integer_up and (
            (ctm == "asymmetric" and nearest == "floor")
            or (ctm in ("half_pixel", "pytorch_half_pixel") and nearest in ("round_prefer_floor", "round_prefer_ceil"))
        )
    if sizes is None and any(not _whole(x.shape[a], full_scales[a]) for a in changed):
        ok = False  # ONNX maps coordinates with the given scale, WebNN with out/in: differ
    if ok and hasattr(im.b, "resample2d"):
        kw = {"mode": wmode, "axes": changed}
        if sizes is not None:
            kw["sizes"] = [full_sizes[a] for a in changed]
        else:
            kw["scales"] = [float(full_scales[a]) for a in changed]
        return im.b.resample2d(x, **kw)
    # Anything else (cubic, other coordinate modes, antialias, more axes): every ONNX resize
    # mode is separable and linear in the input, so resize axis by axis as a matmul with an
    # interpolation matrix computed at load by the ONNX reference implementation.
    if not is_float(x):
        unsupported(f"{mode} resize of {x.data_type} data")
    roi = None
    if ctm == "tf_crop_and_resize":
        roi = [float(v) for v in const(im, ins[1], "roi").reshape(-1)]
        n = len(roi) // 2
        roi_axes = axes if n == len(axes) else list(range(r))
        roi = {a: (roi[i], roi[i + n]) for i, a in enumerate(roi_axes)}
    y = x
    for a in changed:
        mat, fill = _interp_matrix(
            im,
            node,
            attrs,
            x.shape[a],
            full_sizes[a],
            full_scales[a],
            mode,
            ctm,
            nearest,
            roi and roi.get(a, (0.0, 1.0)),
        )
        y = _apply_along(im, y, a, mat)
        if fill is not None and fill.any():
            shp = [1] * r
            shp[a] = fill.size
            ev = attrs.get("extrapolation_value", 0.0)
            y = im.b.add(y, X(im, (fill * ev).reshape(shp).astype(np.dtype(x.data_type))))
    return y


def _interp_matrix(im, node, attrs, n_in, n_out, scale, mode, ctm, nearest, roi=None):
    """[n_in, n_out] matrix M with resize(v) == v @ M along one axis, and for
    tf_crop_and_resize the 0/1 vector of outputs that take the extrapolation value."""
    from onnx import helper as h

    keep = {k: v for k, v in attrs.items() if k in ("cubic_coeff_a", "exclude_outside", "antialias")}
    roi_arr = np.array([0.0, roi[0], 1.0, roi[1]], dtype=np.float32) if roi else None

    def run(data, extrapolation):
        use_sizes = n_out != int(np.floor(n_in * scale))
        names = ["x", "roi" if roi else "", "" if use_sizes else "scales"] + (["sizes"] if use_sizes else [])
        node2 = h.make_node(
            "Resize",
            names,
            ["y"],
            mode=mode,
            coordinate_transformation_mode=ctm,
            nearest_mode=nearest,
            extrapolation_value=extrapolation,
            **keep,
        )
        args = [data, roi_arr, None if use_sizes else np.array([1.0, scale], dtype=np.float32)]
        if use_sizes:
            args.append(np.array([data.shape[0], n_out], dtype=np.int64))
        (m,) = im.evaluate(node2, args)
        return np.asarray(m, dtype=np.float32)

    saved = im.cur_opset
    im.cur_opset = max(saved, 19 if keep.get("antialias") else 13)
    try:
        m = run(np.eye(n_in, dtype=np.float32), 0.0)
        fill = run(np.zeros((1, n_in), np.float32), 1.0).reshape(-1) if roi else None
    finally:
        im.cur_opset = saved
    return m, fill


def _apply_along(im, x, axis, mat):
    b = im.b
    r = len(x.shape)
    perm = [i for i in range(r) if i != axis] + [axis]
    t = b.transpose(x, permutation=perm) if axis != r - 1 else x
    rest = list(t.shape[:-1])
    y = b.matmul(b.reshape(t, [prod(rest), t.shape[-1]]), X(im, mat.astype(np.dtype(x.data_type))))
    y = b.reshape(y, rest + [mat.shape[1]])
    if axis != r - 1:
        inv = [perm.index(i) for i in range(r)]
        y = b.transpose(y, permutation=inv)
    return y
