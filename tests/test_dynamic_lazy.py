"""Size buckets' pipelines made at their first use (issue 29, front/graph.py MLGraph._create):
a graph with dynamic dimensions launches each GEMM in size buckets (ops/_gemm.py _variants),
each gated off (no workgroups) outside its bucket; those launches get their pipelines and bind
groups at the first dispatch whose sizes run them, and the replay skips them where they have no
workgroups. Checked: what a dispatch creates (MLGraph.pipelines_created against the launches its
sizes run), results against float64 numpy at sizes in each bucket, two threads reaching new
buckets at once, and a graph-cache round trip of such a graph."""

import threading

import numpy as np
import pytest
from helpers import dispatch_at, in_threads

import mltensor
from mltensor import MLDynamicDimension as D

K, N, MAX_M = 64, 48, 256


@pytest.fixture(autouse=True)
def _heuristic(monkeypatch):
    monkeypatch.setenv("MLTENSOR_AUTOTUNE", "0")  # (the heuristic's buckets: no timing per build)


def _graph(ctx, w):
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="float32", shape=[D("m", MAX_M), K])
    return b.build_sync({"z": b.relu(b.matmul(a, b.constant(w)))})


def _ref(x, w):
    return np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)


def _keys(g, m):
    """Pipeline keys of the launches a dispatch at M = m runs (no workgroups: not run)."""
    off = set(g._dyn.launch_data({"m": m}).off or ())
    return {k.key for i, k in enumerate(g._kernels) if i not in off}


def _created(g):
    return {k.key for k, e in zip(g._kernels, g._launches) if e[0] is not None}


def _check(ctx, g, w, m, rng):
    x = rng.standard_normal((m, K)).astype(np.float32)
    got = dispatch_at(ctx, g, {"a": x})["z"]
    np.testing.assert_allclose(got, _ref(x, w), rtol=1e-4, atol=1e-4 * max(1.0, np.abs(_ref(x, w)).max()))


def test_buckets_created_at_first_use(ctx, rng):
    w = rng.standard_normal((K, N)).astype(np.float32)
    g = _graph(ctx, w)
    lazy = set(g._dyn.maybe_off)
    assert len(lazy) >= 2  # the GEMV bucket and at least one tiled one (gated launches)
    ungated = {k.key for i, k in enumerate(g._kernels) if i not in lazy}
    assert _created(g) == ungated and g.pipelines_created == len(ungated) < g.pipelines
    _check(ctx, g, w, 3, rng)  # the GEMV bucket only
    small = _keys(g, 3)
    assert _created(g) == small and g.pipelines_created == len(small) < g.pipelines
    made = {n for n, e in zip(g.kernel_names, g._launches) if e[0] is not None}
    assert any("gemv" in n for n in made) and not any("gemv" not in n and "matmul" in n for n in made), made
    _check(ctx, g, w, 200, rng)  # a tiled bucket: created now, the GEMV one kept
    assert _created(g) == small | _keys(g, 200) and _keys(g, 200) - small
    for m in (1, 4, 5, 17, 64, 129, MAX_M):  # every bucket: each made once, results right
        _check(ctx, g, w, m, rng)
    assert g.pipelines_created == g.pipelines
    g.destroy()


def test_skipped_launches_keep_replay_state(ctx, rng):
    """Alternating sizes in two buckets on one tensor set: the replay lists per pattern of skipped
    launches, and the pass's pipeline state across dispatches, stay right (no read between)."""
    w = rng.standard_normal((K, N)).astype(np.float32)
    g = _graph(ctx, w)
    xs = {m: rng.standard_normal((m, K)).astype(np.float32) for m in (2, 150)}
    ins = {m: ctx.create_tensor_sync(data_type="float32", shape=(m, K), writable=True) for m in xs}
    outs = {m: ctx.create_tensor_sync(data_type="float32", shape=(m, N), readable=True) for m in xs}
    for m, x in xs.items():
        ctx.write_tensor(ins[m], x)
    for _ in range(3):
        for m in xs:
            ctx.dispatch(g, {"a": ins[m]}, {"z": outs[m]})
    for m, x in xs.items():
        np.testing.assert_allclose(ctx.read_tensor_sync(outs[m]), _ref(x, w), rtol=1e-4, atol=1e-3)
    for t in [*ins.values(), *outs.values()]:
        t.destroy()
    g.destroy()


