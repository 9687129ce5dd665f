"""Data movement operators against numpy: concat, expand, gather, pad, reshape, slice, split,
transpose, where. Assertions in the order shape, dtype, values."""

import numpy as np
import pytest
from helpers import FUSION, assert_exact, run_graph

import mltensor

NP = mltensor.dtypes.NUMPY


def _data(rng, dt, shape):
    if dt in ("float32", "float16"):
        return rng.standard_normal(shape).astype(NP[dt])
    info = np.iinfo(NP[dt])
    lo, hi = max(info.min, -100), min(info.max, 100)
    return rng.integers(lo, hi, size=shape, endpoint=True).astype(NP[dt])


_check = assert_exact


def _build(ctx, dt, shape, fn):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=shape)
    return b, x, fn(b, x)


def _one(ctx, rng, dt, shape, fn):
    """Build y = fn(b, x) for one input x, run it, return (x data, y result)."""
    b, x, y = _build(ctx, dt, shape, fn)
    xv = _data(rng, dt, shape)
    return xv, run_graph(ctx, {"y": y}, {"x": xv}, b)["y"]


def _kernels(ctx, outputs_fn, dt="float32", shape=(2, 3, 4)):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=shape)
    g = b.build_sync(outputs_fn(b, x))
    names = g.kernel_names
    g.destroy()
    return names


# -- reshape ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,new",
    [
        ((), [1, 1]),
        ((1, 1), ()),
        ((2, 3), [3, 2]),
        ((2, 3, 5), [5, 6]),
        ((1, 2, 3, 2, 1), [12]),
        ((12,), [1, 2, 1, 3, 2]),
    ],
)
def test_reshape_as_output_is_a_copy(ctx, rng, shape, new):
    xv, got = _one(ctx, rng, "float32", shape, lambda b, x: b.reshape(x, new))
    _check(got, xv.reshape(new))


@pytest.mark.parametrize("dt", ["float16", "int8", "uint8", "int64", "uint32"])
def test_reshape_dtypes(ctx, rng, dt):
    xv, got = _one(ctx, rng, dt, (3, 5), lambda b, x: b.reshape(x, [5, 3]))
    _check(got, xv.reshape(5, 3))


def test_reshape_intermediate_is_an_alias(ctx, rng):
    # relu(reshape(x)): only the relu kernel runs, reading x's buffer directly
    names = _kernels(ctx, lambda b, x: {"y": b.relu(b.reshape(x, [4, 6]))})
    assert len(names) == 1 and names[0].startswith("ew_relu"), names
    xv, got = _one(ctx, rng, "float32", (2, 3, 4), lambda b, x: b.relu(b.reshape(b.abs(x), [4, 6])))
    _check(got, np.abs(xv).reshape(4, 6))


def test_reshape_chain_between_ops(ctx, rng):
    def fn(b, x):
        t = b.transpose(b.reshape(b.neg(x), [6, 4]))  # neg -> alias -> transpose
        return b.reshape(b.reshape(t, [2, 2, 6]), [24])

    xv, got = _one(ctx, rng, "float32", (2, 3, 4), fn)
    _check(got, (-xv).reshape(6, 4).T.reshape(24))


def test_reshape_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match=r"\[reshape\].*7 elements, expected 6"):
        b.reshape(x, [7])
    with pytest.raises(TypeError, match=r"\[reshape\]"):
        b.reshape(x, [0, 6])
    with pytest.raises(TypeError, match=r"\[reshape\]"):
        b.reshape(x, [-1, 6])
    with pytest.raises(TypeError, match=r"\[reshape\]"):
        b.reshape(x, "23")
    with pytest.raises(TypeError, match=r"\[reshape\] input must be an MLOperand"):
        b.reshape(np.zeros(6), [6])


# -- transpose ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 5), (2, 3, 4, 5), (2, 1, 3, 2, 3)])
def test_transpose_default_reverses(ctx, rng, shape):
    xv, got = _one(ctx, rng, "float32", shape, lambda b, x: b.transpose(x))
    _check(got, np.transpose(xv))


