"""int64/uint64 with values beyond 32 bits, in both compute modes: native i64/u64 where the device
has "shader-int64" (lavapipe has it), and two 32-bit words (shaders/int64e.wgsl) where it does not,
tested on a context that ignores the feature (MLTENSOR_DISABLE_INT64=1: its device is created
without it, so a kernel using native 64-bit integers would fail to compile there). Every test
below runs in both modes. References are numpy (wrapping integer arithmetic, like the GPU)."""

import numpy as np
import pytest
from helpers import assert_exact, context_with_env, run_graph

import mltensor
from mltensor import dtypes, ml
from mltensor.front.context import _int64_disabled

I64 = np.int64
U64 = np.uint64
BIG = np.array([2**40, -(2**50), 7, -3, 2**62, -(2**63), 2**63 - 1, 0], I64)
BIG2 = np.array([3, 2**45, -(2**33), 5, -(2**61), 1, -1, 2**32], I64)
UBIG = np.array([2**40, 2**63, 2**64 - 1, 3, 2**32, 0, 2**50 + 1, 9], U64)
UBIG2 = np.array([7, 2**62, 1, 2**33, 2**32 - 1, 5, 2**12, 2**63 + 5], U64)


@pytest.fixture(scope="module")
def emulated_ctx():
    c = context_with_env(MLTENSOR_DISABLE_INT64="1")
    yield c
    c.destroy()


@pytest.fixture(scope="module", params=["native", "emulated"])
def nctx(request, ctx, emulated_ctx):
    if request.param == "emulated":
        return emulated_ctx
    if not ctx._int64:
        pytest.skip("the adapter has no shader-int64 (the emulated run covers this device)")
    return ctx


def _in(b, name, arr):
    return b.input(name, data_type=dtypes.normalize(arr.dtype), shape=list(arr.shape))


_check = assert_exact


def _wrap(fn, *arrays):
    with np.errstate(over="ignore"):
        return fn(*arrays)


def test_context_uses_shader_int64_when_the_adapter_has_it(ctx):
    adapter = ctx.device.adapter
    assert ctx._int64 == ("shader-int64" in adapter.features and not _int64_disabled())
    assert ("shader-int64" in ctx.features) == ctx._int64


def test_kernels_compute_in_64_bits(nctx):
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", BIG)
    g = b.build_sync({"y": b.add(x, x)})
    # no unpack/pack edges: the int64 tensors are bound in place
    assert not any(k.startswith(("unpack", "pack")) for k in g.kernel_names), g.kernel_names
    g.destroy()


ARITHMETIC = ("add", "sub", "mul", "max", "min", "div")


