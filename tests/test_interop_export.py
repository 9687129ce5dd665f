"""WebGPU interop as the WebNN interop specification writes it (webnn PR #942, Chromium):
create_exportable_tensor + export_to_gpu. While exported, WebNN use of the tensor fails at once
(unlike import_external_buffer, which holds it back: tests/test_interop.py)."""

import asyncio

import numpy as np
import pytest
import wgpu

import mltensor
from mltensor import InvalidStateError, ml

from test_interop import LENT_USAGE, N, add_one_graph, x0
from test_interop import dev, dev2, sctx  # noqa: F401  (fixtures: a device, another, a context on the first)


def exportable(ctx, device, n=N, **kw):
    kw.setdefault("readable", True)
    kw.setdefault("writable", True)
    return ctx.create_exportable_tensor_sync(data_type="float32", shape=[n], device=device, **kw)


@pytest.mark.parametrize(
    "data_type,shape,size", [("float32", [N], 4 * N), ("float16", [3], 8), ("int8", [5], 8), ("int64", [2, 3], 48)]
)
def test_exported_buffer_is_a_real_gpubuffer(dev, sctx, data_type, shape, size):
    t = sctx.create_exportable_tensor_sync(data_type=data_type, shape=shape, device=dev.device)
    assert not t.importable_to_webgpu and "exportable" in repr(t)
    buf = sctx.export_to_gpu_sync(t)
    assert isinstance(buf, wgpu.GPUBuffer)
    assert buf.usage == LENT_USAGE and buf.size == size
    assert "exported" in repr(t)
    buf.destroy()
    assert "exported" not in repr(t)


def test_same_device_round_trip_moves_no_bytes(dev, sctx):
    """The spec's flow on the context's own device: ML writes, the device's compute pass reads and
    writes the exported buffer, destroy() returns it, ML reads the device's writes. Zero-copy."""
    g = add_one_graph(sctx)
    xin = sctx.create_tensor_sync(data_type="float32", shape=[N], writable=True)
    t = exportable(sctx, dev.device)
    out = sctx.create_tensor_sync(data_type="float32", shape=[N], readable=True)
    sctx.write_tensor(xin, x0())
    sctx.dispatch(g, {"x": xin}, {"y": t})  # ML: x + 1
    before = sctx.counters
    buf = sctx.export_to_gpu_sync(t)
    dev.add_one(buf)  # WebGPU: x + 2
    np.testing.assert_array_equal(dev.read(buf), x0() + 2)
    buf.destroy()
    sctx.dispatch(g, {"x": t}, {"y": out})  # ML again: x + 3
    np.testing.assert_array_equal(sctx.read_tensor_sync(out), x0() + 3)
    np.testing.assert_array_equal(sctx.read_tensor_sync(t), x0() + 2)
    after = sctx.counters
    assert after["bytes_copied_between_devices"] == before["bytes_copied_between_devices"]
    assert after["bytes_uploaded"] == before["bytes_uploaded"]


def test_webnn_use_fails_at_once_while_exported(dev, sctx):
    """dispatch (as input or output), read_tensor (sync, async, BYOB), write_tensor and a second
    export fail with TypeError naming the call; other tensors' work is not held back."""
    g = add_one_graph(sctx)
    t = exportable(sctx, dev.device)
    other = sctx.create_tensor_sync(data_type="float32", shape=[N], readable=True, writable=True)
    out = sctx.create_tensor_sync(data_type="float32", shape=[N], readable=True)
    sctx.write_tensor(t, x0())
    sctx.dispatch(g, {"x": t}, {"y": out})  # validated (the fast path must not skip the check later)
    buf = sctx.export_to_gpu_sync(t)
    with pytest.raises(TypeError, match=r"\[dispatch\] input 'x' is exported to WebGPU"):
        sctx.dispatch(g, {"x": t}, {"y": out})
    with pytest.raises(TypeError, match=r"\[dispatch\] output 'y' is exported to WebGPU"):
        sctx.dispatch(g, {"x": other}, {"y": t})
    with pytest.raises(TypeError, match=r"\[read_tensor\] tensor is exported to WebGPU"):
        sctx.read_tensor_sync(t)
    with pytest.raises(TypeError, match=r"\[read_tensor\]"):
        sctx.read_tensor_sync(t, np.empty(N, np.float32))
    with pytest.raises(TypeError, match=r"\[read_tensor\]"):
        asyncio.run(sctx.read_tensor_async(t))
    with pytest.raises(TypeError, match=r"\[write_tensor\] tensor is exported to WebGPU"):
        sctx.write_tensor(t, x0())
    with pytest.raises(TypeError, match=r"\[export_to_gpu\] the tensor is already exported"):
        sctx.export_to_gpu_sync(t)
    sctx.write_tensor(other, x0())  # not held back by the export
    sctx.dispatch(g, {"x": other}, {"y": out})
    np.testing.assert_array_equal(sctx.read_tensor_sync(out), x0() + 1)
    dev.add_one(buf)
    buf.destroy()
    sctx.dispatch(g, {"x": t}, {"y": out})
    np.testing.assert_array_equal(sctx.read_tensor_sync(out), x0() + 2)


