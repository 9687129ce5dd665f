"""Stateful and control-flow TFLite models made by TensorFlow's converter
(tests/tflite_state_models.py) against LiteRT's interpreter on the same calls: a streaming model
whose resource variables (ring buffers of past frames) the session keeps on the GPU between runs,
in float and full-integer forms (int8 variables too), `reset_state`, runs from several threads;
IF, WHILE with a trip count known at load, a Keras 3 LSTM (a WHILE over time steps).

The models are made on first use by a Python with `tensorflow-cpu` and `tf-keras`
(MLTENSOR_TENSORFLOW_PYTHON, or .venv-tf from `MLTENSOR_SETUP_TENSORFLOW=1 bash setup.sh`), cached
under the cache directory keyed on the generator and the TensorFlow version; without one these
tests skip.
"""

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_tflite_general import CASES

from helpers import in_threads
from tflite_reference import external_python, model_bytes

import mltensor
from mltensor._xdg import cache_dir
from mltensor.errors import NotSupportedError
from mltensor.tflite import import_model
from mltensor.tflite.writer import ModelWriter

pytest.importorskip("ai_edge_litert")

HERE = os.path.dirname(os.path.abspath(__file__))
GENERATOR = os.path.join(HERE, "tflite_state_models.py")
ENV = "MLTENSOR_TENSORFLOW_PYTHON"
STREAMS = ("stream_float", "stream_int8", "stream_int8_variables")


def tensorflow_python():
    if importlib.util.find_spec("tensorflow") is not None:
        return sys.executable
    return external_python(ENV, ".venv-tf", "MLTENSOR_SETUP_TENSORFLOW", "tensorflow-cpu and tf-keras")


def converted(generator, subdir, python=None, packages=("tensorflow", "tf-keras", "keras"), timeout=1200):
    """The directory of the models `generator` writes (run by `python`, by default one with
    TensorFlow, once: cached under the cache directory keyed on the generator and the versions of
    `packages` there)."""
    py = python or tensorflow_python()
    code = f"import importlib.metadata as m; print([m.version(n) for n in {tuple(packages)!r}])"
    versions = subprocess.run([py, "-c", code], check=True, capture_output=True, text=True).stdout
    with open(generator, "rb") as f:
        key = hashlib.sha256(f.read() + versions.encode()).hexdigest()[:16]
    d = os.path.join(cache_dir(), subdir, key)
    if not os.path.exists(os.path.join(d, "versions.json")):
        tmp = d + f".tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run([py, generator, tmp], capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            pytest.fail(f"the converter failed ({r.returncode}):\n{r.stderr[-3000:]}")
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)
    return d


@pytest.fixture(scope="module")
def models():
    return converted(GENERATOR, "tflite-state")


def _interpreter(data):
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data)
    it.allocate_tensors()
    return it


def _invoke(it, *xs):
    for d, x in zip(it.get_input_details(), xs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _frames(it, n, seed=0):
    """n inputs of the interpreter's input (standard normal values, quantized for an int8 one)."""
    d = it.get_input_details()[0]
    xs = np.random.default_rng(seed).standard_normal((n, *d["shape"])).astype(np.float32)
    if d["dtype"] != np.float32:
        scale, zp = d["quantization"]
        xs = np.clip(np.round(xs / scale) + zp, -128, 127).astype(d["dtype"])
    return list(xs)


def _quantum(it):
    d = it.get_output_details()[0]
    return 1 if d["dtype"] != np.float32 else None


def _close(got, ref, quantum, what):
    assert got.shape == ref.shape and got.dtype == ref.dtype, what
    if quantum:  # an integer output: LiteRT's value or one step from it
        assert np.abs(got.astype(np.int32) - ref.astype(np.int32)).max() <= quantum, what
    else:
        np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4, err_msg=what)


