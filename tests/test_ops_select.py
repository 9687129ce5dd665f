"""The internal GPU selections of mltensor/ops/select.py: `_nonzero` against numpy's nonzero and
`_nms` against onnxruntime's NonMaxSuppression (CPU), compared exactly. Both give static shapes
(the maximum) and a count: the rows from the count on must be zeros."""

import numpy as np
import pytest
from helpers import context_with_env, fed_values, one_node_model, run_graph

import mltensor

NP = mltensor.dtypes.NUMPY


# -- _nonzero -----------------------------------------------------------------------------------


def _nonzero_graph(ctx, x, *, constant=False):
    """(indices, count, built graph's kernel names) of _nonzero(x) on the GPU."""
    b = mltensor.MLGraphBuilder(ctx)
    dt = mltensor.dtypes.normalize(x.dtype)
    xi = b.constant(x) if constant else b.input("x", data_type=dt, shape=x.shape)
    idx, cnt = b._nonzero(xi)
    g = b.build_sync({"i": idx, "c": cnt})
    names = list(g.kernel_names)
    g.destroy()
    b = mltensor.MLGraphBuilder(ctx)
    xi = b.constant(x) if constant else b.input("x", data_type=dt, shape=x.shape)
    idx, cnt = b._nonzero(xi)
    r = run_graph(ctx, {"i": idx, "c": cnt}, {} if constant else {"x": x}, b)
    return r["i"], r["c"], names


def _check_nonzero(ctx, x, **kw):
    idx, cnt, names = _nonzero_graph(ctx, x, **kw)
    want = np.array(np.nonzero(x.reshape(x.shape or (1,))), np.int64)
    n = max(x.size, 1)
    assert idx.shape == (max(x.ndim, 1), n) and cnt.shape == (1,)
    assert idx.dtype == np.int64 and cnt.dtype == np.int32
    c = int(cnt[0])
    assert c == want.shape[1]
    np.testing.assert_array_equal(idx[:, :c], want)
    assert not idx[:, c:].any()
    return names


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4), (2, 1, 3, 5), (2, 3, 1, 2, 5)])
def test_nonzero_ranks(ctx, rng, shape):
    x = np.where(rng.random(shape) < 0.4, rng.standard_normal(shape), 0).astype(np.float32)
    _check_nonzero(ctx, np.asarray(x))


def test_nonzero_scalar_zero_and_nonzero(ctx):
    for v in (0.0, -2.5):
        _check_nonzero(ctx, np.asarray(np.float32(v)))


@pytest.mark.parametrize("dt", list(NP))
def test_nonzero_types(ctx, rng, dt):
    """Every data type; the 64-bit ones with values nonzero only in their high word."""
    shape = (6, 37)
    if dt in ("float32", "float16"):
        x = np.where(rng.random(shape) < 0.5, rng.standard_normal(shape), 0).astype(dt)
        x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]  # NaN and inf are nonzero, -0.0 is zero
        x[1, :2] = [6e-8, -6e-8] if dt == "float16" else [1e-45, -1e-45]  # subnormals are nonzero
    else:
        info = np.iinfo(dt)
        x = rng.integers(info.min, int(info.max) + 1, size=shape, dtype=dt)
        x[rng.random(shape) < 0.5] = 0
        if dt in ("int64", "uint64"):
            x[2, :3] = [1 << 32, 1 << 40, 1]
    _check_nonzero(ctx, x)


def test_nonzero_all_zero_and_all_nonzero(ctx):
    for shape in [(5, 3), (3000,)]:
        _check_nonzero(ctx, np.zeros(shape, np.float32))
        _check_nonzero(ctx, np.ones(shape, np.int32))


@pytest.mark.parametrize("n", [1024, 1025, 8192, 8193, 20000])
def test_nonzero_block_edges(ctx, rng, n):
    """Sizes at the block (1024 elements) and single-launch (8 blocks) edges."""
    x = (rng.random(n) < 0.3).astype(np.uint32) * rng.integers(1, 100, n).astype(np.uint32)
    names = _check_nonzero(ctx, x)
    assert len(names) == (1 if n <= 8192 else 3), names


def test_nonzero_million(ctx, rng):
    """10^6 elements (977 blocks, three launches), rank 3."""
    x = np.where(rng.random((100, 100, 100)) < 0.1, 1.0, 0.0).astype(np.float32)
    x[rng.random(x.shape) < 0.001] = np.nan
    names = _check_nonzero(ctx, x)
    assert names == ["nonzero_f32_100x100x100_count", "select_scan_n977", "nonzero_f32_100x100x100_scatter"]


