"""gather_elements, gather_nd, scatter_elements, scatter_nd against numpy references, including
the spec's examples, negative indices and clamping of out-of-range ones."""

import numpy as np
import pytest
from helpers import assert_exact, run_graph

import mltensor

NP = mltensor.dtypes.NUMPY
TYPES = ["float32", "float16", "int32", "uint32", "int64", "uint64", "int8", "uint8"]


_check = assert_exact


def _fix(idx, n):
    """Reference index semantics: negative wraps once, then clamp into [0, n)."""
    idx = np.asarray(idx, np.int64)
    idx = np.where(idx < 0, idx + n, idx)
    return np.clip(idx, 0, n - 1)


def ref_gather_elements(x, idx, axis):
    return np.take_along_axis(x, _fix(idx, x.shape[axis]), axis=axis)


def ref_gather_nd(x, idx):
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    out = [x[tuple(_fix(c[j], x.shape[j]) for j in range(k))] for c in flat]
    return np.array(out, x.dtype).reshape(idx.shape[:-1] + x.shape[k:])


def ref_scatter_elements(x, idx, upd, axis):
    out = x.copy()
    np.put_along_axis(out, _fix(idx, x.shape[axis]), upd, axis=axis)
    return out


def ref_scatter_nd(x, idx, upd):
    out = x.copy()
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    u = upd.reshape((-1,) + x.shape[k:])
    for c, v in zip(flat, u):
        out[tuple(_fix(c[j], x.shape[j]) for j in range(k))] = v
    return out


def _graph(ctx, arrays, fn):
    b = mltensor.MLGraphBuilder(ctx)
    ops = {n: b.input(n, data_type=mltensor.dtypes.normalize(a.dtype), shape=a.shape) for n, a in arrays.items()}
    return run_graph(ctx, {"y": fn(b, **ops)}, arrays, b)["y"]


X43 = np.array([0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32], np.float32).reshape(4, 3)


def test_gather_elements_spec_examples(ctx):
    i1 = np.array([3, 1, 1, 2, 0, 3], np.uint32).reshape(2, 3)
    _check(
        _graph(ctx, {"x": X43, "i": i1}, lambda b, x, i: b.gather_elements(x, i)),
        np.array([[30, 11, 12], [20, 1, 32]], np.float32),
    )
    i2 = np.array([2, 1, 0, 2], np.uint32).reshape(4, 1)
    _check(
        _graph(ctx, {"x": X43, "i": i2}, lambda b, x, i: b.gather_elements(x, i, axis=1)),
        np.array([[2], [11], [20], [32]], np.float32),
    )
    x3 = np.array([0, 1, 10, 11, 100, 101, 110, 111, 200, 201, 210, 211, 300, 301, 310, 311], np.float32).reshape(
        4, 2, 2
    )
    i3 = np.array([0, 2, 1, 3], np.uint32).reshape(1, 2, 2)
    _check(
        _graph(ctx, {"x": x3, "i": i3}, lambda b, x, i: b.gather_elements(x, i, axis=0)),
        np.array([[[0, 201], [110, 311]]], np.float32),
    )


@pytest.mark.parametrize("dt", TYPES)
@pytest.mark.parametrize("it", ["int32", "uint32", "int64"])
def test_gather_elements_types(ctx, rng, dt, it):
    x = rng.integers(0, 100, size=(3, 4, 5)).astype(NP[dt])
    lo = -4 if it != "uint32" else 0
    for axis in (0, 2):
        ishape = list(x.shape)
        ishape[axis] = 6
        idx = rng.integers(lo, 4, size=ishape).astype(NP[it])
        got = _graph(ctx, {"x": x, "i": idx}, lambda b, x, i: b.gather_elements(x, i, axis=axis))
        _check(got, ref_gather_elements(x, idx, axis))