def _check_arithmetic(r, a, c):
    """Results of ARITHMETIC on a, c: wrapping like numpy; division truncates toward zero and
    gives 0 for a zero divisor (computed exactly in Python ints, then wrapped)."""
    _check(r["add"], _wrap(np.add, a, c))
    _check(r["sub"], _wrap(np.subtract, a, c))
    _check(r["mul"], _wrap(np.multiply, a, c))
    _check(r["max"], np.maximum(a, c))
    _check(r["min"], np.minimum(a, c))
    q = [0 if d == 0 else abs(p) // abs(d) * (1 if (p < 0) == (d < 0) else -1) for p, d in zip(a.tolist(), c.tolist())]
    _check(r["div"], np.array([v & (2**64 - 1) for v in q], np.uint64).astype(a.dtype))


@pytest.mark.parametrize("a, c", [(BIG, BIG2), (UBIG, UBIG2)], ids=["int64", "uint64"])
def test_binary_arithmetic(nctx, a, c):
    b = mltensor.MLGraphBuilder(nctx)
    x, y = _in(b, "x", a), _in(b, "y", c)
    r = run_graph(nctx, {op: getattr(b, op)(x, y) for op in ARITHMETIC}, {"x": a, "y": c}, b)
    _check_arithmetic(r, a, c)


@pytest.mark.parametrize("dt", [I64, U64])
def test_pow(nctx, dt):
    a = np.array([3, -2, 7, 1, -1, -1, 5, 0, 2**40 + 3, 2, -3], I64).astype(dt)
    e = np.array([5, 63, 23, -7, -3, -4, -1, 0, 3, 64, 41], I64).astype(dt)
    b = mltensor.MLGraphBuilder(nctx)
    r = run_graph(nctx, {"p": b.pow(_in(b, "a", a), _in(b, "e", e))}, {"a": a, "e": e}, b)
    signed = dt == I64
    want = []
    for x, k in zip(a.tolist(), e.tolist()):
        if signed and k < 0:  # 1 / x^-k truncated toward zero
            want.append(1 if x == 1 else (-1 if k % 2 else 1) if x == -1 else 0)
        else:
            want.append(pow(x, k, 2**64))  # wrapping, as the GPU
    _check(r["p"], np.array([w & (2**64 - 1) for w in want], np.uint64).astype(dt))


def test_unary_and_activations(nctx):
    a = BIG[BIG != -(2**63)]  # neg/abs of the minimum overflow
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", a)
    outs = {"neg": b.neg(x), "abs": b.abs(x), "sign": b.sign(x), "relu": b.relu(x), "identity": b.identity(x)}
    r = run_graph(nctx, outs, {"x": a}, b)
    _check(r["neg"], -a)
    _check(r["abs"], np.abs(a))
    _check(r["sign"], np.sign(a))
    _check(r["relu"], np.maximum(a, 0))
    _check(r["identity"], a)


def test_clamp_with_64_bit_bounds(nctx):
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", BIG)
    u = _in(b, "u", UBIG)
    lo, hi = -(2**45) - 1, 2**55 + 3
    outs = {
        "c": b.clamp(x, min_value=lo, max_value=hi),
        "lo": b.clamp(x, min_value=-(2**33)),
        "u": b.clamp(u, min_value=2**33, max_value=2**63 + 2**20),
    }
    r = run_graph(nctx, outs, {"x": BIG, "u": UBIG}, b)
    _check(r["c"], np.clip(BIG, lo, hi))
    _check(r["lo"], np.maximum(BIG, -(2**33)))
    _check(r["u"], np.clip(UBIG, U64(2**33), U64(2**63 + 2**20)))


def test_casts(nctx):
    f = np.array([-3.75, 1.5e12, -(2.0**40), 0.0, 9.0e18, 123.0], np.float32)
    b = mltensor.MLGraphBuilder(nctx)
    x, u, fx = _in(b, "x", BIG), _in(b, "u", UBIG), _in(b, "f", f)
    i32 = np.array([-1, 5, -(2**31), 2**31 - 1], np.int32)
    u32 = np.array([2**32 - 1, 0, 2**31, 5], np.uint32)
    i8 = np.array([-128, -1, 0, 127], np.int8)
    u8 = np.array([255, 0, 128, 1], np.uint8)
    xi, xu, x8, xu8 = _in(b, "i32", i32), _in(b, "u32", u32), _in(b, "i8", i8), _in(b, "u8", u8)
    outs = {
        "i64_f32": b.cast(x, "float32"),
        "u64_f32": b.cast(u, "float32"),
        "f32_i64": b.cast(fx, "int64"),
        "i64_i32": b.cast(x, "int32"),
        "i64_u64": b.cast(x, "uint64"),
        "u64_i64": b.cast(u, "int64"),
        "i64_i8": b.cast(x, "int8"),
        "i64_u8": b.cast(x, "uint8"),
        "u64_u32": b.cast(u, "uint32"),
        "i64_f16": b.cast(x, "float16"),
        "i32_i64": b.cast(xi, "int64"),
        "i32_u64": b.cast(xi, "uint64"),
        "u32_i64": b.cast(xu, "int64"),
        "u32_u64": b.cast(xu, "uint64"),
        "i8_i64": b.cast(x8, "int64"),
        "i8_u64": b.cast(x8, "uint64"),
        "u8_i64": b.cast(xu8, "int64"),
    }
    r = run_graph(nctx, outs, {"x": BIG, "u": UBIG, "f": f, "i32": i32, "u32": u32, "i8": i8, "u8": u8}, b)
    _check(r["i64_f32"], BIG.astype(np.float32))
    _check(r["u64_f32"], UBIG.astype(np.float32))
    _check(r["f32_i64"], f.astype(I64))
    _check(r["i64_i32"], BIG.astype(np.int32))
    _check(r["i64_u64"], BIG.astype(U64))
    _check(r["u64_i64"], UBIG.astype(I64))
    _check(r["i64_i8"], BIG.astype(np.int8))
    _check(r["i64_u8"], BIG.astype(np.uint8))
    _check(r["u64_u32"], UBIG.astype(np.uint32))
    _check(r["i64_f16"], _wrap(lambda v: v.astype(np.float32).astype(np.float16), BIG))
    _check(r["i32_i64"], i32.astype(I64))
    _check(r["i32_u64"], i32.astype(U64))
    _check(r["u32_i64"], u32.astype(I64))
    _check(r["u32_u64"], u32.astype(U64))
    _check(r["i8_i64"], i8.astype(I64))
    _check(r["i8_u64"], i8.astype(U64))
    _check(r["u8_i64"], u8.astype(I64))


def test_float_to_64_bit_saturates_like_wgsl(nctx):
    # WGSL clamps out-of-range floats to the f32 values nearest the bounds, then truncates
    f = np.array([1e19, -1e19, 3e38, np.inf, -np.inf, 2.0**63, -(2.0**63), 1.8e19, 2.0**64], np.float32)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "f", f)
    r = run_graph(nctx, {"i": b.cast(x, "int64"), "u": b.cast(b.abs(x), "uint64")}, {"f": f}, b)
    i_hi, u_hi = 2**63 - 2**39, 2**64 - 2**40  # the largest f32 values below 2**63 and 2**64
    w = np.clip(f.astype(np.float64), -(2.0**63), 2.0**64)  # finite, still out of range
    _check(r["i"], np.array([max(-(2**63), min(i_hi, int(v))) for v in w], I64))
    _check(r["u"], np.array([min(u_hi, int(v)) for v in np.minimum(np.abs(f.astype(np.float64)), 2.0**64)], U64))


