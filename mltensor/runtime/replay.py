"""The compiled graph-replay loop (replay.c): build, load, and the arrays it replays.

The C source is compiled once per source version and platform with the system C compiler (`cc`,
or $CC) into mltensor's cache directory (outside the repository; set-up builds it ahead), and
loaded with cffi in ABI mode: no Python headers, no setuptools. Anything missing (no compiler,
another wgpu backend, MLTENSOR_NO_NATIVE_REPLAY=1) leaves `loaded()` None and graph replay in
Python (front/graph.py); `status()` says which and why.
"""

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile

from .._xdg import cache_dir

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay.c")
_CDEF = """
void mlt_init(uintptr_t sp, uintptr_t sb, uintptr_t dp, uintptr_t si);
void mlt_replay(uintptr_t pass, size_t n, void *const *pipes, void *const *groups, const uint32_t *xyz);
void mlt_replay_imm(uintptr_t pass, size_t n, void *const *pipes, void *const *groups, uintptr_t xyz_addr,
                    const uint32_t *at, uintptr_t imm_addr);
"""
_state = {"lib": None, "tried": False, "status": "not loaded yet"}


def library_path():
    """Where the compiled library for this source, platform and Python lives."""
    with open(_SRC, "rb") as f:
        digest = hashlib.sha256(f.read() + platform.machine().encode() + sys.platform.encode()).hexdigest()[:16]
    ext = ".dylib" if sys.platform == "darwin" else ".dll" if os.name == "nt" else ".so"
    return os.path.join(cache_dir(), "native", f"libmltreplay-{digest}{ext}")


def build():
    """Compile replay.c into library_path() unless it is there; returns the path. Raises
    RuntimeError when no C compiler is found or compiling fails."""
    path = library_path()
    if os.path.exists(path):
        return path
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # compile to a private name, then rename: processes building at once never load half a file
    fd, tmp = tempfile.mkstemp(suffix=os.path.splitext(path)[1], dir=os.path.dirname(path))
    os.close(fd)
    try:
        try:
            r = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", tmp, _SRC], capture_output=True, text=True)
        except OSError as e:
            raise RuntimeError(f"{cc} could not run: {e}") from None
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed: {(r.stderr or r.stdout).strip()[:500]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def loaded():
    """(ffi, lib) of the compiled replay loop, initialized with wgpu-native's functions; None when
    it cannot be had (the reason in status()). Built on the first call if needed."""
    if _state["tried"]:
        return _state["lib"]
    _state["tried"] = True
    if os.environ.get("MLTENSOR_NO_NATIVE_REPLAY", "") not in ("", "0"):
        _state["status"] = "off (MLTENSOR_NO_NATIVE_REPLAY=1): Python replay"
        return None
    try:
        import cffi
        from wgpu.backends.wgpu_native._ffi import ffi as wffi
        from wgpu.backends.wgpu_native._ffi import lib as wlib

        path = build()
        ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        lib = ffi.dlopen(path)
        lib.mlt_init(
            *(
                int(wffi.cast("uintptr_t", f))
                for f in (
                    wlib.wgpuComputePassEncoderSetPipeline,
                    wlib.wgpuComputePassEncoderSetBindGroup,
                    wlib.wgpuComputePassEncoderDispatchWorkgroups,
                    wlib.wgpuComputePassEncoderSetImmediates,
                )
            )
        )
    except Exception as e:  # no compiler, a failed build, an unloadable library: Python replays
        _state["status"] = f"unavailable ({type(e).__name__}: {e}): Python replay"
        return None
    _state["lib"] = (ffi, lib)
    _state["status"] = f"native ({path})"
    return _state["lib"]


def status():
    """How graph replay runs in this process: "native (library path)", or why it does not."""
    return _state["status"]


def arrays(ffi, raw, address):
    """The C arrays of a replay list [(pipeline | None, bind group | None, x, y, z)], handles
    turned into addresses by `address`; kept with the list (they must outlive every replay)."""
    null = ffi.NULL
    pipes = ffi.new("void *[]", [null if p is None else ffi.cast("void *", address(p)) for p, *_ in raw] or 1)
    groups = ffi.new("void *[]", [null if g is None else ffi.cast("void *", address(g)) for _, g, *_ in raw] or 1)
    xyz = ffi.new("uint32_t[]", [v for r in raw for v in r[2:]] or 1)
    return len(raw), pipes, groups, xyz


def main():
    """Set-up (setup.sh): build the library ahead of the first dispatch."""
    try:
        print(f"native replay: ready ({build()})")
    except RuntimeError as e:
        print(f"native replay: not built ({e}); graphs replay from Python")