@pytest.mark.parametrize("name", STREAMS)
def test_streaming_model_matches_litert(ctx, models, name):
    """Calls in a row on one session and on one LiteRT interpreter: the same outputs, each call
    reading the ring buffers the last one left; reset_state() then matches a fresh interpreter."""
    data = model_bytes(models, name)
    it = _interpreter(data)
    xs = _frames(it, 9)
    q = _quantum(it)
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        assert sess.stateful
        (inp,) = sess.get_inputs()
        assert [o.name for o in sess.get_outputs()] == [d["name"] for d in it.get_output_details()]
        outs = []
        for k, x in enumerate(xs):
            (got,) = sess.run(None, {inp.name: x})
            _close(got, _invoke(it, x), q, f"call {k}")
            outs.append(got)
        # the state matters: the first frame again gives another output than on the first call
        (again,) = sess.run(None, {inp.name: xs[0]})
        _close(again, _invoke(it, xs[0]), q, "call 9")
        assert np.abs(again.astype(np.float64) - outs[0]).max() > (q or 1e-3)
        sess.reset_state()
        fresh = _interpreter(data)
        for k, x in enumerate(xs[:4]):
            (got,) = sess.run(None, {inp.name: x})
            _close(got, _invoke(fresh, x), q, f"call {k} after reset_state")
        # nothing of the state goes to the host: its tensors cannot even be read
        state = sess._specs[None].state
        assert state.inputs and state.outputs
        assert all(not t.readable for t in [*state._cur.values(), *state._next.values()])
        assert sess.stats["readbacks"] == 0


def test_streaming_state_in_ml_tensor_runs_and_graph_cache(ctx, models, tmp_path, monkeypatch):
    """ml-tensor runs carry the state as numpy runs do; a session whose graph comes from the graph
    cache (a second process's case) has its initial state from there too."""
    data = model_bytes(models, "stream_float")
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    it = _interpreter(data)
    xs = _frames(it, 5, seed=3)
    refs = [_invoke(it, x) for x in xs]
    for expect_loaded in (0, 1):
        with mltensor.InferenceSession(data, ctx, cache=True) as sess:
            assert sess.stats["loaded"] == expect_loaded and sess.stateful
            name = sess.get_inputs()[0].name
            for k, (x, ref) in enumerate(zip(xs, refs)):
                loc = "ml-tensor" if k % 2 else "cpu"
                (got,) = sess.run(None, {name: x}, output_location=loc)
                got = ctx.read_tensor_sync(got) if loc == "ml-tensor" else got
                np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4, err_msg=f"call {k}")


def test_streaming_runs_from_threads_form_one_chain(ctx, models):
    """Runs from several threads at once: each reads the state the run dispatched before it
    left. The same frame fed by all of them, call k's output depends on k only (until the ring
    buffers fill): the outputs are LiteRT's outputs for calls 0..n-1, in some order."""
    data = model_bytes(models, "stream_float")
    it = _interpreter(data)
    (x,) = _frames(it, 1, seed=5)
    n = 8
    refs = [_invoke(it, x) for _ in range(n)]
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        name = sess.get_inputs()[0].name
        got = []

        def worker():
            for _ in range(n // 4):
                got.append(sess.run(None, {name: x})[0])

        in_threads(worker, [()] * 4)  # (a thread's exception re-raised here)
        assert len({tuple(np.round(r.reshape(-1), 4)) for r in refs}) > 4  # the calls differ
        key = lambda a: tuple(a.reshape(-1))  # noqa: E731
        for g, r in zip(sorted(got, key=key), sorted(refs, key=key)):
            np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


def test_import_model_state_edges(ctx, models):
    """import_model: one state input (and output) per variable, named after it, and the initial
    values; the caller carries the state."""
    data = model_bytes(models, "stream_float")
    init = {}
    graph, inputs, outputs = import_model(data, ctx, initial_state=init)
    assert sorted(init) == ["state:stream_1/ring", "state:stream_2/ring"]
    assert [n for n, _, _ in inputs][1:] == sorted(init) and [n for n, _, _ in outputs][1:] == sorted(init)
    assert all(not a.any() for a in init.values())  # Keras' zeros initializer
    it = _interpreter(data)
    state = dict(init)
    for k, x in enumerate(_frames(it, 4, seed=9)):
        feeds = {inputs[0][0]: x, **state}
        ins = {}
        for n, dt, shape in inputs:
            ins[n] = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
            ctx.write_tensor(ins[n], feeds[n])
        outs = {n: ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True) for n, dt, shape in outputs}
        ctx.dispatch(graph, ins, outs)
        res = {n: ctx.read_tensor_sync(t) for n, t in outs.items()}
        np.testing.assert_allclose(res[outputs[0][0]], _invoke(it, x), atol=1e-4, rtol=1e-4, err_msg=f"call {k}")
        state = {n: res[n] for n in init}
        for t in [*ins.values(), *outs.values()]:
            t.destroy()
    graph.destroy()