def test_negative_float_to_uint64_wraps_like_c(nctx):
    f = np.array([-1.0, -3.0, 2.0**40], np.float32)
    b = mltensor.MLGraphBuilder(nctx)
    r = run_graph(nctx, {"y": b.cast(_in(b, "f", f), "uint64")}, {"f": f}, b)
    _check(r["y"], f.astype(I64).astype(U64))


@pytest.mark.parametrize("a, c", [(BIG, BIG2), (UBIG, UBIG2)], ids=["int64", "uint64"])
def test_comparisons_and_where(nctx, a, c):
    # values equal in their low 32 bits but different: only a 64-bit compare tells them apart
    a = np.concatenate([a, np.array([2**33 + 1], a.dtype)])
    c = np.concatenate([c, np.array([1], c.dtype)])
    b = mltensor.MLGraphBuilder(nctx)
    x, y = _in(b, "x", a), _in(b, "y", c)
    ops = {
        "equal": np.equal,
        "not_equal": np.not_equal,
        "greater": np.greater,
        "greater_or_equal": np.greater_equal,
        "lesser": np.less,
        "lesser_or_equal": np.less_equal,
    }
    outs = {op: getattr(b, op)(x, y) for op in ops}
    outs["where"] = b.where(b.greater(x, y), x, y)
    r = run_graph(nctx, outs, {"x": a, "y": c}, b)
    for op, fn in ops.items():
        _check(r[op], fn(a, c).astype(np.uint8))
    _check(r["where"], np.where(a > c, a, c))


@pytest.mark.parametrize("shape, axes", [([2, 4], [1]), ([3, 100], [1]), ([1, 20000], [1]), ([2, 3, 4], [0, 2])])
def test_reductions(nctx, rng, shape, axes):
    # thread, group and two-level (partial + final) kernels
    a = rng.integers(-(2**40), 2**40, size=shape, dtype=I64)
    p = rng.integers(-3, 4, size=shape, dtype=I64)
    b = mltensor.MLGraphBuilder(nctx)
    x, y = _in(b, "x", a), _in(b, "p", p)
    outs = {op: getattr(b, op)(x, axes=axes) for op in ("reduce_sum", "reduce_max", "reduce_min", "reduce_l1")}
    outs["reduce_product"] = b.reduce_product(y, axes=axes)
    r = run_graph(nctx, outs, {"x": a, "p": p}, b)
    ax = tuple(axes)
    _check(r["reduce_sum"], a.sum(axis=ax))
    _check(r["reduce_max"], a.max(axis=ax))
    _check(r["reduce_min"], a.min(axis=ax))
    _check(r["reduce_l1"], np.abs(a).sum(axis=ax))
    _check(r["reduce_product"], _wrap(np.prod, p, ax))


