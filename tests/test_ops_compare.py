"""Comparison, logical, is_nan, is_infinite and round_even against numpy."""

import numpy as np
import pytest
from helpers import FUSION, assert_exact, run_graph

import mltensor

NP = mltensor.dtypes.NUMPY

CMP = {
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater": np.greater,
    "greater_or_equal": np.greater_equal,
    "lesser": np.less,
    "lesser_or_equal": np.less_equal,
}
LOGIC = {"logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor}


def _data(dt, shape, rng):
    if dt in ("float32", "float16"):
        a = rng.integers(-3, 4, size=shape).astype(dt) / 2
    elif dt.startswith("u"):
        a = rng.integers(0, 5, size=shape)
    else:
        a = rng.integers(-3, 4, size=shape)
    return np.asarray(a).astype(NP[dt])


_check = assert_exact


@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "uint32", "int64", "uint64", "int8", "uint8"])
def test_comparisons_all_types_broadcast(ctx, rng, dt):
    # all six comparisons of one pair in one graph (each is its own output)
    a = _data(dt, (2, 3, 4), rng)
    c = _data(dt, (3, 1), rng)
    b = mltensor.MLGraphBuilder(ctx)
    xa = b.input("a", data_type=dt, shape=a.shape)
    xc = b.input("c", data_type=dt, shape=c.shape)
    outs = {name: getattr(b, name)(xa, xc) for name in CMP}
    for name in CMP:
        assert outs[name].data_type == "uint8" and outs[name].shape == (2, 3, 4)
    res = run_graph(ctx, outs, {"a": a, "c": c}, b)
    for name, f in CMP.items():
        _check(res[name], f(a, c).astype(np.uint8))


def test_comparisons_nan(ctx):
    a = np.array([np.nan, 1.0, np.nan, -np.inf, np.inf], np.float32)
    c = np.array([np.nan, np.nan, 1.0, -np.inf, 2.0], np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xa = b.input("a", data_type="float32", shape=[5])
    xc = b.input("c", data_type="float32", shape=[5])
    outs = {name: getattr(b, name)(xa, xc) for name in CMP}
    res = run_graph(ctx, outs, {"a": a, "c": c}, b)
    for name, f in CMP.items():
        _check(res[name], f(a, c).astype(np.uint8))


def test_logical(ctx, rng):
    a = rng.integers(0, 3, size=(4, 5)).astype(np.uint8)
    c = rng.integers(0, 3, size=(5,)).astype(np.uint8)
    b = mltensor.MLGraphBuilder(ctx)
    xa = b.input("a", data_type="uint8", shape=a.shape)
    xc = b.input("c", data_type="uint8", shape=c.shape)
    outs = {name: getattr(b, name)(xa, xc) for name in LOGIC}
    outs["logical_not"] = b.logical_not(xa)
    res = run_graph(ctx, outs, {"a": a, "c": c}, b)
    for name, f in LOGIC.items():
        _check(res[name], f(a, c).astype(np.uint8))
    _check(res["logical_not"], np.logical_not(a).astype(np.uint8))


def test_logical_rejects_non_uint8(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="int32", shape=[2])
    y = b.input("y", data_type="uint8", shape=[2])
    with pytest.raises(TypeError, match="logical_and"):
        b.logical_and(x, x)
    with pytest.raises(TypeError, match="logical_not"):
        b.logical_not(x)
    with pytest.raises(TypeError, match="equal"):
        b.equal(x, y)  # mixed types
    with pytest.raises(TypeError):
        b.greater(b.input("z", data_type="int32", shape=[3]), x)  # not broadcastable


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_is_nan_is_infinite_round_even(ctx, dt):
    a = np.array([np.nan, np.inf, -np.inf, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.7, -3.2, 0.0], dtype=dt)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=a.shape)
    outs = {"nan": b.is_nan(x), "inf": b.is_infinite(x), "r": b.round_even(x)}
    assert outs["nan"].data_type == "uint8" and outs["r"].data_type == dt
    res = run_graph(ctx, outs, {"x": a}, b)
    _check(res["nan"], np.isnan(a).astype(np.uint8))
    _check(res["inf"], np.isinf(a).astype(np.uint8))
    _check(res["r"], np.round(a))  # numpy rounds half to even; nan/inf pass through


def test_round_even_rejects_int(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="int32", shape=[2])
    for name in ("round_even", "is_nan", "is_infinite"):
        with pytest.raises(TypeError, match=name):
            getattr(b, name)(x)


def test_fused_chain_is_one_kernel(ctx, rng):
    # greater -> logical_not -> logical_and(equal) -> cast: one fused elementwise kernel
    a = rng.standard_normal((8, 8)).astype(np.float32)
    c = rng.standard_normal((8, 8)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xa = b.input("a", data_type="float32", shape=a.shape)
    xc = b.input("c", data_type="float32", shape=c.shape)
    y = b.cast(b.logical_or(b.logical_not(b.greater(xa, xc)), b.equal(xa, xa)), "float32")
    g = b.build_sync({"y": y})
    assert not FUSION or len(g.kernel_names) == 1, g.kernel_names
    g.destroy()
    b = mltensor.MLGraphBuilder(ctx)
    xa = b.input("a", data_type="float32", shape=a.shape)
    xc = b.input("c", data_type="float32", shape=c.shape)
    y = b.cast(b.logical_xor(b.lesser_or_equal(xa, xc), b.is_nan(xa)), "float32")
    res = run_graph(ctx, {"y": y}, {"a": a, "c": c}, b)
    _check(res["y"], np.logical_xor(a <= c, np.isnan(a)).astype(np.float32))
