"""Autotuning of GEMM/conv kernels on the adapter that runs them.

A lowering with several valid configurations of one kernel (tile shape, threads, split-K factor)
calls `choose(kc, signature, candidates, build, heuristic)`. When tuning is on, each candidate's
launches are compiled and timed directly with timestamp queries on scratch buffers of the right
sizes (not through MLGraph dispatch), the fastest is used, and the choice is persisted in
`<cache_dir>/autotune/<adapter>.json`, keyed by adapter (vendor, device, driver, backend) and by
the signature, so later builds and processes pay nothing. Without `timestamp-query`, with
MLTENSOR_AUTOTUNE=0, or once a build has spent its tuning budget (MLTENSOR_AUTOTUNE_BUDGET
seconds, default 3), `heuristic` (an index into candidates) is used and nothing is persisted.

Default: on for hardware adapters, off on CPU adapters (lavapipe), where the heuristic is the
configuration measured best there; MLTENSOR_AUTOTUNE=1 forces it on.
Visible: `kc.tune_seconds` / `kc.tune_count` for one build, `STATS` for the process.
"""

import hashlib
import json
import os
import tempfile
import threading
import time

import numpy as np
import wgpu

from .._xdg import cache_dir
from ..switches import value
from .profiler import time_launches as time_passes
from .wgsl import cpu_device, pipeline

STATS = {"tuned": 0, "cache_hits": 0, "seconds": 0.0}
_lock = threading.Lock()
_tables = {}  # adapter key -> {signature: entry}
_forced = None  # tests: candidate index every choose() returns (clamped to the last candidate)


class force:
    """Context manager for tests: every tuned kernel built inside uses candidate `index` (or
    the last candidate when it has fewer), so each configuration can be checked for correctness."""

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        global _forced
        self.prev, _forced = _forced, self.index
        return self

    def __exit__(self, *exc):
        global _forced
        _forced = self.prev


def forced_index(n):
    """The index force() imposes among n candidates (the last when it has fewer), else None."""
    return None if _forced is None else min(_forced, n - 1)


def adapter_key(device):
    info = device.adapter.info
    parts = [str(info.get(k, "")) for k in ("vendor", "device", "description", "backend_type")]
    return "|".join(parts)


def enabled(device):
    env = value("MLTENSOR_AUTOTUNE").strip()
    if "timestamp-query" not in device.features:
        return False
    if env in ("0", "1"):
        return env == "1"
    return not cpu_device(device)


def budget_s():
    try:
        return float(os.environ.get("MLTENSOR_AUTOTUNE_BUDGET", "3"))
    except ValueError:
        return 3.0


def _path(key):
    h = hashlib.sha256(key.encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), "autotune", f"{h}.json")


def _table(key):
    t = _tables.get(key)
    if t is None:
        t = {}
        try:
            with open(_path(key)) as f:
                data = json.load(f)
            if data.get("adapter") == key:
                t = data.get("entries", {})
        except (OSError, ValueError):
            pass
        _tables[key] = t
    return t


def _save(key, table):
    path = _path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"adapter": key, "entries": table}, f, indent=0, sort_keys=True)
        os.replace(tmp, path)  # atomic: concurrent processes never read half a file
    except OSError:
        pass  # a read-only cache costs re-tuning, not correctness


def signature_of(kernels):
    """A stable signature for a kernel's problem: template and parameters of its first launch
    without the tuned configuration (callers pass what defines the problem)."""
    return hashlib.sha256(repr(kernels).encode()).hexdigest()[:24]


def time_launches(device, launches, repeat=3):
    """Median GPU seconds of one run of `launches` [(Kernel, [nbytes per binding], groups)], on
    zero-filled buffers (values do not change fp32 FMA timing). Same-size bindings of different
    launches share a buffer when they are the same object index (see `build`). A launch of a
    kernel reading dynamic sizes (Kernel.dims) carries a fourth item, its immediate data (the
    sizes it is timed at, its groups already counted for them)."""
    bufs, groups_bound = {}, []
    for kernel, sizes, groups, *imm in launches:
        pipe, bgl = pipeline(device, kernel)
        entries = []
        for i, (slot, nbytes) in enumerate(sizes):
            buf = bufs.get(slot)
            if buf is None:
                buf = bufs[slot] = device.create_buffer(size=max(16, nbytes), usage=wgpu.BufferUsage.STORAGE)
            entries.append({"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}})
        bg = device.create_bind_group(layout=bgl, entries=entries)
        groups_bound.append((pipe, bg, tuple(int(g) for g in groups), imm[0] if imm else None))
    try:
        runs = time_passes(device, groups_bound, repeat, warmup=1).sum(axis=1)
    finally:
        for b in bufs.values():
            b.destroy()
    return float(np.median(runs))


def choose(kc, signature, candidates, measure, heuristic=0):
    """Index of the candidate to use. `measure(i)` returns the launches of candidate i in
    `time_launches` form; it is only called when tuning."""
    if _forced is not None:
        return forced_index(len(candidates))
    device = kc.device
    if len(candidates) == 1 or not enabled(device):
        return heuristic
    key = adapter_key(device)
    with _lock:
        table = _table(key)
        hit = table.get(signature)
    if hit is not None and hit.get("n") == len(candidates) and 0 <= hit.get("best", -1) < len(candidates):
        STATS["cache_hits"] += 1
        return hit["best"]
    spent = kc.tune_seconds
    if spent >= budget_s():
        return heuristic
    t0 = time.perf_counter()
    times = []
    # the heuristic's choice first: if the budget runs out mid-signature, what was measured can
    # still be compared with it
    order = [heuristic] + [i for i in range(len(candidates)) if i != heuristic]
    for k, i in enumerate(order):
        if k and spent + time.perf_counter() - t0 >= budget_s():
            break  # the budget bounds the build: at most one candidate's timing past it
        try:
            times.append((time_launches(device, measure(i)), i))
        except Exception:  # a candidate the driver rejects (limits) is simply not chosen
            times.append((float("inf"), i))
    complete = len(times) == len(candidates)
    t_best, best = min(times)
    if not np.isfinite(t_best):
        best = heuristic
    dt = time.perf_counter() - t0
    kc.tune_seconds = spent + dt
    kc.tune_count += 1
    with _lock:
        STATS["seconds"] += dt
    if not complete:
        return best  # partial: not persisted, a later build tunes this signature again
    times = [t for t, _ in sorted(times, key=lambda ti: ti[1])]
    with _lock:
        STATS["tuned"] += 1
        table = _table(key)
        table[signature] = {
            "best": best,
            "n": len(candidates),
            "config": repr(candidates[best]),
            "us": [round(t * 1e6, 2) if np.isfinite(t) else None for t in times],
        }
        _save(key, table)
    return best
