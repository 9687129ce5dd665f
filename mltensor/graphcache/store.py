"""The graph cache on disk: entries per adapter, constant bytes stored once by content.

    <cache dir>/graphs/blobs/<sha256>                          constant bytes, shared by entries
    <cache dir>/graphs/<adapter hash>/<key hash>.recipe       the graph (recipe.py), pickled
    <cache dir>/graphs/<adapter hash>/<key hash>.json         its key, mltensor's code digest, blobs, size

<cache dir> is MLTENSOR_CACHE (else $XDG_CACHE_HOME/mltensor, else ~/.cache/mltensor).
The adapter hash covers the adapter and driver, the device features the kernels were compiled
for, the context's float16/int64 modes and its largest tensor (`_max_bytes`): a graph saved on
one GPU or driver is invisible to another. The JSON is written last, each file atomically (a temporary file renamed), so
concurrent processes never read half an entry. An entry whose code digest differs from this
mltensor's (any .py, .wgsl or .c file of the package changed), that does not unpickle, or whose
blobs are missing or do not match their digests is a miss: it is deleted and the graph rebuilt.
The recipe unpickles with only mltensor's own kernel and size classes allowed, never arbitrary
callables. Beyond MLTENSOR_CACHE_MAX_BYTES (default 8 GiB) the least recently used entries are
evicted, then the blobs no entry names.
"""

import hashlib
import json
import mmap
import os
import pickle
import tempfile
import threading
import time

from .._xdg import cache_dir
from ..errors import OperationError
from ..runtime.wgsl import shader_dir
from . import recipe as R

_code = None
_lock = threading.Lock()

