"""Issue 27, data-dependent shapes and executed loops (mltensor/stages/): what they cost, beside
onnxruntime CPU and beside the alternatives, in the same run.

- greedy decoder (tests/test_stages_models.py): a Loop of at most 1024 iterations whose end token
  is computed on the GPU, at a source that decodes all 1024 and one that stops after a few;
  against onnxruntime CPU. Recorded: the host round trips per run against the target n/8 + 1.
- executed vs unrolled: one 64-iteration Loop with a trip count known at load (a 64-wide MLP
  body), unrolled (the importer's choice up to 256) against executed (forced). Supports the
  unroll limit: unrolling should be no slower.
- detector (tests/test_stages_models.py): NonMaxSuppression and TopK in the graph, 64x64
  image; against onnxruntime CPU. Recorded: the bytes read back to decide shapes per run
  (target: only the sizes: 4 bytes for NMS's count).
- NonZero over 1M elements: the count read back (4 bytes) against reading the mask back and
  compacting on the host (the way without a GPU compaction), same session path.
Each timed pair also checks its results against onnxruntime (no timed assertions).
"""

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from mltensor import InferenceSession

from .timing import adapter_name, measure_pair, record

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_stages_models import greedy_decoder, tiny_detector  # noqa: E402

ort = pytest.importorskip("onnxruntime")


def _pair(model, ctx):
    b = model.SerializeToString()
    return InferenceSession(b, ctx, cache=False), ort.InferenceSession(b, providers=["CPUExecutionProvider"])


def _same(got, want):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("which", ["1024 tokens", "early end"])
def test_greedy_decoder_loop(benchmark, ctx, which):
    sess, ref = _pair(greedy_decoder(), ctx)
    rng = np.random.default_rng(5)  # (as the test: source 0 decodes 1024 tokens, source 10 stops at 4)
    srcs = [(rng.standard_normal((1, n, 16)) * (0.5 + k)).astype(np.float32) for n in (5, 9, 5, 9, 7) for k in range(3)]
    x = srcs[0] if which == "1024 tokens" else srcs[10]
    feeds = {"src": x}
    _same(sess.run(None, feeds), ref.run(None, feeds))
    n = len(ref.run(None, feeds)[1])
    before = sess.stats["readbacks"]
    sess.run(None, feeds)
    trips = sess.stats["readbacks"] - before  # the loop's waits (no other cut in this model)
    ours, theirs, ratio = measure_pair(
        (lambda: sess.run(None, feeds), None), (lambda: ref.run(None, feeds), None), rounds=7, warmup=1
    )
    info = record(
        benchmark,
        ours,
        f"stages: greedy decoder loop, {which}",
        theirs,
        "onnxruntime CPU",
        adapter=adapter_name(ctx),
        iterations=n,
        round_trips=trips,
        round_trip_target=n / 8 + 1,
        ms_per_iteration=ours["total_s"] / n * 1e3,
    )
    assert info["ratio"] > 0 and trips <= n / 8 + 1


