"""The entry point `ml` and MLContext: device, tensors, transfers and the timeline."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Awaitable, Callable, Generator, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import wgpu

from .. import dtypes
from ..dynamic.dims import high, parse_shape
from ..errors import InvalidStateError, NotSupportedError, gpu_errors
from ..runtime.constants import ConstantStore
from ..runtime.timeline import PendingRead, Task, Timeline, device_lock
from ..ir.graph import as_shape
from ..ir.registry import support_limits
from ..switches import switch
from ._util import BufferLike, async_doc, awaitable, bytes_of, device_destroyed
from . import saved
from .dispatch import dispatch as _dispatch
from .tensor import MLTensor, exported_error

if TYPE_CHECKING:
    from ..dynamic.dims import MLDynamicDimension, Sym
    from .graph import MLGraph

_POWER = {"default": None, "high-performance": "high-performance", "low-power": "low-power"}
# "immediates": sizes of dynamic dimensions reach kernels as push constants (dynamic/kernels.py)
_WANTED_FEATURES = ("shader-f16", "subgroup", "timestamp-query", "shader-int64", "immediates")
_WANTED_LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-storage-buffers-per-shader-stage",
    "max-immediate-size",
)
MAX_RANK = 8
_adapters: dict[str, Any] = {}
_adapter_lock = threading.Lock()


def _adapter(power_preference: str) -> Any:
    # Requesting an adapter costs about a second on a software adapter: one per preference.
    with _adapter_lock:
        a = _adapters.get(power_preference)
        if a is None:
            a = wgpu.gpu.request_adapter_sync(power_preference=_POWER[power_preference])
            if a is None:
                raise NotSupportedError(
                    "[create_context] wgpu found no GPU adapter. On Linux without a GPU install "
                    "Mesa's software Vulkan driver: apt-get install -y mesa-vulkan-drivers "
                    "(setup.sh does this)"
                )
            _check_backend(a, "create_context")
            _adapters[power_preference] = a
        return a


def _check_backend(adapter: Any, where: str) -> None:
    # wgpu's OpenGL backend lacks what the kernels need (it aborts the process on some of them),
    # and wgpu picks it only when no Vulkan/Metal/D3D12 adapter exists.
    info = adapter.info
    if info.get("backend_type") == "OpenGL":
        raise NotSupportedError(
            f"[{where}] the only adapter is {info.get('device')} through OpenGL; mltensor needs "
            "Vulkan, Metal or D3D12. On Linux install a Vulkan driver, e.g. Mesa's software one: "
            "apt-get install -y mesa-vulkan-drivers (setup.sh does this)"
        )


def _int64_disabled() -> bool:
    """Internal switch, read when a context is created: MLTENSOR_DISABLE_INT64=1 makes the context
    ignore "shader-int64" (not requested, not used on a given device), so int64/uint64 compute with
    two 32-bit words as on an adapter without the feature. For testing that path; not public."""
    return switch("MLTENSOR_DISABLE_INT64")


def _f16_disabled() -> bool:
    """Internal switch, read when a context is created: MLTENSOR_DISABLE_F16=1 makes the context
    ignore "shader-f16" (not requested, not used on a given device), so float16 is stored packed
    and computed in f32 as on an adapter without the feature. For testing that path; not public."""
    return switch("MLTENSOR_DISABLE_F16")


def _interop() -> ModuleType:
    """front/interop.py, imported at the first lend: a process that never lends a tensor does not
    load the interop machinery."""
    from . import interop  # start-up (tests/test_layers.py DEFERRED)

    return interop


class _LostInfo:
    """What `await ctx.lost` resolves to: `message` says why the context was lost."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"<MLContextLostInfo {self.message!r}>"


class _Lost:
    """`ctx.lost`: awaitable, resolves to an object with `.message` when the context is lost."""

    def __init__(self, ctx: MLContext) -> None:
        self._ctx = ctx
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[_LostInfo]]] = []

    def _resolve(self, info: _LostInfo) -> None:
        futures, self._futures = self._futures, []
        for loop, fut in futures:
            loop.call_soon_threadsafe(lambda f=fut: f.done() or f.set_result(info))  # type: ignore[misc]  # (f=fut)

    def __await__(self) -> Generator[Any, None, _LostInfo]:
        ctx = self._ctx
        ctx._check_device()
        if ctx._lost_info is not None:
            return ctx._lost_info
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_LostInfo] = loop.create_future()
        with ctx._lock:
            if ctx._lost_info is not None:
                return ctx._lost_info
            self._futures.append((loop, fut))
        return (yield from fut.__await__())


