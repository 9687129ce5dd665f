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
    cs = lambda **o: lambda b, v: b.cumulative_sum(v, 0, **o)  # noqa: E731
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
    x = np.array(
        [[-5.0, -1.0, -1.0, -7.0], [1.0, np.nan, 3.0, np.nan], [-np.inf, -np.inf, -np.inf, -np.inf]], np.float32
    )
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


# -- long lines: chunked plans (ops/scan.py) ------------------------------------------------------
# lavapipe's llvmpipe ends an invocation's loops past 65535 iterations, silently: one thread per
# line gave 1..65535 then zeros. Lines past a chunk take the "chunks" plan (lavapipe's heuristic)
# or a "tiles" plan (GPUs'); `autotune.force(i)` runs each plan: 0 chunks, 1 tiles of 16 elements
# a thread, 2 tiles of 4. Values are small integers, so float sums are exact and ties are many.

from mltensor import MLDynamicDimension as D  # noqa: E402
from mltensor.runtime import autotune  # noqa: E402

PLANS = [0, 1, 2]


def _build(ctx, specs, fn, plan=None):
    b = mltensor.MLGraphBuilder(ctx)
    xs = [b.input(n, data_type=dt, shape=s) for n, (dt, s) in specs.items()]
    if plan is None:
        return b.build_sync({"y": fn(b, *xs)})
    with autotune.force(plan):
        return b.build_sync({"y": fn(b, *xs)})


def _dispatch(ctx, g, arr):
    x = ctx.create_tensor_sync(data_type=mltensor.dtypes.normalize(arr.dtype), shape=arr.shape, writable=True)
    ctx.write_tensor(x, arr)
    shape = g.compute_shapes({"x": list(arr.shape)})["y"]
    y = ctx.create_tensor_sync(data_type=g.output_descriptors["y"][0], shape=shape, readable=True)
    ctx.dispatch(g, {"x": x}, {"y": y})
    r = ctx.read_tensor_sync(y)
    x.destroy()
    y.destroy()
    return r


def _cumsum_ref(x, axis, excl, rev, dt):
    src = np.flip(x, axis) if rev else x
    want = np.cumsum(src, axis=axis, dtype=np.float64 if dt == "float16" else NP[dt])
    if excl:
        want = want - src
    if rev:
        want = np.flip(want, axis)
    return np.ascontiguousarray(want.astype(NP[dt]))


def _ints(rng, shape, dt, lo=-3, hi=4):
    if dt.startswith("uint"):
        lo = 0
    return rng.integers(lo, hi, size=shape).astype(NP[dt])


def _kernels(g):
    names = list(g.kernel_names)
    return [n for n in names if not n.startswith(("unpack", "pack"))]  # edge conversions


@pytest.mark.parametrize("plan", [None, *PLANS])
@pytest.mark.parametrize(
    "shape,axis",
    [
        ((100_000,), 0),
        ((3, 70_000), 1),
        ((70_000, 3), 0),
        ((2, 9000, 33), 1),
        ((5000, 40), 0),
        ((40, 4097), 1),
        ((300, 1000), 1),
        ((65536 + 5, 2), 0),
    ],
)
def test_cumulative_sum_long_lines(ctx, rng, plan, shape, axis):
    x = _ints(rng, shape, "float32")
    for excl, rev in ((False, False), (True, False), (False, True), (True, True)):
        g = _build(
            ctx, {"x": ("float32", shape)}, lambda b, v: b.cumulative_sum(v, axis, exclusive=excl, reversed=rev), plan
        )
        _check(_dispatch(ctx, g, x), _cumsum_ref(x, axis, excl, rev, "float32"))
        g.destroy()


def test_cumulative_sum_100000_ones(ctx):
    """The report: 1..65535 then zeros. Also dispatched twice (scratch reused across dispatches)."""
    g = _build(ctx, {"x": ("float32", (100_000,))}, lambda b, v: b.cumulative_sum(v, 0))
    x = np.ones(100_000, np.float32)
    _check(_dispatch(ctx, g, x), np.arange(1, 100_001, dtype=np.float32))
    _check(_dispatch(ctx, g, 2 * x), np.arange(2, 200_001, 2, dtype=np.float32))
    g.destroy()


