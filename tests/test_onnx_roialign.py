"""ONNX RoiAlign (average mode, fixed sampling ratio) against onnxruntime: both coordinate modes,
boxes partly or wholly outside the feature map, one image and a batch with batch indices, and a
box count read at run time (boxes from NonZero, as the detectors' per-level selection makes)."""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import mltensor
from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _model(n, c, hh, ww, r, **attrs):
    g = h.make_graph(
        [h.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], **attrs)],
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, [n, c, hh, ww]),
            h.make_tensor_value_info("rois", T.FLOAT, [r, 4]),
            h.make_tensor_value_info("bi", T.INT64, [r]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()


def _boxes(rng, r, hh, ww, scale):
    """Boxes in input coordinates (feature map / scale), some past the borders, one degenerate."""
    x1 = rng.uniform(-4, ww / scale, r)
    y1 = rng.uniform(-4, hh / scale, r)
    x2 = x1 + rng.uniform(0, ww / scale, r)
    y2 = y1 + rng.uniform(0, hh / scale, r)
    b = np.stack([x1, y1, x2, y2], 1).astype(np.float32)
    b[0] = [3, 3, 3, 3]
    return b


@pytest.mark.parametrize("chunk", [None, 5000])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("n", [1, 2])
def test_roi_align_against_onnxruntime(ctm, n, chunk, monkeypatch):
    """chunk: regions pooled a few at a time (what keeps Mask R-CNN's 1000 regions over a
    256x80x80 feature map under the tensor size limit), forced here with a small budget."""
    if chunk is not None:
        from mltensor.onnx.ops import roialign

        monkeypatch.setattr(roialign, "CHUNK_BYTES", chunk)
    rng = np.random.default_rng(n)
    c, hh, ww, r, scale = 5, 9, 13, 11, 0.5
    m = _model(
        n, c, hh, ww, r, coordinate_transformation_mode=ctm, output_height=3, output_width=4,
        sampling_ratio=2, spatial_scale=scale,
    )  # fmt: skip
    x = rng.standard_normal((n, c, hh, ww)).astype(np.float32)
    rois = _boxes(rng, r, hh, ww, scale)
    bi = rng.integers(0, n, r).astype(np.int64)
    feeds = {"x": x, "rois": rois, "bi": bi}
    (want,) = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, feeds)
    (got,) = InferenceSession(m, cache=False).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_roi_align_adaptive_sampling_is_refused():
    m = _model(1, 2, 4, 4, 3, sampling_ratio=0)
    with pytest.raises(mltensor.NotSupportedError, match="sampling_ratio 0"):
        InferenceSession(m, cache=False)


def test_roi_align_boxes_counted_at_run_time():
    """Boxes kept by a score threshold (NonZero): the box count is read back at run time."""
    g = h.make_graph(
        [
            h.make_node("Greater", ["s", "t"], ["keep"]),
            h.make_node("NonZero", ["keep"], ["nz"]),
            h.make_node("Squeeze", ["nz", "ax0"], ["idx"]),
            h.make_node("Gather", ["boxes", "idx"], ["rois"], axis=0),
            h.make_node("Gather", ["zeros", "idx"], ["bi"], axis=0),
            h.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], output_height=2, output_width=2, sampling_ratio=2),
        ],
        "g",
        [
            h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8]),
            h.make_tensor_value_info("boxes", T.FLOAT, [6, 4]),
            h.make_tensor_value_info("s", T.FLOAT, [6]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        [
            nh.from_array(np.array(0.5, np.float32), "t"),
            nh.from_array(np.array([0], np.int64), "ax0"),
            nh.from_array(np.zeros(6, np.int64), "zeros"),
        ],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = InferenceSession(m, cache=False)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    boxes = _boxes(rng, 6, 8, 8, 1.0)
    for s in [rng.random(6), np.array([0.9, 0.1, 0.2, 0.8, 0.7, 0.6]), rng.random(6)]:
        feeds = {"x": x, "boxes": boxes, "s": s.astype(np.float32)}
        (got,) = sess.run(None, feeds)
        (want,) = ref.run(None, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ScatterElements", "ScatterND"])
def test_scatter_of_nothing_leaves_the_data(op):
    """torchvision's multi-scale RoIAlign scatters each level's results into place; a level that
    got no region scatters nothing (empty indices and updates, from a selection run)."""
    nodes = [
        h.make_node("Greater", ["s", "t"], ["keep"]),
        h.make_node("NonZero", ["keep"], ["nz"]),
        h.make_node("Transpose", ["nz"], ["col"], perm=[1, 0]),  # [k, 1]
        h.make_node("Squeeze", ["col", "ax1"], ["rows"]),  # [k]
        h.make_node("Gather", ["u", "rows"], ["upd"], axis=0),  # [k, 2]
    ]
    if op == "ScatterElements":
        nodes.append(h.make_node("Concat", ["col", "col"], ["idx"], axis=1))  # [k, 2]
    else:
        nodes.append(h.make_node("Identity", ["col"], ["idx"]))
    nodes.append(h.make_node(op, ["x", "idx", "upd"], ["y"]))
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 2]), h.make_tensor_value_info("s", T.FLOAT, [3])],
        [h.make_tensor_value_info("y", T.FLOAT, [3, 2])],
        [
            nh.from_array(np.array(0.5, np.float32), "t"),
            nh.from_array(np.array([1], np.int64), "ax1"),
            nh.from_array(np.arange(6, dtype=np.float32).reshape(3, 2) + 10, "u"),
        ],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = InferenceSession(m, cache=False)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for sc in ([0.1, 0.2, 0.3], [0.9, 0.1, 0.7], [0.0, 0.0, 0.0]):
        feeds = {"x": x, "s": np.array(sc, np.float32)}
        (got,) = sess.run(None, feeds)
        (want,) = ref.run(None, feeds)
        np.testing.assert_array_equal(got, want)
