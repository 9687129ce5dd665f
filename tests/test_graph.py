"""MLGraphBuilder, build, MLGraph and dispatch: validation, state, binding and the compiler."""

import asyncio

import numpy as np
import pytest
from helpers import FUSION

import mltensor
from mltensor import MLGraphBuilder


def _t(ctx, shape, dt="float32", **kw):
    kw.setdefault("readable", True)
    kw.setdefault("writable", True)
    return ctx.create_tensor_sync(data_type=dt, shape=list(shape), **kw)


def _add_one(ctx, shape=(4,), dt="float32"):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type=dt, shape=list(shape))
    return b.build_sync({"y": b.add(x, b.constant(data_type=dt, value=1))})


# -- builder ------------------------------------------------------------------------------------


def test_input_and_operand_attributes(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type=np.float16, shape=[1, 3])
    assert x.data_type == "float16" and x.shape == (1, 3)
    with pytest.raises(TypeError, match="already exists"):
        b.input("x", data_type="float32", shape=[1])
    with pytest.raises(TypeError, match="non-empty"):
        b.input("", data_type="float32", shape=[1])
    with pytest.raises(TypeError):
        b.input("y", data_type="float32", shape=[0])
    with pytest.raises(TypeError):
        MLGraphBuilder("not a context")


def test_constant_forms(ctx):
    b = MLGraphBuilder(ctx)
    a = b.constant(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert (a.data_type, a.shape) == ("int32", (2, 3))
    c = b.constant(data_type="float32", shape=[2], data=np.array([1, 2], np.float32))
    assert c.shape == (2,)
    s = b.constant(data_type="float32", value=0.5)
    assert s.shape == ()
    ct = ctx.create_constant_tensor_sync(data_type="float32", shape=[2], data=np.array([3, 4], np.float32))
    k = b.constant(ct)
    assert k.shape == (2,)
    with pytest.raises(TypeError, match="bytes"):
        b.constant(data_type="float32", shape=[3], data=np.zeros(2, np.float32))
    with pytest.raises(TypeError):
        b.constant(np.zeros(2, np.float64))
    with pytest.raises(TypeError, match="create_constant_tensor"):
        b.constant(_t(ctx, [2]))
    x = b.input("x", data_type="float32", shape=[2])
    y = b.add(b.add(b.add(x, c), k), s)
    out = _run(ctx, b, {"y": y}, {"x": np.array([10, 20], np.float32)})
    assert out["y"].tolist() == [14.5, 26.5]


def test_constant_bytes_copied_at_call(ctx):
    b = MLGraphBuilder(ctx)
    data = np.array([1, 2], np.float32)
    c = b.constant(data_type="float32", shape=[2], data=data)
    data[:] = 7
    x = b.input("x", data_type="float32", shape=[2])
    assert _run(ctx, b, {"y": b.add(x, c)}, {"x": np.zeros(2, np.float32)})["y"].tolist() == [1, 2]


def test_operand_from_another_builder(ctx):
    b1, b2 = MLGraphBuilder(ctx), MLGraphBuilder(ctx)
    x1 = b1.input("x", data_type="float32", shape=[2])
    x2 = b2.input("x", data_type="float32", shape=[2])
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        b2.add(x1, x2)
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        b2.build_sync({"y": b1.relu(x1)})


def test_build_rejections_keep_builder_usable(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2])
    c = b.constant(data_type="float32", value=1.0)
    for bad in ({}, {"": b.relu(x)}, {"y": x}, {"y": c}, {"y": "operand"}, [x]):
        with pytest.raises(TypeError):
            b.build_sync(bad)
    g = b.build_sync({"y": b.relu(x)})
    assert g.output_descriptors == {"y": ("float32", (2,))}
    assert g.input_descriptors == {"x": ("float32", (2,))}


def test_second_build_and_methods_after_build(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2])
    b.build_sync({"y": b.relu(x)})
    with pytest.raises(mltensor.InvalidStateError):
        b.build_sync({"z": x})
    with pytest.raises(mltensor.InvalidStateError):
        b.relu(x)
    with pytest.raises(mltensor.InvalidStateError):
        b.input("z", data_type="float32", shape=[1])
    with pytest.raises(mltensor.InvalidStateError):
        b.constant(data_type="float32", value=1.0)