def test_cross_device_export_copies_and_counts(dev, dev2, sctx):
    """A tensor made for another device is exported by copy (after the ML work on it) and copied
    back at destroy() (after the device's work); the counters show both copies."""
    g = add_one_graph(sctx)
    t = exportable(sctx, dev2.device)
    out = sctx.create_tensor_sync(data_type="float32", shape=[N], readable=True)
    sctx.write_tensor(t, x0())
    c0 = sctx.counters["bytes_copied_between_devices"]
    buf = sctx.export_to_gpu_sync(t)
    assert buf.usage == LENT_USAGE and buf.size == 4 * N
    assert sctx.counters["bytes_copied_between_devices"] == c0 + 4 * N
    np.testing.assert_array_equal(dev2.read(buf), x0())
    dev2.add_one(buf)
    buf.destroy()
    assert sctx.counters["bytes_copied_between_devices"] == c0 + 8 * N
    sctx.dispatch(g, {"x": t}, {"y": out})
    np.testing.assert_array_equal(sctx.read_tensor_sync(out), x0() + 2)


async def test_async_forms(dev, dev2, sctx):
    t = await sctx.create_exportable_tensor_async(
        data_type="float32", shape=[N], device=dev2.device, readable=True, writable=True
    )
    sctx.write_tensor(t, x0())
    buf = await sctx.export_to_gpu_async(t)
    dev2.add_one(buf)
    buf.destroy()
    np.testing.assert_array_equal(await sctx.read_tensor_async(t), x0() + 1)


RENDER_WGSL = """
@group(0) @binding(0) var<storage, read> data: array<f32>;
@vertex fn vs(@builtin(vertex_index) i: u32) -> @builtin(position) vec4<f32> {
    let p = array(vec2<f32>(-1.0, -1.0), vec2<f32>(3.0, -1.0), vec2<f32>(-1.0, 3.0));
    return vec4<f32>(p[i], 0.0, 1.0);
}
@fragment fn fs() -> @location(0) vec4<f32> {
    return vec4<f32>(data[0], data[1], data[2], data[3]);
}
"""


def test_render_pass_reads_the_exported_buffer(dev, sctx):
    """The exported buffer bound in the device's own render pass (read in a fragment shader)."""
    t = exportable(sctx, dev.device, n=4)
    sctx.write_tensor(t, np.array([0.25, 0.5, 0.75, 1.0], np.float32))
    buf = sctx.export_to_gpu_sync(t)
    d = dev.device
    module = d.create_shader_module(code=RENDER_WGSL)
    pipe = d.create_render_pipeline(
        layout="auto",
        vertex={"module": module, "entry_point": "vs"},
        fragment={"module": module, "entry_point": "fs", "targets": [{"format": "rgba32float"}]},
        primitive={"topology": "triangle-list"},
    )
    tex = d.create_texture(
        size=(4, 4, 1), format="rgba32float", usage=wgpu.TextureUsage.RENDER_ATTACHMENT | wgpu.TextureUsage.COPY_SRC
    )
    bg = d.create_bind_group(
        layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
    )
    enc = d.create_command_encoder()
    rp = enc.begin_render_pass(
        color_attachments=[
            {"view": tex.create_view(), "load_op": "clear", "store_op": "store", "clear_value": (0, 0, 0, 0)}
        ]
    )
    rp.set_pipeline(pipe)
    rp.set_bind_group(0, bg)
    rp.draw(3)
    rp.end()
    d.queue.submit([enc.finish()])
    pixels = np.frombuffer(d.queue.read_texture({"texture": tex}, {"bytes_per_row": 4 * 16}, (4, 4, 1)), np.float32)
    buf.destroy()
    np.testing.assert_array_equal(pixels.reshape(16, 4)[5], [0.25, 0.5, 0.75, 1.0])