def test_nonzero_constant_input(ctx, rng):
    """A constant input: computed once at build."""
    x = np.where(rng.random((4, 9)) < 0.5, 3, 0).astype(np.int64)
    _check_nonzero(ctx, x, constant=True)


@pytest.mark.parametrize("env", ["MLTENSOR_DISABLE_INT64", "MLTENSOR_DISABLE_F16"])
def test_nonzero_emulated_types(rng, env):
    """int64 in emulated words and float16 computed in f32."""
    ctx = context_with_env(**{env: "1"})
    try:
        for dt in ("int64", "uint64", "float16"):
            x = np.where(rng.random((5, 300)) < 0.5, 7, 0).astype(dt)
            if dt != "float16":
                x[0, :2] = [1 << 33, 5 << 40]
            _check_nonzero(ctx, x)
    finally:
        ctx.destroy()


def test_nonzero_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    with pytest.raises(TypeError, match="_nonzero"):
        b._nonzero(np.zeros(3, np.float32))


# -- _nms ---------------------------------------------------------------------------------------


def _ort_nms(boxes, scores, max_per_class, iou_threshold, score_threshold, center_point_box):
    import onnx
    import onnxruntime as ort

    inputs = [
        ("boxes", boxes, True),
        ("scores", scores, True),
        ("max", np.array([max_per_class], np.int64), False),
        ("iou", np.array([iou_threshold], np.float32), False),
        ("score", None if score_threshold is None else np.array([score_threshold], np.float32), False),
    ]
    model = one_node_model(
        "NonMaxSuppression",
        inputs,
        [("selected", onnx.TensorProto.INT64)],
        {"center_point_box": center_point_box},
        opset=11,
    )
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, fed_values(inputs))[0]


def _gpu_nms(ctx, boxes, scores, **kw):
    b = mltensor.MLGraphBuilder(ctx)
    bx = b.input("boxes", data_type="float32", shape=boxes.shape)
    sc = b.input("scores", data_type="float32", shape=scores.shape)
    sel, cnt = b._nms(bx, sc, **kw)
    r = run_graph(ctx, {"sel": sel, "cnt": cnt}, {"boxes": boxes, "scores": scores}, b)
    return r["sel"], r["cnt"]


def _check_nms(ctx, boxes, scores, max_per_class, iou_threshold=0.5, score_threshold=None, center_point_box=0):
    boxes = np.ascontiguousarray(boxes, np.float32)
    scores = np.ascontiguousarray(scores, np.float32)
    B, S, _ = boxes.shape
    C = scores.shape[1]
    sel, cnt = _gpu_nms(
        ctx,
        boxes,
        scores,
        max_per_class=max_per_class,
        iou_threshold=iou_threshold,
        score_threshold=score_threshold,
        center_point_box=center_point_box,
    )
    assert sel.shape == (B * C * max(1, min(max(max_per_class, 0), S)), 3) and cnt.shape == (1,)
    assert sel.dtype == np.int64 and cnt.dtype == np.int32
    want = _ort_nms(boxes, scores, max_per_class, iou_threshold, score_threshold, center_point_box)
    c = int(cnt[0])
    assert c == len(want), (c, len(want))
    np.testing.assert_array_equal(sel[:c], want)
    assert not sel[c:].any()
    return c


def _corners(rng, B, S, span=100.0, size=20.0):
    y = rng.random((B, S, 1)) * span
    x = rng.random((B, S, 1)) * span
    h = rng.random((B, S, 1)) * size + 0.5
    w = rng.random((B, S, 1)) * size + 0.5
    return np.concatenate([y, x, y + h, x + w], -1).astype(np.float32)


def _centers(rng, B, S, span=100.0, size=20.0):
    xy = rng.random((B, S, 2)) * span
    wh = rng.random((B, S, 2)) * size + 0.5
    return np.concatenate([xy, wh], -1).astype(np.float32)


