"""Graph constants (weights) held once per context.

Every build uploads its constants through the context's ConstantStore: one GPU buffer per
distinct content (the compute-form bytes, keyed by their SHA-256, element type and length),
shared by every graph that binds the same bytes: the specializations of an InferenceSession
(one per input size), two sessions of one model on one context, the rebuilds of a growing
decode loop. A buffer is freed when the last graph using it is destroyed.

Why content and not provenance: the importers transform weights on the host before the builder
sees them (a BatchNormalization folded into its Conv, a Gemm's transposed B, float16 to float32),
so the same initializer reaches the builder as different arrays, and different initializers can
be equal; the bytes are what a kernel reads. SHA-256 runs at about 1.8 GB/s here (SHA-NI), four
times a host memcpy; it runs without the device lock.

On CPU adapters the bytes are written into the buffer mapped at creation (no staging). Elsewhere
uploads are submitted every UPLOAD_BATCH bytes: queue.write_buffer copies the data into wgpu's
staging memory at once and frees it when the submission holding it completes, so without this a
model's whole weights would sit in staging (host memory) next to their GPU copy until the first
dispatch (on CPU adapters both are host memory).
"""

import hashlib

import numpy as np
import wgpu

from .. import dtypes

UPLOAD_BATCH = 64 << 20


def digest(data):
    """Store key of a compute-form host array: (numpy type, bytes, SHA-256)."""
    raw = _bytes(data)
    return data.dtype.str, raw.nbytes, hashlib.sha256(raw).digest()


def _bytes(data):
    a = np.ascontiguousarray(data)
    return memoryview(a.reshape(-1).view(np.uint8))


class ConstantStore:
    """A context's constant buffers; every method runs with the context's lock held."""

    def __init__(self, device, timeline, counters, direct=False):
        self._device = device
        self._timeline = timeline
        self._counters = counters
        # CPU adapters ("mappable-primary-buffers"): write the weights straight into their
        # buffer, mapped at creation. The staging copy queue.write_buffer makes would be freed
        # back to malloc, which keeps it: RSS held the weights twice.
        self._direct = direct
        self._entries = {}  # key -> [buffer, references]
        self._keys = {}  # id(buffer) -> key
        self._unsubmitted = 0  # bytes written since the last submit

    def acquire(self, key, data):
        """The buffer holding `data` (compute form; `key` = digest(data)), uploaded if no graph
        holds these bytes yet. One reference per call: give it back with release()."""
        e = self._entries.get(key)
        if e is not None:
            e[1] += 1
            return e[0]
        raw = _bytes(data)
        n = raw.nbytes
        if n % 4:  # an odd number of f16 elements: writes are whole words
            raw = memoryview(np.concatenate([np.frombuffer(raw, np.uint8), np.zeros(4 - n % 4, np.uint8)]))
        U = wgpu.BufferUsage
        direct = self._direct and n > 0
        buf = self._device.create_buffer(
            label="mltensor-constant",
            size=dtypes.padded(n),
            usage=U.STORAGE | U.COPY_SRC | (U.MAP_WRITE if direct else U.COPY_DST),
            mapped_at_creation=direct,
        )
        if direct:
            buf.write_mapped(raw)
            buf.unmap()
            self._counters["bytes_uploaded"] += n
        elif n:
            tl = self._timeline
            tl.write(buf, raw, n)
            self._unsubmitted += n
            if self._unsubmitted >= UPLOAD_BATCH:
                tl.flush()
                self._unsubmitted = 0
        self._entries[key] = [buf, 1]
        self._keys[id(buf)] = key
        self._counters["constant_bytes"] += buf.size
        return buf

    def key_of(self, buf):
        """The store key of one of its buffers (None for any other buffer)."""
        return self._keys.get(id(buf))

    def acquire_existing(self, key):
        """acquire() when some graph already holds these bytes, else None (nothing uploaded)."""
        e = self._entries.get(key)
        if e is None:
            return None
        e[1] += 1
        return e[0]

    def release(self, buffers):
        """Drop one reference to each buffer; the last one frees it (after the open batch is
        submitted: work recorded on it still runs)."""
        dead = []
        for buf in buffers:
            key = self._keys.get(id(buf))
            if key is None:
                continue
            e = self._entries[key]
            e[1] -= 1
            if e[1] == 0:
                del self._entries[key]
                del self._keys[id(buf)]
                self._counters["constant_bytes"] -= buf.size
                dead.append(buf)
        if dead:
            self._timeline.after_submit(lambda: [b.destroy() for b in dead])

    def clear(self):
        """The context is destroyed or lost: forget every buffer (the device frees them)."""
        self._entries.clear()
        self._keys.clear()
        self._counters["constant_bytes"] = 0
