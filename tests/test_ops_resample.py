"""resample2d against an exact (fractions) numpy reference of the spec's formulas, the spec's own
example, and ONNX's reference Resize for the Python-extension coordinate transforms."""

import math
from fractions import Fraction

import numpy as np
import pytest
from helpers import run_graph

import mltensor


def _coord(transform, o, n_in, n_out):
    if transform == "half_pixel" or (transform == "pytorch_half_pixel" and n_out > 1):
        x = (o + Fraction(1, 2)) * Fraction(n_in, n_out) - Fraction(1, 2)
    elif transform == "align_corners":
        x = Fraction(o * (n_in - 1), n_out - 1) if n_out > 1 else Fraction(0)
    elif transform == "asymmetric":
        x = Fraction(o * n_in, n_out)
    else:  # pytorch_half_pixel with one output
        x = Fraction(0)
    return min(max(x, Fraction(0)), Fraction(n_in - 1))


def _round(x, rounding):
    return {
        "round_prefer_floor": lambda: math.ceil(x - Fraction(1, 2)),
        "round_prefer_ceil": lambda: math.floor(x + Fraction(1, 2)),
        "floor": lambda: math.floor(x),
        "ceil": lambda: math.ceil(x),
    }[rounding]()


def _taps(mode, transform, rounding, n_in, n_out):
    """Per output index: list of (input index, weight)."""
    taps = []
    for o in range(n_out):
        x = _coord(transform, o, n_in, n_out)
        if mode == "nearest-neighbor":
            taps.append([(_round(x, rounding), 1.0)])
        else:
            x0 = math.floor(x)
            t = float(x - x0)
            taps.append([(x0, 1.0 - t), (min(x0 + 1, n_in - 1), t)])
    return taps


def reference(x, out_shape, axes, mode="nearest-neighbor", transform="half_pixel", rounding="round_prefer_floor"):
    x = x.astype(np.float64)
    h, w = axes
    th = _taps(mode, transform, rounding, x.shape[h], out_shape[h])
    tw = _taps(mode, transform, rounding, x.shape[w], out_shape[w])
    # separable: resample h, then w (move the axes last for indexing convenience)
    xt = np.moveaxis(x, (h, w), (-2, -1))
    tmp = np.stack([sum(wt * xt[..., i, :] for i, wt in taps) for taps in th], axis=-2)
    res = np.stack([sum(wt * tmp[..., j] for j, wt in taps) for taps in tw], axis=-1)
    return np.moveaxis(res, (-2, -1), (h, w))


def _run(ctx, xv, dt="float32", **opts):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=xv.shape)
    y = b.resample2d(x, **opts)
    return y.shape, run_graph(ctx, {"y": y}, {"x": xv}, b)["y"]


def _check(got, want, dt="float32", tol=1e-5):
    assert got.shape == want.shape
    assert got.dtype == np.dtype(dt)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


# -- spec semantics -----------------------------------------------------------------------------


def test_spec_linear_example(ctx):
    row = np.array([0, 1, 2, 3], np.float32)
    xv = np.stack([row, row, row + 12, row + 12]).reshape(1, 1, 4, 4)
    shape, got = _run(ctx, xv, mode="linear", sizes=[8, 8])
    first = [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3]
    want = np.array([np.array(first) + r for r in (0, 0, 0, 3, 9, 12, 12, 12)], np.float32).reshape(1, 1, 8, 8)
    assert shape == (1, 1, 8, 8)
    _check(got, want.astype(np.float64))


