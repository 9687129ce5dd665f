"""The context timeline: every write, dispatch, read, import, release and destroy in call order.

Each task names the tensors it reads and writes. A task runs (records GPU commands) at once unless
it touches a tensor that is busy (lent to a GPUDevice, or mapped in place by a read) or conflicts
with a task already held back (read-after-write, write-after-read, write-after-write); held tasks
run in call order when the lease or the mapping ends. GPU commands of running tasks go into one
open command encoder (and one open compute pass), submitted when something waits on the GPU or
after a bounded batch: one submit per flush, not per dispatch.

Reads copy into pooled MAP_READ staging buffers; after the submit all pending reads are mapped at
once, so several reads complete in parallel, and the mapped memory is copied once, straight into
the numpy result.

Threads (API.md, "Threads"). One re-entrant lock per GPU device (`device_lock`, shared by every
context on it) guards everything here: callers hold it from validation to the last recorded
command, so the order of calls is the order of work, across threads as within one. Nothing waits
for the GPU while holding it: maps are requested under the lock and waited on outside it. Two
things would abort the interpreter instead of raising (wgpu-native panics on an invalid
`queue.submit`), and the timeline makes both impossible:
- a submit that uses a mapped (or map-pending) buffer: a tensor mapped in place by a read is
  busy, so work touching it is held back until the read unmaps it, never recorded meanwhile;
  flush also refuses (OperationError) to submit a batch touching a buffer that is not unmapped;
- a submit on a destroyed device: flush checks it under the device lock, which the device's own
  `destroy()` takes as well (see device_lock).
"""

import asyncio
import os
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import wgpu

from ..errors import InvalidStateError, OperationError

BATCH_LAUNCHES = 4096  # submit after this many kernel launches even if nothing waits
_MIN_STAGING = 4096
_MIN_ALIGN = 4


def _native_factories():
    """Encoder and compute-pass constructors. On wgpu-native: the C calls with descriptors built
    once, wrapped in wgpu-py's own classes (which end, finish and release them as usual): wgpu-py's
    methods build the descriptor structs on every call, and on lavapipe that took half of a
    200-kernel dispatch's fixed cost (encoder + pass 62 -> 28-31 us measured). Elsewhere wgpu-py's
    methods."""
    try:
        from wgpu.backends.wgpu_native._api import (
            GPUCommandEncoder,
            GPUComputePassEncoder,
            new_struct_p,
            to_c_string_view,
        )
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        edesc = new_struct_p("WGPUCommandEncoderDescriptor *", label=to_c_string_view(""))
        pdesc = new_struct_p("WGPUComputePassDescriptor *", label=to_c_string_view(""), timestampWrites=ffi.NULL)
    except Exception:  # another wgpu-py layout: its methods
        return None

    def create(device):
        if not type(device).__module__.startswith("wgpu.backends.wgpu_native"):
            return device.create_command_encoder()
        return GPUCommandEncoder("", lib.wgpuDeviceCreateCommandEncoder(device._internal, edesc), device)

    def begin(encoder):
        if not isinstance(encoder, GPUCommandEncoder):
            return encoder.begin_compute_pass()
        return GPUComputePassEncoder(
            "", lib.wgpuCommandEncoderBeginComputePass(encoder._internal, pdesc), encoder._device
        )

    return create, begin


