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
efficiency plot) at the end of the run; MLTENSOR_BENCH_CORPUS_ROUNDS: timed rounds (default 5);
MLTENSOR_BENCH_CORPUS_EXPORTER: the exporter whose files every peer runs (torchscript, the default,
or dynamo).

Each model is a second test against IREE on the same adapter (peer "iree"): the ONNX file imported
by iree-import-onnx with the inputs' shapes fixed and compiled ahead of time for Vulkan
(bench/iree_peer.py, a child process under MLTENSOR_IREE_PYTHON, `.venv-iree`, or this interpreter
when it has the `iree` extra; skipped with the reason when none has IREE). Its outputs are checked
against onnxruntime's before it is timed (a wrong result is reported, not timed); then IREE's
compile time, time to first result (module loaded, one call, outputs on the host) and steady time,
alternated with ours round by round (IREE's measured in its process, the pipe not counted), and
ours/IREE. Ours' time to first result: a new context,
the InferenceSession built without the graph cache, one run. A model IREE fails to import, compile
or run is listed with the error's first line.
"""

import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

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
from mltensor import InferenceSession, ml  # noqa: E402
from mltensor.models import cache_dir  # noqa: E402

from .timing import adapter_name, measure, measure_pair, record  # noqa: E402

BIG = os.environ.get("MLTENSOR_BENCH_CORPUS_BIG", "") not in ("", "0")
ROUNDS = int(os.environ.get("MLTENSOR_BENCH_CORPUS_ROUNDS", "5"))
EXPORTER = os.environ.get("MLTENSOR_BENCH_CORPUS_EXPORTER", "torchscript")
DEFAULT = [
    n
    for n, c in corpus.CASES.items()
    if (c.family == "transformers" or n.startswith("tv_")) and (c.big_sizes is not None or not BIG)
]
NAMES = [n for n in os.environ.get("MLTENSOR_BENCH_CORPUS", "").split(",") if n] or DEFAULT
PEERS = ("onnxruntime", "iree")
ROWS = {}  # model -> its row of the report (both peers' tests fill it)
MODELS = {}  # model -> what both peers' tests share: session, feeds, onnxruntime's outputs
IREE_TOLERANCE = 1e-3  # IREE's result against onnxruntime's (relative, as rel_error)


def iree_python():
    """(interpreter with IREE, None) or (None, why not): MLTENSOR_IREE_PYTHON, else the repository's
    .venv-iree (`MLTENSOR_SETUP_IREE=1 bash setup.sh`), else this interpreter."""
    env = os.environ.get("MLTENSOR_IREE_PYTHON")
    local = os.path.join(os.path.dirname(__file__), "..", ".venv-iree", "bin", "python")
    py = env or (local if os.path.exists(local) else sys.executable)
    probe = "import iree.compiler, iree.runtime, onnx, numpy"
    r = subprocess.run([py, "-c", probe], capture_output=True, text=True)
    if r.returncode != 0:
        where = "MLTENSOR_IREE_PYTHON" if env else ("./.venv-iree" if py == local else "this interpreter")
        return None, (
            f"IREE is not installed ({where}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}); "
            "pip install -e '.[iree]', or MLTENSOR_SETUP_IREE=1 bash setup.sh, or MLTENSOR_IREE_PYTHON=<python with "
            "iree-base-compiler, iree-base-runtime, onnx>"
        )
    return py, None


class IreePeer:
    """bench/iree_peer.py in a child process: compiled (or read from the cache), loaded and run
    once on start (`info`: compile_s, first_s, the outputs' .npz); run() makes one more call."""

    def __init__(self, python, path, feeds):
        self._tmp = tempfile.TemporaryDirectory()
        npz = os.path.join(self._tmp.name, "feeds.npz")
        np.savez(npz, **feeds)
        script = os.path.join(os.path.dirname(__file__), "iree_peer.py")
        work = os.path.join(cache_dir(), "iree")
        self.proc = subprocess.Popen(
            [python, script, path, npz, work], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line = self.proc.stdout.readline()
        try:
            self.info = json.loads(line)
        except ValueError:
            self.close()
            self.info = {"ok": False, "error": f"the IREE process ended ({self.proc.returncode}) without a result"}

    def outputs(self):
        with np.load(self.info["outputs"]) as z:
            out = [z[f"arr_{i}"] for i in range(len(z.files))]
        os.unlink(self.info["outputs"])
        return out

    def _ask(self, cmd):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().split()
        if not reply or reply[0] != "done":
            raise RuntimeError(f"the IREE process ended ({self.proc.poll()}) during {cmd!r}")
        return float(reply[1])

    def run(self):
        """One call; the seconds the IREE process measured around it (the pipe not counted)."""
        return self._ask("run")

    def ping(self):
        self._ask("ping")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self._tmp.cleanup()


def model_flops(path, feeds):
    """2 * multiply-adds of the model's MatMul, Gemm and Conv nodes at the shapes of `feeds`: ONNX
    shape inference with the inputs' dimensions fixed, and for the nodes whose shapes it leaves
    unknown (Reshapes to computed shapes: Swin's windows, MaxViT's grids) the shapes onnxruntime
    gives their values in a run with them as extra outputs."""
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
    nodes = [n for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv") and n.output]
    unknown = {x for n in nodes for x in (n.input[0], n.input[1], n.output[0]) if None in (shapes.get(x) or [None])}
    if unknown:
        shapes.update(_run_shapes(path, feeds, sorted(unknown)))
    total = 0
    for n in nodes:
        out = shapes.get(n.output[0])
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


def _run_shapes(path, feeds, names):
    """{value name: shape} of `names` in one onnxruntime run of the model (as extra outputs)."""
    import onnxruntime as ort

    m = onnx.load(path)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=x) for x in names if x not in have)
    r = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = [o.name for o in r.get_outputs() if o.name in set(names)]
    got = r.run(wanted, {k: v for k, v in feeds.items() if k in {i.name for i in r.get_inputs()}})
    return {k: list(v.shape) for k, v in zip(wanted, got)}


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


def _model(name):
    """The model's shared state, made on first use: the export, feeds at the larger size, a
    session on a new context (built without the graph cache: ours' time to first result) and
    onnxruntime CPU's session and outputs."""
    if name in MODELS:
        return MODELS[name]
    c = corpus.CASES[name]
    try:
        path = corpus.export(name, EXPORTER, BIG)
    except corpus.ExportError as e:
        pytest.skip(f"the {EXPORTER} exporter fails on {name}: {e}")
    size = (c.big_sizes if BIG else c.sizes)[-1]
    feeds = corpus.feeds(name, size, BIG)
    t0 = time.perf_counter()
    mctx = ml.create_context_sync(power_preference="high-performance")
    sess = InferenceSession(path, mctx, cache=False)
    try:
        got = sess.run(None, feeds)
    except mltensor.NotSupportedError as e:  # (an adapter limit: GPT-2's 154 MB embedding on lavapipe)
        mctx.destroy()
        pytest.skip(f"{name} does not run on this adapter: {e}")
    first_s = time.perf_counter() - t0
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = ref.run(None, feeds)
    err = max(corpus.rel_error(g, w) for g, w in zip(got, want))
    MODELS[name] = m = {
        "case": c,
        "path": path,
        "size": size,
        "feeds": feeds,
        "ctx": mctx,
        "sess": sess,
        "ref": ref,
        "want": want,
        "error": err,
        "first_s": first_s,
    }
    return m


def _done(name):
    """The last peer's test of `name` lets its session and context go."""
    m = MODELS.pop(name, None)
    if m:
        m["ctx"].destroy()
        del m
        gc.collect()


@pytest.mark.parametrize("peer", PEERS)
@pytest.mark.parametrize("name", NAMES)
def test_corpus_model(benchmark, ctx, gemm_peak, name, peer):
    try:
        m = _model(name)
        assert m["error"] <= 1e-4, f"{name}: relative error {m['error']:.2e} against onnxruntime"
        if peer == "onnxruntime":
            _against_onnxruntime(benchmark, ctx, gemm_peak, name, m)
        else:
            _against_iree(benchmark, ctx, name, m)
    finally:
        if peer == PEERS[-1]:
            _done(name)


def _against_onnxruntime(benchmark, ctx, gemm_peak, name, m):
    sess, feeds, ref = m["sess"], m["feeds"], m["ref"]
    before = m["ctx"].counters["kernel_launches"]
    sess.run(None, feeds)
    launches = m["ctx"].counters["kernel_launches"] - before
    ours, theirs, _ = measure_pair(
        (lambda: sess.run(None, feeds), None), (lambda: ref.run(None, feeds), None), rounds=ROUNDS, warmup=1
    )
    flops = model_flops(m["path"], feeds)
    eff = flops / ours["total_s"] / gemm_peak
    layers = m["case"].layers if not BIG else None
    row = ROWS.setdefault(name, {"model": name})
    row.update(
        {
            "size": str(m["size"]),
            "launches": launches,
            "layers": layers,
            "per_layer": None if not layers else launches / layers,
            "ours_ms": ours["total_s"] * 1e3,
            "ort_ms": theirs["total_s"] * 1e3,
            "ours_first_s": m["first_s"],
            "gflops": flops / 1e9,
            "efficiency": eff,
            "error": m["error"],
        }
    )
    record(
        benchmark,
        ours,
        "corpus",
        ref=theirs,
        ref_name="onnxruntime CPU",
        unit="GFLOP/s",
        work=flops or None,
        adapter=adapter_name(ctx),
        **{k: v for k, v in row.items() if k not in ("ours_ms", "ort_ms") and not k.startswith("iree")},
    )


IREE = {}  # (interpreter, why not), looked up once


def _against_iree(benchmark, ctx, name, m):
    if not IREE:
        IREE["py"], IREE["why"] = iree_python()
    if IREE["py"] is None:
        pytest.skip(IREE["why"])
    row = ROWS.setdefault(name, {"model": name})
    peer = IreePeer(IREE["py"], m["path"], m["feeds"])
    try:
        info = peer.info
        if not info["ok"]:
            row["iree_failure"] = info["error"]
            pytest.skip(f"IREE fails on {name}: {info['error']}")
        err = max(corpus.rel_error(g, w) for g, w in zip(peer.outputs(), m["want"]))
        row["iree_error"] = err
        if err > IREE_TOLERANCE:
            row["iree_failure"] = f"wrong result: relative error {err:.1e} against onnxruntime"
            pytest.skip(f"IREE's result on {name} is wrong (relative error {err:.1e}): not timed")
        sess, feeds = m["sess"], m["feeds"]
        ping = measure(peer.ping, rounds=5, warmup=1)["total_s"]
        ours, theirs, ratio = measure_pair(
            (lambda: sess.run(None, feeds), None), (peer.run, None), rounds=ROUNDS, warmup=1, ref_self_timed=True
        )
    finally:
        peer.close()
    row.update(
        {
            "iree_compile_s": info["compile_s"],
            "iree_first_s": info["first_s"],
            "iree_ms": theirs["total_s"] * 1e3,
            "iree_ours_ms": ours["total_s"] * 1e3,
            "iree_ratio": ratio,  # median of the per-round ours/IREE
            "iree_ping_ms": ping * 1e3,
        }
    )
    record(
        benchmark,
        ours,
        "corpus-iree",
        ref=theirs,
        ref_name="IREE Vulkan",
        adapter=adapter_name(ctx),
        model=name,
        size=str(m["size"]),
        ours_over_iree=ratio,
        iree_compile_s=info["compile_s"],
        iree_first_s=info["first_s"],
        ours_first_s=m["first_s"],
    )


def _write_report(ctx):
    out = os.environ.get("MLTENSOR_BENCH_CORPUS_OUT")
    rows = [r for r in ROWS.values() if "ours_ms" in r]
    if not out or not ROWS:
        return
    lines = [
        f"# Corpus of real exports ({'real sizes' if BIG else 'small configurations'}, {EXPORTER} exporter)",
        "",
        f"Adapter: **{adapter_name(ctx)}**. Every figure from one run of `bench/test_bench_corpus.py`.",
        "Efficiency: the model's matmul/Gemm/Conv FLOP/s over a 1024^3 GEMM's on the same adapter in "
        "the same run. Launches per layer: launches per run / layers (an upper bound).",
        "",
        "| model | size | launches | per layer (bound) | ours ms | onnxruntime CPU ms | GFLOP | efficiency | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pl = "" if r["per_layer"] is None else f"{r['per_layer']:.1f}"
        lines.append(
            f"| {r['model']} | {r['size']} | {r['launches']} | {pl} | {r['ours_ms']:.1f} | {r['ort_ms']:.1f} | "
            f"{r['gflops']:.3f} | {r['efficiency']:.2f} | {r['error']:.1e} |"
        )
    timed = [r for r in ROWS.values() if "iree_ms" in r]
    failed = [r for r in ROWS.values() if "iree_failure" in r]
    if timed or failed:
        lines += [
            "",
            "## Against IREE's Vulkan backend on the same adapter",
            "",
            "IREE: the same ONNX file, inputs fixed to the size below, `iree-import-onnx` then "
            "`iree-compile --iree-hal-target-device=vulkan` (ahead of time, on the host), run by "
            "iree.runtime on the `vulkan` driver in a child process (bench/iree_peer.py). Steady: "
            "feeds in, outputs on the host, alternated with ours round by round; ours/IREE is the "
            "median of the per-round ratios (< 1: mltensor faster). First result: ours, a new "
            "context, the session built without the graph cache and one run; IREE, the device "
            "opened, the compiled module loaded and one call (its compile is the column before).",
            "",
            "| model | size | ours ms | IREE ms | ours/IREE | ours first result s | IREE compile s | "
            "IREE first result s | IREE error |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in timed:
            lines.append(
                f"| {r['model']} | {r.get('size', '')} | {r['iree_ours_ms']:.1f} | {r['iree_ms']:.1f} | "
                f"{r['iree_ratio']:.2f} | {r.get('ours_first_s', float('nan')):.2f} | {r['iree_compile_s']:.1f} | "
                f"{r['iree_first_s']:.2f} | {r['iree_error']:.1e} |"
            )
        if timed:
            ping = max(r["iree_ping_ms"] for r in timed)
            lines += [
                "",
                "IREE's times are measured in its process around the call (the pipe to it, at most "
                f"{ping:.2f} ms a round trip in this run, is not counted).",
            ]
        if failed:
            lines += ["", "Not timed against IREE:", ""]
            lines += [f"- {r['model']}: {r['iree_failure']}" for r in failed]
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    if not rows:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.5))
    ax.barh([r["model"] for r in rows], [r["efficiency"] for r in rows])
    ax.set_xlabel("model FLOP/s / 1024^3 GEMM FLOP/s (same adapter, same run)")
    ax.set_title(f"Corpus efficiency, {adapter_name(ctx)}")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out + ".png", dpi=100)
