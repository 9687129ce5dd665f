"""Dispatch overhead, chained inference, buffer reuse and elementwise bandwidth.

References in the same run: a hand-written minimal wgpu-py dispatch loop (the floor for any
Python runtime on wgpu), the copy-per-call way of running graphs, and a device buffer copy.
"""

import numpy as np
import wgpu

import mltensor

from .timing import measure, record


def _tensor(ctx, shape, dt="float32", **kw):
    return ctx.create_tensor_sync(data_type=dt, shape=list(shape), **kw)


def _add_one_graph(ctx, shape):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(shape))
    return b.build_sync({"y": b.add(x, b.constant(data_type="float32", value=1.0))})


RAW_WGSL = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&y)) { y[g.x] = x[g.x] + 1.0; }
}
"""


def _raw_kernel(dev):
    bx = dev.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE)
    by = dev.create_buffer(size=256, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    pipe = dev.create_compute_pipeline(
        layout="auto", compute={"module": dev.create_shader_module(code=RAW_WGSL), "entry_point": "main"}
    )
    bg = dev.create_bind_group(
        layout=pipe.get_bind_group_layout(0),
        entries=[{"binding": 0, "resource": {"buffer": bx}}, {"binding": 1, "resource": {"buffer": by}}],
    )
    return pipe, bg, by


def _raw_loop(dev, n):
    """(enqueue, wait) of the reference: n dispatches of one tiny kernel recorded with wgpu-py's
    wrappers into one pass, waited on with a 4-byte read."""
    pipe, bg, by = _raw_kernel(dev)

    def raw():
        enc = dev.create_command_encoder()
        p = enc.begin_compute_pass()
        for _ in range(n):
            p.set_pipeline(pipe)
            p.set_bind_group(0, bg)
            p.dispatch_workgroups(1)
        p.end()
        dev.queue.submit([enc.finish()])

    return raw, lambda: dev.queue.read_buffer(by, 0, 4)


def test_dispatch_overhead(benchmark, ctx):
    """Microseconds per ctx.dispatch of a one-kernel graph, vs a minimal raw wgpu-py loop doing
    the same kernel (set_pipeline, set_bind_group, dispatch_workgroups, one submit per batch)."""
    n_calls = 200
    g = _add_one_graph(ctx, [64])
    a, c = _tensor(ctx, [64], writable=True), _tensor(ctx, [64], readable=True)
    probe = _tensor(ctx, [1], readable=True)

    def ours():
        for _ in range(n_calls):
            ctx.dispatch(g, {"x": a}, {"y": c})

    def wait():
        ctx.read_tensor_sync(probe)

    m_ours = measure(ours, wait, rounds=5)

    m_raw = measure(*_raw_loop(ctx.device, n_calls), rounds=5)
    info = record(
        benchmark,
        m_ours,
        "dispatch overhead",
        m_raw,
        "raw wgpu-py loop",
        us_per_dispatch=m_ours["enqueue_s"] / n_calls * 1e6,
        raw_us_per_dispatch=m_raw["enqueue_s"] / n_calls * 1e6,
    )
    print(
        f"\ndispatch: {info['us_per_dispatch']:.1f} us/call enqueue (raw wgpu loop {info['raw_us_per_dispatch']:.1f} us)"
    )


def test_200_kernel_graph(benchmark, ctx):
    """Per-kernel cost inside one dispatch of a 200-kernel graph (fusion defeated on purpose by
    alternating a reduction-free non-elementwise op is not needed: each add gets its own output
    shape class via reshape so chains do not fuse)."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[8, 8])
    y = x
    one = b.constant(data_type="float32", value=1.0)
    for i in range(200):
        # reshape between adds: [8,8] <-> [64] breaks elementwise fusion (different shapes)
        y = b.reshape(b.add(y, one), [64] if i % 2 == 0 else [8, 8])
    g = b.build_sync({"y": y})
    n_kernels = len(g.kernel_names)
    a = _tensor(ctx, [8, 8], writable=True)
    out = _tensor(ctx, list(g.output_descriptors["y"][1]), readable=True)
    m = measure(lambda: ctx.dispatch(g, {"x": a}, {"y": out}), lambda: ctx.read_tensor_sync(out), rounds=5)
    info = record(
        benchmark,
        m,
        "dispatch overhead",
        kernels=n_kernels,
        us_per_kernel_enqueue=m["enqueue_s"] / n_kernels * 1e6,
        us_per_kernel_total=m["total_s"] / n_kernels * 1e6,
    )
    assert np.allclose(ctx.read_tensor_sync(out).reshape(-1)[:3], [200.0] * 3)
    print(
        f"\n{n_kernels}-kernel graph: {info['us_per_kernel_enqueue']:.2f} us/kernel enqueue, "
        f"{info['us_per_kernel_total']:.2f} us/kernel total"
    )