def handle_address(handle):
    """Integer address of a raw wgpu-native handle (0 for None or another backend's objects)."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi

        return int(ffi.cast("uintptr_t", handle)) if handle is not None else 0
    except Exception:
        return 0


_factories = _native_factories()
_create_encoder, _begin_pass = _factories or (lambda d: d.create_command_encoder(), lambda e: e.begin_compute_pass())


_locks_guard = threading.Lock()


def device_lock(device):
    """The re-entrant lock of a GPU device, shared by every context (and lend) on it.

    Made on first use and kept on the device object. Its `destroy()` is wrapped (on this object
    only) to take the lock too: a device destroyed by another thread can then never go between a
    timeline's check that the device is alive and its `queue.submit`, which wgpu-native turns into
    a process abort on a destroyed device."""
    lock = getattr(device, "_mltensor_lock", None)
    if lock is not None:
        return lock
    with _locks_guard:
        lock = getattr(device, "_mltensor_lock", None)
        if lock is None:
            lock = threading.RLock()
            ref = weakref.ref(device)  # no cycle through the wrapper: the device stays collectable
            cls_destroy = type(device).destroy

            def destroy():
                d = ref()
                if d is not None:
                    with lock:
                        cls_destroy(d)

            try:
                device.destroy = destroy
            except AttributeError:  # a device class without instance attributes: unguarded
                pass
            device._mltensor_lock = lock
    return lock


class Task:
    """One call's work: the tensors (or other objects, see MLGraph.destroy) it reads and writes,
    and the body that records it. `lease` says why a held task waits: True behind a lent tensor
    (only the user's release ends that), False behind a read's mapping (ends by itself)."""

    __slots__ = ("reads", "writes", "body", "done", "lease", "error", "_waiters")

    def __init__(self, reads, writes, body):
        self.reads = frozenset(reads)
        self.writes = frozenset(writes)
        self.body = body
        self.done = False
        self.lease = False
        self.error = None  # what the body raised when it ran late (resumed by another call)
        self._waiters = []

    def run(self, capture=False):
        """Run the body. capture: keep an exception in `error` instead of raising it (a held task
        run by another call's resume(): its own caller learns of it when it waits)."""
        try:
            self.body()
        except Exception as e:
            if not capture:
                raise
            self.error = e
        self.done = True
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            w()

    def on_done(self, callback):
        """callback() once the task ran (now if it has); called with the timeline's lock held, on
        whichever thread ran the task."""
        if self.done:
            callback()
        else:
            self._waiters.append(callback)


class Timeline:
    """The work of one context. Every method expects the caller to hold `lock` (the device's)."""

    def __init__(self, device, counters, device_gone=None):
        self.device = device
        self.queue = device.queue
        self.counters = counters
        self.lock = device_lock(device)
        self.changed = threading.Condition(self.lock)  # held tasks ran, a mapping ended, lost
        # A user's device may be destroyed under us: device_gone() then says so (None for an own
        # device); flush never submits on it and waits for maps give up (wait_sync_promise).
        self.device_gone = device_gone
        self.on_gone = None  # called with a message when a submit finds the device gone (the context's)
        self._encoder = None
        self._pass = None
        self._raw_pass = None
        self._raw_pass_addr = 0
        # raw pipeline and bind group 0 set in the open pass, and (LaunchData, byte offset) of
        # the immediates set last (front/graph.py _record_imm)
        self._pass_state: list[Any] = [None, None, None]
        self._unsubmitted_writes = False  # a queue.write_buffer since the last submit
        self._touched = set()  # buffers used by commands in the open encoder
        self._kept = []  # objects recorded commands refer to (released after the submit)
        self._launches = 0
        self._after_submit = []  # callbacks run right after the next submit
        self.flush_error = None  # while after-submit callbacks run: the submit's failure, if any
        self.held = []  # tasks held back, in call order
        self.lent = set()  # tensors lent to a GPUDevice (interop)
        self.mapped = set()  # tensors mapped in place by a synchronous read (CPU adapters)
        self._staging = {}  # size -> [free MAP_READ buffers]

    # -- tasks ---------------------------------------------------------------------------------

    def enqueue(self, task):
        """Run `task` now, or hold it back behind busy tensors. Returns True if it ran."""
        reason = self.hold_reason(task)
        if reason is not None:
            task.lease = reason == "lease"
            self.held.append(task)
            return False
        task.run()
        return True

    def hold_reason(self, task):
        """None when `task` may run now; else "lease" when it waits, directly or behind held work,
        for a tensor lent to a GPUDevice, or "map" when it only waits for a read that mapped a
        tensor in place (a submit using a mapped buffer would abort the process)."""
        if not self.lent and not self.held and not self.mapped:
            return None
        touched = task.reads | task.writes
        if touched & self.lent:
            return "lease"
        reason = "map" if touched & self.mapped else None
        for h in self.held:
            if task.writes & (h.reads | h.writes) or task.reads & h.writes:
                if h.lease:
                    return "lease"
                reason = "map"
        return reason

    def resume(self):
        """Run held tasks that no longer need to wait (after a lease or a mapping ended), in call
        order, and wake the threads waiting for them."""
        pending, self.held = self.held, []
        for t in pending:
            reason = self.hold_reason(t)
            if reason is not None:
                t.lease = reason == "lease"
                self.held.append(t)
            else:
                t.run(capture=True)
        self.changed.notify_all()

    def unmapped(self, tensor):
        """A read's in-place mapping of `tensor` ended: work held behind it runs."""
        self.mapped.discard(tensor)
        self.resume()

    # -- command recording ---------------------------------------------------------------------

    def compute_pass(self):
        """The open compute pass (wgpu-py object); whoever asks will set its own state."""
        p = self._open_pass()
        self._pass_state[0] = self._pass_state[1] = self._pass_state[2] = None
        return p

    def native_pass(self):
        """Raw handle of the open compute pass. self._pass_state holds [pipeline, bind group 0,
        immediates] set in it: graph replay skips setting what is already set and updates the list."""
        if self._pass is None:
            self._open_pass()
        return self._raw_pass

    def _open_pass(self):
        if self._pass is None:
            self._pass = _begin_pass(self._open_encoder())
            self._raw_pass = getattr(self._pass, "_internal", None)
            self._raw_pass_addr = handle_address(self._raw_pass)  # for the compiled replay loop
            self._pass_state = [None, None, None]
        return self._pass

    def _open_encoder(self):
        if self._encoder is None:
            self._encoder = _create_encoder(self.device)
        return self._encoder

    def encoder(self):
        """The open encoder for copy commands (ends the open compute pass)."""
        if self._pass is not None:
            self._pass.end()
            self._pass = None
        return self._open_encoder()

    def keep(self, obj):
        """Hold a reference until the open encoder is submitted."""
        self._kept.append(obj)

    def touch(self, buffers):
        self._touched.update(buffers)

    def uses(self, buffer):
        return buffer in self._touched

    def launched(self, n):
        self.counters["kernel_launches"] += n
        self._launches += n
        if self._launches >= BATCH_LAUNCHES:
            self.flush()

    def after_submit(self, callback):
        """Run `callback` after the open encoder is submitted (at once if none is open). While it
        runs, `flush_error` holds the submit's failure (None when the work was submitted)."""
        if self._encoder is None:
            callback()
        else:
            self._after_submit.append(callback)

    def flush(self):
        """Submit the open encoder. The state is reset before anything can fail, so a failure
        leaves the timeline usable: the batch is dropped, the reads recorded in it reject (their
        after-submit callbacks see `flush_error`), and OperationError (InvalidStateError for a
        destroyed device) is raised. Nothing invalid reaches `queue.submit`, whose validation
        errors abort the process in wgpu-native."""
        if self._encoder is None and self._unsubmitted_writes:
            # queue.write_buffer lands with the next submit: maps (requested without wgpu-py's
            # own empty submit, see PendingRead._map) must come after one
            self._open_encoder()
        self._unsubmitted_writes = False
        encoder, cpass, touched = self._encoder, self._pass, self._touched
        self._encoder = self._pass = None
        self._touched = set()
        kept, self._kept = self._kept, []
        self._launches = 0
        callbacks, self._after_submit = self._after_submit, []
        error = None
        if encoder is not None:
            try:
                if cpass is not None:
                    cpass.end()
                cb = encoder.finish()
                if self.device_gone is not None and self.device_gone():
                    raise InvalidStateError("[submit] the GPUDevice was destroyed; the work was dropped")
                busy = [b.label for b in touched if b.map_state != "unmapped"]
                if busy:  # a bug if it ever happens: refuse rather than abort
                    raise OperationError(f"[submit] buffers still mapped: {busy}; the work was dropped")
                self.queue.submit([cb])
                self.counters["submits"] += 1
            except InvalidStateError as e:
                error = e
            except Exception as e:
                if self.device_gone is not None and self.device_gone():  # destroyed mid-flush
                    error = InvalidStateError("[submit] the GPUDevice was destroyed; the work was dropped")
                else:
                    error = (
                        e
                        if isinstance(e, OperationError)
                        else OperationError(
                            f"[submit] the GPU rejected work recorded by earlier calls: {type(e).__name__}: {e}"
                        )
                    )
        self.flush_error = error
        try:
            for cb in callbacks:
                cb()
        finally:
            self.flush_error = None
        del kept
        if error is not None:
            if isinstance(error, InvalidStateError) and self.on_gone is not None:
                # the user's device was destroyed between a call's check and this submit: the
                # context is lost from here on, as if that check had seen it (MLContext._lose
                # re-enters flush, which has nothing left to submit)
                self.on_gone("the GPUDevice was destroyed")
            raise error

    # -- transfers -----------------------------------------------------------------------------

    def write(self, buffer, data, nbytes, counter="bytes_uploaded"):
        """queue.write_buffer goes ahead of unsubmitted commands, so submit first if they use it."""
        if buffer in self._touched:
            self.flush()
        self.queue.write_buffer(buffer, 0, data)
        self._unsubmitted_writes = True
        self.counters[counter] += nbytes

    def acquire_staging(self, size):
        cap = max(_MIN_STAGING, 1 << (size - 1).bit_length())
        free = self._staging.get(cap)
        if free:
            return free.pop()
        return self.device.create_buffer(
            label="mltensor-readback",
            size=cap,
            usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST,
        )

    def release_staging(self, buf):
        if buf.map_state != "unmapped":  # a map that never resolved: not reusable
            return
        free = self._staging.setdefault(buf.size, [])
        if len(free) < 4:
            free.append(buf)
        else:
            buf.destroy()

    def drop_staging(self):
        for free in self._staging.values():
            for b in free:
                b.destroy()
        self._staging.clear()


_GONE_POLL = 0.05  # seconds between checks that a user's device still exists, while waiting


class DeviceGone(InvalidStateError):
    """A wait gave up: the device was destroyed, so the promise will never resolve."""


def wait_sync_promise(promise, gone=None):
    """promise.sync_wait(), but giving up with DeviceGone once `gone()` says the device was
    destroyed: wgpu-py's destroy() stops the poll thread, and a pending map then never resolves."""
    if gone is not None:
        ev = promise._thread_event
        while not ev.wait(_GONE_POLL):
            if gone():
                raise DeviceGone("the GPUDevice was destroyed while waiting for it")
    return promise.sync_wait()


async def wait_promise(promise, gone=None):
    """Await a wgpu promise from any thread's event loop (giving up as wait_sync_promise does).
    wgpu-py resolves a promise through the loop of the thread that created it; a map requested
    by another thread's flush belongs to that thread's loop (or none), so it is waited for on an
    executor thread instead."""
    loop = asyncio.get_running_loop()
    own_loop = promise._call_soon_threadsafe == loop.call_soon_threadsafe
    if own_loop and gone is None:
        return await promise
    task = loop.create_task(_awaited(promise)) if own_loop else None
    while True:
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=_GONE_POLL)
            if done:
                return task.result()
        elif await loop.run_in_executor(None, promise._thread_event.wait, _GONE_POLL):
            return promise.sync_wait()
        if gone is not None and gone():
            if task is not None:
                task.cancel()
            raise DeviceGone("the GPUDevice was destroyed while waiting for it")


async def _awaited(promise):
    return await promise


def wake_future(loop, fut):
    """A callable that resolves `fut` (of `loop`) from any thread, once."""
    return lambda: loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))


