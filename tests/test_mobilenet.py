"""A MobileNetV3-style network built with the builder (random weights) against float64 numpy.

Stem conv + hard_swish, depthwise + relu, squeeze-excite (global average pool, 1x1 convs, sigmoid,
mul), an inverted residual block (expand, depthwise, project, add), and a segmentation-style head
(1x1 conv, bilinear resample2d x2, sigmoid); in both layouts (NHWC with OHWI / IHWO filters as the
TFLite importer emits them).
"""

import numpy as np
import pytest
from helpers import FUSION, run_graph
from test_ops_conv import conv2d_ref
from test_ops_pool import pool_ref

import mltensor
from mltensor import MLGraphBuilder


def hard_swish(x):
    return x * np.clip(x / 6 + 0.5, 0, 1)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def resize_linear_ref(x, out_hw):
    """Bilinear, half-pixel, source coordinate clamped to [0, size - 1] (the spec's), NCHW."""

    def weights(n_in, n_out):
        src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        i0 = np.floor(src).astype(int)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, src - i0

    h0, h1, fh = weights(x.shape[2], out_hw[0])
    w0, w1, fw = weights(x.shape[3], out_hw[1])
    rows = x[:, :, h0] * (1 - fh)[:, None] + x[:, :, h1] * fh[:, None]
    return rows[:, :, :, w0] * (1 - fw) + rows[:, :, :, w1] * fw


class Net:
    """Weights in OIHW; `conv` records each layer for both the builder and the reference."""

    def __init__(self, rng):
        self.rng = rng
        self.params = {}

    def w(self, name, oc, icg, k):
        if name not in self.params:
            std = np.sqrt(2.0 / (icg * k * k))
            self.params[name] = (
                (self.rng.standard_normal((oc, icg, k, k)) * std).astype(np.float32),
                (self.rng.standard_normal(oc) * 0.1).astype(np.float32),
            )
        return self.params[name]


def forward_ref(net, x):
    def conv(name, x, oc, k, stride=1, groups=1):
        icg = x.shape[1] // groups
        w, b = net.w(name, oc, icg, k)
        p = k // 2
        return conv2d_ref(x, w, (p, p, p, p), (stride, stride), (1, 1), groups, b)

    x = x.astype(np.float64)
    x = hard_swish(conv("stem", x, 16, 3, stride=2))
    x = np.maximum(conv("dw1", x, 16, 3, groups=16), 0)
    s = pool_ref(x, "avg", x.shape[2:], out_hw=(1, 1))
    s = np.maximum(conv("se1", s, 8, 1), 0)
    s = sigmoid(conv("se2", s, 16, 1))
    x = conv("pw1", x * s, 24, 1)
    y = hard_swish(conv("exp", x, 48, 1))
    y = hard_swish(conv("dw2", y, 48, 3, groups=48))
    x = x + conv("proj", y, 24, 1)
    x = np.maximum(conv("head", x, 8, 1), 0)
    x = resize_linear_ref(x, (x.shape[2] * 2, x.shape[3] * 2))
    return sigmoid(x)


def forward_graph(net, b, x, layout):
    nhwc = layout == "nhwc"

    def conv(name, x, oc, k, stride=1, groups=1):
        ic = x.shape[3] if nhwc else x.shape[1]
        w, bias = net.w(name, oc, ic // groups, k)
        if nhwc:
            # TFLite: OHWI filters, depthwise filters IHWO ([1, H, W, channels])
            fl = "ihwo" if groups > 1 else "ohwi"
            w = w.transpose((1, 2, 3, 0) if groups > 1 else (0, 2, 3, 1))
        else:
            fl = "oihw"
        p = k // 2
        return b.conv2d(
            x,
            b.constant(np.ascontiguousarray(w)),
            bias=b.constant(bias),
            padding=[p] * 4,
            strides=[stride] * 2,
            groups=groups,
            input_layout=layout,
            filter_layout=fl,
        )

    x = b.hard_swish(conv("stem", x, 16, 3, stride=2))
    x = b.relu(conv("dw1", x, 16, 3, groups=16))
    s = b.average_pool2d(x, layout=layout)
    s = b.relu(conv("se1", s, 8, 1))
    s = b.sigmoid(conv("se2", s, 16, 1))
    x = conv("pw1", b.mul(x, s), 24, 1)
    y = b.hard_swish(conv("exp", x, 48, 1))
    y = b.hard_swish(conv("dw2", y, 48, 3, groups=48))
    x = b.add(x, conv("proj", y, 24, 1))
    x = b.relu(conv("head", x, 8, 1))
    hw = x.shape[1:3] if nhwc else x.shape[2:4]
    x = b.resample2d(x, mode="linear", sizes=[hw[0] * 2, hw[1] * 2], axes=[1, 2] if nhwc else [2, 3])
    return b.sigmoid(x)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_mobilenet_block_matches_numpy(ctx, rng, layout):
    if not hasattr(MLGraphBuilder, "resample2d"):
        pytest.skip("resample2d is not implemented yet")
    net = Net(rng)
    X = rng.random((1, 3, 32, 32)).astype(np.float32)
    ref = forward_ref(net, X)
    feed = np.ascontiguousarray(X.transpose(0, 2, 3, 1)) if layout == "nhwc" else X
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=feed.shape)
    y = forward_graph(net, b, x, layout)
    got = run_graph(ctx, {"y": y}, {"x": feed}, b)["y"]
    if layout == "nhwc":
        got = got.transpose(0, 3, 1, 2)
    assert got.shape == ref.shape == (1, 8, 32, 32)
    assert got.dtype == np.float32
    scale = np.abs(ref).max()
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * scale)


def test_mobilenet_fuses_activations(ctx, rng):
    """Every conv + activation pair is one kernel, and so is the residual add after proj; no layout
    transposes in the NHWC graph."""
    if not hasattr(MLGraphBuilder, "resample2d"):
        pytest.skip("resample2d is not implemented yet")
    net = Net(rng)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 32, 32, 3])
    g = b.build_sync({"y": forward_graph(net, b, x, "nhwc")})
    names = g.kernel_names
    convs = [n for n in names if n.startswith("conv2d")]
    if not FUSION:
        return  # the counts below are fusion's
    assert len(convs) == 7, names  # 9, less se1 and se2: the gate kernel runs them after the pool
    assert not any("transpose" in n for n in names), names
    # the activations of stem, dw1, se1, se2, exp, dw2 (twice hard_swish) and head are fused,
    # the residual add into proj, the squeeze-and-excitation product into the conv after it
    assert len(names) == 7 + 3, names  # + gate (pool, se1, se2), resample, sigmoid
    assert sum(n.startswith("gate_") for n in names) == 1, names
    assert sum("_scaled_" in n for n in names) == 1, names
    assert not any(n.startswith("ew_add") for n in names), names