@pytest.mark.parametrize("mode", ["nearest-neighbor", "linear"])
@pytest.mark.parametrize(
    "shape,opts",
    [
        ((1, 2, 3, 4), {}),  # defaults: scales [1, 1] -> identity
        ((1, 2, 3, 4), {"scales": [2.0, 2.0]}),
        ((2, 1, 5, 7), {"scales": [0.5, 0.6]}),  # downsample, odd sizes, floor(in * scale)
        ((1, 3, 4, 4), {"scales": [1.5, 0.75]}),
        ((1, 2, 3, 5), {"sizes": [7, 2]}),
        ((1, 2, 3, 5), {"sizes": [4, 9], "scales": [0.1, 0.1]}),  # sizes override scales
        ((1, 6, 5, 3), {"sizes": [9, 4], "axes": [1, 2]}),  # NHWC
        ((3, 4, 2, 2), {"sizes": [5, 6], "axes": [0, 1]}),
        ((2, 3, 4, 5), {"sizes": [3, 7], "axes": [3, 1]}),  # any two distinct axes, in either order
    ],
)
def test_resample2d(ctx, rng, mode, shape, opts):
    xv = rng.standard_normal(shape).astype(np.float32)
    axes = opts.get("axes", [2, 3])
    out_shape = list(shape)
    for k, a in enumerate(axes):
        out_shape[a] = opts["sizes"][k] if "sizes" in opts else math.floor(shape[a] * opts.get("scales", [1, 1])[k])
    got_shape, got = _run(ctx, xv, mode=mode, **opts)
    assert got_shape == tuple(out_shape)
    _check(got, reference(xv, out_shape, axes, mode))


def test_nearest_ties_round_down(ctx):
    # in 4 -> out 2: x = (o + 0.5) * 2 - 0.5 = 0.5 and 2.5, exact ties: the spec's ceil(x - 0.5)
    # picks 0 and 2; the round_prefer_ceil extension picks 1 and 3
    xv = np.arange(4, dtype=np.float32).reshape(1, 1, 1, 4)
    _, got = _run(ctx, xv, sizes=[1, 2])
    _check(got, np.array([0, 2], np.float64).reshape(1, 1, 1, 2))
    _, got = _run(ctx, xv, sizes=[1, 2], nearest_rounding="round_prefer_ceil")
    _check(got, np.array([1, 3], np.float64).reshape(1, 1, 1, 2))


def test_float16(ctx, rng):
    xv = rng.standard_normal((1, 2, 5, 4)).astype(np.float16)
    _, got = _run(ctx, xv, dt="float16", mode="linear", scales=[1.6, 2.0])
    want = reference(xv, [1, 2, 8, 8], [2, 3], "linear")
    _check(got, want.astype(np.float16).astype(np.float64), "float16", tol=2e-3)


# -- Python extensions: coordinate transforms and rounding (importers) ---------------------------


@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize(
    "mode,rounding",
    [
        ("linear", "round_prefer_floor"),
        ("nearest-neighbor", "round_prefer_floor"),
        ("nearest-neighbor", "round_prefer_ceil"),
        ("nearest-neighbor", "floor"),
        ("nearest-neighbor", "ceil"),
    ],
)
def test_coordinate_transformations(ctx, rng, transform, mode, rounding):
    xv = rng.standard_normal((1, 2, 5, 6)).astype(np.float32)
    sizes = [8, 1] if transform == "pytorch_half_pixel" else [8, 4]
    _, got = _run(ctx, xv, mode=mode, sizes=sizes, coordinate_transformation=transform, nearest_rounding=rounding)
    _check(got, reference(xv, [1, 2] + sizes, [2, 3], mode, transform, rounding))


@pytest.mark.parametrize(
    "mode,transform,nearest_mode",
    [
        ("linear", "half_pixel", "round_prefer_floor"),
        ("linear", "align_corners", "round_prefer_floor"),
        ("linear", "asymmetric", "round_prefer_floor"),
        ("linear", "pytorch_half_pixel", "round_prefer_floor"),
        ("nearest", "half_pixel", "round_prefer_floor"),
        ("nearest", "asymmetric", "floor"),
        ("nearest", "align_corners", "round_prefer_ceil"),
        ("nearest", "half_pixel", "ceil"),
    ],
)
def test_matches_onnx_reference_resize(ctx, rng, mode, transform, nearest_mode):
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    xv = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    sizes = [1, 2, 9, 4]
    node = helper.make_node(
        "Resize",
        ["X", "", "", "S"],
        ["Y"],
        mode=mode,
        coordinate_transformation_mode=transform,
        nearest_mode=nearest_mode,
    )
    graph = helper.make_graph(
        [node],
        "r",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, xv.shape)],
        [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor("S", onnx.TensorProto.INT64, [4], sizes)],
    )
    want = ReferenceEvaluator(helper.make_model(graph)).run(None, {"X": xv})[0]
    wmode = "linear" if mode == "linear" else "nearest-neighbor"
    _, got = _run(
        ctx, xv, mode=wmode, sizes=sizes[2:], coordinate_transformation=transform, nearest_rounding=nearest_mode
    )
    _check(got, want.astype(np.float64))


