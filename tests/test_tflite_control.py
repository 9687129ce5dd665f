"""TFLite control flow decided at run time, in models made by TensorFlow's converter
(tests/tflite_control_models.py), against LiteRT's interpreter on the same inputs: WHILE loops
whose trip count is a graph input or depends on the data (0 iterations included), run by an
InferenceSession on the GPU timeline as stages (tflite/staged.py, stages/loop.py); an IF on a
run-time condition inside a loop body; an IF whose branches give different shapes (the condition
read back, the branch taken imported); a run-time WHILE inside an IF branch (the stage ends inside
the branch taken). tflite.import_model (one graph) still refuses them.

Models are made on first use by a Python with `tensorflow-cpu` (MLTENSOR_TENSORFLOW_PYTHON, or
.venv-tf), cached under the cache directory; without one these tests skip.
"""

import os

import numpy as np
import pytest
from helpers import in_threads
from test_tflite_state import HERE, converted

from tflite_reference import model_bytes

import mltensor
from mltensor.errors import NotSupportedError
from mltensor.tflite import import_model

pytest.importorskip("ai_edge_litert")

GENERATOR = os.path.join(HERE, "tflite_control_models.py")


@pytest.fixture(scope="module")
def models():
    return converted(GENERATOR, "tflite-control")


def _litert(data, feeds):
    """LiteRT's outputs {name: array} for feeds {input name: array}."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data)
    it.allocate_tensors()
    for d in it.get_input_details():
        it.set_tensor(d["index"], feeds[d["name"]])
    it.invoke()
    return {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}


def _feeds(sess, x, n=None):
    out = {}
    for a in sess.get_inputs():
        out[a.name] = x if a.type == "tensor(float)" else np.array(n, np.int32)
    return out


def _check(sess, data, feeds, what, location="cpu"):
    names = [o.name for o in sess.get_outputs()]
    got = sess.run(None, feeds, output_location=location)
    if location == "ml-tensor":
        got = [sess._ctx.read_tensor_sync(t) for t in got]
    ref = _litert(data, feeds)
    for name, g in zip(names, got):
        r = ref[name]
        assert g.shape == r.shape and g.dtype == r.dtype, (what, name, g.shape, r.shape, g.dtype, r.dtype)
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=f"{what}: {name}")
    return dict(zip(names, got))


def _x(seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal((1, 6)) * scale).astype(np.float32)


def test_while_trip_count_from_an_input(ctx, models):
    """The counter comes out: n iterations for n = 0, 1, 5, 20, 37 (batches of 8 and a part);
    the stage after the loop is built once for every n."""
    data = model_bytes(models, "while_bound")
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        for k, n in enumerate((0, 1, 5, 20, 37, 3)):
            got = _check(sess, data, _feeds(sess, _x(k), n), f"n={n}", "ml-tensor" if k % 2 else "cpu")
            assert n in [int(np.asarray(v).reshape(-1)[0]) for v in got.values() if v.dtype == np.int32]
        assert sess.stats["stage_builds"] == 1


def test_while_until_a_threshold(ctx, models):
    """No trip count anywhere: the input's size decides it (0 iterations for a large input)."""
    data = model_bytes(models, "while_threshold")
    trips = set()
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        for k, scale in enumerate((30.0, 4.0, 1.0, 0.2, 0.01)):
            got = _check(sess, data, _feeds(sess, _x(k, scale)), f"scale {scale}")
            trips.update(int(v.reshape(-1)[0]) for v in got.values() if v.dtype == np.int32)
    assert 0 in trips and len(trips) == 5, trips


def test_while_with_an_if_in_its_body_then_a_second_loop(ctx, models):
    data = model_bytes(models, "while_nested_cond")
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        for k, n in enumerate((0, 2, 9)):
            _check(sess, data, _feeds(sess, _x(k + 10), n), f"n={n}")


def test_if_branches_of_different_shapes(ctx, models):
    """Both outcomes: [1, 3] and [1, 12]; each branch's stage built once."""
    data = model_bytes(models, "cond_shapes")
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        shapes = set()
        for k, sign in enumerate((1.0, -1.0, 1.0, -1.0)):
            x = sign * np.abs(_x(k))
            got = _check(sess, data, _feeds(sess, x), f"sign {sign}", "ml-tensor" if k >= 2 else "cpu")
            shapes.update(v.shape for v in got.values())
        assert shapes == {(1, 3), (1, 12)}
        assert sess.stats["stage_builds"] == 2


def test_while_inside_an_if_branch(ctx, models):
    """tf.while_loop (bounded by an input) inside tf.cond on a computed value: the IF's condition
    is read back, then the stage importing the branch taken ends at its WHILE (run on the GPU),
    and the next resumes inside the branch. Both outcomes, several trip counts (0 included)."""
    data = model_bytes(models, "cond_while")
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        for k, (sign, n) in enumerate(((1.0, 3), (-1.0, 3), (1.0, 0), (1.0, 12), (-1.0, 7), (1.0, 5))):
            x = sign * np.abs(_x(k))
            _check(sess, data, _feeds(sess, x, n), f"sign {sign}, n={n}", "ml-tensor" if k % 2 else "cpu")
        # the two branches' stages after the condition, and the stage after the loop
        assert sess.stats["stage_builds"] == 3, sess.stats


