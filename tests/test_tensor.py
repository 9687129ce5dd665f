"""MLTensor creation, writes, reads (new array and BYOB), destroy, and timeline ordering."""

import asyncio

import numpy as np
import pytest

import mltensor
from mltensor import ml
from mltensor.dtypes import ALL, NUMPY


def _t(ctx, dt="float32", shape=(4,), **kw):
    kw.setdefault("readable", True)
    kw.setdefault("writable", True)
    return ctx.create_tensor_sync(data_type=dt, shape=list(shape), **kw)


# -- creation -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ALL)
def test_new_tensor_is_zero_filled_with_dtype_and_shape(ctx, dt):
    t = _t(ctx, dt, (3, 5))
    assert t.data_type == dt and t.shape == (3, 5)
    out = ctx.read_tensor_sync(t)
    assert out.shape == (3, 5)
    assert out.dtype == NUMPY[dt]
    assert not out.any()
    t.destroy()


def test_attributes(ctx):
    t = ctx.create_tensor_sync(data_type="int8", shape=[2, 2], readable=True)
    assert (t.readable, t.writable, t.importable_to_webgpu, t.constant) == (True, False, False, False)
    assert isinstance(t.shape, tuple)


def test_numpy_dtype_accepted(ctx):
    t = ctx.create_tensor_sync(data_type=np.float16, shape=[2], readable=True)
    assert t.data_type == "float16"
    t2 = ctx.create_tensor_sync(data_type=np.dtype("uint8"), shape=[2])
    assert t2.data_type == "uint8"


def test_scalar_tensor(ctx):
    t = _t(ctx, "float32", ())
    ctx.write_tensor(t, np.array(3.5, np.float32))
    out = ctx.read_tensor_sync(t)
    assert out.shape == () and out.dtype == np.float32 and out == 3.5


@pytest.mark.parametrize("shape", [[0], [2, 0], [-1], [2, -3], [1.5], "ab", 3])
def test_bad_shapes_are_type_errors(ctx, shape):
    with pytest.raises(TypeError, match=r"\[create_tensor\]"):
        ctx.create_tensor_sync(data_type="float32", shape=shape)


def test_unknown_data_type_is_type_error(ctx):
    with pytest.raises(TypeError, match="data type"):
        ctx.create_tensor_sync(data_type="float64", shape=[1])
    with pytest.raises(TypeError):
        ctx.create_tensor_sync(data_type=np.float64, shape=[1])
    with pytest.raises(TypeError):
        ctx.create_tensor_sync(data_type="bool", shape=[1])