def test_destroy_tensor_while_exported(dev, sctx):
    """Destroying the tensor while exported is safe: the device keeps using the buffer until its
    destroy(); later WebNN use of the tensor raises InvalidStateError."""
    t = exportable(sctx, dev.device)
    sctx.write_tensor(t, x0())
    buf = sctx.export_to_gpu_sync(t)
    t.destroy()
    dev.add_one(buf)
    np.testing.assert_array_equal(dev.read(buf), x0() + 1)
    buf.destroy()
    with pytest.raises(InvalidStateError, match=r"\[read_tensor\] tensor is destroyed"):
        sctx.read_tensor_sync(t)
    with pytest.raises(InvalidStateError, match=r"\[export_to_gpu\] the tensor is destroyed"):
        sctx.export_to_gpu_sync(t)


def test_context_lost_while_exported(dev):
    ctx = ml.create_context_sync(dev.device)
    t = exportable(ctx, dev.device)
    ctx.write_tensor(t, x0())
    buf = ctx.export_to_gpu_sync(t)
    ctx.destroy()
    dev.add_one(buf)  # still usable by the device
    np.testing.assert_array_equal(dev.read(buf), x0() + 1)
    buf.destroy()
    with pytest.raises(InvalidStateError, match=r"\[export_to_gpu\] the context is lost"):
        ctx.export_to_gpu_sync(t)
    with pytest.raises(InvalidStateError, match=r"\[create_exportable_tensor\] the context is lost"):
        exportable(ctx, dev.device)


def test_wrong_arguments(dev, dev2, sctx):
    plain = sctx.create_tensor_sync(data_type="float32", shape=[4], readable=True)
    lendable = sctx.create_tensor_sync(data_type="float32", shape=[4], importable_to_webgpu=True)
    for t in (plain, lendable):
        with pytest.raises(
            TypeError, match=r"\[export_to_gpu\] the tensor was not created by create_exportable_tensor"
        ):
            sctx.export_to_gpu_sync(t)
    t = exportable(sctx, dev.device, n=4)
    with pytest.raises(TypeError, match=r"\[import_external_buffer\] .*importable_to_webgpu=True"):
        mltensor.import_external_buffer_sync(dev.device, t)  # the two forms do not mix
    other = ml.create_context_sync(dev.device)
    with pytest.raises(TypeError, match=r"\[export_to_gpu\] the tensor was not created by this context"):
        other.export_to_gpu_sync(t)
    other.destroy()
    with pytest.raises(TypeError, match=r"\[export_to_gpu\] tensor must be an MLTensor"):
        sctx.export_to_gpu_sync(np.zeros(4))
    with pytest.raises(TypeError, match=r"\[create_exportable_tensor\] device must be a wgpu.GPUDevice"):
        sctx.create_exportable_tensor_sync(data_type="float32", shape=[4], device="gpu")
    with pytest.raises(TypeError, match=r"\[create_exportable_tensor\] shape dimensions must be integers"):
        sctx.create_exportable_tensor_sync(
            data_type="float32", shape=[mltensor.MLDynamicDimension("n", 8)], device=dev.device
        )
    gone = wgpu.gpu.request_adapter_sync().request_device_sync()
    t2 = exportable(sctx, gone, n=4)
    gone.destroy()
    with pytest.raises(InvalidStateError, match=r"\[export_to_gpu\] the tensor's GPUDevice is destroyed"):
        sctx.export_to_gpu_sync(t2)
    with pytest.raises(InvalidStateError, match=r"\[create_exportable_tensor\] the GPUDevice is destroyed"):
        exportable(sctx, gone, n=4)