class ML:
    """The WebNN entry point (`navigator.ml`); use the instance `mltensor.ml`, as `wgpu.gpu`.

    Its only job is creating contexts: `ml.create_context_sync()` (or `await
    ml.create_context_async()`)."""

    # IDL: interface ML { Promise<MLContext> createContext(optional MLContextOptions options = {});
    #                     Promise<MLContext> createContext(GPUDevice gpuDevice); }

    def create_context_sync(
        self, device: wgpu.GPUDevice | None = None, *, power_preference: str = "default"
    ) -> MLContext:
        """Create an MLContext (WebNN ``createContext``).

        Parameters
        ----------
        device : wgpu.GPUDevice | None, default None
            A device to share (WebNN's ``createContext(gpuDevice)``): the context records onto its
            queue, so tensors lent to your own WebGPU work on it are zero-copy. None: the context
            requests its own adapter and device (one per power preference per process).
        power_preference : str, default "default"
            "default", "high-performance" or "low-power" (wgpu's adapter request; ignored with `device`).

        Returns
        -------
        MLContext
            The new context.

        Raises
        ------
        TypeError
            An unknown `power_preference`, or a `device` that is not a wgpu.GPUDevice.
        NotSupportedError
            No usable adapter (none at all, or only OpenGL); the message says how to install one.
        """
        return MLContext._create(device, power_preference)

    def create_context_async(
        self, device: wgpu.GPUDevice | None = None, *, power_preference: str = "default"
    ) -> Awaitable[MLContext]:
        MLContext._check_args(device, power_preference)

        async def create() -> MLContext:
            return MLContext._create(device, power_preference)

        return awaitable(create())

    create_context_async.__doc__ = async_doc(create_context_sync, "Awaitable[MLContext]\n    The new context.")


ml = ML()
"""The `ML` instance: `from mltensor import ml; ctx = ml.create_context_sync()`."""