@pytest.mark.parametrize("dt", ["float16", "int32", "uint32", "int64", "uint64", "int8"])
@pytest.mark.parametrize("plan", PLANS)
def test_cumulative_sum_long_lines_types(ctx, rng, dt, plan):
    shape, axis = (2, 70_000), 1
    x = _ints(rng, shape, dt)
    if dt in ("int64", "uint64"):  # past 32 bits: the carries between words
        x = x * np.array(3 << 33, NP[dt]) + x
    if dt in ("int32", "uint32"):  # wraps, as numpy
        x = (x * np.array(1 << 28, NP[dt])).astype(NP[dt])
    for excl, rev in ((False, False), (True, True)):
        g = _build(ctx, {"x": (dt, shape)}, lambda b, v: b.cumulative_sum(v, axis, exclusive=excl, reversed=rev), plan)
        _check(_dispatch(ctx, g, x), _cumsum_ref(x, axis, excl, rev, dt))
        g.destroy()


def test_cumulative_sum_float16_accumulates_in_f32(ctx):
    """2049 ones: a float16 running sum would stop at 2048; f32 accumulation rounds only stores."""
    x = np.ones((2, 5000), np.float16)
    for plan in PLANS:
        g = _build(ctx, {"x": ("float16", x.shape)}, lambda b, v: b.cumulative_sum(v, 1), plan)
        _check(_dispatch(ctx, g, x), np.cumsum(x.astype(np.float64), 1).astype(np.float16))
        g.destroy()


def test_one_million(ctx, rng):
    n = 1_000_000
    x = _ints(rng, (n,), "float32")
    x[123_456] = 9
    x[987_654] = -9
    for plan in PLANS:
        g = _build(ctx, {"x": ("float32", (n,))}, lambda b, v: b.cumulative_sum(v, 0, reversed=True), plan)
        _check(_dispatch(ctx, g, x), _cumsum_ref(x, 0, False, True, "float32"))
        g.destroy()
        b = mltensor.MLGraphBuilder(ctx)
        v = b.input("x", data_type="float32", shape=[n])
        with autotune.force(plan):
            res = run_graph(ctx, {"mx": b.arg_max(v, 0), "mn": b.arg_min(v, 0)}, {"x": x}, b)
        _check(res["mx"], np.array(123_456, np.int32))
        _check(res["mn"], np.array(987_654, np.int32))


