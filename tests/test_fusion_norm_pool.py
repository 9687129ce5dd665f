"""Pooling and normalizations with fused epilogues (issue 15): one kernel for pool -> relu,
batch_normalization -> relu (densenet), layer_normalization -> add residual; values vs numpy,
and MLTENSOR_NO_FUSION=1 keeps one kernel per node."""

import os

import numpy as np
import pytest

import mltensor

# counts are checked with fusion on; under MLTENSOR_NO_FUSION=1 only the values are
FUSION = os.environ.get("MLTENSOR_NO_FUSION", "") in ("", "0")


def _graph(ctx, shape, fn):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(shape))
    return b.build_sync({"y": fn(b, x)})


def _run(ctx, g, a):
    t = ctx.create_tensor_sync(data_type="float32", shape=list(a.shape), writable=True)
    ctx.write_tensor(t, a)
    dt, shape = g.output_descriptors["y"]
    out = ctx.create_tensor_sync(data_type=dt, shape=list(shape), readable=True)
    ctx.dispatch(g, {"x": t}, {"y": out})
    return ctx.read_tensor_sync(out)


def _c(b, v):
    v = np.asarray(v, np.float32)
    return b.constant(v) if v.ndim else b.constant(data_type="float32", value=float(v))


def _cases(rng):
    c = 6
    mean, var = rng.standard_normal(c).astype(np.float32), rng.uniform(0.5, 1.5, c).astype(np.float32)
    scale, bias = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    resid = rng.standard_normal((1, c, 1, 1)).astype(np.float32)

    def bn(b, x):
        y = b.batch_normalization(x, _c(b, mean), _c(b, var), scale=_c(b, scale), bias=_c(b, bias))
        return b.relu(y)

    def bn_ref(a):
        s = lambda v: v.reshape(1, c, 1, 1)  # noqa: E731
        return np.maximum((a - s(mean)) / np.sqrt(s(var) + 1e-5) * s(scale) + s(bias), 0)

    def pool(b, x):
        return b.add(
            b.clamp(b.max_pool2d(x, window_dimensions=[2, 2], strides=[2, 2]), min_value=0.0, max_value=1.0),
            _c(b, resid),
        )

    def pool_ref(a):
        m = a.reshape(1, c, 4, 2, 4, 2).max((3, 5))
        return np.clip(m, 0, 1) + resid

    def gpool(b, x):
        return b.sigmoid(b.average_pool2d(x))

    def gpool_ref(a):
        return 1 / (1 + np.exp(-a.mean((2, 3), keepdims=True)))

    def ln(b, x):
        return b.mul(b.layer_normalization(x, axes=[1, 2, 3]), _c(b, 0.5))

    def ln_ref(a):
        mu, v = a.mean((1, 2, 3), keepdims=True), a.var((1, 2, 3), keepdims=True)
        return 0.5 * (a - mu) / np.sqrt(v + 1e-5)

    return {
        "batchnorm_relu": (bn, bn_ref),
        "maxpool_clamp_add": (pool, pool_ref),
        "global_avgpool_sigmoid": (gpool, gpool_ref),
        "layernorm_mul": (ln, ln_ref),
    }


@pytest.mark.parametrize("case", ["batchnorm_relu", "maxpool_clamp_add", "global_avgpool_sigmoid", "layernorm_mul"])
def test_one_kernel_with_epilogue(ctx, rng, case):
    fn, ref = _cases(rng)[case]
    a = rng.standard_normal((1, 6, 8, 8)).astype(np.float32)
    g = _graph(ctx, a.shape, fn)
    assert not FUSION or len(g.kernel_names) == 1, g.kernel_names
    np.testing.assert_allclose(_run(ctx, g, a), ref(a), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", ["batchnorm_relu", "maxpool_clamp_add"])
def test_no_fusion_switch(ctx, rng, case, monkeypatch):
    monkeypatch.setenv("MLTENSOR_NO_FUSION", "1")
    fn, ref = _cases(rng)[case]
    a = rng.standard_normal((1, 6, 8, 8)).astype(np.float32)
    g = _graph(ctx, a.shape, fn)
    assert len(g.kernel_names) >= 2, g.kernel_names
    np.testing.assert_allclose(_run(ctx, g, a), ref(a), rtol=1e-4, atol=1e-5)
