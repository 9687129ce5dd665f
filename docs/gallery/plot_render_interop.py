"""
A render pass that draws an ML tensor, without a copy
=====================================================

WebNN computes, your WebGPU code draws: the context is created on your ``wgpu.GPUDevice``, a graph
writes its result into a tensor created with ``importable_to_webgpu=True``, and
``mltensor.import_external_buffer_sync`` lends that tensor to the device as a ``wgpu.GPUBuffer``.
A render pipeline binds it like any storage buffer: here its fragment shader lights up the edges
the graph found (a grayscale ``conv2d``, two Sobel filters and their magnitude) over a darkened
photo. No byte of the tensor goes through the host; ``ctx.counters`` shows it.
"""

import matplotlib.pyplot as plt
import numpy as np
import wgpu
from matplotlib import cbook
from PIL import Image

import mltensor
from mltensor import ml

with cbook.get_sample_data("grace_hopper.jpg") as f:
    photo = np.asarray(Image.open(f).convert("RGB"))  # uint8, H x W x 3
h, w, _ = photo.shape
assert (w * 4) % 256 == 0, w  # a texture copy's rows are multiples of 256 bytes

device = wgpu.gpu.request_adapter_sync().request_device_sync()
ctx = ml.create_context_sync(device)  # ML work and the render pass share the device and its queue

# %%
# The graph: edges of the photo, written into a tensor that can be lent.

b = mltensor.MLGraphBuilder(ctx)
x = b.input("image", data_type="float32", shape=[1, h, w, 3])  # NHWC
gray = b.conv2d(
    x,
    b.constant(np.array([0.299, 0.587, 0.114], np.float32).reshape(1, 1, 1, 3)),
    input_layout="nhwc",
    filter_layout="ohwi",
)
sobel = np.array([[[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], [[-1, -2, -1], [0, 0, 0], [1, 2, 1]]], np.float32)
g = b.conv2d(
    gray, b.constant(sobel.reshape(2, 3, 3, 1)), padding=[1, 1, 1, 1], input_layout="nhwc", filter_layout="ohwi"
)
gx, gy = b.split(g, 2, axis=3)
graph = b.build_sync({"edges": b.sqrt(b.add(b.mul(gx, gx), b.mul(gy, gy)))})

tx = ctx.create_tensor_sync(data_type="float32", shape=[1, h, w, 3], writable=True)
edges = ctx.create_tensor_sync(data_type="float32", shape=[1, h, w, 1], importable_to_webgpu=True)
ctx.write_tensor(tx, photo[None].astype(np.float32) / 255.0)
ctx.dispatch(graph, {"image": tx}, {"edges": edges})
before = dict(ctx.counters)

# %%
# The render pass: a full-screen triangle whose fragment shader reads the lent tensor (one f32
# per pixel) and the photo (an ordinary buffer of your own, rgba8 packed in u32).

SHADER = """
@group(0) @binding(0) var<storage, read> edges: array<f32>;
@group(0) @binding(1) var<storage, read> photo: array<u32>;
@group(0) @binding(2) var<uniform> size: vec4<u32>;

@vertex fn vs(@builtin(vertex_index) i: u32) -> @builtin(position) vec4<f32> {
    let p = vec2<f32>(f32((i << 1u) & 2u), f32(i & 2u));
    return vec4<f32>(p * 2.0 - 1.0, 0.0, 1.0);
}

@fragment fn fs(@builtin(position) pos: vec4<f32>) -> @location(0) vec4<f32> {
    let i = u32(pos.y) * size.x + u32(pos.x);
    let rgb = unpack4x8unorm(photo[i]).rgb;
    let e = clamp(edges[i] * 1.5, 0.0, 1.0);
    let dim = vec3<f32>(0.05, 0.05, 0.12) + rgb * 0.3;
    return vec4<f32>(mix(dim, vec3<f32>(0.2, 1.0, 0.85), e), 1.0);
}
"""
module = device.create_shader_module(code=SHADER)
pipeline = device.create_render_pipeline(
    layout="auto",
    vertex={"module": module, "entry_point": "vs"},
    primitive={"topology": wgpu.PrimitiveTopology.triangle_list},
    fragment={"module": module, "entry_point": "fs", "targets": [{"format": wgpu.TextureFormat.rgba8unorm}]},
)
rgba = np.concatenate([photo, np.full((h, w, 1), 255, np.uint8)], axis=2)
photo_buf = device.create_buffer_with_data(data=rgba.tobytes(), usage=wgpu.BufferUsage.STORAGE)
size_buf = device.create_buffer_with_data(
    data=np.array([w, h, 0, 0], np.uint32).tobytes(), usage=wgpu.BufferUsage.UNIFORM
)
target = device.create_texture(
    size=(w, h, 1),
    format=wgpu.TextureFormat.rgba8unorm,
    usage=wgpu.TextureUsage.RENDER_ATTACHMENT | wgpu.TextureUsage.COPY_SRC,
)
readback = device.create_buffer(size=w * h * 4, usage=wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.MAP_READ)

lent = mltensor.import_external_buffer_sync(device, edges)  # the tensor's own memory, as a GPUBuffer
bind_group = device.create_bind_group(
    layout=pipeline.get_bind_group_layout(0),
    entries=[
        {"binding": 0, "resource": {"buffer": lent}},
        {"binding": 1, "resource": {"buffer": photo_buf}},
        {"binding": 2, "resource": {"buffer": size_buf}},
    ],
)
encoder = device.create_command_encoder()
rp = encoder.begin_render_pass(
    color_attachments=[
        {"view": target.create_view(), "load_op": "clear", "store_op": "store", "clear_value": (0, 0, 0, 1)}
    ]
)
rp.set_pipeline(pipeline)
rp.set_bind_group(0, bind_group)
rp.draw(3)
rp.end()
encoder.copy_texture_to_buffer(
    {"texture": target}, {"buffer": readback, "bytes_per_row": w * 4, "rows_per_image": h}, (w, h, 1)
)
device.queue.submit([encoder.finish()])
lent.release()  # the tensor is WebNN's again

readback.map_sync(wgpu.MapMode.READ)
frame = np.frombuffer(readback.read_mapped(), np.uint8).reshape(h, w, 4).copy()
readback.unmap()

moved = {k: ctx.counters[k] - before[k] for k in ("bytes_downloaded", "bytes_copied_between_devices")}
print("ML bytes read back or copied while the render pass drew the tensor:", moved)
assert moved == {"bytes_downloaded": 0, "bytes_copied_between_devices": 0}, moved

# %%
# The photo, and the frame the render pass drew from the lent tensor.

fig, (a0, a1) = plt.subplots(1, 2, figsize=(9, 3.6))
a0.imshow(photo)
a0.set_title("input (written once with write_tensor)", fontsize=9)
a1.imshow(frame)
a1.set_title("render pass over the lent edge tensor", fontsize=9)
for a in (a0, a1):
    a.set_axis_off()
fig.tight_layout()
plt.show()