def test_import_and_export_side_by_side(dev, sctx):
    """The explainer's hold-back model and the specification's fail-fast model on one context:
    work on an imported tensor waits for its release; work on an exported one is refused."""
    g = add_one_graph(sctx)
    imp = sctx.create_tensor_sync(
        data_type="float32", shape=[N], readable=True, writable=True, importable_to_webgpu=True
    )
    exp = exportable(sctx, dev.device)
    out = sctx.create_tensor_sync(data_type="float32", shape=[N], readable=True)
    for t in (imp, exp):
        sctx.write_tensor(t, x0())
    b1 = mltensor.import_external_buffer_sync(dev.device, imp)
    b2 = sctx.export_to_gpu_sync(exp)
    sctx.dispatch(g, {"x": imp}, {"y": out})  # held back until the release
    with pytest.raises(TypeError):
        sctx.dispatch(g, {"x": exp}, {"y": out})  # refused
    dev.add_one(b1)
    dev.add_one(b2)
    b1.release()
    np.testing.assert_array_equal(sctx.read_tensor_sync(out), x0() + 2)  # the device's write, then ML's
    b2.destroy()
    np.testing.assert_array_equal(sctx.read_tensor_sync(exp), x0() + 1)


def test_spec_example_video_frame(dev):
    """The interop specification's example, transcribed: a context on the app's device, an
    exportable tensor filled by WebNN, rented to WebGPU for the app's own pass, returned, and
    used by WebNN again, every frame."""
    device = dev.device
    ml_context = ml.create_context_sync(device)
    b = mltensor.MLGraphBuilder(ml_context)
    frame = b.input("frame", data_type="float32", shape=[N])
    graph = b.build_sync({"mask": b.sigmoid(frame)})
    frame_tensor = ml_context.create_tensor_sync(data_type="float32", shape=[N], writable=True)
    mask_tensor = ml_context.create_exportable_tensor_sync(data_type="float32", shape=[N], device=device, readable=True)
    for k in range(3):
        pixels = np.linspace(-4, 4, N, dtype=np.float32) + k
        ml_context.write_tensor(frame_tensor, pixels)
        ml_context.dispatch(graph, {"frame": frame_tensor}, {"mask": mask_tensor})
        gpu_buffer = ml_context.export_to_gpu_sync(mask_tensor)
        dev.add_one(gpu_buffer)  # the app's own WebGPU pass on the mask
        seen = dev.read(gpu_buffer)
        gpu_buffer.destroy()  # WebNN may use mask_tensor again
        want = 1 / (1 + np.exp(-pixels.astype(np.float64))) + 1
        np.testing.assert_allclose(seen, want, rtol=1e-5)
        np.testing.assert_allclose(ml_context.read_tensor_sync(mask_tensor), want, rtol=1e-5)
    ml_context.destroy()


def test_export_races_webnn_use_from_threads(dev, sctx):
    """Threads: one rents and returns the tensor in a loop while another dispatches on it and a
    third exports it too. Every call either works or raises the fail-fast TypeError, never
    another error, and the device's writes and ML's reads stay in order."""
    import threading

    g = add_one_graph(sctx)
    t = exportable(sctx, dev.device)
    out = sctx.create_tensor_sync(data_type="float32", shape=[N], readable=True)
    sctx.write_tensor(t, np.zeros(N, np.float32))
    rounds, errors, refused, ran = 30, [], [0, 0], [0]

    def renter():
        done = 0
        while done < rounds:
            try:
                buf = sctx.export_to_gpu_sync(t)
            except TypeError:  # the other exporter holds it
                continue
            dev.add_one(buf)
            buf.destroy()
            done += 1

    def dispatcher():
        for _ in range(rounds):
            try:
                sctx.dispatch(g, {"x": t}, {"y": out})
                ran[0] += 1
            except TypeError as e:
                assert "exported to WebGPU" in str(e)
                refused[0] += 1

    def exporter():
        for _ in range(rounds):
            try:
                buf = sctx.export_to_gpu_sync(t)
            except TypeError as e:
                assert "already exported" in str(e)
                refused[1] += 1
                continue
            buf.destroy()  # returned unchanged

    def guard(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        return run

    threads = [threading.Thread(target=guard(f)) for f in (renter, dispatcher, exporter)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors
    assert ran[0] + refused[0] == rounds
    # The renter's device added one each round, in order, and nothing else wrote t.
    np.testing.assert_array_equal(sctx.read_tensor_sync(t), np.full(N, rounds, np.float32))