@pytest.mark.parametrize("plan", [None, *PLANS])
@pytest.mark.parametrize("op", ["arg_min", "arg_max"])
@pytest.mark.parametrize(
    "shape,axis",
    [((100_000,), 0), ((3, 70_000), 1), ((70_000, 3), 0), ((2, 9000, 33), 1), ((40, 4097), 1), ((300, 1000), 1)],
)
def test_arg_long_lines(ctx, rng, plan, op, shape, axis):
    """Many ties (values 0..3): the first index of the best wins across chunks."""
    x = _ints(rng, shape, "int32", 0, 4)
    ref = np.argmin if op == "arg_min" else np.argmax
    b = mltensor.MLGraphBuilder(ctx)
    v = b.input("x", data_type="int32", shape=shape)
    with autotune.force(plan if plan is not None else 0) if plan is not None else _nothing():
        res = run_graph(
            ctx,
            {
                "a": getattr(b, op)(v, axis),
                "k": getattr(b, op)(v, axis, keep_dimensions=True, output_data_type="int64"),
            },
            {"x": x},
            b,
        )
    _check(res["a"], ref(x, axis=axis).astype(np.int32))
    _check(res["k"], ref(x, axis=axis, keepdims=True).astype(np.int64))


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("dt", ["float32", "float16", "uint32", "int64", "uint64", "int8"])
@pytest.mark.parametrize("plan", PLANS)
def test_arg_long_lines_types(ctx, rng, dt, plan):
    shape = (3, 70_000)
    x = _ints(rng, shape, dt, -2, 3)
    if dt in ("int64", "uint64"):  # differences only in the high word, or only in the low word
        x = x * np.array(1 << 33, NP[dt]) + _ints(rng, shape, dt, 0, 2)
    b = mltensor.MLGraphBuilder(ctx)
    v = b.input("x", data_type=dt, shape=shape)
    with autotune.force(plan):
        res = run_graph(ctx, {"mx": b.arg_max(v, 1), "mn": b.arg_min(v, 0), "mn1": b.arg_min(v, 1)}, {"x": x}, b)
    _check(res["mx"], np.argmax(x, 1).astype(np.int32))
    _check(res["mn"], np.argmin(x, 0).astype(np.int32))
    _check(res["mn1"], np.argmin(x, 1).astype(np.int32))


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_arg_long_lines_nan_zero_inf(ctx, plan, dt):
    """numpy's rules across chunks: the first NaN wins wherever the best value is; -0 ties +0."""
    n = 70_000
    rows = np.zeros((8, n), np.float32)
    rows[0, 5] = -1.0  # 0: ties of 0 (first index 0 / 1 for min)
    rows[0, 0] = -0.0
    rows[1, 60_000] = np.nan  # 1: a NaN after the max, in a later chunk
    rows[1, 100] = 5.0
    rows[2, [3000, 50_000, 69_999]] = np.nan  # 2: several NaN: the first
    rows[3, :] = -np.inf  # 3: all -inf
    rows[3, 40_000] = np.inf
    rows[4, :] = -0.0  # 4: -0 and +0 tie
    rows[4, 33_333] = 0.0
    rows[5, -1] = np.nan  # 5: NaN last
    rows[6, :] = np.nan  # 6: all NaN
    rows[7, 4096:] = 1.0  # 7: the best starts at a chunk edge
    rows[7, 1024] = np.inf
    rows[7, 1025] = -np.inf
    x = rows.astype(NP[dt])
    b = mltensor.MLGraphBuilder(ctx)
    v = b.input("x", data_type=dt, shape=x.shape)
    with autotune.force(plan):
        res = run_graph(ctx, {"mx": b.arg_max(v, 1), "mn": b.arg_min(v, 1)}, {"x": x}, b)
    _check(res["mx"], np.argmax(x, 1).astype(np.int32))
    _check(res["mn"], np.argmin(x, 1).astype(np.int32))


@pytest.mark.parametrize("plan", PLANS)
def test_launch_counts(ctx, plan):
    """One launch for short lines; long lines: arg_* 2, cumulative_sum 3 (every plan)."""

    def count(shape, fn):
        g = _build(ctx, {"x": ("float32", shape)}, fn, plan)
        n = len(_kernels(g))
        g.destroy()
        return n

    cs, am = (lambda b, v: b.cumulative_sum(v, 1)), (lambda b, v: b.arg_max(v, 1))
    assert count((4, 20), cs) == count((4, 20), am) == 1  # one thread per line
    assert count((4, 100_000), cs) == 3
    assert count((4, 100_000), am) == 2


