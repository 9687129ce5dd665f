"""The context timeline: every write, dispatch, read, import, release and destroy in call order.

Each task names the tensors it reads and writes. A task runs (records GPU commands) at once unless
it touches a lent tensor or conflicts with a task already held back (read-after-write,
write-after-read, write-after-write); held tasks run in call order when a lease ends. GPU commands
of running tasks go into one open command encoder (and one open compute pass), submitted when
something waits on the GPU or after a bounded batch: one submit per flush, not per dispatch.

Reads copy into pooled MAP_READ staging buffers; after the submit all pending reads are mapped at
once, so several reads complete in parallel, and the mapped memory is copied once, straight into
the numpy result.
"""

import asyncio
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import wgpu

from ..errors import InvalidStateError

BATCH_LAUNCHES = 4096  # submit after this many kernel launches even if nothing waits
_MIN_STAGING = 4096


def _native_factories():
    """Encoder and compute-pass constructors. On wgpu-native: the C calls with descriptors built
    once, wrapped in wgpu-py's own classes (which end, finish and release them as usual): wgpu-py's
    methods build the descriptor structs on every call, and on lavapipe that took half of a
    200-kernel dispatch's fixed cost (encoder + pass 62 -> 28-31 us measured). Elsewhere wgpu-py's
    methods."""
    try:
        from wgpu.backends.wgpu_native._api import (GPUCommandEncoder, GPUComputePassEncoder, new_struct_p,
                                                    to_c_string_view)
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
        return GPUComputePassEncoder("", lib.wgpuCommandEncoderBeginComputePass(encoder._internal, pdesc),
                                     encoder._device)

    return create, begin