def test_if_of_different_shapes_inside_an_if_branch(ctx, models):
    """An IF whose branches give [1, 3] and [1, 12] inside a tf.cond branch (the other [1, 2]):
    the outer condition is read back, then the inner one; all three outcomes."""
    data = model_bytes(models, "cond_in_cond")
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        shapes = set()
        for k, x in enumerate((np.full((1, 6), 0.1, np.float32), np.abs(_x(1)) + 0.5, -np.abs(_x(2)), np.abs(_x(3)))):
            got = _check(sess, data, _feeds(sess, x), f"input {k}")
            shapes.update(v.shape for v in got.values())
        assert shapes == {(1, 2), (1, 3), (1, 12)}, shapes


@pytest.mark.parametrize("name", ["while_bound", "cond_while"])
def test_runs_from_threads(ctx, models, name):
    data = model_bytes(models, name)
    ns = (4, 0, 11, 7, 2, 16)
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        results = {}

        def work(n):
            results[n] = sess.run(None, _feeds(sess, _x(n), n))

        in_threads(work, [(n,) for n in ns])  # (a thread's exception re-raised here)
        names = [o.name for o in sess.get_outputs()]
        for n in ns:
            ref = _litert(data, _feeds(sess, _x(n), n))
            for name, g in zip(names, results[n]):
                np.testing.assert_allclose(g, ref[name], rtol=1e-4, atol=1e-4, err_msg=f"n={n}: {name}")


@pytest.mark.parametrize("name", ["while_bound", "while_threshold", "cond_shapes", "cond_while"])
def test_one_graph_refuses_them(ctx, models, name):
    """tflite.import_model builds one graph: the operator is named, and where it runs."""
    with pytest.raises(
        NotSupportedError, match=r"\((WHILE|IF)(, subgraph \d+)?\).*computed at run time.*InferenceSession"
    ):
        import_model(model_bytes(models, name), ctx)


def test_while_in_float16(ctx, models):
    """float16=True: the loop's values and the constants carried into it in float16."""
    data = model_bytes(models, "while_bound")
    with mltensor.InferenceSession(data, ctx, cache=False, float16=True) as sess:
        names = [o.name for o in sess.get_outputs()]
        for k, n in enumerate((0, 9)):
            feeds = _feeds(sess, _x(k), n)
            ref = _litert(data, feeds)
            for name, g in zip(names, sess.run(None, feeds)):
                np.testing.assert_allclose(g, ref[name], rtol=1e-2, atol=1e-2, err_msg=f"n={n}: {name}")


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("while_nested", r"operator 1 \(WHILE, subgraph \d+\).*computed at run time.*inside a WHILE body"),
        ("while_growing", r"operator 0 \(WHILE\): loop variable 1 changes from float32 \[1, 6\] to float32 \[1, 7\]"),
    ],
)
def test_refused_at_the_first_run_naming_the_operator(ctx, models, name, match):
    """A run-time loop inside a loop body, a loop value that grows: the body is built at the first
    run (as an executed ONNX Loop's), which refuses it, naming the operator."""
    with mltensor.InferenceSession(model_bytes(models, name), ctx, cache=False) as sess:
        with pytest.raises(NotSupportedError, match=match):
            sess.run(None, _feeds(sess, _x(0), 2))


def test_while_too_long_to_unroll_runs_on_the_gpu(ctx, models):
    """300 iterations known at load: more than are unrolled (256), so executed as a run-time loop
    is."""
    data = model_bytes(models, "while_long")
    with mltensor.InferenceSession(data, ctx, cache=False) as sess:
        _check(sess, data, _feeds(sess, _x(3)), "300 iterations")
        assert sess.stats["stage_builds"] == 1


def test_staged_model_in_the_graph_cache(ctx, models, tmp_path, monkeypatch):
    """A second session of a staged model loads every stage it reaches from the graph cache (the
    import still runs, for the cuts), with LiteRT's outputs; another option (float16) or a changed
    weight (the loop's factor 0.8 made 0.7) is another build."""
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("MLTENSOR_GRAPH_CACHE", raising=False)
    data = model_bytes(models, "cond_while")
    cases = [(1.0, 3), (-1.0, 2), (1.0, 0)]

    def run(model, **kw):
        with mltensor.InferenceSession(model, ctx, **kw) as sess:
            for k, (sign, n) in enumerate(cases):
                feeds = _feeds(sess, sign * np.abs(_x(k)), n)
                if kw.get("float16"):  # (float16's rounding: the other tests check its values)
                    sess.run(None, feeds)
                else:
                    _check(sess, model, feeds, f"sign {sign}, n={n}")
            return dict(sess.stats)

    first = run(data)
    assert first["loaded"] == 0
    second = run(data)
    # the first stage, both branches' stages after the condition, the stage after the loop
    assert second["loaded"] == 4 and second["stage_builds"] == first["stage_builds"] == 3, second
    assert run(data, float16=True)["loaded"] == 0
    factor = np.float32(0.8).tobytes()
    assert data.count(factor) == 1
    assert run(data.replace(factor, np.float32(0.7).tobytes()))["loaded"] == 0
