"""The persistent graph cache (mltensor/graphcache/): MLContext.save_graph / load_graph /
list_graphs / delete_graph after WebNN's graph-cache explainer, and InferenceSession loading a
specialization an earlier process built. Every test points MLTENSOR_CACHE at its own folder."""

import json
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import mltensor
from mltensor import MLDynamicDimension as D
from mltensor import ml

from helpers import dispatch_at

ort = pytest.importorskip("onnxruntime")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("MLTENSOR_CACHE", str(d))
    monkeypatch.delenv("MLTENSOR_GRAPH_CACHE", raising=False)
    monkeypatch.delenv("MLTENSOR_CACHE_MAX_BYTES", raising=False)
    return d


def _conv_graph(ctx, seed=0, n=2):
    """Conv + bias + relu + matmul with weights: constants of several kinds, pooled intermediates."""
    rng = np.random.default_rng(seed)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[n, 3, 8, 8])
    w = b.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    bias = b.constant(rng.standard_normal(4).astype(np.float32))
    y = b.relu(b.conv2d(x, w, bias=bias, padding=[1, 1, 1, 1]))
    m = b.constant(rng.standard_normal((64, 260)).astype(np.float32))  # >= 64 KiB: a blob of its own
    z = b.matmul(b.reshape(y, [n, 4, 64]), m)
    return b.build_sync({"z": z, "y": y})


def _entries(cache):
    return sorted(p for p in cache.rglob("*.json"))


def test_save_load_round_trip(cache, ctx, rng):
    g = _conv_graph(ctx)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = dispatch_at(ctx, g, {"x": x})
    ctx.save_graph_sync("conv", g)
    assert ctx.list_graphs_sync() == ["conv"]
    before = ctx._counters["constant_bytes"]
    h = ctx.load_graph_sync("conv")
    assert ctx._counters["constant_bytes"] == before  # the loaded graph binds the same constants
    assert h.input_descriptors == g.input_descriptors and h.output_descriptors == g.output_descriptors
    assert h.kernel_names == g.kernel_names
    got = dispatch_at(ctx, h, {"x": x})
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    g.destroy()  # the loaded graph keeps the shared constants alive
    got = dispatch_at(ctx, h, {"x": x})
    np.testing.assert_array_equal(got["z"], want["z"])
    h.destroy()
    ctx.delete_graph("conv")
    assert ctx.list_graphs_sync() == []
    with pytest.raises(mltensor.NotFoundError, match="no graph is cached under 'conv'"):
        ctx.load_graph_sync("conv")


def test_async_forms_and_argument_errors(cache, ctx):
    import asyncio

    g = _conv_graph(ctx)

    async def go():
        await ctx.save_graph_async("a", g)
        h = await ctx.load_graph_async("a")
        return h, await ctx.list_graphs_async()

    h, keys = asyncio.run(go())
    assert keys == ["a"] and h.kernel_names == g.kernel_names
    with pytest.raises(TypeError, match="key must be a non-empty string"):
        ctx.save_graph_sync("", g)
    with pytest.raises(TypeError, match="graph must be an MLGraph"):
        ctx.save_graph_sync("b", object())
    other = ml.create_context_sync()
    try:
        with pytest.raises(TypeError, match="another MLContext"):
            other.save_graph_sync("b", g)
    finally:
        other.destroy()
    h.destroy()
    with pytest.raises(mltensor.InvalidStateError, match="destroyed"):
        ctx.save_graph_sync("b", h)
    with pytest.raises(mltensor.NotFoundError):
        asyncio.run(ctx.load_graph_async("missing"))


def test_load_in_a_fresh_context_uploads_from_the_cache(cache, rng):
    a = ml.create_context_sync()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    try:
        g = _conv_graph(a)
        want = dispatch_at(a, g, {"x": x})
        a.save_graph_sync("conv", g)
    finally:
        a.destroy()
    b = ml.create_context_sync()
    try:
        h = b.load_graph_sync("conv")
        assert b._counters["constant_bytes"] > 0
        got = dispatch_at(b, h, {"x": x})
        np.testing.assert_array_equal(got["z"], want["z"])
        np.testing.assert_array_equal(got["y"], want["y"])
    finally:
        b.destroy()


