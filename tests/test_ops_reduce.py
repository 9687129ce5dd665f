"""Reductions and softmax against float64 numpy references: shape, then dtype, then values."""

import numpy as np
import pytest
from helpers import run_graph

import mltensor

FLOAT_ONLY = ["reduce_l2", "reduce_log_sum", "reduce_log_sum_exp", "reduce_mean"]
SUMLIKE = ["reduce_l1", "reduce_product", "reduce_sum", "reduce_sum_square"]
ANY = ["reduce_max", "reduce_min"]
ALL_OPS = FLOAT_ONLY + SUMLIKE + ANY
INT_TYPES = ["int32", "uint32", "int64", "uint64", "int8", "uint8"]


def ref(op, a, axes, keep):
    a = a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64)
    ax = tuple(range(a.ndim)) if axes is None else tuple(axes)
    kw = {"axis": ax, "keepdims": keep}
    return {
        "reduce_l1": lambda: np.abs(a).sum(**kw),
        "reduce_l2": lambda: np.sqrt((a * a).sum(**kw)),
        "reduce_log_sum": lambda: np.log(a.sum(**kw)),
        "reduce_log_sum_exp": lambda: lse(a, ax, keep),
        "reduce_max": lambda: a.max(**kw),
        "reduce_mean": lambda: a.mean(**kw),
        "reduce_min": lambda: a.min(**kw),
        "reduce_product": lambda: a.prod(**kw),
        "reduce_sum": lambda: a.sum(**kw),
        "reduce_sum_square": lambda: (a * a).sum(**kw),
    }[op]()


def lse(a, ax, keep):
    m = a.max(axis=ax, keepdims=True)
    r = np.log(np.exp(a - m).sum(axis=ax, keepdims=True)) + m
    return r if keep else r.reshape([s for d, s in enumerate(a.shape) if d not in ax])


def data(op, shape, dt, rng):
    """Inputs in each op's domain, with magnitudes that keep products and sums representable."""
    if dt in INT_TYPES:
        lo = 0 if dt.startswith("u") else -5
        hi = 3 if op == "reduce_product" else 9
        return rng.integers(lo, hi, size=shape).astype(dt)
    if op == "reduce_product":
        a = rng.uniform(0.7, 1.3, size=shape) * rng.choice([-1, 1], size=shape)
    elif op == "reduce_log_sum":
        a = rng.uniform(0.1, 2.0, size=shape)
    else:
        a = rng.standard_normal(shape) * 2
    return np.asarray(a).astype(dt)


def run_reduce(ctx, op, a, dt, **options):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=a.shape)
    y = getattr(b, op)(x, **options)
    return run_graph(ctx, {"y": y}, {"x": a}, b)["y"]


def check(r, e, dt, n_reduced, mean=False):
    """Float tolerance grows like sqrt(n) (rounding of an n-term sum), divided by n for a mean."""
    scale = max(1, n_reduced) ** (-0.5 if mean else 0.5)
    assert r.shape == e.shape
    assert r.dtype == np.dtype(dt)
    if dt in INT_TYPES:
        np.testing.assert_array_equal(r, e.astype(dt))
    elif dt == "float16":
        np.testing.assert_allclose(r.astype(np.float64), e, rtol=2e-3, atol=2e-3 * scale)
    else:
        np.testing.assert_allclose(r, e, rtol=3e-5, atol=1e-6 * scale)


CASES = [
    ((), None, False),
    ((), [], False),
    ((7,), None, False),
    ((7,), [], False),  # empty axes: the reduction of each single element (e.g. |x| for l1)
    ((3, 5), [1], False),
    ((3, 5), [0], True),
    ((2, 3, 4), [0, 2], False),  # non-contiguous reduced axes
    ((2, 3, 4), [2, 0], True),  # axes in any order
    ((2, 1, 3, 5), [1, 2], False),
    ((2, 3, 1, 4, 3), None, True),
    ((3, 70), [1], False),  # one workgroup per output, contiguous
    ((70, 3), [0], False),  # one workgroup per output, strided
    ((2, 9001), [1], False),  # two-level (partials + final)
]


