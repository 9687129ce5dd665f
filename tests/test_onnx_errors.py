"""Bad ONNX input fails cleanly: a malformed or truncated model raises mltensor.DataError naming
the file and the field or node, an unsupported construct mltensor.NotSupportedError, a bug of
ours on a model onnx.checker accepts mltensor.InternalError naming the node; nothing else escapes
(protobuf DecodeError, IndexError, KeyError, ValueError...). A byte-level fuzz test of a real
model asserts exactly that: a quick run by default, 600 mutants with -m slow (structural
mutations: test_onnx_mutations.py)."""

import os
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mltensor
from mltensor import InferenceSession
from mltensor.onnx import import_model

SQUEEZENET = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_squeezenet.onnx")
ALLOWED = (mltensor.DataError, mltensor.NotSupportedError)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def test_truncated_file_names_the_file(ctx, tmp_path):
    data = open(SQUEEZENET, "rb").read()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 3])
    with pytest.raises(mltensor.DataError, match=r"cut\.onnx.*not a well-formed ONNX model"):
        InferenceSession(str(p), ctx)
    with pytest.raises(mltensor.DataError, match=r"cut\.onnx"):
        import_model(str(p), ctx)
    with pytest.raises(mltensor.DataError, match=r"<ONNX bytes, \d+ bytes>"):
        InferenceSession(data[:100], ctx)


def test_missing_file_is_os_error(ctx, tmp_path):
    with pytest.raises(FileNotFoundError):
        InferenceSession(str(tmp_path / "nope.onnx"), ctx)


def test_initializer_data_not_matching_its_shape(ctx):
    t = numpy_helper.from_array(np.ones((2, 3), np.float32), "W")
    t.raw_data = t.raw_data[:-4]  # one float short
    m = _model([helper.make_node("Add", ["x", "W"], ["y"])], [_vi("x", [2, 3])], [_vi("y", [2, 3])], [t])
    with pytest.raises(mltensor.DataError, match=r"<onnx.ModelProto>.*tensor 'W'.*does not match"):
        InferenceSession(m, ctx)


def test_dangling_node_input_and_output(ctx):
    m = _model([helper.make_node("Relu", ["ghost"], ["y"], name="r")], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(mltensor.DataError, match=r"node 'r' \(Relu\).*'ghost' is not produced"):
        InferenceSession(m, ctx)
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("z", [2])])
    with pytest.raises(mltensor.DataError, match=r"graph output 'z' is not produced"):
        InferenceSession(m, ctx)


