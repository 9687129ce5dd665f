"""InferenceSession: onnxruntime-compatible surface, zero-copy paths proven with ctx.counters,
errors, and the ONNX importer's public entry point."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mltensor
from mltensor import InferenceSession
from mltensor.onnx import UnsupportedError, import_model

ort = pytest.importorskip("onnxruntime")


def _mlp(batch="batch", opset=17):
    """x[batch,4] -> y = relu(x @ W + b) [batch,3], z = sigmoid(x) [batch,4]."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="mm"),
        helper.make_node("Add", ["xw", "b"], ["pre"], name="add"),
        helper.make_node("Relu", ["pre"], ["y"], name="relu"),
        helper.make_node("Sigmoid", ["x"], ["z"], name="sig"),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [batch, 4]),
        ],
        [w, b],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


@pytest.fixture
def x(rng):
    return rng.standard_normal((2, 4)).astype(np.float32)


def test_run_matches_onnxruntime(ctx, x):
    m = _mlp()
    sess = InferenceSession(m, ctx, free_dimensions={"batch": 2})
    outs = sess.run(None, {"x": x})
    ref = _ort(m, {"x": x})
    assert [o.shape for o in outs] == [r.shape for r in ref]
    assert [o.dtype for o in outs] == [np.float32, np.float32]
    for o, r in zip(outs, ref):
        np.testing.assert_allclose(o, r, rtol=1e-5, atol=1e-6)
    (z,) = sess.run(["z"], {"x": x})
    np.testing.assert_allclose(z, ref[1], rtol=1e-5, atol=1e-6)


def test_io_description(ctx):
    sess = InferenceSession(_mlp(), ctx, free_dimensions={"batch": 5})
    (i,) = sess.get_inputs()
    assert (i.name, i.shape, i.type) == ("x", [5, 4], "tensor(float)")
    assert [(o.name, o.shape, o.type) for o in sess.get_outputs()] == [
        ("y", [5, 3], "tensor(float)"),
        ("z", [5, 4], "tensor(float)"),
    ]


def test_symbolic_dims_from_first_feed(ctx, rng):
    m = _mlp()
    sess = InferenceSession(m, ctx)
    assert sess.get_inputs()[0].shape == ["batch", 4]
    x3 = rng.standard_normal((3, 4)).astype(np.float32)
    y, z = sess.run(None, {"x": x3})
    assert y.shape == (3, 3)
    # as in onnxruntime, the description stays symbolic: later runs may use other sizes
    assert sess.get_inputs()[0].shape == ["batch", 4]
    np.testing.assert_allclose(y, _ort(m, {"x": x3})[0], rtol=1e-5, atol=1e-6)


def test_second_run_allocates_nothing(ctx, x):
    sess = InferenceSession(_mlp(), ctx, free_dimensions={"batch": 2})
    sess.run(None, {"x": x})
    created = []
    orig = ctx.create_tensor_sync
    ctx.create_tensor_sync = lambda **kw: created.append(kw) or orig(**kw)
    try:
        before = ctx.counters
        y2, _ = sess.run(None, {"x": x * 2})
        after = ctx.counters
    finally:
        del ctx.create_tensor_sync
    assert created == []
    assert after["tensors_alive"] == before["tensors_alive"]
    assert after["bytes_alive"] == before["bytes_alive"]
    assert after["bytes_uploaded"] - before["bytes_uploaded"] == x.nbytes  # each feed once
    assert after["bytes_downloaded"] - before["bytes_downloaded"] == 2 * 3 * 4 + 2 * 4 * 4


def test_same_tensors_bound_every_run(ctx, x):
    """The graph's bind-group cache keeps one entry: the same tensors are bound each run."""
    sess = InferenceSession(_mlp(), ctx, free_dimensions={"batch": 2})
    for k in range(3):
        sess.run(None, {"x": x + k})
    assert len(sess.graph._bg_cache) == 1


