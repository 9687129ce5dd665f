"""ONNX TopK (mltensor/onnx/ops/sort.py) against onnxruntime CPU, and the `_topk` builder
operator (mltensor/ops/sort.py) against a numpy reference with every kernel plan forced.

onnxruntime's order: largest: NaN first, then descending; smallest: ascending, NaN last; ties
(-0 and +0 equal, all NaNs equal) the lower index first. Values and indices must match exactly
(values bit for bit: -0 stays -0, NaN where onnxruntime has NaN)."""

import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

import mltensor
from mltensor import InferenceSession
from mltensor.front.builder import MLGraphBuilder
from mltensor.ops import sort
from mltensor.runtime import autotune

from helpers import context_with_env, one_node_model, run_graph


def _seed(*key):
    return zlib.crc32(repr(key).encode())


def _model(x, k, axis=-1, largest=None, sorted_=None, opset=11, k_fed=False):
    """A one-node TopK model: k an attribute (opset 1) or the input K (an initializer, or fed)."""
    attrs = {"axis": axis}
    inputs = [("x", x, True)]
    if opset < 10:
        attrs["k"] = k
    else:
        inputs.append(("k", np.array([k], np.int64), k_fed))
    if largest is not None:
        attrs["largest"] = largest
    if sorted_ is not None:
        attrs["sorted"] = sorted_
    vt = h.np_dtype_to_tensor_dtype(x.dtype)
    return one_node_model("TopK", inputs, [("values", vt), ("indices", TP.INT64)], attrs, opset=opset)


def _feeds(x, k, opset, k_fed):
    f = {"x": x}
    if k_fed and opset >= 10:
        f["k"] = np.array([k], np.int64)
    return f