def test_nodes_out_of_order_are_sorted_as_onnxruntime_does(ctx):
    """ONNX wants nodes in topological order; onnxruntime sorts a main graph that breaks it (a
    hand edit, a careless exporter), so does mltensor (subgraphs too, which onnxruntime refuses),
    and leaves the caller's proto as it was. A cycle still fails with the input no earlier node
    produces."""
    ort = pytest.importorskip("onnxruntime")

    def model(branch_nodes):
        branch = helper.make_graph(branch_nodes, "branch", [], [_vi("t1", [2])])
        return _model(
            [
                helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch),
                helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
                helper.make_node("ReduceSum", ["a"], ["s"], keepdims=0, name="sum"),
                helper.make_node("Mul", ["x", "x"], ["a"], name="sq"),
            ],
            [_vi("x", [2])],
            [_vi("y", [2])],
            [numpy_helper.from_array(np.array(0, np.float32), "zero")],
        )

    b1, b2 = helper.make_node("Relu", ["a"], ["t0"], name="b1"), helper.make_node("Neg", ["t0"], ["t1"], name="b2")
    x = np.array([1.5, -2.0], np.float32)
    ref = model([b1, b2]).SerializeToString()  # (its branch in order: onnxruntime sorts the main graph only)
    (want,) = ort.InferenceSession(ref, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    m = model([b2, b1])
    before = m.SerializeToString()
    (got,) = InferenceSession(m, ctx).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
    assert m.SerializeToString() == before
    (got,) = InferenceSession(before, ctx).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
    cycle = _model(
        [helper.make_node("Neg", ["b"], ["a"], name="n1"), helper.make_node("Neg", ["a"], ["b"], name="n2")],
        [_vi("x", [2])],
        [_vi("b", [2])],
    )
    with pytest.raises(mltensor.DataError, match=r"node 'n1' \(Neg\).*'b' is not produced"):
        InferenceSession(cycle, ctx)


def test_operator_inputs_that_break_the_operator_are_data_errors(ctx):
    """Found by the mutation run (test_onnx_mutations.py) on silero-vad, whose symbolic shapes
    hide them from onnx.checker (onnxruntime rejects both): a Conv whose W and B were swapped,
    a ConstantOfShape asked for a negative dimension. They were internal exceptions."""
    w = numpy_helper.from_array(np.ones((4, 3, 3), np.float32), "W")
    b = numpy_helper.from_array(np.ones(4, np.float32), "B")
    m = _model(
        [helper.make_node("Conv", ["x", "B", "W"], ["y"], name="c")], [_vi("x", [1, 3, 8])], [_vi("y", None)], [w, b]
    )
    with pytest.raises(mltensor.DataError, match=r"node 'c' \(Conv\): W has shape \[4\] and X \[1, 3, 8\]"):
        InferenceSession(m, ctx)
    s = numpy_helper.from_array(np.array([2, -1], np.int64), "s")
    m = _model(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos"), helper.make_node("Add", ["x", "c"], ["y"])],
        [_vi("x", [1])],
        [_vi("y", None)],
        [s],
    )
    with pytest.raises(mltensor.DataError, match=r"node 'cos' \(ConstantOfShape\): shape \[2, -1\] has a negative"):
        InferenceSession(m, ctx)


@pytest.mark.parametrize("case", ["reshape", "range"])
def test_more_operator_inputs_that_break_the_operator(ctx, case):
    """Also found by the mutation run: a Reshape copying (0) a dimension the input lacks, a
    Range of delta 0 (onnxruntime rejects both). They were IndexError and OverflowError."""
    if case == "reshape":
        s = numpy_helper.from_array(np.array([0, 0, 0, -1], np.int64), "s")
        node = helper.make_node("Reshape", ["x", "s"], ["y"], name="r")
        m = _model([node], [_vi("x", ["n", 6])], [_vi("y", None)], [s])
        feeds, msg = {"x": np.ones((2, 6), np.float32)}, r"node 'r' \(Reshape\): shape .* copies dimension 2"
    else:
        node = helper.make_node("Range", ["a", "b", "d"], ["i"], name="r")
        m = _model(
            [
                node,
                helper.make_node("Cast", ["i"], ["c"], to=TensorProto.FLOAT),
                helper.make_node("Add", ["x", "c"], ["y"]),
            ],
            [
                _vi("x", [1]),
                _vi("a", [], TensorProto.INT64),
                _vi("b", [], TensorProto.INT64),
                _vi("d", [], TensorProto.INT64),
            ],
            [_vi("y", None)],
        )
        feeds = {"x": np.ones(1, np.float32), "a": np.array(0), "b": np.array(4), "d": np.array(0)}
        msg = r"node 'r' \(Range\): delta is 0"
    with pytest.raises(mltensor.DataError, match=msg):
        InferenceSession(m, ctx).run(None, feeds)


def test_huge_folded_shape_is_refused_not_allocated(ctx):
    shape = numpy_helper.from_array(np.array([1 << 20, 1 << 20], np.int64), "s")
    m = _model(
        [helper.make_node("ConstantOfShape", ["s"], ["c"], name="big"), helper.make_node("Add", ["x", "c"], ["y"])],
        [_vi("x", [1])],
        [_vi("y", None)],
        [shape],
    )
    with pytest.raises(mltensor.DataError, match=r"node 'big' \(ConstantOfShape\).*would hold 1099511627776"):
        InferenceSession(m, ctx)


@pytest.mark.parametrize("where", ["input", "output"])
def test_name_not_utf8_is_data_error_at_construction(ctx, where, tmp_path, monkeypatch):
    """protobuf gives a string field that is not UTF-8 as bytes: the session refuses the model
    when it is built (it used to escape as a TypeError from the graph cache's JSON note)."""
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    m = _model(
        [helper.make_node("Relu", ["in_QQQQ"], ["out_RRRR"])], [_vi("in_QQQQ", ["n", 3])], [_vi("out_RRRR", ["n", 3])]
    )
    bad = b"QQQQ" if where == "input" else b"RRRR"
    blob = m.SerializeToString().replace(bad, b"\xff\xfe\xfd\xfc")
    with pytest.raises(mltensor.DataError, match=rf"graph {where} has an invalid name"):
        InferenceSession(blob, ctx)


def test_dim_param_not_utf8_still_runs(ctx, tmp_path, monkeypatch):
    """A symbolic dimension whose name is not UTF-8 (bytes from protobuf) names nothing a user
    feeds: the session runs, only without the graph cache's JSON description note."""
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["QQQQ", 3])], [_vi("y", ["QQQQ", 3])])
    blob = m.SerializeToString().replace(b"QQQQ", b"\xff\xfe\xfd\xfc")
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    (y,) = InferenceSession(blob, ctx).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_unsupported_construct_is_not_supported_error(ctx):
    m = _model([helper.make_node("Relu", ["x"], ["y"], domain="com.example")], [_vi("x", [2])], [_vi("y", [2])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(mltensor.NotSupportedError, match="com.example"):
        InferenceSession(m, ctx)


def _broken_relu(monkeypatch):
    from mltensor.onnx.ops._registry import HANDLERS, Handler

    def relu(im, node, ins, attrs):
        return ins[0].no_such_attribute  # a bug of ours

    monkeypatch.setitem(HANDLERS, "Relu", Handler(relu, set()))


def test_internal_exception_is_our_bug_naming_the_node(ctx, monkeypatch):
    """An exception of mltensor's own code on a valid model: InternalError (an OperationError),
    not DataError; it says it is a bug, names the node and keeps the original exception."""
    _broken_relu(monkeypatch)
    m = _model(
        [helper.make_node("Neg", ["x"], ["n"], name="neg"), helper.make_node("Relu", ["n"], ["y"], name="act")],
        [_vi("x", [2, 3])],
        [_vi("y", [2, 3])],
    )
    with pytest.raises(mltensor.InternalError, match=r"node 'act' \(Relu\): internal error in mltensor, a bug") as e:
        InferenceSession(m, ctx)
    assert isinstance(e.value, mltensor.OperationError)
    assert isinstance(e.value.__cause__, AttributeError)
    assert e.value.__cause__.__traceback__ is not None


def test_internal_exception_inside_a_branch_names_the_branch_node(ctx, monkeypatch):
    _broken_relu(monkeypatch)
    branch = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="inner")], "b", [], [_vi("t", [2])])
    m = _model(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch)],
        [_vi("x", [2]), _vi("c", [], TensorProto.BOOL)],
        [_vi("y", [2])],
    )
    with pytest.raises(mltensor.InternalError, match=r"node 'inner' \(Relu\)"):
        InferenceSession(m, ctx).run(None, {"x": np.ones(2, np.float32), "c": np.array(True)})


