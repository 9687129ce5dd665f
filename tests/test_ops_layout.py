"""reverse, tile and triangular against numpy, including the spec's triangular examples."""

import numpy as np
import pytest
from helpers import assert_exact, run_graph

import mltensor

NP = mltensor.dtypes.NUMPY
TYPES = ["float32", "float16", "int32", "uint32", "int64", "uint64", "int8", "uint8"]


_check = assert_exact


def _run(ctx, arr, fns):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=mltensor.dtypes.normalize(arr.dtype), shape=arr.shape)
    outs = {k: f(b, x) for k, f in fns.items()}
    return run_graph(ctx, outs, {"x": arr}, b)


@pytest.mark.parametrize("dt", TYPES)
def test_reverse(ctx, rng, dt):
    x = rng.integers(0, 100, size=(2, 3, 4)).astype(NP[dt])
    cases = {"all": None, "a0": [0], "a1": [1], "a2": [2], "a02": [2, 0], "none": []}
    res = _run(
        ctx,
        x,
        {k: (lambda b, v, a=a: b.reverse(v, axes=a) if a is not None else b.reverse(v)) for k, a in cases.items()},
    )
    for k, a in cases.items():
        _check(res[k], np.flip(x, axis=tuple(a) if a is not None else None))


def test_reverse_errors(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match="reverse"):
        b.reverse(x, axes=[2])
    with pytest.raises(TypeError, match="reverse"):
        b.reverse(x, axes=[1, 1])


@pytest.mark.parametrize("dt", TYPES)
def test_tile(ctx, rng, dt):
    x = rng.integers(0, 100, size=(2, 3, 4)).astype(NP[dt])
    reps = {"r1": [1, 1, 1], "r2": [2, 1, 3], "r3": [1, 4, 1], "r4": [3, 2, 2]}
    res = _run(ctx, x, {k: (lambda b, v, r=r: b.tile(v, r)) for k, r in reps.items()})
    for k, r in reps.items():
        _check(res[k], np.tile(x, r))


def test_tile_errors(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match="tile"):
        b.tile(x, [2])
    with pytest.raises(TypeError, match="tile"):
        b.tile(x, [0, 1])


def test_triangular_spec_examples(ctx):
    x = np.array([[7, 1, 2], [9, 4, 8], [2, 6, 3]], np.float32)
    cases = {
        "upper": ({}, [[7, 1, 2], [0, 4, 8], [0, 0, 3]]),
        "upper_pos": ({"diagonal": 1}, [[0, 1, 2], [0, 0, 8], [0, 0, 0]]),
        "upper_neg": ({"diagonal": -1}, [[7, 1, 2], [9, 4, 8], [0, 6, 3]]),
        "lower": ({"upper": False}, [[7, 0, 0], [9, 4, 0], [2, 6, 3]]),
        "lower_pos": ({"upper": False, "diagonal": 1}, [[7, 1, 0], [9, 4, 8], [2, 6, 3]]),
        "lower_neg": ({"upper": False, "diagonal": -1}, [[0, 0, 0], [9, 0, 0], [2, 6, 0]]),
    }
    res = _run(ctx, x, {k: (lambda b, v, o=o: b.triangular(v, **o)) for k, (o, _) in cases.items()})
    for k, (_, want) in cases.items():
        _check(res[k], np.array(want, np.float32))
    # two batches, lower
    xb = np.stack([x, np.arange(1, 10, dtype=np.float32).reshape(3, 3)])
    res = _run(ctx, xb, {"y": lambda b, v: b.triangular(v, upper=False)})
    _check(res["y"], np.tril(xb))


@pytest.mark.parametrize("dt", TYPES)
def test_triangular_types_shapes(ctx, rng, dt):
    x = rng.integers(1, 100, size=(2, 4, 6)).astype(NP[dt])
    diags = [-7, -2, 0, 3, 9]
    fns = {}
    for d in diags:
        fns[f"u{d}"] = lambda b, v, d=d: b.triangular(v, diagonal=d)
        fns[f"l{d}"] = lambda b, v, d=d: b.triangular(v, upper=False, diagonal=d)
    res = _run(ctx, x, fns)
    for d in diags:
        _check(res[f"u{d}"], np.triu(x, d))
        _check(res[f"l{d}"], np.tril(x, d))


def test_triangular_errors(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    with pytest.raises(TypeError, match="triangular"):
        b.triangular(b.input("x", data_type="float32", shape=[3]))