def test_mltensor_feeds_and_outputs_move_no_bytes(ctx, x):
    sess = InferenceSession(_mlp(), ctx, free_dimensions={"batch": 2})
    t = ctx.create_tensor_sync(data_type="float32", shape=[2, 4], writable=True, readable=True)
    ctx.write_tensor(t, x)
    sess.run(None, {"x": t}, output_location="ml-tensor")  # warm up
    before = ctx.counters
    y, z = sess.run(None, {"x": t}, output_location="ml-tensor")
    ctx.flush()
    after = ctx.counters
    assert isinstance(y, mltensor.MLTensor) and isinstance(z, mltensor.MLTensor)
    assert (y.data_type, y.shape) == ("float32", (2, 3))
    assert after["bytes_uploaded"] == before["bytes_uploaded"]
    assert after["bytes_downloaded"] == before["bytes_downloaded"]
    assert after["tensors_alive"] == before["tensors_alive"]
    np.testing.assert_allclose(ctx.read_tensor_sync(z), 1 / (1 + np.exp(-x)), rtol=1e-5)
    t.destroy()


def test_ml_tensor_outputs_are_overwritten_by_next_run(ctx, x):
    """IOBinding semantics: returned tensors are the session's; the next run overwrites them."""
    sess = InferenceSession(_mlp(), ctx, free_dimensions={"batch": 2})
    (z1,) = sess.run(["z"], {"x": x}, output_location="ml-tensor")
    first = ctx.read_tensor_sync(z1)
    (z2,) = sess.run(["z"], {"x": -x}, output_location="ml-tensor")
    assert z2 is z1
    np.testing.assert_allclose(first, 1 / (1 + np.exp(-x)), rtol=1e-5)
    np.testing.assert_allclose(ctx.read_tensor_sync(z1), 1 / (1 + np.exp(x)), rtol=1e-5)
    sess.close()
    assert z1._destroyed


def test_chained_sessions_move_no_bytes(ctx, x):
    m1 = _mlp()
    # second model: u = y * 2 + 1 on [2, 3]
    g = helper.make_graph(
        [helper.make_node("Mul", ["y", "two"], ["t"]), helper.make_node("Add", ["t", "one"], ["u"])],
        "post",
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        ],
    )
    m2 = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    s1 = InferenceSession(m1, ctx, free_dimensions={"batch": 2})
    s2 = InferenceSession(m2, ctx)
    t = ctx.create_tensor_sync(data_type="float32", shape=[2, 4], writable=True)
    ctx.write_tensor(t, x)
    y, _ = s1.run(None, {"x": t}, output_location="ml-tensor")
    s2.run(None, {"y": y}, output_location="ml-tensor")  # warm up
    before = ctx.counters
    y, _ = s1.run(None, {"x": t}, output_location="ml-tensor")
    (u,) = s2.run(None, {"y": y}, output_location="ml-tensor")
    ctx.flush()
    after = ctx.counters
    for k in ("bytes_uploaded", "bytes_downloaded", "bytes_copied_between_devices", "tensors_alive"):
        assert after[k] == before[k], k
    ref = _ort(m1, {"x": x})[0] * 2 + 1
    np.testing.assert_allclose(ctx.read_tensor_sync(u), ref, rtol=1e-5, atol=1e-6)
    t.destroy()


def test_outputs_read_in_parallel(ctx, x):
    """Both outputs are read after a single submit (reads are started before any wait)."""
    sess = InferenceSession(_mlp(), ctx, free_dimensions={"batch": 2})
    sess.run(None, {"x": x})
    ctx.flush()
    before = ctx.counters["submits"]
    sess.run(None, {"x": x})
    assert ctx.counters["submits"] - before == 1


