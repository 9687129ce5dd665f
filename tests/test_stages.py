"""Data-dependent shapes and executed loops (mltensor/stages/), against onnxruntime.

Shapes computed from the input's values (Reshape, Expand, Slice, Range, ConstantOfShape, Tile,
Resize sizes), If branches of different shapes, Loop with a condition computed on the GPU and
Scan longer than the unroll limit: each model is run at several values in one session, and the
session's stats say what crossed to the host."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import mltensor
from mltensor import InferenceSession

from helpers import in_threads

ort = pytest.importorskip("onnxruntime")


def _cuts(sess):
    """Every stage cut of a session's specializations (mltensor/stages/plan.Stage trees)."""
    out, todo = [], [spec.stage for spec in sess._specs.values() if spec.stage is not None]
    while todo:
        st = todo.pop()
        if st.cut is not None:
            out.append(st.cut)
        todo.extend(st.children.values())
    return out


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def _check(sess, ref, feeds, rtol=1e-6):
    got = sess.run(None, feeds)
    want = ref.run(None, feeds)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)
    return got


def _pair(m):
    b = m.SerializeToString()
    return InferenceSession(b, cache=False), ort.InferenceSession(b, providers=["CPUExecutionProvider"])


def _vi(name, et, shape):
    return h.make_tensor_value_info(name, et, shape)


def _ints_from(src, n, name):
    """Nodes: the first n entries of float input `src`, as int64 `name` (a size computed from the
    input's values: only a run knows it)."""
    return [
        h.make_node("Slice", [src, "zero1", f"n{n}"], [f"{name}/f"]),
        h.make_node("Cast", [f"{name}/f"], [name], to=T.INT64),
    ]


_INITS = [h.make_tensor("zero1", T.INT64, [1], [0])] + [h.make_tensor(f"n{k}", T.INT64, [1], [k]) for k in range(1, 5)]


@pytest.mark.parametrize("op", ["Reshape", "Expand", "Tile", "ConstantOfShape", "Range", "Slice"])
def test_sizes_computed_from_values(op, rng):
    """The size input is computed from the values of the float input `s`: read back (a few
    bytes), and the graph after it built once per distinct value."""
    nodes = [h.make_node("Mul", ["x", "x"], ["x2"])]
    if op == "Reshape":
        nodes += _ints_from("s", 2, "shape") + [h.make_node("Reshape", ["x2", "shape"], ["r"])]
        cases = [(3, 4), (6, 2), (3, 4), (12, 1)]
    elif op == "Expand":
        nodes += _ints_from("s", 3, "shape") + [h.make_node("Expand", ["x2", "shape"], ["r"])]
        cases = [(2, 1, 12), (1, 3, 1), (2, 1, 12)]
    elif op == "Tile":
        nodes += _ints_from("s", 1, "reps") + [h.make_node("Tile", ["x2", "reps"], ["r"])]
        cases = [(1,), (3,), (2,)]
    elif op == "ConstantOfShape":
        nodes += _ints_from("s", 2, "shape") + [
            h.make_node("ConstantOfShape", ["shape"], ["c"], value=h.make_tensor("v", T.FLOAT, [1], [1.5])),
            h.make_node("ReduceSum", ["x2"], ["sx"], keepdims=0),
            h.make_node("Add", ["c", "sx"], ["r"]),
        ]
        cases = [(2, 3), (1, 7), (2, 3)]
    elif op == "Range":
        nodes += [
            h.make_node("ReduceMax", ["s"], ["lim"], keepdims=0),
            h.make_node("Range", ["zf", "lim", "half"], ["r0"]),
            h.make_node("ReduceSum", ["x2"], ["sx"], keepdims=0),
            h.make_node("Add", ["r0", "sx"], ["r"]),
        ]
        cases = [(3.0,), (5.5,), (3.0,)]
    else:  # Slice with computed starts and ends
        nodes += _ints_from("s", 2, "se") + [
            h.make_node("Slice", ["se", "zero1", "n1"], ["st"]),
            h.make_node("Slice", ["se", "n1", "n2"], ["en"]),
            h.make_node("Slice", ["x2", "st", "en"], ["r"]),
        ]
        cases = [(2, 9), (0, 12), (5, 6), (2, 9)]
    nodes.append(h.make_node("Relu", ["r"], ["y"]))
    inits = _INITS + [h.make_tensor("zf", T.FLOAT, [], [0.0]), h.make_tensor("half", T.FLOAT, [], [0.5])]
    m = _model(nodes, [_vi("x", T.FLOAT, [12]), _vi("s", T.FLOAT, [64])], [_vi("y", T.FLOAT, None)], inits)
    sess, ref = _pair(m)
    for case in cases:
        s = rng.standard_normal(64).astype(np.float32)
        s[: len(case)] = case
        _check(sess, ref, {"x": rng.standard_normal(12).astype(np.float32), "s": s})
    st = sess.stats
    distinct = len(set(cases))
    cuts = 2 if op == "Slice" else 1  # Slice reads its starts, then its ends
    assert st["builds"] == 1 and st["stage_builds"] == cuts * distinct
    assert st["stage_hits"] == cuts * (len(cases) - distinct)
    assert st["readbacks"] == cuts * len(cases)
    # only the bytes that decide the shape crossed: the int64 sizes (or the float limit)
    per_run = 4 if op == "Range" else 8 * max(len(c) for c in cases)
    assert st["readback_bytes"] == per_run * len(cases)