def test_dynamic_graph_round_trip(cache, ctx, rng):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("batch", 8), D("seq", 40), 16])
    w = b.constant(rng.standard_normal((16, 24)).astype(np.float32))
    y = b.softmax(b.matmul(x, w), 2)
    g = b.build_sync({"y": y})
    ctx.save_graph_sync("dyn", g)
    h = ctx.load_graph_sync("dyn")
    assert h.dynamic_dimensions == {"batch": 8, "seq": 40}
    for bs, sq in [(1, 1), (3, 17), (8, 40)]:
        a = rng.standard_normal((bs, sq, 16)).astype(np.float32)
        np.testing.assert_array_equal(dispatch_at(ctx, h, {"x": a})["y"], dispatch_at(ctx, g, {"x": a})["y"])
    with pytest.raises(TypeError, match="outside"):  # the loaded graph checks sizes as the built one
        dispatch_at(ctx, h, {"x": np.zeros((9, 1, 16), np.float32)})


def test_a_loaded_program_captures_as_the_built_one(cache, ctx, rng):
    """The graph cache sees a graph only through its Program (runtime/program.py): what a load
    rebuilds captures again as the build did, launches, pool, kernels and their WGSL."""
    from mltensor.front.graph import program_of
    from mltensor.graphcache import recipe
    from mltensor.runtime.program import Program

    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("batch", 8), 16])
    w = b.constant(rng.standard_normal((16, 24)).astype(np.float32))
    graphs = [_conv_graph(ctx), b.build_sync({"y": b.softmax(b.matmul(x, w), 1)})]
    for i, g in enumerate(graphs):
        ctx.save_graph_sync(f"g{i}", g)
        h = ctx.load_graph_sync(f"g{i}")
        assert isinstance(program_of(g), Program) and isinstance(program_of(h), Program)
        (built, bc), (loaded, lc) = recipe.capture(ctx, program_of(g)), recipe.capture(ctx, program_of(h))
        for field in ("launches", "pool", "sources", "kernel_names", "autotune", "inputs", "outputs", "dyn_args"):
            assert repr(loaded[field]) == repr(built[field]), field  # (sizes and Folds: by what they say)
        assert [k.key for k in loaded["kernels"]] == [k.key for k in built["kernels"]]
        assert [c[2] for c in lc] == [c[2] for c in bc]  # the same constants, by size
        assert (loaded["dyn_args"] is None) == (built["dyn_args"] is None) == (i == 0)
        h.destroy()


def _entry_files(cache, key):
    metas = [p for p in cache.rglob("*.json") if json.loads(p.read_text()).get("key") == key]
    assert len(metas) == 1, metas
    m = metas[0]
    names = sorted({r[0] for r in json.loads(m.read_text())["blobs"]})
    return m, m.with_suffix(".recipe"), [cache / "graphs" / "blobs" / n for n in names]