@pytest.mark.parametrize(
    "shape,perm",
    [
        ((2, 3, 4), [0, 2, 1]),
        ((2, 3, 4, 5), [0, 2, 3, 1]),
        ((2, 3, 4, 5), [0, 3, 1, 2]),
        ((3, 1, 2, 2, 3), [4, 1, 0, 3, 2]),
    ],
)
def test_transpose_permutation(ctx, rng, shape, perm):
    xv, got = _one(ctx, rng, "float32", shape, lambda b, x: b.transpose(x, permutation=perm))
    _check(got, np.transpose(xv, perm))


@pytest.mark.parametrize("dt", ["float16", "int32", "int8", "uint8", "int64", "uint64"])
def test_transpose_dtypes(ctx, rng, dt):
    xv, got = _one(ctx, rng, dt, (3, 5, 2), lambda b, x: b.transpose(x, permutation=[1, 2, 0]))
    _check(got, np.transpose(xv, [1, 2, 0]))


def test_transpose_moving_unit_dims_only_is_an_alias(ctx):
    names = _kernels(ctx, lambda b, x: {"y": b.abs(b.transpose(x, permutation=[1, 0, 2]))}, shape=(1, 3, 4))
    assert len(names) == 1 and names[0].startswith("ew_abs"), names


def test_transpose_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3, 4])
    for bad in ([0, 1], [0, 1, 1], [0, 1, 3], [0, 1, 2, 3], [0, 1, -2]):
        with pytest.raises(TypeError, match=r"\[transpose\] permutation"):
            b.transpose(x, permutation=bad)


# -- slice --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,starts,sizes,strides",
    [
        ((), [], [], None),
        ((7,), [2], [5], None),
        ((7,), [1], [6], [4]),
        ((5, 6), [1, 0], [3, 6], None),
        ((5, 6), [0, 1], [5, 5], [2, 3]),
        ((3, 4, 5), [1, 1, 1], [2, 3, 3], [1, 2, 2]),
        ((2, 3, 4, 5, 3), [0, 1, 0, 2, 1], [2, 2, 4, 3, 1], [1, 1, 3, 2, 1]),
    ],
)
def test_slice(ctx, rng, shape, starts, sizes, strides):
    xv, got = _one(ctx, rng, "float32", shape, lambda b, x: b.slice(x, starts, sizes, strides=strides))
    st = strides or [1] * len(shape)
    want = xv[tuple(np.s_[s : s + n : k] for s, n, k in zip(starts, sizes, st))]
    _check(got, want)


@pytest.mark.parametrize("dt", ["float16", "int8", "uint64"])
def test_slice_dtypes(ctx, rng, dt):
    xv, got = _one(ctx, rng, dt, (5, 7), lambda b, x: b.slice(x, [1, 2], [3, 5], strides=[2, 2]))
    _check(got, xv[1:4:2, 2:7:2])


def test_full_slice_is_an_alias(ctx):
    names = _kernels(ctx, lambda b, x: {"y": b.neg(b.slice(x, [0, 0, 0], [2, 3, 4]))})
    assert len(names) == 1, names


def test_slice_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 5])
    with pytest.raises(TypeError, match=r"\[slice\] sizes must be positive"):
        b.slice(x, [0, 0], [0, 5])
    with pytest.raises(TypeError, match=r"\[slice\] starts\[1\] \+ sizes\[1\]"):
        b.slice(x, [0, 1], [4, 5])
    with pytest.raises(TypeError, match=r"\[slice\]"):
        b.slice(x, [4, 0], [1, 5])
    with pytest.raises(TypeError, match=r"\[slice\] starts and sizes must both have 2 values"):
        b.slice(x, [0], [4])
    with pytest.raises(TypeError, match=r"\[slice\] strides must be >= 1"):
        b.slice(x, [0, 0], [4, 5], strides=[1, 0])
    with pytest.raises(TypeError, match=r"\[slice\] strides must have 2 values"):
        b.slice(x, [0, 0], [4, 5], strides=[1])
    with pytest.raises(TypeError, match=r"\[slice\]"):
        b.slice(x, [0, -1], [4, 5])


