"""WebGPU interop: lending MLTensors to a wgpu.GPUDevice (import_external_buffer)."""

import asyncio

import numpy as np
import pytest
import wgpu

import mltensor
from mltensor import ml

U = wgpu.BufferUsage
LENT_USAGE = U.STORAGE | U.COPY_SRC | U.COPY_DST
N = 1000  # not a multiple of the workgroup size

ADD_ONE_WGSL = """
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&data)) { data[id.x] = data[id.x] + 1.0; }
}
"""


class Device:
    """A wgpu device of the test with its own WGSL work: add one in place, read back."""

    def __init__(self):
        self.device = wgpu.gpu.request_adapter_sync().request_device_sync(label="interop-test")
        module = self.device.create_shader_module(code=ADD_ONE_WGSL)
        self.pipeline = self.device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"}
        )

    def add_one(self, buf, n=N):
        """Record and submit (no wait) a compute pass adding 1.0 to each f32 of `buf`."""
        d = self.device
        bg = d.create_bind_group(
            layout=self.pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
        )
        enc = d.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(self.pipeline)
        p.set_bind_group(0, bg)
        p.dispatch_workgroups((n + 63) // 64)
        p.end()
        d.queue.submit([enc.finish()])

    def read(self, buf, dtype=np.float32, count=N):
        """The device's own readback: copy into a MAP_READ buffer and map it."""
        d = self.device
        st = d.create_buffer(size=buf.size, usage=U.MAP_READ | U.COPY_DST)
        enc = d.create_command_encoder()
        enc.copy_buffer_to_buffer(buf, 0, st, 0, buf.size)
        d.queue.submit([enc.finish()])
        st.map_sync(wgpu.MapMode.READ)
        out = np.frombuffer(st.read_mapped(), dtype=dtype, count=count).copy()
        st.unmap()
        st.destroy()
        return out


@pytest.fixture(scope="module")
def dev():
    return Device()


@pytest.fixture(scope="module")
def dev2():
    return Device()


@pytest.fixture
def sctx(dev):
    """A context on the test's device: same-device (zero-copy) interop."""
    c = ml.create_context_sync(dev.device)
    yield c
    c.destroy()


@pytest.fixture
def xctx(dev):
    """A context on `dev`, lending to `dev2`: cross-device interop."""
    c = ml.create_context_sync(dev.device)
    yield c
    c.destroy()


def add_one_graph(ctx, n=N):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[n])
    return b.build_sync({"y": b.add(x, b.constant(np.ones(n, np.float32)))})


def tensor(ctx, n=N, **kw):
    kw.setdefault("readable", True)
    kw.setdefault("writable", True)
    return ctx.create_tensor_sync(data_type="float32", shape=[n], **kw)


def x0():
    return np.arange(N, dtype=np.float32) * 0.5


# -- the buffer --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data_type,shape,size",
    [
        ("float32", [N], 4 * N),
        ("float16", [3], 8),
        ("int8", [5], 8),
        ("uint8", [4], 4),
        ("int64", [2, 3], 48),
        ("float32", [], 4),
    ],
)
def test_buffer_is_a_real_gpubuffer(dev, sctx, data_type, shape, size):
    t = sctx.create_tensor_sync(data_type=data_type, shape=shape, importable_to_webgpu=True)
    buf = mltensor.import_external_buffer_sync(dev.device, t)
    assert isinstance(buf, wgpu.GPUBuffer)
    assert buf.usage == LENT_USAGE
    assert buf.size == size
    buf.destroy()


def test_queue_write_buffer_and_copy_commands(dev, sctx):
    t = tensor(sctx, importable_to_webgpu=True)
    sctx.write_tensor(t, x0())
    buf = mltensor.import_external_buffer_sync(dev.device, t)
    d = dev.device
    d.queue.write_buffer(buf, 0, np.full(10, 7, np.float32))  # queue.write_buffer accepts it
    other = d.create_buffer(size=buf.size, usage=U.COPY_SRC | U.COPY_DST)
    enc = d.create_command_encoder()  # and copy commands, both ways
    enc.copy_buffer_to_buffer(buf, 0, other, 0, buf.size)
    enc.copy_buffer_to_buffer(other, 0, buf, 4 * N - 8, 8)
    d.queue.submit([enc.finish()])
    buf.release()
    want = x0()
    want[:10] = 7
    want[N - 2 :] = want[:2]
    np.testing.assert_array_equal(sctx.read_tensor_sync(t), want)


