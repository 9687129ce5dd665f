"""ONNX NonZero, Compress and NonMaxSuppression on values computed in the graph: the selection on
the GPU, only its count read back (mltensor/stages/), against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from mltensor import InferenceSession

from helpers import in_threads

ort = pytest.importorskip("onnxruntime")


def _vi(name, et, shape):
    return h.make_tensor_value_info(name, et, shape)


def _run_both(m, feeds_list):
    b = m.SerializeToString()
    sess = InferenceSession(b, cache=False)
    ref = ort.InferenceSession(b, providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        got = sess.run(None, feeds)
        want = ref.run(None, feeds)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    return sess


def _model(nodes, inputs, outputs, inits=(), opset=17):
    return h.make_model(
        h.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=[h.make_opsetid("", opset)], ir_version=8
    )


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_nonzero_of_a_computed_mask(shape, rng):
    """NonZero(x > t), its indices used to gather x's values (the usual pattern): empty, some, all."""
    m = _model(
        [
            h.make_node("Greater", ["x", "t"], ["mask"]),
            h.make_node("NonZero", ["mask"], ["nz"]),
            h.make_node("Transpose", ["nz"], ["nzt"]),
            h.make_node("GatherND", ["x", "nzt"], ["vals"]),
        ],
        [_vi("x", T.FLOAT, list(shape)), _vi("t", T.FLOAT, [])],
        [_vi("nz", T.INT64, None), _vi("vals", T.FLOAT, None)],
    )
    x = rng.standard_normal(shape).astype(np.float32)
    feeds = [{"x": x, "t": np.float32(t)} for t in (0.0, 0.5, 10.0, -10.0, 0.0)]
    sess = _run_both(
        m,
        [dict(f, t=np.array(f["t"], np.float32)) for f in feeds[:1]]
        + [{"x": x, "t": np.array(t, np.float32)} for t in (0.5, -10.0, 0.0)]
        + [{"x": rng.standard_normal(shape).astype(np.float32), "t": np.array(0.0, np.float32)}],
    )
    st = sess.stats
    assert st["readback_bytes"] == 4 * st["readbacks"]  # only the count crossed, 4 bytes a run


def test_nonzero_none_at_all_gives_an_empty_result(rng):
    m = _model(
        [h.make_node("Greater", ["x", "t"], ["mask"]), h.make_node("NonZero", ["mask"], ["nz"])],
        [_vi("x", T.FLOAT, [4, 4]), _vi("t", T.FLOAT, [])],
        [_vi("nz", T.INT64, None)],
    )
    _run_both(
        m,
        [
            {"x": np.zeros((4, 4), np.float32), "t": np.array(1.0, np.float32)},
            {"x": np.ones((4, 4), np.float32), "t": np.array(0.5, np.float32)},
        ],
    )


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_compress_on_a_computed_condition(axis, rng):
    n = 6 if axis != 0 else 4
    attrs = {} if axis is None else {"axis": axis}
    m = _model(
        [
            h.make_node("Greater", ["c", "zero"], ["cond"]),
            h.make_node("Compress", ["x", "cond"], ["y"], **attrs),
            h.make_node("Relu", ["y"], ["z"]),
        ],
        [_vi("x", T.FLOAT, [4, 6]), _vi("c", T.FLOAT, [n if axis is not None else 24])],
        [_vi("z", T.FLOAT, None)],
        [h.make_tensor("zero", T.FLOAT, [], [0.0])],
    )
    length = n if axis is not None else 24
    cases = [rng.standard_normal(length), -np.ones(length), np.ones(length), rng.standard_normal(length)]
    sess = _run_both(
        m, [{"x": rng.standard_normal((4, 6)).astype(np.float32), "c": c.astype(np.float32)} for c in cases]
    )
    assert sess.stats["stage_builds"] == 2  # every count in one build, none kept in another