def _mlp_loop(trips):
    body = h.make_graph(
        [
            h.make_node("MatMul", ["h_in", "W"], ["hw"]),
            h.make_node("Add", ["hw", "x"], ["hx"]),
            h.make_node("Tanh", ["hx"], ["h_out"]),
            h.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("c_in", T.BOOL, []),
            h.make_tensor_value_info("h_in", T.FLOAT, [1, 64]),
        ],
        [
            h.make_tensor_value_info("c_out", T.BOOL, []),
            h.make_tensor_value_info("h_out", T.FLOAT, [1, 64]),
            h.make_tensor_value_info("hw", T.FLOAT, [1, 64]),
        ],
    )
    W = (np.random.default_rng(0).standard_normal((64, 64)) * 0.1).astype(np.float32)
    g = h.make_graph(
        [h.make_node("Loop", ["M", "", "h0"], ["hf", "hs"], body=body)],
        "g",
        [h.make_tensor_value_info("h0", T.FLOAT, [1, 64]), h.make_tensor_value_info("x", T.FLOAT, [1, 64])],
        [h.make_tensor_value_info("hf", T.FLOAT, None), h.make_tensor_value_info("hs", T.FLOAT, None)],
        [h.make_tensor("M", T.INT64, [], [trips]), h.make_tensor("W", T.FLOAT, [64, 64], W.ravel())],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def test_unrolled_vs_executed_loop(benchmark, ctx, monkeypatch):
    import mltensor.onnx.ops.control_flow as cf

    m = _mlp_loop(64)
    unrolled, ref = _pair(m, ctx)
    monkeypatch.setattr(cf, "MAX_UNROLL", 0)
    executed, _ = _pair(m, ctx)
    feeds = {"h0": np.ones((1, 64), np.float32), "x": np.full((1, 64), 0.1, np.float32)}
    want = ref.run(None, feeds)
    _same(unrolled.run(None, feeds), want)
    _same(executed.run(None, feeds), want)
    assert executed.stats["stage_builds"] == 1 and unrolled.stats["stage_builds"] == 0
    ours, theirs, ratio = measure_pair(
        (lambda: unrolled.run(None, feeds), None), (lambda: executed.run(None, feeds), None), rounds=9, warmup=1
    )
    record(
        benchmark,
        ours,
        "stages: 64-iteration loop, unrolled",
        theirs,
        "the same loop executed",
        adapter=adapter_name(ctx),
    )


def test_detector_with_nms(benchmark, ctx):
    sess, ref = _pair(tiny_detector(), ctx)
    img = (np.random.default_rng(0).standard_normal((1, 3, 64, 64)) * 1.0).astype(np.float32)
    feeds = {"img": img}
    _same(sess.run(None, feeds), ref.run(None, feeds))
    b0, r0 = sess.stats["readback_bytes"], sess.stats["readbacks"]
    sess.run(None, feeds)
    nbytes, reads = sess.stats["readback_bytes"] - b0, sess.stats["readbacks"] - r0
    ours, theirs, ratio = measure_pair(
        (lambda: sess.run(None, feeds), None), (lambda: ref.run(None, feeds), None), rounds=9, warmup=1
    )
    record(
        benchmark,
        ours,
        "stages: detector with NMS and TopK in the graph (64x64)",
        theirs,
        "onnxruntime CPU",
        adapter=adapter_name(ctx),
        readback_bytes_per_run=nbytes,
        readbacks_per_run=reads,
    )
    assert nbytes == 4 * reads


def test_nonzero_count_vs_host_compaction(benchmark, ctx):
    n = 1 << 20
    m = h.make_model(
        h.make_graph(
            [
                h.make_node("Greater", ["x", "t"], ["mask"]),
                h.make_node("NonZero", ["mask"], ["nz"]),
                h.make_node("ReduceSum", ["nz"], ["s"], keepdims=0),
            ],
            "g",
            [h.make_tensor_value_info("x", T.FLOAT, [n]), h.make_tensor_value_info("t", T.FLOAT, [])],
            [h.make_tensor_value_info("s", T.INT64, None)],
        ),
        opset_imports=[h.make_opsetid("", 17)],
        ir_version=8,
    )
    sess, ref = _pair(m, ctx)
    # the way without the GPU compaction: the mask read back, compacted on the host
    mask_m = h.make_model(
        h.make_graph(
            [h.make_node("Greater", ["x", "t"], ["mask"])],
            "g",
            [h.make_tensor_value_info("x", T.FLOAT, [n]), h.make_tensor_value_info("t", T.FLOAT, [])],
            [h.make_tensor_value_info("mask", T.BOOL, None)],
        ),
        opset_imports=[h.make_opsetid("", 17)],
        ir_version=8,
    )
    mask_sess = InferenceSession(mask_m.SerializeToString(), ctx, cache=False)
    feeds = {"x": np.random.default_rng(0).standard_normal(n).astype(np.float32), "t": np.array(1.0, np.float32)}
    _same(sess.run(None, feeds), ref.run(None, feeds))

    def host_way():
        (mask,) = mask_sess.run(None, feeds)
        return np.nonzero(mask)[0].sum()

    assert host_way() == ref.run(None, feeds)[0]
    b0 = sess.stats["readback_bytes"]
    sess.run(None, feeds)
    nbytes = sess.stats["readback_bytes"] - b0
    ours, theirs, ratio = measure_pair((lambda: sess.run(None, feeds), None), (host_way, None), rounds=9, warmup=1)
    record(
        benchmark,
        ours,
        "stages: NonZero of 1M elements (count read back)",
        theirs,
        "mask read back, compacted on the host",
        adapter=adapter_name(ctx),
        readback_bytes_per_run=nbytes,
        host_way_bytes=n,
    )
    assert nbytes == 4


@pytest.mark.parametrize("which", ["detector", "nonzero 4096", "executed loop, 300 iterations"])
def test_stage_tensors_pooled_vs_allocated(benchmark, ctx, which):
    """The steady per-run time of a staged model with each stage's output tensors (and an
    executed loop's) taken from pools (stages/pool.py) against the same model allocating and
    destroying them every run (the pools turned off: pool.POOL = 0), same run, alternated round
    by round."""
    import mltensor.stages.pool as pool

    if which.startswith("executed"):  # (past the unroll limit: executed)
        m = _mlp_loop(300)
        feeds = {"h0": np.ones((1, 64), np.float32), "x": np.full((1, 64), 0.1, np.float32)}
    elif which == "detector":
        m = tiny_detector()
        feeds = {"img": (np.random.default_rng(0).standard_normal((1, 3, 64, 64))).astype(np.float32)}
    else:
        n = 4096
        nodes = [
            h.make_node("Greater", ["x", "t"], ["mask"]),
            h.make_node("NonZero", ["mask"], ["nz"]),
            h.make_node("ReduceSum", ["nz"], ["s"], keepdims=0),
        ]
        ins = [h.make_tensor_value_info("x", T.FLOAT, [n]), h.make_tensor_value_info("t", T.FLOAT, [])]
        m = h.make_model(
            h.make_graph(nodes, "g", ins, [h.make_tensor_value_info("s", T.INT64, None)]),
            opset_imports=[h.make_opsetid("", 17)],
            ir_version=8,
        )
        feeds = {"x": np.random.default_rng(0).standard_normal(n).astype(np.float32), "t": np.array(1.0, np.float32)}
    pooled, ref = _pair(m, ctx)
    fresh = InferenceSession(m.SerializeToString(), ctx, cache=False)
    size = pool.POOL
    want = ref.run(None, feeds)

    def run_pooled():
        pool.POOL = size
        return pooled.run(None, feeds)

    def run_fresh():
        pool.POOL = 0
        return fresh.run(None, feeds)

    try:
        _same(run_pooled(), want)
        _same(run_fresh(), want)
        ours, theirs, ratio = measure_pair((run_pooled, None), (run_fresh, None), rounds=15, warmup=2)
    finally:
        pool.POOL = size
    record(
        benchmark,
        ours,
        f"stages: stage tensors pooled, {which}",
        theirs,
        "allocated every run (no pool)",
        adapter=adapter_name(ctx),
    )