async def test_run_async(ctx, x):
    m = _mlp()
    sess = InferenceSession(m, ctx, free_dimensions={"batch": 2})
    y, z = await sess.run_async(None, {"x": x})
    ref = _ort(m, {"x": x})
    np.testing.assert_allclose(y, ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(z, ref[1], rtol=1e-5, atol=1e-6)


def test_feed_errors(ctx, x):
    sess = InferenceSession(_mlp(), ctx, free_dimensions={"batch": 2})
    with pytest.raises(TypeError, match=r"unknown input 'q'"):
        sess.run(None, {"x": x, "q": x})
    with pytest.raises(TypeError, match=r"missing input.*'x'"):
        sess.run(None, {})
    with pytest.raises(TypeError, match=r"input 'x' must have dtype float32.*got float64"):
        sess.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(TypeError, match=r"input 'x' must have shape \[2, 4\], got \[3, 4\]"):
        sess.run(None, {"x": np.zeros((3, 4), np.float32)})
    t = ctx.create_tensor_sync(data_type="int32", shape=[2, 4], writable=True)
    with pytest.raises(TypeError, match=r"input 'x' must be float32 \[2, 4\], got an MLTensor int32"):
        sess.run(None, {"x": t})
    with pytest.raises(TypeError, match=r"unknown output 'nope'"):
        sess.run(["nope"], {"x": x})
    t.destroy()


def _single(op, inputs, outputs, opset=17, domain="", **attrs):
    node = helper.make_node(
        op, [n for n, *_ in inputs], [n for n, *_ in outputs], name="the_node", domain=domain, **attrs
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )
    ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(g, opset_imports=ops, ir_version=8)


def test_unsupported_op_error(ctx):
    m = _single("Det", [("x", TensorProto.FLOAT, [3, 3])], [("y", TensorProto.FLOAT, [])])
    with pytest.raises(UnsupportedError) as e:
        InferenceSession(m, ctx)
    msg = str(e.value)
    assert "'the_node'" in msg and "Det" in msg and "opset 17" in msg
    assert "Supported ONNX ops:" in msg and "Conv" in msg and "MatMul" in msg
    assert isinstance(e.value, mltensor.NotSupportedError)


def test_unsupported_attribute_and_domain_errors(ctx):
    m = _single("Relu", [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], bogus=1)
    with pytest.raises(UnsupportedError, match=r"'the_node' \(Relu, opset 17\): attribute 'bogus' is not supported"):
        InferenceSession(m, ctx)
    m = _single("Foo", [("x", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])], domain="com.example")
    with pytest.raises(UnsupportedError, match=r"com.example"):
        InferenceSession(m, ctx)


def test_shape_input_bound_at_first_run(ctx, rng):
    """Reshape's shape given as a graph input: the value is bound at the first run."""
    m = _single(
        "Reshape", [("x", TensorProto.FLOAT, [2, 6]), ("s", TensorProto.INT64, [2])], [("y", TensorProto.FLOAT, None)]
    )
    sess = InferenceSession(m, ctx)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    (y,) = sess.run(None, {"x": x, "s": np.array([3, 4], np.int64)})
    assert y.shape == (3, 4)
    (y,) = sess.run(None, {"x": x, "s": np.array([4, -1], np.int64)})
    assert y.shape == (4, 3)
    np.testing.assert_array_equal(y, x.reshape(4, 3))
    with pytest.raises(UnsupportedError, match=r"graph input 's'"):
        import_model(m, ctx)


@pytest.mark.parametrize(
    "op, ishape, attrs",
    [
        ("Gather", [2, 2], {"axis": 1}),
        ("GatherElements", [3, 4], {"axis": 0}),
        ("GatherND", [2, 1], {}),
        ("ScatterElements", [3, 4], {"axis": 0}),
        ("ScatterND", [2, 1], {}),
    ],
)
def test_runtime_negative_indices_match_onnxruntime(ctx, rng, op, ishape, attrs):
    """Indices fed at run time (not known at load), negative ones included: the WebNN kernels
    count them from the end of the dimension, as ONNX does."""
    data = rng.standard_normal((3, 4)).astype(np.float32)
    if op == "GatherND" or op == "ScatterND":
        idx = np.array([[-1], [0]], np.int64)
    else:
        idx = rng.integers(-3, 3, size=ishape).astype(np.int64)
    inputs = [("x", TensorProto.FLOAT, [3, 4]), ("i", TensorProto.INT64, list(idx.shape))]
    feeds = {"x": data, "i": idx}
    if op.startswith("Scatter"):
        upd = rng.standard_normal(idx.shape if op == "ScatterElements" else (2, 4)).astype(np.float32)
        inputs.append(("u", TensorProto.FLOAT, list(upd.shape)))
        feeds["u"] = upd
        if op == "ScatterElements":  # one update per element: duplicate targets are unspecified
            feeds["i"] = idx = np.array([[-1, 0, -3, 1], [0, -2, 2, -1], [-2, 2, 1, 0]], np.int64)
    m = _single(op, inputs, [("y", TensorProto.FLOAT, None)], **attrs)
    (y,) = InferenceSession(m, ctx).run(None, feeds)
    np.testing.assert_array_equal(y, _ort(m, feeds)[0])


