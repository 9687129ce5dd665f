"""Shared test helpers (import as `from helpers import run_graph`)."""

import os
import threading

import numpy as np

import mltensor

# Kernel counts are fusion's results: tests check them with fusion on; under MLTENSOR_NO_FUSION=1
# (one kernel per node, for comparison) they check only the values.
FUSION = os.environ.get("MLTENSOR_NO_FUSION", "") in ("", "0")


def context_with_env(**env):
    """A new MLContext created with environment variables set (e.g. MLTENSOR_DISABLE_F16="1":
    the switches read at context creation), the environment restored afterwards."""
    import pytest

    from mltensor import ml

    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        return ml.create_context_sync()


@__import__("contextlib").contextmanager
def build_switch(name, value):
    """Environment variable `name` set to `value` for the builds made inside (a build reads its
    switches: a session builds at creation or at a run of new sizes), restored afterwards."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def fusion(on):
    """MLTENSOR_NO_FUSION off (on=True) or on for the builds made inside."""
    return build_switch("MLTENSOR_NO_FUSION", "0" if on else "1")


def size_params(on):
    """MLTENSOR_NO_SIZE_PARAMS off (on=True) or on for the builds made inside."""
    return build_switch("MLTENSOR_NO_SIZE_PARAMS", "0" if on else "1")


def run_graph(ctx, outputs, feeds, builder):
    """Build `outputs` (dict name -> operand), dispatch with numpy `feeds`, return numpy dict."""
    g = builder.build_sync(outputs)
    ins = {}
    for name, arr in feeds.items():
        dt, shape = g.input_descriptors[name]
        t = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
        ctx.write_tensor(t, np.ascontiguousarray(arr, dtype=mltensor.dtypes.NUMPY[dt]))
        ins[name] = t
    outs = {
        n: ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True)
        for n, (dt, shape) in g.output_descriptors.items()
    }
    ctx.dispatch(g, ins, outs)
    res = {n: ctx.read_tensor_sync(t) for n, t in outs.items()}
    for t in list(ins.values()) + list(outs.values()):
        t.destroy()
    g.destroy()
    return res


def assert_exact(got, want):
    """Shape, then dtype, then every value equal (for operators with exact results)."""
    want = np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


def dispatch_at(ctx, g, feeds):
    """Dispatch graph `g` on numpy `feeds` of any sizes it allows (dynamic dimensions: the
    output shapes from g.compute_shapes) and return {output: numpy}; the tensors are destroyed."""
    ins = {}
    for name, a in feeds.items():
        t = ctx.create_tensor_sync(data_type=g.input_descriptors[name][0], shape=a.shape, writable=True)
        ctx.write_tensor(t, a)
        ins[name] = t
    shapes = g.compute_shapes({n: a.shape for n, a in feeds.items()})
    outs = {
        n: ctx.create_tensor_sync(data_type=g.output_descriptors[n][0], shape=s, readable=True)
        for n, s in shapes.items()
    }
    try:
        ctx.dispatch(g, ins, outs)
        return {n: ctx.read_tensor_sync(t) for n, t in outs.items()}
    finally:
        for t in [*ins.values(), *outs.values()]:
            t.destroy()


def one_node_model(op, inputs, outputs, attrs=None, *, opset=21, domain=""):
    """An ONNX model of one node. inputs: [(name, array or None, fed)]: fed ones are graph inputs,
    the others initializers (None: an omitted optional input). outputs: [(name, onnx type)].
    domain "com.microsoft": an onnxruntime contrib operator (the domain is imported too)."""
    from onnx import helper as h
    from onnx import numpy_helper as nh

    vis, inits, names = [], [], []
    for name, arr, fed in inputs:
        if arr is None:
            names.append("")
            continue
        names.append(name)
        if fed:
            vis.append(h.make_tensor_value_info(name, h.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        else:
            inits.append(nh.from_array(arr, name))
    node = h.make_node(op, names, [o for o, _ in outputs], domain=domain, **(attrs or {}))
    g = h.make_graph([node], "g", vis, [h.make_tensor_value_info(o, t, None) for o, t in outputs], inits)
    imports = [h.make_opsetid("", opset)] + ([h.make_opsetid(domain, 1)] if domain else [])
    return h.make_model(g, opset_imports=imports, ir_version=10 if not domain else 8)


def fed_values(inputs):
    """The feeds of one_node_model's fed inputs."""
    return {name: arr for name, arr, fed in inputs if fed and arr is not None}


def without_accuracy_level(model):
    """A copy of an ONNX model with MatMulNBits' accuracy_level removed: onnxruntime's level 4
    quantizes A to int8 (an approximation); level 0 computes in f32, as mltensor always does, so
    that is the reference."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        keep = [a for a in n.attribute if a.name != "accuracy_level"]
        del n.attribute[:]
        n.attribute.extend(keep)
    return m


def in_threads(fn, args, timeout=300):
    """Run fn(*a) for each `a` of `args`, each in its own thread, all at once; re-raise the first
    exception any of them raised (an assertion in a thread would otherwise only be printed)."""
    errors = []

    def run(a):
        try:
            fn(*a)
        except BaseException as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]


def launches_run(graph, feeds):
    """The launches one run of `graph` at the sizes of numpy `feeds` makes (MLGraph.kernels_run:
    size variants with no work at those sizes are not counted)."""
    return len(graph.kernels_run({k: feeds[k].shape for k in graph.input_descriptors}))