@pytest.mark.parametrize(
    "damage",
    [
        "truncated recipe",
        "garbage json",
        "blob changed",
        "small blob changed",
        "blob truncated",
        "blob missing",
        "other code",
        "older format",
        "recipe of another key",
    ],
)
def test_a_damaged_entry_is_a_miss_and_removed(cache, rng, damage):
    a = ml.create_context_sync()
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    try:
        g = _conv_graph(a)
        want = dispatch_at(a, g, {"x": x})["z"]
        a.save_graph_sync("k", g)
        a.save_graph_sync("other", _conv_graph(a, seed=1, n=1))
    finally:
        a.destroy()
    meta, recipe, blobs = _entry_files(cache, "k")
    if damage == "truncated recipe":
        recipe.write_bytes(recipe.read_bytes()[:100])
    elif damage == "garbage json":
        meta.write_text("{not json")
    elif damage == "blob changed":
        big = max(blobs, key=lambda p: p.stat().st_size)
        data = bytearray(big.read_bytes())
        data[0] ^= 1
        big.write_bytes(bytes(data))
    elif damage == "small blob changed":  # the entry's pack of small constants
        small = min(blobs, key=lambda p: p.stat().st_size)
        data = bytearray(small.read_bytes())
        data[-20] ^= 4
        small.write_bytes(bytes(data))
    elif damage == "blob truncated":
        big = max(blobs, key=lambda p: p.stat().st_size)
        big.write_bytes(big.read_bytes()[:-8])
    elif damage == "blob missing":
        blobs[0].unlink()
    elif damage == "other code":
        m = json.loads(meta.read_text())
        m["code"] = "0" * 64
        meta.write_text(json.dumps(m))
    elif damage == "older format":  # (format 2: kernels without launch parameters)
        m = json.loads(meta.read_text())
        m["format"] -= 1
        meta.write_text(json.dumps(m))
    else:
        _, other_recipe, _ = _entry_files(cache, "other")
        recipe.write_bytes(other_recipe.read_bytes())
    b = ml.create_context_sync()  # a fresh context: the constants come from the blobs
    try:
        if damage in ("garbage json", "other code", "older format"):
            assert "k" not in b.list_graphs_sync()
        with pytest.raises(mltensor.NotFoundError):
            b.load_graph_sync("k")
        if damage != "garbage json":
            assert not meta.exists() and not recipe.exists()  # removed: the next save rebuilds it
        # rebuilt and saved again, then loaded
        g = _conv_graph(b)
        b.save_graph_sync("k", g)
        h = b.load_graph_sync("k")
        np.testing.assert_array_equal(dispatch_at(b, h, {"x": x})["z"], want)
        assert b.load_graph_sync("other").kernel_names
    finally:
        b.destroy()


class _Boom:
    def __reduce__(self):
        return (os.remove, (self.path,))


def test_recipe_unpickles_only_mltensor_classes(cache, ctx, tmp_path):
    g = _conv_graph(ctx)
    ctx.save_graph_sync("k", g)
    meta, recipe, _ = _entry_files(cache, "k")
    victim = tmp_path / "victim"
    victim.write_text("still here")
    boom = _Boom()
    boom.path = str(victim)
    entry = pickle.loads(recipe.read_bytes())  # (our own entry, trusted here)
    entry["extra"] = boom
    recipe.write_bytes(pickle.dumps(entry))
    with pytest.raises(mltensor.NotFoundError):
        ctx.load_graph_sync("k")
    assert victim.read_text() == "still here"


def test_eviction_keeps_the_cache_under_its_limit(cache, ctx, monkeypatch):
    for i in range(3):
        ctx.save_graph_sync(f"g{i}", _conv_graph(ctx, seed=i))
    sizes = sum(p.stat().st_size for p in (cache / "graphs" / "blobs").iterdir())
    # room for about one entry's blobs: the least recently used go first
    monkeypatch.setenv("MLTENSOR_CACHE_MAX_BYTES", str(sizes // 3 + 16))
    ctx.load_graph_sync("g0").destroy()  # used: now the most recent
    os.utime(_entry_files(cache, "g0")[0], (2e9, 2e9))
    for p in (cache / "graphs" / "blobs").iterdir():  # (blobs younger than a minute are kept:
        os.utime(p, (1e9, 1e9))  #  another process may be writing them)
    ctx.save_graph_sync("g3", _conv_graph(ctx, seed=3))
    keys = ctx.list_graphs_sync()
    assert "g1" not in keys and "g2" not in keys and len(keys) <= 2
    live = sum(p.stat().st_size for p in (cache / "graphs" / "blobs").iterdir())
    assert live <= sizes * 2 // 3  # the blobs of evicted entries went with them


# -- processes -----------------------------------------------------------------------------------


def _model(path, seed=0):
    """A small ONNX CNN with a free batch dimension."""
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 10])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, str(path))
    return path


_SESSION = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mltensor
    s = mltensor.InferenceSession(sys.argv[1], dynamic=False)
    x = np.load(sys.argv[2])
    out = s.run(None, {"x": x})[0]
    np.save(sys.argv[3], out)
    print(json.dumps(s.stats))