@pytest.mark.parametrize("name", ["cond", "loop_fixed", "lstm_keras3"])
def test_control_flow_matches_litert(ctx, models, name):
    data = model_bytes(models, name)
    it = _interpreter(data)
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        assert not sess.stateful
        (inp,) = sess.get_inputs()
        for sign in (1.0, -1.0):  # cond: both branches taken
            x = sign * np.abs(_frames(it, 1, seed=int(sign) + 2)[0])
            (got,) = sess.run(None, {inp.name: x})
            ref = _invoke(it, x)
            assert np.abs(ref).max() > 1e-2
            np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4, err_msg=f"{name}, sign {sign}")


def test_loop_with_run_time_trip_count_is_refused(ctx, models):
    with pytest.raises(NotSupportedError, match=r"operator 0 \(WHILE\).*computed at run time"):
        import_model(model_bytes(models, "loop_dynamic"), ctx)


def test_versions_recorded(models):
    with open(os.path.join(models, "versions.json")) as f:
        assert json.load(f)["tensorflow"]


def test_lstm_state_carried_between_runs(ctx):
    """UNIDIRECTIONAL_SEQUENCE_LSTM's variable state tensors (hidden and cell): LiteRT carries
    them between invokes, and so does a session (zeros after reset_state(), as LiteRT's
    reset_all_variables()); import_model without initial_state starts each call from zeros.
    A model made with the test writer: no TensorFlow needed."""
    data, (x,) = CASES["lstm_clip_active"](np.random.default_rng(4))
    it = _interpreter(data)
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        assert sess.stateful
        name = sess.get_inputs()[0].name
        first = None
        for k in range(3):
            (got,) = sess.run(None, {name: x})
            ref = _invoke(it, x)
            np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-4, err_msg=f"call {k}")
            first = got if first is None else first
        assert np.abs(got - first).max() > 1e-3  # the carried state changes the outputs
        sess.reset_state()
        it.reset_all_variables()
        (got,) = sess.run(None, {name: x})
        np.testing.assert_allclose(got, _invoke(it, x), atol=1e-4, rtol=1e-4, err_msg="after reset")
        np.testing.assert_allclose(got, first, atol=1e-6)
    graph, inputs, outputs = import_model(data, ctx)  # no initial_state: zeros each call
    assert len(inputs) == 1 and len(outputs) == 1
    graph.destroy()


# -- models written by the test writer (no TensorFlow): the operators one at a time -------------


def _resource(w, name):
    """A RESOURCE tensor (a variable handle)."""
    import tflite

    i = w.tensor(name, [], np.int32)
    n, shape, _, buf, sig, quant, var = w.tensors[i]
    w.tensors[i] = (n, shape, tflite.TensorType.RESOURCE, buf, sig, quant, var)
    return i


def _init_subgraph(w, values):
    """CALL_ONCE's initialization subgraph: each variable assigned a constant."""
    init = w.subgraph()
    for name, value in values.items():
        h = _resource(init, f"{name}_handle")
        init.op("VAR_HANDLE", [], [h], "VarHandleOptions", SharedName=name)
        init.op("ASSIGN_VARIABLE", [h, init.const(f"{name}_init", value)], [])
    init.end([], [])
    return init.index


