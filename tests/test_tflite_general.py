"""TFLite's general builtin operators (mltensor/tflite/general_ops.py): single-operator models
written with ModelWriter, imported and run on the GPU, against LiteRT on the same inputs."""

import numpy as np
import pytest
import tflite

from tflite_reference import litert_outputs as litert_run

from mltensor.errors import NotSupportedError
from mltensor.tflite import import_model, supported_operators
from mltensor.tflite.writer import ModelWriter

pytest.importorskip("ai_edge_litert")

I32, I64 = tflite.TensorType.INT32, tflite.TensorType.INT64


def _r(rng, *shape, scale=1.0, positive=False):
    v = rng.standard_normal(shape) * scale
    return (np.abs(v) + 0.1 if positive else v).astype(np.float32)


def _one(op, in_shapes, out_shapes, consts=(), opts=None, out_dtype=np.float32, **kw):
    """A model of one operator: graph inputs (float32) first, then constants, in the operator's
    input order given by `order` (default: inputs then constants)."""

    def make(rng):
        w = ModelWriter()
        xs = [w.input(f"x{k}", list(s)) for k, s in enumerate(in_shapes)]
        cs = [w.const(f"c{k}", np.asarray(c)) for k, c in enumerate(consts)]
        dts = out_dtype if isinstance(out_dtype, (list, tuple)) else [out_dtype] * len(out_shapes)
        ys = [w.tensor(f"y{k}", list(s), dt) for k, (s, dt) in enumerate(zip(out_shapes, dts))]
        ins = kw.get("order", lambda xs, cs: xs + cs)(xs, cs)
        otype, o = opts if opts else (None, {})
        w.op(op, ins, ys, otype, version=kw.get("version", 1), **o)
        feeds = [_r(rng, *s, **kw.get("feed", {})) for s in in_shapes]
        return w.finish(xs, ys), feeds

    return make


def _chain(rng):
    """GREATER -> LOGICAL_AND with LESS -> SELECT_V2: BOOL tensors inside the graph."""
    w = ModelWriter()
    a, c = w.input("a", [2, 3, 4]), w.input("b", [2, 3, 4])
    zero = w.const("zero", np.zeros((), np.float32))
    g, l, m, y = (w.tensor(n, [2, 3, 4], dt) for n, dt in [("g", np.bool_), ("l", np.bool_), ("m", np.bool_),
                                                          ("y", np.float32)])  # fmt: skip
    w.op("GREATER", [a, zero], [g])
    w.op("LESS", [c, zero], [l])
    w.op("LOGICAL_AND", [g, l], [m])
    w.op("SELECT_V2", [m, a, c], [y])
    return w.finish([a, c], [y]), [_r(rng, 2, 3, 4), _r(rng, 2, 3, 4)]


def _folded(rng):
    """SHAPE -> FILL and RANGE fold at load; the graph is x * fill + range."""
    w = ModelWriter()
    x = w.input("x", [2, 5])
    s, f = w.tensor("s", [2], np.int32), w.tensor("f", [2, 5])
    r, y, z = w.tensor("r", [5]), w.tensor("y", [2, 5]), w.tensor("z", [2, 5])
    w.op("SHAPE", [x], [s], "ShapeOptions", OutType=I32)
    w.op("FILL", [s, w.const("v", np.array(2.5, np.float32))], [f])
    start, limit, delta = (w.const(n, np.array(v, np.float32)) for n, v in [("st", 1), ("li", 3.5), ("de", 0.5)])
    w.op("RANGE", [start, limit, delta], [r])
    w.op("MUL", [x, f], [y])
    w.op("ADD", [y, r], [z])
    return w.finish([x], [z]), [_r(rng, 2, 5)]


