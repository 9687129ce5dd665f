"""Issue 44: mltensor serve's continuous batching, through the HTTP server and the `openai` client
(streamed greedy completions on 127.0.0.1; the server in a thread of this process).

- aggregate tokens/s of 8 concurrent streams against 1 stream (the same prompts one after the
  other), same model, same run: over the wall time (prompts included) and over the decode span
  (first token to last token); target >= 3x on lavapipe (>= 6x on a GPU);
- time to first token, p50 / p99, of the 8 concurrent streams against the same requests alone
  (target: p99 under load <= 3x alone);
- batch occupancy (the engine's sampling rows per step over its slots) during the 8-stream rounds.

Every measured request's message is new (a tag before the prompt): the engine's prompt cache reuses
only the chat template's start, as for a stream of different users. (Batched greedy replies equal
the solo ones: tests/test_serve.py, tests/test_serve_load.py.)

Two models: SmolLM2-135M-Instruct (Q4_1, the registry's, fetched once) and the tiny synthetic one
of the tests (hidden 64: the server's and the engine's own overhead dominates).
"""

import concurrent.futures as cf
import os
import sys
import time

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
pytest.importorskip("prometheus_client")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from mltensor.llm import LLM  # noqa: E402
from mltensor.llm.engine import Engine  # noqa: E402
from mltensor.serve import ServedModel, create_app  # noqa: E402

from .test_bench_blocks import smollm2_q4_k_m  # noqa: E402
from .timing import adapter_name, record  # noqa: E402

STREAMS = 8
PROMPTS = [
    "Tell me about the sea.",
    "What is a prime number?",
    "Name three colours.",
    "Why is the sky blue?",
    "Write a haiku about rain.",
    "What do cats eat?",
    "How far is the moon?",
    "Say hello in French.",
]
SIZES = {"smollm2": 32, "tiny": 64}  # tokens per reply
ROUNDS = 2  # 8-stream rounds (and as many solo passes over the prompts)


def _model(name, tmp_path_factory):
    if name == "smollm2":
        from mltensor.models import fetch_gguf

        return fetch_gguf("smollm2-135m-instruct")
    from serve_helpers import tiny_gguf

    return tiny_gguf(tmp_path_factory.mktemp("bench-serve") / "tiny.gguf")


def _stream(client, prompt, max_tokens):
    """One streamed greedy chat reply: (seconds to the first text, start clock, [clock of each
    chunk], tokens, text)."""
    t0 = time.perf_counter()
    times, tokens, text = [], 0, []
    for c in client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if c.usage is not None:
            tokens = c.usage.completion_tokens
        elif c.choices and c.choices[0].delta.content:
            times.append(time.perf_counter())
            text.append(c.choices[0].delta.content)
    return times[0] - t0, t0, times, tokens, "".join(text)


@pytest.mark.parametrize("name", ["smollm2", "tiny"])
def test_serve_batching(benchmark, ctx, tmp_path_factory, name):
    from serve_helpers import ThreadServer

    llm = LLM(_model(name, tmp_path_factory), ctx, max_context=512)
    engine = Engine(llm, slots=STREAMS, max_queue=64, prefill_chunk=64)
    n = SIZES[name]
    with ThreadServer(create_app({"m": ServedModel(llm, engine)})) as s:
        client = s.client()
        # warm-up: the graphs of one row, of prompt chunks and of batched steps built, the chat
        # template's start in the slots' cache
        _stream(client, PROMPTS[0], 4)
        with cf.ThreadPoolExecutor(STREAMS) as ex:
            list(ex.map(lambda p: _stream(client, f"(warm-up) {p}", 8), PROMPTS))
        solo, solo_wall = [], 0.0
        for r in range(ROUNDS):  # one stream at a time
            for i, p in enumerate(PROMPTS):
                t0 = time.perf_counter()
                solo.append(_stream(client, f"(solo {r}.{i}) {p}", n))
                solo_wall += time.perf_counter() - t0
        m0 = engine.metrics()
        batched, batched_wall = [], 0.0
        with cf.ThreadPoolExecutor(STREAMS) as ex:
            for r in range(ROUNDS):
                t0 = time.perf_counter()
                tagged = [f"(batch {r}.{i}) {p}" for i, p in enumerate(PROMPTS)]
                batched += list(ex.map(lambda p: _stream(client, p, n), tagged))
                batched_wall += time.perf_counter() - t0
        m1 = engine.metrics()
    solo_tokens = sum(r[3] for r in solo)
    batched_tokens = sum(r[3] for r in batched)
    solo_rate = solo_tokens / solo_wall
    batched_rate = batched_tokens / batched_wall
    solo_decode = float(np.median([(r[3] - 1) / (r[2][-1] - r[2][0]) for r in solo if r[3] > 1]))
    rounds = [batched[i : i + STREAMS] for i in range(0, len(batched), STREAMS)]
    batched_decode = float(
        np.median([sum(r[3] - 1 for r in g) / (max(r[2][-1] for r in g) - min(r[2][0] for r in g)) for g in rounds])
    )
    ttft_solo = np.array([r[0] for r in solo])
    ttft_load = np.array([r[0] for r in batched])
    steps = m1["steps_total"] - m0["steps_total"]
    occupancy = (m1["decode_rows_total"] - m0["decode_rows_total"]) / max(steps, 1) / STREAMS
    ours = {"enqueue_s": 0.0, "total_s": batched_wall / batched_tokens, "rounds": ROUNDS, "run": lambda: None}
    ref = {"total_s": solo_wall / solo_tokens}
    info = record(
        benchmark,
        ours,
        f"serve: {name}, {STREAMS} concurrent streams vs 1 (seconds per token, wall)",
        ref,
        "1 stream at a time",
        adapter=adapter_name(ctx),
        tokens_per_reply=n,
        aggregate_tokens_per_s_8=batched_rate,
        aggregate_tokens_per_s_1=solo_rate,
        aggregate_ratio=batched_rate / solo_rate,
        decode_tokens_per_s_8=batched_decode,
        decode_tokens_per_s_1=solo_decode,
        decode_ratio=batched_decode / solo_decode,
        ttft_p50_s_alone=float(np.percentile(ttft_solo, 50)),
        ttft_p99_s_alone=float(np.percentile(ttft_solo, 99)),
        ttft_p50_s_load=float(np.percentile(ttft_load, 50)),
        ttft_p99_s_load=float(np.percentile(ttft_load, 99)),
        ttft_p99_ratio=float(np.percentile(ttft_load, 99) / np.percentile(ttft_solo, 99)),
        batch_occupancy=occupancy,
    )
    print(
        f"\nserve {name} on {info['adapter']}: aggregate {batched_rate:.1f} tokens/s with {STREAMS} streams vs "
        f"{solo_rate:.1f} with 1 ({info['aggregate_ratio']:.2f}x; decode span {batched_decode:.1f} vs "
        f"{solo_decode:.1f} tokens/s, {info['decode_ratio']:.2f}x); time to first token p50/p99 "
        f"{info['ttft_p50_s_load'] * 1e3:.0f}/{info['ttft_p99_s_load'] * 1e3:.0f} ms under load vs "
        f"{info['ttft_p50_s_alone'] * 1e3:.0f}/{info['ttft_p99_s_alone'] * 1e3:.0f} ms alone "
        f"(p99 {info['ttft_p99_ratio']:.2f}x); batch occupancy {occupancy:.2f}"
    )
    assert all(r[3] > 0 for r in solo + batched)