""")


def _run(env, *args, script=_SESSION):
    """A script in a fresh process: the JSON of its last line."""
    r = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_session(cache, tmp_path, rng):
    model = _model(tmp_path / "m.onnx")
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    env = dict(os.environ, MLTENSOR_CACHE=str(cache))
    first = _run(env, model, tmp_path / "x.npy", tmp_path / "a.npy")
    assert first["builds"] == 1 and first["loaded"] == 0
    second = _run(env, model, tmp_path / "x.npy", tmp_path / "b.npy")
    assert second["loaded"] == 1
    np.testing.assert_allclose(np.load(tmp_path / "b.npy"), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.load(tmp_path / "b.npy"), np.load(tmp_path / "a.npy"))
    # the same model path with other weights is another model: built, not loaded
    _model(model, seed=1)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    third = _run(env, model, tmp_path / "x.npy", tmp_path / "c.npy")
    assert third["loaded"] == 0
    np.testing.assert_allclose(np.load(tmp_path / "c.npy"), want, rtol=1e-4, atol=1e-5)
    # switched off: nothing loaded, nothing written
    off = tmp_path / "off"
    stats = _run(
        dict(env, MLTENSOR_CACHE=str(off), MLTENSOR_GRAPH_CACHE="0"), model, tmp_path / "x.npy", tmp_path / "d.npy"
    )
    assert stats["loaded"] == 0 and not (off / "graphs").exists()


def test_session_in_process(cache, tmp_path, rng):
    model = _model(tmp_path / "m.onnx")
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    a = mltensor.InferenceSession(str(model), dynamic=False)
    a.run(None, {"x": x})
    assert a.stats["loaded"] == 0
    b = mltensor.InferenceSession(model.read_bytes(), dynamic=False)  # the same bytes: the same model
    np.testing.assert_allclose(b.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
    assert b.stats["loaded"] == 1 and b.stats["builds"] == 1  # (a load is a build, without import)
    c = mltensor.InferenceSession(str(model), dynamic=False, cache=False)
    c.run(None, {"x": x})
    assert c.stats["loaded"] == 0
    with pytest.raises(TypeError, match="cache must be"):
        mltensor.InferenceSession(str(model), cache="yes")


_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import mltensor
    from mltensor import ml
    ctx = ml.create_context_sync()
    me = int(sys.argv[1])
    for i in range(int(sys.argv[2])):
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[4, 32])
        seed = i % 3  # the same keys from both writers, and keys of their own
        w = np.random.default_rng(seed).standard_normal((32, 32)).astype(np.float32)
        g = b.build_sync({"y": b.relu(b.matmul(x, b.constant(w)))})
        ctx.save_graph_sync(f"shared{seed}", g)
        ctx.save_graph_sync(f"w{me}-{i}", g)
        try:
            ctx.load_graph_sync(f"shared{(i + 1) % 3}").destroy()
        except mltensor.NotFoundError:
            pass  # not written yet by either
        g.destroy()
""")


def test_two_processes_write_one_cache(cache, ctx, rng):
    env = dict(os.environ, MLTENSOR_CACHE=str(cache))
    n = 6
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(k), str(n)], env=env, cwd=ROOT, stderr=subprocess.PIPE, text=True
        )
        for k in range(2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    keys = ctx.list_graphs_sync()
    assert keys == sorted([f"shared{s}" for s in range(3)] + [f"w{k}-{i}" for k in range(2) for i in range(n)])
    x = rng.standard_normal((4, 32)).astype(np.float32)
    for key in keys:
        seed = int(key[-1]) if key.startswith("shared") else int(key.split("-")[1]) % 3
        w = np.random.default_rng(seed).standard_normal((32, 32)).astype(np.float32)
        got = dispatch_at(ctx, ctx.load_graph_sync(key), {"x": x})["y"]
        np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)
    assert not list(cache.rglob("*.tmp"))


def _layouts(ffi, names):
    out = []
    for name in names:
        for form in (f"{name} *", f"{name}[2]"):
            t = ffi.typeof(form)
            fields = [(f, x.type.cname, x.offset) for f, x in t.item.fields] if t.item.kind == "struct" else None
            out.append((t.cname, ffi.sizeof(t.item), fields))
    return out


