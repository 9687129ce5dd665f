"""IREE, the corpus benchmark's same-adapter peer (bench/test_bench_corpus.py), run as a child
process under an interpreter with iree-base-compiler, iree-base-runtime, onnx and numpy
(MLTENSOR_IREE_PYTHON, `.venv-iree` from `MLTENSOR_SETUP_IREE=1 bash setup.sh`, or this venv with
the `iree` extra). Never imported by mltensor's process: IREE's compiler carries its own LLVM and
the runtime its own Vulkan instance, so they stay out of the process lavapipe is loaded in (the
same reason the corpus exports run in a child process).

    python bench/iree_peer.py MODEL.onnx FEEDS.npz WORKDIR

1. The ONNX model's inputs get the feeds' static shapes (IREE compiles for one size, as mltensor
   specializes a session per input size), `iree-import-onnx` turns it into MLIR and `iree-compile
   --iree-hal-target-device=vulkan` compiles it ahead of time for Vulkan's generic SPIR-V target.
   The .vmfb is kept in WORKDIR, keyed by the model's bytes, the shapes, the flags and IREE's
   version, with the compile's seconds; a failure writes its first line instead.
2. Time to first result: the Vulkan device opened, the module loaded, one call with the numpy
   feeds and its outputs read back to the host.
3. One JSON line on stdout: {"ok", "compile_s", "cached", "first_s", "outputs" (an .npz path),
   "device", "version"} or {"ok": false, "stage", "error"}; then each line "run" on stdin makes one
   call (feeds uploaded, outputs read back, as `InferenceSession.run` does) and
   answers "done <seconds>", the call's time measured here (the pipe not counted); "quit" or end
   of input ends the process.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import time

FLAGS = ["--iree-hal-target-device=vulkan"]


def first_line(text):
    """The first line that is an error, without the location prefix (a file in the cache)."""
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    line = next((s for s in lines if "error" in s.lower()), lines[0] if lines else "")
    return re.sub(r"^\S+\.mlir:\d+:\d+: ", "", line)[:300]


def static_model(onnx, path, feeds, out):
    """The model with each input's dimensions fixed to its feed's shape."""
    m = onnx.load(path)
    for i in m.graph.input:
        if i.name in feeds:
            for d, v in zip(i.type.tensor_type.shape.dim, feeds[i.name].shape):
                d.ClearField("dim_param")
                d.dim_value = int(v)
    onnx.save(m, out)
    return [i.name for i in m.graph.input if i.name in feeds]


def compile_model(path, feeds, workdir):
    """(vmfb path, input names, compile seconds, cached) or raises RuntimeError(stage: first line)."""
    import importlib.metadata

    import onnx

    version = importlib.metadata.version("iree-base-compiler")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(json.dumps([[k, list(v.shape), str(v.dtype)] for k, v in sorted(feeds.items())]).encode())
    h.update(json.dumps([FLAGS, version]).encode())
    stem = os.path.join(workdir, h.hexdigest()[:16])
    os.makedirs(workdir, exist_ok=True)
    meta = stem + ".json"
    if os.path.exists(meta):
        with open(meta) as f:
            m = json.load(f)
        if not m["ok"]:
            raise RuntimeError(m["error"])
        return stem + ".vmfb", m["inputs"], m["compile_s"], True
    bindir = os.path.dirname(sys.executable)
    t0 = time.perf_counter()
    names = static_model(onnx, path, feeds, stem + ".onnx")
    err = None
    r = subprocess.run(
        [os.path.join(bindir, "iree-import-onnx"), stem + ".onnx", "-o", stem + ".mlir"], capture_output=True, text=True
    )
    if r.returncode != 0:
        err = "import: " + first_line(r.stderr or r.stdout)
    else:
        r = subprocess.run(
            [os.path.join(bindir, "iree-compile"), stem + ".mlir", *FLAGS, "-o", stem + ".vmfb"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            err = "compile: " + first_line(r.stderr or r.stdout)
    seconds = time.perf_counter() - t0
    for ext in (".onnx", ".mlir"):
        if os.path.exists(stem + ext):
            os.unlink(stem + ext)
    with open(meta, "w") as f:
        json.dump({"ok": err is None, "error": err, "inputs": names, "compile_s": seconds, "version": version}, f)
    if err:
        raise RuntimeError(err)
    return stem + ".vmfb", names, seconds, False


def aligned(a, alignment=4096):
    """A copy of `a` at a page-aligned address: IREE's Vulkan driver imports host memory in place,
    and Vulkan requires minImportedHostPointerAlignment (4096 on lavapipe)."""
    import numpy as np

    raw = np.empty(a.nbytes + alignment, np.uint8)
    off = -raw.ctypes.data % alignment
    out = raw[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def to_host(rt, device, arr):
    """A DeviceArray's values copied to the host through a mapped staging buffer. (DeviceArray's
    own to_host imports an unaligned numpy array where the allocator says it can import host
    memory, which lavapipe refuses: minImportedHostPointerAlignment 4096.)"""
    import numpy as np

    view = arr._buffer_view
    if arr._is_mappable():
        return np.array(arr.to_host())
    source = view.get_buffer()
    host = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=source.byte_length(),
    )
    sem = device.create_semaphore(0)
    device.queue_copy(
        source, host, wait_semaphores=rt.HalFence.create_at(sem, 0), signal_semaphores=rt.HalFence.create_at(sem, 1)
    )
    rt.HalFence.create_at(sem, 1).wait()
    dtype = rt.HalElementType.map_to_dtype(view.element_type)
    return np.array(host.map().asarray(view.shape, dtype))


def main():
    path, feeds_path, workdir = sys.argv[1:4]
    import numpy as np

    feeds = dict(np.load(feeds_path))
    try:
        vmfb, names, compile_s, cached = compile_model(path, feeds, workdir)
    except RuntimeError as e:
        print(json.dumps({"ok": False, "stage": str(e).split(":")[0], "error": str(e)}), flush=True)
        return
    import iree.runtime as rt

    args = [aligned(feeds[n]) for n in names]
    try:
        t0 = time.perf_counter()
        config = rt.Config("vulkan")
        ctx = rt.SystemContext(config=config)
        ctx.add_vm_module(rt.VmModule.mmap(config.vm_instance, vmfb))
        fn = ctx.modules.module["main_graph"]

        def run():
            out = fn(*args)
            out = out if isinstance(out, (tuple, list)) else (out,)
            return [to_host(rt, config.device, o) for o in out]

        outs = run()
        first_s = time.perf_counter() - t0
    except Exception as e:  # a runtime failure is a finding, as a compile failure is
        print(json.dumps({"ok": False, "stage": "run", "error": "run: " + first_line(str(e))}), flush=True)
        return
    out_path = os.path.join(workdir, f"out-{os.getpid()}.npz")
    np.savez(out_path, *outs)
    info = {
        "ok": True,
        "compile_s": compile_s,
        "cached": cached,
        "first_s": first_s,
        "outputs": out_path,
        "device": str(config.device),
        "version": rt.__version__ if hasattr(rt, "__version__") else "",
    }
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "run":
            t0 = time.perf_counter()
            run()
            print(f"done {time.perf_counter() - t0!r}", flush=True)
        elif cmd == "ping":
            print("done 0.0", flush=True)
        else:
            break


if __name__ == "__main__":
    main()