def test_reductions_uint64(nctx):
    a = UBIG.reshape(2, 4)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", a)
    outs = {"max": b.reduce_max(x, axes=[1]), "min": b.reduce_min(x, axes=[1]), "sum": b.reduce_sum(x, axes=[0])}
    r = run_graph(nctx, outs, {"x": a}, b)
    _check(r["max"], a.max(axis=1))
    _check(r["min"], a.min(axis=1))
    _check(r["sum"], _wrap(np.sum, a, 0))


def test_cumulative_sum(nctx, rng):
    a = rng.integers(-(2**50), 2**50, size=(3, 5), dtype=I64)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", a)
    outs = {"c": b.cumulative_sum(x, 1), "ex": b.cumulative_sum(x, 0, exclusive=True, reversed=True)}
    r = run_graph(nctx, outs, {"x": a}, b)
    _check(r["c"], np.cumsum(a, axis=1))
    rev = np.flip(np.cumsum(np.flip(a, 0), axis=0), 0)
    _check(r["ex"], rev - a)


def test_gather_family_with_int64_indices_and_data(nctx):
    data = (np.arange(12, dtype=I64) * 2**40 - 2**43).reshape(4, 3)
    idx = np.array([3, -1, 0, 2**40, -(2**41)], I64)  # out of range: clamped
    ge_idx = np.array([[0, 2, -1], [3, 1, 0]], I64)
    nd_idx = np.array([[1, 2], [-1, 0], [2**35, 1]], I64)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", data)
    outs = {
        "gather": b.gather(x, _in(b, "i", idx), axis=0),
        "gather_e": b.gather_elements(x, _in(b, "ge", ge_idx), axis=0),
        "gather_nd": b.gather_nd(x, _in(b, "nd", nd_idx)),
        "scatter_e": b.scatter_elements(x, _in(b, "se", ge_idx[:1]), b.neg(b.slice(x, [0, 0], [1, 3])), axis=0),
    }
    feeds = {"x": data, "i": idx, "ge": ge_idx, "nd": nd_idx, "se": ge_idx[:1]}
    r = run_graph(nctx, outs, feeds, b)
    clamp = np.array([3, 3, 0, 3, 0])
    _check(r["gather"], data[clamp])
    _check(r["gather_e"], np.take_along_axis(data, ge_idx % 4, axis=0))
    _check(r["gather_nd"], np.array([data[1, 2], data[3, 0], data[3, 1]]))
    want = data.copy()
    for j, k in enumerate(ge_idx[0] % 4):
        want[k, j] = -data[0, j]
    _check(r["scatter_e"], want)


def test_movement_and_layout(nctx):
    a = (np.arange(24, dtype=I64) * (2**37 + 1) - 2**41).reshape(2, 3, 4)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", a)
    c = b.constant(np.array([[[2**60 + 1] * 4] * 3], I64))
    outs = {
        "concat": b.concat([x, c], 0),
        "reshape": b.reshape(x, [6, 4]),
        "transpose": b.transpose(x, permutation=[2, 0, 1]),
        "slice": b.slice(x, [0, 1, 1], [2, 2, 3], strides=[1, 1, 2]),
        "expand": b.expand(b.slice(x, [0, 0, 0], [1, 1, 4]), [3, 2, 4]),
        "pad": b.pad(x, [0, 1, 0], [1, 0, 2], value=-(2**45) - 1),
        "pad_edge": b.pad(x, [1, 0, 0], [0, 0, 1], mode="edge"),
        "tile": b.tile(x, [1, 2, 1]),
        "reverse": b.reverse(x, axes=[2]),
        "tri": b.triangular(x, upper=False),
        "split0": b.split(x, [1, 3], axis=2)[1],
    }
    r = run_graph(nctx, outs, {"x": a}, b)
    _check(r["concat"], np.concatenate([a, np.array([[[2**60 + 1] * 4] * 3], I64)], 0))
    _check(r["reshape"], a.reshape(6, 4))
    _check(r["transpose"], a.transpose(2, 0, 1))
    _check(r["slice"], a[0:2, 1:3, 1:4:2])
    _check(r["expand"], np.broadcast_to(a[:1, :1, :], (3, 2, 4)))
    _check(r["pad"], np.pad(a, [(0, 1), (1, 0), (0, 2)], constant_values=-(2**45) - 1))
    _check(r["pad_edge"], np.pad(a, [(1, 0), (0, 0), (0, 1)], mode="edge"))
    _check(r["tile"], np.tile(a, (1, 2, 1)))
    _check(r["reverse"], a[:, :, ::-1])
    _check(r["tri"], np.tril(a))
    _check(r["split0"], a[:, :, 1:])