# -- ML and device work interleaved, no waits in between ---------------------------------------


def test_same_device_round_trip(dev, sctx):
    g = add_one_graph(sctx)
    xin = tensor(sctx)
    t = tensor(sctx, importable_to_webgpu=True)
    t2 = tensor(sctx, importable_to_webgpu=True)
    sctx.write_tensor(xin, x0())
    sctx.dispatch(g, {"x": xin}, {"y": t})  # ML writes: x + 1
    buf = mltensor.import_external_buffer_sync(dev.device, t)
    dev.add_one(buf)  # device adds one: x + 2
    buf.release()
    sctx.dispatch(g, {"x": t}, {"y": t2})  # ML adds again: x + 3
    buf2 = mltensor.import_external_buffer_sync(dev.device, t2)
    got = dev.read(buf2)  # device reads
    buf2.destroy()
    assert got.shape == (N,) and got.dtype == np.float32
    np.testing.assert_array_equal(got, x0() + 3)
    np.testing.assert_array_equal(sctx.read_tensor_sync(t), x0() + 2)


def test_same_device_cycle_moves_no_bytes(dev, sctx):
    g = add_one_graph(sctx)
    t = tensor(sctx, importable_to_webgpu=True)
    t2 = tensor(sctx)
    sctx.write_tensor(t, x0())
    sctx.flush()
    before = sctx.counters
    for _ in range(3):
        buf = mltensor.import_external_buffer_sync(dev.device, t)
        dev.add_one(buf)
        buf.destroy()
    sctx.dispatch(g, {"x": t}, {"y": t2})
    after = sctx.counters
    for k in ("bytes_uploaded", "bytes_downloaded", "bytes_copied_between_devices"):
        assert after[k] == before[k], k
    np.testing.assert_array_equal(sctx.read_tensor_sync(t2), x0() + 4)


def test_same_device_import_does_not_wait(dev, sctx):
    g = add_one_graph(sctx)
    xin = tensor(sctx)
    t = tensor(sctx, importable_to_webgpu=True)
    sctx.write_tensor(xin, x0())
    sctx.dispatch(g, {"x": xin}, {"y": t})
    submits = sctx.counters["submits"]
    buf = mltensor.import_external_buffer_sync(dev.device, t)
    assert sctx.counters["submits"] == submits + 1  # the ML work went to the shared queue
    assert sctx._timeline._encoder is None
    buf.destroy()


def test_cross_device_round_trip(dev, dev2, xctx):
    g = add_one_graph(xctx)
    xin = tensor(xctx)
    t = tensor(xctx, importable_to_webgpu=True)
    t2 = tensor(xctx, importable_to_webgpu=True)
    xctx.write_tensor(xin, x0())
    c0 = xctx.counters["bytes_copied_between_devices"]
    xctx.dispatch(g, {"x": xin}, {"y": t})  # ML writes: x + 1
    buf = mltensor.import_external_buffer_sync(dev2.device, t)
    assert buf.usage == LENT_USAGE and buf.size == 4 * N
    assert xctx.counters["bytes_copied_between_devices"] == c0 + 4 * N
    dev2.add_one(buf)  # the other device adds one
    buf.release()
    assert xctx.counters["bytes_copied_between_devices"] == c0 + 8 * N
    xctx.dispatch(g, {"x": t}, {"y": t2})  # ML adds again
    buf2 = mltensor.import_external_buffer_sync(dev2.device, t2)
    got = dev2.read(buf2)
    buf2.destroy()
    np.testing.assert_array_equal(got, x0() + 3)
    np.testing.assert_array_equal(xctx.read_tensor_sync(t), x0() + 2)
    assert xctx.counters["bytes_copied_between_devices"] == c0 + 16 * N