def test_resize_sizes_computed_from_values(rng):
    nodes = _ints_from("s", 4, "sizes") + [h.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")]
    m = _model(nodes, [_vi("x", T.FLOAT, [1, 2, 4, 4]), _vi("s", T.FLOAT, [64])], [_vi("y", T.FLOAT, None)], _INITS)
    sess, ref = _pair(m)
    for size in [(1, 2, 8, 8), (1, 2, 2, 6), (1, 2, 8, 8)]:
        s = np.zeros(64, np.float32)
        s[:4] = size
        _check(sess, ref, {"x": rng.standard_normal((1, 2, 4, 4)).astype(np.float32), "s": s})
    assert sess.stats["stage_builds"] == 2


def test_two_cuts_in_a_row_and_ml_tensor_outputs(rng):
    """Two data-dependent sizes one after the other (stage 0 -> 1 -> 2), the outputs returned as
    MLTensors; the run's other tensors are destroyed, the returned ones stay valid."""
    nodes = _ints_from("s", 2, "shape") + [
        h.make_node("Reshape", ["x", "shape"], ["r"]),
        h.make_node("ReduceMax", ["s"], ["m"], keepdims=0),
        h.make_node("Cast", ["m"], ["mi"], to=T.INT64),
        h.make_node("Reshape", ["mi", "n1_shape"], ["reps"]),
        h.make_node("Concat", ["reps", "n1"], ["reps2"], axis=0),
        h.make_node("Tile", ["r", "reps2"], ["y0"]),
    ]
    inits = _INITS + [h.make_tensor("n1_shape", T.INT64, [1], [1])]
    m = _model(nodes, [_vi("x", T.FLOAT, [12]), _vi("s", T.FLOAT, [64])], [_vi("y0", T.FLOAT, None)], inits)
    sess, ref = _pair(m)
    lives = []
    for shape, reps in [((3, 4), 2), ((2, 6), 3), ((3, 4), 2), ((3, 4), 2)]:
        s = np.zeros(64, np.float32)
        s[:2] = shape
        s[5] = reps
        feeds = {"x": rng.standard_normal(12).astype(np.float32), "s": s}
        (t,) = sess.run(None, feeds, output_location="ml-tensor")
        (want,) = ref.run(None, feeds)
        assert isinstance(t, mltensor.MLTensor) and tuple(t.shape) == want.shape
        np.testing.assert_allclose(sess.context.read_tensor_sync(t), want, rtol=1e-6)
        lives.append(sess.context.counters["tensors_alive"])
    assert lives[3] == lives[2]  # a run leaves nothing behind but its outputs (kept till the next)
    assert sess.stats["stage_builds"] == 4  # two outcomes, two stages after the first each


def test_if_cut_inside_a_concurrent_session(rng):
    """Threads running a staged model at once, each meeting both outcomes: results as sequential
    runs give (the stage tree is shared, each run's tensors its own)."""
    then_g = h.make_graph(
        [h.make_node("Mul", ["x", "two"], ["t"])],
        "then",
        [],
        [_vi("t", T.FLOAT, [2, 3])],
        [h.make_tensor("two", T.FLOAT, [], [2.0])],
    )
    else_g = h.make_graph(
        [h.make_node("Reshape", ["x", "shp"], ["e"])],
        "else",
        [],
        [_vi("e", T.FLOAT, [3, 2])],
        [h.make_tensor("shp", T.INT64, [2], [3, 2])],
    )
    m = _model(
        [
            h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            h.make_node("Greater", ["s", "zf"], ["c"]),
            h.make_node("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g),
            h.make_node("Softmax", ["y0"], ["y"], axis=-1),
        ],
        [_vi("x", T.FLOAT, [2, 3])],
        [_vi("y", T.FLOAT, None)],
        [h.make_tensor("zf", T.FLOAT, [], [0.0])],
    )
    sess, ref = _pair(m)
    xs = [(np.abs(rng.standard_normal((2, 3))) * (1 if i % 2 else -1)).astype(np.float32) for i in range(24)]
    want = [ref.run(None, {"x": x})[0] for x in xs]

    def work(k):
        for i in range(k, len(xs), 4):
            (y,) = sess.run(None, {"x": xs[i]})
            assert y.shape == want[i].shape
            np.testing.assert_allclose(y, want[i], rtol=1e-6)

    in_threads(work, [(k,) for k in range(4)])
    assert sess.stats["stage_builds"] == 2


def test_a_read_of_a_whole_tensor_is_refused_clearly(rng):
    """A shape input of more than MAX_READ_ELEMENTS computed values is not a size: clear error."""
    from mltensor.onnx.resume import MAX_READ_ELEMENTS

    n = MAX_READ_ELEMENTS + 1
    m = _model(
        [h.make_node("Cast", ["s"], ["si"], to=T.INT64), h.make_node("Reshape", ["x", "si"], ["y"])],
        [_vi("x", T.FLOAT, [n]), _vi("s", T.FLOAT, [n])],
        [_vi("y", T.FLOAT, None)],
    )
    with pytest.raises(mltensor.NotSupportedError, match=f"at most {MAX_READ_ELEMENTS}"):
        InferenceSession(m, cache=False)


# -- Loop and Scan executed -------------------------------------------------------------------


def _greedy_loop(M, W, stop_token=3):
    """A greedy decoding loop as exporters write one: h = tanh(h W + x), token = argmax(h), stop
    once the token is `stop_token`; the tokens are the scan output, h the loop-carried state."""
    body = h.make_graph(
        [
            h.make_node("MatMul", ["h_in", "W"], ["hw"]),
            h.make_node("Add", ["hw", "x"], ["hx"]),
            h.make_node("Tanh", ["hx"], ["h_out"]),
            h.make_node("ArgMax", ["h_out"], ["tok"], axis=0, keepdims=0),
            h.make_node("Equal", ["tok", "stop"], ["eq"]),
            h.make_node("Not", ["eq"], ["cond_out"]),
            h.make_node("Identity", ["tok"], ["tok_out"]),
        ],
        "body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("h_in", T.FLOAT, [4])],
        [_vi("cond_out", T.BOOL, []), _vi("h_out", T.FLOAT, [4]), _vi("tok_out", T.INT64, [])],
        [h.make_tensor("stop", T.INT64, [], [stop_token])],
    )
    return _model(
        [h.make_node("Loop", ["M", "c0", "h0"], ["h_final", "toks"], body=body)],
        [_vi("h0", T.FLOAT, [4]), _vi("x", T.FLOAT, [4])],
        [_vi("h_final", T.FLOAT, [4]), _vi("toks", T.INT64, None)],
        [
            h.make_tensor("M", T.INT64, [], [M]),
            h.make_tensor("c0", T.BOOL, [], [True]),
            h.make_tensor("W", T.FLOAT, [4, 4], W.ravel()),
        ],
    )


def test_loop_with_a_gpu_condition_early_exit_and_round_trips(rng):
    """Exit at the first iteration, somewhere in the middle, and never (the 1024 maximum): tokens
    identical to onnxruntime's, and at most n/8 + 1 waits for the condition."""
    from mltensor.stages.loop import BATCH

    W = (rng.standard_normal((4, 4)) * 0.9).astype(np.float32)
    sess, ref = _pair(_greedy_loop(1024, W))
    seen = set()
    for x3 in (5.0, -5.0, 0.3, -0.3, 0.0, 1.0, -1.0, 0.1):
        for _ in range(3):
            h0 = rng.standard_normal(4).astype(np.float32)
            x = np.array([0.1, -0.2, 0.3, x3], np.float32) + rng.standard_normal(4).astype(np.float32) * 0.2
            before = sess.stats["readbacks"]
            _, toks = _check(sess, ref, {"h0": h0, "x": x}, rtol=1e-5)
            n = len(toks)
            seen.add("first" if n == 1 else "none" if n == 1024 else "middle")
            assert sess.stats["readbacks"] - before <= n / BATCH + 1
    assert {"first", "none"} <= seen


@pytest.mark.parametrize("with_topk", [False, True])
def test_loop_zero_trips_and_computed_trip_count(with_topk, rng):
    """M computed from the input's values (read back first), including 0: no iteration, empty scan
    output, the state unchanged. With a TopK over the scan output (an operator that takes no
    dynamic dimension) the rest is built per count instead of once for every count."""
    top = [h.make_node("TopK", ["sqs", "one_k"], ["top", "top_i"], axis=0)] if with_topk else []
    top_out = [_vi("top", T.FLOAT, None)] if with_topk else []
    cases = (3, 300, 3, 5) if with_topk else (0, 3, 300, 0, 3)
    body = h.make_graph(
        [
            h.make_node("Add", ["v_in", "one"], ["v_out"]),
            h.make_node("Mul", ["v_out", "v_out"], ["sq"]),
            h.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_vi("i", T.INT64, []), _vi("c_in", T.BOOL, []), _vi("v_in", T.FLOAT, [3])],
        [_vi("c_out", T.BOOL, []), _vi("v_out", T.FLOAT, [3]), _vi("sq", T.FLOAT, [3])],
        [h.make_tensor("one", T.FLOAT, [], [1.0])],
    )
    m = _model(
        [
            h.make_node("ReduceMax", ["s"], ["mf"], keepdims=0),
            h.make_node("Cast", ["mf"], ["M"], to=T.INT64),
            h.make_node("Loop", ["M", "", "v0"], ["v", "sqs"], body=body),
            h.make_node("Neg", ["v"], ["nv"]),
        ]
        + top,
        [_vi("v0", T.FLOAT, [3]), _vi("s", T.FLOAT, [64])],
        [_vi("nv", T.FLOAT, [3]), _vi("sqs", T.FLOAT, None)] + top_out,
        [h.make_tensor("one_k", T.INT64, [1], [1])],
    )
    sess, ref = _pair(m)
    for trips in cases:
        s = np.full(64, trips, np.float32)
        _check(sess, ref, {"v0": rng.standard_normal(3).astype(np.float32), "s": s}, rtol=1e-5)
    # the executed loop (300 iterations; shorter ones are unrolled once M is known): its scan
    # output's count lands as a dynamic dimension, except where TopK needs a fixed size
    tried = [c.dynamic_ok for c in _cuts(sess) if c.loop is not None and c.dynamic_ok is not None]
    assert tried and all(ok is (not with_topk) for ok in tried)  # (None: the loop ran no iteration)


@pytest.mark.parametrize("rev_in,rev_out,in_axis,out_axis", [(0, 0, 0, 0), (1, 0, 1, 1), (0, 1, 0, 1)])
def test_scan_longer_than_the_unroll_limit(rev_in, rev_out, in_axis, out_axis, rng):
    from mltensor.onnx.ops.control_flow import MAX_UNROLL

    steps = MAX_UNROLL + 44
    body = h.make_graph(
        [
            h.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            h.make_node("Mul", ["s_out", "k"], ["y_t"]),
            h.make_node("Cast", ["y_t"], ["b_t"], to=T.UINT8),
        ],
        "b",
        [_vi("s_in", T.FLOAT, [3]), _vi("x_t", T.FLOAT, [3])],
        [_vi("s_out", T.FLOAT, [3]), _vi("y_t", T.FLOAT, [3]), _vi("b_t", T.UINT8, [3])],
        [h.make_tensor("k", T.FLOAT, [], [0.5])],
    )
    xshape = [steps, 3] if in_axis == 0 else [3, steps]
    m = _model(
        [
            h.make_node(
                "Scan",
                ["s0", "x"],
                ["s", "y", "yb"],
                body=body,
                num_scan_inputs=1,
                scan_input_directions=[rev_in],
                scan_output_directions=[rev_out, 0],
                scan_output_axes=[out_axis, 0],
                scan_input_axes=[in_axis],
            )
        ],
        [_vi("s0", T.FLOAT, [3]), _vi("x", T.FLOAT, xshape)],
        [_vi("s", T.FLOAT, None), _vi("y", T.FLOAT, None), _vi("yb", T.UINT8, None)],
    )
    sess, ref = _pair(m)
    x = np.abs(rng.standard_normal(xshape)).astype(np.float32)
    _check(sess, ref, {"s0": np.zeros(3, np.float32), "x": x}, rtol=1e-5)
    if (rev_in, rev_out) != (0, 0):
        return
    # repeated runs take the loop's tensors (row inputs, the two sets of body outputs) and the
    # stages' outputs from their pools: a steady run makes only its scan outputs' stacks (two);
    # threads running it at once each get their own sets
    ctx = sess.context
    created = []
    real = ctx.create_tensor_sync
    ctx.create_tensor_sync = lambda *a, **k: created.append(1) or real(*a, **k)
    try:
        counts = []
        for i in range(4):
            _check(sess, ref, {"s0": np.full(3, i, np.float32), "x": x}, rtol=1e-5)
            counts.append(len(created))
        assert counts[3] - counts[2] == counts[2] - counts[1] == 2, counts
    finally:
        del ctx.create_tensor_sync
    feeds = [{"s0": np.full(3, i, np.float32), "x": x * (i + 1)} for i in range(6)]
    want = [ref.run(None, f) for f in feeds]

    def work(k):
        for i in range(k, len(feeds), 3):
            for g, w in zip(sess.run(None, feeds[i]), want[i]):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)

    in_threads(work, [(k,) for k in range(3)])


def test_a_data_dependent_shape_inside_an_executed_loop_body_is_refused(rng):
    body = h.make_graph(
        [
            h.make_node("Cast", ["v_in"], ["vi"], to=T.INT64),
            h.make_node("Tile", ["v_in", "vi"], ["t"]),
            h.make_node("ReduceSum", ["t"], ["r"], keepdims=1),
            h.make_node("Add", ["v_in", "r"], ["v_out"]),
            h.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [_vi("i", T.INT64, []), _vi("c_in", T.BOOL, []), _vi("v_in", T.FLOAT, [1])],
        [_vi("c_out", T.BOOL, []), _vi("v_out", T.FLOAT, [1])],
    )
    m = _model(
        [h.make_node("Loop", ["M", "", "v0"], ["v"], body=body)],
        [_vi("v0", T.FLOAT, [1])],
        [_vi("v", T.FLOAT, None)],
        [h.make_tensor("M", T.INT64, [], [1000])],
    )
    sess = InferenceSession(m, cache=False)
    with pytest.raises(mltensor.NotSupportedError, match="inside a Loop or Scan body"):
        sess.run(None, {"v0": np.ones(1, np.float32)})


def test_topk_with_k_computed_from_values(rng):
    """k = max(s) (a float input of 64 values): read back (8 bytes), TopK built for each k."""
    m = _model(
        [
            h.make_node("ReduceMax", ["s"], ["kf"], keepdims=1),
            h.make_node("Cast", ["kf"], ["k"], to=T.INT64),
            h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
        ],
        [_vi("x", T.FLOAT, [3, 40]), _vi("s", T.FLOAT, [64])],
        [_vi("v", T.FLOAT, None), _vi("i", T.INT64, None)],
    )
    sess, ref = _pair(m)
    for k in (5, 40, 1, 5):
        s = np.zeros(64, np.float32)
        s[7] = k
        _check(sess, ref, {"x": rng.standard_normal((3, 40)).astype(np.float32), "s": s})
    assert sess.stats["stage_builds"] == 3 and sess.stats["readback_bytes"] == 4 * 8


@pytest.mark.parametrize("stop,init", [(1, 1), (20, 1), (7, 1), (5, 0), (0, 1)])
def test_loop_exit_at_the_first_and_the_last_iteration(stop, init, rng):
    """cond_out = i + 1 < stop with M = 20: the exit falls at the first iteration (stop 0, 1), in
    the middle (7), exactly at the last (20), or before any iteration (initial condition false,
    computed from the input); scan outputs and the final state as onnxruntime's."""
    body = h.make_graph(
        [
            h.make_node("Add", ["i", "one"], ["i1"]),
            h.make_node("Cast", ["i1"], ["i1f"], to=T.FLOAT),
            h.make_node("Less", ["i1f", "stop"], ["cond_out"]),
            h.make_node("Add", ["v_in", "i1f"], ["v_out"]),
            h.make_node("Identity", ["i"], ["i_scan"]),
        ],
        "body",
        [_vi("i", T.INT64, []), _vi("c_in", T.BOOL, []), _vi("v_in", T.FLOAT, [])],
        [_vi("cond_out", T.BOOL, []), _vi("v_out", T.FLOAT, []), _vi("i_scan", T.INT64, [])],
        [h.make_tensor("one", T.INT64, [], [1])],
    )
    m = _model(
        [
            h.make_node("ReduceMax", ["s"], ["stop"], keepdims=0),
            h.make_node("ReduceMin", ["s"], ["c0f"], keepdims=0),
            h.make_node("Cast", ["c0f"], ["c0"], to=T.BOOL),
            h.make_node("Loop", ["M", "c0", "v0"], ["v", "iters"], body=body),
        ],
        [_vi("s", T.FLOAT, [64]), _vi("v0", T.FLOAT, [])],
        [_vi("v", T.FLOAT, None), _vi("iters", T.INT64, None)],
        [h.make_tensor("M", T.INT64, [], [20])],
    )
    sess, ref = _pair(m)
    s = np.full(64, float(stop), np.float32)
    s[3] = init  # the minimum: the initial condition
    if stop < init:
        s[3], s[4] = stop, stop
    _check(sess, ref, {"s": s, "v0": np.array(0.5, np.float32)})


def test_a_shape_fed_as_a_large_input_is_read_back(rng):
    """Reshape's shape comes from a graph input of 32 values (too many to bind by value): read back
    each run (16 bytes), the rest built once per shape."""
    m = _model(
        [h.make_node("Slice", ["shp", "zero1", "n2"], ["shape"]), h.make_node("Reshape", ["x", "shape"], ["y"])],
        [_vi("x", T.FLOAT, [12]), _vi("shp", T.INT64, [32])],
        [_vi("y", T.FLOAT, None)],
        _INITS,
    )
    sess, ref = _pair(m)
    for a, b_ in [(3, 4), (2, 6), (3, 4)]:
        shp = np.zeros(32, np.int64)
        shp[:2] = a, b_
        _check(sess, ref, {"x": rng.standard_normal(12).astype(np.float32), "shp": shp})
    assert sess.stats["stage_builds"] == 2 and sess.stats["readback_bytes"] == 3 * 16


def _scan8_model(nb, steps, directions, lens_kind):
    """Opset-8 Scan: a float state summing the first scan input, an int64 state counting the
    iterations; scan outputs the running sum and the second input times two. lens_kind: None
    (no sequence_lens), "input" (a graph input), "computed" (cast from a float input: read back)."""
    body = h.make_graph(
        [
            h.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            h.make_node("Add", ["c_in", "one"], ["c_out"]),
            h.make_node("Identity", ["s_out"], ["y_t"]),
            h.make_node("Add", ["z_t", "z_t"], ["w_t"]),
        ],
        "b",
        [_vi("s_in", T.FLOAT, [2, 3]), _vi("c_in", T.INT64, []), _vi("x_t", T.FLOAT, [2, 3]), _vi("z_t", T.INT64, [4])],
        [
            _vi("s_out", T.FLOAT, [2, 3]),
            _vi("c_out", T.INT64, []),
            _vi("y_t", T.FLOAT, [2, 3]),
            _vi("w_t", T.INT64, [4]),
        ],
        [h.make_tensor("one", T.INT64, [], [1])],
    )
    nodes, inputs = (
        [],
        [
            _vi("s0", T.FLOAT, [nb, 2, 3]),
            _vi("c0", T.INT64, [nb]),
            _vi("x", T.FLOAT, [nb, steps, 2, 3]),
            _vi("z", T.INT64, [nb, steps, 4]),
        ],
    )
    lens = ""
    if lens_kind == "input":
        inputs.append(_vi("lens", T.INT64, [nb]))
        lens = "lens"
    elif lens_kind == "computed":
        inputs.append(_vi("lf", T.FLOAT, [nb]))
        nodes.append(h.make_node("Cast", ["lf"], ["lens"], to=T.INT64))
        lens = "lens"
    nodes.append(
        h.make_node(
            "Scan",
            [lens, "s0", "c0", "x", "z"],
            ["s", "c", "y", "w"],
            body=body,
            num_scan_inputs=2,
            directions=directions,
        )
    )
    return _model(
        nodes,
        inputs,
        [_vi("s", T.FLOAT, None), _vi("c", T.INT64, None), _vi("y", T.FLOAT, None), _vi("w", T.INT64, None)],
        opset=8,
    )


@pytest.mark.parametrize(
    "nb,steps,directions,lens_kind,lens_list",
    [
        (1, 5, [0, 0], None, [None]),
        (3, 6, [1, 0], "input", [[6, 2, 1], [3, 6, 6], [6, 2, 1]]),
        (2, 4, [0, 1], "computed", [[1, 4], [4, 3]]),
        # executed (the lengths add up past the unroll limit): one cut per batch entry
        (3, 120, [1, 0], "input", [[120, 37, 120], [1, 120, 120]]),
    ],
)
def test_scan_opset8_batch_and_sequence_lens(nb, steps, directions, lens_kind, lens_list, rng):
    """Opset-8 Scan against onnxruntime: batch entries scanned over their own lengths (reversed
    inputs read from the length back), scan outputs zero past it."""
    sess, ref = _pair(_scan8_model(nb, steps, directions, lens_kind))
    for lens in lens_list:
        feeds = {
            "s0": rng.standard_normal((nb, 2, 3)).astype(np.float32),
            "c0": rng.integers(0, 9, nb),
            "x": rng.standard_normal((nb, steps, 2, 3)).astype(np.float32),
            "z": rng.integers(-50, 50, (nb, steps, 4)),
        }
        if lens_kind == "input":
            feeds["lens"] = np.array(lens, np.int64)
        elif lens_kind == "computed":
            feeds["lf"] = np.array(lens, np.float32)
        _check(sess, ref, feeds, rtol=1e-5)
    if steps > 100:
        assert sum(c.loop is not None for c in _cuts(sess)) >= nb


def test_scan_opset8_lengths_out_of_range_are_refused(rng):
    sess = InferenceSession(_scan8_model(2, 4, [0, 0], "input"), cache=False)
    feeds = {
        "s0": np.zeros((2, 2, 3), np.float32),
        "c0": np.zeros(2, np.int64),
        "x": np.zeros((2, 4, 2, 3), np.float32),
        "z": np.zeros((2, 4, 4), np.int64),
    }
    for bad in ([0, 4], [5, 1]):
        with pytest.raises(mltensor.DataError, match="sequence_lens"):
            sess.run(None, {**feeds, "lens": np.array(bad, np.int64)})
