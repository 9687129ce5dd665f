"""Elementwise family against float64 numpy: binary arithmetic with broadcasting, unary math,
activations, prelu, cast, fused chains, and validation. Each graph holds several shapes (rank 0 to
5, odd sizes) as separate inputs and outputs, so one build covers them; assertions go shape, then
dtype, then values."""

import math

import numpy as np
import pytest
from helpers import FUSION, run_graph

import mltensor

ALL = ["float32", "float16", "int32", "uint32", "int64", "uint64", "int8", "uint8"]
INTS = ["int32", "uint32", "int64", "uint64", "int8", "uint8"]
SIGNED_INTS = ["int32", "int64", "int8"]

# per-dtype tolerance of values computed in f32 and stored in the output type
TOL = {"float32": dict(rtol=2e-6, atol=1e-6), "float16": dict(rtol=2e-3, atol=2e-3)}
# transcendental functions: f32 hardware/driver precision rather than correct rounding
TOL_TRANS = {"float32": dict(rtol=2e-5, atol=2e-6), "float16": dict(rtol=3e-3, atol=3e-3)}


def run(ctx, fn, feeds):
    """Build outputs {name: fn(builder, operands...)} over inputs `feeds` (list of tuples of
    arrays: one graph output per tuple), run once, return the outputs in order."""
    b = mltensor.MLGraphBuilder(ctx)
    outs, flat = {}, {}
    for i, arrays in enumerate(feeds):
        ops = []
        for j, a in enumerate(arrays):
            name = f"x{i}_{j}"
            flat[name] = a
            ops.append(b.input(name, data_type=mltensor.dtypes.normalize(a.dtype), shape=a.shape))
        outs[f"y{i}"] = fn(b, *ops)
    res = run_graph(ctx, outs, flat, b)
    return [res[f"y{i}"] for i in range(len(feeds))]


def check(r, e, dt, tol=None):
    e = np.asarray(e)
    assert r.shape == e.shape, (r.shape, e.shape)
    assert r.dtype == np.dtype(dt), (r.dtype, dt)
    if dt in INTS:
        np.testing.assert_array_equal(r, e.astype(dt))
    else:
        np.testing.assert_allclose(r.astype(np.float64), e, **(tol or TOL)[dt])


def gen(rng, shape, dt, lo=-4.0, hi=4.0):
    if dt in INTS:
        info = np.iinfo(dt)
        return rng.integers(max(int(lo), info.min), min(int(hi), info.max) + 1, size=shape).astype(dt)
    return rng.uniform(lo, hi, size=shape).astype(dt)


# -- binary -----------------------------------------------------------------------------------

BROADCAST = [
    ((), ()),
    ((5,), ()),
    ((), (3, 1)),
    ((7,), (7,)),
    ((2, 3), (3,)),
    ((2, 1, 5), (3, 1)),
    ((1,), (3, 1, 2)),
    ((2, 3, 1, 5, 3), (1, 3, 4, 1, 3)),
    ((2, 1, 4, 3, 1), (3, 1)),
]


def div_ref(a, b):
    if a.dtype.kind == "f":
        return a.astype(np.float64) / b
    q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))  # integers truncate toward 0
    return q * np.sign(a.astype(np.int64)) * np.sign(b.astype(np.int64))


BINARY = {
    "add": lambda a, b: a.astype(np.float64) + b if a.dtype.kind == "f" else a.astype(np.int64) + b,
    "sub": lambda a, b: a.astype(np.float64) - b if a.dtype.kind == "f" else a.astype(np.int64) - b,
    "mul": lambda a, b: a.astype(np.float64) * b if a.dtype.kind == "f" else a.astype(np.int64) * b,
    "div": div_ref,
    "max": np.maximum,
    "min": np.minimum,
    "pow": lambda a, b: (
        np.power(a.astype(np.float64), b) if a.dtype.kind == "f" else np.power(a.astype(np.int64), b.astype(np.int64))
    ),
}
POW_TYPES = ["float32", "float16", "int32", "uint32", "int8", "uint8"]