async def test_cross_device_async(dev, dev2, xctx):
    g = add_one_graph(xctx)
    t = tensor(xctx, importable_to_webgpu=True)
    t2 = tensor(xctx)
    xctx.write_tensor(t, x0())
    buf = await mltensor.import_external_buffer_async(dev2.device, t)
    dev2.add_one(buf)
    dev2.add_one(buf)
    r = xctx.read_tensor_async(t)  # held back until the release
    xctx.dispatch(g, {"x": t}, {"y": t2})
    r2 = xctx.read_tensor_async(t2)
    await asyncio.sleep(0)
    assert not r.done() and not r2.done()
    buf.destroy()
    np.testing.assert_array_equal(await r, x0() + 2)
    np.testing.assert_array_equal(await r2, x0() + 3)


def test_own_device_context_lends_to_its_own_device(dev):
    ctx = ml.create_context_sync()
    try:
        t = tensor(ctx, importable_to_webgpu=True)
        ctx.write_tensor(t, x0())
        buf = mltensor.import_external_buffer_sync(ctx.device, t)
        assert buf.usage == LENT_USAGE
        ctx.device.queue.write_buffer(buf, 0, np.float32([42]))
        buf.release()
        assert ctx.counters["bytes_copied_between_devices"] == 0
        assert ctx.read_tensor_sync(t)[0] == 42
    finally:
        ctx.destroy()


# -- holding back ------------------------------------------------------------------------------


@pytest.mark.parametrize("cross", [False, True])
async def test_dependent_work_is_held_independent_work_flows(dev, dev2, xctx, cross):
    target = dev2 if cross else dev
    ctx = xctx
    g = add_one_graph(ctx)
    T = tensor(ctx, importable_to_webgpu=True)
    A, B = tensor(ctx), tensor(ctx)
    C, D = tensor(ctx), tensor(ctx)
    ctx.write_tensor(T, x0())
    ctx.write_tensor(C, x0() * 2)
    buf = mltensor.import_external_buffer_sync(target.device, T)
    ctx.dispatch(g, {"x": T}, {"y": A})  # reads T: held
    ctx.dispatch(g, {"x": A}, {"y": B})  # reads A, written by held work: held
    rB = ctx.read_tensor_async(B)  # held
    ctx.dispatch(g, {"x": C}, {"y": D})  # independent
    rD = ctx.read_tensor_async(D)
    target.add_one(buf)  # the device writes T meanwhile
    target.add_one(buf)
    np.testing.assert_array_equal(await rD, x0() * 2 + 1)  # resolves while T is still lent
    assert not rB.done()
    with pytest.raises(mltensor.InvalidStateError):
        ctx.read_tensor_sync(A)  # cannot block the only thread on a lease
    buf.release()
    np.testing.assert_array_equal(await rB, x0() + 4)  # device's +2, then ML +1 +1
    np.testing.assert_array_equal(ctx.read_tensor_sync(A), x0() + 3)


async def test_held_write_keeps_call_time_bytes(dev, sctx):
    T = tensor(sctx, importable_to_webgpu=True)
    buf = mltensor.import_external_buffer_sync(dev.device, T)
    data = x0()
    sctx.write_tensor(T, data)  # held back behind the lease
    data[:] = -1  # changing it afterwards changes nothing
    r = sctx.read_tensor_async(T)
    dev.add_one(buf)  # runs first: the held write overwrites it
    await asyncio.sleep(0)
    assert not r.done()
    buf.release()
    np.testing.assert_array_equal(await r, x0())


async def test_held_work_runs_in_call_order(dev, sctx):
    g = add_one_graph(sctx)
    T = tensor(sctx, importable_to_webgpu=True)
    A = tensor(sctx)
    sctx.write_tensor(T, x0())
    buf = mltensor.import_external_buffer_sync(dev.device, T)
    sctx.dispatch(g, {"x": T}, {"y": A})  # A = T + 1 (T after the device's work)
    r1 = sctx.read_tensor_async(A)
    sctx.write_tensor(A, np.zeros(N, np.float32))  # write-after-read on A: held too
    r2 = sctx.read_tensor_async(A)
    dev.add_one(buf)
    buf.destroy()
    np.testing.assert_array_equal(await r1, x0() + 2)
    np.testing.assert_array_equal(await r2, np.zeros(N, np.float32))