def test_too_large_is_type_error(ctx):
    limit = ctx.op_support_limits()["max_tensor_byte_length"]
    with pytest.raises(TypeError, match="max_tensor_byte_length"):
        ctx.create_tensor_sync(data_type="float32", shape=[limit // 4 + 1])


async def test_create_tensor_async(ctx):
    t = await ctx.create_tensor_async(data_type="int32", shape=[3], readable=True)
    assert (await ctx.read_tensor_async(t)).tolist() == [0, 0, 0]


# -- round trips ----------------------------------------------------------------------------------


def _extremes(dt):
    np_dt = NUMPY[dt]
    if dt == "float16":
        bits = np.array(
            [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0x7C01, 0xFE17, 0x0001, 0x03FF, 0x7BFF, 0x3C00, 0xBC00, 0x5555],
            dtype=np.uint16,
        )
        return bits.view(np.float16)
    if dt == "float32":
        bits = np.array(
            [
                0,
                0x80000000,
                0x7F800000,
                0xFF800000,
                0x7FC00000,
                0x7F800001,
                0x00000001,
                0x7F7FFFFF,
                0x3F800000,
                0x12345678,
            ],
            dtype=np.uint32,
        )
        return bits.view(np.float32)
    info = np.iinfo(np_dt)
    return np.array([info.min, info.max, 0, 1, info.max // 3, info.min + 1], dtype=np_dt)


@pytest.mark.parametrize("dt", ALL)
def test_round_trip_exact_bytes(ctx, dt):
    data = _extremes(dt)
    t = _t(ctx, dt, data.shape)
    ctx.write_tensor(t, data)
    out = ctx.read_tensor_sync(t)
    assert out.shape == data.shape
    assert out.dtype == NUMPY[dt]
    assert out.tobytes() == data.tobytes()


@pytest.mark.parametrize("dt", ALL)
def test_uint8_raw_write_into_any_dtype(ctx, dt):
    data = _extremes(dt)[:5]
    t = _t(ctx, dt, data.shape)
    ctx.write_tensor(t, np.frombuffer(data.tobytes(), dtype=np.uint8))
    assert ctx.read_tensor_sync(t).tobytes() == data.tobytes()
    ctx.write_tensor(t, bytearray(data[::-1].tobytes()))
    assert ctx.read_tensor_sync(t).tobytes() == data[::-1].tobytes()
    ctx.write_tensor(t, memoryview(data.tobytes()))
    assert ctx.read_tensor_sync(t).tobytes() == data.tobytes()


def test_odd_byte_lengths(ctx):
    for n in (1, 2, 3, 5, 7):
        data = np.arange(n, dtype=np.uint8) + 200
        t = _t(ctx, "uint8", (n,))
        ctx.write_tensor(t, data)
        assert ctx.read_tensor_sync(t).tolist() == data.tolist()
    t = _t(ctx, "float16", (3,))
    ctx.write_tensor(t, np.array([1, 2, 3], np.float16))
    assert ctx.read_tensor_sync(t).tolist() == [1, 2, 3]


def test_write_then_overwrite_order(ctx):
    t = _t(ctx, "int32", (4,))
    for k in range(5):
        ctx.write_tensor(t, np.full(4, k, np.int32))
    assert ctx.read_tensor_sync(t).tolist() == [4] * 4


async def test_reads_see_writes_in_call_order(ctx):
    t = _t(ctx, "int32", (4,))
    ctx.write_tensor(t, np.full(4, 1, np.int32))
    r1 = ctx.read_tensor_async(t)
    ctx.write_tensor(t, np.full(4, 2, np.int32))
    r2 = ctx.read_tensor_async(t)
    assert (await r1).tolist() == [1] * 4
    assert (await r2).tolist() == [2] * 4


def test_write_copies_data_at_call_time(ctx):
    t = _t(ctx, "float32", (3,))
    data = np.array([1, 2, 3], np.float32)
    ctx.write_tensor(t, data)
    data[:] = 9
    assert ctx.read_tensor_sync(t).tolist() == [1, 2, 3]


def test_noncontiguous_write(ctx):
    t = _t(ctx, "float32", (3,))
    data = np.arange(6, dtype=np.float32)[::2]
    ctx.write_tensor(t, data)
    assert ctx.read_tensor_sync(t).tolist() == [0, 2, 4]


# -- write validation -----------------------------------------------------------------------------


def test_write_errors(ctx):
    t = _t(ctx, "float32", (4,))
    with pytest.raises(TypeError, match="bytes"):
        ctx.write_tensor(t, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        ctx.write_tensor(t, np.zeros(4, np.int32))
    with pytest.raises(TypeError, match="dtype"):
        ctx.write_tensor(t, np.zeros(2, np.float64))
    with pytest.raises(TypeError, match="buffer protocol"):
        ctx.write_tensor(t, [1, 2, 3, 4])
    ro = ctx.create_tensor_sync(data_type="float32", shape=[4], readable=True)
    with pytest.raises(TypeError, match="writable"):
        ctx.write_tensor(ro, np.zeros(4, np.float32))
    with pytest.raises(TypeError):
        ctx.write_tensor("tensor", np.zeros(4, np.float32))


def test_write_other_context_tensor(ctx, fresh_ctx):
    t = _t(fresh_ctx, "float32", (2,))
    with pytest.raises(TypeError, match="another MLContext"):
        ctx.write_tensor(t, np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="another MLContext"):
        ctx.read_tensor_sync(t)


def test_write_destroyed_tensor(ctx):
    t = _t(ctx)
    t.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        ctx.write_tensor(t, np.zeros(4, np.float32))
    with pytest.raises(mltensor.InvalidStateError):
        ctx.read_tensor_sync(t)


# -- reads ----------------------------------------------------------------------------------------


def test_read_not_readable(ctx):
    t = ctx.create_tensor_sync(data_type="float32", shape=[4], writable=True)
    with pytest.raises(TypeError, match="readable"):
        ctx.read_tensor_sync(t)


def test_byob_exact_larger_and_smaller(ctx):
    t = _t(ctx, "int32", (4,))
    ctx.write_tensor(t, np.array([1, -2, 3, -4], np.int32))
    out = np.zeros(4, np.int32)
    assert ctx.read_tensor_sync(t, out) is None
    assert out.tolist() == [1, -2, 3, -4]
    big = np.full(6, 7, np.int32)
    ctx.read_tensor_sync(t, big)
    assert big.tolist() == [1, -2, 3, -4, 7, 7]
    raw = bytearray(20)
    ctx.read_tensor_sync(t, raw)
    assert np.frombuffer(bytes(raw[:16]), np.int32).tolist() == [1, -2, 3, -4]
    with pytest.raises(TypeError, match="bytes"):
        ctx.read_tensor_sync(t, np.zeros(3, np.int32))
    with pytest.raises(TypeError):
        ctx.read_tensor_sync(t, b"\0" * 16)  # read-only buffer


async def test_byob_async(ctx):
    t = _t(ctx, "float16", (3,))
    ctx.write_tensor(t, np.array([1, 2, 3], np.float16))
    out = np.zeros(3, np.float16)
    assert await ctx.read_tensor_async(t, out) is None
    assert out.tolist() == [1, 2, 3]


async def test_parallel_reads_one_submit(ctx):
    ts = [_t(ctx, "float32", (64,)) for _ in range(4)]
    for k, t in enumerate(ts):
        ctx.write_tensor(t, np.full(64, k, np.float32))
    ctx.flush()
    before = ctx.counters["submits"]
    reads = [ctx.read_tensor_async(t) for t in ts]
    results = await asyncio.gather(*reads)
    assert [r[0] for r in results] == [0, 1, 2, 3]
    assert ctx.counters["submits"] - before == 1  # all copies went out in one submit


def test_counters_track_bytes_and_tensors(fresh_ctx):
    c = fresh_ctx
    t = _t(c, "float32", (10,))
    assert c.counters["tensors_alive"] == 1 and c.counters["bytes_alive"] == 40
    c.write_tensor(t, np.zeros(10, np.float32))
    c.read_tensor_sync(t)
    assert c.counters["bytes_uploaded"] == 40 and c.counters["bytes_downloaded"] == 40
    t.destroy()
    assert c.counters["tensors_alive"] == 0 and c.counters["bytes_alive"] == 0


# -- destroy --------------------------------------------------------------------------------------


def test_destroy_twice(ctx):
    t = _t(ctx)
    t.destroy()
    t.destroy()


async def test_destroy_with_reads_pending(ctx):
    t = _t(ctx)
    ctx.write_tensor(t, np.ones(4, np.float32))
    r = ctx.read_tensor_async(t)
    t.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        await r


async def test_context_destroy_with_reads_pending():
    c = ml.create_context_sync()
    t = _t(c)
    r = c.read_tensor_async(t)
    c.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        await r


def test_destroy_after_dispatch_work_completes(ctx):
    """A tensor destroyed after work is enqueued on it: the work still completes."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4])
    g = b.build_sync({"y": b.add(x, x)})
    tx = _t(ctx)
    ty = _t(ctx)
    ctx.write_tensor(tx, np.arange(4, dtype=np.float32))
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    tx.destroy()  # enqueued dispatch still reads it
    assert ctx.read_tensor_sync(ty).tolist() == [0, 2, 4, 6]


def test_two_contexts_do_not_mix():
    a = ml.create_context_sync()
    b = ml.create_context_sync()
    ta, tb = _t(a, "int32", (2,)), _t(b, "int32", (2,))
    a.write_tensor(ta, np.array([1, 2], np.int32))
    b.write_tensor(tb, np.array([3, 4], np.int32))
    assert a.read_tensor_sync(ta).tolist() == [1, 2]
    assert b.read_tensor_sync(tb).tolist() == [3, 4]
    a.destroy()
    assert b.read_tensor_sync(tb).tolist() == [3, 4]
    b.destroy()


# -- constant tensors -----------------------------------------------------------------------------


def test_constant_tensor(ctx):
    c = ctx.create_constant_tensor_sync(data_type="float32", shape=[3], data=np.array([1, 2, 3], np.float32))
    assert c.constant and not c.readable and not c.writable
    with pytest.raises(TypeError):
        ctx.read_tensor_sync(c)
    with pytest.raises(TypeError):
        ctx.write_tensor(c, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="bytes"):
        ctx.create_constant_tensor_sync(data_type="float32", shape=[3], data=np.zeros(2, np.float32))


async def test_constant_tensor_async(ctx):
    c = await ctx.create_constant_tensor_async(data_type="int8", shape=[2], data=np.array([1, -1], np.int8))
    assert c.constant and c.data_type == "int8"


def test_large_results_never_share_memory_while_alive(ctx):
    """Large reads recycle host memory, but only once no array (or view) refers to it."""
    n = 1 << 19  # 2 MiB of float32: above the recycling threshold
    t = _t(ctx, "float32", (n,))
    ctx.write_tensor(t, np.full(n, 1, np.float32))
    first = ctx.read_tensor_sync(t)
    part = first[10:20]  # a view keeps the block alive after `first` goes
    del first
    ctx.write_tensor(t, np.full(n, 2, np.float32))
    second = ctx.read_tensor_sync(t)
    assert part.tolist() == [1] * 10
    assert second[:3].tolist() == [2, 2, 2]
    del part, second
    ctx.write_tensor(t, np.full(n, 3, np.float32))
    third = ctx.read_tensor_sync(t)  # may reuse a block now: it must hold the new values
    assert third.shape == (n,) and third.dtype == np.float32
    assert (third == 3).all()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("writable", [False, True], ids=["staging", "in_place"])
def test_interrupted_read_leaves_the_tensor_usable(fresh_ctx, monkeypatch, writable):
    """A KeyboardInterrupt (Ctrl-C) while a read waits for its mapping: the read raises it, and
    the buffer is unmapped all the same, so later writes, reads and dispatches of the tensor go on
    (a buffer left mapped held them back forever: a chat interrupted in a read hung its next turn)."""
    from mltensor.runtime import timeline

    ctx = fresh_ctx
    t = ctx.create_tensor_sync(data_type="float32", shape=[4], readable=True, writable=writable)
    if writable:
        ctx.write_tensor(t, np.arange(4, dtype=np.float32))
    real = timeline.wait_sync_promise
    calls = []

    def interrupted(promise, gone=None):
        calls.append(promise)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(promise, gone)

    monkeypatch.setattr(timeline, "wait_sync_promise", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ctx.read_tensor_sync(t)
    monkeypatch.setattr(timeline, "wait_sync_promise", real)
    want = np.arange(4, dtype=np.float32) if writable else np.zeros(4, np.float32)
    np.testing.assert_array_equal(ctx.read_tensor_sync(t), want)
    if writable:
        ctx.write_tensor(t, np.full(4, 7, np.float32))
        np.testing.assert_array_equal(ctx.read_tensor_sync(t), np.full(4, 7, np.float32))