def _accumulator(read_after_assign=False, initialized=True):
    """acc <- acc + x each call (acc starts at 0.5); y = acc + x, or with read_after_assign
    y = 2 * (the variable read again after the assignment)."""
    w = ModelWriter()
    x = w.input("x", [2, 3])
    h, r, s, y = _resource(w, "h"), w.tensor("r", [2, 3]), w.tensor("s", [2, 3]), w.tensor("y", [2, 3])
    if initialized:
        w.op(
            "CALL_ONCE",
            [],
            [],
            "CallOnceOptions",
            InitSubgraphIndex=_init_subgraph(w, {"acc": np.full((2, 3), 0.5, np.float32)}),
        )
    w.op("VAR_HANDLE", [], [h], "VarHandleOptions", SharedName="acc")
    w.op("READ_VARIABLE", [h], [r])
    w.op("ADD", [r, x], [s], "AddOptions")
    w.op("ASSIGN_VARIABLE", [h, s], [])
    if read_after_assign:
        r2 = w.tensor("r2", [2, 3])
        w.op("READ_VARIABLE", [h], [r2])
        w.op("MUL", [r2, w.const("two", np.array(2.0, np.float32))], [y], "MulOptions")
    else:
        w.op("ADD", [s, x], [y], "AddOptions")
    return w.finish([x], [y])


def _if_model():
    """IF(c > 0) with the variable handle and x as arguments: the then branch adds x to the
    variable and gives it; the else branch gives 2 x and leaves the variable alone."""
    w = ModelWriter()
    x, c = w.input("x", [2, 3]), w.input("c", [1])
    h, cond, y = _resource(w, "h"), w.tensor("cond", [1], np.bool_), w.tensor("y", [2, 3])
    init = _init_subgraph(w, {"acc": np.zeros((2, 3), np.float32)})
    w.op("CALL_ONCE", [], [], "CallOnceOptions", InitSubgraphIndex=init)
    w.op("VAR_HANDLE", [], [h], "VarHandleOptions", SharedName="acc")
    w.op("GREATER", [c, w.const("zero", np.zeros(1, np.float32))], [cond])
    then, other = w.subgraph(), w.subgraph()
    th, tx, tr, ts = (
        _resource(then, "th"),
        then.tensor("tx", [2, 3]),
        then.tensor("tr", [2, 3]),
        then.tensor("ts", [2, 3]),
    )
    then.op("READ_VARIABLE", [th], [tr])
    then.op("ADD", [tr, tx], [ts], "AddOptions")
    then.op("ASSIGN_VARIABLE", [th, ts], [])
    then.end([th, tx], [ts])
    eh, ex, ey = _resource(other, "eh"), other.tensor("ex", [2, 3]), other.tensor("ey", [2, 3])
    other.op("MUL", [ex, other.const("two", np.array(2.0, np.float32))], [ey], "MulOptions")
    other.end([eh, ex], [ey])
    w.op("IF", [cond, h, x], [y], "IfOptions", ThenSubgraphIndex=then.index, ElseSubgraphIndex=other.index)
    return w.finish([x, c], [y])


def _while_model(trips):
    """y = x; repeat `trips` times: y = 0.5 y + sin(y) (a counter against a constant)."""
    w = ModelWriter()
    x = w.input("x", [2, 3])
    i_out, y = w.tensor("i_out", [], np.int32), w.tensor("y", [2, 3])
    cond, body = w.subgraph(), w.subgraph()
    ci, cy, cb = cond.tensor("ci", [], np.int32), cond.tensor("cy", [2, 3]), cond.tensor("cb", [], np.bool_)
    cond.op("LESS", [ci, cond.const("n", np.array(trips, np.int32))], [cb])
    cond.end([ci, cy], [cb])
    bi, by = body.tensor("bi", [], np.int32), body.tensor("by", [2, 3])
    bi2, bs, bm, by2 = (body.tensor(n, s, np.int32 if n == "bi2" else np.float32) for n, s in
                        [("bi2", []), ("bs", [2, 3]), ("bm", [2, 3]), ("by2", [2, 3])])  # fmt: skip
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [bi2], "AddOptions")
    body.op("SIN", [by], [bs])
    body.op("MUL", [by, body.const("half", np.array(0.5, np.float32))], [bm], "MulOptions")
    body.op("ADD", [bm, bs], [by2], "AddOptions")
    body.end([bi, by], [bi2, by2])
    w.op("WHILE", [w.const("i0", np.array(0, np.int32)), x], [i_out, y], "WhileOptions",
         CondSubgraphIndex=cond.index, BodySubgraphIndex=body.index)  # fmt: skip
    return w.finish([x], [y])