async def test_build_async(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3])
    g = await b.build_async({"y": b.neg(x)})
    assert isinstance(g, mltensor.MLGraph)


def test_unused_inputs_and_dead_nodes(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4])
    b.input("unused", data_type="float32", shape=[4])
    b.exp(b.sin(x))  # dead
    g = b.build_sync({"y": b.relu(x)})
    assert g.kernel_names == [n for n in g.kernel_names if "sin" not in n and "exp" not in n]
    assert len(g.kernel_names) == 1
    assert set(g.input_descriptors) == {"x", "unused"}


# -- compiler -------------------------------------------------------------------------------------


def test_elementwise_chain_fuses_into_one_kernel(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, 5])
    bias = b.constant(np.linspace(-1, 1, 5).astype(np.float32))
    y = b.tanh(b.mul(b.add(x, bias), b.constant(data_type="float32", value=2.0)))
    g = b.build_sync({"y": y})
    assert not FUSION or (len(g.kernel_names) == 1 and g.kernel_names[0].startswith("ew_add_mul_tanh")), g.kernel_names
    data = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    out = _dispatch(ctx, g, {"x": data})["y"]
    np.testing.assert_allclose(out, np.tanh((data + np.linspace(-1, 1, 5)) * 2), rtol=1e-5, atol=1e-6)


def test_constant_subgraph_is_folded_at_build(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4])
    c = b.constant(np.array([1, 4, 9, 16], np.float32))
    folded = b.mul(b.sqrt(c), b.constant(data_type="float32", value=3.0))
    g = b.build_sync({"y": b.add(x, folded)})
    assert len(g.kernel_names) == 1  # sqrt*3 ran once at build
    before = ctx.counters["kernel_launches"]
    out = _dispatch(ctx, g, {"x": np.zeros(4, np.float32)})["y"]
    assert out.tolist() == [3, 6, 9, 12]
    assert ctx.counters["kernel_launches"] - before == 1


def test_folding_keeps_only_what_dispatch_reads(ctx, rng):
    # int8 weights dequantized at build: the graph keeps the float32 result, not the (unpacked)
    # int8 constant or the folded intermediates, and the result stays right after a collection
    import gc

    w = rng.integers(-128, 128, size=(64, 64), dtype=np.int8)
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[64, 64])
    scale, zp = b.constant(np.full((1, 1), 0.5, np.float32)), b.constant(np.zeros((1, 1), np.int8))
    wf = b.transpose(b.dequantize_linear(b.constant(w), scale, zp))
    g = b.build_sync({"y": b.add(x, wf)})
    kept = sum(buf.size for buf in g._buffers if "pool" not in buf.label)
    assert kept == 64 * 64 * 4, [(buf.label, buf.size) for buf in g._buffers]
    gc.collect()
    for _ in range(2):
        out = _dispatch(ctx, g, {"x": np.ones((64, 64), np.float32)})["y"]
        np.testing.assert_array_equal(out, 1 + 0.5 * w.T.astype(np.float32))


def test_intermediates_share_pooled_buffers(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1024])
    y = x
    for i in range(12):
        # a reshape round trip between ops keeps them from fusing, so each is its own kernel
        y = b.reshape(b.exp(b.neg(b.reshape(y, [32, 32]))), [1024]) if i % 2 else b.sqrt(b.abs(y))
    g = b.build_sync({"y": y})
    pool = [buf for buf in g._buffers if "pool" in buf.label]
    assert len(g.kernel_names) >= 12
    assert len(pool) <= 2, [buf.label for buf in pool]


