"""A built MLGraph as data, and back: what save_graph stores and load_graph rebuilds.

A graph is its launches: each a kernel (the WGSL source it was compiled from, its bindings,
workgroup counts and launch parameters: kernels sharing a pipeline keep their own values in
Kernel.sizes, the immediates layout is derived from them again at load) and the buffers it
binds, which are the caller's tensors (bound at dispatch), pooled intermediates (sizes), or
constant bytes: weights from the context's constant store,
values folded at build, constant tensors. Constant bytes are read back from the device at save
and stored once by content (store.py); a rebuilt graph binds them through the constant store
like a fresh build, so it shares them with every other graph holding the same bytes. Nothing
of the builder, the importers or the compiler's passes runs at load: no lowering, no WGSL
rendering, no autotuning.
"""

import hashlib

import numpy as np
import wgpu

from .. import dtypes
from ..runtime.program import Ext, ext_of, resource_of
from ..runtime.wgsl import source_of

FORMAT = 5  # 3: kernels carry their launch parameters (Kernel.sizes); 4: their derived sizes (Kernel.derived); 5: their epilogue's constants (Kernel.consts); an older entry is a miss
_READ_CHUNK = 64 << 20


def capture(graph):
    """(recipe, [(store key, GPUBuffer, size)] of the constant bytes to read back)."""
    ctx = graph._context
    store = ctx._constants
    pool = {id(b): i for i, b in enumerate(graph._pool)}
    consts, index = [], {}

    def const_ref(buf, nbytes=None):
        k = id(buf)
        if k not in index:
            key = store.key_of(buf)
            index[k] = len(consts)
            consts.append((key, buf, buf.size if nbytes is None else nbytes))
        return index[k]

    for t in graph._keep:  # constant tensors bound in place: their bytes become plain constants
        const_ref(t._buffer, dtypes.padded(t._nbytes))

    def ref(b):
        view = None
        if b.__class__ is tuple:
            b, view = b
        if isinstance(b, Ext):
            r = ("ext", b.kind, b.name, b.data_type, b.shape)
        elif id(b) in pool:
            r = ("pool", pool[id(b)])
        else:
            r = ("const", const_ref(b))
        return r + (view,)

    launches = [(i, [ref(b) for b in bufs], groups)
                for i, (_, _, bufs, groups, _) in enumerate(graph._launches)]
    recipe = {
        "format": FORMAT,
        "inputs": graph._inputs, "outputs": graph._outputs,
        "kernels": graph._kernels,
        # (no rendering at load; a launch not created yet is rendered here, or a loaded graph's)
        "sources": list(graph._sources) if graph._sources is not None
        else [source_of(ctx.device, k) for k in graph._kernels],
        "launches": launches,
        "pool": [b.size for b in graph._pool],
        "constants": [(key, size) for key, _, size in consts],
        "kernel_names": graph._kernel_names, "autotune": graph._autotune,
        "dyn_args": graph._dyn_args,
    }
    return recipe, consts


