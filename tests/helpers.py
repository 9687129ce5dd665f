"""Shared test helpers (import as `from helpers import run_graph`)."""

import os

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
    outs = {n: ctx.create_tensor_sync(data_type=g.output_descriptors[n][0], shape=s, readable=True)
            for n, s in shapes.items()}
    try:
        ctx.dispatch(g, ins, outs)
        return {n: ctx.read_tensor_sync(t) for n, t in outs.items()}
    finally:
        for t in [*ins.values(), *outs.values()]:
            t.destroy()
