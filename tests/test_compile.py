"""Parallel kernel compilation (runtime/compile.py): results do not depend on the thread count,
failures name the kernel, and on CPU adapters the JIT warm-up remembers what this machine's
driver has compiled."""

import glob
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import mltensor
from mltensor import ml
from mltensor.runtime import compile as C


def _many_kernels(ctx, n=12):
    """A chain of n elementwise kernels of different sizes (each its own pipeline)."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[64])
    outs = {}
    for i in range(n):
        y = b.slice(x, [0], [64 - 4 * i]) if i else x
        outs[f"y{i}"] = b.softmax(
            b.reshape(b.mul(y, b.constant(data_type="float32", value=float(i + 1))), [1, 64 - 4 * i]), 1
        )
    return b.build_sync(outs), outs


def _run(ctx, g, xv):
    t = ctx.create_tensor_sync(data_type="float32", shape=[64], writable=True)
    ctx.write_tensor(t, xv)
    outs = {
        n: ctx.create_tensor_sync(data_type=dt, shape=s, readable=True) for n, (dt, s) in g.output_descriptors.items()
    }
    ctx.dispatch(g, {"x": t}, outs)
    return {n: ctx.read_tensor_sync(o) for n, o in outs.items()}


@pytest.mark.parametrize("threads", ["1", "4"])
def test_results_do_not_depend_on_compile_threads(monkeypatch, threads, rng):
    monkeypatch.setenv("MLTENSOR_COMPILE_THREADS", threads)
    assert C.threads() == int(threads)
    ctx = ml.create_context_sync()  # a new device: nothing compiled yet
    g, _ = _many_kernels(ctx)
    xv = rng.standard_normal(64).astype(np.float32)
    got = _run(ctx, g, xv)
    for i in range(12):
        z = xv[: 64 - 4 * i] * (i + 1)
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        np.testing.assert_allclose(got[f"y{i}"].reshape(-1), want, rtol=1e-5, atol=1e-7)
    ctx.destroy()


def test_a_kernel_that_fails_to_compile_is_named(monkeypatch, fresh_ctx):
    from mltensor.runtime import wgsl

    real = wgsl.Kernel.source

    def broken(self):
        src = real(self)
        return src.replace("fn main", "fn main_broken", 1) if "softmax" in self.name else src

    monkeypatch.setattr(wgsl.Kernel, "source", broken)
    monkeypatch.setenv("MLTENSOR_COMPILE_THREADS", "4")
    with pytest.raises(mltensor.OperationError, match=r"kernel softmax\S* failed to compile"):
        _many_kernels(fresh_ctx)


def test_threads_setting_is_validated(monkeypatch):
    monkeypatch.setenv("MLTENSOR_COMPILE_THREADS", "zero")
    assert 1 <= C.threads() <= 8
    monkeypatch.setenv("MLTENSOR_COMPILE_THREADS", "0")
    assert C.threads() == 1


def _two_processes(script, tmp_path):
    """The outputs of `script` run in two fresh processes, one after the other, on caches that
    start empty under tmp_path (2 compile threads, Mesa's disk cache on)."""
    env = dict(
        os.environ,
        MLTENSOR_CACHE=str(tmp_path),
        MLTENSOR_COMPILE_THREADS="2",
        MESA_SHADER_CACHE_DIR=str(tmp_path / "mesa"),
    )
    env.pop("MESA_SHADER_CACHE_DISABLE", None)
    out = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout)
    return out