@pytest.mark.parametrize("name", ["smollm2", "smollm2_q4_k_m"])
def test_serve_decode_steps(benchmark, ctx, tmp_path_factory, name):
    """The engine's decode step alone (no prompts, no server): a step of 8 generating rows (8
    streams) against a step of 1, each slot's sequence at the same position, steps alternated and
    paired. Aggregate decode tokens/s = rows / step time, so the ratio is 8 t(1) / t(8): what
    continuous batching buys once every stream is generating (the wall-clock figures of
    test_serve_batching also count the prompts, whose cost per token batching barely lowers on a
    compute-bound adapter). smollm2_q4_k_m: the same model requantized to Q4_K_M by
    llama.cpp's quantizer (the K-quant GEMVs of ops/blocks.py; skipped without one)."""
    from mltensor.llm.batch import LlamaBatch

    path = _model("smollm2", tmp_path_factory)
    llm = LLM(path if name == "smollm2" else smollm2_q4_k_m(path), ctx, max_context=512)
    batch = LlamaBatch(llm.model, STREAMS, rows=STREAMS)
    start = 48  # positions every slot holds before the measured steps (a chat template and a prompt)
    for s in range(STREAMS):
        for p in range(0, start, STREAMS):
            batch.run([(s, p, list(range(100 + p, 100 + p + STREAMS)))])
    rounds, steps = 8, 3

    def step(rows, at):
        batch.run([(s, at, [200 + s]) for s in range(rows)])

    times = {1: [], STREAMS: []}
    for r in range(rounds + 1):
        for rows in (1, STREAMS):
            t0 = time.perf_counter()
            for i in range(steps):
                step(rows, start + i)
            if r:  # (round 0 warms up)
                times[rows].append((time.perf_counter() - t0) / steps)
    t1, t8 = np.array(times[1]), np.array(times[STREAMS])
    ratio = float(np.median(STREAMS * t1 / t8))
    ours = {"enqueue_s": 0.0, "total_s": float(np.median(t8)) / STREAMS, "run": lambda: step(STREAMS, start)}
    info = record(
        benchmark,
        ours,
        f"serve: {name}, decode steps of {STREAMS} rows vs 1 (seconds per token)",
        {"total_s": float(np.median(t1))},
        "steps of 1 row",
        adapter=adapter_name(ctx),
        step_s_1=float(np.median(t1)),
        step_s_8=float(np.median(t8)),
        decode_tokens_per_s_1=float(1 / np.median(t1)),
        decode_tokens_per_s_8=float(STREAMS / np.median(t8)),
        decode_step_ratio=ratio,
    )
    print(
        f"\nserve {name} decode steps on {info['adapter']}: {STREAMS} rows {np.median(t8) * 1e3:.0f} ms, "
        f"1 row {np.median(t1) * 1e3:.0f} ms a step: aggregate decode {ratio:.2f}x"
    )
