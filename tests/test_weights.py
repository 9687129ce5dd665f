"""Weights held once: read in place from the model file (onnx/weights.py), uploaded once per
context and shared by every graph binding the same bytes (runtime/constants.py), host copies
released once uploaded."""

import gc
import os
import threading
import weakref

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mltensor
from mltensor import InferenceSession, ml
from mltensor.models_synthetic import vit
from mltensor.onnx import weights as W
from mltensor.onnx.model import load_model

ort = pytest.importorskip("onnxruntime")

SMALL_VIT = dict(layers=2, hidden=64, heads=2, mlp=128, image=32, patch=8, classes=10)


def _ort(model, feeds):
    src = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, feeds)


def _weight_bytes(model_bytes):
    m = onnx.load_model_from_string(model_bytes)
    return sum(numpy_helper.to_array(t).nbytes for t in m.graph.initializer)


@pytest.fixture
def pixels(rng):
    return rng.random((2, 3, 32, 32), dtype=np.float32)


def _mixed_model():
    """Initializers of every kind the loader meets: big float32 / float16 / int64 / bool /
    bfloat16 raw_data (moved out), small ones (kept), float_data (typed field, kept)."""
    rng = np.random.default_rng(3)
    big = rng.standard_normal((64, 32)).astype(np.float32)
    inits = [
        numpy_helper.from_array(big, "W"),  # 8 KiB raw
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float16).repeat(40), "H"),  # 2.5 KiB
        numpy_helper.from_array(np.arange(300, dtype=np.int64) % 32, "idx"),  # 2.4 KiB
        numpy_helper.from_array(np.arange(1280) % 3 == 0, "mask"),  # 1.25 KiB bool
        numpy_helper.from_array(np.float32([0.5]), "half"),  # small: kept
        helper.make_tensor(
            "bf",
            TensorProto.BFLOAT16,
            [600],
            raw=True,  # raw bytes: converted on read
            vals=(np.linspace(-2, 2, 600).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes(),
        ),
        helper.make_tensor("typed", TensorProto.FLOAT, [32], rng.standard_normal(32).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Mul", ["xw", "half"], ["a"]),
        helper.make_node("Add", ["a", "typed"], ["y"]),
        helper.make_node("Gather", ["H", "idx"], ["h"], axis=0),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["bf"], ["b32"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["h"], ["h32"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["m"], ["ms"], keepdims=0),
        helper.make_node("ReduceSum", ["b32"], ["bs"], keepdims=0),
        helper.make_node("Add", ["ms", "bs"], ["s"]),
    ]
    g = helper.make_graph(
        nodes,
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32]),
            helper.make_tensor_value_info("h32", TensorProto.FLOAT, [300]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
        ],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_strip_moves_big_raw_data_out_and_reads_it_back_in_place(tmp_path):
    m = _mixed_model()
    data = m.SerializeToString()
    stripped, index = W.strip(data)
    assert len(stripped) < len(data) - 12000
    moved = {
        t.name
        for t in onnx.load_model_from_string(stripped).graph.initializer
        if t.data_location == TensorProto.EXTERNAL
    }
    assert moved == {"W", "H", "idx", "mask", "bf"}  # not the small one, not the typed field
    assert len(index) == 5
    p = tmp_path / "mixed.onnx"
    p.write_bytes(data)
    for source in (str(p), data):
        model, weights = load_model(source)
        from mltensor.onnx.importer import Importer

        im = Importer(model, ml.create_context_sync(), weights=weights)
        for t in m.graph.initializer:
            got = im._tensor(next(u for u in model.graph.initializer if u.name == t.name))
            want = numpy_helper.to_array(t)
            assert got.dtype == want.dtype and got.shape == want.shape, t.name
            np.testing.assert_array_equal(got, want, err_msg=t.name)
            if t.name in ("W", "H", "idx", "mask"):  # numpy views: read in place, not copied
                assert not got.flags.owndata and not got.flags.writeable, t.name


def test_models_read_in_place_match_onnxruntime(ctx, rng, tmp_path):
    m = _mixed_model()
    x = rng.standard_normal((2, 64)).astype(np.float32)
    want = _ort(m, {"x": x})
    p = tmp_path / "mixed.onnx"
    onnx.save(m, str(p))
    ext = tmp_path / "ext.onnx"
    onnx.save(
        onnx.ModelProto.FromString(m.SerializeToString()),
        str(ext),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.bin",
        size_threshold=0,
    )
    for source in (str(p), m.SerializeToString(), bytearray(m.SerializeToString()), m, str(ext)):
        got = InferenceSession(source, ctx).run(None, {"x": x})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_further_input_size_adds_no_constant_bytes(fresh_ctx, pixels):
    """One graph per size (dynamic=False): the second size binds the first one's weights."""
    model = vit(**SMALL_VIT)
    sess = InferenceSession(model, fresh_ctx, dynamic=False)
    y1 = sess.run(None, {"pixel_values": pixels[:1]})[0]
    c1 = fresh_ctx.counters
    y2 = sess.run(None, {"pixel_values": pixels})[0]
    c2 = fresh_ctx.counters
    assert sess.stats["builds"] == 2
    weights = _weight_bytes(model)
    assert c1["constant_bytes"] > 0.9 * weights
    # what the second size adds is the class token the importer broadcast to the batch on the
    # host (Expand of a constant, 2 x 64 floats), never the weights
    added = c2["constant_bytes"] - c1["constant_bytes"]
    assert 0 <= added <= 512, added
    # uploaded: the feed, that class token, and scalars only the build reads (the attention
    # scale a fused kernel takes as a parameter: released after the build, uploaded again by
    # the next): never the weights
    extra = c2["bytes_uploaded"] - c1["bytes_uploaded"] - pixels.nbytes - added
    assert 0 <= extra <= 64, extra
    graphs = [spec.graph for spec in sess._specs.values()]
    assert abs(graphs[0].memory["constants"] - graphs[1].memory["constants"]) <= 512
    want = _ort(model, {"pixel_values": pixels})[0]
    np.testing.assert_allclose(y1, want[:1], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y2, want, rtol=1e-4, atol=1e-5)


def test_sessions_of_one_model_share_until_the_last_is_closed(fresh_ctx, pixels, tmp_path):
    p = tmp_path / "vit.onnx"
    p.write_bytes(vit(**SMALL_VIT))
    want = _ort(str(p), {"pixel_values": pixels})[0]
    a = InferenceSession(str(p), fresh_ctx)
    a.run(None, {"pixel_values": pixels})
    held = fresh_ctx.counters["constant_bytes"]
    b = InferenceSession(str(p), fresh_ctx)
    up = fresh_ctx.counters["bytes_uploaded"]
    b.run(None, {"pixel_values": pixels})
    assert fresh_ctx.counters["constant_bytes"] == held
    assert fresh_ctx.counters["bytes_uploaded"] - up == pixels.nbytes
    a.close()
    del a
    gc.collect()
    assert fresh_ctx.counters["constant_bytes"] == held  # b still binds them
    np.testing.assert_allclose(b.run(None, {"pixel_values": pixels})[0], want, rtol=1e-4, atol=1e-5)
    b.close()
    fresh_ctx.flush()
    assert fresh_ctx.counters["constant_bytes"] == 0


def test_constants_used_only_at_build_are_given_back(fresh_ctx):
    """A constant consumed only by constant folding is released after the build's prologue."""
    b = mltensor.MLGraphBuilder(fresh_ctx)
    x = b.input("x", data_type="float32", shape=[256])
    w = b.constant(np.linspace(-1, 1, 256, dtype=np.float32))
    folded = b.exp(w)  # computed once at build
    g = b.build_sync({"y": b.add(x, folded)})
    t = fresh_ctx.create_tensor_sync(data_type="float32", shape=[256], writable=True)
    out = fresh_ctx.create_tensor_sync(data_type="float32", shape=[256], readable=True)
    fresh_ctx.write_tensor(t, np.ones(256, np.float32))
    fresh_ctx.dispatch(g, {"x": t}, {"y": out})
    np.testing.assert_allclose(fresh_ctx.read_tensor_sync(out), 1 + np.exp(np.linspace(-1, 1, 256)), rtol=1e-5)
    assert g.memory["constants"] == 0 and g.memory["folded_constants"] == 1024
    assert fresh_ctx.counters["constant_bytes"] == 0  # w itself is gone


def test_builder_forgets_its_host_copy_once_built(fresh_ctx):
    b = mltensor.MLGraphBuilder(fresh_ctx)
    x = b.input("x", data_type="float32", shape=[1024])
    c = b.constant(np.full(1024, 2.0, np.float32))
    ref = weakref.ref(c._value)  # the builder's copy (constant() copies at the call)
    g = b.build_sync({"y": b.mul(x, c)})
    gc.collect()
    assert ref() is None
    assert g.memory["constants"] == 4096


_TRACED = """
import gc, sys, tracemalloc
import numpy as np
from mltensor import InferenceSession
from mltensor.models_synthetic import vit
px = np.load(sys.argv[2])
InferenceSession(vit(layers=2, hidden=64, heads=2, mlp=128, image=32, patch=8, classes=10)).run(
    None, {"pixel_values": px})  # imports, caches
gc.collect()
tracemalloc.start()
sess = InferenceSession(sys.argv[1])
y = sess.run(None, {"pixel_values": px})[0]
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
np.save(sys.argv[3], y)
print(peak)
"""


@pytest.mark.parametrize("graph_cache", ["empty", "warm"])
def test_session_load_and_run_make_no_host_copy_of_the_weights(pixels, tmp_path, graph_cache):
    """tracemalloc sees every numpy allocation: loading and running a model read from a file
    allocates a small fraction of its weights on the host (the importer used to copy them
    two or three times), whether the graph is built and saved to the graph cache or loaded from
    it. In a fresh interpreter: tracemalloc counts every thread's allocations, and other tests
    leave threads behind."""
    import subprocess
    import sys

    model = vit(**dict(SMALL_VIT, layers=1, hidden=512, heads=4, mlp=2048))  # 12 MB of weights
    p = tmp_path / "vit.onnx"
    p.write_bytes(model)
    np.save(tmp_path / "x.npy", pixels)
    weights = _weight_bytes(model)
    env = dict(os.environ, MLTENSOR_CACHE=str(tmp_path / "cache"))
    for _ in range(1 if graph_cache == "empty" else 2):
        r = subprocess.run(
            [sys.executable, "-c", _TRACED, str(p), str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-3000:]
    peak = int(r.stdout.strip().splitlines()[-1])
    assert weights > 10_000_000
    assert peak < 0.25 * weights, (peak, weights)
    np.testing.assert_allclose(
        np.load(tmp_path / "y.npy"), _ort(model, {"pixel_values": pixels})[0], rtol=1e-4, atol=1e-5
    )


def test_a_changed_model_file_is_refused_not_read_torn(fresh_ctx, pixels, tmp_path):
    p = tmp_path / "vit.onnx"
    p.write_bytes(vit(**SMALL_VIT))
    sess = InferenceSession(str(p), fresh_ctx, dynamic=False, cache=False)  # (cached: not read again)
    sess.run(None, {"pixel_values": pixels[:1]})
    p.write_bytes(b"\0" * 100)  # truncated by an exporter overwriting it in place
    with pytest.raises(mltensor.DataError, match=r"changed since the session loaded it"):
        sess.run(None, {"pixel_values": pixels})  # a new size: imported again
    sess.run(None, {"pixel_values": pixels[:1]})  # the built size runs on


def test_external_data_outside_the_model_directory_is_refused(ctx, tmp_path):
    m = _mixed_model()
    d = tmp_path / "m"
    d.mkdir()
    onnx.save(
        m,
        str(d / "ext.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="w.bin",
        size_threshold=0,
    )
    m2 = onnx.load(str(d / "ext.onnx"), load_external_data=False)
    for t in m2.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../w.bin"
    os.replace(d / "w.bin", tmp_path / "w.bin")
    onnx.save(m2, str(d / "ext.onnx"))
    with pytest.raises(mltensor.DataError, match=r"outside the model's directory"):
        InferenceSession(str(d / "ext.onnx"), ctx)


def test_garbage_after_a_valid_prefix_is_a_data_error(ctx):
    data = _mixed_model().SerializeToString()
    with pytest.raises(mltensor.DataError, match=r"not a well-formed ONNX model"):
        InferenceSession(data + b"\xff\xff\xff", ctx)


def test_threads_building_one_model_share_one_copy(fresh_ctx, pixels):
    model = vit(**SMALL_VIT)
    want = _ort(model, {"pixel_values": pixels})[0]
    results, errors = [], []

    def run():
        try:
            results.append(InferenceSession(model, fresh_ctx).run(None, {"pixel_values": pixels})[0])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for y in results:
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    assert fresh_ctx.counters["constant_bytes"] < 1.1 * _weight_bytes(model)