def _lstm(clip, steps=5, time_major=False):
    """UNIDIRECTIONAL_SEQUENCE_LSTM as the converter writes it (gate weights i, f, c, o apart,
    state tensors variable); `clip`: the cell clip (0.4 acts, 10 does not in 5 steps)."""

    def make(rng):
        w = ModelWriter()
        n_in, hid, batch = 3, 4, 2
        shape = [steps, batch, n_in] if time_major else [batch, steps, n_in]
        x = w.input("x", shape)
        ins = [x]
        ins += [w.const(f"w{k}", _r(rng, hid, n_in, scale=0.8)) for k in range(4)]
        ins += [w.const(f"r{k}", _r(rng, hid, hid, scale=0.8)) for k in range(4)]
        ins += [-1, -1, -1]
        ins += [w.const(f"b{k}", _r(rng, hid)) for k in range(4)]
        ins += [-1, -1]
        ins += [w.tensor("h0", [batch, hid], variable=True), w.tensor("c0", [batch, hid], variable=True)]
        ins += [-1, -1, -1, -1]
        y = w.tensor("y", [steps, batch, hid] if time_major else [batch, steps, hid])
        w.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [y], "UnidirectionalSequenceLSTMOptions",
             FusedActivationFunction=4, CellClip=clip, TimeMajor=time_major)  # fmt: skip
        return w.finish([x], [y]), [_r(rng, *shape, scale=2.0)]

    return make