def test_exception_on_a_model_the_checker_rejects_is_data_error(ctx, monkeypatch):
    """The same exception on a model onnx.checker rejects (Relu given two inputs): DataError,
    quoting the checker."""
    _broken_relu(monkeypatch)
    m = _model([helper.make_node("Relu", ["x", "x"], ["y"], name="act")], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(mltensor.DataError, match=r"node 'act' \(Relu\): malformed model: onnx.checker rejects it"):
        InferenceSession(m, ctx)


def test_loader_bug_on_a_file_that_parses_is_internal_error(ctx, monkeypatch):
    """The in-place weight reader failing on a file protobuf parses: our bug, not the file's."""
    from mltensor.onnx import weights

    def strip(buf):
        raise IndexError("index out of range")

    monkeypatch.setattr(weights, "strip", strip)
    with pytest.raises(mltensor.InternalError, match=r"the file parses as an ONNX ModelProto") as e:
        InferenceSession(open(SQUEEZENET, "rb").read(), ctx)
    assert isinstance(e.value.__cause__, IndexError)
    with pytest.raises(mltensor.DataError, match=r"not a well-formed ONNX model"):
        InferenceSession(b"\xff" * 64, ctx)


def test_run_bug_is_internal_error(ctx, monkeypatch):
    """An exception of our own while running: InternalError naming the call, with its cause."""
    from mltensor.session.run import RunPath

    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    sess = InferenceSession(m, ctx)

    def broken(*args, **kwargs):
        raise KeyError("some internal key")

    monkeypatch.setattr(RunPath, "_bind_and_dispatch", broken)
    with pytest.raises(mltensor.InternalError, match=r"\[InferenceSession.run\] internal error in mltensor") as e:
        sess.run(None, {"x": np.ones(2, np.float32)})
    assert isinstance(e.value.__cause__, KeyError)
    with pytest.raises(TypeError, match="x"):  # the caller's errors stay what they were
        sess.run(None, {"x": np.ones(3, np.float32)})


def _mutants(data, n, seed):
    """Bit flips, zeroed runs, truncation and swapped byte runs (which swap fields or parts of
    them), in turn."""
    rng = random.Random(seed)
    for k in range(n):
        b = bytearray(data)
        kind = k % 4
        if kind == 0:
            for _ in range(rng.randint(1, 8)):
                i = rng.randrange(len(b))
                b[i] ^= 1 << rng.randrange(8)
        elif kind == 1:
            i, m = rng.randrange(len(b)), rng.randint(1, 64)
            b[i : i + m] = bytes(len(b[i : i + m]))
        elif kind == 2:
            b = b[: rng.randrange(len(b))]
        else:
            m = rng.randint(2, 40)
            i, j = sorted(rng.sample(range(len(b) - m), 2))
            if j - i >= m:
                b[i : i + m], b[j : j + m] = b[j : j + m], b[i : i + m]
        yield kind, bytes(b)


def _fuzz(ctx, n, seed, run_loaded):
    data = open(SQUEEZENET, "rb").read()
    outcomes = {}
    for kind, blob in _mutants(data, n, seed):
        try:
            sess = InferenceSession(blob, ctx)
        except ALLOWED as e:
            outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
            assert str(e).startswith("[onnx]")
            continue
        except Exception as e:  # noqa: BLE001 -- the point: nothing else may escape
            pytest.fail(f"mutant (kind {kind}) escaped as {type(e).__name__}: {e}")
        outcomes["loaded"] = outcomes.get("loaded", 0) + 1
        if run_loaded:
            feeds = {}
            for a in sess.get_inputs():
                if a.shape is None or not all(isinstance(d, int) for d in a.shape) or a.type != "tensor(float)":
                    break
                feeds[a.name] = np.zeros(a.shape, np.float32)
            else:
                try:
                    sess.run(None, feeds)
                except ALLOWED:
                    pass
                except TypeError:
                    pass  # a feed the mutated model declares differently: the caller's error
        sess.close()
    return outcomes


def test_fuzz_quick(ctx):
    out = _fuzz(ctx, 40, seed=0, run_loaded=False)
    assert out.get("DataError", 0) > 10


@pytest.mark.slow
def test_fuzz_600_mutants(ctx):
    out = _fuzz(ctx, 600, seed=1, run_loaded=True)
    assert sum(out.values()) == 600


@pytest.mark.slow
def test_fuzz_silero_vad_with_subgraphs(ctx):
    """A real exported model with If subgraphs and LSTM, 200 mutants, each loaded one run with
    16 kHz feeds (its sizes are symbolic, so the import happens at that run)."""
    from mltensor import models

    try:
        data = open(models.fetch_onnx("silero_vad_16k_op15", progress=False), "rb").read()
    except models.FetchError as e:  # pragma: no cover
        pytest.skip(f"model unavailable: {e}")
    feeds = {
        "input": np.zeros((1, 512), np.float32),
        "state": np.zeros((2, 1, 128), np.float32),
        "sr": np.array(16000, np.int64),
    }
    counts = {}
    for kind, blob in _mutants(data, 200, seed=2):
        try:
            sess = InferenceSession(blob, ctx)
            sess.run(None, feeds)
            sess.close()
            outcome = "ran"
        except ALLOWED as e:
            outcome = type(e).__name__
        except TypeError:
            outcome = "feed mismatch"  # the mutated model declares other inputs: the caller's error
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"mutant (kind {kind}) escaped as {type(e).__name__}: {e}")
        counts[outcome] = counts.get(outcome, 0) + 1
    assert sum(counts.values()) == 200
