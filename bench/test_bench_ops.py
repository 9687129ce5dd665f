"""Compute-heavy operators: matmul and conv2d throughput (GFLOP/s).

References in the same run: numpy (BLAS) and a one-thread-per-output naive WGSL matmul written
here with raw wgpu-py (what the tiled kernel must beat by design), onnxruntime's CPU Conv for the
convolutions. Each GPU measurement waits for completion inside the timed region (a read of a
one-element tensor queued after the work).
"""

import numpy as np
import pytest
import wgpu

import mltensor

from .timing import measure, record

N = 1024  # matmul M = K = N


def _probe(ctx):
    return ctx.create_tensor_sync(data_type="float32", shape=[1], readable=True)


NAIVE_WGSL = """
@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@compute @workgroup_size(8, 8)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.y;
    let col = gid.x;
    if (row >= {n}u || col >= {n}u) { return; }
    var s = 0.0;
    for (var k = 0u; k < {n}u; k = k + 1u) { s = s + a[row * {n}u + k] * b[k * {n}u + col]; }
    c[row * {n}u + col] = s;
}
"""


def _naive_matmul(dev, A, B):
    """(enqueue, wait, result) for the naive kernel on raw wgpu-py buffers."""
    n = A.shape[0]
    U = wgpu.BufferUsage
    ba = dev.create_buffer_with_data(data=A, usage=U.STORAGE)
    bb = dev.create_buffer_with_data(data=B, usage=U.STORAGE)
    bc = dev.create_buffer(size=A.nbytes, usage=U.STORAGE | U.COPY_SRC)
    probe = dev.create_buffer(size=4, usage=U.STORAGE | U.COPY_SRC)
    module = dev.create_shader_module(code=NAIVE_WGSL.replace("{n}", str(n)))
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    bg = dev.create_bind_group(
        layout=pipe.get_bind_group_layout(0),
        entries=[{"binding": i, "resource": {"buffer": x}} for i, x in enumerate((ba, bb, bc))],
    )

    def enqueue():
        enc = dev.create_command_encoder()
        p = enc.begin_compute_pass()
        p.set_pipeline(pipe)
        p.set_bind_group(0, bg)
        p.dispatch_workgroups(-(-n // 8), -(-n // 8), 1)
        p.end()
        dev.queue.submit([enc.finish()])

    def wait():
        dev.queue.read_buffer(probe, 0, 4)

    def result():
        return np.frombuffer(dev.queue.read_buffer(bc), np.float32).reshape(n, n)

    return enqueue, wait, result


def test_matmul_1024(benchmark, ctx):
    """1024^3 float32 matmul: ours (tiled, register-blocked) vs numpy and vs a naive WGSL kernel."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((N, N)).astype(np.float32)
    B = rng.standard_normal((N, N)).astype(np.float32)
    flops = 2.0 * N**3

    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("a", data_type="float32", shape=[N, N])
    g = b.build_sync({"y": b.matmul(x, b.constant(B))})
    ta = ctx.create_tensor_sync(data_type="float32", shape=[N, N], writable=True)
    ty = ctx.create_tensor_sync(data_type="float32", shape=[N, N], readable=True)
    ctx.write_tensor(ta, A)
    probe = _probe(ctx)

    ctx.dispatch(g, {"a": ta}, {"y": ty})
    ours_out = ctx.read_tensor_sync(ty)
    ref = A @ B
    np.testing.assert_allclose(ours_out, ref, rtol=1e-3, atol=1e-3)

    m_ours = measure(
        lambda: ctx.dispatch(g, {"a": ta}, {"y": ty}), lambda: ctx.read_tensor_sync(probe), rounds=3, warmup=1
    )
    m_np = measure(lambda: A @ B, rounds=3, warmup=1)
    enq, wait, result = _naive_matmul(ctx.device, A, B)
    enq()
    wait()
    np.testing.assert_allclose(result(), ref, rtol=1e-3, atol=1e-3)
    m_naive = measure(enq, wait, rounds=1, warmup=0)

    ours_rate = flops / m_ours["total_s"] / 1e9
    naive_rate = flops / m_naive["total_s"] / 1e9
    np_rate = flops / m_np["total_s"] / 1e9
    record(
        benchmark,
        m_ours,
        "matmul 1024",
        m_np,
        "numpy",
        unit="GFLOP/s",
        work=flops,
        naive_total_s=m_naive["total_s"],
        naive_rate=naive_rate,
        speedup_vs_naive=m_naive["total_s"] / m_ours["total_s"],
        kernels=g.kernel_names,
    )
    print(
        f"\nmatmul {N}^3 f32: ours {ours_rate:.2f} GFLOP/s, naive WGSL {naive_rate:.2f} GFLOP/s "
        f"({m_naive['total_s'] / m_ours['total_s']:.1f}x), numpy {np_rate:.2f} GFLOP/s "
        f"({g.kernel_names[0]})"
    )


def _ort_conv(x_nchw, w_oihw, pads, strides, groups):
    """onnxruntime CPU Conv on the same data (NCHW), or None when onnxruntime is missing."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:  # pragma: no cover
        return None
    node = helper.make_node(
        "Conv", ["x", "w"], ["y"], pads=[pads[0], pads[2], pads[1], pads[3]], strides=strides, group=groups
    )
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_nchw.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w_oihw, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = min(model.ir_version, 9)
    opts = ort.SessionOptions()
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    _ = onnx
    return lambda: sess.run(None, {"x": x_nchw})[0]


@pytest.mark.parametrize(
    "kind,c_in,c_out,hw,groups",
    [
        ("3x3", 64, 64, 56, 1),  # a ResNet/MobileNet-stem-sized 3x3 layer
        ("depthwise3x3", 144, 144, 56, 144),  # a MobileNetV2 depthwise layer
    ],
)
def test_conv2d_nhwc(benchmark, ctx, kind, c_in, c_out, hw, groups):
    """NHWC conv (OHWI / IHWO filters, the TFLite layouts), stride 1, same padding, vs onnxruntime."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1, c_in, hw, hw)).astype(np.float32)
    W = (rng.standard_normal((c_out, c_in // groups, 3, 3)) * 0.1).astype(np.float32)
    flops = 2.0 * hw * hw * c_out * (c_in // groups) * 9
    dw = groups > 1
    Wl = np.ascontiguousarray(W.transpose((1, 2, 3, 0) if dw else (0, 2, 3, 1)))
    Xl = np.ascontiguousarray(X.transpose(0, 2, 3, 1))

    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(Xl.shape))
    y = b.conv2d(
        x,
        b.constant(Wl),
        padding=[1, 1, 1, 1],
        groups=groups,
        input_layout="nhwc",
        filter_layout="ihwo" if dw else "ohwi",
    )
    g = b.build_sync({"y": y})
    tx = ctx.create_tensor_sync(data_type="float32", shape=list(Xl.shape), writable=True)
    ty = ctx.create_tensor_sync(data_type="float32", shape=list(y.shape), readable=True)
    ctx.write_tensor(tx, Xl)
    probe = _probe(ctx)
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    got = ctx.read_tensor_sync(ty).transpose(0, 3, 1, 2)

    ort_run = _ort_conv(X, W, [1, 1, 1, 1], [1, 1], groups)
    m_ours = measure(
        lambda: ctx.dispatch(g, {"x": tx}, {"y": ty}), lambda: ctx.read_tensor_sync(probe), rounds=5, warmup=1
    )
    m_ref = None
    if ort_run is not None:
        np.testing.assert_allclose(got, ort_run(), rtol=1e-3, atol=1e-3)
        m_ref = measure(ort_run, rounds=5, warmup=1)
    info = record(
        benchmark,
        m_ours,
        f"conv2d nhwc {kind}",
        m_ref,
        "onnxruntime CPU",
        unit="GFLOP/s",
        work=flops,
        kernels=g.kernel_names,
    )
    ref_txt = f", onnxruntime {info['ref_rate']:.2f} GFLOP/s" if m_ref else ""
    print(
        f"\nconv2d {kind} 1x{hw}x{hw}x{c_in}->{c_out}: ours {info['ours_rate']:.2f} GFLOP/s"
        f"{ref_txt} ({g.kernel_names[0]})"
    )
