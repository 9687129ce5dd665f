"""Issue 29, start-up: what a fresh process pays before its first result, beside onnxruntime.

Each figure is one model in its own interpreter (bench/one_process.py): start-up overhead =
session load + first result - a steady run. Three states of the caches, in this order:

- cold: Mesa's on-disk shader cache empty (MESA_SHADER_CACHE_DIR a new folder) and mltensor's
  cache empty (MLTENSOR_CACHE a new folder): a fresh machine, CI, a new driver;
- driver warm: Mesa's cache as the cold run left it, mltensor's cache empty again;
- both warm: both caches as the run before left them (the graph cache loads the session's
  graph: no import, no lowering, no WGSL generation).

Targets (lavapipe, 2 cores, a ~140-kernel model): cold <= 8 s; both warm <= 0.3x driver warm.
The model: PP-OCRv4 det (fetched once, like the real-model tests), 1x3x320x320.

Each state is measured three ways in the same run: the session as a user gets it by default
(the model's symbolic height and width as dynamic dimensions: one build for every page size,
138 kernels), a one-size session (`dynamic=False`: 70 kernels, its static sizes of the
elementwise, pool and resample kernels passed as launch parameters, so same-family layers share
a pipeline: dynamic/kernels.py SizeParams), and that one-size session with
MLTENSOR_NO_SIZE_PARAMS=1 (every size a WGSL constant, one pipeline per distinct size), with the
distinct-pipeline count of each. The launch parameters' cost in steady runs is measured per
family (test_size_params_*): the same graph built both ways, dispatched alternately.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import mltensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from helpers import size_params as _size_params  # noqa: E402

from .timing import adapter_name, measure_pair, record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL, INPUT, SHAPE = "ppocr_v4_det", "x", [1, 3, 320, 320]
RUNS = int(os.environ.get("MLTENSOR_BENCH_STARTUP_RUNS", "3"))


def one_process(engine, model, name, shape, env=None, runs=3, static=False):
    env = dict(os.environ, **(env or {}))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as a user's machine: modules load from .pyc
    r = subprocess.run(
        [sys.executable, "-m", "bench.one_process", engine, str(model), name, json.dumps(shape), "--runs", str(runs)]
        + (["--static"] if static else []),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _median(rows, k):
    v = sorted(r[k] for r in rows)
    return v[len(v) // 2]


@pytest.fixture(scope="module")
def startup():
    path = mltensor.models.fetch_onnx(MODEL)
    ways = (
        ("", False, {"MLTENSOR_NO_SIZE_PARAMS": "0"}),
        (" (one size)", True, {"MLTENSOR_NO_SIZE_PARAMS": "0"}),
        (" (constants)", True, {"MLTENSOR_NO_SIZE_PARAMS": "1"}),
    )
    rows = {f"{state}{tag}": [] for tag, _, _ in ways for state in ("cold", "driver warm", "both warm")}
    rows["onnxruntime"] = []
    for _ in range(RUNS):
        for tag, static, extra in ways:
            with tempfile.TemporaryDirectory() as mesa, tempfile.TemporaryDirectory() as ours:
                env = {"MESA_SHADER_CACHE_DIR": mesa, "MLTENSOR_CACHE": ours, **extra}
                rows["cold" + tag].append(one_process("mltensor", path, INPUT, SHAPE, env, static=static))
                with tempfile.TemporaryDirectory() as ours2:
                    rows["driver warm" + tag].append(
                        one_process("mltensor", path, INPUT, SHAPE, dict(env, MLTENSOR_CACHE=ours2), static=static)
                    )
                rows["both warm" + tag].append(one_process("mltensor", path, INPUT, SHAPE, env, static=static))
        rows["onnxruntime"].append(one_process("onnxruntime", path, INPUT, SHAPE))
    for state, rs in rows.items():
        print(
            f"\n{state:>25}: "
            + ", ".join(
                f"{k} {_median(rs, k):.3f}"
                for k in ("import_s", "context_s", "session_s", "load_first_s", "steady_s", "overhead_s")
            )
            + f", pipelines {rs[0].get('pipelines')} "
            f"(created {rs[0].get('pipelines_created')}), "
            "overhead per run " + ", ".join("%.3f" % r["overhead_s"] for r in rs)
        )
    assert rows["both warm"][-1]["stats"]["loaded"] == 1 and rows["cold"][-1]["stats"]["loaded"] == 0
    return rows


def _report(benchmark, ctx, group, ours, ref, ref_name, **extra):
    info = benchmark.extra_info
    info.update(
        group=group,
        adapter=adapter_name(ctx),
        model=MODEL,
        kernels=ours[0].get("kernels"),
        pipelines=ours[0].get("pipelines"),
        pipelines_created=ours[0].get("pipelines_created"),
        ours_total_s=_median(ours, "overhead_s"),
        ref_total_s=_median(ref, "overhead_s"),
        ref_name=ref_name,
        ours_enqueue_s=_median(ours, "overhead_s"),
        runs=len(ours),
        **extra,
    )
    info["ratio"] = info["ref_total_s"] / info["ours_total_s"]
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    return info


def test_startup_cold(benchmark, ctx, startup):
    """Both caches empty: overhead against onnxruntime's (target: <= 8 s on 2 lavapipe cores)."""
    info = _report(
        benchmark,
        ctx,
        "start-up overhead: cold (driver and mltensor caches empty)",
        startup["cold"],
        startup["onnxruntime"],
        "onnxruntime CPU, same model",
        import_s=_median(startup["cold"], "import_s"),
        context_s=_median(startup["cold"], "context_s"),
        one_size_overhead_s=_median(startup["cold (one size)"], "overhead_s"),
        one_size_kernels=startup["cold (one size)"][0].get("kernels"),
        one_size_pipelines=startup["cold (one size)"][0].get("pipelines"),
        constants_overhead_s=_median(startup["cold (constants)"], "overhead_s"),
        constants_pipelines=startup["cold (constants)"][0].get("pipelines"),
    )
    print(
        f"\ncold start-up overhead {info['ours_total_s']:.2f} s ({info['pipelines']} pipelines, "
        f"{info['pipelines_created']} created at this size, every size; one "
        f"size: {info['one_size_overhead_s']:.2f} s, {info['one_size_pipelines']} pipelines; every size a "
        f"constant: {info['constants_overhead_s']:.2f} s, {info['constants_pipelines']} pipelines), "
        f"onnxruntime {info['ref_total_s']:.2f} s"
    )


