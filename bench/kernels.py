"""GEMM/conv kernel measurements shared by bench/test_bench_kernels.py and the GPU report script
(`python -m bench.kernels --out FILE`): our GPU time per kernel from timestamp queries
(runtime/profiler.py), beside PyTorch (cuDNN / cuBLAS fp32, TF32 off) when torch with CUDA is
importable, else onnxruntime CPU on the same single conv / matmul model.
"""

import argparse
import os
import time

import numpy as np

import mltensor
from mltensor.runtime import autotune
from mltensor.runtime.profiler import profile_dispatch

# resnet50 (onnx light model) conv layers: (input NCHW, filter OIHW, stride, count in the model);
# padding k // 2. From ../shared/gpu/h100-2026-11-22/conv-vs-cudnn.txt.
RESNET50_CONVS = [
    ((1, 3, 224, 224), (64, 3, 7, 7), 2, 1),
    ((1, 64, 56, 56), (64, 64, 1, 1), 1, 1),
    ((1, 64, 56, 56), (64, 64, 3, 3), 1, 3),
    ((1, 64, 56, 56), (256, 64, 1, 1), 1, 4),
    ((1, 256, 56, 56), (64, 256, 1, 1), 1, 2),
    ((1, 256, 56, 56), (128, 256, 1, 1), 1, 1),
    ((1, 128, 56, 56), (128, 128, 3, 3), 2, 1),
    ((1, 128, 28, 28), (512, 128, 1, 1), 1, 4),
    ((1, 256, 56, 56), (512, 256, 1, 1), 2, 1),
    ((1, 512, 28, 28), (128, 512, 1, 1), 1, 3),
    ((1, 128, 28, 28), (128, 128, 3, 3), 1, 3),
    ((1, 512, 28, 28), (256, 512, 1, 1), 1, 1),
    ((1, 256, 28, 28), (256, 256, 3, 3), 2, 1),
    ((1, 256, 14, 14), (1024, 256, 1, 1), 1, 6),
    ((1, 512, 28, 28), (1024, 512, 1, 1), 2, 1),
    ((1, 1024, 14, 14), (256, 1024, 1, 1), 1, 5),
    ((1, 256, 14, 14), (256, 256, 3, 3), 1, 5),
    ((1, 1024, 14, 14), (512, 1024, 1, 1), 1, 1),
    ((1, 512, 14, 14), (512, 512, 3, 3), 2, 1),
    ((1, 512, 7, 7), (2048, 512, 1, 1), 1, 3),
    ((1, 1024, 14, 14), (2048, 1024, 1, 1), 2, 1),
    ((1, 2048, 7, 7), (512, 2048, 1, 1), 1, 2),
    ((1, 512, 7, 7), (512, 512, 3, 3), 1, 2),
]


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.allow_tf32 = False  # fp32 against fp32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    return torch


def warm_gpu(seconds=1.0):
    """Idle GPU clocks read ~3x slow: keep the GPU busy for a second before timing."""
    torch = torch_cuda()
    if torch is not None:
        a = torch.randn(2048, 2048, device="cuda")
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ a
        torch.cuda.synchronize()


def gpu_seconds(ctx, builder, outputs, feeds, repeat=5):
    """(sum of our kernels' GPU seconds for one dispatch, build seconds, tuning seconds)."""
    t0 = time.perf_counter()
    tuned0 = autotune.STATS["seconds"]
    g = builder.build_sync(outputs)
    build_s = time.perf_counter() - t0
    tune_s = autotune.STATS["seconds"] - tuned0
    ins = {}
    for name, arr in feeds.items():
        t = ctx.create_tensor_sync(data_type="float32", shape=arr.shape, writable=True)
        ctx.write_tensor(t, arr)
        ins[name] = t
    outs = {
        n: ctx.create_tensor_sync(data_type=dt, shape=s, readable=True) for n, (dt, s) in g.output_descriptors.items()
    }
    rows = profile_dispatch(ctx, g, ins, outs, repeat=repeat)
    for t in list(ins.values()) + list(outs.values()):
        t.destroy()
    g.destroy()
    return sum(t for _, t in rows), build_s, tune_s, [n for n, _ in rows]


def ours_conv(ctx, xs, ws, stride):
    b = mltensor.MLGraphBuilder(ctx)
    k = ws[2]
    p = k // 2
    y = b.conv2d(
        b.input("x", data_type="float32", shape=xs),
        b.constant(np.zeros(ws, np.float32)),
        padding=[p, p, p, p],
        strides=[stride, stride],
        bias=b.constant(np.zeros(ws[0], np.float32)),
    )
    return gpu_seconds(ctx, b, {"y": b.relu(y)}, {"x": np.zeros(xs, np.float32)})


def torch_conv(torch, xs, ws, stride, iters=50):
    x = torch.randn(xs, device="cuda")
    w = torch.randn(ws, device="cuda")
    bias = torch.randn(ws[0], device="cuda")
    p = ws[2] // 2

    def f():
        return torch.relu(torch.nn.functional.conv2d(x, w, bias, stride=stride, padding=p))

    return _cuda_time(torch, f, iters)


def _cuda_time(torch, f, iters):
    for _ in range(5):
        f()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) * 1e-3 / iters


