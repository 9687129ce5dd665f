"""Issue 25, safe from any thread: how often threaded stress runs die or go wrong, and what
threads are worth on one context.

- Stress: the scenarios of tests/test_threads.py (raw API, 4 threads; a shared session, 4
  threads, two sizes) run MLTENSOR_BENCH_STRESS_RUNS times each (default 20), each in its own
  interpreter; counted: runs that died (abort, segfault, hang), runs with any error raised, and
  results that differ from the same work on one thread.
- Throughput: selfie segmentation frames/s with 4 threads, each with its own session, on one
  context, against one thread with one session, in the same run (numpy in, numpy out).
"""

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import mltensor

from .timing import adapter_name, measure, record

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")


def _stress(scenario, args, runs):
    sys.path.insert(0, TESTS)
    try:
        import test_threads
    finally:
        sys.path.remove(TESTS)
    died, errored, wrong, seconds = 0, 0, 0, []
    for _ in range(runs):
        t0 = time.perf_counter()
        try:
            r = test_threads._spawn(scenario, *args)
        except (AssertionError, subprocess.TimeoutExpired):
            died += 1
            continue
        finally:
            seconds.append(time.perf_counter() - t0)
        errored += bool(r["errors"])
        wrong += r["wrong"]
    return {
        "runs": runs,
        "died": died,
        "runs_with_errors": errored,
        "wrong_results": wrong,
        "median_run_s": float(np.median(seconds)),
    }


@pytest.mark.parametrize(
    "scenario,args",
    [
        ("raw_api", (4, 40)),
        ("sessions", (4, 25, True, "cpu", (1, 2))),
    ],
    ids=["raw-api-4-threads", "shared-session-4-threads"],
)
def test_threaded_stress_runs(benchmark, ctx, scenario, args):
    """Target: 0 runs dying, 0 with errors, 0 wrong results over >= 20 runs (lavapipe)."""
    runs = int(os.environ.get("MLTENSOR_BENCH_STRESS_RUNS", "20"))
    s = _stress(scenario, args, runs)
    benchmark.extra_info.update(group="threads: stress runs", adapter=adapter_name(ctx), **s)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(
        f"\n{scenario}{args} x{runs} on {adapter_name(ctx)}: died {s['died']}, with errors "
        f"{s['runs_with_errors']}, wrong results {s['wrong_results']}"
    )


def test_four_threads_own_sessions_vs_one(benchmark, ctx):
    """Frames/s of 4 threads x own selfie-segmentation session on one context, against 1 thread
    (ratio > 1: threads help; target >= 1.0x on lavapipe, reported on a GPU)."""
    path = mltensor.models.fetch("selfie_segmentation")
    sessions = [mltensor.InferenceSession(path, ctx) for _ in range(4)]
    name = sessions[0].get_inputs()[0].name
    frames = [np.random.default_rng(k).random((1, 256, 256, 3), dtype=np.float32) for k in range(4)]
    per_thread = 6
    for s, f in zip(sessions, frames):
        s.run(None, {name: f})  # warm: tensors, bind groups

    def one_thread():
        for _ in range(4 * per_thread):
            sessions[0].run(None, {name: frames[0]})

    def four_threads():
        def work(k):
            for _ in range(per_thread):
                sessions[k].run(None, {name: frames[k]})

        ts = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    ref = measure(one_thread, rounds=3, warmup=1)
    ours = measure(four_threads, rounds=3, warmup=1)
    n = 4 * per_thread
    record(
        benchmark,
        ours,
        "threads: throughput",
        ref,
        "1 thread, 1 session",
        adapter=adapter_name(ctx),
        frames_per_s=n / ours["total_s"],
        ref_frames_per_s=n / ref["total_s"],
    )
    print(
        f"\nselfie on {adapter_name(ctx)}: 4 threads {n / ours['total_s']:.1f} frames/s, "
        f"1 thread {n / ref['total_s']:.1f} frames/s, x{ref['total_s'] / ours['total_s']:.2f}"
    )
    for s in sessions:
        s.close()