def test_float16_and_int8_edges(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float16", shape=[5])
    i8 = b.input("i", data_type="int8", shape=[5])
    y = b.add(x, b.cast(i8, "float16"))
    z = b.cast(b.mul(i8, b.constant(data_type="int8", value=3)), "int8")
    g = b.build_sync({"y": y, "z": z})
    xs = np.array([0.5, -1.5, 65504, -0.0, 2.25], np.float16)
    ins = np.array([1, -2, 3, -128, 127], np.int8)
    out = _dispatch(ctx, g, {"x": xs, "i": ins})
    assert out["y"].dtype == np.float16
    np.testing.assert_array_equal(out["y"], (xs.astype(np.float32) + ins).astype(np.float16))
    assert out["z"].dtype == np.int8
    np.testing.assert_array_equal(out["z"], (ins.astype(np.int32) * 3).astype(np.int8))


def test_same_operand_as_two_outputs(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3])
    y = b.relu(x)
    g = b.build_sync({"a": y, "b": y})
    out = _dispatch(ctx, g, {"x": np.array([-1, 0, 2], np.float32)})
    assert out["a"].tolist() == out["b"].tolist() == [0, 0, 2]


# -- dispatch -------------------------------------------------------------------------------------


def test_dispatch_validation(ctx, fresh_ctx):
    g = _add_one(ctx)
    a, c = _t(ctx, [4]), _t(ctx, [4])
    with pytest.raises(TypeError, match="missing"):
        ctx.dispatch(g, {}, {"y": c})
    with pytest.raises(TypeError, match="unexpected"):
        ctx.dispatch(g, {"x": a, "z": a}, {"y": c})
    with pytest.raises(TypeError, match="unexpected"):
        ctx.dispatch(g, {"X": a}, {"y": c})
    with pytest.raises(TypeError, match="must be float32"):
        ctx.dispatch(g, {"x": _t(ctx, [5])}, {"y": c})
    with pytest.raises(TypeError, match="must be float32"):
        ctx.dispatch(g, {"x": _t(ctx, [4], "int32")}, {"y": c})
    with pytest.raises(TypeError, match="MLTensor"):
        ctx.dispatch(g, {"x": None}, {"y": c})
    with pytest.raises(TypeError, match="also bound as an input"):
        ctx.dispatch(g, {"x": a}, {"y": a})
    with pytest.raises(TypeError, match="another MLContext"):
        ctx.dispatch(g, {"x": _t(fresh_ctx, [4])}, {"y": c})
    with pytest.raises(TypeError, match="another MLContext"):
        fresh_ctx.dispatch(g, {"x": a}, {"y": c})
    const = ctx.create_constant_tensor_sync(data_type="float32", shape=[4], data=np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="constant"):
        ctx.dispatch(g, {"x": const}, {"y": c})
    with pytest.raises(TypeError):
        ctx.dispatch("graph", {"x": a}, {"y": c})
    d = _t(ctx, [4])
    d.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        ctx.dispatch(g, {"x": d}, {"y": c})
    g2 = _add_one(ctx)
    g2.destroy()
    g2.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        ctx.dispatch(g2, {"x": a}, {"y": c})


def test_two_outputs_same_tensor_rejected(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2])
    g = b.build_sync({"p": b.relu(x), "q": b.neg(x)})
    a, c = _t(ctx, [2]), _t(ctx, [2])
    with pytest.raises(TypeError, match="two outputs"):
        ctx.dispatch(g, {"x": a}, {"p": c, "q": c})


def test_same_tensor_for_several_inputs(ctx):
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3])
    y = b.input("y", data_type="float32", shape=[3])
    g = b.build_sync({"z": b.mul(x, y)})
    a, c = _t(ctx, [3]), _t(ctx, [3])
    ctx.write_tensor(a, np.array([1, 2, 3], np.float32))
    ctx.dispatch(g, {"x": a, "y": a}, {"z": c})
    assert ctx.read_tensor_sync(c).tolist() == [1, 4, 9]


def test_chained_inference_without_reads(ctx):
    g = _add_one(ctx)
    a, c = _t(ctx, [4]), _t(ctx, [4])
    ctx.write_tensor(a, np.zeros(4, np.float32))
    for _ in range(50):
        ctx.dispatch(g, {"x": a}, {"y": c})
        a, c = c, a
    assert ctx.read_tensor_sync(a).tolist() == [50] * 4


