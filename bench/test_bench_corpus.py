"""Issue 41: the corpus of real exports (tests/corpus.py: transformers, torchvision and timm models
from their configurations, exported by torch.onnx.export), each run the way a user runs it: an
InferenceSession on numpy inputs, against onnxruntime CPU on the same inputs in the same run.

Per model, at the larger of its two test sizes:
- the result against onnxruntime (max|ours - ort| / max|ort|, asserted <= 1e-4 before timing:
  never a timed assertion);
- launches one run makes (the context's counter around a run: size variants that do no work are
  not launched) and that count over the model's layers (an upper bound of launches per layer:
  embeddings, masks and heads are in it too);
- the time of one run, ours and onnxruntime's, alternated round by round (timing.measure_pair);
- efficiency: the model's matmul / Gemm / Conv FLOPs (from ONNX shape inference at those input
  sizes) per second of ours, over the FLOP/s of a 1024^3 float32 GEMM measured in this run on the
  same adapter. A slow path shows up as an outlier.

MLTENSOR_BENCH_CORPUS: comma-separated case names (default: the transformer and torchvision
classification cases); MLTENSOR_BENCH_CORPUS_BIG=1: the real-size configurations;
MLTENSOR_BENCH_CORPUS_OUT=<prefix>: also write <prefix>.md (the table) and <prefix>.png (the
efficiency plot) at the end of the run; MLTENSOR_BENCH_CORPUS_ROUNDS: timed rounds (default 5).
"""

import importlib.util
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

# (looked up, not imported: torch in this process after lavapipe's LLVM crashes it; the corpus
# exports in a child process)
for _pkg in ("torch", "transformers", "torchvision", "onnxruntime"):
    if importlib.util.find_spec(_pkg) is None:
        pytest.skip(f"the corpus needs {_pkg}: pip install -e '.[models]'", allow_module_level=True)

import corpus  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import mltensor  # noqa: E402
from mltensor import InferenceSession  # noqa: E402

from .timing import adapter_name, measure, measure_pair, record  # noqa: E402

BIG = os.environ.get("MLTENSOR_BENCH_CORPUS_BIG", "") not in ("", "0")
ROUNDS = int(os.environ.get("MLTENSOR_BENCH_CORPUS_ROUNDS", "5"))
DEFAULT = [
    n
    for n, c in corpus.CASES.items()
    if (c.family == "transformers" or n.startswith("tv_")) and (c.big_sizes is not None or not BIG)
]
NAMES = [n for n in os.environ.get("MLTENSOR_BENCH_CORPUS", "").split(",") if n] or DEFAULT
ROWS = []


def model_flops(path, feeds):
    """2 * multiply-adds of the model's MatMul, Gemm and Conv nodes at the shapes of `feeds`
    (ONNX shape inference with the inputs' dimensions fixed; a node whose shapes stay unknown
    is not counted)."""
    m = onnx.load(path, load_external_data=False)
    for i in m.graph.input:
        if i.name in feeds:
            dims = i.type.tensor_type.shape.dim
            for d, v in zip(dims, feeds[i.name].shape):
                d.ClearField("dim_param")
                d.dim_value = int(v)
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    shapes = {}
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        shapes[vi.name] = dims
    for t in m.graph.initializer:
        shapes[t.name] = list(t.dims)
    total = 0
    for n in m.graph.node:
        out = shapes.get(n.output[0]) if n.output else None
        if not out or None in out:
            continue
        if n.op_type in ("MatMul", "Gemm"):
            a = shapes.get(n.input[0])
            if not a or None in a:
                continue
            trans_a = any(at.name == "transA" and at.i for at in n.attribute)
            k = a[-2] if trans_a and n.op_type == "Gemm" else a[-1]
            total += 2 * int(np.prod(out)) * k
        elif n.op_type == "Conv":
            w = shapes.get(n.input[1])
            if not w or None in w:
                continue
            total += 2 * int(np.prod(out)) * int(np.prod(w[1:]))
    return total


