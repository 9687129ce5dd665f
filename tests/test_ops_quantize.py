"""quantize_linear / dequantize_linear against numpy, per-tensor, per-axis and blockwise."""

import numpy as np
import pytest
from helpers import run_graph

import mltensor

NP = mltensor.dtypes.NUMPY
RANGE = {"uint8": (0, 255), "int8": (-128, 127), "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1)}


def _check(got, want, **tol):
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if tol:
        np.testing.assert_allclose(got, want, **tol)
    else:
        np.testing.assert_array_equal(got, want)


def _expand(s, shape):
    for axis, (n, m) in enumerate(zip(shape, s.shape)):
        s = np.repeat(s, n // m, axis=axis)
    return s


def ref_quantize(x, scale, zp):
    s = _expand(scale.astype(np.float32), x.shape)
    z = _expand(zp.astype(np.float64), x.shape)
    lo, hi = RANGE[mltensor.dtypes.normalize(zp.dtype)]
    q = np.round(x.astype(np.float32) / s).astype(np.float64) + z
    return np.clip(q, lo, hi).astype(zp.dtype)


def ref_dequantize(x, scale, zp):
    s = _expand(scale.astype(np.float32), x.shape)
    z = _expand(zp.astype(np.int64), x.shape)
    return ((x.astype(np.int64) - z).astype(np.float32) * s).astype(scale.dtype)


def _run(ctx, op, x, scale, zp):
    b = mltensor.MLGraphBuilder(ctx)
    arrays = {"x": x, "s": scale, "z": zp}
    ins = {n: b.input(n, data_type=mltensor.dtypes.normalize(a.dtype), shape=a.shape) for n, a in arrays.items()}
    y = getattr(b, op)(ins["x"], ins["s"], ins["z"])
    return run_graph(ctx, {"y": y}, arrays, b)["y"]


SCALE_SHAPES = {"tensor": (1, 1, 1), "axis": (1, 6, 1), "block": (2, 3, 2), "full": (2, 6, 4)}


@pytest.mark.parametrize("qt", ["uint8", "int8", "int32", "uint32"])
@pytest.mark.parametrize("ft", ["float32", "float16"])
@pytest.mark.parametrize("kind", list(SCALE_SHAPES))
def test_quantize_linear(ctx, rng, qt, ft, kind):
    x = (rng.standard_normal((2, 6, 4)) * 60).astype(ft)
    x.flat[:4] = [0.5, 1.5, 2.5, -2.5]  # ties round to even
    scale = rng.uniform(0.25, 1.0, SCALE_SHAPES[kind]).astype(ft)
    scale.flat[0] = 1.0
    lo, hi = RANGE[qt]
    zp = rng.integers(max(lo, -20), min(hi, 20) + 1, SCALE_SHAPES[kind]).astype(NP[qt])
    zp.flat[0] = 0
    got = _run(ctx, "quantize_linear", x, scale, zp)
    _check(got, ref_quantize(x, scale, zp))
    if kind == "tensor":
        assert list(got.flat[:4]) == [0, 2, 2, max(lo, -2)]


def test_quantize_saturates(ctx):
    x = np.array([[-1e6, -300, -129, 300, 1e6, 254.6]], np.float32)
    one = np.ones((1, 1), np.float32)
    for qt in ("uint8", "int8", "int32", "uint32"):
        got = _run(ctx, "quantize_linear", x * (1e4 if qt.endswith("32") else 1), one, np.zeros((1, 1), NP[qt]))
        _check(got, ref_quantize(x * (1e4 if qt.endswith("32") else 1), one, np.zeros((1, 1), NP[qt])))


@pytest.mark.parametrize("qt", ["uint8", "int8", "int32", "uint32"])
@pytest.mark.parametrize("ft", ["float32", "float16"])
@pytest.mark.parametrize("kind", list(SCALE_SHAPES))
def test_dequantize_linear(ctx, rng, qt, ft, kind):
    lo, hi = RANGE[qt]
    x = rng.integers(max(lo, -128), min(hi, 255) + 1, (2, 6, 4)).astype(NP[qt])
    scale = rng.uniform(0.01, 2.0, SCALE_SHAPES[kind]).astype(ft)
    zp = rng.integers(max(lo, -20), min(hi, 20) + 1, SCALE_SHAPES[kind]).astype(NP[qt])
    got = _run(ctx, "dequantize_linear", x, scale, zp)
    _check(got, ref_dequantize(x, scale, zp), rtol=1e-3 if ft == "float16" else 1e-6, atol=0)


def test_round_trip_fuses_with_neighbours(ctx, rng):
    # quantize -> dequantize of an int8 tensor reproduces values on the grid
    x = (rng.integers(-100, 100, (4, 8)) * 0.5).astype(np.float32)
    scale = np.full((1, 8), 0.5, np.float32)
    zp = np.zeros((1, 8), np.int8)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=x.shape)
    s, z = b.constant(scale), b.constant(zp)
    y = b.dequantize_linear(b.quantize_linear(xi, s, z), s, z)
    _check(run_graph(ctx, {"y": y}, {"x": x}, b)["y"], x)


def test_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 6])
    s = b.input("s", data_type="float32", shape=[2, 3])
    z = b.input("z", data_type="uint8", shape=[2, 3])
    assert b.quantize_linear(x, s, z).data_type == "uint8"
    with pytest.raises(TypeError, match="blockwise"):
        b.quantize_linear(
            x, b.input("s4", data_type="float32", shape=[4, 4]), b.input("z4", data_type="uint8", shape=[4, 4])
        )
    with pytest.raises(TypeError, match="rank"):
        b.quantize_linear(x, b.input("s1", data_type="float32", shape=[6]), b.input("z1", data_type="uint8", shape=[6]))
    with pytest.raises(TypeError, match="zero_point"):
        b.quantize_linear(x, s, b.input("zf", data_type="float32", shape=[2, 3]))
    with pytest.raises(TypeError, match="zero_point"):
        b.quantize_linear(x, s, b.input("z2", data_type="uint8", shape=[1, 3]))
    q = b.input("q", data_type="int8", shape=[4, 6])
    assert b.dequantize_linear(q, s, b.input("zq", data_type="int8", shape=[2, 3])).data_type == "float32"
    with pytest.raises(TypeError, match="dequantize_linear"):
        b.dequantize_linear(q, s, z)  # zero point type differs from input
    with pytest.raises(TypeError, match="dequantize_linear"):
        b.dequantize_linear(x, s, z)  # float input