B = np.bool_
CASES = {
    "lstm": _lstm(0.0),
    "lstm_clip_inactive": _lstm(10.0),
    "lstm_clip_active": _lstm(0.4),
    "lstm_time_major_clipped": _lstm(0.4, steps=3, time_major=True),
    "expand_dims": _one("EXPAND_DIMS", [(2, 3, 4)], [(2, 1, 3, 4)], [np.array([1], np.int32)]),
    "squeeze": _one("SQUEEZE", [(2, 1, 3, 1)], [(2, 3)]),
    "transpose": _one("TRANSPOSE", [(2, 3, 4)], [(4, 2, 3)], [np.array([2, 0, 1], np.int32)]),
    "batch_matmul": _one(
        "BATCH_MATMUL", [(2, 3, 4), (2, 5, 4)], [(2, 3, 5)], opts=("BatchMatMulOptions", {"AdjY": True})
    ),  # fmt: skip
    "batch_matmul_adjx_const": _one(
        "BATCH_MATMUL",
        [(2, 4, 3)],
        [(2, 3, 5)],
        [np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)],
        opts=("BatchMatMulOptions", {"AdjX": True}),
    ),  # fmt: skip
    "rsqrt": _one("RSQRT", [(3, 7)], [(3, 7)], feed={"positive": True}),
    "sqrt": _one("SQRT", [(3, 7)], [(3, 7)], feed={"positive": True}),
    "log": _one("LOG", [(3, 7)], [(3, 7)], feed={"positive": True}),
    "exp": _one("EXP", [(3, 7)], [(3, 7)]),
    "abs": _one("ABS", [(3, 7)], [(3, 7)]),
    "neg": _one("NEG", [(3, 7)], [(3, 7)]),
    "square": _one("SQUARE", [(3, 7)], [(3, 7)]),
    "floor": _one("FLOOR", [(3, 7)], [(3, 7)], feed={"scale": 3.0}),
    "ceil": _one("CEIL", [(3, 7)], [(3, 7)], feed={"scale": 3.0}),
    "sin": _one("SIN", [(3, 7)], [(3, 7)]),
    "cos": _one("COS", [(3, 7)], [(3, 7)]),
    "elu": _one("ELU", [(3, 7)], [(3, 7)]),
    "log_softmax": _one("LOG_SOFTMAX", [(3, 7)], [(3, 7)], opts=("LogSoftmaxOptions", {})),
    "gelu": _one("GELU", [(3, 7)], [(3, 7)], feed={"scale": 2.0}),
    "gelu_tanh": _one("GELU", [(3, 7)], [(3, 7)], opts=("GeluOptions", {"Approximate": True}), feed={"scale": 2.0}),
    "leaky_relu": _one("LEAKY_RELU", [(3, 7)], [(3, 7)], opts=("LeakyReluOptions", {"Alpha": 0.25})),
    "l2_normalization": _one("L2_NORMALIZATION", [(2, 3, 8)], [(2, 3, 8)]),
    "pow": _one("POW", [(3, 7), (3, 7)], [(3, 7)], feed={"positive": True}),
    "squared_difference": _one("SQUARED_DIFFERENCE", [(3, 7), (1, 7)], [(3, 7)]),
    "floor_div": _one("FLOOR_DIV", [(3, 7)], [(3, 7)], [np.array([0.7], np.float32)], feed={"scale": 3.0}),
    "floor_mod": _one("FLOOR_MOD", [(3, 7)], [(3, 7)], [np.array([0.7], np.float32)], feed={"scale": 3.0}),
    "greater_equal": _one("GREATER_EQUAL", [(3, 7), (3, 7)], [(3, 7)], out_dtype=B),
    "not_equal": _one("NOT_EQUAL", [(3, 7)], [(3, 7)], [np.float32(0)], out_dtype=B),
    "less_equal": _one("LESS_EQUAL", [(3, 7), (1, 7)], [(3, 7)], out_dtype=B),
    "select_chain": _chain,
    "reduce_max": _one("REDUCE_MAX", [(2, 3, 4)], [(2, 4)], [np.array([1], np.int32)]),
    "reduce_min_keep": _one(
        "REDUCE_MIN",
        [(2, 3, 4)],
        [(1, 3, 1)],
        [np.array([0, -1], np.int32)],
        opts=("ReducerOptions", {"KeepDims": True}),
    ),  # fmt: skip
    "reduce_prod": _one("REDUCE_PROD", [(2, 3, 4)], [(2, 3)], [np.array([2], np.int32)]),
    "sum": _one("SUM", [(2, 3, 4)], [(4,)], [np.array([0, 1], np.int32)]),
    "arg_max": _one(
        "ARG_MAX",
        [(2, 3, 4)],
        [(2, 4)],
        [np.array([1], np.int32)],
        opts=("ArgMaxOptions", {"OutputType": I32}),
        out_dtype=np.int32,
    ),  # fmt: skip
    "arg_min_int64": _one(
        "ARG_MIN",
        [(2, 3, 4)],
        [(2, 3)],
        [np.array([-1], np.int32)],
        opts=("ArgMinOptions", {"OutputType": I64}),
        out_dtype=np.int64,
    ),  # fmt: skip
    "gather": _one("GATHER", [(5, 4)], [(3, 4)], [np.array([4, 0, 2], np.int32)]),
    "gather_axis1": _one(
        "GATHER",
        [(2, 5, 3)],
        [(2, 2, 2, 3)],
        [np.array([[1, 4], [0, 0]], np.int32)],
        opts=("GatherOptions", {"Axis": 1}),
    ),  # fmt: skip
    "gather_nd": _one("GATHER_ND", [(4, 5, 3)], [(2, 3)], [np.array([[1, 2], [3, 0]], np.int32)]),
    "slice": _one("SLICE", [(4, 5, 6)], [(2, 5, 3)], [np.array([1, 0, 2], np.int32), np.array([2, -1, 3], np.int32)]),
    "split": _one(
        "SPLIT",
        [(4, 6)],
        [(4, 3), (4, 3)],
        [np.array(1, np.int32)],
        opts=("SplitOptions", {"NumSplits": 2}),
        order=lambda xs, cs: cs + xs,
    ),  # fmt: skip
    "split_v": _one(
        "SPLIT_V",
        [(4, 6)],
        [(1, 6), (3, 6)],
        [np.array([1, -1], np.int32), np.array(0, np.int32)],
        opts=("SplitVOptions", {"NumSplits": 2}),
    ),  # fmt: skip
    "pack": _one("PACK", [(3, 4), (3, 4)], [(3, 2, 4)], opts=("PackOptions", {"ValuesCount": 2, "Axis": 1})),
    "unpack": _one("UNPACK", [(3, 2, 4)], [(3, 4), (3, 4)], opts=("UnpackOptions", {"Num": 2, "Axis": -2})),
    "tile": _one("TILE", [(2, 3)], [(4, 9)], [np.array([2, 3], np.int32)]),
    "broadcast_to": _one("BROADCAST_TO", [(3, 1)], [(2, 3, 4)], [np.array([2, 3, 4], np.int32)], version=2),
    "cast_to_int32": _one("CAST", [(3, 7)], [(3, 7)], out_dtype=np.int32, feed={"scale": 4.0}),
    "cumsum": _one(
        "CUMSUM",
        [(3, 7)],
        [(3, 7)],
        [np.array(1, np.int32)],
        opts=("CumsumOptions", {"Exclusive": True, "Reverse": True}),
    ),  # fmt: skip
    "reverse_v2": _one("REVERSE_V2", [(3, 7)], [(3, 7)], [np.array([1], np.int32)]),
    "mirror_pad": _one(
        "MIRROR_PAD",
        [(1, 4, 5, 2)],
        [(1, 6, 8, 2)],
        [np.array([[0, 0], [1, 1], [2, 1], [0, 0]], np.int32)],
        opts=("MirrorPadOptions", {"Mode": 0}),
    ),  # fmt: skip
    "shape_fill_range_folded": _folded,
    "space_to_depth": _one(
        "SPACE_TO_DEPTH", [(1, 4, 6, 3)], [(1, 2, 3, 12)], opts=("SpaceToDepthOptions", {"BlockSize": 2})
    ),
    "space_to_batch_nd": _one(
        "SPACE_TO_BATCH_ND",
        [(1, 5, 6, 3)],
        [(4, 3, 4, 3)],
        [np.array([2, 2], np.int32), np.array([[1, 0], [1, 1]], np.int32)],
    ),  # fmt: skip
    "batch_to_space_nd": _one(
        "BATCH_TO_SPACE_ND",
        [(4, 3, 4, 3)],
        [(1, 5, 6, 3)],
        [np.array([2, 2], np.int32), np.array([[1, 0], [1, 1]], np.int32)],
    ),  # fmt: skip
    "add_n": _one("ADD_N", [(3, 7), (3, 7), (3, 7)], [(3, 7)]),
    "relu_0_to_1": _one("RELU_0_TO_1", [(3, 7)], [(3, 7)]),
    "embedding_lookup": _one(
        "EMBEDDING_LOOKUP",
        [],
        [(4, 4)],
        [np.array([4, 0, 2, 1], np.int32), np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4)],
    ),  # fmt: skip
}