def test_double_and_bool_io(ctx):
    m = _single(
        "Greater", [("a", TensorProto.DOUBLE, [4]), ("b", TensorProto.DOUBLE, [4])], [("c", TensorProto.BOOL, [4])]
    )
    sess = InferenceSession(m, ctx)
    assert [i.type for i in sess.get_inputs()] == ["tensor(double)", "tensor(double)"]
    assert sess.get_outputs()[0].type == "tensor(bool)"
    a = np.array([1, 2, 3, 4], np.float64)
    (c,) = sess.run(None, {"a": a, "b": a[::-1].copy()})
    assert c.dtype == np.bool_
    np.testing.assert_array_equal(c, [False, False, True, True])


def test_constant_output(ctx):
    """An output folded at load comes from the host (numpy) or a tensor written once."""
    m = _single("Shape", [("x", TensorProto.FLOAT, [2, 5])], [("s", TensorProto.INT64, [2])])
    sess = InferenceSession(m, ctx)
    (s,) = sess.run(None, {"x": np.zeros((2, 5), np.float32)})
    assert s.dtype == np.int64
    np.testing.assert_array_equal(s, [2, 5])
    (t,) = sess.run(None, {"x": np.zeros((2, 5), np.float32)}, output_location="ml-tensor")
    assert (t.data_type, t.shape) == ("int64", (2,))
    np.testing.assert_array_equal(ctx.read_tensor_sync(t), [2, 5])


def test_import_model_public(ctx, x):
    graph, inputs, outputs = import_model(_mlp(), ctx, free_dimensions={"batch": 2})
    assert inputs == [("x", "float32", (2, 4))]
    assert outputs == [("y", "float32", (2, 3)), ("z", "float32", (2, 4))]
    assert isinstance(graph, mltensor.MLGraph)
    with pytest.raises(TypeError, match=r"symbolic dimension 'batch' of input 'x'.*free_dimensions"):
        import_model(_mlp(), ctx)


