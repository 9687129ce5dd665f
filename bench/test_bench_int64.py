"""int64 arithmetic emulated with two 32-bit words (adapters without "shader-int64") against the
native i64 kernels on the same adapter, in the same run: what the emulation costs.

The emulated context is the internal switch MLTENSOR_DISABLE_INT64=1 (the device is created
without the feature). Graphs: a fused multiply-add chain and a full reduction (the common int64
work: index arithmetic, shape math, sums) over 1M elements, and division (the worst case: a
64-step long division per element when the operands do not fit in 32 bits). Skipped where the
adapter has no shader-int64 (there is no native figure to compare with).
"""

import numpy as np
import pytest

import mltensor
from mltensor import ml

from .timing import measure, record

N = 1 << 20


def _graph(ctx, kind):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="int64", shape=[N])
    y = b.input("y", data_type="int64", shape=[N])
    if kind == "div":
        out = b.div(x, y)
    else:
        out = b.reduce_sum(b.add(b.mul(x, y), x), keep_dimensions=True) if kind == "sum" else b.add(b.mul(x, y), x)
    return b.build_sync({"z": out}), out.shape


def _run(ctx, kind, a, c):
    g, shape = _graph(ctx, kind)
    tx = ctx.create_tensor_sync(data_type="int64", shape=[N], writable=True)
    ty = ctx.create_tensor_sync(data_type="int64", shape=[N], writable=True)
    tz = ctx.create_tensor_sync(data_type="int64", shape=list(shape), readable=True)
    ctx.write_tensor(tx, a)
    ctx.write_tensor(ty, c)
    m = measure(lambda: ctx.dispatch(g, {"x": tx, "y": ty}, {"z": tz}), lambda: ctx.read_tensor_sync(tz), rounds=5)
    return m, ctx.read_tensor_sync(tz)


@pytest.fixture(scope="module")
def emulated_ctx():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLTENSOR_DISABLE_INT64", "1")
        c = ml.create_context_sync(power_preference="high-performance")
    yield c
    c.destroy()


@pytest.mark.parametrize("kind", ["muladd", "sum", "div"])
def test_int64_emulated_vs_native(benchmark, ctx, emulated_ctx, kind):
    if not ctx._int64:
        pytest.skip("the adapter has no shader-int64: no native reference")
    rng = np.random.default_rng(0)
    a = rng.integers(-(2**62), 2**62, size=N, dtype=np.int64)
    c = rng.integers(-(2**40), 2**40, size=N, dtype=np.int64)
    native, want = _run(ctx, kind, a, c)
    ours, got = _run(emulated_ctx, kind, a, c)
    np.testing.assert_array_equal(got, want)  # same bits, or the timing means nothing
    record(benchmark, ours, f"int64 {kind} 1M (two-word emulation)", native, "native i64 (same adapter)")