# -- split --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,splits,axis",
    [
        ((6,), 3, 0),
        ((4, 6), 2, 1),
        ((2, 5, 3), [1, 3, 1], 1),
        ((3, 4, 5), [2, 3], 2),
        ((4, 3, 2, 2, 3), [1, 3], 0),
        ((5,), [5], 0),
    ],
)
def test_split(ctx, rng, shape, splits, axis):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=shape)
    outs = b.split(x, splits, axis=axis)
    assert isinstance(outs, list)
    n = splits if isinstance(splits, int) else len(splits)
    assert len(outs) == n
    xv = _data(rng, "float32", shape)
    got = run_graph(ctx, {f"o{k}": o for k, o in enumerate(outs)}, {"x": xv}, b)
    cuts = np.cumsum(splits)[:-1] if not isinstance(splits, int) else splits
    for k, want in enumerate(np.split(xv, cuts, axis=axis)):
        assert outs[k].shape == want.shape
        _check(got[f"o{k}"], want)


def test_split_outputs_feed_ops(ctx, rng):
    def fn(b, x):
        a, c, d = b.split(x, [1, 2, 1], axis=1)
        return (
            b.add(b.mul(a, d), b.reduce_sum(c, axes=[1], keep_dimensions=True))
            if hasattr(b, "reduce_sum")
            else b.add(b.mul(a, d), a)
        )

    b, x, y = _build(ctx, "float32", (3, 4, 2), fn)
    xv = _data(rng, "float32", (3, 4, 2))
    got = run_graph(ctx, {"y": y}, {"x": xv}, b)["y"]
    a, c, d = xv[:, :1], xv[:, 1:3], xv[:, 3:]
    want = a * d + (c.sum(1, keepdims=True) if hasattr(b, "reduce_sum") else a)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dt", ["float16", "int8", "int64"])
def test_split_dtypes(ctx, rng, dt):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=[3, 5])
    o1, o2 = b.split(x, [2, 3], axis=1)
    xv = _data(rng, dt, (3, 5))
    got = run_graph(ctx, {"a": o1, "b": o2}, {"x": xv}, b)
    _check(got["a"], xv[:, :2])
    _check(got["b"], xv[:, 2:])


def test_split_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 6])
    with pytest.raises(TypeError, match=r"\[split\] splits \(4\) must evenly divide"):
        b.split(x, 4, axis=1)
    with pytest.raises(TypeError, match=r"\[split\] splits \(a count\) must be positive"):
        b.split(x, 0)
    with pytest.raises(TypeError, match=r"\[split\] splits sizes \[2, 3\] sum to 5"):
        b.split(x, [2, 3], axis=1)
    with pytest.raises(TypeError, match=r"\[split\] splits \(sizes\)"):
        b.split(x, [4, 0])
    with pytest.raises(TypeError, match=r"\[split\] axis must be below"):
        b.split(x, 2, axis=2)
    with pytest.raises(TypeError, match=r"\[split\] axis"):
        b.split(x, 2, axis=-1)
    s = b.input("s", data_type="float32", shape=[])
    with pytest.raises(TypeError, match=r"\[split\] input rank"):
        b.split(s, 1)


# -- concat -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes,axis",
    [
        ([(3,), (5,)], 0),
        ([(2, 3), (2, 1), (2, 4)], 1),
        ([(1, 3, 4), (2, 3, 4)], 0),
        ([(2, 3, 5), (2, 1, 5), (2, 2, 5)], 1),
        ([(2, 3, 4, 1), (2, 3, 4, 2)], 3),
        ([(2, 1, 2, 3, 3), (2, 1, 2, 1, 3)], 3),
    ],
)
def test_concat(ctx, rng, shapes, axis):
    b = mltensor.MLGraphBuilder(ctx)
    xs = [b.input(f"x{k}", data_type="float32", shape=s) for k, s in enumerate(shapes)]
    y = b.concat(xs, axis)
    vals = {f"x{k}": _data(rng, "float32", s) for k, s in enumerate(shapes)}
    got = run_graph(ctx, {"y": y}, vals, b)["y"]
    _check(got, np.concatenate(list(vals.values()), axis=axis))


@pytest.mark.parametrize("dt", ["float16", "int8", "uint8", "int64", "int32"])
def test_concat_dtypes(ctx, rng, dt):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=[2, 3])
    cv = _data(rng, dt, (2, 2))
    y = b.concat([x, b.constant(cv), x], 1)
    xv = _data(rng, dt, (2, 3))
    got = run_graph(ctx, {"y": y}, {"x": xv}, b)["y"]
    _check(got, np.concatenate([xv, cv, xv], 1))