def binary_data(rng, op, dt, sa, sb):
    if op == "pow":
        if dt in INTS:
            return gen(rng, sa, dt, 0 if dt[0] == "u" else -3, 3), gen(rng, sb, dt, 0, 3)
        a = gen(rng, sa, dt, 0.2, 3.0)
        return a, gen(rng, sb, dt, -2.0, 2.0)
    a = gen(rng, sa, dt, -20, 20) if dt in INTS else gen(rng, sa, dt)
    b = gen(rng, sb, dt, -20, 20) if dt in INTS else gen(rng, sb, dt)
    if op == "sub" and dt[0] == "u":
        a, b = a + np.asarray(20, dt), b  # stay non-negative
    if op == "div":
        b = np.where(b == 0, np.asarray(3, dt), b).astype(dt)
        if dt in ("float32", "float16"):
            b = np.where(np.abs(b) < 0.5, np.asarray(0.5, dt), b).astype(dt)
    return a, b


@pytest.mark.parametrize("op", list(BINARY))
def test_binary_float32_broadcasting(ctx, rng, op):
    feeds = [binary_data(rng, op, "float32", sa, sb) for sa, sb in BROADCAST]
    res = run(ctx, lambda b, x, y: getattr(b, op)(x, y), feeds)
    tol = TOL_TRANS if op == "pow" else TOL
    for (a, c), r in zip(feeds, res):
        check(r, BINARY[op](a, c), "float32", tol)


BINARY_DT = [(op, dt) for op in BINARY for dt in ALL[1:] if op != "pow" or dt in POW_TYPES]


@pytest.mark.parametrize("op,dt", BINARY_DT)
def test_binary_types(ctx, rng, op, dt):
    shapes = [((), ()), ((2, 3, 5), (3, 1)), ((4, 1, 3), (1, 2, 3))]
    feeds = [binary_data(rng, op, dt, sa, sb) for sa, sb in shapes]
    res = run(ctx, lambda b, x, y: getattr(b, op)(x, y), feeds)
    tol = TOL_TRANS if op == "pow" else TOL
    for (a, c), r in zip(feeds, res):
        check(r, BINARY[op](a, c), dt, tol)


def test_pow_negative_base_integral_exponent(ctx):
    a = np.array([-2.0, -3.0, -1.5, 2.0, 0.0, -2.0], np.float32)
    c = np.array([2.0, 3.0, 2.0, -1.0, 2.0, 0.0], np.float32)
    (r,) = run(ctx, lambda b, x, y: b.pow(x, y), [(a, c)])
    check(r, np.power(a.astype(np.float64), c), "float32")


def test_integer_div_truncates(ctx):
    a = np.array([7, -7, 7, -7, 0, 9], np.int32)
    c = np.array([2, 2, -2, -2, 5, 3], np.int32)
    (r,) = run(ctx, lambda b, x, y: b.div(x, y), [(a, c)])
    check(r, np.array([3, -3, -3, 3, 0, 3]), "int32")


# -- unary ------------------------------------------------------------------------------------

SHAPES = [(), (7,), (3, 1, 5), (2, 3, 1, 2, 3)]


def _erf(a):
    return np.vectorize(math.erf)(a.astype(np.float64))


UNARY = {
    # name: (reference, (lo, hi) input range, transcendental)
    "abs": (np.abs, (-5, 5), False),
    "ceil": (np.ceil, (-5, 5), False),
    "cos": (np.cos, (-5, 5), True),
    "erf": (_erf, (-3, 3), True),
    "exp": (np.exp, (-5, 5), True),
    "floor": (np.floor, (-5, 5), False),
    "identity": (lambda a: a, (-5, 5), False),
    "log": (np.log, (0.05, 20), True),
    "neg": (np.negative, (-5, 5), False),
    "reciprocal": (lambda a: 1.0 / a, (0.3, 4), False),
    "sign": (np.sign, (-5, 5), False),
    "sin": (np.sin, (-5, 5), True),
    "sqrt": (np.sqrt, (0, 20), False),
    "tan": (np.tan, (-1.2, 1.2), True),
}
UNARY_INT = {"abs": SIGNED_INTS, "neg": SIGNED_INTS, "sign": SIGNED_INTS, "identity": INTS}


def unary_feeds(rng, dt, lo, hi):
    feeds = [(gen(rng, s, dt, lo, hi),) for s in SHAPES]
    if dt in ("float32", "float16") and lo < 0 < hi:
        feeds.append((np.array([0.0, -0.0, 0.5, -0.5, 2.5, -2.5], dt),))  # zeros and halves
    return feeds


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_float(ctx, rng, op, dt):
    fn, (lo, hi), trans = UNARY[op]
    feeds = unary_feeds(rng, dt, lo, hi)
    res = run(ctx, lambda b, x: getattr(b, op)(x), feeds)
    for (a,), r in zip(feeds, res):
        check(r, fn(a.astype(np.float64)), dt, TOL_TRANS if trans else TOL)


