"""Whole models with data-dependent shapes, built in the tests as their libraries export them, at
two input sizes in one session, against onnxruntime: a greedy decoder whose Loop (1024 at most)
stops on an end token computed on the GPU, and a detector with its NonMaxSuppression in the
graph. (The small 3-D CNN is in test_onnx_3d.py.)"""

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _vi(name, et, shape):
    return h.make_tensor_value_info(name, et, shape)


def greedy_decoder(V=12, H=32, D=16, eos=0, max_len=1024, seed=0):
    """An encoder over a source of any length (mean of tanh(src W)), then a Loop decoding greedily:
    h = tanh(h Wh + E[token] + context), token = argmax(h Wo), until the end token or max_len.
    The context is read by the body from the enclosing graph; tokens are the scan output. Wh is
    contracting and Wo's margins wide, so float rounding never flips a token."""
    rng = np.random.default_rng(seed)

    def f(*s):
        return (rng.standard_normal(s) * 0.7).astype(np.float32)

    body = h.make_graph(
        [
            h.make_node("Gather", ["E", "tok_in"], ["emb"], axis=0),
            h.make_node("MatMul", ["h_in", "Wh"], ["hh"]),
            h.make_node("Add", ["hh", "emb"], ["a1"]),
            h.make_node("Add", ["a1", "ctx"], ["a2"]),
            h.make_node("Tanh", ["a2"], ["h_out"]),
            h.make_node("MatMul", ["h_out", "Wo"], ["logits"]),
            h.make_node("ArgMax", ["logits"], ["tok_out"], axis=1, keepdims=0),
            h.make_node("Equal", ["tok_out", "eos"], ["is_eos"]),
            h.make_node("Not", ["is_eos"], ["go"]),
            h.make_node("Squeeze", ["go"], ["cond_out"]),
            h.make_node("Identity", ["tok_out"], ["tok_scan"]),
        ],
        "body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("h_in", T.FLOAT, [1, H]), _vi("tok_in", T.INT64, [1])],
        [
            _vi("cond_out", T.BOOL, []),
            _vi("h_out", T.FLOAT, [1, H]),
            _vi("tok_out", T.INT64, [1]),
            _vi("tok_scan", T.INT64, [1]),
        ],
    )
    nodes = [
        h.make_node("MatMul", ["src", "We"], ["enc0"]),
        h.make_node("Tanh", ["enc0"], ["enc"]),
        h.make_node("ReduceMean", ["enc"], ["ctx"], axes=[1], keepdims=0),
        h.make_node("Loop", ["M", "c0", "ctx", "bos"], ["h_final", "last", "tokens"], body=body),
    ]
    inits = [
        nh.from_array(f(D, H), "We"),
        nh.from_array(f(V, H), "E"),
        nh.from_array(f(H, H) * 0.15, "Wh"),
        nh.from_array(f(H, V) * 4, "Wo"),
        nh.from_array(np.array(max_len, np.int64), "M"),
        nh.from_array(np.array(True), "c0"),
        nh.from_array(np.array([1], np.int64), "bos"),
        nh.from_array(np.array([eos], np.int64), "eos"),
    ]
    g = h.make_graph(
        nodes,
        "decoder",
        [_vi("src", T.FLOAT, [1, "seq", D])],
        [_vi("h_final", T.FLOAT, None), _vi("tokens", T.INT64, None)],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _decode_cases(sess, ref, cases):
    lengths = []
    for x in cases:
        got = sess.run(None, {"src": x})
        want = ref.run(None, {"src": x})
        np.testing.assert_array_equal(got[1], want[1])  # identical tokens
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
        lengths.append(len(want[1]))
    return lengths


def _sources(rng, lengths):
    return [(rng.standard_normal((1, n, 16)) * s).astype(np.float32) for n, s in lengths]


def test_greedy_decoder_loop_two_source_lengths(rng):
    m = greedy_decoder().SerializeToString()
    sess = InferenceSession(m, cache=False)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    # sources drawn so that runs stop early (4, 5, 2 tokens) or run to 1024, at lengths 5, 9, 7
    srcs = _sources(np.random.default_rng(5), [(n, 0.5 + k) for n in (5, 9, 5, 9, 7) for k in range(3)])
    picked = [srcs[i] for i in (0, 7, 10, 13, 12)]
    lengths = _decode_cases(sess, ref, picked)
    assert max(lengths) == 1024 and min(lengths) < 10
    assert sess.stats["builds"] == 3  # one per source length (the loop is cut: no dynamic build)
    # the rest after the loop takes the token count as a dynamic dimension: one build per source
    # length for every count
    assert sess.stats["stage_builds"] == len({x.shape[1] for x in picked})
    assert sess._spec.stage.cut.dynamic_ok


@pytest.mark.slow
def test_greedy_decoder_loop_many_runs(rng):
    m = greedy_decoder(seed=3).SerializeToString()
    sess = InferenceSession(m, cache=False)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    _decode_cases(sess, ref, _sources(rng, [(n, s) for n in (3, 11, 3) for s in (0.3, 1, 2, 4)]))


def tiny_detector(C=3, seed=0):
    """A single-shot detector exported with its post-processing in the graph, as torchvision and
    YOLO exports have it: conv features, per-location boxes and class scores, NonMaxSuppression,
    the kept boxes and scores gathered by the selected indices, then the best 10 by TopK with
    k = min(kept, 10) computed from the kept count."""
    rng = np.random.default_rng(seed)

    def w(*s):
        return (rng.standard_normal(s) * 0.4).astype(np.float32)

    def init(name, arr):
        t = nh.from_array(np.asarray(arr))
        t.name = name
        return t

    inits = [
        init("w1", w(8, 3, 3, 3)),
        init("w2", w(8, 8, 3, 3)),
        init("wb", w(4, 8, 1, 1)),
        init("wc", w(C, 8, 1, 1)),
        init("shape_b", np.array([1, 4, -1], np.int64)),
        init("shape_c", np.array([1, C, -1], np.int64)),
        init("max_out", np.array([20], np.int64)),
        init("iou", np.array([0.5], np.float32)),
        init("score_thr", np.array([0.75], np.float32)),
        init("ten", np.array([10], np.int64)),
        init("one", np.array(1, np.int64)),
        init("two", np.array(2, np.int64)),
        init("zero", np.array(0, np.int64)),
        init("scale", np.array([40.0], np.float32)),
    ]
    nodes = [
        h.make_node("Conv", ["img", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("Relu", ["c2"], ["feat"]),
        h.make_node("Conv", ["feat", "wb"], ["braw"]),
        h.make_node("Reshape", ["braw", "shape_b"], ["b3"]),
        h.make_node("Transpose", ["b3"], ["bt"], perm=[0, 2, 1]),
        h.make_node("Sigmoid", ["bt"], ["bs"]),
        h.make_node("Mul", ["bs", "scale"], ["boxes"]),
        h.make_node("Conv", ["feat", "wc"], ["craw"]),
        h.make_node("Reshape", ["craw", "shape_c"], ["c3"]),
        h.make_node("Sigmoid", ["c3"], ["scores"]),
        h.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_thr"], ["sel"]),
        h.make_node("Gather", ["sel", "two"], ["box_i"], axis=1),
        h.make_node("Gather", ["sel", "one"], ["labels_all"], axis=1),
        h.make_node("Gather", ["boxes", "zero"], ["boxes0"], axis=0),
        h.make_node("Gather", ["boxes0", "box_i"], ["kept"], axis=0),
        h.make_node("GatherND", ["scores", "sel"], ["kept_scores"]),
        h.make_node("Shape", ["kept_scores"], ["n_kept"]),
        h.make_node("Min", ["n_kept", "ten"], ["k"]),
        h.make_node("TopK", ["kept_scores", "k"], ["top_scores", "top_i"]),
        h.make_node("Gather", ["kept", "top_i"], ["top_boxes"], axis=0),
        h.make_node("Gather", ["labels_all", "top_i"], ["top_labels"], axis=0),
    ]
    g = h.make_graph(
        nodes,
        "detector",
        [_vi("img", T.FLOAT, [1, 3, "h", "w"])],
        [_vi("top_boxes", T.FLOAT, None), _vi("top_scores", T.FLOAT, None), _vi("top_labels", T.INT64, None)],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_detector_with_nms_in_the_graph_two_image_sizes():
    rng = np.random.default_rng(0)  # images giving 0, a few and more than 10 detections
    m = tiny_detector().SerializeToString()
    sess = InferenceSession(m, cache=False)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    counts = []
    for hw in [(32, 48), (64, 64), (32, 48)]:
        for scale in (0.3, 1.0, 0.0):
            img = (rng.standard_normal((1, 3) + hw) * scale).astype(np.float32)
            got = sess.run(None, {"img": img})
            want = ref.run(None, {"img": img})
            for g, w_ in zip(got, want):
                assert g.shape == w_.shape and g.dtype == w_.dtype
            np.testing.assert_array_equal(got[2], want[2])  # identical labels, boxes and scores
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
            counts.append(len(want[1]))
    assert len(set(counts)) > 1  # different numbers of detections
    st = sess.stats
    assert st["readback_bytes"] == 4 * st["readbacks"]  # only NMS's count crossed before the outputs


def test_if_whose_branch_cuts_keeps_its_condition():
    """torchvision's batched NMS: If(no boxes) then an empty constant else NonMaxSuppression...
    A selection inside a branch cuts the import; the import resumes at the If, whose condition
    must still be there (the branch node's dropped inputs are its own, not the If's: SSDlite's
    export failed on exactly this)."""
    then_g = h.make_graph(
        [h.make_node("Constant", [], ["t"], value=nh.from_array(np.zeros(0, np.int64)))],
        "then",
        [],
        [_vi("t", T.INT64, [0])],
    )
    else_g = h.make_graph(
        [
            h.make_node("Greater", ["x", "zero"], ["pos"]),
            h.make_node("NonZero", ["pos"], ["nz"]),
            h.make_node("Squeeze", ["nz", "ax0"], ["e"]),
        ],
        "else",
        [],
        [_vi("e", T.INT64, ["n"])],
    )
    g = h.make_graph(
        [
            h.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
            h.make_node("Less", ["mx", "zero"], ["none"]),
            h.make_node("If", ["none"], ["idx"], then_branch=then_g, else_branch=else_g),
            h.make_node("Gather", ["x", "idx"], ["y"]),
        ],
        "g",
        [_vi("x", T.FLOAT, [8])],
        [_vi("y", T.FLOAT, None)],
        [nh.from_array(np.array(0, np.float32), "zero"), nh.from_array(np.array([0], np.int64), "ax0")],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = InferenceSession(m, cache=False)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for x in [rng.standard_normal(8), -np.abs(rng.standard_normal(8)) - 0.1, rng.standard_normal(8)]:
        x = x.astype(np.float32)
        (got,) = sess.run(None, {"x": x})
        (want,) = ref.run(None, {"x": x})
        np.testing.assert_array_equal(got, want)


def test_flatten_of_an_empty_selection():
    """RetinaNet's per-level boxes: a selection that found nothing leaves an empty host array,
    which onnx.reference's Flatten cannot reshape; ONNX shape inference gives the empty result."""
    g = h.make_graph(
        [
            h.make_node("Greater", ["x", "t"], ["big"]),
            h.make_node("NonZero", ["big"], ["nz"]),
            h.make_node("Transpose", ["nz"], ["tr"], perm=[1, 0]),
            h.make_node("Unsqueeze", ["tr", "ax1"], ["u"]),
            h.make_node("Flatten", ["u"], ["y"], axis=1),
        ],
        "g",
        [_vi("x", T.FLOAT, [8])],
        [_vi("y", T.INT64, None)],
        [nh.from_array(np.array(1.0, np.float32), "t"), nh.from_array(np.array([1], np.int64), "ax1")],
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString()
    sess = InferenceSession(m, cache=False)
    ref = ort.InferenceSession(m, providers=["CPUExecutionProvider"])
    for x in [np.zeros(8), np.arange(8) - 3.0, np.zeros(8)]:
        x = x.astype(np.float32)
        (got,) = sess.run(None, {"x": x})
        (want,) = ref.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