def _same(got, want):
    """Shape, dtype, then every value bit for bit (floats as their bit patterns)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if got.dtype.kind == "f":
        u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
        got, want = np.ascontiguousarray(got).view(u), np.ascontiguousarray(want).view(u)
    np.testing.assert_array_equal(got, want)


def _check(ctx, x, k, axis=-1, largest=None, sorted_=None, opset=11, k_fed=False):
    model = _model(x, k, axis, largest, sorted_, opset, k_fed)
    feeds = _feeds(x, k, opset, k_fed)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    s = InferenceSession(model, ctx)
    try:
        got = s.run(None, feeds)
    finally:
        s.close()
    if sorted_ == 0:  # any order: onnxruntime's is not sorted, mltensor's is; the same elements
        ax = axis % x.ndim
        order = np.argsort(ref[1], axis=ax, kind="stable")
        ref = [np.take_along_axis(r, order, ax) for r in ref]
        order = np.argsort(got[1], axis=ax, kind="stable")
        got = [np.take_along_axis(g, order, ax) for g in got]
    _same(got[0], ref[0])
    _same(got[1], ref[1])


def _ties(rng, shape, dtype=np.float32, levels=5):
    """Integer values in [-levels, levels]: many equal values in every row."""
    return rng.integers(-levels, levels + 1, shape).astype(dtype)


def _specials(rng, shape, dtype=np.float32):
    """Ties, NaNs, +-inf and -0 mixed in."""
    x = rng.integers(-3, 4, shape).astype(np.float32)
    for v, p in ((np.nan, 0.1), (np.inf, 0.05), (-np.inf, 0.05), (-0.0, 0.1), (0.0, 0.05)):
        x[rng.random(shape) < p] = v
    return x.astype(dtype)


# -- ONNX against onnxruntime ------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_axes(ctx, axis):
    rng = np.random.default_rng(_seed("axes", axis))
    x = _ties(rng, (4, 6, 7), levels=3)
    for largest in (1, 0):
        _check(ctx, x, 3, axis=axis, largest=largest)


@pytest.mark.parametrize("k", [1, 2, 16, 17, 40, 63, 64])
@pytest.mark.parametrize("largest", [1, 0])
def test_k_last_axis(ctx, k, largest):
    rng = np.random.default_rng(_seed("k", k, largest))
    x = rng.standard_normal((5, 64)).astype(np.float32)
    _check(ctx, x, k, largest=largest)


@pytest.mark.parametrize("n,k", [(1000, 1), (1000, 7), (1000, 100), (1000, 1000), (300, 16)])
@pytest.mark.parametrize("largest", [1, 0])
def test_ties(ctx, n, k, largest):
    rng = np.random.default_rng(_seed("ties", n, k, largest))
    _check(ctx, _ties(rng, (3, n)), k, largest=largest)


@pytest.mark.parametrize("k", [1, 5, 40, 200])
@pytest.mark.parametrize("largest", [1, 0])
def test_nan_inf_signed_zero(ctx, k, largest):
    rng = np.random.default_rng(_seed("nan", k, largest))
    _check(ctx, _specials(rng, (4, 200)), k, largest=largest)


def test_all_nan_rows(ctx):
    x = np.full((2, 40), np.nan, np.float32)
    x[1, ::3] = -0.0
    for largest in (1, 0):
        _check(ctx, x, 20, largest=largest)


@pytest.mark.parametrize("k", [1, 9, 50])
def test_float16(ctx, k):
    rng = np.random.default_rng(_seed("f16", k))
    x = _specials(rng, (3, 120), np.float16)
    x[0, :60] = rng.standard_normal(60).astype(np.float16)
    for largest in (1, 0):
        _check(ctx, x, k, largest=largest)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("k", [1, 6, 30])
def test_integers(ctx, dtype, k):
    rng = np.random.default_rng(_seed("int", np.dtype(dtype).name, k))
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (4, 90), dtype=dtype, endpoint=True)
    x[:, ::4] = x[:, 1::4]  # ties
    x[0, :3] = [info.min, info.max, 0]
    if dtype == np.int64:  # equal high words, low words differing (and the other way)
        x[1] = (rng.integers(-2, 2, 90) << 32) + rng.integers(0, 4, 90)
    for largest in (1, 0):
        _check(ctx, x, k, largest=largest)


def test_rows_of_one(ctx):
    x = np.array([[3.0], [np.nan], [-0.0], [-1.0]], np.float32)
    for largest in (1, 0):
        _check(ctx, x, 1, axis=1, largest=largest)
        _check(ctx, x, 1, axis=0, largest=largest)
    _check(ctx, np.array([7], np.int64), 1, axis=0)


@pytest.mark.parametrize("shape,k", [((3000, 30), 5), ((2000, 40), 25), ((64, 3000), 20), ((48, 500, 2), 3)])
def test_many_rows(ctx, shape, k):
    rng = np.random.default_rng(_seed("rows", shape, k))
    x = _ties(rng, shape, levels=50)
    _check(ctx, x, k, axis=-1 if len(shape) == 2 else 1)


@pytest.mark.parametrize("k", [1, 10, 100, 3000, 10_000])
def test_long_rows(ctx, k):
    rng = np.random.default_rng(_seed("long", k))
    x = rng.standard_normal((2, 10_000)).astype(np.float32)
    x[1] = np.round(x[1] * 4)  # ties
    for largest in (1, 0):
        _check(ctx, x, k, largest=largest)


@pytest.mark.parametrize("k", [5, 100, 100_000])
def test_row_of_100k(ctx, k):
    rng = np.random.default_rng(_seed("100k", k))
    x = np.round(rng.standard_normal((1, 100_000)) * 1000).astype(np.float32)
    x[0, rng.integers(0, 100_000, 50)] = np.nan
    _check(ctx, x, k)


@pytest.mark.slow
@pytest.mark.parametrize(
    "shape,axis,k", [((3, 100_000), 1, 1000), ((100_000, 3), 0, 40), ((1, 25200), 1, 300), ((8, 8400), 1, 8400)]
)
def test_long_rows_slow(ctx, shape, axis, k):
    rng = np.random.default_rng(_seed("slow", shape, k))
    x = _ties(rng, shape, levels=2000)
    for largest in (1, 0):
        _check(ctx, x, k, axis=axis, largest=largest)


@pytest.mark.parametrize("opset", [1, 10, 11, 24])
def test_opsets(ctx, opset):
    rng = np.random.default_rng(_seed("opset", opset))
    x = _ties(rng, (3, 4, 20))
    kw = {} if opset < 11 else {"largest": 1, "sorted_": 1}
    _check(ctx, x, 4, axis=-1, opset=opset, **kw)
    _check(ctx, x, 2, axis=1, opset=opset, **kw)


def test_k_input_and_unsorted(ctx):
    rng = np.random.default_rng(_seed("kin"))
    x = rng.standard_normal((3, 50)).astype(np.float32)
    _check(ctx, x, 6, k_fed=True)  # K a graph input: bound by value at the first run
    s = InferenceSession(_model(x, 6, k_fed=True), ctx)
    try:
        v, i = s.run(None, {"x": x, "k": np.array([6], np.int64)})
        v2, i2 = s.run(None, {"x": x, "k": np.array([2], np.int64)})
    finally:
        s.close()
    _same(v2, v[:, :2])
    _same(i2, i[:, :2])
    # sorted=0 allows any order (mltensor's is sorted, onnxruntime's is not): the same elements
    _check(ctx, x, 6, sorted_=0)
    _check(ctx, _ties(rng, (3, 50)), 6, largest=0, sorted_=0)


def test_k_zero(ctx):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = InferenceSession(_model(x, 0), ctx)
    try:
        v, i = s.run(None, {"x": x})
    finally:
        s.close()
    _same(v, np.zeros((3, 0), np.float32))
    _same(i, np.zeros((3, 0), np.int64))


def test_k_too_large(ctx):
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(mltensor.errors.DataError, match="k 4"):
        InferenceSession(_model(x, 4), ctx)


# -- the builder operator: every plan forced, numpy reference --------------------------------


def _reference(x, k, axis, largest):
    """onnxruntime's order in numpy (test_reference_matches_onnxruntime checks it)."""
    xm = np.moveaxis(x, axis, -1)
    n = xm.shape[-1]
    flat = xm.reshape(-1, n)
    idx = np.arange(n)
    fl = x.dtype.kind == "f"
    out = []
    for row in flat:
        nan = np.isnan(row) if fl else np.zeros(n, bool)
        v = np.where(nan, 0, row).astype(np.float64) if fl else row.astype(object)  # -0 == +0
        order = np.lexsort((idx, -v, ~nan)) if largest else np.lexsort((idx, v, nan))
        out.append(order[:k])
    i = np.array(out, np.int64).reshape(xm.shape[:-1] + (k,))
    vals = np.take_along_axis(xm, i, -1)
    return np.moveaxis(vals, -1, axis), np.moveaxis(i, -1, axis)