def test_chained_inference_fibonacci(benchmark, ctx):
    """The explainer's Fibonacci: out = a + b, then (b, out) feed the next dispatch; N dispatches
    with no reads in between, against the same with a readback and re-upload per step."""
    n = 64
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("a", data_type="float32", shape=[256])
    y = b.input("b", data_type="float32", shape=[256])
    g = b.build_sync({"out": b.add(x, y)})
    ts = [_tensor(ctx, [256], readable=True, writable=True) for _ in range(3)]
    init = np.ones(256, np.float32)

    def chained():
        ctx.write_tensor(ts[0], init)
        ctx.write_tensor(ts[1], init)
        p, q, r = ts
        for _ in range(n):
            ctx.dispatch(g, {"a": p, "b": q}, {"out": r})
            p, q, r = q, r, p
        return q

    last = {}

    def wait():
        last["v"] = ctx.read_tensor_sync(ts[(n + 1) % 3])

    m_ours = measure(chained, wait, rounds=3)

    def copying():
        a, bb = init.copy(), init.copy()
        for _ in range(n):
            ctx.write_tensor(ts[0], a)
            ctx.write_tensor(ts[1], bb)
            ctx.dispatch(g, {"a": ts[0], "b": ts[1]}, {"out": ts[2]})
            a, bb = bb, ctx.read_tensor_sync(ts[2])

    m_copy = measure(copying, rounds=3)
    fib = [1.0, 1.0]
    for _ in range(n):
        fib.append(np.float32(fib[-1]) + np.float32(fib[-2]))
    np.testing.assert_allclose(last["v"][0], fib[-1], rtol=1e-6)
    info = record(benchmark, m_ours, "chained inference", m_copy, "read + re-upload per step", steps=n)
    print(
        f"\nfibonacci x{n}: chained {m_ours['total_s'] * 1e3:.1f} ms vs copying {m_copy['total_s'] * 1e3:.1f} ms (x{info['ratio']:.2f})"
    )


def test_buffer_reuse_three_graphs(benchmark, ctx):
    """Three graphs on one input: with MLTensors the input is uploaded once; the copy-per-call
    way uploads it for every graph (and reads every result back)."""
    shape = [1, 64, 64, 16]
    graphs = []
    for op in ("relu", "sigmoid", "tanh"):
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=shape)
        graphs.append(b.build_sync({"y": getattr(b, op)(x)}))
    data = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    tin = _tensor(ctx, shape, writable=True)
    outs = [_tensor(ctx, shape, readable=True) for _ in graphs]

    def ours():
        ctx.write_tensor(tin, data)
        for g, o in zip(graphs, outs):
            ctx.dispatch(g, {"x": tin}, {"y": o})

    def wait():
        ctx.read_tensor_sync(outs[-1])

    before = ctx.counters["bytes_uploaded"]
    m_ours = measure(ours, wait, rounds=7, warmup=1)
    up_ours = (ctx.counters["bytes_uploaded"] - before) / (m_ours["rounds"] + 1)  # + the warm-up run

    def copying():
        for g, o in zip(graphs, outs):
            ctx.write_tensor(tin, data)
            ctx.dispatch(g, {"x": tin}, {"y": o})
            ctx.read_tensor_sync(o)

    before = ctx.counters["bytes_uploaded"]
    m_copy = measure(copying, rounds=7, warmup=1)
    up_copy = (ctx.counters["bytes_uploaded"] - before) / (m_copy["rounds"] + 1)
    assert up_copy == 3 * up_ours
    info = record(
        benchmark, m_ours, "buffer reuse", m_copy, "upload per call", bytes_uploaded=up_ours, ref_bytes_uploaded=up_copy
    )
    print(
        f"\nthree graphs, one input: {up_ours / 2**20:.2f} MiB uploaded vs {up_copy / 2**20:.2f} MiB copy-per-call (x{info['ratio']:.2f} time)"
    )


def test_elementwise_chain_bandwidth(benchmark, ctx):
    """GB/s of a fused 5-op elementwise chain (one read + one write per element) vs a device
    buffer-to-buffer copy of the same bytes."""
    n = 4 * 1024 * 1024
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[n])
    y = b.sigmoid(
        b.mul(b.relu(b.add(x, b.constant(data_type="float32", value=0.5))), b.constant(data_type="float32", value=2.0))
    )
    y = b.clamp(y, min_value=0.1, max_value=0.9)
    g = b.build_sync({"y": y})
    assert len(g.kernel_names) == 1, g.kernel_names
    a = _tensor(ctx, [n], writable=True)
    o = _tensor(ctx, [n], readable=True)
    probe = _tensor(ctx, [1], readable=True)
    m_ours = measure(lambda: ctx.dispatch(g, {"x": a}, {"y": o}), lambda: ctx.read_tensor_sync(probe), rounds=5)
    dev = ctx.device
    src = dev.create_buffer(size=4 * n, usage=wgpu.BufferUsage.COPY_SRC)
    dst = dev.create_buffer(size=4 * n, usage=wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC)

    def copy():
        enc = dev.create_command_encoder()
        enc.copy_buffer_to_buffer(src, 0, dst, 0, 4 * n)
        dev.queue.submit([enc.finish()])

    m_copy = measure(copy, lambda: dev.queue.read_buffer(dst, 0, 4), rounds=5)
    info = record(benchmark, m_ours, "operators", m_copy, "device buffer copy", unit="GB/s", work=8 * n)
    print(f"\nelementwise chain: {info['ours_rate']:.2f} GB/s vs buffer copy {info['ref_rate']:.2f} GB/s")