def test_concat_of_intermediates_reuses_pooled_memory(ctx, rng):
    # Each concat writes its output in several launches; the output must be allocated before the
    # first of them and stay alive until the last reader, while freed inputs get reused.
    def fn(b, x):
        a = b.neg(x)
        c = b.concat([a, b.abs(x), a], 1)  # [2, 9, 4]
        d = b.concat([b.relu(c), c], 2)  # [2, 9, 8]
        e = b.transpose(d, permutation=[2, 0, 1])
        return b.concat([b.slice(e, [0, 0, 0], [3, 2, 9]), b.neg(b.slice(e, [5, 0, 0], [3, 2, 9]))], 0)

    xv, got = _one(ctx, rng, "float32", (2, 3, 4), fn)
    a = -xv
    c = np.concatenate([a, np.abs(xv), a], 1)
    d = np.concatenate([np.maximum(c, 0), c], 2)
    e = np.transpose(d, [2, 0, 1])
    _check(got, np.concatenate([e[0:3], -e[5:8]], 0))


def test_concat_single_input(ctx, rng):
    xv, got = _one(ctx, rng, "float32", (2, 3), lambda b, x: b.concat([x], 1))
    _check(got, xv)


def test_concat_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match=r"\[concat\] inputs must not be empty"):
        b.concat([], 0)
    with pytest.raises(TypeError, match=r"\[concat\] axis must be below"):
        b.concat([x, x], 2)
    with pytest.raises(TypeError, match=r"\[concat\] inputs\[1\] shape \[3, 3\] must match"):
        b.concat([x, b.input("z", data_type="float32", shape=[3, 3])], 1)
    with pytest.raises(TypeError, match=r"\[concat\] inputs\[1\] shape"):
        b.concat([x, b.input("r", data_type="float32", shape=[2, 3, 1])], 1)
    with pytest.raises(TypeError, match=r"\[concat\] inputs\[1\] data type int32 differs"):
        b.concat([x, b.input("i", data_type="int32", shape=[2, 3])], 0)
    with pytest.raises(TypeError, match=r"\[concat\] inputs\[1\] must be an MLOperand"):
        b.concat([x, None], 0)
    with pytest.raises(TypeError, match=r"\[concat\]"):
        b.concat([b.input("s", data_type="float32", shape=[])], 0)


# -- expand -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,new",
    [
        ((), [2, 3]),
        ((3,), [2, 3]),
        ((3, 1), [3, 4]),
        ((2, 1, 3), [4, 2, 5, 3]),
        ((1, 2, 1, 1, 3), [2, 2, 2, 2, 3]),
        ((2, 3), [2, 3]),
    ],
)
def test_expand(ctx, rng, shape, new):
    xv, got = _one(ctx, rng, "float32", shape, lambda b, x: b.expand(x, new))
    _check(got, np.broadcast_to(xv, new))


@pytest.mark.parametrize("dt", ["float16", "int8", "uint8", "int64"])
def test_expand_dtypes(ctx, rng, dt):
    xv, got = _one(ctx, rng, dt, (3, 1), lambda b, x: b.expand(x, [2, 3, 4]))
    _check(got, np.broadcast_to(xv, (2, 3, 4)))


def test_expand_fuses_into_elementwise(ctx, rng):
    names = _kernels(ctx, lambda b, x: {"y": b.add(b.expand(b.slice(x, [0, 0, 0], [1, 3, 1]), [2, 3, 4]), x)})
    assert not FUSION or (len(names) == 2 and names[1].startswith("ew_expand_add")), names
    xv, got = _one(
        ctx, rng, "float32", (2, 3, 4), lambda b, x: b.add(b.expand(b.slice(x, [0, 0, 0], [1, 3, 1]), [2, 3, 4]), x)
    )
    _check(got, xv[:1, :, :1] + xv)


def test_expand_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match=r"\[expand\].*cannot broadcast"):
        b.expand(x, [2, 4])
    with pytest.raises(TypeError, match=r"\[expand\].*cannot broadcast"):
        b.expand(x, [3])  # expand never drops dimensions (unidirectional)
    with pytest.raises(TypeError, match=r"\[expand\]"):
        b.expand(x, [0, 3])


# -- pad ----------------------------------------------------------------------------------------

NP_PAD = {"constant": "constant", "edge": "edge", "reflection": "reflect"}


