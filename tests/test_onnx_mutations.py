"""Structural mutations of real models: every DataError is on a model onnxruntime rejects too
(and onnx.checker, or onnxruntime), and nothing escapes but mltensor's errors (issue 42, point 1).

The byte-level fuzz of tests/test_onnx_errors.py mostly breaks the protobuf; these mutants stay
well-formed protobuf and break the graph instead, as a buggy exporter or a hand edit would: a
node input dropped or renamed, an attribute of another type or value, an initializer reshaped or
retyped, nodes removed or reordered, a graph input redeclared. Each one is loaded and run on
mltensor; a DataError must be confirmed by onnxruntime (creating the session or running the
same feeds) rejecting the same model (`onnx.checker.check_model(full_check=True)` rejecting it
alone is reported apart: a model onnxruntime runs is not the user's fault for us either), an
internal exception must come out as mltensor.InternalError (a bug named as such, counted and
printed), and nothing else may escape. Seeded; a quick run by default, more mutants with -m slow.
"""

import random
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mltensor
from mltensor import InferenceSession, models_synthetic

ort = pytest.importorskip("onnxruntime")

ALLOWED = (mltensor.DataError, mltensor.NotSupportedError, mltensor.OperationError, mltensor.InvalidStateError)


def _select_model():
    """Data-dependent shapes (NonZero, a computed TopK, an If whose branches differ in shape):
    the paths that cut a model into stages."""
    n = helper.make_node
    nodes = [
        n("Greater", ["x", "zero"], ["pos"], name="gt"),
        n("NonZero", ["pos"], ["nz"], name="nz"),
        n("Squeeze", ["nz", "ax0"], ["idx"], name="sq"),
        n("Gather", ["x", "idx"], ["sel"], name="g"),
        n("ReduceSum", ["sel"], ["total"], keepdims=0, name="rs"),
        n("TopK", ["x", "k"], ["tv", "ti"], axis=0, name="topk"),
        n("Mul", ["tv", "total"], ["y"], name="mul"),
        n("Greater", ["total", "zero"], ["c"], name="c"),
        n(
            "If",
            ["c"],
            ["z"],
            name="if",
            then_branch=helper.make_graph(
                [n("Relu", ["sel"], ["t"], name="relu")], "then", [], [helper.make_tensor_value_info("t", 1, None)]
            ),
            else_branch=helper.make_graph(
                [n("Neg", ["x"], ["e"], name="neg")], "else", [], [helper.make_tensor_value_info("e", 1, None)]
            ),
        ),
    ]
    inits = [
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "ax0"),
        numpy_helper.from_array(np.array([3], np.int64), "k"),
    ]
    g = helper.make_graph(
        nodes,
        "select",
        [helper.make_tensor_value_info("x", 1, [8])],
        [helper.make_tensor_value_info("y", 1, [3]), helper.make_tensor_value_info("z", 1, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _real_sources():
    """The silero-vad model (If subgraphs, LSTM) and PP-OCR's direction classifier, shipped in
    wheels (mltensor.models fetches them once); {} when they cannot be fetched."""
    from mltensor import models

    try:
        vad = onnx.load(models.fetch_onnx("silero_vad_16k_op15", progress=False))
        cls = onnx.load(models.fetch_onnx("ppocr_mobile_v2_cls", progress=False))
    except models.FetchError:  # pragma: no cover
        return {}
    rng = np.random.default_rng(1)
    return {
        "silero_vad": (
            vad,
            {
                "input": rng.standard_normal((1, 512)).astype(np.float32) * 0.1,
                "state": np.zeros((2, 1, 128), np.float32),
                "sr": np.array(16000, np.int64),
            },
        ),
        "ppocr_cls": (cls, {"x": rng.random((1, 3, 48, 192), dtype=np.float32)}),
    }


def _sources():
    rng = np.random.default_rng(0)
    gpt2 = onnx.load_from_string(models_synthetic.tiny_gpt2(layers=1, heads=2, head_size=8, vocab=64, n_positions=32))
    vit = onnx.load_from_string(
        models_synthetic.vit(layers=1, hidden=32, heads=2, mlp=64, image=32, patch=16, classes=10, batch=1)
    )
    return {
        "tiny_gpt2": (
            gpt2,
            {
                "input_ids": rng.integers(0, 64, (1, 5)).astype(np.int64),
                "past_key_values.0.key": np.zeros((1, 2, 0, 8), np.float32),
                "past_key_values.0.value": np.zeros((1, 2, 0, 8), np.float32),
            },
        ),
        "vit": (vit, {"pixel_values": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)}),
        "select": (_select_model(), {"x": rng.standard_normal(8).astype(np.float32)}),
    }


# -- mutations: each takes (model copy, rng) and returns a description, or None if it does not apply


def _pick_node(m, rng, pred=lambda n: True):
    nodes = [n for n in m.graph.node if pred(n)]
    return rng.choice(nodes) if nodes else None


def _drop_input(m, rng):
    node = _pick_node(m, rng, lambda n: len(n.input) > 0)
    if node is None:
        return None
    i = rng.randrange(len(node.input))
    if i == len(node.input) - 1 and rng.random() < 0.5:
        del node.input[i]
        return f"{node.name}: last input removed"
    node.input[i] = ""
    return f"{node.name}: input {i} left empty"


def _rename_edge(m, rng):
    node = _pick_node(m, rng, lambda n: len(n.input) > 0)
    if node is None:
        return None
    i = rng.randrange(len(node.input))
    names = [o for n in m.graph.node for o in n.output] + [t.name for t in m.graph.initializer]
    new = rng.choice(names) if rng.random() < 0.6 else node.input[i] + "_renamed"
    node.input[i] = new
    return f"{node.name}: input {i} -> {new!r}"


def _attribute_type(m, rng):
    node = _pick_node(m, rng, lambda n: any(a.type != onnx.AttributeProto.GRAPH for a in n.attribute))
    if node is None:
        return None
    a = rng.choice([a for a in node.attribute if a.type != onnx.AttributeProto.GRAPH])
    vals = {
        "int": lambda: helper.make_attribute(a.name, rng.choice([-2, 0, 1, 3, 7])),
        "float": lambda: helper.make_attribute(a.name, rng.choice([-1.5, 0.0, 2.5])),
        "ints": lambda: helper.make_attribute(
            a.name, [rng.randint(-3, 4) for _ in range(rng.randint(0, 4))], attr_type=onnx.AttributeProto.INTS
        ),
        "string": lambda: helper.make_attribute(a.name, "bogus"),
        "tensor": lambda: helper.make_attribute(a.name, numpy_helper.from_array(np.array([2, 1], np.int64))),
    }
    kind = rng.choice(sorted(vals))
    new = vals[kind]()
    a.CopyFrom(new)
    return f"{node.name}: attribute {a.name!r} -> {kind} {helper.get_attribute_value(a)!r}"


def _attribute_value(m, rng):
    """Same type, another value (an axis, a permutation, a flag): often a model onnxruntime runs."""
    kinds = (onnx.AttributeProto.INT, onnx.AttributeProto.INTS, onnx.AttributeProto.FLOAT)
    node = _pick_node(m, rng, lambda n: any(a.type in kinds for a in n.attribute))
    if node is None:
        return None
    a = rng.choice([a for a in node.attribute if a.type in kinds])
    if a.type == onnx.AttributeProto.INT:
        a.i = rng.choice([-2, -1, 0, 1, 2, 3])
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = rng.choice([0.0, a.f * 2, -a.f])
    elif len(a.ints) > 1 and rng.random() < 0.5:
        v = list(a.ints)
        rng.shuffle(v)
        a.ints[:] = v
    elif len(a.ints):
        a.ints[rng.randrange(len(a.ints))] = rng.choice([-1, 0, 1, 2, 3])
    else:
        return None
    return f"{node.name}: attribute {a.name!r} -> {helper.get_attribute_value(a)!r}"


def _small_value(m, rng):
    """An entry of a small integer initializer or Constant (a shape, axes, starts, a k) changed."""
    cands = [t for t in m.graph.initializer if t.data_type in (TensorProto.INT64, TensorProto.INT32)]
    cands += [
        a.t
        for n in m.graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value" and a.t.data_type in (TensorProto.INT64, TensorProto.INT32)
    ]
    cands = [t for t in cands if 0 < int(np.prod(t.dims)) <= 8]
    if not cands:
        return None
    t = rng.choice(cands)
    v = numpy_helper.to_array(t).copy()
    v.reshape(-1)[rng.randrange(v.size)] = rng.choice([-2, -1, 0, 1, 2, 3, 5])
    t.CopyFrom(numpy_helper.from_array(v, t.name))
    return f"value {t.name!r} -> {v.tolist()}"


def _swap_inputs(m, rng):
    node = _pick_node(m, rng, lambda n: len([x for x in n.input if x]) > 1)
    if node is None:
        return None
    i, j = rng.sample(range(len(node.input)), 2)
    node.input[i], node.input[j] = node.input[j], node.input[i]
    return f"{node.name}: inputs {i} and {j} swapped"


def _initializer_shape(m, rng):
    if not m.graph.initializer:
        return None
    t = rng.choice(list(m.graph.initializer))
    dims = list(t.dims)
    how = rng.randrange(4)
    if how == 0 and len(dims) >= 2:
        dims = dims[::-1]  # same size, another shape
    elif how == 1:
        dims = dims + [1]
    elif how == 2 and dims:
        dims[rng.randrange(len(dims))] += 1  # the data no longer fits
    else:
        dims = dims[1:]
    del t.dims[:]
    t.dims.extend(dims)
    return f"initializer {t.name!r}: dims -> {dims}"


def _initializer_dtype(m, rng):
    if not m.graph.initializer:
        return None
    t = rng.choice(list(m.graph.initializer))
    new = rng.choice([TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT16, TensorProto.BOOL])
    t.data_type = new
    return f"initializer {t.name!r}: data_type -> {TensorProto.DataType.Name(new)}"


def _remove_node(m, rng):
    if len(m.graph.node) < 2:
        return None
    i = rng.randrange(len(m.graph.node))
    name = m.graph.node[i].name
    del m.graph.node[i]
    return f"node {name!r} removed"


def _truncate(m, rng):
    k = rng.randint(1, max(1, len(m.graph.node) // 2))
    del m.graph.node[len(m.graph.node) - k :]
    return f"last {k} nodes removed"


def _swap_nodes(m, rng):
    if len(m.graph.node) < 2:
        return None
    i, j = sorted(rng.sample(range(len(m.graph.node)), 2))
    a, b = onnx.NodeProto(), onnx.NodeProto()
    a.CopyFrom(m.graph.node[i])
    b.CopyFrom(m.graph.node[j])
    m.graph.node[i].CopyFrom(b)
    m.graph.node[j].CopyFrom(a)
    return f"nodes {a.name!r} and {b.name!r} swapped"


def _op_type(m, rng):
    node = _pick_node(m, rng)
    old = node.op_type
    node.op_type = rng.choice(["Add", "Relu", "Reshape", "Transpose", "Concat", "Gather", "MatMul", "Squeeze", "Where"])
    return f"{node.name}: op_type {old} -> {node.op_type}"


def _graph_input(m, rng):
    vi = rng.choice(list(m.graph.input))
    tt = vi.type.tensor_type
    if rng.random() < 0.5:
        tt.elem_type = rng.choice([TensorProto.INT64, TensorProto.FLOAT, TensorProto.INT32])
        return f"input {vi.name!r}: elem_type -> {TensorProto.DataType.Name(tt.elem_type)}"
    if len(tt.shape.dim):
        d = tt.shape.dim[rng.randrange(len(tt.shape.dim))]
        d.dim_value = rng.choice([1, 2, 7])
        return f"input {vi.name!r}: a dimension -> {d.dim_value}"
    return None


MUTATIONS = [
    _attribute_value,
    _small_value,
    _swap_inputs,
    _drop_input,
    _rename_edge,
    _attribute_type,
    _initializer_shape,
    _initializer_dtype,
    _remove_node,
    _truncate,
    _swap_nodes,
    _op_type,
    _graph_input,
]


def _mutants(sources, n, seed):
    rng = random.Random(seed)
    names = sorted(sources)
    made = 0
    while made < n:
        name = names[made % len(names)]
        m = onnx.ModelProto()
        m.CopyFrom(sources[name][0])
        what = rng.choice(MUTATIONS)(m, rng)
        if what is None:
            continue
        made += 1
        yield name, what, m


# -- the oracles --------------------------------------------------------------------------------


def _checker_rejects(m):
    try:
        onnx.checker.check_model(m, full_check=True)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return None


def _ort_rejects(blob, feeds):
    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # (its rejections are expected here: not logged)
        s = ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])
        want = {i.name for i in s.get_inputs()}
        s.run(None, {k: v for k, v in feeds.items() if k in want})
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return None


def _run_mltensor(ctx, blob, feeds):
    """The outcome's name: 'ran', an error class's name, or 'feed mismatch' (mltensor's TypeError
    about the feeds of a model that declares other inputs: the caller's error)."""
    sess = None
    try:
        sess = InferenceSession(blob, ctx, cache=False)
        want = {i.name for i in sess.get_inputs()}
        sess.run(None, {k: v for k, v in feeds.items() if k in want})
        return "ran", None
    except ALLOWED as e:
        return type(e).__name__, e
    except TypeError as e:
        if str(e).startswith("["):
            return "feed mismatch", e
        raise
    finally:
        if sess is not None:
            sess.close()


def _mutation_run(ctx, n, seed, real=False):
    sources = _sources()
    if real:
        sources.update(_real_sources())
    counts, unconfirmed, internal, lenient = {}, [], [], []
    t0 = time.perf_counter()
    for name, what, m in _mutants(sources, n, seed):
        blob = m.SerializeToString()
        feeds = sources[name][1]
        try:
            outcome, err = _run_mltensor(ctx, blob, feeds)
        except Exception as e:  # noqa: BLE001 -- the point: nothing else may escape
            pytest.fail(f"{name} mutant ({what}) escaped as {type(e).__name__}: {e}")
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == "DataError":
            by_checker, by_ort = _checker_rejects(m), _ort_rejects(blob, feeds)
            if by_checker is None and by_ort is None:
                unconfirmed.append(f"{name} mutant ({what}): {err}")
            elif by_ort is None:  # the checker's word alone: onnxruntime runs it, so should we
                lenient.append(f"{name} mutant ({what}): {err} [onnx.checker: {by_checker}]")
        elif outcome == "InternalError":
            ort_says = _ort_rejects(blob, feeds)
            internal.append(f"{name} mutant ({what}): {err} [onnxruntime: {ort_says or 'runs it'}]")
            assert err.__cause__ is not None, "an InternalError keeps the original exception"
    took = time.perf_counter() - t0
    print(f"\n{n} mutants in {took:.1f} s: {counts}")
    for line in internal:
        print("  internal error:", line)
    assert not unconfirmed, "DataError on models neither onnx.checker nor onnxruntime rejects:\n" + "\n".join(
        unconfirmed
    )
    assert not lenient, "DataError on models onnxruntime runs:\n" + "\n".join(lenient)
    return counts, internal


def test_mutations_quick(ctx):
    counts, _ = _mutation_run(ctx, 400, seed=0)
    assert sum(counts.values()) == 400
    assert counts.get("DataError", 0) >= 80  # the mutations do reach the model checks
    assert counts.get("ran", 0) >= 5  # and some run


@pytest.mark.slow
def test_mutations_1500(ctx):
    """With the real models from wheels among the sources too."""
    counts, _ = _mutation_run(ctx, 1500, seed=1, real=True)
    assert sum(counts.values()) == 1500