async def task_done(ctx, task):
    """Return once `task` has run (at once if it has), or the context is lost (which wakes every
    such waiter through ctx._read_waiters); the task may be run by any thread's call."""
    with ctx._lock:
        if task.done:
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        wake = wake_future(loop, fut)
        task.on_done(wake)
        ctx._read_waiters.add(wake)
    try:
        await fut
    finally:
        ctx._read_waiters.discard(wake)


_PARALLEL_COPY = 8 << 20  # bytes: above this, the host copy is split across threads
_copy_pool = None
_copy_pool_lock = threading.Lock()


def _copy(dst, src):
    """dst[:] = src, in parallel chunks for large reads: the copy into fresh memory is bound by
    page faults, which cores take in parallel (numpy releases the GIL while it copies)."""
    global _copy_pool
    n = src.nbytes
    workers = min(4, os.cpu_count() or 1)
    if n < _PARALLEL_COPY or workers < 2:
        dst[:] = src
        return
    with _copy_pool_lock:
        if _copy_pool is None:
            _copy_pool = ThreadPoolExecutor(workers - 1, thread_name_prefix="mltensor-copy")
    step = -(-n // workers) + 4095 & ~4095  # page-aligned chunks

    def part(k):
        dst[k * step : (k + 1) * step] = src[k * step : (k + 1) * step]

    futures = [_copy_pool.submit(part, k) for k in range(1, workers)]
    part(0)
    for f in futures:
        f.result()


class _HostPool:
    """Recycled host memory for large read results.

    Writing into fresh memory costs about twice the copy itself (the kernel faults in and zeroes
    every page), and real-time loops read the same sizes every frame. A block is handed out again
    only when no array refers to it any more: numpy views keep their owner (the block) as `base`,
    so the block's reference count shows whether any result, or view of one, is alive."""

    MIN_BYTES = 1 << 20
    CAP_BYTES = 256 << 20  # at most this much is kept for reuse

    def __init__(self):
        self._blocks = []
        self._lock = threading.Lock()

    def take(self, nbytes):
        if nbytes < self.MIN_BYTES:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            blocks = self._blocks
            for i in range(len(blocks)):
                b = blocks[i]
                # references: the list, `b`, getrefcount's argument -> nothing else holds it
                if b.nbytes == nbytes and sys.getrefcount(b) == 3:
                    return b
            block = np.empty(nbytes, np.uint8)
            total = sum(b.nbytes for b in blocks) + nbytes
            if total > self.CAP_BYTES:  # forget blocks nobody uses, oldest first
                keep = []
                for i in range(len(blocks)):
                    b = blocks[i]
                    if total > self.CAP_BYTES and sys.getrefcount(b) == 3:
                        total -= b.nbytes
                    else:
                        keep.append(b)
                self._blocks = blocks = keep
            if total <= self.CAP_BYTES:
                blocks.append(block)
            return block


_host_pool = _HostPool()


class PendingRead:
    """A read_tensor in flight: copy recorded by its task, mapped after the submit, then copied
    once from mapped memory into the result. Or, on CPU adapters, for a synchronous read of a
    tensor created mappable: the tensor itself mapped in place (`start_direct`), busy until the
    copy is done, so no other call's work on it is recorded meanwhile."""

    def __init__(self, ctx, tensor, out):
        self.ctx = ctx
        self.tensor = tensor
        self.out = out
        self.staging = None
        self.promise = None
        self.error = None  # the submit of the copy failed (Timeline.flush)
        # the tensor's shape at the call (a resizable one may change before the read completes)
        self.shape, self.nbytes = tensor._shape, tensor._nbytes
        self.size = min(tensor._buffer.size, max(_MIN_ALIGN, (self.nbytes + 3) & ~3))
        self.direct = False  # mapped in place (start_direct)
        self.task = Task((tensor,), (), self._record)

    def _record(self):
        tl = self.ctx._timeline
        self.staging = tl.acquire_staging(self.size)
        tl.encoder().copy_buffer_to_buffer(self.tensor._buffer, 0, self.staging, 0, self.size)
        tl.touch((self.tensor._buffer, self.staging))
        tl.after_submit(self._map)

    def _map(self):
        # Requested right after the submit holding the copy. "READ_NOSYNC": wgpu-py would
        # otherwise submit an empty command buffer first (a workaround for maps of never-submitted
        # buffers, wgpu-native#305); ours always follow the submit of their copy.
        error = self.ctx._timeline.flush_error
        if error is not None:
            self.error = error
            return
        self.promise = self.staging.map_async("READ_NOSYNC", 0, self.size)

    def start_direct(self):
        """Map the tensor itself (lock held): everything before the read is submitted first, and
        the tensor stays busy (Timeline.mapped) until _release unmaps it."""
        tl = self.ctx._timeline
        tl.flush()  # also submits pending queue writes (Timeline.flush)
        tl.mapped.add(self.tensor)
        try:
            self.promise = self.tensor._buffer.map_async("READ_NOSYNC", 0, self.size)
        except BaseException:
            tl.unmapped(self.tensor)
            raise
        self.direct = True

    def _check(self, where):
        if self.ctx._lost_info is not None:
            raise InvalidStateError(f"[{where}] the context was lost while the read was pending")
        if self.tensor._destroyed:
            raise InvalidStateError(f"[{where}] the tensor was destroyed while the read was pending")

    def _failed(self, where):
        err = self.error or self.task.error
        if isinstance(err, InvalidStateError):
            raise InvalidStateError(f"[{where}] {err}") from err
        raise OperationError(f"[{where}] {err}") from err

    def _finish(self, where):
        try:
            self._check(where)
            result = self._copy_out(self.tensor._buffer if self.direct else self.staging)
        except BaseException:
            self._release()
            raise
        self._release(self.nbytes)
        self._check(where)  # lost meanwhile (a user's device destroyed under the read): reject
        return result

    def _copy_out(self, mapped):
        t = self.tensor
        nbytes = self.nbytes
        mv = mapped.read_mapped(0, self.size, copy=False)
        src = np.frombuffer(mv, dtype=np.uint8, count=nbytes)
        if self.out is None:
            block = _host_pool.take(nbytes)
            _copy(block, src)
            result = block.view(t._np_dtype).reshape(self.shape)
        else:
            _copy(np.frombuffer(self.out, dtype=np.uint8, count=nbytes), src)
            result = None
        del mv, src
        return result

    def _release(self, downloaded=0):
        """Unmap and return the staging buffer (or end the in-place mapping); count the bytes."""
        tl = self.ctx._timeline
        with tl.lock:
            self.ctx._counters["bytes_downloaded"] += downloaded
            buf = self.tensor._buffer if self.direct else self.staging
            if buf is not None and buf.map_state == "mapped":
                try:
                    buf.unmap()
                except Exception as e:  # the device is gone: nothing can use the buffer again
                    self.ctx._check_device()
                    self.ctx._lose(f"a read could not unmap its buffer: {' '.join(str(e).split())}")
            if self.direct:
                if buf.map_state == "unmapped":  # never submitted while a map is pending
                    self.direct = False
                    tl.unmapped(self.tensor)
            elif self.staging is not None:
                if self.ctx._lost_info is None:
                    tl.release_staging(self.staging)
                self.staging = None

    def _wait_recorded(self, where):
        """Lock held: return once the read's copy is recorded. A read held behind a mapping
        waits (another thread's read ends it); one held behind a lent tensor raises, since only
        a release, which this thread would make, ends that."""
        tl = self.ctx._timeline
        while not self.task.done:
            self._check(where)
            if self.task.lease:
                raise InvalidStateError(
                    f"[{where}] the tensor is held back behind a tensor lent to a GPUDevice; release "
                    "the lease first, or use read_tensor_async, which resolves after the release"
                )
            tl.changed.wait()

    def wait_sync(self, where: str) -> np.ndarray | None:
        tl = self.ctx._timeline
        if not self.direct:
            with tl.lock:
                self._wait_recorded(where)
                if self.task.error is None and self.error is None and self.promise is None:
                    tl.flush()
        if self.error is not None or self.task.error is not None:
            self._release()
            self._failed(where)
        try:  # without the lock: other threads go on meanwhile
            wait_sync_promise(self.promise, tl.device_gone)
        except Exception as e:
            self._map_failed(e, where)
        except BaseException:
            # an interrupt (Ctrl-C) while the map is pending: the map resolves all the same, and a
            # buffer left mapped would hold back every later use of the tensor for good; wait for
            # it, unmap, then let the interrupt through
            try:
                wait_sync_promise(self.promise, tl.device_gone)
            except Exception:
                pass
            finally:
                self._release()
            raise
        return self._finish(where)

    def _map_failed(self, e, where):
        """A map that rejects or never resolves means the device failed (destroyed, lost, or the
        buffer is gone): the context is lost, so nothing waits on this buffer forever, and the
        read raises."""
        self._release()
        self._check(where)
        if isinstance(e, DeviceGone):
            self.ctx._lose("the GPUDevice was destroyed")
            raise InvalidStateError(f"[{where}] the context is lost (the GPUDevice was destroyed)") from None
        self.ctx._lose(f"a read could not map its buffer: {e}")
        raise OperationError(f"[{where}] the read could not map its buffer (the context is lost): {e}") from e

    async def wait_async(self, where: str) -> np.ndarray | None:
        tl = self.ctx._timeline
        ctx = self.ctx
        await task_done(ctx, self.task)
        with tl.lock:
            if self.staging is None and self.error is None and self.task.error is None:
                self._check(where)  # never recorded: the context was lost while it was held
            if self.task.error is None and self.error is None and self.promise is None:
                tl.flush()
        if self.error is not None or self.task.error is not None:
            self._release()
            self._failed(where)
        # Wait for the mapping even when the read will reject, so the staging buffer is
        # returned in a known state and no callback fires into a closed event loop later.
        try:
            await wait_promise(self.promise, tl.device_gone)
        except Exception as e:
            self._map_failed(e, where)
        return self._finish(where)