@pytest.mark.parametrize("op", ALL_OPS)
@pytest.mark.parametrize("shape,axes,keep", CASES, ids=[f"{s}-{a}-{k}" for s, a, k in CASES])
def test_reduce_float32(ctx, rng, op, shape, axes, keep):
    if op == "reduce_product" and np.prod(shape) > 100:
        shape, axes = (3, 70), [1]  # a product of 9001 values is not representable
    a = data(op, shape, "float32", rng)
    r = run_reduce(ctx, op, a, "float32", axes=axes, keep_dimensions=keep)
    e = ref(op, a, axes, keep)
    check(r, e, "float32", a.size // max(1, e.size), op == "reduce_mean")


@pytest.mark.parametrize("op", ALL_OPS)
def test_reduce_float16(ctx, rng, op):
    a = data(op, (4, 3, 5), "float16", rng)
    r = run_reduce(ctx, op, a, "float16", axes=[0, 2])
    check(r, ref(op, a, [0, 2], False), "float16", 20, op == "reduce_mean")


# the spec allows 8-bit integers only for max/min (rejection tested below)
INT_CASES = [(op, dt) for op in SUMLIKE + ANY for dt in INT_TYPES if op in ANY or dt[-1] != "8"]


@pytest.mark.parametrize("op,dt", INT_CASES)
def test_reduce_integers(ctx, rng, op, dt):
    shape, axes = ((3, 4, 2), [1]) if op == "reduce_product" else ((3, 100, 2), [1])
    a = data(op, shape, dt, rng)
    r = run_reduce(ctx, op, a, dt, axes=axes, keep_dimensions=True)
    check(r, ref(op, a, axes, True), dt, 0)


def test_reduce_large_integer_sum_two_level(ctx, rng):
    a = rng.integers(-100, 100, size=(9000,)).astype("int32")
    r = run_reduce(ctx, "reduce_sum", a, "int32")
    check(r, np.array(a.astype(np.int64).sum()), "int32", 0)


def test_reduce_log_sum_exp_is_stable(ctx):
    a = np.array([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -1000.0]], np.float32)
    r = run_reduce(ctx, "reduce_log_sum_exp", a, "float32", axes=[1])
    check(r, ref("reduce_log_sum_exp", a, [1], True).reshape(2), "float32", 3)
    big = np.full((2, 5000), 500.0, np.float32)  # two-level path: partial maxima combined
    r = run_reduce(ctx, "reduce_log_sum_exp", big, "float32", axes=[1])
    check(r, np.full(2, 500.0 + np.log(5000.0)), "float32", 1)


def test_reduce_default_keeps_nothing(ctx, rng):
    a = data("reduce_sum", (2, 3), "float32", rng)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    assert b.reduce_sum(x).shape == ()
    assert b.reduce_sum(x, keep_dimensions=True).shape == (1, 1)
    assert b.reduce_sum(x, axes=[]).shape == (2, 3)
    assert b.reduce_mean(x, axes=[1], keep_dimensions=True).shape == (2, 1)
    r = run_graph(ctx, {"y": b.reduce_mean(x, axes=[0])}, {"x": a}, b)["y"]
    check(r, a.astype(np.float64).mean(0), "float32", 2, True)


def test_reduce_fused_with_elementwise(ctx, rng):
    # reductions take the outputs of fused elementwise chains and feed them
    a = data("reduce_sum", (4, 6), "float32", rng)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 6])
    y = b.sqrt(b.reduce_sum(b.mul(x, x), axes=[1]))
    r = run_graph(ctx, {"y": y}, {"x": a}, b)["y"]
    check(r, np.sqrt((a.astype(np.float64) ** 2).sum(1)), "float32", 6)


def test_reduce_support_limits(ctx):
    lim = ctx.op_support_limits()
    assert set(lim["reduce_mean"]["input"]["data_types"]) == {"float32", "float16"}
    assert set(lim["reduce_sum"]["input"]["data_types"]) == {"float32", "float16", "int32", "uint32", "int64", "uint64"}
    assert len(lim["reduce_max"]["input"]["data_types"]) == 8
    assert set(lim["softmax"]["input"]["data_types"]) == {"float32", "float16"}


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ALL_OPS)
def test_reduce_validation(ctx, op):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3, 4])
    with pytest.raises(TypeError, match=rf"\[{op}\].*out of range"):
        getattr(b, op)(x, axes=[3])
    with pytest.raises(TypeError, match="duplicates"):
        getattr(b, op)(x, axes=[1, 1])
    with pytest.raises(TypeError, match="integers"):
        getattr(b, op)(x, axes=[0.5])
    with pytest.raises(TypeError, match="integers"):
        getattr(b, op)(x, axes=1)
    with pytest.raises(TypeError, match="keep_dimensions"):
        getattr(b, op)(x, keep_dimensions=1)
    with pytest.raises(TypeError):
        getattr(b, op)(x, unknown=1)
    with pytest.raises(TypeError, match="MLOperand"):
        getattr(b, op)(np.zeros(3))
    other = mltensor.MLGraphBuilder(ctx).input("x", data_type="float32", shape=[2])
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        getattr(b, op)(other)


@pytest.mark.parametrize("op", FLOAT_ONLY)
def test_reduce_float_only_rejects_integers(ctx, op):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="int32", shape=[2, 3])
    with pytest.raises(TypeError, match=rf"\[{op}\] input data type int32"):
        getattr(b, op)(x)


@pytest.mark.parametrize("op", SUMLIKE)
def test_reduce_sumlike_rejects_8bit(ctx, op):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="int8", shape=[2, 3])
    with pytest.raises(TypeError, match=rf"\[{op}\] input data type int8"):
        getattr(b, op)(x)


# -- softmax ----------------------------------------------------------------------------------


def softmax_ref(a, axis):
    a = a.astype(np.float64)
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def run_softmax(ctx, a, axis, dt="float32"):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=a.shape)
    return run_graph(ctx, {"y": b.softmax(x, axis)}, {"x": a}, b)["y"]


