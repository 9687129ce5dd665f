"""Launch costs (issue 15): reads wait with one submit, and never see stale memory."""

import numpy as np

import mltensor


def _add_one(ctx, n):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[n])
    return b.build_sync({"y": b.add(x, b.constant(data_type="float32", value=1.0))})


def test_read_after_dispatch_is_one_submit(ctx):
    """The kernel and the read's copy go out in one submit: no empty submit ahead of the map."""
    g = _add_one(ctx, 64)
    a = ctx.create_tensor_sync(data_type="float32", shape=[64], writable=True)
    c = ctx.create_tensor_sync(data_type="float32", shape=[64], readable=True)
    ctx.write_tensor(a, np.arange(64, dtype=np.float32))
    ctx.dispatch(g, {"x": a}, {"y": c})
    ctx.read_tensor_sync(c)
    for i in range(5):
        before = ctx.counters["submits"]
        ctx.dispatch(g, {"x": a}, {"y": c})
        np.testing.assert_array_equal(ctx.read_tensor_sync(c), np.arange(64, dtype=np.float32) + 1)
        assert ctx.counters["submits"] - before == 1


def test_read_right_after_write_sees_the_write(ctx):
    """A queue write is staged until the next submit: a read mapped with no submit in between
    must still see it (on CPU adapters readable tensors are mapped in place)."""
    t = ctx.create_tensor_sync(data_type="float32", shape=[1000], readable=True, writable=True)
    for k in range(6):
        v = np.full(1000, k + 0.5, np.float32)
        ctx.write_tensor(t, v)
        np.testing.assert_array_equal(ctx.read_tensor_sync(t), v)
        np.testing.assert_array_equal(ctx.read_tensor_sync(t), v)  # and again, nothing pending


async def test_async_read_right_after_write(ctx):
    t = ctx.create_tensor_sync(data_type="int32", shape=[77], readable=True, writable=True)
    for k in range(4):
        v = np.arange(77, dtype=np.int32) * (k + 1)
        ctx.write_tensor(t, v)
        np.testing.assert_array_equal(await ctx.read_tensor_async(t), v)