def _run(ctx, data, feeds):
    graph, inputs, outputs = import_model(data, ctx)
    ins = {}
    for (name, dt, shape), v in zip(inputs, feeds):
        t = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
        ctx.write_tensor(t, np.ascontiguousarray(v))
        ins[name] = t
    outs = {name: ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True) for name, dt, shape in outputs}
    ctx.dispatch(graph, ins, outs)
    res = [ctx.read_tensor_sync(outs[name]) for name, _, _ in outputs]
    for t in list(ins.values()) + list(outs.values()):
        t.destroy()
    graph.destroy()
    return res


@pytest.mark.parametrize("name", list(CASES))
def test_general_operator_matches_litert(ctx, name):
    data, feeds = CASES[name](np.random.default_rng(3))
    ref = litert_run(data, feeds)
    got = _run(ctx, data, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        if r.dtype == np.bool_:
            assert g.dtype == np.uint8  # TFLite BOOL is WebNN uint8
            np.testing.assert_array_equal(g, r.astype(np.uint8))
        elif r.dtype.kind in "iu":
            assert g.dtype == r.dtype
            np.testing.assert_array_equal(g, r)
        else:
            assert g.dtype == np.float32
            np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


def test_every_case_operator_is_supported():
    ops = set(supported_operators())
    for name in ["RSQRT", "BATCH_MATMUL", "SELECT_V2", "UNIDIRECTIONAL_SEQUENCE_LSTM", "GATHER_ND", "SPLIT_V"]:
        assert name in ops


def test_unsupported_lists_general_operators(ctx):
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4])
    w.op("HASHTABLE_LOOKUP", [x], [y])
    with pytest.raises(NotSupportedError) as e:
        import_model(w.finish([x], [y]), ctx)
    msg = str(e.value)
    assert "operator 0 (HASHTABLE_LOOKUP)" in msg and "BATCH_MATMUL" in msg and "EXPAND_DIMS" in msg