def _nms_model(center_point_box=0, params_as_inputs=False, opset=17):
    """Detector post-processing as exporters write it: scores = sigmoid(logits), NMS, then the
    kept boxes gathered by the selected indices."""
    inputs = [_vi("boxes", T.FLOAT, [2, 50, 4]), _vi("logits", T.FLOAT, [2, 3, 50])]
    inits = []
    if params_as_inputs:  # given as data: each is read back too
        inputs += [_vi("mx", T.FLOAT, [8]), _vi("thr", T.FLOAT, [8])]
        pre = [
            h.make_node("ReduceMax", ["mx"], ["mxf"], keepdims=0),
            h.make_node("Cast", ["mxf"], ["mx0"], to=T.INT64),
            h.make_node("Reshape", ["mx0", "one"], ["max_out"]),
            h.make_node("Slice", ["thr", "s0", "s1"], ["iou"]),
            h.make_node("Slice", ["thr", "s1", "s2"], ["score"]),
        ]
        inits += [h.make_tensor("one", T.INT64, [1], [1])] + [
            h.make_tensor(f"s{k}", T.INT64, [1], [k]) for k in range(3)
        ]
    else:
        pre = []
        inits += [
            h.make_tensor("max_out", T.INT64, [1], [7]),
            h.make_tensor("iou", T.FLOAT, [1], [0.4]),
            h.make_tensor("score", T.FLOAT, [1], [0.3]),
        ]
    nodes = pre + [
        h.make_node("Sigmoid", ["logits"], ["scores"]),
        h.make_node(
            "NonMaxSuppression",
            ["boxes", "scores", "max_out", "iou", "score"],
            ["sel"],
            center_point_box=center_point_box,
        ),
        h.make_node("Gather", ["sel", "two"], ["box_idx"], axis=1),
        h.make_node("Gather", ["boxes", "box_idx"], ["kept"], axis=1),
    ]
    inits.append(h.make_tensor("two", T.INT64, [], [2]))
    return _model(nodes, inputs, [_vi("sel", T.INT64, None), _vi("kept", T.FLOAT, None)], inits, opset)


def _boxes(rng, cpb):
    xy = rng.uniform(0, 10, (2, 50, 2))
    wh = rng.uniform(0.5, 4, (2, 50, 2))
    if cpb:
        b = np.concatenate([xy, wh], -1)
    else:
        b = np.concatenate([xy, xy + wh], -1)
        b[:, ::3] = b[:, ::3][..., [2, 3, 0, 1]]  # some corners flipped
    return b.astype(np.float32)


@pytest.mark.parametrize("cpb", [0, 1])
def test_nms_in_the_graph(cpb, rng):
    m = _nms_model(cpb)
    feeds = [
        {"boxes": _boxes(rng, cpb), "logits": (rng.standard_normal((2, 3, 50)) * 2).astype(np.float32)}
        for _ in range(3)
    ]
    feeds.append({"boxes": _boxes(rng, cpb), "logits": np.full((2, 3, 50), -5, np.float32)})  # none kept
    sess = _run_both(m, feeds)
    st = sess.stats
    assert st["readback_bytes"] == 4 * st["readbacks"]
    # the gathers after NMS take the count as a dynamic dimension: one build for every count
    # (and one for none kept: an empty result)
    assert st["stage_builds"] == 2 and sess._spec.stage.cut.dynamic_ok


def test_nms_parameters_computed_at_run_time(rng):
    m = _nms_model(params_as_inputs=True)
    feeds = []
    for mx, iou, score in [(3, 0.5, 0.2), (50, 1.0, 0.0), (0, 0.5, 0.2), (3, 0.5, 0.2)]:
        thr = np.zeros(8, np.float32)
        thr[:2] = iou, score
        feeds.append(
            {
                "boxes": _boxes(rng, 0),
                "logits": rng.standard_normal((2, 3, 50)).astype(np.float32),
                "mx": np.full(8, mx, np.float32),
                "thr": thr,
            }
        )
    _run_both(m, feeds)


@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_unique_of_computed_values(sorted_, dtype, rng):
    et = T.FLOAT if dtype == np.float32 else T.INT64
    m = _model(
        [h.make_node("Abs", ["x"], ["a"]), h.make_node("Unique", ["a"], ["y", "idx", "inv", "cnt"], sorted=sorted_)],
        [_vi("x", et, [5, 7])],
        [_vi("y", et, None), _vi("idx", T.INT64, None), _vi("inv", T.INT64, None), _vi("cnt", T.INT64, None)],
        opset=11,
    )
    cases = [rng.integers(-4, 5, (5, 7)), np.full((5, 7), 3), rng.permutation(35).reshape(5, 7) - 17]
    _run_both(m, [{"x": c.astype(dtype)} for c in cases])