def test_fast_cffi_parses_as_cffi_does(tmp_path, monkeypatch):
    """runtime/cffi_types.py: wgpu's ffi (its header's parse from the cache, type strings parsed
    the fast way) and an ffi of the same header parsed by plain cffi agree on every struct; a
    damaged cache file is parsed again."""
    import cffi
    from cffi import cparser
    from wgpu.backends.wgpu_native._ffi import ffi, get_wgpu_header

    cached = cparser.Parser._parse
    assert getattr(cached, "_mltensor_cached", False) and getattr(ffi._parser, "_mltensor_fast", False)
    with monkeypatch.context() as m:
        m.setattr(cparser.Parser, "_parse", cached._orig)
        ref = cffi.FFI()
        ref.cdef(get_wgpu_header())
    names = sorted({k.split(" ", 1)[1] for k in ref._parser._declarations if k.startswith("typedef WGPU")})
    assert len(names) > 100
    names = names[::4]  # (plain cffi parses each type string in ~12 ms)
    assert _layouts(ffi, names) == _layouts(ref, names)
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path))
    victim = tmp_path / "victim"
    victim.write_text("still here")
    boom = _Boom()
    boom.path = str(victim)
    for damage in (None, b"garbage", pickle.dumps(boom)):  # (the last would remove victim if loaded)
        if damage is not None:
            [p] = (tmp_path / "cffi").glob("*.pickle")
            p.write_bytes(damage)
        again = cffi.FFI()
        again.cdef(get_wgpu_header())  # (through the cache: stored, then read back or re-parsed)
        assert _layouts(again, names[:8]) == _layouts(ref, names[:8])
    assert len(list((tmp_path / "cffi").glob("*.pickle"))) == 1 and victim.read_text() == "still here"


def test_a_load_maps_one_weight_file_at_a_time(cache, rng, monkeypatch):
    """Constants are uploaded from mapped blob files, each unmapped once uploaded: the process
    never holds a second copy of all the weights next to the GPU's."""

    def build(ctx):
        b = mltensor.MLGraphBuilder(ctx)
        y = b.input("x", data_type="float32", shape=[2, 64])
        for k, (m, n) in enumerate([(64, 256), (256, 256), (256, 64)]):  # >= 64 KiB each: own files
            y = b.relu(b.matmul(y, b.constant(np.random.default_rng(k).standard_normal((m, n)).astype(np.float32))))
        return b.build_sync({"y": y})

    a = ml.create_context_sync()
    x = rng.standard_normal((2, 64)).astype(np.float32)
    try:
        g = build(a)
        want = dispatch_at(a, g, {"x": x})["y"]
        a.save_graph_sync("mlp", g)
    finally:
        a.destroy()
    blobs = str(cache / "graphs" / "blobs")
    seen = []
    b = ml.create_context_sync()
    orig = type(b._constants).acquire

    def acquire(self, key, data):  # (observes the mappings; the upload itself is unchanged)
        with open("/proc/self/maps") as f:
            seen.append({line.split()[-1] for line in f if blobs in line})
        return orig(self, key, data)

    monkeypatch.setattr(type(b._constants), "acquire", acquire)
    try:
        h = b.load_graph_sync("mlp")
        big = [m for m in seen if m]
        assert len(seen) >= 3 and all(len(m) <= 2 for m in seen), seen  # the pack and one weight
        assert len(set().union(*big)) >= 3
        with open("/proc/self/maps") as f:
            assert not [line for line in f if blobs in line]
        np.testing.assert_array_equal(dispatch_at(b, h, {"x": x})["y"], want)
    finally:
        b.destroy()