def read_back(ctx, consts):
    """The bytes of each constant buffer, copied into one mappable staging buffer per batch
    (<= 64 MB, a larger constant alone); the copies are submitted with the context's lock held
    and waited for without it. Yields (store key, memoryview of the mapped bytes): valid only
    until the next batch is asked for, so the caller hashes and writes them with no host copy."""
    device = ctx.device
    i = 0
    while i < len(consts):
        batch, total = [], 0
        while i < len(consts) and (not batch or total + dtypes.padded(consts[i][2]) <= _READ_CHUNK):
            batch.append((consts[i], total))
            total += -(-dtypes.padded(consts[i][2]) // 16) * 16
            i += 1
        with ctx._lock:
            ctx._check("save_graph")
            tl = ctx._timeline
            tl.flush()  # the build's uploads and prologue first
            st = device.create_buffer(size=max(16, total), usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            enc = device.create_command_encoder(label="mltensor-save")
            for (_, buf, size), off in batch:
                if size:
                    enc.copy_buffer_to_buffer(buf, 0, st, off, dtypes.padded(size))
            device.queue.submit([enc.finish()])
            tl.counters["submits"] += 1
        try:
            st.map_sync(wgpu.MapMode.READ)
            data = st.read_mapped(0, max(16, total), copy=False).cast("B")
            try:
                for (key, _, size), off in batch:
                    ctx._counters["bytes_downloaded"] += size
                    yield key, data[off:off + size]
            finally:
                del data
                st.unmap()
        finally:
            st.destroy()


def blob_name(data):
    return hashlib.sha256(data).hexdigest()


def rebuild(ctx, recipe, blob):
    """An MLGraph from a recipe; blob(i) gives constant i's bytes (a buffer) or raises. The
    constants are acquired from the store first (shared when another graph holds them)."""
    from ..front.graph import MLGraph
    from ..dynamic.plan import DynamicPlan
    from ..runtime.compile import compile_kernels
    from ..runtime.constants import digest
    from ..runtime.wgsl import pipeline

    device = ctx.device
    store = ctx._constants
    shared = []
    try:
        for i, (key, size) in enumerate(recipe["constants"]):
            with ctx._lock:
                ctx._check("load_graph")
                buf = store.acquire_existing(key)
            if buf is None:
                data = np.frombuffer(blob(i), dtype=np.uint8)
                if data.nbytes != size:
                    raise ValueError(f"constant {i}: {data.nbytes} bytes, expected {size}")
                if key is None:  # a folded value or a constant tensor: keyed by its bytes
                    key = digest(data)
                elif hashlib.sha256(data).digest() != key[2]:
                    raise ValueError(f"constant {i}: its bytes do not match their digest")
                with ctx._lock:
                    ctx._check("load_graph")
                    buf = store.acquire(key, data)
                del data  # (the blob's mapping goes with its last view)
            shared.append(buf)
        pool = [device.create_buffer(label=f"mltensor-pool{i}", size=s, usage=wgpu.BufferUsage.STORAGE)
                for i, s in enumerate(recipe["pool"])]
        kernels = recipe["kernels"]
        plan = DynamicPlan(*recipe["dyn_args"]) if recipe["dyn_args"] is not None else None
        # size buckets' variants (launches with no workgroups at some sizes) are created at the
        # first dispatch that runs them, as in a fresh build (compiler/program.py MLGraph._create)
        lazy = set(plan.maybe_off) if plan is not None else set()
        keep = [i for i in range(len(kernels)) if i not in lazy]
        compile_kernels(ctx, [kernels[i] for i in keep], [recipe["sources"][i] for i in keep])
        graph = MLGraph(ctx, recipe["inputs"], recipe["outputs"], [], pool)
        graph._shared, graph._pool = shared, pool  # (one store reference per acquire)
        graph._kernels = list(kernels)
        graph._sources = list(recipe["sources"])

        def buf_of(r):
            kind, view = r[0], r[-1]
            if kind == "ext":
                b = Ext(r[1], r[2], r[3], r[4])
            elif kind == "pool":
                b = pool[r[1]]
            else:
                b = shared[r[1]]
            return b if view is None else (b, view)

        for ki, refs, groups in recipe["launches"]:
            bufs = [buf_of(r) for r in refs]
            bg = None
            if ki in lazy:
                graph._launches.append([None, None, bufs, groups, None])
                graph._lazy += 1
                continue
            pipe, bgl = pipeline(device, kernels[ki])
            if not any(ext_of(b) for b in bufs):
                bg = device.create_bind_group(
                    layout=bgl, entries=[{"binding": i, "resource": resource_of(b)} for i, b in enumerate(bufs)])
            graph._launches.append([pipe, bgl, bufs, groups, bg])
        graph._kernel_names = list(recipe["kernel_names"])
        graph._autotune = dict(recipe["autotune"])
        if plan is not None:
            graph._dyn_args = recipe["dyn_args"]
            graph._dyn = plan
        graph._memory = {"constants": sum(b.size for b in {id(b): b for b in shared}.values()),
                         "constant_tensors": 0,
                         "folded_constants": 0, "intermediates": sum(b.size for b in pool)}
        graph._finish()
        return graph
    except BaseException:
        with ctx._lock:
            store.release(shared)
        raise
