"""The one timing helper every benchmark uses.

GPU work is asynchronous: a figure that does not wait for the GPU measures only enqueueing. So
each measurement runs `enqueue()` and then `wait()` (a read of a small output, or a flush+map),
both inside the timed region, and reports enqueue time and total time separately. References
(numpy, onnxruntime, LiteRT, raw wgpu, the copying way) are measured with the same helper in the
same run, so figures are reported as ratios.
"""

import statistics
import time


def measure(enqueue, wait=None, *, rounds=10, warmup=2, min_time=0.0):
    """Median seconds of `enqueue()` alone and of `enqueue(); wait()`, over `rounds` runs."""
    for _ in range(warmup):
        enqueue()
        if wait:
            wait()
    enq, tot = [], []
    t_start = time.perf_counter()
    while len(tot) < rounds or time.perf_counter() - t_start < min_time:
        t0 = time.perf_counter()
        enqueue()
        t1 = time.perf_counter()
        if wait:
            wait()
        t2 = time.perf_counter()
        enq.append(t1 - t0)
        tot.append(t2 - t0)

    def run():
        enqueue()
        if wait:
            wait()

    return {"enqueue_s": statistics.median(enq), "total_s": statistics.median(tot), "rounds": len(tot), "run": run}


def measure_pair(ours, ref, *, rounds=21, warmup=2, repeat=1, ref_self_timed=False):
    """measure() of two (enqueue, wait) pairs, alternated round by round so that a shared
    machine's drift hits both alike: (ours, ref, median of the per-round time ratios ours/ref).
    Each round runs `repeat` enqueues then one wait. `ref_self_timed`: the reference runs in
    another process and its enqueue() returns the seconds that process measured around its own
    run (so the pipe to it is not counted); its wait is then None."""

    def once(enqueue, wait, self_timed=False):
        t0 = time.perf_counter()
        inner = [enqueue() for _ in range(repeat)]
        t1 = time.perf_counter()
        if wait:
            wait()
        if self_timed:
            return sum(inner), sum(inner)
        return t1 - t0, time.perf_counter() - t0

    for _ in range(warmup):
        once(*ours)
        once(*ref, ref_self_timed)
    a, b = [], []
    for _ in range(rounds):
        a.append(once(*ours))
        b.append(once(*ref, ref_self_timed))

    def stats(xs, pair):
        def run():
            for _ in range(repeat):
                pair[0]()
            if pair[1]:
                pair[1]()

        return {
            "enqueue_s": statistics.median(x[0] for x in xs) / repeat,
            "total_s": statistics.median(x[1] for x in xs) / repeat,
            "rounds": rounds,
            "run": run,
        }

    return stats(a, ours), stats(b, ref), statistics.median(x[1] / y[1] for x, y in zip(a, b))


def record(benchmark, ours, group, ref=None, ref_name=None, unit=None, work=None, **extra):
    """Put our measurement (and a reference's) into pytest-benchmark's report.

    `ours`/`ref` are `measure()` results. `work` (e.g. FLOPs or bytes per run) turns times into
    rates: `unit` names it ("GFLOP/s", "GB/s"). The ratio is reference time / our time (> 1: we
    are faster).
    """
    info = benchmark.extra_info
    info["group"] = group
    info["ours_total_s"] = ours["total_s"]
    info["ours_enqueue_s"] = ours["enqueue_s"]
    if work is not None:
        info["unit"] = unit
        info["ours_rate"] = work / ours["total_s"] / 1e9
    if ref is not None:
        info["ref_name"] = ref_name
        info["ref_total_s"] = ref["total_s"]
        info["ratio"] = ref["total_s"] / ours["total_s"]
        if work is not None:
            info["ref_rate"] = work / ref["total_s"] / 1e9
    elif ref_name:
        info["ref_name"] = ref_name
        info["ref_missing"] = True
    info.update(extra)
    # pytest-benchmark's own table: one more timed run of ours (enqueue + wait), so the table shows
    # a real figure; the report uses the medians above.
    benchmark.pedantic(ours["run"], rounds=1, iterations=1)
    return info


def adapter_name(ctx):
    i = ctx.device.adapter.info
    return f"{i['device']} ({i['backend_type']}, {i['adapter_type']})"