def ours_matmul(ctx, n):
    b = mltensor.MLGraphBuilder(ctx)
    z = b.matmul(b.input("a", data_type="float32", shape=(n, n)), b.input("b", data_type="float32", shape=(n, n)))
    zeros = np.zeros((n, n), np.float32)
    return gpu_seconds(ctx, b, {"z": z}, {"a": zeros, "b": zeros})


def torch_matmul(torch, n, iters=20):
    a = torch.randn(n, n, device="cuda")
    bb = torch.randn(n, n, device="cuda")
    return _cuda_time(torch, lambda: a @ bb, iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sessions", default="resnet50,vgg19,densenet121")
    args = ap.parse_args()
    ctx = mltensor.ml.create_context_sync()
    info = ctx.device.adapter.info
    adapter = f"{info.get('device')} ({info.get('backend_type')}, {info.get('description')})"
    torch = torch_cuda()
    lines = [
        f"# GEMM/conv kernels on {adapter}",
        "",
        f"autotune enabled: {autotune.enabled(ctx.device)}; reference: "
        f"{'torch ' + torch.__version__ + ' CUDA fp32 (TF32 off)' if torch else 'none'}",
        "",
    ]
    warm_gpu()
    lines += [
        "## matmul n x n fp32",
        "",
        "| n | ours ms | TFLOP/s | cuBLAS ms | cuBLAS TFLOP/s | build s (tuning s) | kernel |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in (1024, 2048, 4096):
        t, bs, ts, names = ours_matmul(ctx, n)
        ref = torch_matmul(torch, n) if torch else float("nan")
        fl = 2 * n**3
        lines.append(
            f"| {n} | {t * 1e3:.3f} | {fl / t / 1e12:.1f} | {ref * 1e3:.3f} | {fl / ref / 1e12:.1f} | "
            f"{bs:.2f} ({ts:.2f}) | {' + '.join(names)} |"
        )
        print(lines[-1], flush=True)
    warm_gpu()
    lines += [
        "",
        "## resnet50 conv layers (bias + relu fused), batch 1",
        "",
        "| input | filter | s | count | ours ms | cuDNN ms | ours/cuDNN | build s (tuning s) | kernel |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    tot_o = tot_r = tune = 0.0
    worst = 0.0
    for xs, ws, st, cnt in RESNET50_CONVS:
        t, bs, ts, names = ours_conv(ctx, xs, ws, st)
        ref = torch_conv(torch, xs, ws, st) if torch else float("nan")
        tot_o += cnt * t
        tot_r += cnt * ref
        tune += ts
        worst = max(worst, t / ref) if torch else worst
        lines.append(
            f"| {list(xs)} | {list(ws)} | {st} | {cnt} | {t * 1e3:.3f} | {ref * 1e3:.3f} | {t / ref:.2f} | "
            f"{bs:.2f} ({ts:.2f}) | {' + '.join(names)} |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        f"**resnet50 conv layers summed: ours {tot_o * 1e3:.2f} ms, cuDNN {tot_r * 1e3:.2f} ms, "
        f"ratio {tot_o / tot_r:.2f}x (worst layer {worst:.2f}x); tuning {tune:.1f} s in all**",
        "",
    ]
    print(lines[-2], flush=True)
    if args.sessions:
        lines += session_rows(ctx, torch, args.sessions.split(","))
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")


def session_rows(ctx, torch, names):
    import sys

    import onnx

    from mltensor import InferenceSession

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_onnx_models import light_path, randomize_weights, real_inputs

    from .timing import measure

    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    rows = [
        "## InferenceSession latency, batch 1 (numpy in, numpy out)",
        "",
        "| model | first build s (tuning s) | second build s | ours ms | onnxruntime CPU ms | torch CUDA ms |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        m = randomize_weights(onnx.load(light_path(name)))
        (vi,) = real_inputs(m)
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        tune0 = autotune.STATS["seconds"]
        t0 = time.perf_counter()
        sess = InferenceSession(m, ctx)
        b1 = time.perf_counter() - t0
        tune = autotune.STATS["seconds"] - tune0
        t0 = time.perf_counter()
        InferenceSession(m, ctx).close()
        b2 = time.perf_counter() - t0
        warm_gpu(0.5)
        ours = measure(lambda: sess.run(None, {vi.name: x}), rounds=20, warmup=3)["total_s"]
        ref = float("nan")
        if ort is not None:
            r = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
            ref = measure(lambda: r.run(None, {vi.name: x}), rounds=10, warmup=2)["total_s"]
        tt = float("nan")
        if torch is not None:
            tt = torch_session(torch, m, vi.name, x)
        sess.close()
        rows.append(
            f"| {name} | {b1:.2f} ({tune:.2f}) | {b2:.2f} | {ours * 1e3:.2f} | {ref * 1e3:.2f} | {tt * 1e3:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


def torch_session(torch, model, iname, x):
    """PyTorch CUDA eager on the same ONNX model via onnx2torch when installed, else NaN."""
    try:
        from onnx2torch import convert
    except ImportError:
        return float("nan")
    from .timing import measure

    net = convert(model).cuda().eval()
    xt = torch.from_numpy(x)

    def run():
        with torch.no_grad():
            return net(xt.cuda()).cpu()

    return measure(run, rounds=20, warmup=3)["total_s"]


if __name__ == "__main__":
    main()
