"""A built graph's Program as data, and back: what save_graph stores and load_graph rebuilds.

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
from ..runtime.compile import compile_kernels
from ..runtime.constants import digest
from ..runtime.program import Ext, Program, instantiate
from ..runtime.wgsl import source_of

FORMAT = 8  # 8: ONNX nodes labelled with their node names (the report names them); 7: the fusion report (Program.fusion_notes); 3: kernels carry their launch parameters (Kernel.sizes); 4: their derived sizes (Kernel.derived); 5: their epilogue's constants (Kernel.consts); 6: Ext is runtime.program's (the Program); an older entry is a miss
_READ_CHUNK = 64 << 20


def capture(ctx, program):
    """(recipe, [(store key, GPUBuffer, size)] of the constant bytes to read back) of a Program
    of `ctx` (runtime/program.py)."""
    store = ctx._constants
    pool = {id(b): i for i, b in enumerate(program.pool)}
    consts, index = [], {}

    def const_ref(buf, nbytes=None):
        k = id(buf)
        if k not in index:
            key = store.key_of(buf)
            index[k] = len(consts)
            consts.append((key, buf, buf.size if nbytes is None else nbytes))
        return index[k]

    for t in program.keep:  # constant tensors bound in place: their bytes become plain constants
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

    launches = [(i, [ref(b) for b in bufs], groups) for i, (_, _, bufs, groups, _) in enumerate(program.launches)]
    recipe = {
        "format": FORMAT,
        "inputs": program.inputs,
        "outputs": program.outputs,
        "kernels": program.kernels,
        # (no rendering at load; a launch not created yet is rendered here, or a loaded graph's)
        "sources": list(program.sources)
        if program.sources is not None
        else [source_of(ctx.device, k) for k in program.kernels],
        "launches": launches,
        "pool": [b.size for b in program.pool],
        "constants": [(key, size) for key, _, size in consts],
        "kernel_names": program.kernel_names,
        "fusion_notes": program.fusion_notes,
        "autotune": program.autotune,
        "dyn_args": program.dyn_args,
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
                    yield key, data[off : off + size]
            finally:
                del data
                st.unmap()
        finally:
            st.destroy()


def blob_name(data):
    return hashlib.sha256(data).hexdigest()


def rebuild(ctx, recipe, blob):
    """A Program from a recipe (front/graph.py MLGraph(ctx, program) dispatches it); blob(i)
    gives constant i's bytes (a buffer) or raises. The constants are acquired from the store
    first (shared when another graph holds them)."""
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
        pool = [
            device.create_buffer(label=f"mltensor-pool{i}", size=s, usage=wgpu.BufferUsage.STORAGE)
            for i, s in enumerate(recipe["pool"])
        ]
        kernels = recipe["kernels"]
        dyn_args = recipe["dyn_args"]
        program = Program(
            recipe["inputs"],
            recipe["outputs"],
            kernels,
            [],
            pool,
            shared=shared,
            sources=recipe["sources"],
            kernel_names=recipe["kernel_names"],
            fusion_notes=recipe["fusion_notes"],
            autotune=recipe["autotune"],
            dyn_args=dyn_args,
            memory={
                "constants": sum(b.size for b in {id(b): b for b in shared}.values()),
                "constant_tensors": 0,
                "folded_constants": 0,
                "intermediates": sum(b.size for b in pool),
            },
        )
        # size buckets' variants (launches with no workgroups at some sizes) are created at the
        # first dispatch that runs them, as in a fresh build (front/graph.py MLGraph._create)
        lazy = set(program.dyn.maybe_off) if program.dyn is not None else set()
        keep = [i for i in range(len(kernels)) if i not in lazy]
        compile_kernels(ctx, [kernels[i] for i in keep], [recipe["sources"][i] for i in keep])

        def buf_of(r):
            kind, view = r[0], r[-1]
            if kind == "ext":
                b = Ext(r[1], r[2], r[3], r[4])
            elif kind == "pool":
                b = pool[r[1]]
            else:
                b = shared[r[1]]
            return b if view is None else (b, view)

        # (launch i runs kernel i: capture numbers them so)
        program.launches = instantiate(
            device,
            [(kernels[ki], [buf_of(r) for r in refs], groups) for ki, refs, groups in recipe["launches"]],
            {i for i, (ki, _, _) in enumerate(recipe["launches"]) if ki in lazy},
        )
        return program
    except BaseException:
        with ctx._lock:
            store.release(shared)
        raise