def test_startup_both_warm(benchmark, ctx, startup):
    """The graph cache's gain: both warm against the driver warm with mltensor's cache empty
    (ratio = driver-warm / both-warm; target >= 3.3, i.e. both warm <= 0.3x)."""
    info = _report(
        benchmark,
        ctx,
        "start-up overhead: graph cache warm vs empty (driver cache warm)",
        startup["both warm"],
        startup["driver warm"],
        "mltensor, its cache empty",
        onnxruntime_overhead_s=_median(startup["onnxruntime"], "overhead_s"),
        both_warm_session_s=_median(startup["both warm"], "session_s"),
        driver_warm_session_s=_median(startup["driver warm"], "session_s"),
        one_size_both_warm_s=_median(startup["both warm (one size)"], "overhead_s"),
        one_size_driver_warm_s=_median(startup["driver warm (one size)"], "overhead_s"),
        constants_both_warm_s=_median(startup["both warm (constants)"], "overhead_s"),
        constants_driver_warm_s=_median(startup["driver warm (constants)"], "overhead_s"),
        constants_pipelines=startup["both warm (constants)"][0].get("pipelines"),
    )
    print(
        f"\nboth warm {info['ours_total_s']:.3f} s = {1 / info['ratio']:.2f}x of driver warm "
        f"{info['ref_total_s']:.3f} s (onnxruntime {info['onnxruntime_overhead_s']:.3f} s); one size: "
        f"{info['one_size_both_warm_s']:.3f} s of {info['one_size_driver_warm_s']:.3f} s; every size a constant: "
        f"{info['constants_both_warm_s']:.3f} s of {info['constants_driver_warm_s']:.3f} s"
    )


def test_startup_size_params(benchmark, ctx, startup):
    """What launch parameters give start-up (same run, one-size sessions: a graph with dynamic
    dimensions keeps its sizes as those): both warm with every size a WGSL constant against both
    warm as built (ratio = constants / parameters; > 1: faster start)."""
    info = _report(
        benchmark,
        ctx,
        "start-up overhead: sizes as launch parameters vs constants (both caches warm)",
        startup["both warm (one size)"],
        startup["both warm (constants)"],
        "every size a constant",
        constants_pipelines=startup["both warm (constants)"][0].get("pipelines"),
        cold_s=_median(startup["cold (one size)"], "overhead_s"),
        constants_cold_s=_median(startup["cold (constants)"], "overhead_s"),
        best_both_warm_s=min(r["overhead_s"] for r in startup["both warm (one size)"]),
        best_constants_both_warm_s=min(r["overhead_s"] for r in startup["both warm (constants)"]),
        best_cold_s=min(r["overhead_s"] for r in startup["cold (one size)"]),
        best_constants_cold_s=min(r["overhead_s"] for r in startup["cold (constants)"]),
        steady_s=_median(startup["both warm (one size)"], "steady_s"),
        constants_steady_s=_median(startup["both warm (constants)"], "steady_s"),
    )
    print(
        f"\nboth warm: {info['pipelines']} pipelines {info['ours_total_s']:.3f} s, every size a constant: "
        f"{info['constants_pipelines']} pipelines {info['ref_total_s']:.3f} s"
    )


