"""Compiling a build's kernels in parallel.

A build needs one pipeline per distinct kernel (runtime/wgsl.py caches them per device). Drivers
do the expensive part at different moments, so both are spread over the machine's cores
(MLTENSOR_COMPILE_THREADS, default the core count up to 8; 1 compiles one after another):

- GPU drivers (NVIDIA, AMD, Intel...) compile to machine code in createComputePipeline: the
  pipelines are created from a thread pool (wgpu-native is thread-safe and wgpu-py's calls
  release the GIL). WGSL rendering (Python) stays on the calling thread.
- Mesa's CPU drivers (lavapipe, llvmpipe) only translate there: the LLVM compile of a pipeline
  happens at its first dispatch, on the queue's single thread, 0.1 to 1.3 s per convolution
  kernel, so a fresh machine's first run of a 67-kernel detector spent 14 s compiling on one core.
  Mesa keeps compiled shaders in an on-disk cache shared by every device of the process, so
  `_warm_cpu` gives each extra core a helper device that creates a share of the new pipelines
  and dispatches them with zero workgroups (compiling them into that cache) while the context's
  own queue does the same for its share; the build's first real dispatch then loads the rest
  from the cache. Kernels this machine has already compiled (a persistent index of kernel
  hashes per adapter, next to the autotune tables) are skipped: the driver cache has them.
"""

import hashlib
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import wgpu

from .._xdg import cache_dir
from .autotune import adapter_key
from .wgsl import compiled, cpu_device, pipeline, source_of

_MAX_THREADS = 8
_MIN_WARM = 4  # fewer new kernels than this compile at their first dispatch, as before
_helpers = {}  # id(adapter) -> [helper devices]
_helpers_lock = threading.Lock()
_seen = {}  # adapter key -> set of kernel hashes compiled by this machine's driver before
_seen_lock = threading.Lock()