def test_a_session_built_under_other_switches_is_not_loaded(cache, tmp_path, rng, monkeypatch):
    """A graph built with MLTENSOR_NO_FUSION=1 (one kernel per node) is cached under that
    switch: a session without it builds its own fused graph, and the switch loads its own."""
    model = _model(tmp_path / "m.onnx")
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    monkeypatch.setenv("MLTENSOR_NO_FUSION", "1")
    a = mltensor.InferenceSession(str(model), dynamic=False)
    a.run(None, {"x": x})
    unfused = len(a._spec.graph.kernel_names)
    monkeypatch.delenv("MLTENSOR_NO_FUSION")
    b = mltensor.InferenceSession(str(model), dynamic=False)
    b.run(None, {"x": x})
    assert b.stats["loaded"] == 0 and len(b._spec.graph.kernel_names) < unfused
    monkeypatch.setenv("MLTENSOR_NO_FUSION", "1")
    c = mltensor.InferenceSession(str(model), dynamic=False)
    np.testing.assert_allclose(c.run(None, {"x": x})[0], b.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert c.stats["loaded"] == 1 and len(c._spec.graph.kernel_names) == unfused


# -- sessions described from the cache's note (no onnx import, no parse) -----------------------

_WARM = textwrap.dedent("""
    import json, sys
    import numpy as np
    import mltensor
    LIBS = ("onnx", "jinja2", "mltensor.tflite.reader")
    out = {"imported": [sorted(m for m in LIBS if m in sys.modules)]}
    model, name, *io = sys.argv[1:]
    s = mltensor.InferenceSession(model, dynamic=False)
    out["io"] = [[[a.name, a.shape, a.type] for a in s.get_inputs()],
                 [[a.name, a.shape, a.type] for a in s.get_outputs()]]
    out["errors"] = []
    x0 = np.load(io[0])
    for feed in ({"nope": x0}, {name: x0[0]}, {name: x0.astype(np.int32)}):
        try:
            s.run(None, feed)
        except Exception as e:
            out["errors"].append(f"{type(e).__name__}: {e}")
    for x, y in zip(io[::2], io[1::2]):
        np.save(y, s.run(None, {name: np.load(x)})[0])
        out["imported"].append(sorted(m for m in LIBS if m in sys.modules))
    out["stats"] = s.stats
    print(json.dumps(out))
""")


def _warm(env, *args):
    return _run(env, *args, script=_WARM)


def test_a_warm_process_neither_imports_onnx_nor_parses_the_model(cache, tmp_path, rng):
    """The second process describes the session from the note the first left (inputs, outputs,
    symbolic shapes) and loads its graph: onnx (and jinja2, the TFLite reader) is never imported,
    yet what it answers is what the first answered. A size not in the cache is built: the model
    is parsed then."""
    model = _model(tmp_path / "m.onnx")
    x2 = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    x5 = rng.standard_normal((5, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "x2.npy", x2)
    np.save(tmp_path / "x5.npy", x5)
    env = dict(os.environ, MLTENSOR_CACHE=str(cache))
    cold = _warm(env, model, "x", tmp_path / "x2.npy", tmp_path / "a2.npy")
    assert cold["stats"]["loaded"] == 0 and "onnx" in cold["imported"][1]
    warm = _warm(env, model, "x", tmp_path / "x2.npy", tmp_path / "b2.npy", tmp_path / "x5.npy", tmp_path / "b5.npy")
    assert warm["imported"][:2] == [[], []]  # after `import mltensor`, after the cached size's run
    assert warm["stats"]["loaded"] == 1 and warm["stats"]["builds"] == 2
    assert (
        warm["io"]
        == cold["io"]
        == [[["x", ["n", 3, 16, 16], "tensor(float)"]], [["logits", ["n", 10], "tensor(float)"]]]
    )
    assert warm["errors"] == cold["errors"] and len(cold["errors"]) == 3
    np.testing.assert_array_equal(np.load(tmp_path / "b2.npy"), np.load(tmp_path / "a2.npy"))
    # the new size was imported and built from the model, parsed for it
    assert "onnx" in warm["imported"][2]
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x5})[0]
    np.testing.assert_allclose(np.load(tmp_path / "b5.npy"), want, rtol=1e-4, atol=1e-5)
    # a TFLite model's cached session imports neither the TFLite reader nor onnx
    from mltensor.tflite.writer import ModelWriter

    w = ModelWriter()
    i = w.input("image", [1, 5, 5, 2])
    k = w.const("kernel", rng.standard_normal((3, 3, 3, 2)).astype(np.float32))
    o = w.tensor("features", [1, 5, 5, 3])
    w.op("CONV_2D", [i, k, -1], [o], "Conv2DOptions", Padding=0, StrideW=1, StrideH=1)
    tfl = tmp_path / "conv.tflite"
    tfl.write_bytes(w.finish([i], [o]))
    np.save(tmp_path / "img.npy", rng.standard_normal((1, 5, 5, 2)).astype(np.float32))
    cold = _warm(env, tfl, "image", tmp_path / "img.npy", tmp_path / "t1.npy")
    warm = _warm(env, tfl, "image", tmp_path / "img.npy", tmp_path / "t2.npy")
    assert warm["stats"]["loaded"] == 1 and warm["imported"] == [[], []] and warm["io"] == cold["io"]
    np.testing.assert_array_equal(np.load(tmp_path / "t2.npy"), np.load(tmp_path / "t1.npy"))