@pytest.mark.parametrize("mode", ["constant", "edge", "reflection"])
@pytest.mark.parametrize(
    "shape,begin,end",
    [
        ((5,), [2], [3]),
        ((3, 4), [1, 2], [2, 1]),
        ((2, 3, 4), [0, 2, 1], [1, 0, 3]),
        ((1, 3, 3, 2), [0, 1, 1, 0], [0, 2, 2, 1]),
        ((2, 1, 3, 2, 3), [1, 0, 2, 1, 0], [0, 0, 1, 1, 2]),
    ],
)
def test_pad(ctx, rng, mode, shape, begin, end):
    if mode == "reflection" and any(p >= d for p, d in zip(begin + end, shape + shape)):
        pytest.skip("reflection padding must be smaller than the dimension")
    xv, got = _one(ctx, rng, "float32", shape, lambda b, x: b.pad(x, begin, end, mode=mode))
    _check(got, np.pad(xv, list(zip(begin, end)), mode=NP_PAD[mode]))


def test_pad_spec_example(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    outs = {m: b.pad(x, [1, 2], [1, 2], mode=m) for m in NP_PAD}
    got = run_graph(ctx, outs, {"x": np.arange(1, 7, dtype=np.float32).reshape(2, 3)}, b)
    _check(got["edge"], np.array([[1, 1, 1, 2, 3, 3, 3]] * 2 + [[4, 4, 4, 5, 6, 6, 6]] * 2, np.float32))
    _check(got["reflection"], np.array([[6, 5, 4, 5, 6, 5, 4], [3, 2, 1, 2, 3, 2, 1]] * 2, np.float32))
    assert got["constant"].sum() == 21 and got["constant"][1, 2] == 1


@pytest.mark.parametrize(
    "dt,value,want",
    [
        ("float32", -2.5, -2.5),
        ("float16", 1e-3, np.float16(1e-3)),
        ("int8", -7, -7),
        ("int8", 300, 127),
        ("uint8", 9, 9),
        ("uint8", -3, 0),
        ("int32", 2.9, 2),
        ("int64", -5, -5),
        ("uint32", 4e9, 4000000000),
    ],
)
def test_pad_constant_value_cast(ctx, rng, dt, value, want):
    xv, got = _one(ctx, rng, dt, (2, 3), lambda b, x: b.pad(x, [1, 0], [0, 2], value=value))
    _check(got, np.pad(xv, [(1, 0), (0, 2)], constant_values=np.array(want, NP[dt])))


def test_pad_value_inf(ctx, rng):
    xv, got = _one(ctx, rng, "float32", (3,), lambda b, x: b.pad(x, [1], [1], value=float("-inf")))
    _check(got, np.pad(xv, 1, constant_values=-np.inf))


@pytest.mark.parametrize("mode", ["edge", "reflection"])
@pytest.mark.parametrize("dt", ["int8", "uint8", "float16", "int64"])
def test_pad_modes_dtypes(ctx, rng, mode, dt):
    xv, got = _one(ctx, rng, dt, (3, 4), lambda b, x: b.pad(x, [2, 1], [1, 3], mode=mode))
    _check(got, np.pad(xv, [(2, 1), (1, 3)], mode=NP_PAD[mode]))


def test_pad_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match=r"\[pad\] reflection padding must be smaller"):
        b.pad(x, [2, 0], [0, 0], mode="reflection")
    with pytest.raises(TypeError, match=r"\[pad\] reflection padding must be smaller"):
        b.pad(x, [0, 0], [0, 3], mode="reflection")
    b.pad(x, [1, 2], [1, 2], mode="reflection")  # the largest allowed
    with pytest.raises(TypeError, match=r"\[pad\] beginning_padding and ending_padding must both have 2"):
        b.pad(x, [1], [1, 1])
    with pytest.raises(TypeError, match=r"\[pad\] mode must be one of"):
        b.pad(x, [1, 1], [1, 1], mode="symmetric")
    with pytest.raises(TypeError, match=r"\[pad\] value must be a number"):
        b.pad(x, [1, 1], [1, 1], value="0")
    with pytest.raises(TypeError, match=r"\[pad\]"):
        b.pad(x, [1, -1], [1, 1])
    with pytest.raises(TypeError, match=r"\[pad\] input rank"):
        b.pad(b.input("s", data_type="float32", shape=[]), [], [])


