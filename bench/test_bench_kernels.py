"""GEMM/conv kernel family (issue 14): our GPU time from timestamp queries against a same-run
reference: PyTorch CUDA fp32 (cuDNN, cuBLAS; TF32 off) when importable, else onnxruntime CPU on
the same single conv. Per-layer resnet50 conv table, matmul TFLOP/s, and session latency of the
light ONNX models. Big cases are skipped on CPU adapters (lavapipe). The GPU is warmed for a
second first (idle clocks read ~3x slow). Measurement code: bench/kernels.py."""

import os
import sys

import numpy as np
import pytest

from .kernels import (
    RESNET50_CONVS,
    ours_conv,
    ours_matmul,
    session_rows,
    torch_conv,
    torch_cuda,
    torch_matmul,
    warm_gpu,
)
from .timing import adapter_name, measure, record


def _cpu(ctx):
    return str(ctx.device.adapter.info.get("adapter_type", "")).upper() == "CPU"


def _as_measure(seconds):
    return {"total_s": seconds, "enqueue_s": 0.0, "run": lambda: None}


@pytest.fixture(scope="module", autouse=True)
def _warm():
    warm_gpu(1.0)


@pytest.mark.parametrize("n", [1024, 2048, 4096])
def test_matmul_tflops(benchmark, ctx, n):
    if n > 1024 and _cpu(ctx):
        pytest.skip("big GEMMs only on hardware adapters")
    t, build_s, tune_s, names = ours_matmul(ctx, n)
    torch = torch_cuda()
    ref = _as_measure(torch_matmul(torch, n)) if torch else None
    info = record(
        benchmark,
        _as_measure(t),
        f"kernels matmul {n} (GPU time)",
        ref,
        "cuBLAS fp32 (torch)",
        unit="GFLOP/s",
        work=2 * n**3,
        kernels=names,
        build_s=build_s,
        tune_s=tune_s,
        adapter=adapter_name(ctx),
    )
    print(f"\nmatmul {n}: {info['ours_rate'] / 1e3:.1f} TFLOP/s ({' + '.join(names)})")


def _ort_conv(xs, ws, stride):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    p = ws[2] // 2
    w = numpy_helper.from_array(np.zeros(ws, np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[p] * 4, strides=[stride] * 2)
    g = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.zeros(xs, np.float32)
    return measure(lambda: s.run(None, {"x": x}), rounds=5, warmup=1)


@pytest.mark.parametrize("layer", range(len(RESNET50_CONVS)))
def test_resnet50_conv_layer(benchmark, ctx, layer):
    xs, ws, st, count = RESNET50_CONVS[layer]
    t, build_s, tune_s, names = ours_conv(ctx, xs, ws, st)
    torch = torch_cuda()
    if torch:
        ref, ref_name = _as_measure(torch_conv(torch, xs, ws, st)), "cuDNN fp32 (torch eager, conv+relu)"
    else:
        ref, ref_name = _ort_conv(xs, ws, st), "onnxruntime CPU (same conv)"
    flops = 2 * np.prod(ws[1:]) * ws[0] * (xs[2] // st) * (xs[3] // st)
    record(
        benchmark,
        _as_measure(t),
        f"kernels resnet50 conv {layer:02d} {list(ws)} s{st} x{count}",
        ref,
        ref_name,
        unit="GFLOP/s",
        work=float(flops),
        kernels=names,
        count=count,
        tune_s=tune_s,
        adapter=adapter_name(ctx),
    )


SESSIONS = ["resnet50", "vgg19", "densenet121", "inception_v1", "squeezenet", "shufflenet"]


@pytest.mark.parametrize("name", SESSIONS)
def test_session_latency_vs_references(benchmark, ctx, name):
    if _cpu(ctx) and name in ("vgg19", "densenet121", "inception_v1", "resnet50"):
        pytest.skip("big models only on hardware adapters (bench/test_bench_onnx.py covers resnet50 there)")
    pytest.importorskip("onnx")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    (row,) = [r for r in session_rows(ctx, torch_cuda(), [name]) if r.startswith(f"| {name}")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    ours_ms, ort_ms, torch_ms = (float(c) for c in cells[3:6])
    info = record(
        benchmark,
        _as_measure(ours_ms * 1e-3),
        f"kernels session {name}",
        _as_measure(ort_ms * 1e-3),
        "onnxruntime CPU",
        first_build=cells[1],
        second_build_s=cells[2],
        torch_cuda_ms=torch_ms,
        adapter=adapter_name(ctx),
    )
    print(
        f"\n{name}: ours {ours_ms:.2f} ms, onnxruntime CPU {ort_ms:.2f} ms, torch CUDA {torch_ms:.2f} ms "
        f"(ratio vs ort {info['ratio']:.2f})"
    )
