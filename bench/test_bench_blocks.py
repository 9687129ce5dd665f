"""Issue 43: GGUF block formats on the GPU (mltensor/ops/blocks.py), same run, ratios.

- the decode GEMV of each block type against the Q4_0 GEMV of the same matrix (the kernel a Q4_0
  model's decode step runs on this adapter: `_llm_gemv` on CPU adapters, `_matmul_nbits`
  elsewhere), as a bandwidth ratio (bytes of the weights per second; target >= 0.8 for the
  K-quants); wall time alternated round by round, and the process's CPU time (lavapipe's threads
  are the process's: robust to other load on the machine);
- SmolLM2-135M requantized to Q4_K_M by llama.cpp (`cyllama`, here or in the interpreter named
  by MLTENSOR_QUANTIZE_PYTHON; skipped without) against its Q4_1 file: decode tokens/s (target
  >= 0.9x) and the weights' GPU bytes against the file's.
"""

import os
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest

from mltensor import MLGraphBuilder
from mltensor.llm import kernels  # noqa: F401 - registers _llm_gemv
from mltensor.llm.gguf import repack
from mltensor.llm.model import LlamaModel, LlamaWeights
from mltensor.llm.sampler import Sampler
from mltensor.llm.tokenizer import GGUFTokenizer
from mltensor.ops.blocks import BLOCK_TYPES, pack_blocks

from .timing import adapter_name, measure_pair, record

gguf = pytest.importorskip("gguf")
K = N = 2048
REP = 8  # GEMVs a dispatch (summed, so that all are live)