def test_reference_matches_onnxruntime():
    rng = np.random.default_rng(_seed("ref"))
    for n, k in ((50, 50), (300, 7), (2000, 700)):
        x = _specials(rng, (3, n))
        for largest in (1, 0):
            m = _model(x, k, largest=largest)
            sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            ref = sess.run(None, {"x": x})
            v, i = _reference(x, k, 1, largest)
            _same(v, ref[0])
            _same(i, ref[1])


def _run_op(ctx, x, k, axis, largest, force=None):
    b = MLGraphBuilder(ctx)
    xi = b.input("x", data_type=mltensor.dtypes.normalize(x.dtype), shape=list(x.shape))
    v, i = b._topk(xi, k=k, axis=axis, largest=largest)
    assert v.shape == i.shape and v.data_type == xi.data_type and i.data_type == "int64"
    if force is None:
        return run_graph(ctx, {"v": v, "i": i}, {"x": x}, b)
    with autotune.force(force):
        return run_graph(ctx, {"v": v, "i": i}, {"x": x}, b)


def _data(rng, dtype, shape):
    if np.dtype(dtype).kind == "f":
        return _specials(rng, shape, dtype)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
    return np.where(rng.random(shape) < 0.5, x, x.flat[0])  # ties


# (shape, axis, k): short rows, k <= 16 and above, chunked rows and merges, strided axes
_PLAN_CASES = [
    ((300, 20), 1, 7),
    ((5, 1), 1, 1),
    ((3, 3000), 1, 16),
    ((2, 3000), 1, 17),
    ((2, 5000, 2), 1, 5),
    ((2, 3, 600, 2), 2, 33),
    ((2, 4097), 1, 4097),
    ((1, 20_000), 1, 2),
]