def _description_note(cache):
    notes = [p for p in (cache / "graphs").glob("*/*.note") if "|description" in json.loads(p.read_text())["key"]]
    assert len(notes) == 1
    return notes[0]


def _io(sess):
    return [
        [(a.name, a.shape, a.type) for a in sess.get_inputs()],
        [(a.name, a.shape, a.type) for a in sess.get_outputs()],
    ]


@pytest.mark.parametrize("options", [{"dynamic": False}, {}, {"free_dimensions": {"n": 2}}])
def test_a_session_described_from_its_note_answers_as_from_the_model(cache, tmp_path, rng, options):
    model = _model(tmp_path / "m.onnx")
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    a = mltensor.InferenceSession(str(model), **options)
    ya = a.run(None, {"x": x})[0]
    assert a._loaded is not None  # (parsed: no note yet)
    b = mltensor.InferenceSession(str(model), **options)
    assert b._loaded is None and b._cache_id == a._cache_id
    assert _io(b) == _io(a) and b._np_in == a._np_in
    assert [b.stats[k] for k in ("dynamic", "static_reason")] == [a.stats[k] for k in ("dynamic", "static_reason")]
    np.testing.assert_array_equal(b.run(None, {"x": x})[0], ya)
    assert b._loaded is None and b.stats["loaded"] == 1
    for bad in ({"x": x.astype(np.float64)}, {"x": x[0]}, {"y": x}, {}):
        with pytest.raises(TypeError) as ea:
            a.run(None, bad)
        with pytest.raises(TypeError) as eb:
            b.run(None, bad)
        assert str(ea.value) == str(eb.value)
    if options.get("dynamic") is False:  # another size: built, from the model parsed for it
        x3 = x[:1].repeat(3, axis=0)
        want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x3})[0]
        np.testing.assert_allclose(b.run(None, {"x": x3})[0], want, rtol=1e-4, atol=1e-5)
        assert b._loaded is not None and b.stats["builds"] == 2


@pytest.mark.parametrize("damage", ["version", "garbage", "fields", "externals"])
def test_a_stale_or_damaged_note_is_ignored(cache, tmp_path, rng, damage):
    model = _model(tmp_path / "m.onnx")
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    a = mltensor.InferenceSession(str(model), dynamic=False)
    ya = a.run(None, {"x": x})[0]
    path = _description_note(cache)
    entry = json.loads(path.read_text())
    note = entry["note"]
    if damage == "garbage":
        path.write_bytes(b"\x00{not json")
    else:
        if damage == "version":
            note["version"] -= 1
        elif damage == "fields":
            note["inputs"] = [["x", "float"]]
        else:  # an external data file that is not there
            note["externals"] = ["gone.bin"]
        path.write_text(json.dumps(entry))
    b = mltensor.InferenceSession(str(model), dynamic=False)
    assert b._loaded is not None  # the model was parsed
    assert _io(b) == _io(a) and b._cache_id == a._cache_id
    np.testing.assert_array_equal(b.run(None, {"x": x})[0], ya)
    assert b.stats["loaded"] == 1
    # and the note it wrote describes the next one
    assert json.loads(_description_note(cache).read_text())["note"]["externals"] == []
    assert mltensor.InferenceSession(str(model), dynamic=False)._loaded is None


