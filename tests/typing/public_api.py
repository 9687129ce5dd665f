"""A user's program, type-checked with mypy --strict by tests/test_types.py (never run): every
call here must be known to the checker with its parameter and return types (py.typed, the
annotations of the public API, mltensor/front/_builder_ops.pyi). Not a test module (no test_)."""

import numpy as np

import mltensor
from mltensor import MLGraph, MLGraphBuilder, MLOperand, MLTensor, ml


def build(ctx: mltensor.MLContext) -> MLGraph:
    b = MLGraphBuilder(ctx)
    x: MLOperand = b.input("x", data_type="float32", shape=[1, 3, 8, 8])
    w = b.constant(np.zeros((4, 3, 3, 3), np.float32))
    y = b.conv2d(x, w, padding=[1, 1, 1, 1], strides=[1, 1], label="conv")
    y = b.relu(y)
    m = b.matmul(a=b.reshape(y, [4, 64]), b=b.constant(np.zeros((64, 2), np.float32)))
    g = b.gemm(m, b.constant(np.zeros((2, 2), np.float32)), c=None, alpha=0.5)
    parts: list[MLOperand] = b.split(g, 2, axis=1)
    z = b.add(parts[0], parts[1])
    return b.build_sync({"y": y, "z": z})


def run() -> None:
    ctx = ml.create_context_sync(power_preference="high-performance")
    graph = build(ctx)
    tx: MLTensor = ctx.create_tensor_sync(data_type="float32", shape=[1, 3, 8, 8], writable=True)
    ty = ctx.create_tensor_sync(data_type="float32", shape=[1, 4, 8, 8], readable=True)
    tz = ctx.create_tensor_sync(data_type="float32", shape=[4, 1], readable=True)
    ctx.write_tensor(tx, np.ones((1, 3, 8, 8), np.float32))
    ctx.dispatch(graph, {"x": tx}, {"y": ty, "z": tz})
    out = ctx.read_tensor_sync(ty)
    assert out is not None
    ctx.destroy()


async def run_async() -> None:
    ctx = await ml.create_context_async()
    t = await ctx.create_tensor_async(data_type="float32", shape=[2], readable=True)
    arr = await ctx.read_tensor_async(t)
    assert arr is not None