def test_same_graph_different_tensors_and_untouched_others(ctx):
    g = _add_one(ctx)
    pairs = [(_t(ctx, [4]), _t(ctx, [4])) for _ in range(3)]
    bystander = _t(ctx, [4])
    ctx.write_tensor(bystander, np.full(4, 42, np.float32))
    for k, (a, c) in enumerate(pairs):
        ctx.write_tensor(a, np.full(4, k, np.float32))
        ctx.dispatch(g, {"x": a}, {"y": c})
    for k, (a, c) in enumerate(pairs):
        assert ctx.read_tensor_sync(c).tolist() == [k + 1] * 4
        assert ctx.read_tensor_sync(a).tolist() == [k] * 4
    assert ctx.read_tensor_sync(bystander).tolist() == [42] * 4


def test_rebinding_after_tensor_destroyed(ctx):
    g = _add_one(ctx)
    a, c = _t(ctx, [4]), _t(ctx, [4])
    ctx.dispatch(g, {"x": a}, {"y": c})
    assert len(g._bg_cache) == 1
    c.destroy()
    assert len(g._bg_cache) == 0  # entries of destroyed tensors are dropped
    c2 = _t(ctx, [4])
    ctx.write_tensor(a, np.full(4, 5, np.float32))
    ctx.dispatch(g, {"x": a}, {"y": c2})
    assert ctx.read_tensor_sync(c2).tolist() == [6] * 4


def test_destroyed_graph_after_dispatch_completes(ctx):
    g = _add_one(ctx)
    a, c = _t(ctx, [4]), _t(ctx, [4])
    ctx.write_tensor(a, np.full(4, 2, np.float32))
    ctx.dispatch(g, {"x": a}, {"y": c})
    g.destroy()
    assert ctx.read_tensor_sync(c).tolist() == [3] * 4


def test_constant_tensor_shared_by_two_graphs(ctx):
    ct = ctx.create_constant_tensor_sync(data_type="float32", shape=[3], data=np.array([1, 2, 3], np.float32))
    graphs = []
    for op in ("add", "mul"):
        b = MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[3])
        graphs.append(b.build_sync({"y": getattr(b, op)(x, b.constant(ct))}))
    a, c, d = _t(ctx, [3]), _t(ctx, [3]), _t(ctx, [3])
    ctx.write_tensor(a, np.array([10, 10, 10], np.float32))
    up = ctx.counters["bytes_uploaded"]
    ctx.dispatch(graphs[0], {"x": a}, {"y": c})
    ctx.dispatch(graphs[1], {"x": a}, {"y": d})
    assert ctx.read_tensor_sync(c).tolist() == [11, 12, 13]
    assert ctx.read_tensor_sync(d).tolist() == [10, 20, 30]
    assert ctx.counters["bytes_uploaded"] == up


def test_float16_constant_tensor_in_graph(ctx):
    ct = ctx.create_constant_tensor_sync(data_type="float16", shape=[2], data=np.array([0.5, -2], np.float16))
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float16", shape=[2])
    g = b.build_sync({"y": b.mul(x, b.constant(ct))})
    assert _dispatch(ctx, g, {"x": np.array([4, 4], np.float16)})["y"].tolist() == [2, -8]


async def test_dispatch_then_async_reads_in_order(ctx):
    g = _add_one(ctx)
    a, c = _t(ctx, [4]), _t(ctx, [4])
    ctx.write_tensor(a, np.zeros(4, np.float32))
    ctx.dispatch(g, {"x": a}, {"y": c})
    r1 = ctx.read_tensor_async(c)
    ctx.dispatch(g, {"x": c}, {"y": a})
    r2 = ctx.read_tensor_async(a)
    v1, v2 = await asyncio.gather(r1, r2)
    assert v1.tolist() == [1] * 4 and v2.tolist() == [2] * 4


def test_write_after_dispatch_is_ordered(ctx):
    g = _add_one(ctx)
    a, c = _t(ctx, [4]), _t(ctx, [4])
    ctx.write_tensor(a, np.full(4, 1, np.float32))
    ctx.dispatch(g, {"x": a}, {"y": c})  # recorded, not submitted
    ctx.write_tensor(a, np.full(4, 100, np.float32))  # must not overtake the dispatch
    assert ctx.read_tensor_sync(c).tolist() == [2] * 4