@pytest.mark.parametrize("plan", [None, *PLANS])
@pytest.mark.parametrize("rev", [False, True])
def test_dynamic_long_lines(ctx, rng, plan, rev):
    """One build for lines of 1 to 100000 elements: the serial kernel, one chunk or several by
    size, each variant sized to 0 workgroups where it does not apply; against numpy and bit for
    bit against a static build at each size (float sums of random values: same order)."""
    specs = {"x": ("float32", [D("r", 3), D("n", 100_000)])}
    fns = {"cs": lambda b, v: b.cumulative_sum(v, 1, exclusive=rev, reversed=rev), "am": lambda b, v: b.arg_max(v, 1)}
    graphs = {k: _build(ctx, specs, f, plan) for k, f in fns.items()}
    for r, n in ((1, 1), (3, 33), (2, 1024), (3, 1025), (1, 5000), (3, 70_001), (2, 100_000)):
        x = rng.standard_normal((r, n)).astype(np.float32)
        x[r - 1, n // 2] = 10.0
        for k, g in graphs.items():
            got = _dispatch(ctx, g, x)
            gs = _build(ctx, {"x": ("float32", (r, n))}, fns[k], plan)
            static = _dispatch(ctx, gs, x)
            gs.destroy()
            if k == "am":
                _check(got, np.argmax(x, 1).astype(np.int32))
            else:
                x64 = np.flip(x, 1).astype(np.float64) if rev else x.astype(np.float64)
                want = np.cumsum(x64, 1) - (x64 if rev else 0)
                np.testing.assert_allclose(got, np.flip(want, 1) if rev else want, rtol=1e-4, atol=2e-3)
            assert np.array_equal(got.view(np.uint32), static.view(np.uint32)), (k, r, n)
    for g in graphs.values():
        g.destroy()


def test_dynamic_inner_lanes(ctx, rng):
    """The axis not last, with a dynamic inner size: the lanes (1 to 32 lines side by side) are
    chosen at dispatch."""
    specs = {"x": ("int32", [D("n", 9000), D("c", 40)])}
    for plan in PLANS:
        gc = _build(ctx, specs, lambda b, v: b.cumulative_sum(v, 0), plan)
        ga = _build(ctx, specs, lambda b, v: b.arg_min(v, 0), plan)
        for n, c in ((1, 1), (9000, 3), (5000, 40), (4097, 17), (300, 33)):
            x = _ints(rng, (n, c), "int32", 0, 4)
            _check(_dispatch(ctx, gc, x), np.cumsum(x, 0, dtype=np.int32))
            _check(_dispatch(ctx, ga, x), np.argmin(x, 0).astype(np.int32))
        gc.destroy()
        ga.destroy()


# -- the same pattern in softmax (ops/reduce.py) --------------------------------------------------
# One workgroup per row looped 3 * K / 64 times a thread: rows past ~1.4M elements came out partly
# zero on lavapipe. Long rows now take two launches (SOFTMAX_SPLIT_K; SOFTMAX_SPLIT_K_CPU on CPU
# adapters such as lavapipe).


def _softmax_ref(a, axis):
    a = a.astype(np.float64)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("split_k", [None, 70_000])
@pytest.mark.parametrize(
    "shape,axis,dt",
    [
        ((1, 1_500_000), 1, "float32"),
        ((700_000, 2), 0, "float32"),
        ((2, 600_000), 1, "float16"),
        ((3, 100_000), 1, "float32"),
    ],
)
def test_softmax_long_rows(ctx, rng, monkeypatch, split_k, shape, axis, dt):
    from mltensor.ops import reduce

    if split_k:  # the GPU threshold, on this adapter too
        monkeypatch.setattr(reduce, "SOFTMAX_SPLIT_K_CPU", split_k)
        monkeypatch.setattr(reduce, "SOFTMAX_SPLIT_K", split_k)
    x = (3 * rng.standard_normal(shape)).astype(NP[dt])
    x[(0,) * len(shape)] = -np.inf
    got = _one(ctx, x, lambda b, v: b.softmax(v, axis))
    assert got.shape == x.shape and got.dtype == x.dtype
    want = _softmax_ref(x, axis)
    tol = dict(rtol=2e-2, atol=1e-6) if dt == "float16" else dict(rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(got.astype(np.float64), want, **tol)
    np.testing.assert_allclose(got.astype(np.float64).sum(axis=axis), 1.0, rtol=2e-3 if dt == "float16" else 1e-5)


def test_softmax_long_rows_dynamic(ctx, rng, monkeypatch):
    """A dynamic row length crossing the threshold: the workgroup kernel or the two launches by
    size, bit for bit what the static build at each size computes."""
    from mltensor.ops import reduce

    monkeypatch.setattr(reduce, "SOFTMAX_SPLIT_K_CPU", 70_000)
    monkeypatch.setattr(reduce, "SOFTMAX_SPLIT_K", 70_000)
    specs = {"x": ("float32", [D("r", 3), D("k", 200_000)])}
    g = _build(ctx, specs, lambda b, v: b.softmax(v, 1))
    for r, k in ((1, 1), (3, 40), (2, 5000), (3, 70_000), (1, 70_001), (3, 200_000)):
        x = rng.standard_normal((r, k)).astype(np.float32)
        got = _dispatch(ctx, g, x)
        np.testing.assert_allclose(got, _softmax_ref(x, 1), rtol=1e-4, atol=1e-9)
        gs = _build(ctx, {"x": ("float32", (r, k))}, lambda b, v: b.softmax(v, 1))
        static = _dispatch(ctx, gs, x)
        gs.destroy()
        assert np.array_equal(got.view(np.uint32), static.view(np.uint32)), (r, k)
    g.destroy()