UNARY_INT_CASES = [(op, dt) for op, types in UNARY_INT.items() for dt in types]


@pytest.mark.parametrize("op,dt", UNARY_INT_CASES)
def test_unary_integers(ctx, rng, op, dt):
    feeds = [(gen(rng, s, dt, -100, 100),) for s in SHAPES]
    res = run(ctx, lambda b, x: getattr(b, op)(x), feeds)
    for (a,), r in zip(feeds, res):
        check(r, UNARY[op][0](a.astype(np.int64)), dt)


# -- activations ------------------------------------------------------------------------------


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


ACTIVATIONS = {
    # name: (options, reference(a, **options), transcendental)
    "clamp": (
        {"min_value": -1.5, "max_value": 2.0},
        lambda a, min_value, max_value: np.clip(a, min_value, max_value),
        False,
    ),
    "elu": ({"alpha": 0.7}, lambda a, alpha: np.where(a >= 0, a, alpha * (np.exp(a) - 1)), True),
    "gelu": ({}, lambda a: 0.5 * a * (1 + _erf(a / math.sqrt(2))), True),
    "hard_sigmoid": ({"alpha": 0.3, "beta": 0.4}, lambda a, alpha, beta: np.clip(alpha * a + beta, 0, 1), False),
    "hard_swish": ({}, lambda a: a * np.clip(a + 3, 0, 6) / 6, False),
    "leaky_relu": ({"alpha": 0.2}, lambda a, alpha: np.where(a >= 0, a, alpha * a), False),
    "linear": ({"alpha": -2.5, "beta": 0.75}, lambda a, alpha, beta: alpha * a + beta, False),
    "relu": ({}, lambda a: np.maximum(a, 0), False),
    "sigmoid": ({}, _sigmoid, True),
    "softplus": ({}, lambda a: np.log1p(np.exp(a)), True),
    "softsign": ({}, lambda a: a / (1 + np.abs(a)), False),
    "tanh": ({}, np.tanh, True),
}
DEFAULTS = {
    "clamp": {"min_value": -np.inf, "max_value": np.inf},
    "elu": {"alpha": 1.0},
    "hard_sigmoid": {"alpha": 0.2, "beta": 0.5},
    "leaky_relu": {"alpha": 0.01},
    "linear": {"alpha": 1.0, "beta": 0.0},
}


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_activation_float(ctx, rng, op, dt):
    opts, fn, trans = ACTIVATIONS[op]
    feeds = unary_feeds(rng, dt, -6, 6)
    tol = TOL_TRANS if trans else TOL
    res = run(ctx, lambda b, x: getattr(b, op)(x, **opts), feeds)
    for (a,), r in zip(feeds, res):
        check(r, fn(a.astype(np.float64), **opts), dt, tol)
    # default options
    (a,) = feeds[2]
    (r,) = run(ctx, lambda b, x: getattr(b, op)(x), [(a,)])
    check(r, fn(a.astype(np.float64), **DEFAULTS.get(op, {})), dt, tol)


def test_activation_extremes(ctx):
    a = np.array([-100.0, -30.0, 30.0, 100.0, 0.0], np.float32)
    for op, fn in (("sigmoid", _sigmoid), ("tanh", np.tanh), ("softplus", lambda v: np.logaddexp(0, v))):
        (r,) = run(ctx, lambda b, x: getattr(b, op)(x), [(a,)])
        assert np.isfinite(r).all(), op
        check(r, fn(a.astype(np.float64)), "float32", TOL_TRANS)


@pytest.mark.parametrize("dt", INTS)
def test_clamp_integers(ctx, rng, dt):
    feeds = [(gen(rng, s, dt, -50, 50),) for s in SHAPES]
    lo, hi = (-7, 20) if dt[0] != "u" else (3, 20)
    res = run(ctx, lambda b, x: b.clamp(x, min_value=lo, max_value=hi), feeds)
    for (a,), r in zip(feeds, res):
        check(r, np.clip(a, lo, hi), dt)
    # bounds outside the type's range saturate
    (a,) = feeds[1]
    (r,) = run(ctx, lambda b, x: b.clamp(x, min_value=-1e12, max_value=1e12), [(a,)])
    check(r, a, dt)


@pytest.mark.parametrize("dt", SIGNED_INTS)
def test_relu_integers(ctx, rng, dt):
    feeds = [(gen(rng, s, dt, -50, 50),) for s in SHAPES]
    res = run(ctx, lambda b, x: b.relu(x), feeds)
    for (a,), r in zip(feeds, res):
        check(r, np.maximum(a, 0), dt)