def test_nms_onnx_example(ctx):
    """The ONNX spec's nonmaxsuppression_suppress_by_IOU (and its flipped-corners variant)."""
    boxes = np.array(
        [
            [
                [0.0, 0.0, 1.0, 1.0],
                [0.0, 0.1, 1.0, 1.1],
                [0.0, -0.1, 1.0, 0.9],
                [0.0, 10.0, 1.0, 11.0],
                [0.0, 10.1, 1.0, 11.1],
                [0.0, 100.0, 1.0, 101.0],
            ]
        ],
        np.float32,
    )
    scores = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], np.float32)
    assert _check_nms(ctx, boxes, scores, 3, 0.5, 0.0) == 3
    flipped = np.array(
        [
            [
                [1.0, 1.0, 0.0, 0.0],
                [0.0, 0.1, 1.0, 1.1],
                [0.0, 0.9, 1.0, -0.1],
                [0.0, 10.0, 1.0, 11.0],
                [1.0, 10.1, 0.0, 11.1],
                [1.0, 101.0, 0.0, 100.0],
            ]
        ],
        np.float32,
    )
    _check_nms(ctx, flipped, scores, 3, 0.5, 0.0)
    centers = np.array(
        [
            [
                [0.5, 0.5, 1.0, 1.0],
                [0.5, 0.6, 1.0, 1.0],
                [0.5, 0.4, 1.0, 1.0],
                [0.5, 10.5, 1.0, 1.0],
                [0.5, 10.6, 1.0, 1.0],
                [0.5, 100.5, 1.0, 1.0],
            ]
        ],
        np.float32,
    )
    _check_nms(ctx, centers, scores, 3, 0.5, 0.0, center_point_box=1)


@pytest.mark.parametrize("center", [0, 1])
def test_nms_batches_classes(ctx, rng, center):
    B, C, S = 3, 4, 60
    boxes = _centers(rng, B, S) if center else _corners(rng, B, S)
    scores = rng.random((B, C, S))
    _check_nms(ctx, boxes, scores, 5, 0.4, 0.3, center)
    _check_nms(ctx, boxes, scores, 1000, 0.3, None, center)  # max_per_class > S


def test_nms_flipped_corners(ctx, rng):
    boxes = _corners(rng, 2, 80)
    flip = rng.random((2, 80)) < 0.5
    boxes[flip] = boxes[flip][:, [2, 3, 0, 1]]
    swap_x = rng.random((2, 80)) < 0.5
    boxes[swap_x] = boxes[swap_x][:, [0, 3, 2, 1]]
    _check_nms(ctx, boxes, rng.random((2, 3, 80)), 20, 0.25, 0.1)


def test_nms_none_pass_the_score_threshold(ctx, rng):
    boxes = _corners(rng, 2, 30)
    scores = rng.random((2, 3, 30)) * 0.5
    assert _check_nms(ctx, boxes, scores, 10, 0.5, 0.5) == 0
    scores[1, 2, 7] = 0.5  # equal to the threshold: not kept (strictly greater)
    assert _check_nms(ctx, boxes, scores, 10, 0.5, 0.5) == 0
    scores[1, 2, 8] = np.nextafter(np.float32(0.5), np.float32(1))
    assert _check_nms(ctx, boxes, scores, 10, 0.5, 0.5) == 1


def test_nms_all_selected(ctx, rng):
    """iou_threshold 1.0: nothing is suppressed, not even identical boxes (IoU 1 is not > 1)."""
    boxes = _corners(rng, 1, 50, span=10.0)
    boxes[0, 10] = boxes[0, 3]
    scores = rng.random((1, 2, 50))
    assert _check_nms(ctx, boxes, scores, 100, 1.0) == 100
    _check_nms(ctx, _centers(rng, 1, 50, span=10.0), scores, 100, 1.0, None, 1)


def test_nms_max_per_class(ctx, rng):
    boxes = _corners(rng, 2, 40)
    scores = rng.random((2, 3, 40))
    for m in (0, 1, 2, 40, 41, 10**9, -3):
        _check_nms(ctx, boxes, scores, m, 0.5, 0.2)


def test_nms_max_per_class_zero_launches_one_fill(ctx, rng):
    b = mltensor.MLGraphBuilder(ctx)
    sel, cnt = b._nms(
        b.input("b", data_type="float32", shape=[1, 5, 4]),
        b.input("s", data_type="float32", shape=[1, 2, 5]),
        max_per_class=0,
    )
    assert sel.shape == (2, 3) and sel.data_type == "int64" and cnt.shape == (1,) and cnt.data_type == "int32"
    g = b.build_sync({"sel": sel, "cnt": cnt})
    assert g.kernel_names == ["nms_b1c2s5_none"]
    g.destroy()


def test_nms_ties(ctx, rng):
    """Equal scores: the lower box index first (onnxruntime's order), -0.0 equal to 0.0."""
    boxes = _corners(rng, 2, 200, span=60.0)
    scores = rng.integers(0, 4, (2, 3, 200)).astype(np.float32) / 4
    scores[0, 0, :50] = -0.0
    _check_nms(ctx, boxes, scores, 30, 0.5, None)
    _check_nms(ctx, boxes, scores, 200, 0.2, -0.5)
    _check_nms(ctx, boxes, np.ones((2, 1, 200)), 200, 0.0)  # one score: index order


