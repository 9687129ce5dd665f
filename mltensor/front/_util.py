"""Small helpers shared by the front objects: argument checks, awaitables, a destroyed device."""

import asyncio

import numpy as np

from .. import dtypes


def device_destroyed(device):
    # wgpu-py 0.32 has no device.lost; destroy() stops the device's poll thread.
    return getattr(device, "_poller", True) is None


def bytes_of(data, data_type, nbytes, where):
    """Validate `data` against a tensor and return a byte view of it (no copy when contiguous)."""
    if not isinstance(data, np.ndarray):
        try:
            data = np.asarray(memoryview(data))  # keeps a typed buffer's item type
        except (TypeError, ValueError):
            raise TypeError(f"[{where}] data must support the buffer protocol, got {type(data).__name__}") from None
    if data.dtype != dtypes.NUMPY[data_type] and data.dtype != np.uint8:
        raise TypeError(
            f"[{where}] data of dtype {data.dtype} does not match the tensor's {data_type} "
            "(pass raw bytes or uint8 to write any type)"
        )
    data = np.ascontiguousarray(data)
    if data.nbytes != nbytes:
        raise TypeError(f"[{where}] data has {data.nbytes} bytes, the tensor needs {nbytes}")
    return memoryview(data.reshape(-1).view(np.uint8))


def awaitable(coro):
    """The `_async` half of a pair: a Task when a loop runs (so creating it is enough to start
    it), else the coroutine itself."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return coro
    return loop.create_task(coro)