def test_model_from_path_and_bytes(ctx, x, tmp_path):
    m = _mlp()
    p = tmp_path / "m.onnx"
    onnx.save(m, str(p))
    ref = _ort(m, {"x": x})[0]
    for src in (str(p), p, m.SerializeToString()):
        (y,) = InferenceSession(src, ctx, free_dimensions={"batch": 2}).run(["y"], {"x": x})
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_external_data(ctx, x, tmp_path):
    m = _mlp()
    p = tmp_path / "ext.onnx"
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    onnx.save(m2, str(p), save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    assert (tmp_path / "w.bin").exists()
    (y,) = InferenceSession(str(p), ctx, free_dimensions={"batch": 2}).run(["y"], {"x": x})
    np.testing.assert_allclose(y, _ort(m, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_tflite_routing(ctx, monkeypatch):
    """Bytes with the TFL3 identifier (and .tflite paths) go to the TFLite importer
    (mltensor.tflite.import_stages: import_model's form for sessions, its control flow decided at
    run time as stages)."""
    import mltensor.tflite as tfl

    calls = []

    def fake(source, context, free_dimensions=None, float16=False, **more):
        calls.append((source, context, free_dimensions, float16))
        raise RuntimeError("routed")

    monkeypatch.setattr(tfl, "import_stages", fake, raising=False)
    blob = b"\x1c\x00\x00\x00TFL3" + b"\x00" * 16
    with pytest.raises(RuntimeError, match="routed"):
        InferenceSession(blob, ctx, free_dimensions={"b": 1})
    with pytest.raises(RuntimeError, match="routed"):
        InferenceSession("model.tflite", ctx)
    with pytest.raises(RuntimeError, match="routed"):
        InferenceSession("model.tflite", ctx, float16=True)
    assert calls[0][0] == blob and calls[0][1] is ctx and calls[0][2] == {"b": 1} and calls[0][3] is False
    assert calls[1][0] == "model.tflite"
    assert calls[2][3] is True


def test_int64_io(ctx):
    m = _single("Add", [("a", TensorProto.INT64, [3]), ("b", TensorProto.INT64, [3])], [("c", TensorProto.INT64, [3])])
    sess = InferenceSession(m, ctx)
    assert [(i.name, i.type) for i in sess.get_inputs()] == [("a", "tensor(int64)"), ("b", "tensor(int64)")]
    assert sess.graph.input_descriptors["a"] == ("int64", (3,))
    (c,) = sess.run(None, {"a": np.array([1, -2, 3], np.int64), "b": np.array([10, 20, -30], np.int64)})
    assert c.dtype == np.int64
    np.testing.assert_array_equal(c, [11, 18, -27])


def test_output_fed_back_into_same_session(ctx):
    """A decode loop: the output tensor of a run is the next run's input (no copy, no allocation
    after the second run: the output alternates between two tensors)."""
    m = _single(
        "Add", [("x", TensorProto.FLOAT, [3]), ("one", TensorProto.FLOAT, [3])], [("y", TensorProto.FLOAT, [3])]
    )
    sess = InferenceSession(m, ctx)
    one = np.ones(3, np.float32)
    t = ctx.create_tensor_sync(data_type="float32", shape=[3], writable=True)
    ctx.write_tensor(t, np.zeros(3, np.float32))
    cur = t
    for _ in range(2):
        (cur,) = sess.run(None, {"x": cur, "one": one}, output_location="ml-tensor")
    alive = ctx.counters["tensors_alive"]
    for _ in range(3):
        (cur,) = sess.run(None, {"x": cur, "one": one}, output_location="ml-tensor")
    assert ctx.counters["tensors_alive"] == alive
    np.testing.assert_array_equal(ctx.read_tensor_sync(cur), [5, 5, 5])
    t.destroy()


def test_session_package_imports_nothing_heavy():
    """Importing the session package (as `mltensor.InferenceSession` does) imports neither onnx,
    jinja2, the TFLite reader nor the importer and stage modules that pull them in: those come
    through session/lazy.py when something is built (a process whose builds all load from the
    graph cache never needs them: test_graph_cache.py checks that end to end)."""
    import subprocess
    import sys

    heavy = (
        "onnx",
        "jinja2",
        "tflite",
        "mltensor.onnx",
        "mltensor.onnx.importer",
        "mltensor.tflite",
        "mltensor.tflite.reader",
        "mltensor.stages.plan",
        "mltensor.stages.loop",
    )
    code = (
        "import sys, mltensor\n"
        "assert mltensor.InferenceSession.__module__ == 'mltensor.session.inference'\n"
        "import mltensor.session\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_stages_reach_the_session_through_stage_host_only():
    """stages/ imports neither the session nor the ONNX importer (it reaches them through
    stages/host.py StageHost), and InferenceSession implements every StageHost member."""
    import ast
    import os

    from mltensor.stages import host

    root = os.path.dirname(host.__file__)
    for f in ("plan.py", "loop.py", "pool.py", "host.py"):
        tree = ast.parse(open(os.path.join(root, f)).read())
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom):
                mod = n.module or ""
                assert "session" not in mod and "importer" not in mod, (f, mod)
                assert all("session" not in a.name for a in n.names), f
    members = [n for n in vars(host.StageHost) if not n.startswith("_")]
    assert {"context", "build_lock", "next_stage", "import_body", "read_all", "count_read"} <= set(members)
    for name in members:
        assert hasattr(InferenceSession, name) or name == "build_lock", name
    assert "build_lock" in InferenceSession.__init__.__code__.co_names
