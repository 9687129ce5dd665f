"""The GEMM/conv autotuner on lavapipe: off by default on a CPU adapter (the heuristic, today's
lavapipe tiles), forced on with MLTENSOR_AUTOTUNE=1 it times candidates, persists the choice per
adapter and signature, and a second build or a fresh process pays nothing."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from helpers import run_graph

import mltensor
from mltensor.runtime import autotune


def _graph(ctx, M=96, K=600, N=72):
    b = mltensor.MLGraphBuilder(ctx)
    z = b.relu(b.matmul(b.input("a", data_type="float32", shape=(M, K)), b.constant(np.ones((K, N), np.float32))))
    return b, z


def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    autotune._tables.clear()


def test_off_by_default_on_cpu_adapter(ctx, monkeypatch, tmp_path):
    if str(ctx.device.adapter.info.get("adapter_type", "")).upper() != "CPU":
        pytest.skip("a hardware adapter tunes by default")
    _fresh(monkeypatch, tmp_path)
    monkeypatch.delenv("MLTENSOR_AUTOTUNE", raising=False)
    assert not autotune.enabled(ctx.device)
    before = dict(autotune.STATS)
    b, z = _graph(ctx)
    names = b.build_sync({"z": z}).kernel_names
    assert autotune.STATS["tuned"] == before["tuned"]
    assert any(re.search(r"_t8x\d+k4w8d$", n) for n in names), names  # the CPU adapters' DIRECT tile
    assert not os.path.exists(os.path.join(tmp_path, "autotune"))


def test_forced_tuning_persists_and_second_build_is_free(ctx, rng, monkeypatch, tmp_path):
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("MLTENSOR_AUTOTUNE", "1")
    assert autotune.enabled(ctx.device)
    t0 = dict(autotune.STATS)
    b, z = _graph(ctx)
    A = rng.standard_normal((96, 600)).astype(np.float32)
    build = b.build_sync
    built = []
    b.build_sync = lambda outs: built.append(build(outs)) or built[-1]
    got = run_graph(ctx, {"z": z}, {"a": A}, b)["z"]
    # the build shows what tuning cost it
    assert built[0].autotune["signatures_tuned"] == 1 and built[0].autotune["seconds"] > 0
    np.testing.assert_allclose(
        got, np.maximum(A.astype(np.float64).sum(1, keepdims=True), 0) * np.ones((1, 72)), rtol=1e-4, atol=1e-3
    )
    assert autotune.STATS["tuned"] == t0["tuned"] + 1
    assert autotune.STATS["seconds"] > t0["seconds"]
    files = os.listdir(os.path.join(tmp_path, "autotune"))
    assert len(files) == 1
    data = json.load(open(os.path.join(tmp_path, "autotune", files[0])))
    assert data["adapter"] == autotune.adapter_key(ctx.device)
    (entry,) = data["entries"].values()
    assert 0 <= entry["best"] < entry["n"] and len(entry["us"]) == entry["n"]

    # second build in this process: a cache hit, no timing
    t1 = dict(autotune.STATS)
    b, z = _graph(ctx)
    g = b.build_sync({"z": z})
    assert autotune.STATS["tuned"] == t1["tuned"]
    assert autotune.STATS["cache_hits"] == t1["cache_hits"] + 1
    assert g.autotune == {"seconds": 0.0, "signatures_tuned": 0}

    # a fresh process reads the persisted choice
    code = (
        "import numpy as np, mltensor\n"
        "from mltensor.runtime import autotune\n"
        "ctx = mltensor.ml.create_context_sync()\n"
        "b = mltensor.MLGraphBuilder(ctx)\n"
        "z = b.relu(b.matmul(b.input('a', data_type='float32', shape=(96, 600)), b.constant(np.ones((600, 72), np.float32))))\n"
        "b.build_sync({'z': z})\n"
        "print(autotune.STATS['tuned'], autotune.STATS['cache_hits'])\n"
    )
    env = dict(os.environ, MLTENSOR_CACHE=str(tmp_path), MLTENSOR_AUTOTUNE="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "1"]


def test_budget_bounds_tuning(ctx, monkeypatch, tmp_path):
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("MLTENSOR_AUTOTUNE", "1")
    monkeypatch.setenv("MLTENSOR_AUTOTUNE_BUDGET", "0")
    t0 = dict(autotune.STATS)
    b, z = _graph(ctx)
    b.build_sync({"z": z})
    assert autotune.STATS["tuned"] == t0["tuned"]  # budget spent: heuristic, nothing persisted
    assert not os.path.exists(os.path.join(tmp_path, "autotune"))


def test_budget_running_out_mid_signature(ctx, monkeypatch, tmp_path):
    """A budget smaller than one candidate's timing: the heuristic's candidate is timed first and
    the tuner stops there (one candidate past the budget at most), persists nothing, and the
    graph is still right."""
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setenv("MLTENSOR_AUTOTUNE", "1")
    monkeypatch.setenv("MLTENSOR_AUTOTUNE_BUDGET", "1e-9")
    measured = []
    real = autotune.time_launches
    monkeypatch.setattr(autotune, "time_launches", lambda *a, **k: measured.append(1) or real(*a, **k))
    t0 = dict(autotune.STATS)
    b, z = _graph(ctx)
    A = np.ones((96, 600), np.float32)
    got = run_graph(ctx, {"z": z}, {"a": A}, b)["z"]
    np.testing.assert_allclose(got, np.full((96, 72), 600.0), rtol=1e-5)
    assert len(measured) == 1
    assert autotune.STATS["tuned"] == t0["tuned"]
    assert not os.path.exists(os.path.join(tmp_path, "autotune"))