def test_many_dispatches_batch_into_few_submits(ctx):
    g = _add_one(ctx)
    a, c = _t(ctx, [4]), _t(ctx, [4])
    ctx.flush()
    before = ctx.counters["submits"]
    for _ in range(100):
        ctx.dispatch(g, {"x": a}, {"y": c})
    ctx.read_tensor_sync(c)
    assert ctx.counters["submits"] - before <= 2


# -- helpers --------------------------------------------------------------------------------------


def _dispatch(ctx, g, feeds):
    ins = {}
    for n, arr in feeds.items():
        dt, shape = g.input_descriptors[n]
        ins[n] = _t(ctx, shape, dt)
        ctx.write_tensor(ins[n], arr)
    outs = {n: _t(ctx, shape, dt) for n, (dt, shape) in g.output_descriptors.items()}
    ctx.dispatch(g, ins, outs)
    return {n: ctx.read_tensor_sync(t) for n, t in outs.items()}


def _run(ctx, b, outputs, feeds):
    return _dispatch(ctx, b.build_sync(outputs), feeds)


def test_fusion_respects_the_binding_limit(ctx):
    """A chain with more inputs than a kernel may bind is split into several fused kernels, and the
    cap is a small fixed number whatever the adapter reports (NVIDIA: 524,288)."""
    from mltensor.compiler.steps import MAX_FUSED_BINDINGS, binding_cap

    limit = binding_cap(ctx.device)
    assert limit <= min(MAX_FUSED_BINDINGS, ctx.device.limits["max-storage-buffers-per-shader-stage"])
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4])
    y, feeds = x, {"x": np.zeros(4, np.float32)}
    for k in range(limit + 8):
        y = b.add(y, b.input(f"c{k}", data_type="float32", shape=[4]))
        feeds[f"c{k}"] = np.full(4, k, np.float32)
    g = b.build_sync({"y": y})
    assert not FUSION or 2 <= len(g.kernel_names) <= 3, g.kernel_names
    assert all(len(entry[2]) <= limit for entry in g._launches)
    assert _dispatch(ctx, g, feeds)["y"].tolist() == [sum(range(limit + 8))] * 4


def test_binding_cap_ignores_huge_adapter_limits():
    from mltensor.compiler.steps import MAX_FUSED_BINDINGS, binding_cap

    class Dev:
        def __init__(self, n):
            self.limits = {"max-storage-buffers-per-shader-stage": n}

    assert binding_cap(Dev(524288)) == MAX_FUSED_BINDINGS
    assert binding_cap(Dev(4)) == 4  # never above what the adapter allows


def test_results_beyond_the_byte_limit_are_type_errors(ctx):
    limit = ctx.op_support_limits()["max_tensor_byte_length"]
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 1024])
    with pytest.raises(TypeError, match="max_tensor_byte_length"):
        b.expand(x, [limit // 4096 + 1, 1024])
    b.build_sync({"y": b.relu(x)})  # the builder is still usable


def test_gpu_compile_failures_are_operation_errors(ctx, monkeypatch):
    from mltensor.ir.registry import OPS

    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4])
    y = b.relu(x)
    monkeypatch.setattr(OPS["relu"], "expr", lambda kc, n, v: f"not_a_function({v})")
    with pytest.raises(mltensor.OperationError, match=r"\[build\].*ew_relu"):
        b.build_sync({"y": y})


def test_rebinding_does_not_pile_up_destroy_callbacks(ctx):
    # one input tensor bound with 100 different output tensors (more than the bind-group cache
    # holds): the input registers the graph's eviction callback once, and results stay right
    g = _add_one(ctx)
    x = _t(ctx, (4,))
    ctx.write_tensor(x, np.arange(4, dtype=np.float32))
    for _ in range(100):
        y = _t(ctx, (4,))
        ctx.dispatch(g, {"x": x}, {"y": y})
        y.destroy()
    assert len(x._on_destroy) == 1
    y = _t(ctx, (4,))
    ctx.dispatch(g, {"x": x}, {"y": y})
    assert ctx.read_tensor_sync(y).tolist() == [1, 2, 3, 4]
