"""arg_min, arg_max and cumulative_sum against numpy."""

import numpy as np
import pytest
from helpers import assert_exact, run_graph

import mltensor

NP = mltensor.dtypes.NUMPY


_check = assert_exact


def _one(ctx, arr, fn, dt=None):
    dt = dt or mltensor.dtypes.normalize(arr.dtype)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=arr.shape)
    return run_graph(ctx, {"y": fn(b, x)}, {"x": arr}, b)["y"]


def test_cumulative_sum_spec_examples(ctx):
    x = np.array([1, 2, 3, 4], np.float32)
    cs = lambda **o: (lambda b, v: b.cumulative_sum(v, 0, **o))  # noqa: E731
    _check(_one(ctx, x, cs()), np.array([1, 3, 6, 10], np.float32))
    _check(_one(ctx, x, cs(exclusive=True)), np.array([0, 1, 3, 6], np.float32))
    _check(_one(ctx, x, cs(reversed=True)), np.array([10, 9, 7, 4], np.float32))
    _check(_one(ctx, x, cs(exclusive=True, reversed=True)), np.array([9, 7, 4, 0], np.float32))


@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "uint32", "int64", "uint64", "int8", "uint8"])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_cumulative_sum_axes_types(ctx, rng, dt, axis):
    x = rng.integers(0, 5, size=(3, 4, 5)).astype(NP[dt])
    for excl in (False, True):
        for rev in (False, True):
            got = _one(ctx, x, lambda b, v: b.cumulative_sum(v, axis, exclusive=excl, reversed=rev))
            src = np.flip(x, axis) if rev else x
            want = np.cumsum(src, axis=axis, dtype=NP[dt])
            if excl:
                want = want - src
            if rev:
                want = np.flip(want, axis)
            _check(got, np.ascontiguousarray(want))


def test_cumulative_sum_errors(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match="axis"):
        b.cumulative_sum(x, 2)
    with pytest.raises(TypeError, match="cumulative_sum"):
        b.cumulative_sum(b.input("s", data_type="float32", shape=[]), 0)


@pytest.mark.parametrize("op", ["arg_min", "arg_max"])
@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "uint32", "int64", "uint64", "int8", "uint8"])
def test_arg_min_max_types(ctx, rng, op, dt):
    # small value range: many ties; numpy returns the first index, as we do
    x = rng.integers(0, 4, size=(3, 4, 5)).astype(NP[dt])
    ref = np.argmin if op == "arg_min" else np.argmax
    b = mltensor.MLGraphBuilder(ctx)
    v = b.input("x", data_type=dt, shape=x.shape)
    outs = {}
    for axis in range(3):
        outs[f"a{axis}"] = getattr(b, op)(v, axis)
        outs[f"k{axis}"] = getattr(b, op)(v, axis, keep_dimensions=True, output_data_type="int64")
    res = run_graph(ctx, outs, {"x": x}, b)
    for axis in range(3):
        _check(res[f"a{axis}"], ref(x, axis=axis).astype(np.int32))
        _check(res[f"k{axis}"], ref(x, axis=axis, keepdims=True).astype(np.int64))


def test_arg_max_nan_and_negative(ctx):
    x = np.array([[-5.0, -1.0, -1.0, -7.0], [1.0, np.nan, 3.0, np.nan], [-np.inf, -np.inf, -np.inf, -np.inf]],
                 np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    v = b.input("x", data_type="float32", shape=x.shape)
    res = run_graph(ctx, {"mx": b.arg_max(v, 1), "mn": b.arg_min(v, 1)}, {"x": x}, b)
    _check(res["mx"], np.argmax(x, axis=1).astype(np.int32))
    _check(res["mn"], np.argmin(x, axis=1).astype(np.int32))


def test_arg_errors(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match="axis"):
        b.arg_max(x, 2)
    with pytest.raises(TypeError, match="output_data_type"):
        b.arg_min(x, 0, output_data_type="float32")
    with pytest.raises(TypeError):
        b.arg_min(b.input("s", data_type="float32", shape=[]), 0)
    y = b.arg_max(x, 1, keep_dimensions=True)
    assert y.shape == (2, 1) and y.data_type == "int32"