async def test_import_held_behind_another_lease(dev, sctx):
    g = add_one_graph(sctx)
    T, A = tensor(sctx, importable_to_webgpu=True), tensor(sctx, importable_to_webgpu=True)
    sctx.write_tensor(T, x0())
    buf = mltensor.import_external_buffer_sync(dev.device, T)
    sctx.dispatch(g, {"x": T}, {"y": A})  # held: A depends on the lease of T
    with pytest.raises(mltensor.InvalidStateError):
        mltensor.import_external_buffer_sync(dev.device, A)
    pa = mltensor.import_external_buffer_async(dev.device, A)
    await asyncio.sleep(0)
    assert not pa.done()
    dev.add_one(buf)
    buf.release()
    bufa = await pa
    np.testing.assert_array_equal(dev.read(bufa), x0() + 2)
    bufa.release()


# -- edge cases --------------------------------------------------------------------------------


def test_not_importable_and_wrong_arguments(dev, sctx):
    t = tensor(sctx)
    with pytest.raises(TypeError, match="importable_to_webgpu"):
        mltensor.import_external_buffer_sync(dev.device, t)
    with pytest.raises(TypeError, match="importable_to_webgpu"):
        mltensor.import_external_buffer_async(dev.device, t)
    with pytest.raises(TypeError, match="GPUDevice"):
        mltensor.import_external_buffer_sync(None, tensor(sctx, importable_to_webgpu=True))
    with pytest.raises(TypeError, match="MLTensor"):
        mltensor.import_external_buffer_sync(dev.device, np.zeros(3))


def test_import_twice_returns_the_same_buffer(dev, dev2, sctx):
    t = tensor(sctx, importable_to_webgpu=True)
    buf = mltensor.import_external_buffer_sync(dev.device, t)
    assert mltensor.import_external_buffer_sync(dev.device, t) is buf
    with pytest.raises(TypeError, match="another GPUDevice"):
        mltensor.import_external_buffer_sync(dev2.device, t)
    buf.release()
    buf3 = mltensor.import_external_buffer_sync(dev.device, t)  # a new lease after the release
    assert buf3 is not buf
    buf3.release()


async def test_import_async_twice(dev, dev2, xctx):
    t = tensor(xctx, importable_to_webgpu=True)
    p = mltensor.import_external_buffer_async(dev2.device, t)
    with pytest.raises(TypeError, match="not resolved"):
        mltensor.import_external_buffer_sync(dev2.device, t)
    with pytest.raises(TypeError, match="not resolved"):
        mltensor.import_external_buffer_async(dev2.device, t)
    buf = await p
    assert await mltensor.import_external_buffer_async(dev2.device, t) is buf
    assert mltensor.import_external_buffer_sync(dev2.device, t) is buf
    buf.release()


async def test_import_async_same_device_pending_until_awaited(dev, sctx):
    t = tensor(sctx, importable_to_webgpu=True)
    p = mltensor.import_external_buffer_async(dev.device, t)
    with pytest.raises(TypeError, match="not resolved"):
        mltensor.import_external_buffer_sync(dev.device, t)
    buf = await p
    assert buf.usage == LENT_USAGE
    buf.release()


def test_release_twice_is_a_no_op(dev, dev2, xctx):
    g = add_one_graph(xctx)
    t, t2 = tensor(xctx, importable_to_webgpu=True), tensor(xctx)
    xctx.write_tensor(t, x0())
    buf = mltensor.import_external_buffer_sync(dev2.device, t)
    dev2.add_one(buf)
    buf.release()
    c = xctx.counters["bytes_copied_between_devices"]
    buf.release()
    buf.destroy()
    assert xctx.counters["bytes_copied_between_devices"] == c
    xctx.dispatch(g, {"x": t}, {"y": t2})
    np.testing.assert_array_equal(xctx.read_tensor_sync(t2), x0() + 2)