def threads():
    env = os.environ.get("MLTENSOR_COMPILE_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    return max(1, min(os.cpu_count() or 1, _MAX_THREADS))


def compile_kernels(ctx, kernels, sources=None, warm=True, locked=False):
    """Make sure every kernel has its pipeline on the context's device, compiling the missing
    ones in parallel (see the module docstring). sources: their WGSL, when known (a graph
    loaded from the graph cache), else rendered here. warm=False: no Mesa warm-up. locked: the
    caller holds the device lock (MLGraph._create, a dispatch's first use of size buckets): the
    warm-up's context share runs on the calling thread (the lock is re-entrant; a pool thread
    would wait for it forever), the helpers' on the pool."""
    device = ctx.device
    todo, src_of, seen_keys = [], {}, set()
    for i, k in enumerate(kernels):
        if k.key not in seen_keys and not compiled(device, k):
            seen_keys.add(k.key)
            todo.append(k)
            if sources is not None:
                src_of[k.key] = sources[i]
    n = threads()
    if len(todo) < 2 or n == 1:
        for k in todo:
            pipeline(device, k, src_of.get(k.key))
        return
    # (jinja: holds the GIL, no gain from threads)
    sources = [src_of[k.key] if k.key in src_of else k.source() for k in todo]
    # one of the kernels rendering the same WGSL first (the others then share its pipeline)
    first, rest, seen_src = [], [], set()
    for k, src in zip(todo, sources):
        (rest if src in seen_src else first).append((k, src))
        seen_src.add(src)
    with ThreadPoolExecutor(max_workers=min(n, len(first)), thread_name_prefix="mltensor-compile") as pool:
        for f in [pool.submit(pipeline, device, k, src) for k, src in first]:
            f.result()  # the first failure (OperationError naming the kernel) is raised
    for k, src in rest:
        pipeline(device, k, src)
    if warm and cpu_device(ctx.device) and _disk_cache_on():
        _warm_cpu(ctx, todo, sources, n, locked)


def warm(ctx, kernels, locked=False):
    """The Mesa warm-up (module docstring) of kernels whose pipelines the device has already:
    a graph with dynamic dimensions warms its kernels at its first dispatch, together with the
    size buckets that dispatch runs (MLGraph._create), one parallel pass instead of two."""
    if not kernels or not (cpu_device(ctx.device) and _disk_cache_on()) or threads() == 1:
        return
    _warm_cpu(ctx, kernels, [source_of(ctx.device, k) for k in kernels], threads(), locked)


def _disk_cache_on():
    """Mesa's on-disk shader cache is on unless switched off (the helpers' work would be lost)."""
    for var in ("MESA_SHADER_CACHE_DISABLE", "MESA_GLSL_CACHE_DISABLE"):
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes"):
            return False
    return True


_LOOP_RE = re.compile(r"for \(var \w+ = 0u; \w+ < (\d+)u;")


def _cost(src):
    """A rough cost of compiling a kernel on a CPU driver, to start the costliest first (the
    last one compiled alone is the warm-up's tail): its length, times the copies of loops with
    small literal trip counts, which LLVM unrolls (a direct convolution's channel loop of 24
    copied into 4 tap blocks, before it looped over its taps, compiled in 1.2 s: 3x a tiled
    GEMM kernel 1.4x its length)."""
    unrolled = sum(n for n in map(int, _LOOP_RE.findall(src)) if n <= 64)
    return len(src) * (1 + unrolled / 16)


def _hash(src):
    return hashlib.sha256(src.encode()).hexdigest()[:20]


def _seen_path(key):
    return os.path.join(cache_dir(), "compiled", hashlib.sha256(key.encode()).hexdigest()[:16] + ".txt")


def _seen_set(key):
    with _seen_lock:
        s = _seen.get(key)
        if s is None:
            try:
                with open(_seen_path(key)) as f:
                    s = {line.strip() for line in f if line.strip()}
            except OSError:
                s = set()
            _seen[key] = s
        return s


def _remember(key, hashes):
    with _seen_lock:
        _seen.setdefault(key, set()).update(hashes)
        path = _seen_path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:  # appends of whole lines: concurrent processes interleave safely
                f.write("".join(h + "\n" for h in hashes))
        except OSError:
            pass  # a read-only cache costs a warm-up next time, not correctness


def _warm_cpu(ctx, kernels, sources, n, locked=False):
    key = adapter_key(ctx.device) + "|" + str(ctx._adapter_info.get("description", ""))
    known = _seen_set(key)
    new, hashes = [], set(known)
    for k, s in zip(kernels, sources):
        h = _hash(s)
        if h not in hashes:  # (kernels of different keys may render the same WGSL)
            hashes.add(h)
            new.append((k, s))
    if len(new) < _MIN_WARM:
        return
    # costliest first (_cost: convolutions dominate), each worker taking the next
    # kernel when its previous one is compiled, so the shares balance themselves
    todo = sorted(new, key=lambda ks: -_cost(ks[1]))
    todo_lock = threading.Lock()

    def take():
        with todo_lock:
            return todo.pop(0) if todo else None

    def on_helper(dev):
        while (item := take()) is not None:
            k, src = item
            pipe, bgl = _pipeline_on(dev, k, src)
            enc = dev.create_command_encoder()
            _record_empty(dev, enc, pipe, bgl, k)
            dev.queue.submit([enc.finish()])
            _wait_idle(dev)

    def on_context():
        device = ctx.device
        while (item := take()) is not None:
            k, _ = item
            pipe, bgl = pipeline(device, k)
            probe = device.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
            st = device.create_buffer(size=4, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
            with ctx._lock:  # submitted like any ML work; waited for without the lock
                if ctx._lost_info is not None:
                    return
                enc = device.create_command_encoder(label="mltensor-warm")
                _record_empty(device, enc, pipe, bgl, k)  # touches nothing the timeline tracks
                enc.copy_buffer_to_buffer(probe, 0, st, 0, 4)
                device.queue.submit([enc.finish()])
            st.map_sync(wgpu.MapMode.READ)
            st.unmap()

    helpers = _helper_devices(ctx.device, n - 1)
    with ThreadPoolExecutor(max_workers=len(helpers) + 1, thread_name_prefix="mltensor-jit") as pool:
        futures = [pool.submit(on_helper, dev) for dev in helpers]
        if locked:
            try:
                on_context()
            except Exception:
                pass
        else:
            futures.append(pool.submit(on_context))
        for f in futures:
            try:
                f.result()
            except Exception:  # a warm-up failure costs time, never the build
                pass
    _remember(key, [_hash(s) for _, s in new])


def _helper_devices(device, count):
    """Up to `count` devices of the context's adapter, kept for the process."""
    if count <= 0:
        return []
    adapter = device.adapter
    with _helpers_lock:
        pool = _helpers.setdefault(id(adapter), [])
        while len(pool) < count:
            try:
                pool.append(
                    adapter.request_device_sync(
                        label="mltensor-jit-helper",
                        required_features=list(device.features),
                        required_limits={k: v for k, v in device.limits.items() if isinstance(v, int)},
                    )
                )
            except Exception:
                break
        return pool[:count]


def _pipeline_on(dev, kernel, src):
    module = dev.create_shader_module(label=kernel.name, code=src)
    bgl = dev.create_bind_group_layout(entries=_layout_entries(kernel))
    layout = dev.create_pipeline_layout(bind_group_layouts=[bgl], immediate_size=kernel.immediates())
    return dev.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": "main"}), bgl


def _layout_entries(kernel):
    B = wgpu.BufferBindingType
    return [
        {
            "binding": i,
            "visibility": wgpu.ShaderStage.COMPUTE,
            "buffer": {"type": B.storage if b.writable else B.read_only_storage},
        }
        for i, b in enumerate(kernel.bindings)
    ]


def _record_empty(dev, enc, pipe, bgl, kernel):
    bufs = [dev.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE) for _ in kernel.bindings]
    bg = dev.create_bind_group(
        layout=bgl, entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(bufs)]
    )
    p = enc.begin_compute_pass()
    p.set_pipeline(pipe)
    if kernel.immediates():  # (zero sizes: no workgroup reads them)
        p.set_immediates(0, bytes(kernel.immediates()), 0, kernel.immediates())
    p.set_bind_group(0, bg)
    p.dispatch_workgroups(0, 0, 0)  # compiles the pipeline, runs nothing
    p.end()


def _wait_idle(dev):
    b = dev.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
    dev.queue.read_buffer(b)  # returns once the queue's earlier work is done
