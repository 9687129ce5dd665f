"""Shape-polymorphic InferenceSession: any input size the model allows, one build per combination
of sizes kept in a bounded LRU cache; every size checked against onnxruntime."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import mltensor
from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _convnet():
    """x[N, 3, 8, W] -> conv3x3 -> relu -> features (reshaped with Shape/Concat, as exporters do)
    and a global-pool + gemm head; N and W are symbolic."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    fc = rng.standard_normal((4, 5)).astype(np.float32)
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(fc, "fc"),
        numpy_helper.from_array(np.array([-1], np.int64), "m1"),
        numpy_helper.from_array(np.array([0], np.int64), "z0"),
        numpy_helper.from_array(np.array([1], np.int64), "o1"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "z0", "o1"], ["n"]),
        helper.make_node("Concat", ["n", "m1"], ["flat_shape"], axis=0),
        helper.make_node("Reshape", ["r", "flat_shape"], ["feat"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["pf"]),
        helper.make_node("MatMul", ["pf", "fc"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, "W"])],
        [
            helper.make_tensor_value_info("feat", TensorProto.FLOAT, ["N", None]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 5]),
        ],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def model():
    return _convnet()


@pytest.fixture(scope="module")
def ref(model):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return lambda x: s.run(None, {"x": x})


def _check(sess, ref, n, w, rng):
    x = rng.standard_normal((n, 3, 8, w)).astype(np.float32)
    got = sess.run(None, {"x": x})
    want = ref(x)
    for g, r in zip(got, want):
        assert g.shape == r.shape
        assert g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


def _counts(sess):
    st = sess.stats
    return {k: st[k] for k in ("builds", "hits", "evictions", "specializations")}


def test_any_batch_and_width_with_lru_eviction(ctx, model, ref, rng):
    """One build per size (dynamic=False: by default N and W are dynamic dimensions and one build
    serves every size but 1, see test_dynamic_conv.py and test_dynamic_session.py)."""
    sess = InferenceSession(model, ctx, max_specializations=2, dynamic=False)
    assert sess.specializations == 0
    _check(sess, ref, 1, 16, rng)
    _check(sess, ref, 2, 8, rng)
    _check(sess, ref, 1, 16, rng)  # cached
    assert _counts(sess) == {"builds": 2, "hits": 1, "evictions": 0, "specializations": 2}
    _check(sess, ref, 3, 12, rng)  # evicts (2, 8), the least recently used
    assert _counts(sess) == {"builds": 3, "hits": 1, "evictions": 1, "specializations": 2}
    _check(sess, ref, 1, 16, rng)  # still cached
    _check(sess, ref, 2, 8, rng)  # rebuilt, evicts (3, 12)
    assert _counts(sess) == {"builds": 4, "hits": 2, "evictions": 2, "specializations": 2}
    assert sess.stats["dynamic"] is False and sess.stats["static_reason"] == "dynamic=False"
    assert sess.get_inputs()[0].shape == ["N", 3, 8, "W"]
    sess.close()
    assert sess.specializations == 0


def test_each_size_keeps_its_tensors(ctx, model, ref, rng):
    """Alternating between two cached sizes allocates nothing: tensors are cached per size."""
    sess = InferenceSession(model, ctx)
    a = rng.standard_normal((1, 3, 8, 16)).astype(np.float32)
    b = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    sess.run(None, {"x": a})
    sess.run(None, {"x": b})
    before = ctx.counters["tensors_alive"]
    for x in (a, b, a, b):
        got = sess.run(None, {"x": x})
        np.testing.assert_allclose(got[1], ref(x)[1], rtol=1e-4, atol=1e-4)
    assert ctx.counters["tensors_alive"] == before
    assert sess.stats["builds"] == 2
    sess.close()


def test_evicted_specialization_frees_its_tensors(ctx, model, rng):
    sess = InferenceSession(model, ctx, max_specializations=1)
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    (t,) = sess.run(["logits"], {"x": x}, output_location="ml-tensor")
    sess.run(None, {"x": np.zeros((2, 3, 8, 8), np.float32)})
    assert t._destroyed  # documented: eviction destroys that size's tensors
    assert sess.specializations == 1
    sess.close()