# -- gather -------------------------------------------------------------------------------------


def _np_gather(x, idx, axis):
    n = x.shape[axis]
    idx = np.where(idx < 0, idx + n, idx)
    return np.take(x, np.clip(idx, 0, n - 1), axis=axis)


@pytest.mark.parametrize("it", ["int32", "int64", "uint32"])
@pytest.mark.parametrize(
    "shape,idx_shape,axis",
    [
        ((5,), (3,), 0),
        ((4, 3), (2,), 0),
        ((4, 3), (2, 2), 1),
        ((3, 4, 5), (), 1),
        ((2, 3, 4, 5), (3, 2), 2),
        ((2, 3, 2, 3, 4), (5,), 4),
    ],
)
def test_gather(ctx, rng, it, shape, idx_shape, axis):
    n = shape[axis]
    lo = -n if it != "uint32" else 0
    iv = rng.integers(lo, n, size=idx_shape).astype(NP[it])
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=shape)
    i = b.input("i", data_type=it, shape=idx_shape)
    y = b.gather(x, i, axis=axis)
    xv = _data(rng, "float32", shape)
    got = run_graph(ctx, {"y": y}, {"x": xv, "i": iv}, b)["y"]
    _check(got, _np_gather(xv, iv.astype(np.int64), axis))


@pytest.mark.parametrize("it", ["int32", "int64", "uint32"])
def test_gather_out_of_range_is_clamped(ctx, rng, it):
    vals = [0, 3, 4, 100, 7] if it == "uint32" else [-1, -4, -5, -100, 4, 100]
    iv = np.array(vals, NP[it])
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="int32", shape=[4, 2])
    y = b.gather(x, b.constant(iv), axis=0)
    xv = np.arange(8, dtype=np.int32).reshape(4, 2)
    got = run_graph(ctx, {"y": y}, {"x": xv}, b)["y"]
    _check(got, _np_gather(xv, iv.astype(np.int64), 0))


@pytest.mark.parametrize("dt", ["float16", "int8", "uint8", "int64"])
def test_gather_dtypes(ctx, rng, dt):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=[3, 5])
    iv = np.array([[4, -1], [0, 2]], np.int32)
    y = b.gather(x, b.constant(iv), axis=1)
    xv = _data(rng, dt, (3, 5))
    _check(run_graph(ctx, {"y": y}, {"x": xv}, b)["y"], _np_gather(xv, iv, 1))


def test_gather_spec_example(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 3])
    y1 = b.gather(x, b.constant(np.array([3, 1], np.uint32)))
    y3 = b.gather(x, b.constant(np.array([[0, 1], [1, 2]], np.uint32)), axis=1)
    xv = np.array([[0, 1, 2], [10, 11, 12], [20, 21, 22], [30, 31, 32]], np.float32)
    got = run_graph(ctx, {"y1": y1, "y3": y3}, {"x": xv}, b)
    _check(got["y1"], np.array([[30, 31, 32], [10, 11, 12]], np.float32))
    _check(got["y3"], xv[:, [[0, 1], [1, 2]]])


def test_gather_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 3])
    i = b.input("i", data_type="int32", shape=[2])
    with pytest.raises(TypeError, match=r"\[gather\] indices data type float32 is not supported"):
        b.gather(x, x)
    with pytest.raises(TypeError, match=r"\[gather\] indices data type uint8"):
        b.gather(x, b.input("u", data_type="uint8", shape=[2]))
    with pytest.raises(TypeError, match=r"\[gather\] axis must be below the input's rank 2, got 2"):
        b.gather(x, i, axis=2)
    with pytest.raises(TypeError, match=r"\[gather\] input rank"):
        b.gather(b.input("s", data_type="float32", shape=[]), i)


