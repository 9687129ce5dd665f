"""MLContext: creation options, properties, op_support_limits, destroy and lost."""

import asyncio

import numpy as np
import pytest
import wgpu

import mltensor
from mltensor import ml


def test_create_default_and_power_preferences():
    for pref in ("default", "high-performance", "low-power"):
        c = ml.create_context_sync(power_preference=pref)
        assert isinstance(c, mltensor.MLContext)
        assert isinstance(c.device, wgpu.GPUDevice)
        assert isinstance(c.accelerated, bool)
        c.destroy()


def test_software_adapter_is_not_accelerated(ctx):
    if ctx.device.adapter.info["adapter_type"] == "CPU":
        assert ctx.accelerated is False


def test_unknown_power_preference_is_type_error():
    with pytest.raises(TypeError, match="power_preference"):
        ml.create_context_sync(power_preference="auto")


def test_non_device_argument_is_type_error():
    with pytest.raises(TypeError):
        ml.create_context_sync("gpu")


async def test_create_context_async():
    c = await ml.create_context_async(power_preference="low-power")
    assert isinstance(c, mltensor.MLContext)
    c.destroy()


def test_shared_device_context_uses_that_device():
    dev = wgpu.gpu.request_adapter_sync().request_device_sync()
    c = ml.create_context_sync(dev)
    assert c.device is dev
    c.destroy()


def test_mltensor_context_not_constructible():
    with pytest.raises(TypeError):
        mltensor.MLContext()


def test_optional_features_requested(ctx):
    from mltensor.front.context import _f16_disabled

    adapter_features = ctx.device.adapter.features
    for f in ("shader-f16", "subgroup", "timestamp-query"):
        # MLTENSOR_DISABLE_F16=1 (internal switch) leaves shader-f16 unrequested
        want = f in adapter_features and not (f == "shader-f16" and _f16_disabled())
        assert (f in ctx.device.features) == want
    assert ctx._f16 == ("shader-f16" in ctx.device.features)


def test_op_support_limits_shape(ctx):
    lim = ctx.op_support_limits()
    assert lim["preferred_input_layout"] in ("nchw", "nhwc")
    assert lim["max_tensor_byte_length"] > 0
    for k in ("input", "constant", "output"):
        assert set(lim[k]["data_types"]) == set(mltensor.dtypes.ALL)
        assert lim[k]["rank_range"]["min"] == 0
    assert "add" in lim and set(lim["add"]) == {"a", "b", "output"}
    assert "float32" in lim["add"]["a"]["data_types"]


def test_counters_snapshot_is_a_copy(ctx):
    c = ctx.counters
    c["submits"] = -1
    assert ctx.counters["submits"] != -1
    assert set(c) == {
        "bytes_uploaded",
        "bytes_downloaded",
        "bytes_copied_between_devices",
        "submits",
        "kernel_launches",
        "tensors_alive",
        "bytes_alive",
        "constant_bytes",
    }


def test_destroy_is_idempotent_and_invalidates_everything():
    c = ml.create_context_sync()
    t = c.create_tensor_sync(data_type="float32", shape=[2], readable=True, writable=True)
    t2 = c.create_tensor_sync(data_type="float32", shape=[2], readable=True, writable=True)
    b = mltensor.MLGraphBuilder(c)
    x = b.input("x", data_type="float32", shape=[2])
    g = b.build_sync({"y": b.relu(x)})
    c.destroy()
    c.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        c.create_tensor_sync(data_type="float32", shape=[2])
    with pytest.raises(mltensor.InvalidStateError):
        c.read_tensor_sync(t)
    with pytest.raises(mltensor.InvalidStateError):
        c.write_tensor(t, np.zeros(2, np.float32))
    with pytest.raises(mltensor.InvalidStateError):
        c.dispatch(g, {"x": t}, {"y": t2})
    with pytest.raises(mltensor.InvalidStateError):
        mltensor.MLGraphBuilder(c)
    with pytest.raises(mltensor.InvalidStateError):
        b.relu(x)
    assert c.counters["tensors_alive"] == 0


async def test_lost_resolves_on_destroy():
    c = ml.create_context_sync()
    waiter = asyncio.ensure_future(c.lost)
    await asyncio.sleep(0)
    assert not waiter.done()
    c.destroy()
    info = await asyncio.wait_for(waiter, 5)
    assert isinstance(info.message, str) and info.message
    # awaiting again after loss resolves at once
    info2 = await c.lost
    assert info2 is info


async def test_lost_when_shared_device_destroyed():
    dev = wgpu.gpu.request_adapter_sync().request_device_sync()
    c = ml.create_context_sync(dev)
    dev.destroy()
    info = await asyncio.wait_for(c.lost, 5)
    assert "destroyed" in info.message
    with pytest.raises(mltensor.InvalidStateError):
        c.create_tensor_sync(data_type="float32", shape=[1])


def test_destroyed_device_rejected_at_creation():
    dev = wgpu.gpu.request_adapter_sync().request_device_sync()
    dev.destroy()
    with pytest.raises(mltensor.InvalidStateError):
        ml.create_context_sync(dev)


def test_errors_hierarchy():
    for e in (
        mltensor.InvalidStateError,
        mltensor.NotSupportedError,
        mltensor.OperationError,
        mltensor.UnknownError,
        mltensor.DataError,
    ):
        assert issubclass(e, mltensor.DOMException)
        assert issubclass(e, Exception)
    assert not issubclass(mltensor.DOMException, TypeError)


def test_public_surface_is_small():
    public = {n for n in dir(mltensor) if not n.startswith("_")}
    # modules imported for the implementation must not leak as API beyond what __all__ names
    assert set(mltensor.__all__) >= {"ml", "MLContext", "MLTensor", "MLGraphBuilder", "MLGraph", "MLOperand"}
    for name in mltensor.__all__:
        assert getattr(mltensor, name) is not None
    import types

    # besides __all__, only submodules (implementation packages) appear on the package
    extra = {n for n in public - set(mltensor.__all__) if not isinstance(getattr(mltensor, n), types.ModuleType)}
    assert extra <= {"__version__"}, extra


def test_opengl_fallback_adapter_is_refused_clearly():
    """wgpu picks its OpenGL backend only when no Vulkan/Metal/D3D12 driver exists; mltensor
    refuses it with instructions instead of letting a kernel abort the process later."""
    from mltensor.front.context import _check_backend

    class GLAdapter:
        info = {"backend_type": "OpenGL", "device": "llvmpipe"}

    with pytest.raises(mltensor.NotSupportedError, match="mesa-vulkan-drivers"):
        _check_backend(GLAdapter(), "create_context")
    _check_backend(type("VkAdapter", (), {"info": {"backend_type": "Vulkan"}})(), "create_context")