def test_tflite_bilinear_flags(ctx, rng):
    # TFLite RESIZE_BILINEAR: align_corners -> x = o*(in-1)/(out-1); neither flag -> x = o*in/out
    xv = rng.standard_normal((1, 4, 3, 2)).astype(np.float32)  # NHWC
    for transform in ("align_corners", "asymmetric", "half_pixel"):
        _, got = _run(ctx, xv, mode="linear", sizes=[8, 6], axes=[1, 2], coordinate_transformation=transform)
        _check(got, reference(xv, [1, 8, 6, 2], [1, 2], "linear", transform))


# -- validation ---------------------------------------------------------------------------------


def test_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 2, 3, 4])
    cases = [
        ({"mode": "cubic"}, r"mode must be one of"),
        ({"scales": [2.0]}, r"scales must have 2 values"),
        ({"scales": [2.0, 0.0]}, r"scales must be positive"),
        ({"scales": [2.0, -1.0]}, r"scales must be positive"),
        ({"scales": [2.0, float("nan")]}, r"scales must be positive"),
        ({"scales": [2.0, "1"]}, r"scales must be numbers"),
        ({"scales": [0.1, 1.0]}, r"output size along axis 2 is 0"),
        ({"sizes": [2, 0]}, r"sizes must be positive"),
        ({"sizes": [2, 3, 4]}, r"sizes must have 2 values"),
        ({"sizes": [2, -3]}, r"sizes"),
        ({"axes": [2, 2]}, r"axes must be two different dimensions"),
        ({"axes": [3, 4]}, r"axes must be two different dimensions"),
        ({"axes": [1]}, r"axes must have 2 values"),
        ({"coordinate_transformation": "tf_crop_and_resize"}, r"coordinate_transformation must be one of"),
        ({"nearest_rounding": "round"}, r"nearest_rounding must be one of"),
    ]
    for opts, msg in cases:
        with pytest.raises(TypeError, match=r"\[resample2d\] " + msg):
            b.resample2d(x, **opts)
    with pytest.raises(TypeError, match=r"\[resample2d\] input rank must be 4, got 3"):
        b.resample2d(b.input("r", data_type="float32", shape=[2, 3, 4]))
    with pytest.raises(TypeError, match=r"\[resample2d\] input data type int32 is not supported"):
        b.resample2d(b.input("i", data_type="int32", shape=[1, 1, 2, 2]))
    assert ctx.op_support_limits()["resample2d"]["input"]["rank_range"] == {"min": 4, "max": 4}


# Size pairs whose source coordinates start left of 0 (upsampling: negative numerators), land
# exactly on ties, run past the last sample, or collapse to one sample: the boundaries of the
# integer rounding in the kernel (signed division of negative numerators misread whole rows on
# NVIDIA's driver, where lavapipe was right).
_SIZE_PAIRS = [(1, 1), (1, 4), (2, 5), (2, 6), (3, 1), (3, 8), (4, 2), (4, 6), (5, 9), (7, 3), (8, 3), (9, 16)]


@pytest.mark.parametrize("transform", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("rounding", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_nearest_rounding_boundaries(ctx, rng, transform, rounding):
    b = mltensor.MLGraphBuilder(ctx)
    outs, feeds, want = {}, {}, {}
    for k in range(0, len(_SIZE_PAIRS), 2):
        (hi, ho), (wi, wo) = _SIZE_PAIRS[k], _SIZE_PAIRS[k + 1]
        xv = rng.permutation(2 * hi * wi).astype(np.float32).reshape(1, 2, hi, wi)  # distinct values
        x = b.input(f"x{k}", data_type="float32", shape=list(xv.shape))
        outs[f"y{k}"] = b.resample2d(x, sizes=[ho, wo], coordinate_transformation=transform, nearest_rounding=rounding)
        feeds[f"x{k}"] = xv
        want[f"y{k}"] = reference(xv, [1, 2, ho, wo], [2, 3], "nearest-neighbor", transform, rounding)
    got = run_graph(ctx, outs, feeds, b)
    for name in outs:
        _check(got[name], want[name], tol=0)
