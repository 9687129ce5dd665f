"""The compiled replay loop (mltensor/runtime/replay.c, replay.py): where a C compiler exists it is
built and used, and graph dispatch gives the same results through it as through the Python loop
(checked against numpy) across tensor sets, interleaved graphs and repeated pipelines; without a
compiler, or switched off, Python replays and status() says why."""

import shutil

import numpy as np
import pytest

import mltensor
from mltensor.runtime import replay


def test_built_and_used_where_a_compiler_exists(ctx, monkeypatch):
    if not shutil.which("cc") and not shutil.which("gcc"):
        pytest.skip("no C compiler here")
    if not type(ctx.device).__module__.startswith("wgpu.backends.wgpu_native"):
        pytest.skip("another wgpu backend")
    monkeypatch.delenv("MLTENSOR_NO_NATIVE_REPLAY", raising=False)  # whatever this run's setting
    monkeypatch.setattr(replay, "_state", {"lib": None, "tried": False, "status": ""})
    assert replay.loaded() is not None, replay.status()
    assert replay.status().startswith("native ("), replay.status()


def _graphs(ctx):
    """Two graphs: a 61-kernel chain (runs of one pipeline, alternating pipelines) and a small one."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 4])
    s = b.input("s", data_type="float32", shape=[4, 4])
    y, flat = x, b.reshape(s, [16])
    for i in range(60):  # reshapes keep the elementwise nodes from fusing into one kernel
        t = b.add(y, s if i % 2 == 0 else flat) if i % 3 else b.mul(y, b.constant(data_type="float32", value=0.5))
        y = b.reshape(t, [16] if i % 2 == 0 else [4, 4])
    g1 = b.build_sync({"y": b.relu(y)})
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 4])
    g2 = b.build_sync({"y": b.matmul(x, x)})
    return g1, g2


def _ref1(x, s):
    y = x.astype(np.float64)
    for i in range(60):
        y = y + s if i % 3 else y * 0.5
    return np.maximum(y, 0)


@pytest.mark.parametrize("native", [True, False], ids=["compiled", "python"])
def test_replay_paths_agree_with_numpy(ctx, rng, monkeypatch, native):
    if native and replay.loaded() is None:
        pytest.skip(replay.status())
    if not native:
        monkeypatch.setitem(replay._state, "tried", True)
        monkeypatch.setitem(replay._state, "lib", None)
    g1, g2 = _graphs(ctx)
    assert len(g1.kernel_names) == 61
    sets = []
    for _ in range(2):  # two tensor sets: the second rebinds the launches that touch them
        t = {k: ctx.create_tensor_sync(data_type="float32", shape=[4, 4], writable=True) for k in "xs"}
        vals = {k: rng.standard_normal((4, 4)).astype(np.float32) for k in "xs"}
        for k in "xs":
            ctx.write_tensor(t[k], vals[k])
        sets.append((t, vals, ctx.create_tensor_sync(data_type="float32", shape=[4, 4], readable=True)))
    o2 = ctx.create_tensor_sync(data_type="float32", shape=[4, 4], readable=True)
    for rnd in range(3):
        for t, vals, out in sets:  # A, B, A, B...: cached sets, and another graph in between
            ctx.dispatch(g1, t, {"y": out})
            ctx.dispatch(g2, {"x": t["x"]}, {"y": o2})
            ctx.dispatch(g1, t, {"y": out})  # the pass already holds g1's last pipeline
            np.testing.assert_allclose(ctx.read_tensor_sync(out), _ref1(vals["x"], vals["s"]), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(ctx.read_tensor_sync(o2), vals["x"] @ vals["x"], rtol=1e-5, atol=1e-5)
    g1.destroy()
    g2.destroy()


def test_no_compiler_falls_back(monkeypatch, tmp_path):
    monkeypatch.delenv("MLTENSOR_NO_NATIVE_REPLAY", raising=False)
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))  # nothing built yet there
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(replay, "_state", {"lib": None, "tried": False, "status": ""})
    assert replay.loaded() is None
    assert replay.status().startswith("unavailable (") and "Python replay" in replay.status()
    with pytest.raises(RuntimeError, match="no-such-compiler|failed"):
        replay.build()


def test_switched_off(monkeypatch):
    monkeypatch.setenv("MLTENSOR_NO_NATIVE_REPLAY", "1")
    monkeypatch.setattr(replay, "_state", {"lib": None, "tried": False, "status": ""})
    assert replay.loaded() is None and replay.status().startswith("off")