_ALLOWED = {
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "complex"),
    ("mltensor.runtime.wgsl", "Kernel"),
    ("mltensor.runtime.wgsl", "Binding"),
    ("mltensor.dynamic.dims", "Sym"),
    ("mltensor.dynamic.dims", "_Atom"),
    ("mltensor.dynamic.dims", "Condition"),
    ("mltensor.dynamic.dims", "MLDynamicDimension"),
    ("mltensor.dynamic.kernels", "Fold"),
    ("mltensor.runtime.program", "Ext"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a graph cache entry")
        return super().find_class(module, name)


def root():
    return os.path.join(cache_dir(), "graphs")


def enabled():
    """MLTENSOR_GRAPH_CACHE=0 turns the cache off for InferenceSession (the explicit
    save_graph / load_graph calls always work)."""
    return os.environ.get("MLTENSOR_GRAPH_CACHE", "1").strip() not in ("0", "false", "no")


def max_bytes():
    try:
        return int(float(os.environ.get("MLTENSOR_CACHE_MAX_BYTES", str(8 << 30))))
    except ValueError:
        return 8 << 30


def code_digest():
    """SHA-256 over mltensor's code (.py, .c) and kernel templates (.wgsl): a cached graph is
    valid only for the exact code that compiled it."""
    global _code
    if _code is None:
        h = hashlib.sha256()
        pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        shaders = os.path.abspath(shader_dir())
        # the templates once: inside the package (mltensor/shaders) they are part of its walk
        for base in (pkg,) if shaders.startswith(pkg + os.sep) else (pkg, shaders):
            for d, dirs, files in sorted(os.walk(base)):
                dirs.sort()
                for f in sorted(files):
                    if f.endswith((".py", ".wgsl", ".c")):
                        h.update(os.path.relpath(os.path.join(d, f), base).encode())
                        with open(os.path.join(d, f), "rb") as fh:
                            h.update(fh.read())
        _code = h.hexdigest()
    return _code


def _adapter_dir(ctx):
    info = ctx._adapter_info
    parts = [str(info.get(k, "")) for k in ("vendor", "device", "description", "backend_type", "adapter_type")]
    parts += sorted(str(f) for f in ctx.device.features)
    parts += [
        f"f16={ctx._f16}",
        f"int64={ctx._int64}",
        f"align={ctx.device.limits.get('min-storage-buffer-offset-alignment')}",
        # constants above it are split at import (onnx/ops/_blocks.py): a graph built under a
        # larger limit binds buffers a smaller one refuses
        f"max_bytes={ctx._max_bytes}",
    ]
    return os.path.join(root(), hashlib.sha256("|".join(parts).encode()).hexdigest()[:20])


def _key_hash(key):
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _write_atomic(path, data):
    """Write bytes (or, for a callable, what it writes to the file) to a temporary file renamed
    over `path`. Returns the bytes written."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data)
            n = f.tell()
        os.replace(tmp, path)
        return n
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_PACK = 64 << 10  # constants smaller than this go into one file per entry


def save(ctx, key, program, extra=None):
    """Store a graph's Program (front/graph.py program_of) under `key` (replacing an entry of
    that key). Returns the bytes written.
    Each constant is stored by content (shared with every entry holding the same bytes); the
    small ones (biases, scales, folded shapes: most of a model's constants by count) together
    in one file, so an entry is a few files, not hundreds."""
    recipe, consts = R.capture(ctx, program)
    blobs_dir = os.path.join(root(), "blobs")
    refs, written, pack = [], 0, bytearray()

    def put(data):
        nonlocal written
        name = R.blob_name(data)
        path = os.path.join(blobs_dir, name)
        if not (os.path.exists(path) and os.path.getsize(path) == len(data)):
            _write_atomic(path, data)
            written += len(data)
        else:
            os.utime(path)
        return name

    for _, data in R.read_back(ctx, consts):
        if len(data) < _PACK:
            refs.append([None, len(pack), len(data)])
            pack += data
            pack += bytes(-len(pack) % 16)
        else:
            refs.append([put(data), 0, len(data)])
    if pack:
        name = put(pack)
        for r in refs:
            if r[0] is None:
                r[0] = name
    d = _adapter_dir(ctx)
    h = _key_hash(key)
    # pickled straight into the file: a recipe holds every kernel's WGSL (megabytes for a
    # transformer), which a bytes object would hold a second time
    size = _write_atomic(
        os.path.join(d, h + ".recipe"),
        lambda f: pickle.dump({"recipe": recipe, "extra": extra}, f, protocol=pickle.HIGHEST_PROTOCOL),
    )
    meta = {
        "key": key,
        "format": R.FORMAT,
        "code": code_digest(),
        "blobs": refs,
        "bytes": sum(c[2] for c in consts) + size,
        "saved": time.time(),
    }
    _write_atomic(os.path.join(d, h + ".json"), json.dumps(meta).encode())
    _evict()
    return written + size


def _meta(path):
    try:
        with open(path) as f:
            m = json.load(f)
        if not isinstance(m, dict) or not isinstance(m.get("key"), str):
            return None
        return m
    except (OSError, ValueError):
        return None


def load(ctx, key):
    """(Program, extra) saved under `key` for this adapter and code, or None (a stale or corrupt
    entry is deleted); front/graph.py MLGraph(ctx, program) dispatches the program."""
    d = _adapter_dir(ctx)
    h = _key_hash(key)
    meta_path = os.path.join(d, h + ".json")
    meta = _meta(meta_path)
    if meta is None or meta["key"] != key:
        return None
    if meta.get("format") != R.FORMAT or meta.get("code") != code_digest():
        _delete_files(d, h)
        return None
    try:
        with open(os.path.join(d, h + ".recipe"), "rb") as f:
            entry = _Unpickler(f).load()
        rec = entry["recipe"]
        refs = meta["blobs"]
        if rec.get("format") != R.FORMAT or len(refs) != len(rec["constants"]):
            raise ValueError("the recipe does not match its entry")
        files = {}

        def blob(i):
            """Constant i's bytes: a view of its mapped file (no host copy of the weights).
            A constant without a content key (folded at build) is trusted only once its whole
            file hashes to the file's name."""
            name, off, size = refs[i]
            m = files.get(name)
            if m is None:
                with open(os.path.join(root(), "blobs", name), "rb") as f:
                    n = os.fstat(f.fileno()).st_size
                    m = [mmap.mmap(f.fileno(), n, access=mmap.ACCESS_READ) if n else b"", False]
                if (off, size) != (0, n):  # a pack of small constants: mapped once per load;
                    files[name] = m  # a weight's own file is unmapped once uploaded
            if rec["constants"][i][0] is None and not m[1]:
                if R.blob_name(m[0]) != name:
                    raise ValueError(f"blob {name} does not match its digest")
                m[1] = True
            if off + size > len(m[0]):
                raise ValueError(f"blob {name} is shorter than its entry says")
            return memoryview(m[0])[off : off + size]

        try:
            program = R.rebuild(ctx, rec, blob)
        finally:
            files.clear()  # (each mapping closes with its last view)
    except (
        OSError,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
        EOFError,
        pickle.UnpicklingError,
        OperationError,
    ):
        _delete_files(d, h)  # corrupt, truncated, a blob gone: rebuilt by the caller
        return None
    try:
        os.utime(meta_path)  # recently used: evicted last
    except OSError:
        pass
    return program, entry.get("extra")


def keys(ctx):
    d = _adapter_dir(ctx)
    out = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    code = code_digest()
    for n in names:
        if n.endswith(".json"):
            m = _meta(os.path.join(d, n))
            if m is not None and m.get("code") == code and m.get("format") == R.FORMAT:
                out.append(m["key"])
    return out


def delete(ctx, key):
    _delete_files(_adapter_dir(ctx), _key_hash(key))


def _delete_files(d, h):
    for ext in (".json", ".recipe"):
        try:
            os.unlink(os.path.join(d, h + ext))
        except OSError:
            pass


def _evict():
    """Least recently used entries out until the cache fits MLTENSOR_CACHE_MAX_BYTES, then the
    blobs no remaining entry names (a blob another process is writing right now is younger than
    a minute and kept)."""
    with _lock:
        r = root()
        entries = []
        try:
            adapters = [os.path.join(r, a) for a in os.listdir(r) if a != "blobs"]
        except OSError:
            return
        for a in adapters:
            try:
                files = os.listdir(a)
            except OSError:
                continue
            for n in files:
                if n.endswith(".json"):
                    p = os.path.join(a, n)
                    m = _meta(p)
                    try:
                        used = os.path.getmtime(p)
                    except OSError:
                        continue
                    entries.append((used, a, n[:-5], m))
        blobs_dir = os.path.join(r, "blobs")
        try:
            blobs = {
                b: os.path.getsize(os.path.join(blobs_dir, b)) for b in os.listdir(blobs_dir) if not b.endswith(".tmp")
            }
        except OSError:
            blobs = {}
        total = sum(blobs.values())
        limit = max_bytes()
        entries.sort()
        while total > limit and entries:
            _, a, h, _ = entries.pop(0)
            _delete_files(a, h)
            live = _live(entries)
            total = sum(s for b, s in blobs.items() if b in live)
        live = _live(entries)
        now = time.time()
        for b in blobs:
            if b not in live:
                p = os.path.join(blobs_dir, b)
                try:
                    if now - os.path.getmtime(p) > 60:
                        os.unlink(p)
                except OSError:
                    pass


def _live(entries):
    """Names of the blobs the entries refer to."""
    out = set()
    for _, _, _, m in entries:
        for r in (m or {}).get("blobs", ()):
            if isinstance(r, list) and r and isinstance(r[0], str):
                out.add(r[0])
    return out


def save_note(ctx, key, note):
    """A small JSON record beside the entries (InferenceSession's per-model facts)."""
    try:
        data = json.dumps({"key": key, "code": code_digest(), "note": note}).encode()
    except (TypeError, ValueError):  # (bytes in it: an ONNX string that is not UTF-8, such as a
        return  # dim_param, which protobuf gives as bytes): no note
    _write_atomic(os.path.join(_adapter_dir(ctx), _key_hash(key) + ".note"), data)


def load_note(ctx, key):
    m = _meta(os.path.join(_adapter_dir(ctx), _key_hash(key) + ".note"))
    if m is None or m["key"] != key or m.get("code") != code_digest():
        return None
    return m.get("note")
