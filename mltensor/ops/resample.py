"""resample2d: nearest-neighbor and bilinear resampling of two dimensions of a 4-D tensor.

The spec's coordinate transform is half-pixel with scale = outputSize / inputSize:
    x = (o + 0.5) * inputSize / outputSize - 0.5, clamped to [0, inputSize - 1]
nearest-neighbor takes ceil(x - 0.5) (ties go down), linear interpolates between floor(x) and the
next sample. The kernel evaluates x as an exact rational num/den (num = A*o + B, den = D, all
integers reduced by their gcd), so nearest-neighbor rounding is exact integer arithmetic: ties
really are ties, as in the spec's real-number formulas, and no float error can move a sample.

Python extensions (keyword-only, defaults are the spec's behaviour), for the importers to map
ONNX Resize and TFLite RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR faithfully:
- coordinate_transformation: "half_pixel" (spec), "pytorch_half_pixel" (half_pixel, but 0 when
  the output size is 1), "align_corners" (x = o * (in - 1) / (out - 1)), "asymmetric"
  (x = o * in / out).
- nearest_rounding: "round_prefer_floor" (spec), "round_prefer_ceil", "floor", "ceil".
  TFLite half_pixel_centers nearest is half_pixel + round_prefer_ceil; TFLite's default nearest is
  asymmetric + floor; align_corners nearest is align_corners + round_prefer_ceil.

Dynamic dimensions (mltensor/dynamic/): every dimension of the input may be a size known at
dispatch. With `sizes`, the output sizes are static; with `scales`, an output size is
floor(size * scale) as a size expression: size * k for an integer scale, (size * p) // q for a
scale p / q (a float's exact ratio, q a power of two) where size * p fits in 32 bits for the
largest size (else NotSupportedError: give sizes); an output size that is 0 for small sizes is
checked by every dispatch. The coordinate map of a resampled dimension is then, where the output
size is an integer multiple k of the input size (integer scales), the static build's constants
(they depend on k only), else computed in the kernel from the sizes read at dispatch with the
same gcd reduction as _rational (resample_at.wgsl rs_rat), so every size samples exactly as a
static build at that size does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import cdiv, exact_div, high, is_static, wgsl
from ..dynamic import kernels as dynamic_kernels
from ..errors import NotSupportedError
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, store_fn
from ._index import FAST_DIV_MAX, index_lines, row_strides
from ._checks import check_support
from .elementwise import GRID_WX
from .movement import int_sequence, output_shape
from .reduce import groups

DYNAMIC_OPS = frozenset({"resample2d"})

MODES = ("nearest-neighbor", "linear")
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
ROUNDINGS = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _rational(transform, n_in, n_out):
    """(A, B, D): the source coordinate of output index o is (A*o + B) / D, before clamping."""
    if transform in ("half_pixel", "pytorch_half_pixel"):
        if transform == "pytorch_half_pixel" and n_out == 1:
            return 0, 0, 1
        g = math.gcd(n_in, n_out)
        i, o = n_in // g, n_out // g
        # ((2o + 1) * in - out) / (2 * out)
        return 2 * i, i - o, 2 * o
    if transform == "align_corners":
        if n_out == 1:
            return 0, 0, 1
        g = math.gcd(n_in - 1, n_out - 1) or 1
        return (n_in - 1) // g, 0, (n_out - 1) // g
    g = math.gcd(n_in, n_out)
    return n_in // g, 0, n_out // g


def _nearest_floor(A, B, D, rounding):
    """(A2, B2, D2) with the nearest sample of output index o = floor((A2*o + B2) / D2), D2 > 0,
    for the source coordinate x = (A*o + B) / D. Every rounding becomes one floor of a quotient,
    so the kernel divides only non-negative numbers: a negative numerator means a sample left of
    0, which clamps to 0. (The previous floor/ceil division used WGSL's `%` on negative i32s:
    on an H100 with NVIDIA's Vulkan driver 580 and naga, `x % c` for a negative x and a constant
    c that is not a power of two gave the unsigned remainder (-299 % 3 = 2), so whole rows and
    columns came from the wrong place; lavapipe was right.)"""
    if rounding == "round_prefer_floor":  # ceil(x - 1/2) = floor((2(A o + B) - D + 2D - 1) / 2D)
        return 2 * A, 2 * B + D - 1, 2 * D
    if rounding == "round_prefer_ceil":  # floor(x + 1/2)
        return 2 * A, 2 * B + D, 2 * D
    if rounding == "floor":
        return A, B, D
    return A, B + D - 1, D  # ceil(x) = floor((A o + B + D - 1) / D)


# rs_rat's transform codes (shaders/resample_at.wgsl)
_KIND = {"half_pixel": 0, "pytorch_half_pixel": 1, "align_corners": 2, "asymmetric": 3}


def _structural(transform, n_in, n_out):
    """(A, B, D) of _rational for sizes known only at dispatch, where they are the same for every
    size (an output size k times the input size): the static build's constants, else None.
    pytorch_half_pixel and align_corners at k = 1 differ from these only where the output size
    is 1, whose single sample (o = 0) is at coordinate 0 either way."""
    k = exact_div(n_out, n_in)
    if not isinstance(k, int) or k < 1:
        return None
    if transform == "align_corners":
        return (1, 0, 1) if k == 1 else None
    return _rational("half_pixel" if transform == "pytorch_half_pixel" else transform, 1, k)


def _nearest_wgsl(r, rounding):
    """_nearest_floor of the rational held in the WGSL vec3<i32> `r`: (A2, B2 as i32, D2 as u32)
    WGSL expressions."""
    A, B, D = f"{r}.x", f"{r}.y", f"{r}.z"
    if rounding == "round_prefer_floor":
        return f"2 * {A}", f"2 * {B} + {D} - 1", f"u32(2 * {D})"
    if rounding == "round_prefer_ceil":
        return f"2 * {A}", f"2 * {B} + {D}", f"u32(2 * {D})"
    if rounding == "floor":
        return A, B, f"u32({D})"
    return A, f"{B} + {D} - 1", f"u32({D})"


def resample_params(kc, node, out, src):
    """Parameters of shaders/resample_at.wgsl (rs_index / rs_linear) for resample2d node `node`
    writing `out`, its input bound as `src`: shared by its own kernel and by a convolution that
    resamples its input as it loads it (conv.py, the "resample" prologue). Sizes known only at
    dispatch (Syms) are read there; a resampled dimension whose coordinate map depends on them
    gets `{h,w}_dyn` (rs_rat's arguments) and WGSL expressions of that map."""
    x = node.inputs[0]
    a = node.attrs
    ax_h, ax_w = a["axes"]
    rs = {
        "src": src,
        "out_shape": list(out.shape),
        "in_strides": row_strides(x.shape),
        "axes": [ax_h, ax_w],
        "mode": a["mode"],
        "ST": store_fn(kc.wtype(x)),  # linear: f32 result stored as f16
    }
    if not is_static(out.shape):  # the output coordinates as chained quotients
        fast = high(math.prod(out.shape)) < FAST_DIV_MAX
        rs["coords"] = "\n".join(index_lines("i", ("c0", "c1", "c2", "c3"), list(out.shape), fast))
    for tag, ax in (("h", ax_h), ("w", ax_w)):
        n_in, n_out = x.shape[ax], out.shape[ax]
        rat = None if is_static((n_in, n_out)) else _structural(a["coordinate_transformation"], n_in, n_out)
        if rat is None and not is_static((n_in, n_out)):
            # computed in the kernel (rs_rat): every integer it forms is at most a few times
            # in * out, as the unreduced ratio's
            if 8 * (high(n_in) + 1) * (high(n_out) + 1) >= 2**31:
                raise NotSupportedError(
                    f"[resample2d] sizes up to {high(n_in)} -> {high(n_out)} are too large "
                    "for a coordinate map computed at dispatch"
                )
            r = f"r{tag}"
            rs[f"{tag}_dyn"] = [_KIND[a["coordinate_transformation"]], wgsl(n_in), wgsl(n_out)]
            rs[f"{tag}_rat"] = [f"{r}.x", f"{r}.y", f"{r}.z"]
            rs[f"{tag}_near"] = list(_nearest_wgsl(r, a["nearest_rounding"]))
            rs[f"{tag}_last"] = n_in - 1
            continue
        A, B, D = rat or _rational(a["coordinate_transformation"], n_in, n_out)
        rs[f"{tag}_rat"] = [A, B, D]
        rs[f"{tag}_near"] = _nearest_floor(A, B, D, a["nearest_rounding"])
        # every integer the kernel forms (A2*o + B2 below, A*o + B for linear) must fit in i32
        A2, B2, D2 = rs[f"{tag}_near"]
        if max(abs(A2) * high(n_out) + abs(B2) + D2, abs(A) * high(n_out) + abs(B)) >= 2**31:
            raise NotImplementedError(f"[resample2d] sizes {x.shape[ax]} -> {out.shape[ax]} are too large")
        rs[f"{tag}_last"] = x.shape[ax] - 1
    return rs


def _lower_resample2d(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    a = node.attrs
    name = (
        f"resample2d_{'nearest' if a['mode'] == 'nearest-neighbor' else 'linear'}_"
        + "x".join(map(str, x.shape))
        + "_to_"
        + "x".join(map(str, out.shape))
        + f"_{kc.wtype(x)}"
    )
    bindings = (Binding("src", kc.wtype(x)), Binding("dst", kc.wtype(out), True))
    rs = resample_params(kc, node, out, "src")
    grid = _grid(kc, x, out, rs)
    if grid is not None:
        params, P, groups_ = grid
        kc.launch(Kernel(name, "resample.wgsl", params, bindings, sizes=P.values), [x, out], groups_)
        return
    kernel = Kernel(name, "resample.wgsl", {"n": out.size, "rs": rs}, bindings)
    kc.launch(kernel, [x, out], groups("resample2d", cdiv(out.size, WORKGROUP)))


def _grid(kc, x, out, rs):
    """(template parameters, SizeParams, workgroup counts) of a grid launch, or None. An NCHW
    resampling of the last two axes (the default) with static sizes runs as a grid: thread (x, y)
    of workgroup (gx, gy, z) is output column x of row y of plane z, so no thread divides its
    index; the sizes and strides are launch parameters (every resampling of one mode, transform
    and scale shares a pipeline). A division by a size read at dispatch would have made the flat
    kernel 1.6x slower on lavapipe (bench/test_bench_startup.py)."""

    if rs["axes"] != [2, 3] or not is_static(tuple(x.shape) + tuple(out.shape)):
        return None
    P = kc.size_params()
    n, c, ih, iw = x.shape
    oh, ow = out.shape[2:]
    wx = GRID_WX
    wy = WORKGROUP // wx
    counts = (-(-ow // wx), -(-oh // wy), n * c)
    if not P or max(counts) > dynamic_kernels.MAX_GROUPS:
        return None
    # The coordinate maps' integers stay constants: the nearest sample divides by D (a division
    # by a value read at dispatch made the kernel 2x slower), and they depend only on the scale.
    rs = dict(rs, out_shape=None, in_strides=[0, 0, P(iw), 1])  # (b.x: the plane's offset, from the grid)
    for tag in ("h", "w"):
        rs[tag + "_last"] = P(rs[tag + "_last"])
        del rs[tag + ("_rat" if rs["mode"] == "nearest-neighbor" else "_near")]  # (unread)
    params = {"rs": rs, "rs_grid": {"wx": wx, "wy": wy, "sx": P(ow), "sy": P(oh), "plane": P(ih * iw)}}
    return params, P, counts


register(
    "resample2d",
    {"input": dtypes.FLOATS, "output": dtypes.FLOATS},
    ranks={"input": (4, 4)},
    lower=_lower_resample2d,
)


def _scales(scales):
    if isinstance(scales, (str, bytes)) or not hasattr(scales, "__iter__"):
        raise TypeError(f"[resample2d] scales must be a sequence of 2 numbers, got {scales!r}")
    vals = list(scales)
    if len(vals) != 2:
        raise TypeError(f"[resample2d] scales must have 2 values, got {len(vals)}")
    out = []
    for v in vals:
        if isinstance(v, (bool, str, bytes)) or not hasattr(v, "__float__"):
            raise TypeError(f"[resample2d] scales must be numbers, got {vals!r}")
        import numpy as np

        f = float(np.float32(v))  # IDL sequence<float>
        if not f > 0 or math.isinf(f):
            raise TypeError(f"[resample2d] scales must be positive and finite, got {vals!r}")
        out.append(f)
    return out


def _scaled(n, scale):
    """floor(n * scale) for an input size n: an int for a static one (the float product, as
    always), else a size expression equal to it for every size."""
    if isinstance(n, int):
        return math.floor(n * scale)
    p, q = scale.as_integer_ratio()  # exact: q is a power of two
    if high(n) * p >= 2**32:
        raise NotSupportedError(
            f"[resample2d] scale {scale} of a dynamic input size {n}: floor(size * scale) is not exact in "
            "32-bit size arithmetic for its largest sizes; give sizes, or an integer or simpler scale"
        )
    return (n * p) // q


@builder_op(renamed={"x": "input"})
def resample2d(
    self: Any,
    input: MLOperand,
    *,
    mode: str = "nearest-neighbor",
    scales: Sequence[float] | None = None,
    sizes: Sequence[int] | None = None,
    axes: Sequence[int] | None = None,
    coordinate_transformation: str = "half_pixel",
    nearest_rounding: str = "round_prefer_floor",
    label: str | None = None,
) -> MLOperand:
    """Resample two dimensions (`axes`, default [2, 3]) of a 4-D input by `scales` (two floats) or
    to `sizes` (two ints; wins over scales). mode: "nearest-neighbor" or "linear" (bilinear).

    Python extensions (used by the importers; defaults are the spec's):
    coordinate_transformation "half_pixel", "pytorch_half_pixel", "align_corners" or
    "asymmetric"; nearest_rounding "round_prefer_floor", "round_prefer_ceil", "floor" or "ceil".
    Nearest sampling positions are computed in exact integer arithmetic."""
    # IDL: MLOperand resample2d(MLOperand input, optional MLResample2dOptions options = {});
    # Python extensions: coordinate_transformation, nearest_rounding (see the module docstring).
    self._operand(input, "resample2d", "input")
    check_support("resample2d", input=input)
    if mode not in MODES:
        raise TypeError(f"[resample2d] mode must be one of {', '.join(MODES)}, got {mode!r}")
    if coordinate_transformation not in TRANSFORMS:
        raise TypeError(
            f"[resample2d] coordinate_transformation must be one of {', '.join(TRANSFORMS)}, "
            f"got {coordinate_transformation!r}"
        )
    if nearest_rounding not in ROUNDINGS:
        raise TypeError(
            f"[resample2d] nearest_rounding must be one of {', '.join(ROUNDINGS)}, got {nearest_rounding!r}"
        )
    scales = [1.0, 1.0] if scales is None else _scales(scales)
    if sizes is not None:
        sizes = int_sequence("resample2d", "sizes", sizes, length=2)
        if 0 in sizes:
            raise TypeError(f"[resample2d] sizes must be positive, got {sizes}")
    if axes is None:
        axes = [2, 3]
    else:
        axes = int_sequence("resample2d", "axes", axes, length=2)
        if axes[0] == axes[1] or any(a >= input.rank for a in axes):
            raise TypeError(
                f"[resample2d] axes must be two different dimensions below the input's rank {input.rank}, got {axes}"
            )
    shape = list(input.shape)
    for k, ax in enumerate(axes):
        size = sizes[k] if sizes is not None else _scaled(input.shape[ax], scales[k])
        if high(size) < 1:
            raise TypeError(
                f"[resample2d] output size along axis {ax} is {size} (input size {input.shape[ax]} * "
                f"scale {scales[k]}); it must be at least 1"
            )
        shape[ax] = size
    shape = output_shape(self, "resample2d", input.data_type, shape)
    attrs = {
        "mode": mode,
        "scales": scales,
        "sizes": sizes,
        "axes": axes,
        "coordinate_transformation": coordinate_transformation,
        "nearest_rounding": nearest_rounding,
    }
    return self._emit1("resample2d", [input], attrs, input.data_type, shape, label)
