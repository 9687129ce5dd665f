"""One model in one fresh process, measured as a new user meets it: import, context, session load
and first result, steady runs, resident memory. Run by test_bench_startup.py and
test_bench_memory.py (each figure from its own interpreter, so no cache of this process helps):

    python -m bench.one_process mltensor|onnxruntime MODEL INPUT_NAME SHAPE_JSON [--runs N] [--static]

(--static: InferenceSession(..., dynamic=False), a build for the one input size, as an app
whose size never changes asks for; by default a session makes a model's symbolic dimensions
dynamic: one build for every size.)

prints one JSON line. Memory: RSS after import and context creation (start), then the peak
resident set from there (/proc/self/clear_refs resets the high-water mark, Linux >= 4.0).
"""

import json
import sys
import time


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def main(argv):
    engine, model, name, shape = argv[:4]
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 3
    out = {}
    t = time.perf_counter()
    if engine == "mltensor":
        import mltensor

        out["import_s"] = time.perf_counter() - t
        t = time.perf_counter()
        ctx = mltensor.ml.create_context_sync()
        out["context_s"] = time.perf_counter() - t
    else:
        import onnxruntime as ort

        ort.set_default_logger_severity(3)
        out["import_s"] = time.perf_counter() - t
        out["context_s"] = 0.0
    import numpy as np

    x = np.random.default_rng(0).random(json.loads(shape), dtype=np.float32)
    out["rss_start"] = _status("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak from here
    except OSError:
        pass
    t = time.perf_counter()
    if engine == "mltensor":
        sess = mltensor.InferenceSession(model, ctx, dynamic=False if "--static" in argv else None)
    else:
        sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    out["session_s"] = time.perf_counter() - t
    first = sess.run(None, {name: x})[0]
    out["load_first_s"] = time.perf_counter() - t
    steady = []
    for _ in range(runs):
        t = time.perf_counter()
        y = sess.run(None, {name: x})[0]
        steady.append(time.perf_counter() - t)
    out["steady_s"] = float(np.median(steady))
    out["overhead_s"] = out["load_first_s"] - out["steady_s"]
    out["rss_peak_above_start"] = _status("VmHWM") - out["rss_start"]
    out["first_equals_steady"] = bool(np.array_equal(first, y))
    out["checksum"] = float(np.abs(y.astype(np.float64)).sum())
    if engine == "mltensor":
        out["stats"] = sess.stats
        out["kernels"] = len(sess._spec.graph.kernel_names) if sess._spec is not None else None
        out["pipelines"] = sess._spec.graph.pipelines if sess._spec is not None else None
        # (size buckets' variants are made at their first use: those these runs' sizes made)
        out["pipelines_created"] = sess._spec.graph.pipelines_created if sess._spec is not None else None
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
