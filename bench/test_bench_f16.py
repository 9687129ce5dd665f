"""float16 computed in f16 (the context uses "shader-f16") against float32, the same graph on the
same adapter in the same run: time (ratio = float32 time / float16 time, > 1: f16 is faster) and
bytes moved.

Graphs: a square matmul (1024 by default, MLTENSOR_BENCH_F16_N=4096 for the issue's size, which
takes minutes on a software adapter), ResNet-50 (the ONNX light model with random weights,
converted to float16 with onnxconverter-common, keep_io_types=False) and MediaPipe selfie
segmentation 256x256 (TFLite, float16 weights; float16=True). Where the adapter has no shader-f16
the float16 figures are the f32 path behind edge conversions (recorded as `f16_native: False`).

The two are measured alternately, one round each in turn (`_paired`), so that load from other
processes on a shared machine hits both alike.

Bytes: `bytes_per_run` is what one dispatch binds, counted from the graph (every buffer it owns:
weights, pooled intermediates) plus its input and output tensors; `bytes_uploaded` is what the
build uploaded (weights). Targets on a GPU (not measurable on a software adapter, whose f16
arithmetic is scalar code on the CPU): matmul f16 >= 1.7x the f32 rate, resnet50 f16 >= 1.5x.
"""

import os
import sys

import numpy as np
import pytest

import mltensor
from mltensor import InferenceSession, models

from .timing import measure, record

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))


def _paired(run16, wait16, run32, wait32, rounds, warmup=1):
    """measure() of two workloads, alternating one round of each: (float16 figures, float32)."""
    ms = [[], []]
    for r in range(rounds + warmup):
        for k, (run, wait) in enumerate(((run16, wait16), (run32, wait32))):
            m = measure(run, wait, rounds=1, warmup=0)
            if r >= warmup:
                ms[k].append(m)
    out = []
    for lst in ms:
        med = sorted(lst, key=lambda m: m["total_s"])[len(lst) // 2]
        out.append(dict(med, rounds=len(lst)))
    return out


def _graph_bytes(graph, tensors):
    return sum(b.size for b in graph._buffers) + sum(t._buffer.size for t in tensors)


def test_matmul_f16_vs_f32(benchmark, ctx):
    n = int(os.environ.get("MLTENSOR_BENCH_F16_N", "1024"))
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    w = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    res, out, keep, runs = {}, {}, [], {}
    for dt in ("float16", "float32"):
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("a", data_type=dt, shape=[n, n])
        up = ctx.counters["bytes_uploaded"]
        g = b.build_sync({"y": b.matmul(x, b.constant(w.astype(dt)))})
        uploaded = ctx.counters["bytes_uploaded"] - up
        ta = ctx.create_tensor_sync(data_type=dt, shape=[n, n], writable=True)
        ty = ctx.create_tensor_sync(data_type=dt, shape=[n, n], readable=True)
        ctx.write_tensor(ta, a.astype(dt))
        runs[dt] = (
            lambda g=g, ta=ta, ty=ty: ctx.dispatch(g, {"a": ta}, {"y": ty}),
            lambda ty=ty: ctx.read_tensor_sync(ty),
        )
        res[dt] = (_graph_bytes(g, [ta, ty]), uploaded)
        keep += [g, ta, ty]
    m16, m32 = _paired(*runs["float16"], *runs["float32"], rounds=3)
    for dt in runs:
        runs[dt][0]()
        out[dt] = runs[dt][1]().astype(np.float64)
    ref = a.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64)
    assert np.abs(out["float16"] - ref).max() < 1e-2 * np.sqrt(n)  # correct, or the timing means nothing
    (b16, u16), (b32, u32) = res["float16"], res["float32"]
    record(
        benchmark,
        m16,
        f"matmul {n}x{n} float16",
        m32,
        "float32 (same graph, same adapter)",
        unit="GFLOP/s",
        work=2.0 * n**3,
        f16_native=ctx._f16,
        bytes_per_run_f16=b16,
        bytes_per_run_f32=b32,
        bytes_uploaded_f16=u16,
        bytes_uploaded_f32=u32,
    )
    for o in keep:  # after record(), which runs ours once more
        o.destroy()


def _resnet(ctx):
    onnx = pytest.importorskip("onnx")
    f16conv = pytest.importorskip("onnxconverter_common.float16")
    from test_onnx_models import expose_logits, light_path, randomize_weights, real_inputs

    m32 = expose_logits(randomize_weights(onnx.load(light_path("resnet50")), 0))
    (vi,) = real_inputs(m32)
    shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    return m32, f16conv.convert_float_to_float16(m32, keep_io_types=False), vi.name, x


def _graph_of(sess):
    return sum(b.size for b in sess._spec.graph._buffers)


def test_resnet50_f16_vs_f32(benchmark, ctx):
    m32, m16, name, x = _resnet(ctx)
    rounds = int(os.environ.get("MLTENSOR_BENCH_F16_ROUNDS", "2"))
    s16, s32 = InferenceSession(m16, ctx), InferenceSession(m32, ctx)
    feeds16, feeds32 = {name: x.astype(np.float16)}, {name: x.astype(np.float16).astype(np.float32)}
    o16, o32 = s16.run(None, feeds16), s32.run(None, feeds32)  # builds
    f16, f32 = _paired(lambda: s16.run(None, feeds16), None, lambda: s32.run(None, feeds32), None, rounds)
    b16, b32 = _graph_of(s16), _graph_of(s32)
    rel = float(np.abs(o16[-1].astype(np.float64) - o32[-1]).max() / np.abs(o32[-1]).max())
    assert rel < 1e-2, rel
    record(
        benchmark,
        f16,
        "resnet50 (ONNX light, random weights) float16",
        f32,
        "float32 model",
        f16_native=ctx._f16,
        graph_bytes_f16=b16,
        graph_bytes_f32=b32,
        max_rel_err_logits=rel,
    )
    s16.close()
    s32.close()  # (record() ran ours once more before)


def test_selfie_f16_vs_f32(benchmark, ctx):
    from test_tflite import _photo

    try:
        path = models.fetch("selfie_segmentation", progress=False)
    except models.FetchError as e:
        pytest.skip(f"model unavailable: {e}")
    x = _photo(256, 256)
    res, sess = {}, {}
    for f16 in (True, False):
        up = ctx.counters["bytes_uploaded"]
        s = sess[f16] = InferenceSession(path, ctx, float16=f16)  # builds (TFLite): uploads the weights
        up = ctx.counters["bytes_uploaded"] - up
        name = s.get_inputs()[0].name
        res[f16] = [None, _graph_of(s), up, s.run(None, {name: x})[0]]
    res[True][0], res[False][0] = _paired(
        lambda: sess[True].run(None, {name: x}), None, lambda: sess[False].run(None, {name: x}), None, 10
    )
    err = float(np.abs(res[True][3].astype(np.float64) - res[False][3]).mean())
    assert err < 1e-3, err
    record(
        benchmark,
        res[True][0],
        "selfie segmentation 256x256 float16 (float16 weights)",
        res[False][0],
        "float32 import",
        f16_native=ctx._f16,
        graph_bytes_f16=res[True][1],
        graph_bytes_f32=res[False][1],
        bytes_uploaded_f16=res[True][2],
        bytes_uploaded_f32=res[False][2],
        mean_abs_err_mask=err,
    )
    for s in sess.values():
        s.close()
