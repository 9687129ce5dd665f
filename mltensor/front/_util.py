"""Small helpers shared by the front objects: argument checks, awaitables, a destroyed device."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np

from .. import dtypes

_T = TypeVar("_T")


def device_destroyed(device: Any) -> bool:
    # wgpu-py 0.32 has no device.lost; destroy() stops the device's poll thread.
    return getattr(device, "_poller", True) is None


def bytes_of(data: Any, data_type: str, nbytes: int, where: str) -> memoryview:
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


def awaitable(coro: Coroutine[Any, Any, _T]) -> Awaitable[_T]:
    """The `_async` half of a pair: a Task when a loop runs (so creating it is enough to start
    it), else the coroutine itself."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return coro
    return loop.create_task(coro)


# Anything with the buffer protocol (numpy arrays, bytes, bytearray, memoryview, array.array):
# collections.abc.Buffer from Python 3.12 on; Any until then (the docstrings say it).
BufferLike = Any

# The `_async` half of a pair (API.md): an awaitable of the `_sync` half's result.
AsyncResult = Awaitable


def async_doc(sync: Callable[..., Any], returns: str) -> str:
    """The docstring of the `_async` half of a pair: the `_sync` half's summary line, its
    Parameters and Raises sections, and `returns` (numpydoc lines) for its Returns."""
    doc = inspect.cleandoc(sync.__doc__ or "")
    ends = [doc.index(k) for k in ("Returns\n", "Raises\n") if k in doc] + [len(doc)]
    params = doc[doc.index("Parameters\n") : min(ends)] if "Parameters\n" in doc else ""
    raises = doc[doc.index("Raises\n") :] if "Raises\n" in doc else ""
    return (
        f"The awaitable form of `{sync.__name__}` (argument errors are raised at the call; the others "
        f"at the await).\n\n{params}Returns\n-------\n{returns}\n\n{raises}"
    ).rstrip() + "\n"