def test_nms_special_scores(ctx, rng):
    """Negative and infinite scores; NaN scores are never candidates where onnxruntime's result
    is defined (with a threshold)."""
    boxes = _corners(rng, 1, 40)
    scores = rng.standard_normal((1, 2, 40)).astype(np.float32)
    scores[0, 0, :3] = [np.inf, -np.inf, np.inf]
    _check_nms(ctx, boxes, scores, 40, 0.5, None)
    scores[0, 1, 5:8] = np.nan
    _check_nms(ctx, boxes, scores, 40, 0.5, -1.0)
    _check_nms(ctx, boxes, scores, 40, 0.5, float("-inf"))


def test_nms_degenerate_boxes(ctx, rng):
    """Zero-area boxes (never suppress nor suppressed), boxes sharing only an edge, negative
    widths in the center format (never intersect)."""
    boxes = _corners(rng, 1, 30, span=10.0)
    boxes[0, :5, 2] = boxes[0, :5, 0]  # zero height
    boxes[0, 5] = [0, 0, 1, 1]
    boxes[0, 6] = [1, 0, 2, 1]  # shares an edge with 5
    _check_nms(ctx, boxes, rng.random((1, 2, 30)), 30, 0.0)
    centers = _centers(rng, 1, 30, span=10.0)
    centers[0, :8, 2] *= -1
    centers[0, 4:12, 3] *= -1
    _check_nms(ctx, centers, rng.random((1, 2, 30)), 30, 0.1, None, 1)


def test_nms_single_box(ctx):
    boxes = np.array([[[0, 0, 1, 1]], [[2, 2, 1, 1]]], np.float32)
    assert _check_nms(ctx, boxes, np.array([[[0.5], [0.1]], [[0.7], [0.9]]]), 3, 0.5, 0.2) == 3


def _f32_iou(c, s):
    """onnxruntime's IoU of two corner boxes in float32 arithmetic (None: no intersection)."""
    f = np.float32

    def norm(b):
        y0, x0, y1, x1 = (f(v) for v in b)
        ymin, ymax = (y1, y0) if y0 >= y1 else (y0, y1)
        xmin, xmax = (x1, x0) if x0 >= x1 else (x0, x1)
        return ymin, xmin, ymax, xmax, f(f(ymax - ymin) * f(xmax - xmin))

    cy0, cx0, cy1, cx1, ca = norm(c)
    sy0, sx0, sy1, sx1, sa = norm(s)
    ix = f(min(cx1, sx1) - max(cx0, sx0))
    iy = f(min(cy1, sy1) - max(cy0, sy0))
    if ix <= 0 or iy <= 0:
        return None
    inter = f(ix * iy)
    return f(inter / f(f(ca + sa) - inter))