def test_released_buffer_no_longer_reaches_the_tensor(dev, sctx):
    t = tensor(sctx, importable_to_webgpu=True)
    sctx.write_tensor(t, x0())
    buf = mltensor.import_external_buffer_sync(dev.device, t)
    buf.release()
    with pytest.raises(Exception):
        dev.device.queue.write_buffer(buf, 0, np.zeros(N, np.float32))  # stub: too small
    dev.add_one(buf)  # a stray kernel on it touches the 4-byte stub, not the tensor
    np.testing.assert_array_equal(sctx.read_tensor_sync(t), x0())


@pytest.mark.parametrize("cross", [False, True])
def test_tensor_destroyed_while_lent(dev, dev2, xctx, cross):
    target = dev2 if cross else dev
    t = tensor(xctx, importable_to_webgpu=True)
    xctx.write_tensor(t, x0())
    alive = xctx.counters["tensors_alive"]
    buf = mltensor.import_external_buffer_sync(target.device, t)
    t.destroy()  # the free is held behind the lease
    assert xctx.counters["tensors_alive"] == alive - 1
    with pytest.raises(mltensor.InvalidStateError):
        mltensor.import_external_buffer_sync(target.device, t)
    target.add_one(buf)  # still usable by the device
    np.testing.assert_array_equal(target.read(buf), x0() + 1)
    buf.release()
    assert not xctx._timeline.held and t not in xctx._timeline.lent


@pytest.mark.parametrize("cross", [False, True])
def test_context_destroyed_while_lent(dev, dev2, cross):
    target = dev2 if cross else dev
    ctx = ml.create_context_sync(dev.device)
    g = add_one_graph(ctx)
    t, a = tensor(ctx, importable_to_webgpu=True), tensor(ctx)
    ctx.write_tensor(t, x0())
    buf = mltensor.import_external_buffer_sync(target.device, t)
    ctx.dispatch(g, {"x": t}, {"y": a})  # held
    ctx.destroy()
    target.add_one(buf)  # still usable by the device
    np.testing.assert_array_equal(target.read(buf), x0() + 1)
    buf.release()
    buf.release()
    with pytest.raises(mltensor.InvalidStateError):
        mltensor.import_external_buffer_sync(target.device, t)


def test_destroyed_device_and_lost_context(dev, sctx):
    d = wgpu.gpu.request_adapter_sync().request_device_sync()
    t = tensor(sctx, importable_to_webgpu=True)
    d.destroy()
    with pytest.raises(mltensor.InvalidStateError, match="destroyed"):
        mltensor.import_external_buffer_sync(d, t)
    with pytest.raises(mltensor.InvalidStateError, match="destroyed"):
        mltensor.import_external_buffer_async(d, t)
    ctx = ml.create_context_sync(dev.device)
    t2 = tensor(ctx, importable_to_webgpu=True)
    ctx.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        mltensor.import_external_buffer_sync(dev.device, t2)


async def test_context_lost_while_async_import_held(dev, dev2):
    ctx = ml.create_context_sync(dev.device)
    g = add_one_graph(ctx)
    T, A = tensor(ctx, importable_to_webgpu=True), tensor(ctx, importable_to_webgpu=True)
    buf = mltensor.import_external_buffer_sync(dev.device, T)
    ctx.dispatch(g, {"x": T}, {"y": A})
    p = mltensor.import_external_buffer_async(dev2.device, A)
    await asyncio.sleep(0)
    ctx.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        await p
    buf.release()


async def test_cancelled_async_import_unlends(dev, sctx):
    g = add_one_graph(sctx)
    T, A, B = (tensor(sctx, importable_to_webgpu=True) for _ in range(3))
    sctx.write_tensor(T, x0())
    buf = mltensor.import_external_buffer_sync(dev.device, T)
    sctx.dispatch(g, {"x": T}, {"y": A})
    p = mltensor.import_external_buffer_async(dev.device, A)  # held behind T's lease
    await asyncio.sleep(0)
    p.cancel()
    with pytest.raises(asyncio.CancelledError):
        await p
    buf.release()
    assert A not in sctx._timeline.lent and not sctx._timeline.held
    np.testing.assert_array_equal(sctx.read_tensor_sync(A), x0() + 1)