def test_a_note_checks_the_files_it_describes(cache, tmp_path, rng):
    """The note is keyed by the model file's bytes; its external data files are part of the model:
    new weights there are a new model (built, not loaded). A model file replaced after a session
    was described from the note is refused when the session comes to parse it."""
    model = _model(tmp_path / "m.onnx")
    m = onnx.load(str(model))
    onnx.save(m, str(tmp_path / "e.onnx"), save_as_external_data=True, location="e.bin", size_threshold=0)
    ext = str(tmp_path / "e.onnx")
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    a = mltensor.InferenceSession(ext, dynamic=False)
    ya = a.run(None, {"x": x})[0]
    b = mltensor.InferenceSession(ext, dynamic=False)
    assert b._loaded is None and b._cache_id == a._cache_id
    np.testing.assert_array_equal(b.run(None, {"x": x})[0], ya)
    assert b.stats["loaded"] == 1
    # other weights in the external data file, the model file unchanged
    m2 = onnx.load(str(_model(tmp_path / "m2.onnx", seed=1)))
    os.unlink(tmp_path / "e.bin")  # (onnx appends to an existing file)
    onnx.save(m2, str(tmp_path / "e2.onnx"), save_as_external_data=True, location="e.bin", size_threshold=0)
    assert (tmp_path / "e2.onnx").read_bytes() == (tmp_path / "e.onnx").read_bytes()
    want = ort.InferenceSession(ext, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    c = mltensor.InferenceSession(ext, dynamic=False)
    assert c._loaded is None and c._cache_id != a._cache_id
    np.testing.assert_allclose(c.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)
    assert c.stats["loaded"] == 0 and c._loaded is not None
    # the model file replaced under a described session: refused at its parse, not misbuilt
    d = mltensor.InferenceSession(str(model), dynamic=False)
    d.run(None, {"x": x})
    e = mltensor.InferenceSession(str(model), dynamic=False)
    assert e._loaded is None
    _model(model, seed=2)
    with pytest.raises(mltensor.DataError, match="changed since the session loaded it"):
        e.run(None, {"x": x[:1]})


def test_onnx_io_constants_are_onnx_s():
    from mltensor import onnxio

    for name in (
        "FLOAT",
        "UINT8",
        "INT8",
        "UINT16",
        "INT16",
        "INT32",
        "INT64",
        "STRING",
        "BOOL",
        "FLOAT16",
        "DOUBLE",
        "UINT32",
        "UINT64",
    ):
        et = getattr(onnxio, name)
        assert et == getattr(TensorProto, name), name
        assert onnxio.np_dtype(et) == np.dtype(helper.tensor_dtype_to_np_dtype(et)), name
    assert onnxio.np_dtype(TensorProto.BFLOAT16) == np.dtype(helper.tensor_dtype_to_np_dtype(TensorProto.BFLOAT16))


def test_a_static_fallback_noted_at_other_maxima_is_not_applied(cache, tmp_path, rng):
    """Why a model could not build with dynamic dimensions is noted with the max_dimensions it was
    learned at: a later session with other maxima (smaller ones may fit a software adapter's
    buffer limit) tries the dynamic build again; one with the same maxima goes per size at once."""
    from mltensor.session import cache as graph_cache

    model = _model(tmp_path / "m.onnx")
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    a = mltensor.InferenceSession(str(model), max_dimensions={"n": 8})
    a.run(None, {"x": x})
    assert a.stats["dynamic"], a.stats["static_reason"]
    # what a process whose dynamic build failed at n <= 8 leaves in the note
    graph_cache.save_note(
        a, {"value_names": [], "static_reason": "NotSupportedError: too big", "static_maxima": [["n", 8]]}
    )
    same = mltensor.InferenceSession(str(model), max_dimensions={"n": 8})
    assert same.stats["dynamic"] is False and same.stats["static_reason"] == "NotSupportedError: too big"
    other = mltensor.InferenceSession(str(model), max_dimensions={"n": 4})
    other.run(None, {"x": x})
    assert other.stats["dynamic"] and other.stats["static_reason"] is None