def _unique_model(et, shape, axis, sorted_):
    kw = {} if axis is None else {"axis": axis}
    return _model(
        [
            h.make_node("Abs", ["x"], ["a"]),
            h.make_node("Unique", ["a"], ["y", "idx", "inv", "cnt"], sorted=sorted_, **kw),
        ],
        [_vi("x", et, list(shape))],
        [_vi("y", et, None), _vi("idx", T.INT64, None), _vi("inv", T.INT64, None), _vi("cnt", T.INT64, None)],
        opset=11,
    )


def _slices(rng, shape, axis, pattern):
    """An input whose slices along `axis` repeat: drawn from a few distinct slices (duplicates
    far apart, ties in the leading columns broken late), all equal, or all distinct."""
    moved = [shape[axis]] + [s for i, s in enumerate(shape) if i != axis]
    n, m = moved[0], int(np.prod(moved[1:]))
    if pattern == "few":
        base = rng.integers(-2, 3, (3, m))
        base[1, :-1] = base[0, :-1]  # two slices equal but in their last entry
        rows = base[rng.integers(0, 3, n)]
    elif pattern == "equal":
        rows = np.repeat(rng.integers(-3, 4, (1, m)), n, 0)
    else:
        rows = rng.permutation(n * m).reshape(n, m) - n * m // 2
    x = rows.reshape(moved)
    return np.moveaxis(x, 0, axis)


@pytest.mark.parametrize(
    "shape,axis", [((6, 4), 0), ((3, 7), 1), ((2, 5, 3), 1), ((4, 3, 2), -1), ((9, 1), 0), ((5, 3, 4), 0)]
)
@pytest.mark.parametrize("sorted_", [1, 0])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_unique_along_an_axis(shape, axis, sorted_, dtype, rng):
    """Unique slices (lexicographic order, or first occurrence), their first indices, inverse
    indices and counts, against onnxruntime: few distinct slices, all equal, all distinct."""
    et = T.FLOAT if dtype == np.float32 else T.INT64
    m = _unique_model(et, shape, axis, sorted_)
    cases = [_slices(rng, shape, axis % len(shape), p) for p in ("few", "equal", "distinct", "few")]
    _run_both(m, [{"x": c.astype(dtype)} for c in cases])


def test_unique_along_an_axis_single_slice_and_wide_rows(rng):
    # one slice: no cut at all; 37 columns: prefix doubling over an odd number of columns
    _run_both(_unique_model(T.FLOAT, (1, 3, 2), 0, 1), [{"x": rng.standard_normal((1, 3, 2)).astype(np.float32)}])
    shape = (40, 37)
    m = _unique_model(T.INT64, shape, 0, 1)
    _run_both(m, [{"x": _slices(rng, shape, 0, p)} for p in ("few", "distinct")])


def test_unique_keys_past_int32(monkeypatch, rng):
    """Rows of more than 46340 slices pair their ranks as int64 keys (n * n past int32): the
    threshold lowered to take that path on a small input."""
    from mltensor.onnx.ops import select

    monkeypatch.setattr(select, "KEY32_MAX_N", 3)
    shape = (12, 5)
    m = _unique_model(T.FLOAT, shape, 0, 1)
    _run_both(m, [{"x": _slices(rng, shape, 0, p).astype(np.float32)} for p in ("few", "distinct")])


def test_unique_nan_as_numpy():
    """NaN as the ONNX reference (numpy's unique): flattened, every NaN one value; along an axis,
    a slice holding a NaN equal to no slice, placed by its other entries (onnxruntime's answer
    depends on the input order here)."""
    nan = np.nan
    x = np.array([[nan, 0], [nan, 0], [1, -0.0], [1, 0.0], [nan, -1], [-1, nan]], np.float32)
    for axis in (None, 0):
        kw = {} if axis is None else {"axis": axis}
        m = _model(
            [h.make_node("Identity", ["x"], ["a"]), h.make_node("Unique", ["a"], ["y", "idx", "inv", "cnt"], **kw)],
            [_vi("x", T.FLOAT, [6, 2])],
            [_vi("y", T.FLOAT, None)] + [_vi(o, T.INT64, None) for o in ("idx", "inv", "cnt")],
            opset=11,
        )
        got = InferenceSession(m, cache=False).run(None, {"x": x})
        want = np.unique(x, True, True, True, axis=axis)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w.reshape(-1) if g.ndim == 1 else w)  # (numpy 2: inverse in x's shape)