class MLContext:
    """A WebNN context: one GPU device, the tensors and graphs created on it, and the timeline
    that orders all their work.

    Created by `ml.create_context_sync()` (never directly). Every call on a context, its tensors
    and graphs may come from any thread; work takes effect in call order as far as any tensor can
    observe. `dispatch` and `write_tensor` return at once: work is recorded and submitted in
    batches, at the latest when something waits on it (a read, `flush`)."""

    # IDL: interface MLContext { ... } (see API.md, "Entry point and context")

    # its state, set by _create (declared for type checkers)
    _device: wgpu.GPUDevice
    _own_device: bool
    _int64: bool
    _f16: bool
    _adapter_info: dict[str, Any]
    _counters: dict[str, int]
    _lock: Any
    _timeline: Timeline
    _lost_info: _LostInfo | None
    _lost: _Lost
    _tensors: set[MLTensor]
    _graphs: set[MLGraph]
    _read_waiters: set[Callable[[], object]]
    _direct_map: bool
    _constants: ConstantStore
    _max_bytes: int

    def __init__(self) -> None:
        raise TypeError("MLContext is created with ml.create_context_sync() or _async()")

    @staticmethod
    def _check_args(device: object, power_preference: str) -> None:
        if power_preference not in _POWER:
            raise TypeError(
                f"[create_context] power_preference must be one of {', '.join(map(repr, _POWER))}, "
                f"got {power_preference!r}"
            )
        if device is not None and not isinstance(device, wgpu.GPUDevice):
            raise TypeError(f"[create_context] expected a wgpu.GPUDevice or options, got {device!r}")
        if device is not None and device_destroyed(device):
            raise InvalidStateError("[create_context] the GPUDevice is destroyed")

    @classmethod
    def _create(cls, device: Any, power_preference: str) -> MLContext:
        cls._check_args(device, power_preference)
        self = object.__new__(cls)
        own = device is None
        if own:
            adapter = _adapter(power_preference)
            features = [
                f
                for f in _WANTED_FEATURES
                if f in adapter.features
                and not (f == "shader-int64" and _int64_disabled())
                and not (f == "shader-f16" and _f16_disabled())
            ]
            # On a CPU adapter all buffers live in host memory: readable tensors can be mapped
            # directly, saving a full GPU copy per synchronous read (see read_tensor_sync).
            if adapter.info.get("adapter_type") == "CPU" and "mappable-primary-buffers" in adapter.features:
                features.append("mappable-primary-buffers")
            limits = {k: adapter.limits[k] for k in _WANTED_LIMITS if k in adapter.limits}
            device = adapter.request_device_sync(label="mltensor", required_features=features, required_limits=limits)
        else:
            adapter = device.adapter
            _check_backend(adapter, "create_context")
        self._device = device
        self._own_device = own
        # int64/uint64 compute natively in 64 bits (else emulated with two 32-bit words, see dtypes.py)
        self._int64 = "shader-int64" in device.features and not _int64_disabled()
        # float16 computes natively in f16 (else in f32, unpacked at the graph's edges; see dtypes.py)
        self._f16 = "shader-f16" in device.features and not _f16_disabled()
        self._adapter_info = adapter.info
        self._counters = dict.fromkeys(
            (
                "bytes_uploaded",
                "bytes_downloaded",
                "bytes_copied_between_devices",
                "submits",
                "kernel_launches",
                "tensors_alive",
                "bytes_alive",
                "constant_bytes",
            ),
            0,
        )
        # The device's lock (shared by every context on it): every call that touches the timeline
        # or the context's state holds it, from validation to the last recorded command.
        self._lock = device_lock(device)
        self._timeline = Timeline(device, self._counters, device_gone=None if own else lambda: device_destroyed(device))
        if not own:
            me = weakref.ref(self)
            self._timeline.on_gone = lambda message: (c := me()) is not None and c._lose(message)  # type: ignore[func-returns-value]  # (its value is unused)
        self._lost_info = None
        self._lost = _Lost(self)
        self._tensors = set()
        self._graphs = set()
        self._read_waiters = set()
        self._direct_map = "mappable-primary-buffers" in device.features
        # graphs' weights, one buffer per distinct content shared by every build (runtime/constants.py)
        self._constants = ConstantStore(device, self._timeline, self._counters, direct=self._direct_map)
        lim = device.limits
        # max_tensor_byte_length, read by the builder's check and by the ONNX import, which splits
        # constants above it (onnx/ops/_blocks.py); tests lower it on one context to force that
        self._max_bytes = min(lim["max-buffer-size"], lim["max-storage-buffer-binding-size"])
        return self

    def __repr__(self) -> str:
        state = " lost" if self._lost_info else ""
        return f"<MLContext on {self._adapter_info.get('device', '?')}{state}>"

    # -- properties (Python extensions where WebNN has none) -----------------------------------

    @property
    def device(self) -> wgpu.GPUDevice:
        """Python extension: the `wgpu.GPUDevice` this context runs on (its own, or the one
        passed to `create_context`)."""
        return self._device

    @property
    def accelerated(self) -> bool:
        """False on a CPU / software adapter (such as Mesa's lavapipe), True on a GPU."""
        return self._adapter_info.get("adapter_type", "").lower() not in ("cpu", "")

    @property
    def lost(self) -> Awaitable[_LostInfo]:
        """An awaitable that resolves, when the context is lost (`destroy()`, or the device of a
        device-created context destroyed or lost), to an object whose `message` says why."""
        return self._lost

    @property
    def counters(self) -> dict[str, int]:
        """Python extension: a snapshot dict of what the context has done, for proving how many copies a path makes:
        `bytes_uploaded`, `bytes_downloaded`, `bytes_copied_between_devices` (interop with another device), `submits`,
        `kernel_launches`, `tensors_alive`, `bytes_alive` and `constant_bytes` (graphs' weights held on the device, once
        per distinct content)."""
        with self._lock:
            return dict(self._counters)

    @property
    def features(self) -> set[str]:
        """Python extension: the set of wgpu features of the context's device (e.g.
        "shader-f16", "shader-int64", "subgroup", "timestamp-query")."""
        return set(self._device.features)

    def op_support_limits(self) -> dict[str, Any]:
        """What this context supports (WebNN ``opSupportLimits()``). The data types listed are exactly those that work
        on this context (int64 and float16 included only where the adapter runs them).

        Returns
        -------
        dict
            ``preferred_input_layout`` (str), ``max_tensor_byte_length`` (int, bytes), the data
            types and rank ranges of graph ``input``, ``constant`` and ``output`` operands
            (``{"data_types": [...], "rank_range": {"min": .., "max": ..}}``), and one entry per
            builder operator giving the same per operand name (``{"conv2d": {"input": {...},
            "filter": {...}, ...}, ...}``). Operator names starting with ``_`` (internal
            kernels) are not listed.
        """
        return support_limits(self)

    # -- state ---------------------------------------------------------------------------------

    def _check_device(self) -> None:
        if self._lost_info is None and not self._own_device and device_destroyed(self._device):
            self._lose("the GPUDevice was destroyed")

    def _check(self, where: str) -> None:
        self._check_device()
        if self._lost_info is not None:
            raise InvalidStateError(f"[{where}] the context is lost ({self._lost_info.message})")

    def _check_tensor(self, t: object, where: str, what: str = "tensor") -> None:
        if not isinstance(t, MLTensor):
            raise TypeError(f"[{where}] {what} must be an MLTensor, got {type(t).__name__}")
        if t._context is not self:
            raise TypeError(f"[{where}] {what} belongs to another MLContext")
        if t._destroyed:
            raise InvalidStateError(f"[{where}] {what} is destroyed")
        if t._exported is not None:
            raise TypeError(exported_error(where, what))

    def _tensor_created(self, t: MLTensor) -> None:
        self._tensors.add(t)
        self._counters["tensors_alive"] += 1
        self._counters["bytes_alive"] += t._buffer.size

    def _tensor_destroyed(self, t: MLTensor) -> None:
        self._tensors.discard(t)
        self._counters["tensors_alive"] -= 1
        self._counters["bytes_alive"] -= t._buffer.size

    def _lose(self, message: str) -> None:
        with self._lock:
            if self._lost_info is not None:
                return
            self._lost_info = _LostInfo(message)
            tl = self._timeline
            try:
                tl.flush()
            except Exception:
                pass
            for g in list(self._graphs):
                g.destroy()
            for t in list(self._tensors):
                t.destroy()
            for wake in list(self._read_waiters):  # async reads and imports held back
                wake()
            tl.held = []
            self._constants.clear()  # (graph frees held back above never run; the device frees all)
            tl.mapped.clear()  # reads mapping in place unmap by themselves; nothing submits now
            tl.drop_staging()
            tl.changed.notify_all()  # synchronous reads waiting for held work raise
            self._lost._resolve(self._lost_info)

    # IDL: undefined destroy();
    def destroy(self) -> None:
        """Idempotent. Loses the context: its graphs and tensors are destroyed, pending reads
        reject with InvalidStateError. An own device is released when the context is dropped."""
        self._lose("destroy() was called")

    # -- tensors -------------------------------------------------------------------------------

    def _tensor_args(self, where: str, data_type: Any, shape: Any) -> tuple[str, tuple[int | Sym, ...]]:
        self._check(where)
        data_type = dtypes.normalize(data_type, where)
        shape = as_shape(shape, where)
        if len(shape) > MAX_RANK:
            raise TypeError(f"[{where}] rank {len(shape)} is above the supported maximum {MAX_RANK}")
        nbytes = high(dtypes.byte_length(data_type, shape))  # dynamic dimensions: at their maximum
        if nbytes > self._max_bytes:
            raise TypeError(f"[{where}] byte length {nbytes} exceeds max_tensor_byte_length {self._max_bytes}")
        return data_type, shape

    # IDL: Promise<MLTensor> createTensor(MLTensorDescriptor descriptor);
    def create_tensor_sync(
        self,
        *,
        data_type: str | np.dtype,
        shape: Sequence[int | MLDynamicDimension],
        readable: bool = False,
        writable: bool = False,
        importable_to_webgpu: bool = False,
    ) -> MLTensor:
        """Create an MLTensor (WebNN ``createTensor``), zero-filled.

        Parameters
        ----------
        data_type : str or numpy.dtype
            "float32", "float16", "int32", "uint32", "int64", "uint64", "int8" or "uint8" (or a numpy
            dtype of the same kind).
        shape : sequence of int or MLDynamicDimension
            The sizes; ``[]`` is a scalar. A `MLDynamicDimension` entry makes the tensor resizable
            (Python extension): sized for the maximum, its `shape` set by `write_tensor` of an array
            and by each dispatch writing it.
        readable : bool, default False
            Allow `read_tensor_sync` / `read_tensor_async`.
        writable : bool, default False
            Allow `write_tensor`.
        importable_to_webgpu : bool, default False
            Allow lending it with `mltensor.import_external_buffer_sync`.

        Returns
        -------
        MLTensor
            The new tensor.

        Raises
        ------
        TypeError
            A zero or negative size, a byte length above ``max_tensor_byte_length``, or a data type
            the context does not support.
        InvalidStateError
            The context is lost.
        """
        with self._lock:
            parsed = parse_shape(shape, "create_tensor", {}, named_only=False)  # dynamic: resizable
            dt, checked = self._tensor_args("create_tensor", data_type, parsed)
            return MLTensor(self, dt, checked, readable, writable, importable_to_webgpu)

    def create_tensor_async(
        self,
        *,
        data_type: str | np.dtype,
        shape: Sequence[int | MLDynamicDimension],
        readable: bool = False,
        writable: bool = False,
        importable_to_webgpu: bool = False,
    ) -> Awaitable[MLTensor]:
        t = self.create_tensor_sync(
            data_type=data_type,
            shape=shape,
            readable=readable,
            writable=writable,
            importable_to_webgpu=importable_to_webgpu,
        )

        async def done() -> MLTensor:
            return t

        return awaitable(done())

    create_tensor_async.__doc__ = async_doc(create_tensor_sync, "Awaitable[MLTensor]\n    The new tensor.")

    # IDL (WebNN interop, webnn PR #942): Promise<MLTensor> createExportableTensor(MLTensorDescriptor descriptor, GPUDevice device);
    def create_exportable_tensor_sync(
        self,
        *,
        data_type: str | np.dtype,
        shape: Sequence[int],
        device: wgpu.GPUDevice,
        readable: bool = False,
        writable: bool = False,
    ) -> MLTensor:
        """Create a tensor `export_to_gpu_sync` can rent to `device` (WebNN interop's ``createExportableTensor``):
        zero-copy when `device` is this context's device, copied in and out otherwise.

        Parameters
        ----------
        data_type : str or numpy.dtype
            The data type, as `create_tensor_sync` takes it.
        shape : sequence of int
            The sizes.
        device : wgpu.GPUDevice
            The device the tensor is exported to (a device of wgpu's native backend).
        readable : bool, default False
            Allow `read_tensor_sync` / `read_tensor_async`.
        writable : bool, default False
            Allow `write_tensor`.

        Returns
        -------
        MLTensor
            The new tensor.

        Raises
        ------
        TypeError
            `device` is not a wgpu.GPUDevice of the native backend, or the descriptor is invalid.
        InvalidStateError
            The context is lost or `device` is destroyed.
        """
        where = "create_exportable_tensor"
        if not isinstance(device, wgpu.GPUDevice):
            raise TypeError(f"[{where}] device must be a wgpu.GPUDevice, got {type(device).__name__}")
        if not type(device).__module__.startswith("wgpu.backends.wgpu_native"):
            raise TypeError(f"[{where}] device must be a device of wgpu's native backend")
        with self._lock:
            self._check(where)
            if device_destroyed(device):
                raise InvalidStateError(f"[{where}] the GPUDevice is destroyed")
            dt, checked = self._tensor_args(where, data_type, shape)
            return MLTensor(self, dt, checked, readable, writable, False, export_device=device)

    def create_exportable_tensor_async(
        self,
        *,
        data_type: str | np.dtype,
        shape: Sequence[int],
        device: wgpu.GPUDevice,
        readable: bool = False,
        writable: bool = False,
    ) -> Awaitable[MLTensor]:
        t = self.create_exportable_tensor_sync(
            data_type=data_type, shape=shape, device=device, readable=readable, writable=writable
        )

        async def done() -> MLTensor:
            return t

        return awaitable(done())

    create_exportable_tensor_async.__doc__ = async_doc(
        create_exportable_tensor_sync, "Awaitable[MLTensor]\n    The new tensor."
    )

    # IDL (WebNN interop, webnn PR #942): Promise<GPUBuffer> exportToGPU(MLTensor tensor);
    def export_to_gpu_sync(self, tensor: MLTensor) -> wgpu.GPUBuffer:
        """Rent an exportable tensor to its GPUDevice (WebNN interop's ``exportToGPU``). WebNN use of the tensor fails
        until the buffer's ``destroy()``, which returns the tensor with the device's writes in it.

        Parameters
        ----------
        tensor : MLTensor
            A tensor created by `create_exportable_tensor_sync`.

        Returns
        -------
        wgpu.GPUBuffer
            A buffer of usage STORAGE | COPY_SRC | COPY_DST that the device uses exclusively.

        Raises
        ------
        TypeError
            A tensor of another context, or one not created by `create_exportable_tensor_sync`, or one
            exported already.
        InvalidStateError
            The tensor is destroyed or the context lost.
        """
        return _interop().export_to_gpu(self, tensor, False)

    def export_to_gpu_async(self, tensor: MLTensor) -> Awaitable[wgpu.GPUBuffer]:
        return _interop().export_to_gpu(self, tensor, True)  # type: ignore[no-any-return]  # (a deferred import)

    export_to_gpu_async.__doc__ = async_doc(export_to_gpu_sync, "Awaitable[wgpu.GPUBuffer]\n    The buffer.")

    # -- graph cache (webnn cache-explainer.md; mltensor/graphcache/): front/saved.py, bound here
    save_graph_sync = saved.save_graph_sync
    save_graph_async = saved.save_graph_async
    load_graph_sync = saved.load_graph_sync
    load_graph_async = saved.load_graph_async
    list_graphs_sync = saved.list_graphs_sync
    list_graphs_async = saved.list_graphs_async
    delete_graph = saved.delete_graph

    # IDL: Promise<MLTensor> createConstantTensor(MLOperandDescriptor descriptor, AllowSharedBufferSource inputData);
    def create_constant_tensor_sync(
        self, *, data_type: str | np.dtype, shape: Sequence[int], data: BufferLike
    ) -> MLTensor:
        """Create a constant MLTensor holding `data` (WebNN ``createConstantTensor``): neither
        readable nor writable, it can only be passed to `MLGraphBuilder.constant`.

        Parameters
        ----------
        data_type : str or numpy.dtype
            The data type, as `create_tensor_sync` takes it.
        shape : sequence of int
            The sizes.
        data : buffer
            Anything with the buffer protocol, of the byte length `data_type` and `shape` give.

        Returns
        -------
        MLTensor
            The constant tensor.

        Raises
        ------
        TypeError
            An invalid descriptor, or data of another byte length or data type.
        InvalidStateError
            The context is lost.
        """
        where = "create_constant_tensor"
        with self._lock:
            dt, checked = self._tensor_args(where, data_type, shape)
            raw = bytes_of(data, dt, dtypes.byte_length(dt, checked), where)
            t = MLTensor(self, dt, checked, False, False, False, constant=True)
            with gpu_errors(where):
                try:
                    self._timeline.write(t._buffer, _pad4(raw), len(raw))
                except BaseException:
                    t.destroy()
                    raise
            return t

    def create_constant_tensor_async(
        self, *, data_type: str | np.dtype, shape: Sequence[int], data: BufferLike
    ) -> Awaitable[MLTensor]:
        t = self.create_constant_tensor_sync(data_type=data_type, shape=shape, data=data)

        async def done() -> MLTensor:
            return t

        return awaitable(done())

    create_constant_tensor_async.__doc__ = async_doc(
        create_constant_tensor_sync, "Awaitable[MLTensor]\n    The constant tensor."
    )

    # IDL: undefined writeTensor(MLTensor tensor, AllowSharedBufferSource inputData);
    def write_tensor(self, tensor: MLTensor, data: BufferLike) -> None:
        """Write `data` into a writable tensor (WebNN ``writeTensor``); returns at once. The write
        takes effect in call order with the context's other work (held back while the tensor is lent).

        Parameters
        ----------
        tensor : MLTensor
            A tensor of this context created with ``writable=True``.
        data : buffer
            Anything with the buffer protocol, of exactly the tensor's byte length, typed as the
            tensor's data type or as raw bytes / uint8. The bytes are taken at the call. A numpy
            array of another shape resizes a resizable tensor to it.

        Raises
        ------
        TypeError
            A tensor of another context or not writable, or data of another byte length or dtype.
        InvalidStateError
            The tensor is destroyed or the context lost.
        """
        where = "write_tensor"
        with self._lock:
            self._check_tensor(tensor, where)
            self._check(where)
            if not tensor._writable:
                raise TypeError(f"[{where}] the tensor was not created with writable=True")
            if (
                tensor._max_shape is not None
                and isinstance(data, np.ndarray)
                and data.ndim
                and data.shape != tensor._shape
                and data.dtype == tensor._np_dtype
            ):
                tensor._fit(data.shape, where)  # a resizable tensor takes the array's shape
            raw: bytes | memoryview = bytes_of(data, tensor._data_type, tensor._nbytes, where)
            tl = self._timeline
            task = Task((), (tensor,), None)
            if tl.hold_reason(task) is not None:
                raw = bytes(raw)  # held back: keep the bytes given at call time
            payload = _pad4(raw)
            task.body = lambda: tl.write(tensor._buffer, payload, len(raw))
            with gpu_errors(where):
                tl.enqueue(task)

    # IDL: Promise<ArrayBuffer> readTensor(MLTensor tensor);
    # IDL: Promise<undefined> readTensor(MLTensor tensor, AllowSharedBufferSource outputData);
    def _read_args(self, tensor: MLTensor, out: BufferLike | None, where: str) -> memoryview | None:
        self._check_tensor(tensor, where)
        self._check(where)
        if not tensor._readable:
            raise TypeError(f"[{where}] the tensor was not created with readable=True")
        if out is not None:
            try:
                mv = memoryview(out)
            except TypeError:
                raise TypeError(
                    f"[{where}] output must support the buffer protocol, got {type(out).__name__}"
                ) from None
            if mv.readonly:
                raise TypeError(f"[{where}] output buffer is read-only")
            if mv.nbytes < tensor._nbytes:
                raise TypeError(f"[{where}] output buffer has {mv.nbytes} bytes, the tensor needs {tensor._nbytes}")
            if not mv.c_contiguous:
                raise TypeError(f"[{where}] output buffer must be contiguous")
            out = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
        return out

    def read_tensor_sync(self, tensor: MLTensor, out: BufferLike | None = None) -> np.ndarray | None:
        """Read a readable tensor (WebNN ``readTensor``), waiting for the work before it. The bytes go
        from GPU staging memory straight into the result (one host copy).

        Parameters
        ----------
        tensor : MLTensor
            A tensor of this context created with ``readable=True``.
        out : buffer or None, default None
            A writable contiguous buffer of at least the tensor's byte length: its prefix is filled.

        Returns
        -------
        numpy.ndarray or None
            A new array of the tensor's dtype and current shape; None when `out` is given.

        Raises
        ------
        TypeError
            A tensor of another context or not readable, or an `out` too small or read-only.
        InvalidStateError
            The tensor is destroyed or the context lost (also while the read is pending).
        """
        return self._start_read(tensor, out, sync=True).wait_sync("read_tensor")

    def _start_read(
        self, tensor: MLTensor, out: Any = None, where: str = "read_tensor", sync: bool = False
    ) -> PendingRead:
        """Validate and start a read; returns the PendingRead (wait_sync / wait_async). Several
        started before any is waited on complete with one submit (InferenceSession uses this).
        sync: the caller will wait with wait_sync, so on CPU adapters a mappable tensor that
        nothing holds back is mapped in place instead of copied (busy until the read ends)."""
        with self._lock:
            out = self._read_args(tensor, out, where)
            r = PendingRead(self, tensor, out)
            tl = self._timeline
            with gpu_errors(where):
                if sync and tensor._direct_map and tl.hold_reason(r.task) is None:
                    r.start_direct()
                else:
                    tl.enqueue(r.task)
            return r

    def read_tensor_async(self, tensor: MLTensor, out: BufferLike | None = None) -> Awaitable[np.ndarray | None]:
        return awaitable(self._start_read(tensor, out).wait_async("read_tensor"))

    read_tensor_async.__doc__ = async_doc(
        read_tensor_sync,
        "Awaitable[numpy.ndarray | None]\n    The array (None when out is given). Reads started before any is awaited proceed in parallel.",
    )

    # IDL: undefined dispatch(MLGraph graph, MLNamedTensors inputs, MLNamedTensors outputs);
    # dispatch(graph, inputs, outputs) is front/graph.dispatch, bound as the method (hot path).
    dispatch = _dispatch

    def flush(self) -> None:
        """Python extension: submit recorded GPU work now (it is submitted anyway when something waits on it)."""
        with self._lock:
            self._check("flush")
            with gpu_errors("flush"):
                self._timeline.flush()


def _pad4(raw: bytes | memoryview) -> bytes | memoryview:
    n = len(raw)
    if n % 4 == 0 and n:
        return raw
    return bytes(raw) + b"\0" * (dtypes.padded(n) - n)