@pytest.mark.parametrize("read_after_assign", [False, True])
def test_written_variable_model_matches_litert(ctx, read_after_assign):
    data = _accumulator(read_after_assign)
    it = _interpreter(data)
    xs = list(np.random.default_rng(1).standard_normal((5, 2, 3)).astype(np.float32))
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        assert sess.stateful and [a.name for a in sess.get_inputs()] == ["x"]
        for k, x in enumerate(xs):
            (got,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(got, _invoke(it, x), atol=1e-5, err_msg=f"call {k}")
        sess.reset_state()
        (got,) = sess.run(None, {"x": xs[0]})
        np.testing.assert_allclose(got, _invoke(_interpreter(data), xs[0]), atol=1e-5, err_msg="after reset")


def test_written_if_model_assigns_in_one_branch(ctx):
    """A condition computed at run time: both branches computed, outputs and the variable the
    then branch assigns selected; over calls that take either branch, as LiteRT."""
    data = _if_model()
    it = _interpreter(data)
    rng = np.random.default_rng(2)
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        for k, sign in enumerate([1, 1, -1, 1, -1, -1, 1]):
            x = rng.standard_normal((2, 3)).astype(np.float32)
            c = np.array([sign], np.float32)
            (got,) = sess.run(None, {"x": x, "c": c})
            np.testing.assert_allclose(got, _invoke(it, x, c), atol=1e-5, err_msg=f"call {k}")


def test_written_while_model(ctx):
    data = _while_model(9)
    x = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        assert not sess.stateful
        (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, _invoke(_interpreter(data), x), atol=1e-5)
    # 1000 iterations: too many to unroll; one graph refuses it, a session runs it on the GPU
    data = _while_model(1000)
    with pytest.raises(NotSupportedError, match=r"operator 0 \(WHILE\).*more than 256 iterations"):
        import_model(data, ctx)
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        (got,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(got, _invoke(_interpreter(data), x), atol=1e-5)


def test_variable_read_without_initial_value_is_refused(ctx):
    from mltensor.errors import DataError

    with pytest.raises(DataError, match=r"READ_VARIABLE.*'acc', which no CALL_ONCE"):
        import_model(_accumulator(initialized=False), ctx)


def test_converter_operators_supported(models):
    """Every builtin operator the converter emits for these stateful and control-flow models
    (resource variables, CALL_ONCE, IF, WHILE, the LSTM) is one the importer converts."""
    from tflite_reference import operator_coverage

    used, missing = operator_coverage(sorted(glob.glob(os.path.join(models, "*.tflite"))))
    assert {"VAR_HANDLE", "CALL_ONCE", "IF", "WHILE"} <= used
    assert 1 - len(missing) / len(used) >= 0.95, sorted(missing)


def test_if_branches_of_different_shapes_refused(ctx):
    """IF on a condition computed at run time whose branches give different shapes ([2, 3] and
    [3, 2]: the output's shape would be known only at run time) is refused at load, naming it."""
    w = ModelWriter()
    x, c = w.input("x", [2, 3]), w.input("c", [1])
    cond, y = w.tensor("cond", [1], np.bool_), w.tensor("y", [2, 3])
    w.op("GREATER", [c, w.const("zero", np.zeros(1, np.float32))], [cond])
    then, other = w.subgraph(), w.subgraph()
    tx = then.tensor("tx", [2, 3])
    then.end([tx], [tx])
    ex, ey = other.tensor("ex", [2, 3]), other.tensor("ey", [3, 2])
    other.op("RESHAPE", [ex, other.const("shape", np.array([3, 2], np.int32))], [ey])
    other.end([ex], [ey])
    w.op("IF", [cond, x], [y], "IfOptions", ThenSubgraphIndex=then.index, ElseSubgraphIndex=other.index)
    with pytest.raises(NotSupportedError, match=r"\(IF\).*float32 \[2, 3\] and float32 \[3, 2\].*same shapes"):
        import_model(w.finish([x, c], [y]), ctx)