def test_arg_max_min_int64_output(nctx):
    a = np.array([[2**40, 2**40 + 1, -5], [-(2**50), -(2**50) - 1, 3]], I64)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", a)
    outs = {
        "amax": b.arg_max(x, 1, output_data_type="int64"),
        "amin": b.arg_min(x, 1, output_data_type="int64"),
        "f": b.arg_max(b.cast(x, "float32"), 0, output_data_type="int64"),
    }
    r = run_graph(nctx, outs, {"x": a}, b)
    _check(r["amax"], a.argmax(1).astype(I64))
    _check(r["amin"], a.argmin(1).astype(I64))
    _check(r["f"], a.astype(np.float32).argmax(0).astype(I64))


def test_max_pool_int64(nctx, rng):
    a = (np.arange(16, dtype=I64) * -(2**35)).reshape(1, 1, 4, 4)
    g = rng.integers(-(2**62), 2**62, size=(2, 3, 16, 16), dtype=I64)  # whole-plane: workgroup tree
    b = mltensor.MLGraphBuilder(nctx)
    outs = {
        "y": b.max_pool2d(_in(b, "x", a), window_dimensions=[2, 2], strides=[2, 2]),
        "g": b.max_pool2d(_in(b, "g", g), window_dimensions=[16, 16]),
    }
    r = run_graph(nctx, outs, {"x": a, "g": g}, b)
    _check(r["y"], a.reshape(1, 1, 2, 2, 2, 2).max(axis=(3, 5)))
    _check(r["g"], g.max(axis=(2, 3), keepdims=True))


def test_constants_and_constant_tensors_beyond_32_bits(nctx):
    c = np.array([2**63 - 1, -(2**63), 2**33], I64)
    tv = np.array([2**40, 1, -(2**40)], I64)
    t = nctx.create_constant_tensor_sync(data_type="int64", shape=[3], data=tv)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", np.zeros(3, I64))
    outs = {"y": b.add(x, b.constant(c)), "u": b.identity(b.constant(UBIG)), "t": b.sub(x, b.constant(t))}
    r = run_graph(nctx, outs, {"x": np.zeros(3, I64)}, b)
    _check(r["y"], c)
    _check(r["u"], UBIG)
    _check(r["t"], -tv)
    t.destroy()


def test_reshaped_input_and_repeated_output(nctx):
    # copies of int64 values into the caller's tensors (word count doubles)
    b = mltensor.MLGraphBuilder(nctx)
    x = _in(b, "x", BIG)
    y = b.add(x, x)
    r = run_graph(nctx, {"same": b.reshape(x, [8]), "y1": y, "y2": y}, {"x": BIG}, b)
    _check(r["same"], BIG)
    _check(r["y1"], _wrap(np.add, BIG, BIG))
    _check(r["y2"], _wrap(np.add, BIG, BIG))


# -- the emulated mode ---------------------------------------------------------------------------


def test_emulated_context_has_no_native_64_bit_integers(emulated_ctx):
    assert not emulated_ctx._int64
    assert "shader-int64" not in emulated_ctx.features
    assert "shader-int64" not in emulated_ctx.device.features


@pytest.mark.parametrize("dt", [np.int64, np.uint64])
def test_emulated_arithmetic_random_words(emulated_ctx, rng, dt):
    # random 64-bit patterns: every carry, borrow and sign case of the word arithmetic, checked
    # against numpy's wrapping arithmetic
    n = 4096
    a = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False).astype(dt)
    c = rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False).astype(dt)
    # small and one-word values too (fast division path, 32-bit boundaries)
    c[:512] = rng.integers(-(2**31), 2**31, size=512).astype(dt)
    a[512:1024] = rng.integers(0, 2**32, size=512).astype(dt)
    c[1024:1040] = 0
    # int -> float rounding ties (to even, up with a sticky bit below) and the carry into 2**64
    ties = [
        (2**23 + 1) * 2**17 + 2**16,
        (2**23 + 2) * 2**17 + 2**16,
        (2**23 + 2) * 2**17 + 2**16 + 1,
        (2**23 + 1) * 2**40 + 2**39,
        (2**23 + 2) * 2**40 + 2**39,
        2**64 - 1,
        2**63 + 2**39 + 1,
    ]
    a[1040 : 1040 + len(ties)] = np.array(ties, np.uint64).astype(dt)
    b = mltensor.MLGraphBuilder(emulated_ctx)
    x, y = _in(b, "x", a), _in(b, "y", c)
    outs = {op: getattr(b, op)(x, y) for op in ARITHMETIC}
    outs.update(lesser=b.lesser(x, y), f=b.cast(x, "float32"))
    r = run_graph(emulated_ctx, outs, {"x": a, "y": c}, b)
    _check_arithmetic(r, a, c)
    _check(r["lesser"], (a < c).astype(np.uint8))
    _check(r["f"], a.astype(np.float32))  # round to nearest even, as numpy


