"""
A convolution on the GPU: edge detection
========================================

A graph built with ``MLGraphBuilder``: a grayscale conversion (a 1x1 ``conv2d``), two Sobel
filters (a 3x3 ``conv2d`` with two output channels) and the gradient magnitude
(``sqrt(gx^2 + gy^2)``, elementwise operators the compiler fuses into one kernel). The photo
comes from matplotlib's sample data.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import cbook
from PIL import Image

import mltensor
from mltensor import ml

with cbook.get_sample_data("grace_hopper.jpg") as f:
    img = np.asarray(Image.open(f).convert("RGB"), dtype=np.float32) / 255.0  # H x W x 3
h, w, _ = img.shape

ctx = ml.create_context_sync()
b = mltensor.MLGraphBuilder(ctx)
x = b.input("image", data_type="float32", shape=[1, h, w, 3])  # NHWC
gray_w = b.constant(np.array([0.299, 0.587, 0.114], np.float32).reshape(1, 1, 1, 3))  # OHWI
gray = b.conv2d(x, gray_w, input_layout="nhwc", filter_layout="ohwi")
sobel = np.array([[[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], [[-1, -2, -1], [0, 0, 0], [1, 2, 1]]], np.float32).reshape(
    2, 3, 3, 1
)
g = b.conv2d(gray, b.constant(sobel), padding=[1, 1, 1, 1], input_layout="nhwc", filter_layout="ohwi")
gx, gy = b.split(g, 2, axis=3)
edges = b.sqrt(b.add(b.mul(gx, gx), b.mul(gy, gy)))
graph = b.build_sync({"edges": edges})
print("kernels:", graph.kernel_names)

tx = ctx.create_tensor_sync(data_type="float32", shape=[1, h, w, 3], writable=True)
ty = ctx.create_tensor_sync(data_type="float32", shape=[1, h, w, 1], readable=True)
ctx.write_tensor(tx, img[None])
ctx.dispatch(graph, {"image": tx}, {"edges": ty})
out = ctx.read_tensor_sync(ty)[0, :, :, 0]

# %%
# The input and the gradient magnitude computed on the GPU.

fig, (a0, a1) = plt.subplots(1, 2, figsize=(8, 4.6))
a0.imshow(img)
a0.set_title("input")
a1.imshow(out, cmap="magma", vmax=np.percentile(out, 99))
a1.set_title("|Sobel gradient| (mltensor)")
for a in (a0, a1):
    a.set_axis_off()
fig.tight_layout()
plt.show()
