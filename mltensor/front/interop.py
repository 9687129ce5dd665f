"""WebGPU interop: lend an MLTensor to a wgpu.GPUDevice, in two forms sharing one lease.

- `import_external_buffer(device, tensor)`, the MLTensor explainer's model (WebGPU
  `device.importExternalBuffer`): while lent the tensor is in `timeline.lent`, so ML work touching
  it (and work depending on that work) is held back and runs in call order after the release.
- `MLContext.export_to_gpu(tensor)` of a tensor made by `create_exportable_tensor(..., device)`,
  the WebNN interop specification (webnn PR #942, Chromium's exportToGPU): while exported
  (`tensor._exported`) the tensor is rented to the device and WebNN use of it fails at once
  (dispatch, read_tensor, write_tensor, exporting it again: TypeError naming the call). The
  tensor is in `timeline.lent` too, which then holds back only its destroy()'s free.

- Same device (the context runs on `device`): zero-copy. The lent buffer is a second wgpu-py
  object around the tensor's native buffer (one more native reference). The import submits the
  ML work recorded so far, so the device's later submits on the shared queue see it; nothing waits
  for the GPU.
- Another device: the tensor is copied (after the ML work touching it) into a fresh buffer of that
  device at import, and copied back (after the device's work on it) at release.

`buf.destroy()` / `buf.release()` end the lease. They never free the tensor's memory: the buffer
object is re-pointed at a tiny stub buffer, so a stray use afterwards cannot touch the tensor.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import wgpu
from wgpu.backends.wgpu_native import _api as _native
from wgpu.backends.wgpu_native._ffi import lib as _lib

from ..errors import InvalidStateError, gpu_errors
from ..runtime.timeline import DeviceGone, Task, device_lock, task_done, wait_promise, wait_sync_promise
from ._util import async_doc, awaitable, device_destroyed
from .tensor import MLTensor

_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def _device_state(device: Any) -> dict[str, Any]:
    """Per-device interop state, kept on the device object itself (a dict keyed by the device
    would keep it alive: its buffers reference it): the 4-byte stub that released leases point
    to, and a small pool of MAP_READ buffers for cross-device copy-back."""
    st = getattr(device, "_mltensor_interop", None)
    if st is None:
        st = device._mltensor_interop = {"stub": None, "staging": {}}
    return st


class LentBuffer(_native.GPUBuffer):  # type: ignore[misc]  # (wgpu ships no types: its classes are Any)
    """A wgpu.GPUBuffer handed to a device by import_external_buffer. destroy() and release()
    return the tensor to ML; they do not free its memory."""

    _internal: Any  # (wgpu-py's: the native buffer handle)
    _lease: _Lease

    @classmethod
    def _wrap(cls, lease: _Lease, internal: Any, device: Any, size: int, label: str) -> LentBuffer:
        """A second wgpu-py object around a native buffer, with its own native reference
        (balanced by the release in _release() or _repoint())."""
        _lib.wgpuBufferAddRef(internal)
        self = cls(label, internal, device, size, _USAGE, "unmapped")
        self._lease = lease
        return self

    # IDL: undefined destroy();
    def destroy(self) -> None:
        """End the lease (the tensor goes back to ML with the device's writes); idempotent."""
        self._lease.end()

    def release(self) -> None:
        """Python extension, same as destroy(): end the lease; idempotent."""
        self._lease.end()

    def _repoint(self, device: Any) -> None:
        """After the lease: point this object at a stub so later use cannot reach the tensor."""
        state = _device_state(device)
        stub = state["stub"]
        if stub is None:
            if device_destroyed(device):
                return  # nothing can use this buffer any more anyway
            stub = device.create_buffer(label="mltensor-released-lease", size=4, usage=_USAGE)
            state["stub"] = stub
        _lib.wgpuBufferAddRef(stub._internal)
        old, self._internal = self._internal, stub._internal
        if old is not None:
            _lib.wgpuBufferRelease(old)


class _Lease:
    """One lend of a tensor to a device: `rent` for export_to_gpu (WebNN use fails meanwhile),
    else import_external_buffer's (WebNN use is held back meanwhile)."""

    def __init__(self, tensor: MLTensor, device: Any, rent: bool = False) -> None:
        ctx = tensor._context
        self.tensor = tensor
        self.ctx = ctx
        self.device = device
        self.rent = rent
        self.same = device is ctx.device
        self.size = tensor._buffer.size
        self.state = "pending"  # -> "lent" -> "ended"
        self.buffer: Any = None  # the LentBuffer, once lent
        self.error: Exception | None = None
        self._staging: Any = None
        self._promise: Any = None
        self.task = Task((tensor,), (tensor,), self._start)

    # -- import ---------------------------------------------------------------------------------

    def _start(self) -> None:
        """The import task: runs once the ML work before it is recorded (call order)."""
        tl = self.ctx._timeline
        t = self.tensor
        # A rented tensor is refused by WebNN calls instead (tensor._exported), so the only task
        # this holds back for it is destroy()'s free: the device keeps the buffer until its end.
        tl.lent.add(t)
        try:
            if not self.same:
                self._staging = tl.acquire_staging(self.size)
                tl.encoder().copy_buffer_to_buffer(t._buffer, 0, self._staging, 0, self.size)
                tl.touch((t._buffer, self._staging))
            tl.flush()  # same device: the device's later submits come after this ML work
            if not self.same:
                self._promise = self._staging.map_async(wgpu.MapMode.READ, 0, self.size)
        except Exception as e:  # e.g. a lost device: reported to the importer, never to resume()
            self.error = e

    def _label(self) -> str:
        t = self.tensor
        return f"mltensor-lent-{t._data_type}{list(t._shape)}"

    def _complete(self, where: str) -> LentBuffer:
        """After the import task ran (and, cross device, the staging map resolved)."""
        ctx = self.ctx
        if self.error is not None:
            raise self.error
        if ctx._lost_info is not None:
            raise InvalidStateError(f"[{where}] the context was lost while the import was pending")
        if self.same:
            buf = LentBuffer._wrap(self, self.tensor._buffer._internal, self.device, self.size, self._label())
        else:
            if device_destroyed(self.device):
                raise InvalidStateError(f"[{where}] the GPUDevice was destroyed while the import was pending")
            mv = self._staging.read_mapped(0, self.size, copy=False)
            native = self.device.create_buffer(
                label=self._label(), size=self.size, usage=_USAGE, mapped_at_creation=True
            )
            native.write_mapped(mv)
            native.unmap()
            del mv
            self._drop_staging()
            buf = LentBuffer._wrap(self, native._internal, self.device, self.size, self._label())
            del native  # the wrapper holds its own native reference
            ctx._counters["bytes_copied_between_devices"] += self.size
        self.buffer = buf
        self.state = "lent"
        return buf

    def _drop_staging(self) -> None:
        if self._staging is not None:
            if self._promise is not None:
                try:
                    self._staging.unmap()
                except Exception:
                    pass
            if self.ctx._lost_info is None:
                self.ctx._timeline.release_staging(self._staging)
            self._staging = self._promise = None

    def _abort(self) -> None:
        """The import failed or was cancelled: the tensor is not lent after all."""
        if not self.task.done:  # still held back: take it out of the queue
            self.task.body = lambda: None
            tl = self.ctx._timeline
            if self.task in tl.held:
                tl.held.remove(self.task)
        self._drop_staging()
        self._finish_lease()

    def run_sync(self, where: str) -> LentBuffer:
        try:
            if self._promise is not None:
                wait_sync_promise(self._promise, self.ctx._timeline.device_gone)  # without the lock
            with self.ctx._lock, gpu_errors(where):
                return self._complete(where)
        except BaseException:
            with self.ctx._lock:
                self._abort()
            raise

    async def run_async(self, where: str) -> LentBuffer:
        ctx = self.ctx
        try:
            await task_done(ctx, self.task)
            if ctx._lost_info is not None:
                raise InvalidStateError(f"[{where}] the context was lost while the import was pending")
            if self._promise is not None:
                await wait_promise(self._promise, ctx._timeline.device_gone)
            with ctx._lock, gpu_errors(where):
                return self._complete(where)
        except BaseException:
            with ctx._lock:
                self._abort()
            raise

    # -- release --------------------------------------------------------------------------------

    def end(self) -> None:
        """buf.destroy() / buf.release(): idempotent."""
        ctx, t = self.ctx, self.tensor
        with ctx._lock:
            if self.state != "lent":
                return
            self.state = "ending"
            ctx._check_device()  # a destroyed context device loses the context first
            copy = not self.same and ctx._lost_info is None and not t._destroyed
        try:
            # Cross device: the copy back runs on the other device without this context's lock
            # (that device may be another context's, whose lock is taken there: never both).
            data = self._copy_back() if copy else None
            with ctx._lock:
                if data is not None and ctx._lost_info is None and not t._destroyed:
                    ctx._timeline.write(t._buffer, data, self.size, "bytes_copied_between_devices")
        finally:
            with ctx._lock:
                self.buffer._repoint(self.device)
                self._finish_lease()

    def _copy_back(self) -> bytes | None:
        """Wait for the device's work on the buffer (map a staging copy) and return its bytes;
        None when the device is gone (the tensor keeps its pre-import contents). end() writes
        them into the tensor through the context's queue, ahead of the held-back ML work."""
        dev = self.device
        state = _device_state(dev)
        with device_lock(dev):  # the device's destroy() takes it too: never a submit on a destroyed device
            if device_destroyed(dev):
                return None
            pool = state["staging"].setdefault(self.size, [])
            st = (
                pool.pop()
                if pool
                else dev.create_buffer(
                    label="mltensor-lease-copyback",
                    size=self.size,
                    usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
                )
            )
            enc = dev.create_command_encoder()
            enc.copy_buffer_to_buffer(self.buffer, 0, st, 0, self.size)
            dev.queue.submit([enc.finish()])
            promise = st.map_async(wgpu.MapMode.READ, 0, self.size)
        try:
            wait_sync_promise(promise, lambda: device_destroyed(dev))
            return bytes(st.read_mapped(0, self.size, copy=False))
        except DeviceGone:
            return None  # destroyed meanwhile: the tensor keeps its pre-import contents
        finally:
            with device_lock(dev):
                if st.map_state == "mapped":
                    st.unmap()
                if len(pool) < 2 and st.map_state == "unmapped":
                    pool.append(st)
                elif not device_destroyed(dev):
                    st.destroy()

    def _finish_lease(self) -> None:
        self.state = "ended"
        t, ctx = self.tensor, self.ctx
        if getattr(t, "_lease", None) is self:
            t._lease = None
        if t._exported is self:
            t._exported = None
        tl = ctx._timeline
        tl.lent.discard(t)
        if ctx._lost_info is None:
            tl.resume()


def _begin(device: object, tensor: object, where: str, asynchronous: bool) -> tuple[_Lease, bool]:
    if not isinstance(device, wgpu.GPUDevice):
        raise TypeError(f"[{where}] device must be a wgpu.GPUDevice, got {type(device).__name__}")
    if not isinstance(tensor, MLTensor):
        raise TypeError(f"[{where}] tensor must be an MLTensor, got {type(tensor).__name__}")
    if not isinstance(device, _native.GPUDevice):
        raise TypeError(f"[{where}] device must be a device of wgpu's native backend")
    if not tensor._importable:
        raise TypeError(f"[{where}] the tensor was not created with importable_to_webgpu=True")
    if device_destroyed(device):
        raise InvalidStateError(f"[{where}] the GPUDevice is destroyed")
    ctx = tensor._context
    with ctx._lock, gpu_errors(where):
        return _begin_locked(ctx, device, tensor, where, asynchronous)


def _begin_locked(
    ctx: Any, device: Any, tensor: MLTensor, where: str, asynchronous: bool, rent: bool = False
) -> tuple[_Lease, bool]:
    ctx._check(where)
    if tensor._destroyed:
        raise InvalidStateError(f"[{where}] the tensor is destroyed")
    lease = getattr(tensor, "_lease", None)
    if rent and lease is not None:
        raise TypeError(
            f"[{where}] the tensor is already exported (or its export is pending); destroy() "
            "the GPUBuffer export_to_gpu returned first"
        )
    if lease is not None:
        if lease.state == "pending":
            raise TypeError(f"[{where}] an import of this tensor has not resolved yet")
        if lease.state == "ending":
            raise TypeError(f"[{where}] a release of this tensor has not finished yet")
        if lease.device is not device:
            raise TypeError(f"[{where}] the tensor is already lent to another GPUDevice")
        return lease, True
    lease = _Lease(tensor, device, rent)
    tl = ctx._timeline
    if not asynchronous and tl.hold_reason(lease.task) == "lease":
        raise InvalidStateError(
            f"[{where}] the tensor depends on work held back behind another lent tensor; release "
            f"that lease first, or use {where}_async, which resolves after it"
        )
    tensor._lease = lease
    if rent:  # from this call on, WebNN use of the tensor fails (call order)
        tensor._exported = lease
        for cb in tensor._on_destroy:  # graphs forget it was validated for their fast paths
            cb(tensor)
    tl.enqueue(lease.task)
    if not asynchronous:  # held behind another thread's read mapping tensors in place: it ends soon
        while not lease.task.done:
            ctx._check(where)
            if lease.task.lease:
                tl.held.remove(lease.task)
                tensor._lease = None
                if tensor._exported is lease:
                    tensor._exported = None
                raise InvalidStateError(
                    f"[{where}] the tensor depends on work held back behind another lent tensor; release "
                    f"that lease first, or use {where}_async, which resolves after it"
                )
            tl.changed.wait()
    return lease, False


# IDL (WebGPU, MLTensor explainer): GPUBuffer importExternalBuffer(GPUExternalBufferDescriptor descriptor);
def import_external_buffer_sync(device: wgpu.GPUDevice, tensor: MLTensor) -> wgpu.GPUBuffer:
    """Lend `tensor` to a WebGPU device (the MLTensor explainer's ``importExternalBuffer``). While
    lent, ML work touching the tensor is held back and runs, in call order, after the release:
    ``buf.destroy()`` or ``buf.release()`` returns the tensor with the device's writes in it.
    On the context's own device the buffer is the tensor's memory (zero-copy); on another device
    the tensor is copied there at import and back at release.

    Parameters
    ----------
    device : wgpu.GPUDevice
        A device of wgpu's native backend: the context's own (``ctx.device``) or another one.
    tensor : MLTensor
        A tensor created with ``importable_to_webgpu=True``. Importing a tensor already lent to
        the same device returns the same buffer.

    Returns
    -------
    wgpu.GPUBuffer
        A buffer of usage STORAGE | COPY_SRC | COPY_DST over the tensor's bytes.

    Raises
    ------
    TypeError
        `device` is not a native wgpu device, `tensor` not an MLTensor or not created
        importable, lent to another device already, or its previous import or release has not
        finished.
    InvalidStateError
        The device or the tensor is destroyed, the context lost, or the tensor depends on work
        held back behind another lent tensor (the async form waits for that instead).
    """
    where = "import_external_buffer"
    lease, again = _begin(device, tensor, where, False)
    if again:
        return lease.buffer
    return lease.run_sync(where)


def import_external_buffer_async(device: wgpu.GPUDevice, tensor: MLTensor) -> Awaitable[wgpu.GPUBuffer]:
    where = "import_external_buffer"
    lease, again = _begin(device, tensor, where, True)

    async def existing() -> Any:
        return lease.buffer

    return awaitable(existing() if again else lease.run_async(where))


import_external_buffer_async.__doc__ = async_doc(
    import_external_buffer_sync,
    "Awaitable[wgpu.GPUBuffer]\n    The buffer, once any held-back work the tensor depends on has run.",
)


# IDL (WebNN interop, webnn PR #942): Promise<GPUBuffer> exportToGPU(MLTensor tensor);
def export_to_gpu(ctx: Any, tensor: object, asynchronous: bool) -> LentBuffer | Awaitable[LentBuffer]:
    """MLContext.export_to_gpu_sync/_async: rent an exportable tensor to its device."""
    where = "export_to_gpu"
    if not isinstance(tensor, MLTensor):
        raise TypeError(f"[{where}] tensor must be an MLTensor, got {type(tensor).__name__}")
    with ctx._lock, gpu_errors(where):
        ctx._check(where)
        if tensor._context is not ctx:
            raise TypeError(f"[{where}] the tensor was not created by this context")
        if tensor._export_device is None:
            raise TypeError(
                f"[{where}] the tensor was not created by create_exportable_tensor (it cannot be exported to WebGPU)"
            )
        if tensor._destroyed:
            raise InvalidStateError(f"[{where}] the tensor is destroyed")
        device = tensor._export_device
        if device_destroyed(device):
            raise InvalidStateError(f"[{where}] the tensor's GPUDevice is destroyed")
        lease, _ = _begin_locked(ctx, device, tensor, where, asynchronous, rent=True)
    if not asynchronous:
        return lease.run_sync(where)
    return awaitable(lease.run_async(where))


__all__ = ["import_external_buffer_sync", "import_external_buffer_async", "LentBuffer"]