# -- every int64 operator: emulated == native ----------------------------------------------------


def _random_feed(rng, key, dt, shape, op, edges=False):
    """Values that exercise all 64 bits where the operator allows it: indices in range (negative
    too), 0/1 conditions, small exponents for pow, big magnitudes for float -> integer casts.
    edges: integers drawn from the type's boundary values (equal operands, word carries)."""
    if key == "indices":
        return rng.integers(-2, 2, size=shape).astype(dt)
    if key == "condition":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt in ("float32", "float16"):
        return (rng.standard_normal(shape) * 1e12).astype(dt)
    info = np.iinfo(dt)
    v = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if edges:
        pool = {info.min, info.max, 0, 1, info.min + 1, info.max - 1} | {
            x for x in (-1, 2**32, 2**32 - 1, -(2**32), 2**31) if info.min <= x <= info.max
        }
        v = rng.choice(np.array(sorted(pool), dtype=dt), size=shape)
    if op == "pow" and key == "b":
        v = rng.integers(0, 70, size=shape).astype(dt)
    return v


def _int64_cases():
    from test_op_support_limits import RECIPES

    c = ml.create_context_sync()
    lim = c.op_support_limits()
    c.destroy()
    cases = []
    for op, (groups, _) in sorted(RECIPES.items()):
        for gi, g in enumerate(groups):
            for t in ("int64", "uint64"):
                if op in lim and t in lim[op][g[0]]["data_types"]:
                    cases.append((op, gi, t))
    return cases


@pytest.mark.parametrize("op, group, dt", _int64_cases())
def test_emulation_matches_native(ctx, emulated_ctx, op, group, dt):
    """For every operator x operand group listing int64/uint64: the emulated kernels give the
    same bits as the native ones on random full-range values and on boundary values (four feeds
    per graph)."""
    if not ctx._int64:
        pytest.skip("the adapter has no shader-int64: no native reference")
    from test_op_support_limits import RECIPES

    groups, recipe = RECIPES[op]
    lim = ctx.op_support_limits()
    T = {k: lim[op][g[0]]["data_types"][0] for g in groups for k in g}
    T.update({k: dt for k in groups[group]})
    results = []
    for c in (ctx, emulated_ctx):
        b = mltensor.MLGraphBuilder(c)
        shapes = {}

        def inp(key, shape, b=b, shapes=shapes):
            name = f"{key}{len(shapes)}"
            shapes[name] = (key, T[key], shape)
            return b.input(name, data_type=T[key], shape=shape)

        outs = recipe(b, T, inp)
        outs = {f"y{j}": y for j, y in enumerate(outs if isinstance(outs, (list, tuple)) else [outs])}
        g = b.build_sync(outs)
        runs = []
        for seed in range(4):
            rng = np.random.default_rng(seed)
            ins = {}
            for n, (k, t, shape) in shapes.items():
                ins[n] = c.create_tensor_sync(data_type=t, shape=shape, writable=True)
                c.write_tensor(ins[n], _random_feed(rng, k, t, shape, op, edges=seed >= 2))
            res = {
                n: c.create_tensor_sync(data_type=y.data_type, shape=list(y.shape), readable=True)
                for n, y in outs.items()
            }
            c.dispatch(g, ins, res)
            runs.append({n: c.read_tensor_sync(t) for n, t in res.items()})
        g.destroy()
        results.append(runs)
    for native, emulated in zip(*results):
        for name in native:
            np.testing.assert_array_equal(emulated[name], native[name], err_msg=f"{op} {dt} {name}")
