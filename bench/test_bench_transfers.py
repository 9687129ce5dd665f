"""Transfers: write and read throughput of a 64 MiB tensor, against wgpu-py's
queue.write_buffer / queue.read_buffer and a numpy copy of the same bytes, in the same run."""

import numpy as np
import pytest

from .timing import measure, record

N_BYTES = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def big(ctx):
    n = N_BYTES // 4
    t = ctx.create_tensor_sync(data_type="float32", shape=[n], readable=True, writable=True)
    data = np.random.default_rng(0).random(n, dtype=np.float32)
    ctx.write_tensor(t, data)
    assert ctx.read_tensor_sync(t).tobytes() == data.tobytes()
    yield t, data
    t.destroy()


def test_read_64mib(benchmark, ctx, big):
    t, data = big
    ours = measure(lambda: ctx.read_tensor_sync(t), rounds=8)
    ref = measure(lambda: ctx.device.queue.read_buffer(t._buffer), rounds=8)
    npc = measure(lambda: data.copy(), rounds=8)
    info = record(
        benchmark,
        ours,
        "transfers",
        ref,
        "queue.read_buffer",
        unit="GB/s",
        work=N_BYTES,
        numpy_copy_rate=N_BYTES / npc["total_s"] / 1e9,
    )
    print(
        f"\nread 64 MiB: ours {info['ours_rate']:.2f} GB/s, queue.read_buffer {info['ref_rate']:.2f} GB/s "
        f"(x{info['ratio']:.2f}), numpy copy {info['numpy_copy_rate']:.2f} GB/s"
    )


def test_read_64mib_byob(benchmark, ctx, big):
    t, data = big
    out = np.empty_like(data)
    ours = measure(lambda: ctx.read_tensor_sync(t, out), rounds=8)
    ref = measure(lambda: ctx.device.queue.read_buffer(t._buffer), rounds=8)
    info = record(benchmark, ours, "transfers", ref, "queue.read_buffer", unit="GB/s", work=N_BYTES)
    print(f"\nread 64 MiB into a given buffer: ours {info['ours_rate']:.2f} GB/s (x{info['ratio']:.2f})")


def test_write_64mib(benchmark, ctx, big):
    t, data = big
    # A write is complete once a following read of a tiny tensor (same queue) has resolved.
    probe = ctx.create_tensor_sync(data_type="float32", shape=[1], readable=True)

    def wait():
        ctx.read_tensor_sync(probe)

    ours = measure(lambda: ctx.write_tensor(t, data), wait, rounds=8)
    ref = measure(lambda: ctx.device.queue.write_buffer(t._buffer, 0, data), wait, rounds=8)
    npc = measure(lambda: data.copy(), rounds=8)
    info = record(
        benchmark,
        ours,
        "transfers",
        ref,
        "queue.write_buffer",
        unit="GB/s",
        work=N_BYTES,
        numpy_copy_rate=N_BYTES / npc["total_s"] / 1e9,
    )
    print(
        f"\nwrite 64 MiB: ours {info['ours_rate']:.2f} GB/s, queue.write_buffer {info['ref_rate']:.2f} GB/s "
        f"(x{info['ratio']:.2f}), numpy copy {info['numpy_copy_rate']:.2f} GB/s"
    )
