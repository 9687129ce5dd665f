"""Every float unary and activation at the edges of float32: tiny, moderate, large, huge, infinite
and NaN inputs, against float64 numpy references of the operator's mathematical definition
(continuous limits at +-inf, NaN in -> NaN out).

GPU drivers evaluate exp/log/tanh/division with fast approximations and assume nothing about
overflow: a formula that is exact on paper (tanh as (e - 1) / (e + 1), softsign as x / (1 + |x|),
mish's x * tanh(softplus(x))) returns NaN or loses every digit there while lavapipe, which uses
accurate libm-style code, passes. These inputs are where that shows.
"""

import math

import numpy as np
import pytest
from helpers import run_graph

import mltensor

EDGES = np.array(
    [
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        1e-7,
        -1e-7,
        0.5,
        -0.5,
        1.0,
        -1.0,
        3.0,
        -3.0,
        5.0,
        -5.0,
        20.0,
        -20.0,
        88.0,
        -88.0,
        1e30,
        -1e30,
        np.inf,
        -np.inf,
        np.nan,
    ],
    np.float32,
)
# sin/cos/tan: |x| up to 1e4, where our own range reduction works (shaders/common.wgsl sincos_f32;
# beyond 65536 the driver's built-ins take over, whose precision no API specifies)
TRIG = np.array(
    [
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        1e-7,
        0.5,
        -1.0,
        3.0,
        20.0,
        -20.0,
        88.0,
        -88.0,
        1000.0,
        -4321.5,
        1e4,
        np.inf,
        -np.inf,
        np.nan,
    ],
    np.float32,
)

_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _limit(y, x, at_neg_inf=None, at_pos_inf=None):
    """Replace the value at -inf / +inf inputs by the function's limit (nan * 0 in the formula)."""
    y = np.array(y, np.float64)
    if at_neg_inf is not None:
        y[x == -np.inf] = at_neg_inf
    if at_pos_inf is not None:
        y[x == np.inf] = at_pos_inf
    return y


def _softsign(x):
    with np.errstate(invalid="ignore"):
        return _limit(x / (1 + np.abs(x)), x, -1.0, 1.0)


def _gelu(x):
    return _limit(0.5 * x * _erfc(-x / math.sqrt(2)), x, 0.0)


def _hard_swish(x):
    return _limit(x * np.clip(x / 6 + 0.5, 0, 1), x, 0.0)


def _sigmoid(x):
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def _elu(x, alpha=1.0):
    return np.where(np.isnan(x), np.nan, np.where(x >= 0, x, alpha * np.expm1(np.minimum(x, 0))))


UNARY = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "neg": np.negative,
    "identity": lambda x: x,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "reciprocal": lambda x: 1 / x,
    "sign": np.sign,
    "round_even": np.round,
    "erf": _erf,
    "elu": _elu,
    "gelu": _gelu,
    "hard_sigmoid": lambda x: np.clip(0.2 * x + 0.5, 0, 1),
    "hard_swish": _hard_swish,
    "leaky_relu": lambda x: np.where(x >= 0, x, 0.01 * x),
    "linear": lambda x: x,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": _sigmoid,
    "softplus": lambda x: np.logaddexp(0, x),
    "softsign": _softsign,
    "tanh": np.tanh,
}
TRIG_OPS = {"sin": np.sin, "cos": np.cos, "tan": np.tan}


def _run1(ctx, op, x, **opts):
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=list(x.shape))
    y = getattr(b, op)(xi, **opts)
    return run_graph(ctx, {"y": y}, {"x": x}, b)["y"]


def _compare(op, x, got, want, rtol=2e-5, atol=1e-37):
    want = np.asarray(want, np.float64)
    assert got.shape == x.shape
    assert got.dtype == np.float32
    # float32 cannot hold what float64 gives beyond its range: compare with the rounded reference
    with np.errstate(over="ignore", under="ignore"):
        want32 = want.astype(np.float32).astype(np.float64)
    got64 = got.astype(np.float64)
    bad = []
    for xi, g, w in zip(x, got64, want32):
        if np.isnan(w):
            ok = np.isnan(g)
        elif np.isinf(w):
            ok = g == w
        else:
            ok = np.isfinite(g) and abs(g - w) <= atol + rtol * abs(w)
        if not ok:
            bad.append(f"{op}({xi!r}) = {g!r}, expected {w!r}")
    assert not bad, "; ".join(bad)


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_at_the_edges(ctx, op):
    with np.errstate(all="ignore"):
        want = UNARY[op](EDGES.astype(np.float64))
    _compare(op, EDGES, _run1(ctx, op, EDGES), want)


@pytest.mark.parametrize("op", sorted(TRIG_OPS))
def test_trig_at_the_edges(ctx, op):
    with np.errstate(all="ignore"):
        want = TRIG_OPS[op](TRIG.astype(np.float64))
    # absolute error of a few ulp of the argument: the reduction modulo pi of an f32 input
    _compare(op, TRIG, _run1(ctx, op, TRIG), want, rtol=1e-4, atol=2e-6)


def test_mish_chain(ctx):
    """ONNX Mish = x * tanh(softplus(x)) as three fused builder ops, across its whole range:
    where softplus is tiny, tanh of it must keep its relative precision."""
    x = np.concatenate([np.linspace(-30, 30, 601, dtype=np.float32), EDGES])
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=list(x.shape))
    y = b.mul(xi, b.tanh(b.softplus(xi)))
    got = run_graph(ctx, {"y": y}, {"x": x}, b)["y"]
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        want = x64 * np.tanh(np.logaddexp(0, x64))  # the chain's own NaN at -inf (-inf * 0)
    # exp(-88) is subnormal, which GPUs flush to 0: an absolute slack at that scale
    _compare("mish", x, got, want, rtol=1e-5, atol=1e-35)


@pytest.mark.parametrize(
    "rows",
    [
        [
            [0.0, 1.0, 2.0],
            [88.0, -88.0, 0.0],
            [1e30, 1e30, -1e30],
            [-np.inf, 0.0, 1.0],
            [-1e30, -1e30, -1e30],
            [-np.inf, -np.inf, 5.0],
            [20.0, -20.0, np.nan],
        ],
    ],
)
def test_softmax_and_log_sum_exp_at_the_edges(ctx, rows):
    x = np.array(rows, np.float32)
    x64 = x.astype(np.float64)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=list(x.shape))
    outs = {"s": b.softmax(xi, 1), "l": b.reduce_log_sum_exp(xi, axes=[1])}
    got = run_graph(ctx, outs, {"x": x}, b)
    with np.errstate(all="ignore"):
        m = np.max(x64, axis=1, keepdims=True)
        e = np.exp(x64 - m)
        want_s = e / e.sum(axis=1, keepdims=True)
        want_l = (np.log(e.sum(axis=1, keepdims=True)) + m)[:, 0]
    for r in range(len(rows)):
        _compare("softmax", x[r], got["s"][r], want_s[r], atol=1e-30)
    _compare("reduce_log_sum_exp", x[:, 0], got["l"], want_l)


def test_reduce_log_sum_exp_of_infinities(ctx):
    x = np.array([[np.inf, 0.0], [np.inf, np.inf], [-np.inf, -np.inf], [np.inf, -np.inf]], np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.input("x", data_type="float32", shape=[4, 2])
    got = run_graph(ctx, {"l": b.reduce_log_sum_exp(xi, axes=[1])}, {"x": x}, b)["l"]
    _compare("reduce_log_sum_exp", x[:, 0], got, [np.inf, np.inf, -np.inf, np.inf])