@pytest.mark.parametrize(
    "shape,axis,k,dtype", [c + (np.float32,) for c in _PLAN_CASES] + [c + (np.int64,) for c in _PLAN_CASES[1::2]]
)
def test_every_plan(ctx, shape, axis, k, dtype):
    rng = np.random.default_rng(_seed("plan", shape, k, np.dtype(dtype).name))
    x = _data(rng, dtype, shape)
    n = shape[axis]
    kw = 2 if dtype == np.int64 else 1
    storage = min(ctx._device.limits["max-compute-workgroup-storage-size"], 32768)
    plans = sort.candidates(x.size // n, n, k, kw, storage)
    for f in range(len(plans)):
        for largest in (True, False) if f == 0 else (f % 2 == 1,):
            got = _run_op(ctx, x, k, axis, largest, force=f)
            v, i = _reference(x, k, axis, largest)
            _same(got["v"], v)
            _same(got["i"], i)


@pytest.mark.parametrize("dtype", [np.float16, np.uint32, np.uint64, np.int32, np.uint8, np.int8])
def test_op_types(ctx, dtype):
    rng = np.random.default_rng(_seed("types", np.dtype(dtype).name))
    x = _data(rng, dtype, (3, 700))
    for k in (3, 40):
        for largest in (True, False):
            got = _run_op(ctx, x, k, 1, largest)
            v, i = _reference(x, k, 1, largest)
            _same(got["v"], v)
            _same(got["i"], i)


@pytest.mark.parametrize(
    "env,dtype",
    [("MLTENSOR_DISABLE_INT64", np.int64), ("MLTENSOR_DISABLE_INT64", np.uint64), ("MLTENSOR_DISABLE_F16", np.float16)],
)
def test_op_without_features(env, dtype):
    c = context_with_env(**{env: "1"})
    try:
        rng = np.random.default_rng(_seed("feat", env, np.dtype(dtype).name))
        x = _data(rng, dtype, (3, 3000))
        for k in (5, 300):
            for largest in (True, False):
                got = _run_op(c, x, k, 1, largest)
                v, i = _reference(x, k, 1, largest)
                _same(got["v"], v)
                _same(got["i"], i)
    finally:
        c.destroy()


def test_more_groups_than_a_dimension(ctx):
    # 70,000 rows: one workgroup a row is folded into two dimensions (grid())
    rng = np.random.default_rng(_seed("fold"))
    x = _ties(rng, (70_000, 3))
    plans = sort.candidates(70_000, 3, 2, 1, 16384)
    for f in range(len(plans)):
        got = _run_op(ctx, x, 2, 1, True, force=f)
        v, i = _reference(x, 2, 1, True)
        _same(got["v"], v)
        _same(got["i"], i)


def test_op_validation(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 5])
    for bad in (
        {"k": 0, "axis": 1},
        {"k": 6, "axis": 1},
        {"k": 2, "axis": 2},
        {"k": 2.0, "axis": 1},
        {"k": 2, "axis": 1, "largest": 1},
    ):
        with pytest.raises(TypeError, match=r"\[_topk\]"):
            b._topk(x, **bad)
    v, i = b._topk(x, k=2, axis=-1)
    assert v.shape == (2, 2) and i.data_type == "int64"