def test_two_threads_reach_new_buckets_at_once(ctx, rng):
    w = rng.standard_normal((K, N)).astype(np.float32)
    g = _graph(ctx, w)
    sizes = [2, 200, 3, 100]
    xs = [np.random.default_rng(i).standard_normal((m, K)).astype(np.float32) for i, m in enumerate(sizes)]
    start = threading.Barrier(len(sizes))

    def run(i):
        start.wait()
        for _ in range(3):
            got = dispatch_at(ctx, g, {"a": xs[i]})["z"]
            np.testing.assert_allclose(got, _ref(xs[i], w), rtol=1e-4, atol=1e-3)

    in_threads(run, [(i,) for i in range(len(sizes))])
    want = set().union(*(_keys(g, m) for m in sizes))
    assert _created(g) == want
    # each launch made once: its pipeline object is the device cache's (no second creation)
    from mltensor.runtime.wgsl import pipeline

    for k, e in zip(g._kernels, g._launches):
        if e[0] is not None:
            assert pipeline(ctx.device, k)[0] is e[0]
    g.destroy()


def test_graph_cache_round_trip_creates_lazily(ctx, rng, tmp_path, monkeypatch):
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLTENSOR_GRAPH_CACHE", raising=False)
    w = rng.standard_normal((K, N)).astype(np.float32)
    g = _graph(ctx, w)
    ctx.save_graph_sync("lazy", g)  # before any dispatch: the gated launches have no pipeline yet
    h = ctx.load_graph_sync("lazy")
    lazy = set(h._dyn.maybe_off)
    assert lazy == set(g._dyn.maybe_off) and h._lazy == len(lazy)
    assert h.pipelines == g.pipelines and h.kernel_names == g.kernel_names
    _check(ctx, h, w, 2, rng)
    assert _created(h) == _keys(h, 2)
    _check(ctx, h, w, 150, rng)
    assert _created(h) == _keys(h, 2) | _keys(h, 150)
    ctx.save_graph_sync("lazy2", h)  # a loaded graph saves its WGSL sources again
    h2 = ctx.load_graph_sync("lazy2")
    _check(ctx, h2, w, 150, rng)
    for x in (g, h, h2):
        x.destroy()


def test_profile_lists_the_launches_run(ctx, rng):
    if "timestamp-query" not in ctx.device.features:
        pytest.skip("no timestamp-query")
    from mltensor.runtime.profiler import profile_dispatch

    w = rng.standard_normal((K, N)).astype(np.float32)
    g = _graph(ctx, w)
    x = ctx.create_tensor_sync(data_type="float32", shape=(2, K), writable=True)
    ctx.write_tensor(x, rng.standard_normal((2, K)).astype(np.float32))
    z = ctx.create_tensor_sync(data_type="float32", shape=(2, N), readable=True)
    off = set(g._dyn.launch_data({"m": 2}).off or ())
    rows = profile_dispatch(ctx, g, {"a": x}, {"z": z}, repeat=1)
    assert [n for n, _ in rows] == [n for i, n in enumerate(g.kernel_names) if i not in off]
    assert len(rows) < len(g.kernel_names)
    for t in (x, z, g):
        t.destroy()


def test_destroyed_tensors_leave_the_replay_cache(ctx, rng):
    """Replay lists per (tensor set, launches left out) are dropped with their tensors."""
    w = rng.standard_normal((K, N)).astype(np.float32)
    g = _graph(ctx, w)
    _check(ctx, g, w, 2, rng)  # (dispatch_at destroys its tensors)
    _check(ctx, g, w, 150, rng)
    assert not g._bg_cache
    g.destroy()