# -- prelu ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ["float32", "float16", "int32", "int64", "int8"])
def test_prelu(ctx, rng, dt):
    shapes = [((), ()), ((2, 3, 4), (4,)), ((2, 3, 4), (3, 1)), ((1, 2, 3, 2, 3), (1, 2, 1, 1, 3)), ((5,), (5,))]
    feeds = [(gen(rng, sa, dt, -20, 20), gen(rng, sb, dt, -3, 3)) for sa, sb in shapes]
    res = run(ctx, lambda b, x, s: b.prelu(x, s), feeds)
    for (a, s), r in zip(feeds, res):
        a64 = a.astype(np.float64 if dt in ("float32", "float16") else np.int64)
        check(r, np.where(a64 >= 0, a64, a64 * s), dt)


# -- cast -------------------------------------------------------------------------------------


def cast_source(src):
    """Values every destination type represents (cast of out-of-range values is
    implementation-defined); negatives and fractions only where the source has them."""
    v = [0, 1, 7, 42, 100, 127, 3, 64, 5]
    if src in ("float32", "float16"):
        v += [2.75, 99.5, 0.25, 126.9]
    if src in ("float32", "float16", "int32", "int64", "int8"):
        v += [-1, -100, -2.5 if src[0] == "f" else -3]
    return np.array(v).astype(src)


def cast_ref(a, dst):
    if a.dtype.kind == "f" and dst in INTS:
        a = np.trunc(a)  # float -> int truncates toward zero
    return a.astype(np.float64) if dst[0] == "f" else a


@pytest.mark.parametrize("src", ALL)
def test_cast_all_pairs(ctx, src):
    a = cast_source(src)
    # one graph per source: one output per destination type
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type=src, shape=a.shape)
    outs = {dst: b.cast(x, dst) for dst in ALL}
    res = run_graph(ctx, outs, {"x": a}, b)
    for dst in ALL:
        keep = np.ones(a.shape, bool)
        if dst[0] == "u":
            keep = a >= 0  # negative -> unsigned is implementation-defined
        r = res[dst]
        assert r.shape == a.shape and r.dtype == np.dtype(dst), (src, dst)
        e = cast_ref(a, dst)
        if dst in INTS:
            np.testing.assert_array_equal(r[keep], e[keep].astype(dst), err_msg=f"{src}->{dst}")
        else:
            np.testing.assert_allclose(
                r[keep].astype(np.float64),
                e[keep].astype(dst).astype(np.float64),
                rtol=0,
                atol=0,
                err_msg=f"{src}->{dst}",
            )


def test_cast_float_to_uint32_above_int32_range(ctx):
    # regression: the conversion went through i32 and saturated at 2**31 - 1
    a = np.array([3e9, 4e9, 2147483648.0, 1.5, 7.0], np.float32)
    (r,) = run(ctx, lambda b, x: b.cast(x, "uint32"), [(a,)])
    check(r, a.astype(np.uint32), "uint32")


def test_cast_numpy_dtype_and_scalar(ctx):
    a = np.array(3.75, np.float32)
    (r,) = run(ctx, lambda b, x: b.cast(x, np.int32), [(a,)])
    check(r, np.array(3), "int32")


# -- fusion -----------------------------------------------------------------------------------


def test_fused_chain_is_one_kernel(ctx, rng):
    x = gen(rng, (2, 3, 5), "float32")
    w = gen(rng, (5,), "float32")
    c = gen(rng, (3, 1), "float32")
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=x.shape)
    wc, cc = b.constant(w), b.constant(c)
    y = b.sigmoid(b.relu(b.add(b.mul(xi, wc), cc)))
    y = b.clamp(b.sub(y, b.abs(xi)), min_value=-0.5)
    g = b.build_sync({"y": y})
    assert not FUSION or len(g.kernel_names) == 1, g.kernel_names
    g.destroy()
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=x.shape)
    y = b.clamp(b.sub(b.sigmoid(b.relu(b.add(b.mul(xi, b.constant(w)), b.constant(c)))), b.abs(xi)), min_value=-0.5)
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    x64 = x.astype(np.float64)
    e = np.maximum(_sigmoid(np.maximum(x64 * w + c, 0)) - np.abs(x64), -0.5)
    check(r, e, "float32", TOL_TRANS)