SOFTMAX_CASES = [
    ((5,), 0),
    ((3, 7), 1),
    ((3, 7), 0),
    ((2, 3, 4, 5), 2),
    ((2, 1, 3, 2, 3), 4),
    ((3, 300), 1),
    ((200, 3), 0),
    ((2, 70, 3), 1),
]


@pytest.mark.parametrize("shape,axis", SOFTMAX_CASES)
def test_softmax(ctx, rng, shape, axis):
    a = (rng.standard_normal(shape) * 3).astype(np.float32)
    r = run_softmax(ctx, a, axis)
    e = softmax_ref(a, axis)
    assert r.shape == e.shape
    assert r.dtype == np.float32
    np.testing.assert_allclose(r, e, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape,axis", [((4, 9), 1), ((2, 100), 1)])
def test_softmax_float16(ctx, rng, shape, axis):
    a = rng.standard_normal(shape).astype(np.float16)
    r = run_softmax(ctx, a, axis, "float16")
    assert r.shape == shape
    assert r.dtype == np.float16
    np.testing.assert_allclose(r.astype(np.float64), softmax_ref(a, axis), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("shape", [(2, 5), (2, 500)])
def test_softmax_is_stable(ctx, shape):
    a = np.linspace(-1.0, 1.0, np.prod(shape)).reshape(shape).astype(np.float32)
    a[0] += 1000.0
    a[1] -= 1000.0
    r = run_softmax(ctx, a, 1)
    assert np.isfinite(r).all()
    np.testing.assert_allclose(r, softmax_ref(a, 1), rtol=1e-4, atol=1e-7)


def test_softmax_long_rows_split(ctx, rng, monkeypatch):
    """Rows past the split length take two launches: each chunk's (max, sum of exp) pairs, then
    per chunk the row's pairs combined and the chunk normalized (a lower split length here,
    so the test stays small); one row near -1000 and one near +1000."""
    from mltensor.ops import reduce as reduce_ops

    monkeypatch.setattr(reduce_ops, "SOFTMAX_SPLIT_K", 4096)
    monkeypatch.setattr(reduce_ops, "SOFTMAX_SPLIT_K_CPU", 4096)
    a = (rng.standard_normal((3, 20000)) * 4).astype(np.float32)
    a[1] += 1000.0
    a[2] -= 1000.0
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(a.shape))
    g = b.build_sync({"y": b.softmax(x, 1)})
    assert any("softmax" in n and "partial" in n for n in g.kernel_names), g.kernel_names
    g.destroy()
    r = run_softmax(ctx, a, 1)
    np.testing.assert_allclose(r, softmax_ref(a, 1), rtol=1e-4, atol=1e-9)


def test_softmax_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError):
        b.softmax(x)  # axis is required
    with pytest.raises(TypeError, match=r"\[softmax\] axis must be in \[0, 2\)"):
        b.softmax(x, 2)
    with pytest.raises(TypeError, match="integer"):
        b.softmax(x, 1.0)
    with pytest.raises(TypeError, match="integer"):
        b.softmax(x, True)
    xi = b.input("xi", data_type="int32", shape=[2, 3])
    with pytest.raises(TypeError, match=r"\[softmax\] input data type int32"):
        b.softmax(xi, 1)
    s = b.input("s", data_type="float32", shape=[])
    with pytest.raises(TypeError, match="rank"):
        b.softmax(s, 0)
    other = mltensor.MLGraphBuilder(ctx).input("x", data_type="float32", shape=[2])
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        b.softmax(other, 0)


def test_folded_grids(ctx, rng, monkeypatch):
    # Past 65535 workgroups a launch is folded into 2-D; shrink the limit to test that cheaply.
    import mltensor.dynamic.kernels as dyn_kernels

    monkeypatch.setattr(dyn_kernels, "MAX_GROUPS", 7)
    for shape, axis in [((50, 40), 1), ((3000, 5), 1), ((20, 5000), 1)]:  # group, thread, two-level
        a = data("reduce_sum", shape, "float32", rng)
        r = run_reduce(ctx, "reduce_sum", a, "float32", axes=[axis])
        check(r, ref("reduce_sum", a, [axis], False), "float32", shape[axis])
    for shape in [(50, 40), (700, 3)]:
        a = (rng.standard_normal(shape) * 3).astype(np.float32)
        np.testing.assert_allclose(run_softmax(ctx, a, 1), softmax_ref(a, 1), rtol=1e-5, atol=1e-7)


def test_reduce_of_constants_folded_at_build(ctx, rng):
    # constant subgraphs (including the two-level path with its scratch buffer) run once at build
    c1 = rng.standard_normal((3, 40)).astype(np.float32)
    c2 = rng.standard_normal((2, 9000)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3])
    s1 = b.softmax(b.constant(c1), 1)
    folded = b.reduce_mean(b.reduce_sum(b.constant(c2), axes=[1]))
    y = b.add(b.mul(x, b.reduce_max(s1, axes=[1])), folded)
    a = rng.standard_normal(3).astype(np.float32)
    r = run_graph(ctx, {"y": y}, {"x": a}, b)["y"]
    e = a * softmax_ref(c1, 1).max(1) + c2.astype(np.float64).sum(1).mean()
    check(r, e, "float32", 9000)