def handle_address(handle):
    """Integer address of a raw wgpu-native handle (0 for None or another backend's objects)."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi

        return int(ffi.cast("uintptr_t", handle)) if handle is not None else 0
    except Exception:
        return 0


_factories = _native_factories()
_create_encoder, _begin_pass = _factories or (lambda d: d.create_command_encoder(),
                                              lambda e: e.begin_compute_pass())


class Task:
    __slots__ = ("reads", "writes", "body", "done", "_waiters")

    def __init__(self, reads, writes, body):
        self.reads = frozenset(reads)
        self.writes = frozenset(writes)
        self.body = body
        self.done = False
        self._waiters = []

    def run(self):
        self.body()
        self.done = True
        for w in self._waiters:
            w()
        self._waiters = []

    def on_done(self, callback):
        if self.done:
            callback()
        else:
            self._waiters.append(callback)


class Timeline:
    def __init__(self, device, counters):
        self.device = device
        self.queue = device.queue
        self.counters = counters
        self._encoder = None
        self._pass = None
        self._raw_pass = None
        self._raw_pass_addr = 0
        self._pass_state = [None, None]  # raw pipeline and bind group 0 set in the open pass
        self._unsubmitted_writes = False  # a queue.write_buffer since the last submit
        self._touched = set()  # buffers used by commands in the open encoder
        self._kept = []  # objects recorded commands refer to (released after the submit)
        self._launches = 0
        self._after_submit = []  # callbacks run right after the next submit
        self.held = []  # tasks held back, in call order
        self.lent = set()  # tensors lent to a GPUDevice (interop)
        self._staging = {}  # size -> [free MAP_READ buffers]

    # -- tasks ---------------------------------------------------------------------------------

    def enqueue(self, task):
        """Run `task` now, or hold it back behind lent tensors. Returns True if it ran."""
        if self._must_hold(task):
            self.held.append(task)
            return False
        task.run()
        return True

    def _must_hold(self, task):
        if not self.lent and not self.held:
            return False
        if (task.reads | task.writes) & self.lent:
            return True
        for h in self.held:
            if task.writes & (h.reads | h.writes) or task.reads & h.writes:
                return True
        return False

    def resume(self):
        """Run held tasks that no longer need to wait (after a lease ended), in call order."""
        pending, self.held = self.held, []
        for t in pending:
            self.enqueue(t)

    # -- command recording ---------------------------------------------------------------------

    def compute_pass(self):
        """The open compute pass (wgpu-py object); whoever asks will set its own state."""
        p = self._open_pass()
        self._pass_state[0] = self._pass_state[1] = None
        return p

    def native_pass(self):
        """Raw handle of the open compute pass. self._pass_state holds [pipeline, bind group 0]
        set in it: graph replay skips setting what is already set and updates the list."""
        if self._pass is None:
            self._open_pass()
        return self._raw_pass

    def _open_pass(self):
        if self._pass is None:
            self._pass = _begin_pass(self._open_encoder())
            self._raw_pass = getattr(self._pass, "_internal", None)
            self._raw_pass_addr = handle_address(self._raw_pass)  # for the compiled replay loop
            self._pass_state = [None, None]
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
        """Run `callback` after the open encoder is submitted (at once if none is open)."""
        if self._encoder is None:
            callback()
        else:
            self._after_submit.append(callback)

    def flush(self):
        if self._encoder is None and self._unsubmitted_writes:
            # queue.write_buffer lands with the next submit: maps (requested without wgpu-py's
            # own empty submit, see PendingRead._map) must come after one
            self._open_encoder()
        self._unsubmitted_writes = False
        if self._encoder is not None:
            if self._pass is not None:
                self._pass.end()
                self._pass = None
            cb = self._encoder.finish()
            self._encoder = None
            self.queue.submit([cb])
            self.counters["submits"] += 1
        self._touched.clear()
        self._kept = []
        self._launches = 0
        callbacks, self._after_submit = self._after_submit, []
        for cb in callbacks:
            cb()

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


_PARALLEL_COPY = 8 << 20  # bytes: above this, the host copy is split across threads
_copy_pool = None


def _copy(dst, src):
    """dst[:] = src, in parallel chunks for large reads: the copy into fresh memory is bound by
    page faults, which cores take in parallel (numpy releases the GIL while it copies)."""
    global _copy_pool
    n = src.nbytes
    workers = min(4, os.cpu_count() or 1)
    if n < _PARALLEL_COPY or workers < 2:
        dst[:] = src
        return
    if _copy_pool is None:
        _copy_pool = ThreadPoolExecutor(workers - 1, thread_name_prefix="mltensor-copy")
    step = -(-n // workers) + 4095 & ~4095  # page-aligned chunks

    def part(k):
        dst[k * step:(k + 1) * step] = src[k * step:(k + 1) * step]

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
    once from mapped memory into the result."""

    def __init__(self, ctx, tensor, out):
        self.ctx = ctx
        self.tensor = tensor
        self.out = out
        self.staging = None
        self.promise = None
        self.size = tensor._buffer.size
        self.direct = False  # mapped in place by wait_sync (see MLContext._start_read)
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
        self.promise = self.staging.map_async("READ_NOSYNC", 0, self.size)

    def _check(self, where):
        if self.ctx._lost_info is not None:
            raise InvalidStateError(f"[{where}] the context was lost while the read was pending")
        if self.tensor._destroyed:
            raise InvalidStateError(f"[{where}] the tensor was destroyed while the read was pending")

    def _finish(self, where):
        try:
            self._check(where)
            return self._copy_out(self.staging)
        finally:
            self._release()

    def read_mapped_tensor(self, where):
        """Synchronous read of a tensor created mappable (CPU adapters): map the tensor itself.
        Safe because nothing else can be recorded while this call blocks."""
        self.ctx._timeline.flush()  # also submits pending queue writes (Timeline.flush)
        buf = self.tensor._buffer
        buf.map_async("READ_NOSYNC", 0, self.size).sync_wait()
        try:
            return self._copy_out(buf)
        finally:
            buf.unmap()

    def _copy_out(self, mapped):
        t = self.tensor
        nbytes = t._nbytes
        mv = mapped.read_mapped(0, self.size, copy=False)
        src = np.frombuffer(mv, dtype=np.uint8, count=nbytes)
        if self.out is None:
            block = _host_pool.take(nbytes)
            _copy(block, src)
            result = block.view(t._np_dtype).reshape(t.shape)
        else:
            _copy(np.frombuffer(self.out, dtype=np.uint8, count=nbytes), src)
            result = None
        del mv, src
        self.ctx._counters["bytes_downloaded"] += nbytes
        return result

    def _release(self):
        if self.staging is not None:
            if self.promise is not None:
                try:
                    self.staging.unmap()
                except Exception:
                    pass
            self.ctx._timeline.release_staging(self.staging)
            self.staging = None

    def wait_sync(self, where):
        if self.direct:
            return self.read_mapped_tensor(where)
        if not self.task.done:
            self._check(where)
            raise InvalidStateError(
                f"[{where}] the tensor is held back behind a tensor lent to a GPUDevice; release "
                "the lease first, or use read_tensor_async, which resolves after the release"
            )
        if self.promise is None:
            self.ctx._timeline.flush()
        try:
            self.promise.sync_wait()
        except Exception:
            self._release()
            self._check(where)
            raise
        return self._finish(where)

    async def wait_async(self, where):
        if not self.task.done:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            self.task.on_done(lambda: fut.done() or fut.set_result(None))
            self.ctx._read_waiters.add(fut)
            try:
                await fut
            finally:
                self.ctx._read_waiters.discard(fut)
        if self.staging is None:  # never recorded: the context was lost while it was held
            self._check(where)
        if self.promise is None:
            self.ctx._timeline.flush()
        # Wait for the mapping even when the read will reject, so the staging buffer is
        # returned in a known state and no callback fires into a closed event loop later.
        try:
            await self.promise
        except Exception:
            self._release()
            self._check(where)
            raise
        return self._finish(where)