def _nonzero_gather_model():
    """NonZero of a computed mask (a counted cut: the count as a dynamic dimension), its values
    gathered and summed after it."""
    return _model(
        [
            h.make_node("Greater", ["x", "t"], ["mask"]),
            h.make_node("NonZero", ["mask"], ["nz"]),
            h.make_node("Squeeze", ["nz", "ax0"], ["i"]),
            h.make_node("Gather", ["x", "i"], ["vals"]),
            h.make_node("Mul", ["vals", "vals"], ["sq"]),
            h.make_node("ReduceSum", ["sq"], ["s"], keepdims=0),
        ],
        [_vi("x", T.FLOAT, [64]), _vi("t", T.FLOAT, [])],
        [_vi("nz", T.INT64, None), _vi("vals", T.FLOAT, None), _vi("s", T.FLOAT, None)],
        [h.make_tensor("ax0", T.INT64, [1], [0])],
    )


def test_staged_runs_reuse_their_stage_tensors(rng):
    """Repeated runs of a model with a cut (NonZero, then NonMaxSuppression) create no tensor
    after the first runs (each stage's outputs come from its pool), and the context holds as
    many tensors after each."""
    x = rng.standard_normal(64).astype(np.float32)
    m = _nonzero_gather_model()
    b = m.SerializeToString()
    sess = InferenceSession(b, cache=False)
    ref = ort.InferenceSession(b, providers=["CPUExecutionProvider"])
    ctx = sess.context
    created = []
    real = ctx.create_tensor_sync

    def counting(*a, **k):
        created.append(k.get("shape"))
        return real(*a, **k)

    ctx.create_tensor_sync = counting
    try:
        base = ctx.counters["tensors_alive"]
        alive = []
        for i in range(6):
            feeds = {"x": x, "t": np.array(0.1 * (i % 3), np.float32)}  # three counts, each met twice
            for g, w in zip(sess.run(None, feeds), ref.run(None, feeds)):
                np.testing.assert_allclose(g, w, rtol=1e-5)
            alive.append((len(created), ctx.counters["tensors_alive"], ctx.counters["bytes_alive"]))
        assert alive[3:] == [alive[2]] * 3, alive  # nothing made, nothing left behind
        sess.close()  # the pools go with the stages
        assert ctx.counters["tensors_alive"] == base
        nms = _nms_model()
        sess2 = InferenceSession(nms, cache=False)
        feeds = {"boxes": _boxes(rng, 0), "logits": (rng.standard_normal((2, 3, 50)) * 2).astype(np.float32)}
        first = sess2.run(None, feeds)
        n0 = len(created)
        for _ in range(3):
            for g, w in zip(sess2.run(None, feeds), first):
                np.testing.assert_array_equal(g, w)
        assert len(created) == n0
    finally:
        del ctx.create_tensor_sync


def test_staged_runs_concurrent_on_pooled_tensors(rng):
    """Threads running one staged session at once, at different counts, some taking their
    outputs as MLTensors: every result as onnxruntime's (no run reads or writes a set another
    run holds), and the pools keep no more sets than runs were in flight."""

    from mltensor.stages.pool import POOL

    m = _nonzero_gather_model()
    b = m.SerializeToString()
    sess = InferenceSession(b, cache=False)
    ref = ort.InferenceSession(b, providers=["CPUExecutionProvider"])
    cases = [
        {"x": rng.standard_normal(64).astype(np.float32), "t": np.array(t, np.float32)}
        for t in (0.0, 0.5, -0.5, 1.0) * 4
    ]
    want = [ref.run(None, f) for f in cases]

    def work(k):
        for _ in range(3):
            for i in range(k, len(cases), 4):
                if k % 2:
                    ts = sess.run(None, cases[i], output_location="ml-tensor")
                    got = [sess.context.read_tensor_sync(t) for t in ts]
                else:
                    got = sess.run(None, cases[i])
                for g, w in zip(got, want[i]):
                    np.testing.assert_allclose(g.reshape(w.shape), w, rtol=1e-5)

    in_threads(work, [(k,) for k in range(4)])
    stages, todo = [], [s.stage for s in sess._specs.values() if s.stage is not None]
    while todo:
        st = todo.pop()
        stages.append(st)
        todo.extend(st.children.values())
    assert stages and all(len(st.pool.free) <= min(4, POOL) for st in stages)