def test_startup_size_params_graph_cache_load(benchmark, ctx, tmp_path, monkeypatch):
    """The graph-cache start-up of PP-OCRv4 det in one process, sizes as launch parameters
    against every size a constant, alternated round by round (each round a fresh context: the
    graph's pipelines are created again, Mesa's disk cache warm): load_graph + first result -
    a steady run. Less exposed to a shared machine's bursts than the one-process-per-figure
    rows above (ratio = constants / parameters)."""
    import statistics
    import time

    from mltensor import ml

    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    path = mltensor.models.fetch_onnx(MODEL)
    x = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
    pipelines = {}
    for v in ("0", "1"):
        monkeypatch.setenv("MLTENSOR_NO_SIZE_PARAMS", v)
        sess = mltensor.InferenceSession(path, ctx, dynamic=False)  # (a dynamic graph keeps constants)
        sess.run(None, {INPUT: x})
        ctx.save_graph_sync("det" + v, sess._spec.graph)
        pipelines[v] = sess._spec.graph.pipelines
    times = {"0": [], "1": []}
    for _ in range(RUNS * 3):
        for v in ("0", "1"):
            c = ml.create_context_sync()
            try:
                t0 = time.perf_counter()
                g = c.load_graph_sync("det" + v)
                t_in = c.create_tensor_sync(data_type="float32", shape=SHAPE, writable=True)
                c.write_tensor(t_in, x)
                outs = {
                    n: c.create_tensor_sync(data_type=dt, shape=list(s), readable=True)
                    for n, (dt, s) in g.output_descriptors.items()
                }
                probe = next(iter(outs.values()))
                c.dispatch(g, {INPUT: t_in}, outs)
                c.read_tensor_sync(probe)
                t1 = time.perf_counter()
                c.dispatch(g, {INPUT: t_in}, outs)
                c.read_tensor_sync(probe)
                times[v].append((t1 - t0) - (time.perf_counter() - t1))
            finally:
                c.destroy()
    ours, ref = statistics.median(times["0"]), statistics.median(times["1"])
    info = benchmark.extra_info
    info.update(
        group="start-up overhead: sizes as launch parameters vs constants (graph cache load, one process)",
        adapter=adapter_name(ctx),
        model=MODEL,
        pipelines=pipelines["0"],
        constants_pipelines=pipelines["1"],
        ours_total_s=ours,
        ours_enqueue_s=ours,
        ref_total_s=ref,
        ref_name="every size a constant",
        ratio=ref / ours,
        rounds=len(times["0"]),
        best_s=min(times["0"]),
        constants_best_s=min(times["1"]),
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(
        f"\ngraph cache load + first result - steady: {pipelines['0']} pipelines {ours:.3f} s (best "
        f"{min(times['0']):.3f}), every size a constant: {pipelines['1']} pipelines {ref:.3f} s (best "
        f"{min(times['1']):.3f})"
    )


def test_derived_sizes(benchmark, ctx, monkeypatch):
    """The default session of PP-OCRv4 det (every size: dynamic height and width) built twice in
    one process: sizes over the dimensions as derived fields computed by the host per dispatch
    (dims.py hoisting, the default) and rendered inline at every use (MLTENSOR_NO_DERIVED_SIZES=1).
    Figures: the WGSL of the distinct kernels, the time to create their pipelines on a fresh
    device of the same adapter (one thread, Mesa's disk cache as it is: on lavapipe that is
    SPIR-V -> NIR, what a warm start pays per pipeline), and steady runs at 320x320 alternated
    round by round (ratio = inline / derived: > 1, derived is faster)."""
    import time

    from mltensor.runtime.compile import _layout_entries

    path = mltensor.models.fetch_onnx(MODEL)
    x = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
    sess, kernels = {}, {}
    for v in ("0", "1"):
        monkeypatch.setenv("MLTENSOR_NO_DERIVED_SIZES", v)
        sess[v] = mltensor.InferenceSession(path, ctx, cache=False)
        sess[v].run(None, {INPUT: x})
        g = sess[v]._spec.graph
        kernels[v] = list({k.key: k for k in g._kernels}.values())
    np.testing.assert_array_equal(sess["0"].run(None, {INPUT: x})[0], sess["1"].run(None, {INPUT: x})[0])
    dev = ctx.device.adapter.request_device_sync(
        required_features=list(ctx.device.features),
        required_limits={k: v for k, v in ctx.device.limits.items() if isinstance(v, int)},
    )
    create, chars = {}, {}
    for v in ("1", "0", "1", "0"):  # (alternated; the second round counts)
        t0 = time.perf_counter()
        for k in kernels[v]:
            src = k.source()
            m = dev.create_shader_module(code=src)
            bgl = dev.create_bind_group_layout(entries=_layout_entries(k))
            layout = dev.create_pipeline_layout(bind_group_layouts=[bgl], immediate_size=k.immediates())
            dev.create_compute_pipeline(layout=layout, compute={"module": m, "entry_point": "main"})
        create[v] = time.perf_counter() - t0
        chars[v] = sum(len(k.source()) for k in kernels[v])
    dev.destroy()
    ours, ref, ratio = measure_pair(
        (lambda: sess["0"].run(None, {INPUT: x}), None),
        (lambda: sess["1"].run(None, {INPUT: x}), None),
        rounds=9,
        warmup=1,
    )
    g0, g1 = sess["0"]._spec.graph, sess["1"]._spec.graph
    info = record(
        benchmark,
        ours,
        "derived sizes: dynamic kernels' sizes as host-computed fields vs inline",
        ref,
        "every size inline (MLTENSOR_NO_DERIVED_SIZES=1)",
        adapter=adapter_name(ctx),
        model=MODEL,
        kernels=len(kernels["0"]),
        wgsl_chars=chars["0"],
        inline_wgsl_chars=chars["1"],
        create_s=create["0"],
        inline_create_s=create["1"],
        pipelines_created=g0.pipelines_created,
        inline_pipelines_created=g1.pipelines_created,
        median_round_ratio=1 / ratio,
    )
    print(
        f"\nderived sizes: {len(kernels['0'])} kernels, WGSL {chars['0'] / 1e6:.2f} M chars (inline "
        f"{chars['1'] / 1e6:.2f} M), pipeline creation {create['0']:.2f} s (inline {create['1']:.2f} s), "
        f"{g0.pipelines_created} pipelines created at 320x320 (inline {g1.pipelines_created}); steady "
        f"inline / derived {info['median_round_ratio']:.3f}"
    )


# -- the launch parameters' cost in steady runs, per family (same graph built both ways) ---------


def _family_graph(ctx, family, params):
    """A graph of one family's layers at PP-OCRv4 det's sizes (several sizes per kernel shape);
    params False: every size a WGSL constant (MLTENSOR_NO_SIZE_PARAMS=1 at build)."""
    with _size_params(params):
        b = mltensor.MLGraphBuilder(ctx)
        rng = np.random.default_rng(0)
        outs, feeds = {}, {}
        for k, hw in enumerate((80, 40, 20, 10)):
            shape = [1, 96, hw, hw]
            x = b.input(f"x{k}", data_type="float32", shape=shape)
            feeds[f"x{k}"] = rng.standard_normal(shape).astype(np.float32)
            if family == "elementwise":  # a per-channel scale, a residual add (broadcasting: a grid launch)
                s = b.constant(rng.standard_normal((96, 1, 1)).astype(np.float32))
                y = b.add(b.add(x, b.mul(x, s)), x)
            elif family == "elementwise vec4":
                y = b.sigmoid(b.mul(x, b.constant(data_type="float32", value=0.5)))
            elif family == "pool":  # (flat, divides by sizes: keeps its constants)
                y = b.max_pool2d(x, window_dimensions=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
            elif family == "global pool":
                y = b.average_pool2d(x)
            elif family == "gate":  # squeeze-and-excitation: one fused kernel per block
                w1 = b.constant(rng.standard_normal((24, 96, 1, 1)).astype(np.float32) / 10)
                w2 = b.constant(rng.standard_normal((96, 24, 1, 1)).astype(np.float32) / 5)
                y = b.sigmoid(b.conv2d(b.relu(b.conv2d(b.average_pool2d(x), w1)), w2))
            else:  # resample: x2, nearest (a grid launch)
                y = b.resample2d(x, scales=[2.0, 2.0])
            outs[f"y{k}"] = y
        g = b.build_sync(outs)
    ins = {n: ctx.create_tensor_sync(data_type="float32", shape=list(a.shape), writable=True) for n, a in feeds.items()}
    for n, a in feeds.items():
        ctx.write_tensor(ins[n], a)
    outs = {
        n: ctx.create_tensor_sync(data_type=dt, shape=list(s), readable=True)
        for n, (dt, s) in g.output_descriptors.items()
    }
    return g, ins, outs


@pytest.mark.parametrize("family", ["elementwise", "elementwise vec4", "pool", "global pool", "gate", "resample"])
def test_size_params_steady_cost(benchmark, ctx, family):
    """A dispatch of one family's layers, sizes as launch parameters against every size a WGSL
    constant, alternated round by round (ratio = constants / parameters: 1.0 is no cost)."""
    g, ins, outs = _family_graph(ctx, family, True)
    g0, ins0, outs0 = _family_graph(ctx, family, False)
    probe = next(iter(outs.values()))
    probe0 = next(iter(outs0.values()))
    ours, ref, ratio = measure_pair(
        (lambda: ctx.dispatch(g, ins, outs), lambda: ctx.read_tensor_sync(probe)),
        (lambda: ctx.dispatch(g0, ins0, outs0), lambda: ctx.read_tensor_sync(probe0)),
        rounds=31,
        repeat=4,
    )
    for n in outs:
        np.testing.assert_array_equal(ctx.read_tensor_sync(outs[n]), ctx.read_tensor_sync(outs0[n]))
    info = record(
        benchmark,
        ours,
        "launch parameters: steady cost per family (same graph, sizes as constants)",
        ref,
        "every size a constant",
        adapter=adapter_name(ctx),
        family=family,
        launches=len(g.kernel_names),
        pipelines=g.pipelines,
        constants_pipelines=g0.pipelines,
        median_round_ratio=1 / ratio,
    )
    print(
        f"\n{family}: {g.pipelines} pipelines for {len(g.kernel_names)} launches (constants: {g0.pipelines}); "
        f"constants / parameters {info['median_round_ratio']:.3f}"
    )


def test_size_params_launch_overhead(benchmark, ctx):
    """Enqueue cost per launch of 200 launches of one pipeline at 200 sizes (immediates set per
    launch) against the same graph with every size a constant (200 pipelines, one set per
    launch): the compiled replay loop's cost of launch parameters."""

    def graph(params):
        with _size_params(params):
            b = mltensor.MLGraphBuilder(ctx)
            x = b.input("x", data_type="float32", shape=[1024])
            one = b.constant(data_type="float32", value=1.0)
            outs = {f"y{i}": b.add(b.slice(x, [0], [1024 - 4 * i]), one) for i in range(200)}
            g = b.build_sync(outs)
        t = ctx.create_tensor_sync(data_type="float32", shape=[1024], writable=True)
        ctx.write_tensor(t, np.ones(1024, np.float32))
        outs = {
            n: ctx.create_tensor_sync(data_type=dt, shape=list(s), readable=True)
            for n, (dt, s) in g.output_descriptors.items()
        }
        return g, {"x": t}, outs

    g, ins, outs = graph(True)
    g0, ins0, outs0 = graph(False)
    probe, probe0 = outs["y0"], outs0["y0"]
    ours, ref, ratio = measure_pair(
        (lambda: ctx.dispatch(g, ins, outs), lambda: ctx.read_tensor_sync(probe)),
        (lambda: ctx.dispatch(g0, ins0, outs0), lambda: ctx.read_tensor_sync(probe0)),
        rounds=21,
        repeat=10,
    )
    n = len(g.kernel_names)
    info = record(
        benchmark,
        ours,
        "launch parameters: dispatch overhead per launch",
        ref,
        "every size a constant",
        adapter=adapter_name(ctx),
        launches=n,
        pipelines=g.pipelines,
        constants_pipelines=g0.pipelines,
        us_per_launch_enqueue=ours["enqueue_s"] / n * 1e6,
        constants_us_per_launch_enqueue=ref["enqueue_s"] / n * 1e6,
        median_round_ratio=1 / ratio,
    )
    print(
        f"\n{n} launches: {info['us_per_launch_enqueue']:.3f} us/launch enqueue with parameters "
        f"({g.pipelines} pipeline), {info['constants_us_per_launch_enqueue']:.3f} us with constants "
        f"({g0.pipelines} pipelines)"
    )