def test_fused_chain_with_shared_value_and_two_outputs(ctx, rng):
    x = gen(rng, (4, 3), "float16")
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float16", shape=x.shape)
    e = b.exp(xi)
    y1 = b.div(e, b.add(e, b.constant(np.float16(1.0).reshape(()))))
    y2 = b.cast(b.floor(b.mul(e, e)), "int32")
    res = run_graph(ctx, {"y1": y1, "y2": y2}, {"x": x}, b)
    x64 = x.astype(np.float64)
    check(res["y1"], np.exp(x64) / (np.exp(x64) + 1), "float16", TOL_TRANS)
    ref2 = np.floor(np.exp(x.astype(np.float32)) ** 2)
    assert res["y2"].dtype == np.int32
    np.testing.assert_allclose(res["y2"], ref2, rtol=1e-5, atol=1)


def test_chain_on_constants_only_is_folded(ctx):
    # a subgraph of constants feeding an input-dependent op
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=[3])
    k = b.exp(b.constant(np.array([0.0, 1.0, 2.0], np.float32)))
    y = b.mul(xi, k)
    x = np.array([1.0, 2.0, -3.0], np.float32)
    r = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    check(r, x * np.exp([0.0, 1.0, 2.0]), "float32", TOL_TRANS)


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", list(BINARY))
def test_binary_validation(ctx, op):
    b = mltensor.MLGraphBuilder(ctx)
    f = getattr(b, op)
    x = b.input("x", data_type="float32", shape=[2, 3])
    with pytest.raises(TypeError, match=rf"\[{op}\] shapes \[2, 3\] and \[1, 2\] are not broadcastable"):
        f(x, b.input("y", data_type="float32", shape=[2]))
    with pytest.raises(TypeError, match=rf"\[{op}\].*differs"):
        f(x, b.input("h", data_type="float16", shape=[2, 3]))
    with pytest.raises(TypeError, match=rf"\[{op}\] b must be an MLOperand"):
        f(x, 1.0)
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        f(x, mltensor.MLGraphBuilder(ctx).input("x", data_type="float32", shape=[2, 3]))


UNARY_FLOAT_ONLY = [op for op in list(UNARY) + list(ACTIVATIONS) if op not in UNARY_INT and op not in ("clamp", "relu")]


@pytest.mark.parametrize("op", UNARY_FLOAT_ONLY)
def test_float_only_ops_reject_integers(ctx, op):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="int32", shape=[2])
    with pytest.raises(TypeError, match=rf"\[{op}\] input data type int32 is not supported"):
        getattr(b, op)(x)


@pytest.mark.parametrize("op", ["abs", "neg", "sign", "relu"])
def test_signed_ops_reject_unsigned(ctx, op):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="uint32", shape=[2])
    with pytest.raises(TypeError, match=rf"\[{op}\] input data type uint32"):
        getattr(b, op)(x)


def test_option_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2])
    with pytest.raises(TypeError, match=r"\[elu\] alpha must be a number"):
        b.elu(x, alpha="1")
    with pytest.raises(TypeError, match=r"\[leaky_relu\] alpha must be a number"):
        b.leaky_relu(x, alpha=True)
    with pytest.raises(TypeError, match=r"\[linear\] unexpected options"):
        b.linear(x, gamma=1.0)
    with pytest.raises(TypeError, match=r"\[relu\] unexpected options"):
        b.relu(x, alpha=1.0)
    with pytest.raises(TypeError, match=r"\[clamp\] min_value \(2.0\) must not be greater than max_value \(1.0\)"):
        b.clamp(x, min_value=2, max_value=1)
    with pytest.raises(TypeError, match=r"\[cast\]"):
        b.cast(x, "float64")
    with pytest.raises(TypeError, match=r"\[cast\]"):
        b.cast(x, "bfloat16")
    with pytest.raises(TypeError, match=r"\[exp\] input must be an MLOperand"):
        b.exp(np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        b.exp(mltensor.MLGraphBuilder(ctx).input("x", data_type="float32", shape=[2]))
    with pytest.raises(TypeError, match=r"\[prelu\] slope data type int32"):
        b.prelu(x, b.input("s", data_type="int32", shape=[2]))
    with pytest.raises(TypeError, match=r"\[prelu\] input data type uint8"):
        b.prelu(b.input("u", data_type="uint8", shape=[2]), b.input("u2", data_type="uint8", shape=[2]))
    with pytest.raises(TypeError, match="label"):
        b.exp(x, label=3)