def test_free_dimensions_still_pin(ctx, model, ref, rng):
    sess = InferenceSession(model, ctx, free_dimensions={"N": 1})
    assert sess.specializations == 0  # W is still open: built at the first run
    _check(sess, ref, 1, 8, rng)
    _check(sess, ref, 1, 12, rng)
    with pytest.raises(TypeError, match=r"input 'x' must have shape \[1, 3, 8, 'W'\], got \[2, 3, 8, 8\]"):
        sess.run(None, {"x": np.zeros((2, 3, 8, 8), np.float32)})
    with pytest.raises(TypeError, match=r"input 'x' must have shape"):
        sess.run(None, {"x": np.zeros((1, 3, 9, 8), np.float32)})
    assert sess.specializations == 1  # W (8, 12) is dynamic: one build for both
    pinned = InferenceSession(model, ctx, free_dimensions={"N": 2, "W": 8})
    assert pinned.specializations == 1  # everything fixed: built at creation
    _check(pinned, ref, 2, 8, rng)
    assert pinned.stats["builds"] == 1


def test_max_specializations_is_validated(ctx, model):
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(TypeError, match="max_specializations"):
            InferenceSession(model, ctx, max_specializations=bad)


def test_shape_input_values_specialize_too(ctx, rng):
    """An input used as a shape is part of the key: each new value is a new build."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sess = InferenceSession(m, ctx)
    x = rng.standard_normal(12).astype(np.float32)
    for shp in ([3, 4], [2, 6], [3, 4]):
        (y,) = sess.run(None, {"x": x, "shape": np.array(shp, np.int64)})
        np.testing.assert_array_equal(y, x.reshape(shp))
    x8 = rng.standard_normal(8).astype(np.float32)
    (y,) = sess.run(None, {"x": x8, "shape": np.array([2, 4], np.int64)})
    np.testing.assert_array_equal(y, x8.reshape(2, 4))
    assert sess.stats["builds"] == 3 and sess.stats["hits"] == 1
    assert isinstance(sess.graph, mltensor.MLGraph)


async def test_run_async_at_two_sizes_concurrently(ctx, model, ref, rng):
    import asyncio

    sess = InferenceSession(model, ctx)
    a = rng.standard_normal((1, 3, 8, 16)).astype(np.float32)
    b = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    ra, rb = await asyncio.gather(sess.run_async(None, {"x": a}), sess.run_async(None, {"x": b}))
    for got, x in ((ra, a), (rb, b)):
        for g, w in zip(got, ref(x)):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    sess.close()


@pytest.mark.parametrize(
    "mode,ctm,nearest,scale,one_build",
    [
        ("nearest", "asymmetric", "floor", 2.0, True),
        ("linear", "half_pixel", "", 2.0, True),
        ("nearest", "half_pixel", "round_prefer_floor", 4.0, True),
        ("linear", "half_pixel", "", 0.5, False),
        ("linear", "half_pixel", "", 1.5, False),
        ("nearest", "asymmetric", "round_prefer_floor", 2.0, False),
    ],
)
def test_resize_by_scales_of_dynamic_sizes(ctx, rng, mode, ctm, nearest, scale, one_build):
    """Resize by constant scales (a detector's FPN: x2 upsampling, then an add with the finer
    level; PP-OCR's det) on symbolic H and W: the output size floor(n * scale) is a size
    expression, so where WebNN's resample2d computes what ONNX asks (integer scales, its
    coordinate modes) one build serves every size; the rest takes the interpolation matrices
    of the static path, a build per size as before. Every size against onnxruntime."""
    kw = {"nearest_mode": nearest} if nearest else {}
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, coordinate_transformation_mode=ctm, **kw),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    sc = numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales")
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, "H", "W"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [sc],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(m, ctx, cache=False)
    sizes = [(6, 8), (10, 6), (7, 9), (6, 8)]
    for h, w in sizes:
        x = rng.standard_normal((1, 2, h, w)).astype(np.float32)
        (got,), (want,) = sess.run(None, {"x": x}), ref.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert sess.stats["dynamic"] is one_build, sess.stats["static_reason"]
    assert sess.stats["builds"] == (1 if one_build else len(set(sizes)))
