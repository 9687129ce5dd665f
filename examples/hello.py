"""A small end-to-end tour: tensors, a graph, dispatch, readback."""

import numpy as np

import mltensor
from mltensor import ml

ctx = ml.create_context_sync()
b = mltensor.MLGraphBuilder(ctx)
x = b.input("x", data_type="float32", shape=[2, 3])
w = b.constant(np.array([0.5, -1.0, 2.0], dtype=np.float32))
y = b.relu(b.add(b.mul(x, w), b.constant(data_type="float32", value=1.0)))
graph = b.build_sync({"y": y})

tx = ctx.create_tensor_sync(data_type="float32", shape=[2, 3], writable=True)
ty = ctx.create_tensor_sync(data_type="float32", shape=[2, 3], readable=True)
ctx.write_tensor(tx, np.arange(6, dtype=np.float32).reshape(2, 3))
ctx.dispatch(graph, {"x": tx}, {"y": ty})
print("adapter:", ctx.device.adapter.info["device"])
print("kernels:", graph.kernel_names)
print("y =", ctx.read_tensor_sync(ty))
print("counters:", ctx.counters)