def _pairs_at(t, rng, n):
    """Pairs of corner boxes whose float32 IoU lies within a few ulp of t (a coordinate found by
    bisection on its bits, then its neighbours): the decision hangs on the exact rounding of the
    division and of the union (unfused products)."""
    f = np.float32
    out = []
    while len(out) < n:
        c = rng.random(4).astype(f) * 5
        c[2:] = c[:2] + (rng.random(2) * 3 + 0.5).astype(f)
        h = f(rng.random() * 0.5)

        def moved(d):
            return np.array([c[0] + h, c[1] + d, c[2] + h, c[3] + d], f)

        lo, hi = f(0).view(np.uint32), f(c[3] - c[1]).view(np.uint32)
        if (_f32_iou(c, moved(f(0))) or 0) <= t:
            continue
        while int(hi) - int(lo) > 1:
            mid = np.uint32((int(lo) + int(hi)) // 2)
            if (_f32_iou(c, moved(mid.view(f))) or 0) > t:
                lo = mid
            else:
                hi = mid
        out += [(c, moved(np.uint32(int(lo) + k).view(f))) for k in range(-4, 5)]
    return out


@pytest.mark.parametrize("t", [0.5, 0.3, 1 / 3, 0.7])
def test_nms_iou_at_the_threshold(ctx, rng, t):
    t = float(np.float32(t))
    pairs = _pairs_at(t, rng, 45)
    boxes = np.stack([np.stack(p) for p in pairs])
    ious = [_f32_iou(s, c) for c, s in pairs]
    assert any(v == t for v in ious) and any(v is not None and v > t for v in ious)
    scores = np.tile(np.array([0.9, 0.8], np.float32), (len(pairs), 1, 1))
    _check_nms(ctx, boxes, scores, 2, t)


def test_nms_integer_boxes(ctx, rng):
    """Pixel coordinates: IoUs that are exact simple fractions (1/2, 1/3, ...) at the threshold."""
    boxes = rng.integers(0, 6, (4, 120, 4)).astype(np.float32)
    scores = rng.random((4, 2, 120))
    for t in (0.5, 1 / 3, 0.25, 0.0, 1.0):
        _check_nms(ctx, boxes, scores, 120, t)


def test_nms_many_boxes(ctx, rng):
    """S = 3000: the sort runs in workgroup-memory chunks and storage passes."""
    boxes = _corners(rng, 1, 3000, span=300.0)
    scores = rng.random((1, 2, 3000))
    _check_nms(ctx, boxes, scores, 3000, 0.5, None)
    _check_nms(ctx, boxes, scores, 100, 0.6, 0.2)


def test_nms_launches(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    sel, cnt = b._nms(
        b.input("b", data_type="float32", shape=[2, 50, 4]),
        b.input("s", data_type="float32", shape=[2, 3, 50]),
        max_per_class=10,
        iou_threshold=0.5,
        score_threshold=0.1,
    )
    assert sel.shape == (60, 3)
    g = b.build_sync({"sel": sel, "cnt": cnt})
    assert g.kernel_names == ["nms_b2c3s50_m10_select", "select_scan_n6", "nms_b2c3s50_m10_scatter"]
    g.destroy()


def test_nms_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    bx = b.input("b", data_type="float32", shape=[1, 5, 4])
    sc = b.input("s", data_type="float32", shape=[1, 2, 5])
    for kw, msg in [
        (dict(iou_threshold=1.5), "iou_threshold"),
        (dict(center_point_box=2), "center_point_box"),
        (dict(max_per_class=1.5), "max_per_class"),
        (dict(score_threshold="x"), "score_threshold"),
    ]:
        with pytest.raises(TypeError, match=msg):
            b._nms(bx, sc, **{"max_per_class": 3, **kw})
    with pytest.raises(TypeError, match="scores"):
        b._nms(bx, b.input("s2", data_type="float32", shape=[1, 2, 6]), max_per_class=3)
    with pytest.raises(TypeError, match="boxes"):
        b._nms(b.input("b2", data_type="float32", shape=[1, 5, 3]), sc, max_per_class=3)
    with pytest.raises(TypeError, match="data type"):
        b._nms(b.input("b3", data_type="float16", shape=[1, 5, 4]), sc, max_per_class=3)


def test_nms_greedy_in_several_launches(ctx, rng, monkeypatch):
    """The greedy pass split across launches (CPU adapters, lavapipe's loop budget): forced
    here with 7 selections a launch."""
    import mltensor.ops.select as select

    monkeypatch.setattr(select, "greedy_cap", lambda S: 7)
    monkeypatch.setattr(select, "cpu_device", lambda device: True)
    boxes = _corners(rng, 2, 60, span=50.0)
    scores = rng.random((2, 3, 60))
    b = mltensor.MLGraphBuilder(ctx)
    sel, cnt = b._nms(
        b.input("b", data_type="float32", shape=[2, 60, 4]),
        b.input("s", data_type="float32", shape=[2, 3, 60]),
        max_per_class=30,
    )
    g = b.build_sync({"sel": sel, "cnt": cnt})
    assert g.kernel_names == (
        ["nms_b2c3s60_m30_select"] + ["nms_b2c3s60_m30_resume"] * 4 + ["select_scan_n6", "nms_b2c3s60_m30_scatter"]
    )
    g.destroy()
    for m, t, st in [(30, 0.3, None), (60, 1.0, None), (8, 0.2, 0.1)]:
        _check_nms(ctx, boxes, scores, m, t, st)


@pytest.mark.slow
def test_nms_many_selected(ctx, rng):
    """12000 boxes, all selected: more loop iterations than lavapipe runs in one invocation,
    hence several launches there."""
    boxes = _centers(rng, 1, 12000, span=2000.0)
    _check_nms(ctx, boxes, rng.random((1, 1, 12000)), 12000, 1.0, None, 1)


@pytest.mark.slow
def test_nms_yolo_sized(ctx, rng):
    """YOLO's 8400 boxes and 80 classes, with and without a score threshold."""
    boxes = _centers(rng, 1, 8400, span=640.0, size=60.0)
    scores = rng.random((1, 80, 8400)).astype(np.float32) ** 8
    _check_nms(ctx, boxes, scores, 100, 0.45, 0.25, 1)
    _check_nms(ctx, boxes, scores[:, :4], 8400, 0.45, None, 1)