def test_gather_nd_spec_examples(ctx):
    x1 = np.array([[0, 1], [2, 3]], np.float32)
    x2 = np.arange(8, dtype=np.float32).reshape(2, 2, 2)
    cases = [
        (x1, [[0, 0], [1, 1], [1, 0]], [0, 3, 2]),
        (x1, [[1], [0]], [[2, 3], [0, 1]]),
        (x2, [[0, 1], [1, 0]], [[2, 3], [4, 5]]),
        (x2, [[1], [0], [1]], [[[4, 5], [6, 7]], [[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
        (x2, [[0, 0, 1], [0, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]], [1, 2, 4, 6, 7]),
    ]
    for x, idx, want in cases:
        got = _graph(ctx, {"x": x, "i": np.array(idx, np.uint32)}, lambda b, x, i: b.gather_nd(x, i))
        _check(got, np.array(want, np.float32))


@pytest.mark.parametrize("it", ["int32", "uint32", "int64"])
def test_gather_nd_negative_and_clamped(ctx, rng, it):
    x = rng.integers(0, 100, size=(3, 4, 5)).astype(np.int32)
    lo, hi = (-6, 6) if it != "uint32" else (0, 9)
    for k in (1, 2, 3):
        idx = rng.integers(lo, hi, size=(2, 3, k)).astype(NP[it])
        got = _graph(ctx, {"x": x, "i": idx}, lambda b, x, i: b.gather_nd(x, i))
        _check(got, ref_gather_nd(x, idx))


def test_scatter_elements_spec_examples(ctx):
    i1 = np.array([3, 1, 1, 2, 0, 3], np.uint32).reshape(2, 3)
    u1 = np.array([-1, -2, -3, -4, -5, -6], np.float32).reshape(2, 3)
    _check(
        _graph(ctx, {"x": X43, "i": i1, "u": u1}, lambda b, x, i, u: b.scatter_elements(x, i, u)),
        np.array([[0, -5, 2], [10, -2, -3], [-4, 21, 22], [-1, 31, -6]], np.float32),
    )
    i2 = np.array([2, 1, 0, 2], np.uint32).reshape(4, 1)
    u2 = np.array([-1, -2, -3, -4], np.float32).reshape(4, 1)
    _check(
        _graph(ctx, {"x": X43, "i": i2, "u": u2}, lambda b, x, i, u: b.scatter_elements(x, i, u, axis=1)),
        np.array([[0, 1, -1], [10, -2, 12], [-3, 21, 22], [30, 31, -4]], np.float32),
    )


@pytest.mark.parametrize("dt", ["float32", "float16", "int64", "uint8"])
@pytest.mark.parametrize("it", ["int32", "uint32", "int64"])
def test_scatter_elements_types(ctx, rng, dt, it):
    x = rng.integers(0, 100, size=(3, 4, 5)).astype(NP[dt])
    for axis in (0, 1):
        # distinct target positions along the axis (duplicates are unspecified), some negative
        n = x.shape[axis]
        perm = np.argsort(rng.random((n,) + x.shape[:axis] + x.shape[axis + 1 :]), axis=0)[:2]
        idx = np.moveaxis(perm, 0, axis).astype(np.int64)
        if it != "uint32":
            idx = np.where(rng.random(idx.shape) < 0.5, idx - n, idx)
        idx = idx.astype(NP[it])
        upd = rng.integers(100, 200, size=idx.shape).astype(NP[dt])
        got = _graph(ctx, {"x": x, "i": idx, "u": upd}, lambda b, x, i, u: b.scatter_elements(x, i, u, axis=axis))
        _check(got, ref_scatter_elements(x, idx, upd, axis))


@pytest.mark.parametrize("it", ["int32", "uint32", "int64"])
def test_scatter_nd(ctx, rng, it):
    x = rng.integers(0, 100, size=(4, 3, 2)).astype(np.float32)
    # k = 1: rows 2 and -1 (=3); k = 2: distinct (row, col) pairs; k = 3: single elements
    cases = [
        np.array([[2], [3 if it == "uint32" else -1]]),
        np.array([[0, 0], [1, 2], [3, 1]]),
        np.array([[0, 0, 1], [3, 2, 0]]),
    ]
    for idx in cases:
        idx = idx.astype(NP[it])
        k = idx.shape[-1]
        upd = rng.integers(100, 200, size=idx.shape[:-1] + x.shape[k:]).astype(np.float32)
        got = _graph(ctx, {"x": x, "i": idx, "u": upd}, lambda b, x, i, u: b.scatter_nd(x, i, u))
        _check(got, ref_scatter_nd(x, idx, upd))


def test_out_of_range_indices_are_clamped(ctx):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([[100, -100, 5]], np.int32)
    _check(_graph(ctx, {"x": x, "i": idx}, lambda b, x, i: b.gather_elements(x, i)), ref_gather_elements(x, idx, 0))
    idx = np.array([[7, -9]], np.int64)
    _check(_graph(ctx, {"x": x, "i": idx}, lambda b, x, i: b.gather_nd(x, i)), ref_gather_nd(x, idx))
    idx = np.array([[1000]], np.uint32)
    upd = np.array([[5, 6, 7]], np.float32).reshape(1, 3)
    _check(
        _graph(ctx, {"x": x, "i": idx, "u": upd}, lambda b, x, i, u: b.scatter_nd(x, i, u)), ref_scatter_nd(x, idx, upd)
    )
    idx = np.array([[-50, 50, 1]], np.int32)
    upd = np.array([[-1, -2, -3]], np.float32)
    _check(
        _graph(ctx, {"x": x, "i": idx, "u": upd}, lambda b, x, i, u: b.scatter_elements(x, i, u)),
        ref_scatter_elements(x, idx, upd, 0),
    )


def test_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 3])
    i = b.input("i", data_type="int32", shape=[2, 3])
    with pytest.raises(TypeError, match="gather_elements"):
        b.gather_elements(x, b.input("f", data_type="float32", shape=[2, 3]))
    with pytest.raises(TypeError, match="gather_elements"):
        b.gather_elements(x, i, axis=1)  # shape mismatch off-axis
    with pytest.raises(TypeError, match="axis"):
        b.gather_elements(x, i, axis=2)
    with pytest.raises(TypeError, match="gather_nd"):
        b.gather_nd(x, b.input("j", data_type="int32", shape=[2, 3]))
    with pytest.raises(TypeError, match="scatter_elements"):
        b.scatter_elements(x, i, b.input("u", data_type="int32", shape=[2, 3]))
    with pytest.raises(TypeError, match="scatter_nd"):
        b.scatter_nd(x, b.input("k", data_type="int32", shape=[2, 1]), b.input("v", data_type="float32", shape=[2]))
    assert b.gather_nd(x, b.input("m", data_type="int32", shape=[5, 2])).shape == (5,)
    assert b.gather_elements(x, i).shape == (2, 3)