def _random_blocks(kind, rows, cols, rng):
    """Well-formed blocks: random quant bytes, small float16 scales (tests/llm_reference.py has
    the same for the tests)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from llm_reference import random_blocks

    return random_blocks(kind, rows, cols, rng)


def _gemv_graph(ctx, kind, rng, ta):
    b = MLGraphBuilder(ctx)
    x = b.input("a", data_type="float32", shape=[1, K])
    cpu = str(ctx.device.adapter.info.get("adapter_type", "")).upper() == "CPU"
    if kind == "Q4_0":
        w = rng.standard_normal((N, K)).astype(np.float32)
        q = repack(kind, gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0), N, K)
        pk, sc = b.constant(q.packed), b.constant(q.scales16)
        nbytes = q.nbytes
        if cpu:
            ys = [b._llm_gemv(x, pk, sc, K=K, N=N, bits=4) for _ in range(REP)]
        else:
            ys = [b._matmul_nbits(x, pk, sc, K=K, N=N, bits=4, block_size=32) for _ in range(REP)]
    else:
        words = pack_blocks(kind, _random_blocks(kind, N, K, rng), N, K)
        c = b.constant(words)
        nbytes = words.nbytes
        ys = [b._matmul_blocks(x, c, kind=kind, K=K, N=N) for _ in range(REP)]
    y = ys[0]
    for z in ys[1:]:
        y = b.add(y, z)
    g = b.build_sync({"y": y})
    ty = ctx.create_tensor_sync(data_type="float32", shape=[1, N], readable=True)
    return (lambda: ctx.dispatch(g, {"a": ta}, {"y": ty}), lambda: ctx.read_tensor_sync(ty)), nbytes


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q5_0", "Q5_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "Q5_1"])
def test_block_gemv_vs_q4_0(benchmark, ctx, kind):
    assert kind in BLOCK_TYPES
    rng = np.random.default_rng(0)
    ta = ctx.create_tensor_sync(data_type="float32", shape=[1, K], writable=True)
    ctx.write_tensor(ta, rng.standard_normal((1, K)).astype(np.float32))
    ref, ref_bytes = _gemv_graph(ctx, "Q4_0", rng, ta)
    ours, nbytes = _gemv_graph(ctx, kind, rng, ta)
    o, r, wall_ratio = measure_pair(ours, ref, rounds=9, warmup=2)

    def cpu(pair):
        t0 = time.process_time()
        pair[0]()
        pair[1]()
        return time.process_time() - t0

    co, cr = [], []
    for _ in range(9):
        co.append(cpu(ours))
        cr.append(cpu(ref))
    cpu_ratio = statistics.median(co) / statistics.median(cr)
    info = record(
        benchmark,
        o,
        f"llm blocks: decode GEMV {K}x{N} vs Q4_0",
        r,
        "Q4_0 decode GEMV, same matrix",
        unit="GB/s",
        work=nbytes * REP,
        adapter=adapter_name(ctx),
        bandwidth_ratio=nbytes / ref_bytes / wall_ratio,
        bandwidth_ratio_cpu_time=nbytes / ref_bytes / cpu_ratio,
        weight_bytes=nbytes,
        q4_0_bytes=ref_bytes,
    )
    print(
        f"\n{kind} GEMV {K}x{N} on {info['adapter']}: bandwidth {info['bandwidth_ratio']:.2f}x the Q4_0 GEMV's "
        f"(process CPU time: {info['bandwidth_ratio_cpu_time']:.2f}x); {nbytes} bytes against {ref_bytes}"
    )


QUANTIZE = (
    "import sys, cyllama.llama.llama_cpp as L\n"
    "p = L.LlamaModelQuantizeParams()\n"
    "p.ftype = 15\n"  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    "p.nthread = 2\n"
    "p.allow_requantize = True\n"
    "L.model_quantize(sys.argv[1], sys.argv[2], p)\n"
)


def smollm2_q4_k_m(src):
    """SmolLM2 requantized to Q4_K_M by llama.cpp, cached next to the source file."""
    out = os.path.join(os.path.dirname(src), "SmolLM2-135M-Instruct.requantized.Q4_K_M.gguf")
    if os.path.exists(out):
        return out
    try:
        import cyllama.llama.llama_cpp  # noqa: F401

        py = sys.executable
    except ImportError:
        py = os.environ.get("MLTENSOR_QUANTIZE_PYTHON")
        if not py:
            pytest.skip("needs cyllama (pip install cyllama), here or in MLTENSOR_QUANTIZE_PYTHON")
    subprocess.run([py, "-c", QUANTIZE, src, out + ".part"], check=True, capture_output=True)
    os.replace(out + ".part", out)
    return out


def test_smollm2_q4_k_m_decode_vs_q4_1(benchmark, ctx):
    from mltensor.models import fetch_gguf

    q41 = fetch_gguf("smollm2-135m-instruct")
    qkm = smollm2_q4_k_m(q41)
    runs = []
    for path in (qkm, q41):
        w = LlamaWeights(path)
        tok = GGUFTokenizer(w.file)
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
        before = ctx.counters["constant_bytes"]
        model = LlamaModel(w, ctx, max_context=256)
        model.graph("prefill")
        model.graph("step")
        gpu_bytes = ctx.counters["constant_bytes"] - before
        runs.append((model, Sampler(ctx, w.config.vocab), ids, gpu_bytes, os.path.getsize(path)))

    def decode(run, steps):
        model, sampler, ids, _, _ = run
        s = model.session()
        nxt = sampler(s.feed(ids))
        sampler.read()
        t0 = time.perf_counter()
        for _ in range(steps):
            nxt = sampler(s.feed(nxt))
            sampler.read()
        return (time.perf_counter() - t0) / steps

    for run in runs:
        decode(run, 2)
    ours, ref = [], []
    for _ in range(3):
        ours.append(decode(runs[0], 12))
        ref.append(decode(runs[1], 12))
    step, ref_step = statistics.median(ours), statistics.median(ref)
    info = record(
        benchmark,
        {"enqueue_s": 0.0, "total_s": step, "rounds": len(ours), "run": lambda: None},
        "llm blocks: SmolLM2-135M Q4_K_M decode step vs Q4_1",
        {"total_s": ref_step},
        "the Q4_1 file's decode step",
        adapter=adapter_name(ctx),
        tokens_per_s=1 / step,
        ref_tokens_per_s=1 / ref_step,
        # constants are shared by content: the Q4_1 model's count misses what both files hold
        gpu_bytes=runs[0][3],
        file_bytes=runs[0][4],
    )
    print(
        f"\nSmolLM2-135M Q4_K_M (requantized) on {info['adapter']}: {1 / step:.2f} tokens/s against "
        f"{1 / ref_step:.2f} for Q4_1 ({ref_step / step:.2f}x); weights {runs[0][3] / 1e6:.1f} MB on the GPU "
        f"for a {runs[0][4] / 1e6:.1f} MB file"
    )
    assert runs[0][3] <= 1.1 * runs[0][4]