@pytest.fixture(scope="module")
def gemm_peak(ctx):
    """FLOP/s of a 1024^3 float32 GEMM on this adapter, in this run (the efficiency's yardstick)."""
    rng = np.random.default_rng(0)
    n = 1024
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[n, n])
    g = b.build_sync({"y": b.matmul(x, b.constant(rng.standard_normal((n, n)).astype(np.float32)))})
    xt = ctx.create_tensor_sync(data_type="float32", shape=[n, n], writable=True)
    ctx.write_tensor(xt, rng.standard_normal((n, n)).astype(np.float32))
    yt = ctx.create_tensor_sync(data_type="float32", shape=[n, n], readable=True)
    m = measure(lambda: ctx.dispatch(g, {"x": xt}, {"y": yt}), lambda: ctx.read_tensor_sync(yt), rounds=3, warmup=1)
    yield 2 * n**3 / m["total_s"]
    _write_report(ctx)


@pytest.mark.parametrize("name", NAMES)
def test_corpus_model(benchmark, ctx, gemm_peak, name):
    c = corpus.CASES[name]
    try:
        path = corpus.export(name, "torchscript", BIG)
    except corpus.ExportError as e:
        pytest.skip(f"the TorchScript exporter fails on {name}: {e}")
    size = (c.big_sizes if BIG else c.sizes)[-1]
    feeds = corpus.feeds(name, size, BIG)
    sess = InferenceSession(path, ctx)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    try:
        got = sess.run(None, feeds)
    except mltensor.NotSupportedError as e:  # (an adapter limit: GPT-2's 154 MB embedding on lavapipe)
        pytest.skip(f"{name} does not run on this adapter: {e}")
    want = ref.run(None, feeds)
    err = max(corpus.rel_error(g, w) for g, w in zip(got, want))
    assert err <= 1e-4, f"{name}: relative error {err:.2e} against onnxruntime"
    before = ctx.counters["kernel_launches"]
    sess.run(None, feeds)
    launches = ctx.counters["kernel_launches"] - before
    ours, theirs, _ = measure_pair(
        (lambda: sess.run(None, feeds), None), (lambda: ref.run(None, feeds), None), rounds=ROUNDS, warmup=1
    )
    flops = model_flops(path, feeds)
    eff = flops / ours["total_s"] / gemm_peak
    layers = c.layers if not BIG else None
    row = {
        "model": name,
        "size": str(size),
        "launches": launches,
        "layers": layers,
        "per_layer": None if not layers else launches / layers,
        "ours_ms": ours["total_s"] * 1e3,
        "ort_ms": theirs["total_s"] * 1e3,
        "gflops": flops / 1e9,
        "efficiency": eff,
        "error": err,
    }
    ROWS.append(row)
    record(
        benchmark,
        ours,
        "corpus",
        ref=theirs,
        ref_name="onnxruntime CPU",
        unit="GFLOP/s",
        work=flops or None,
        adapter=adapter_name(ctx),
        **{k: v for k, v in row.items() if k not in ("ours_ms", "ort_ms")},
    )


def _write_report(ctx):
    out = os.environ.get("MLTENSOR_BENCH_CORPUS_OUT")
    if not out or not ROWS:
        return
    lines = [
        f"# Corpus of real exports ({'real sizes' if BIG else 'small configurations'})",
        "",
        f"Adapter: **{adapter_name(ctx)}**. Every figure from one run of `bench/test_bench_corpus.py`.",
        "Efficiency: the model's matmul/Gemm/Conv FLOP/s over a 1024^3 GEMM's on the same adapter in "
        "the same run. Launches per layer: launches per run / layers (an upper bound).",
        "",
        "| model | size | launches | per layer (bound) | ours ms | onnxruntime CPU ms | GFLOP | efficiency | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in ROWS:
        pl = "" if r["per_layer"] is None else f"{r['per_layer']:.1f}"
        lines.append(
            f"| {r['model']} | {r['size']} | {r['launches']} | {pl} | {r['ours_ms']:.1f} | {r['ort_ms']:.1f} | "
            f"{r['gflops']:.3f} | {r['efficiency']:.2f} | {r['error']:.1e} |"
        )
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(ROWS) + 1.5))
    ax.barh([r["model"] for r in ROWS], [r["efficiency"] for r in ROWS])
    ax.set_xlabel("model FLOP/s / 1024^3 GEMM FLOP/s (same adapter, same run)")
    ax.set_title(f"Corpus efficiency, {adapter_name(ctx)}")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=100)