def test_cpu_warm_up_remembers_compiled_kernels(tmp_path):
    """In a fresh process (nothing compiled in it), a CPU adapter's build records the kernels its
    driver compiled; a second process finds them all recorded and warms nothing up."""
    ctx = ml.create_context_sync()
    if str(ctx._adapter_info.get("adapter_type", "")).upper() != "CPU":
        pytest.skip("the JIT warm-up is for Mesa's CPU drivers")
    script = textwrap.dedent("""
        import numpy as np, mltensor
        from mltensor import ml
        from mltensor.runtime import compile as C
        calls = []
        real = C._helper_devices
        C._helper_devices = lambda *a: calls.append(1) or real(*a)
        ctx = ml.create_context_sync()
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[256])
        # (a different operator each: kernels differing only in size share one pipeline)
        ops = ["sigmoid", "tanh", "sin", "exp", "cos", "abs", "neg", "sqrt"]
        ys = {f"y{i}": getattr(b, op)(b.mul(b.slice(x, [0], [256 - 8 * i]),
                                             b.constant(data_type="float32", value=i + 0.5)))
              for i, op in enumerate(ops)}
        g = b.build_sync(ys)
        t = ctx.create_tensor_sync(data_type="float32", shape=[256], writable=True)
        ctx.write_tensor(t, np.ones(256, np.float32))
        outs = {n: ctx.create_tensor_sync(data_type="float32", shape=s, readable=True)
                for n, (_, s) in g.output_descriptors.items()}
        ctx.dispatch(g, {"x": t}, outs)
        got = ctx.read_tensor_sync(outs["y3"])
        assert np.allclose(got, np.exp(3.5)), got[:4]
        print("warmed", len(calls))
    """)
    first, second = _two_processes(script, tmp_path)
    assert "warmed 1" in first
    (index,) = glob.glob(str(tmp_path / "compiled" / "*.txt"))
    assert len(open(index).read().split()) >= 8
    assert "warmed 0" in second


def test_cpu_warm_up_of_dynamic_kernels(tmp_path):
    """Kernels reading dynamic dimensions (immediate data) are warmed too, at the graph's first
    dispatch with the size buckets it runs: their empty dispatches set zero sizes (no error), the
    index records them, and a second process warms nothing."""
    ctx = ml.create_context_sync()
    if str(ctx._adapter_info.get("adapter_type", "")).upper() != "CPU":
        pytest.skip("the JIT warm-up is for Mesa's CPU drivers")
    script = textwrap.dedent("""
        import numpy as np, mltensor
        from mltensor import ml
        from mltensor.dynamic.dims import MLDynamicDimension as D
        from mltensor.runtime import compile as C
        done = []
        real = C._record_empty
        def record(dev, enc, pipe, bgl, k):
            real(dev, enc, pipe, bgl, k)
            done.append(k.immediates())
        C._record_empty = record
        ctx = ml.create_context_sync()
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[1, 8, D("H", 64), D("W", 64)])
        w = np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32)
        y = b.conv2d(x, b.constant(w), padding=[1, 1, 1, 1], strides=[2, 2])
        y = b.sigmoid(b.conv2d(b.relu(y), b.constant(np.ones((4, 16, 1, 1), np.float32))))
        z = b.max_pool2d(b.tanh(b.resample2d(y, scales=[2.0, 2.0])), window_dimensions=[3, 3], strides=[2, 2])
        g = b.build_sync({"y": b.average_pool2d(y), "z": b.reduce_sum(b.exp(z), axes=[2, 3])})
        print(len(g.kernel_names), g.kernel_names)
        assert not done  # (not at build: at the first dispatch)
        xv = np.random.default_rng(1).standard_normal((1, 8, 40, 24)).astype(np.float32)
        t = ctx.create_tensor_sync(data_type="float32", shape=xv.shape, writable=True)
        ctx.write_tensor(t, xv)
        outs = {n: ctx.create_tensor_sync(data_type="float32", shape=s, readable=True)
                for n, s in g.compute_shapes({"x": xv.shape}).items()}
        ctx.dispatch(g, {"x": t}, outs)
        assert ctx.read_tensor_sync(outs["y"]).shape == (1, 4, 1, 1)
        print("warmed", len(done), "with immediates", sum(1 for n in done if n))
    """)
    first, second = _two_processes(script, tmp_path)
    words = first.split()
    n, imm = int(words[-4]), int(words[-1])
    assert n >= 4 and imm >= 4, first
    assert "warmed 0" in second, second


def test_warm_up_order_starts_the_costliest():
    """Loops with small literal trip counts count as their unrolled copies: a shorter kernel with
    4 loops of 24 goes before a longer straight one (the warm-up's last kernel runs alone)."""
    loops = "fn main() {\n" + "    for (var ic = 0u; ic < 24u; ic = ic + 1u) { acc = fma(a, b, acc); }\n" * 4 + "}\n"
    straight = "fn main() {\n" + "    acc = fma(a, b, acc);\n" * 60 + "}\n"
    assert len(loops) < len(straight) and C._cost(loops) > C._cost(straight)
    assert C._cost("for (var i = 0u; i < 4096u; i = i + 1u) {}") == len("for (var i = 0u; i < 4096u; i = i + 1u) {}")
