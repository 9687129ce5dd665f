"""WebGPU interop: cost of one import_external_buffer + release cycle, and bytes moved per cycle.

Same device (zero-copy lease) and another device (copy in at import, copy back at release),
against the copying way a user would otherwise write: read_tensor_sync, queue.write_buffer to a
buffer of the device, map that buffer back, write_tensor.
"""

import numpy as np
import pytest
import wgpu

import mltensor
from mltensor import ml

from .timing import adapter_name, measure, record

U = wgpu.BufferUsage
MOVED = ("bytes_uploaded", "bytes_downloaded", "bytes_copied_between_devices")


@pytest.fixture(scope="module")
def devices():
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    return adapter.request_device_sync(label="bench-a"), adapter.request_device_sync(label="bench-b")


def _moved(ctx):
    c = ctx.counters
    return sum(c[k] for k in MOVED)


def _copying_way(ctx, t, device, nbytes):
    """The reference: round trip through host memory with the public API only."""
    dbuf = device.create_buffer(size=nbytes, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST)
    st = device.create_buffer(size=nbytes, usage=U.MAP_READ | U.COPY_DST)

    def cycle():
        device.queue.write_buffer(dbuf, 0, ctx.read_tensor_sync(t))
        enc = device.create_command_encoder()
        enc.copy_buffer_to_buffer(dbuf, 0, st, 0, nbytes)
        device.queue.submit([enc.finish()])
        st.map_sync(wgpu.MapMode.READ)
        ctx.write_tensor(t, st.read_mapped(copy=False))
        st.unmap()

    return cycle


@pytest.mark.parametrize("cross", [False, True], ids=["same-device", "cross-device"])
@pytest.mark.parametrize("n", [1024, 1 << 20], ids=["4KiB", "4MiB"])
def test_import_release_cycle(benchmark, devices, cross, n):
    dev_a, dev_b = devices
    ctx = ml.create_context_sync(dev_a)
    target = dev_b if cross else dev_a
    t = ctx.create_tensor_sync(data_type="float32", shape=[n], readable=True, writable=True, importable_to_webgpu=True)
    ctx.write_tensor(t, np.arange(n, dtype=np.float32))
    ctx.flush()

    def cycle():
        buf = mltensor.import_external_buffer_sync(target, t)
        buf.release()

    before = _moved(ctx)
    cycle()
    per_cycle = _moved(ctx) - before
    ours = measure(cycle, rounds=30, warmup=3)
    ref = measure(_copying_way(ctx, t, target, 4 * n), ctx.flush, rounds=10, warmup=2)
    before = _moved(ctx)
    _copying_way(ctx, t, target, 4 * n)()
    ref_moved = _moved(ctx) - before
    np.testing.assert_array_equal(ctx.read_tensor_sync(t), np.arange(n, dtype=np.float32))
    info = record(
        benchmark,
        ours,
        f"interop import+release ({'cross' if cross else 'same'} device)",
        ref=ref,
        ref_name="host round trip (read_tensor + write_buffer + map + write_tensor)",
        cycle_us=ours["total_s"] * 1e6,
        tensor_bytes=4 * n,
        bytes_moved_per_cycle=per_cycle,
        ref_bytes_moved_per_cycle=ref_moved + 2 * 4 * n,
        adapter=adapter_name(ctx),
    )
    print(
        f"\n[interop] {'cross' if cross else 'same'}-device {4 * n} B: cycle "
        f"{info['cycle_us']:.1f} us, {per_cycle} B moved/cycle (ML counters); host round trip "
        f"{ref['total_s'] * 1e6:.1f} us; ratio {info['ratio']:.1f}x"
    )
    if not cross:
        assert per_cycle == 0
    else:
        assert per_cycle == 2 * 4 * n
    ctx.destroy()