# -- where --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cs,ts,fs",
    [
        ((2, 3), (2, 3), (2, 3)),
        ((3,), (2, 3), ()),
        ((2, 1, 4), (3, 1), (1, 3, 4)),
        ((), (4,), (2, 4)),
        ((2, 1, 1, 1, 3), (1, 2, 1, 3), (2, 1, 2, 1, 1)),
    ],
)
def test_where_broadcasting(ctx, rng, cs, ts, fs):
    b = mltensor.MLGraphBuilder(ctx)
    c = b.input("c", data_type="uint8", shape=cs)
    t = b.input("t", data_type="float32", shape=ts)
    f = b.input("f", data_type="float32", shape=fs)
    y = b.where(c, t, f)
    vals = {
        "c": rng.integers(0, 3, size=cs).astype(np.uint8),  # any non-zero is true
        "t": _data(rng, "float32", ts),
        "f": _data(rng, "float32", fs),
    }
    got = run_graph(ctx, {"y": y}, vals, b)["y"]
    _check(got, np.where(vals["c"] != 0, vals["t"], vals["f"]))


@pytest.mark.parametrize("dt", ["float16", "int32", "int8", "uint8", "int64", "uint32"])
def test_where_dtypes(ctx, rng, dt):
    b = mltensor.MLGraphBuilder(ctx)
    c = b.input("c", data_type="uint8", shape=[2, 3])
    t = b.input("t", data_type=dt, shape=[2, 3])
    fv = _data(rng, dt, (3,))
    y = b.where(c, t, b.constant(fv))
    cv = np.array([[1, 0, 5], [0, 0, 1]], np.uint8)
    tv = _data(rng, dt, (2, 3))
    _check(run_graph(ctx, {"y": y}, {"c": cv, "t": tv}, b)["y"], np.where(cv != 0, tv, fv))


def test_where_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    c = b.input("c", data_type="uint8", shape=[2, 3])
    t = b.input("t", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match=r"\[where\] condition data type float32 is not supported"):
        b.where(t, t, t)
    with pytest.raises(TypeError, match=r"\[where\] false_value data type int32 differs"):
        b.where(c, t, b.input("i", data_type="int32", shape=[2, 3]))
    with pytest.raises(TypeError, match=r"\[where\] .*not broadcastable"):
        b.where(c, t, b.input("f", data_type="float32", shape=[4]))
    with pytest.raises(TypeError, match=r"\[where\] .*not broadcastable"):
        b.where(b.input("c2", data_type="uint8", shape=[3, 1]), t, t)


def test_support_limits_list_movement_ops(ctx):
    lim = ctx.op_support_limits()
    assert lim["gather"]["indices"]["data_types"] == ["int32", "uint32", "int64"]
    assert lim["where"]["condition"]["data_types"] == ["uint8"]
    assert set(lim["concat"]) == {"inputs", "output"}
    assert set(lim["split"]) == {"input", "outputs"}
    for op in ("concat", "expand", "pad", "reshape", "slice", "split", "transpose", "where"):
        assert op in lim


def test_movement_of_constants_and_shared_outputs(ctx):
    # constant inputs: bound in place, folded at build when not outputs, copied when outputs
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, 2])
    cv = np.arange(6, dtype=np.float32).reshape(2, 3)
    c = b.constant(cv)
    c16 = b.constant(cv.astype(np.float16))
    halves = b.concat([b.slice(c, [0, 0], [1, 3]), b.slice(c, [1, 0], [1, 3])], 1)
    outs = {
        "r": b.reshape(c, [3, 2]),
        "t": b.transpose(c),
        "f": b.add(b.transpose(c), x),
        "g": b.add(b.reshape(halves, [3, 2]), x),
        "h": b.reshape(c16, [6]),
        "p": b.pad(c16, [0, 1], [0, 0], value=3),
    }
    got = run_graph(ctx, outs, {"x": np.ones((3, 2), np.float32)}, b)
    _check(got["r"], cv.reshape(3, 2))
    _check(got["t"], cv.T)
    _check(got["f"], cv.T + 1)
    _check(got["g"], cv.reshape(3, 2) + 1)
    _check(got["h"], cv.reshape(6).astype(np.float16))
    _check(got["p"], np.pad(cv, [(0, 0), (1, 0)], constant_values=3).astype(np.float16))
    # one value as three outputs, two of them through aliases (each output gets its own copy)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    y = b.relu(x)
    got = run_graph(ctx, {"a": y, "b": b.reshape(y, [6]), "c": b.transpose(y, permutation=[0, 1])}, {"x": 2 - cv}, b)
    want = np.maximum(2 - cv, 0)
    _check(got["a"], want)
    _check(got["b"], want.reshape(6))
    _check(got["c"], want)
