"""Nodes that compute nothing new (compiler/fusion/noop.py): identity transposes and same-shape
reshapes are read through, and a node repeating an earlier one (same operator, inputs and
attributes; small constants by value) is that node. Values against numpy, kernel counts against
the same graph without the repeats; effectful or large-constant nodes are not merged."""

import numpy as np
from helpers import FUSION, dispatch_at

import mltensor
from mltensor.dynamic.dims import MLDynamicDimension as D


def _mask(b, s, neg):
    """T5's per-layer causal mask, where(key > query, neg, 0) over [seq, seq], plus the sequence
    length computed from the sizes (an expand and a sum), written anew."""
    n = s.shape[1]
    r = b.reshape(
        b.cast(
            b.reduce_sum(b.expand(b.constant(np.ones((1,), np.float32)), [n]), axes=[0], keep_dimensions=True),
            "float32",
        ),
        [1],
    )
    causal = b.greater(b.reshape(s, [n, 1]), b.reshape(s, [1, n]))
    return b.add(
        b.where(causal, b.constant(data_type="float32", value=neg), b.constant(data_type="float32", value=0.0)), r
    )


def test_repeats_run_once(ctx):
    """Two layers each computing the same mask from the same input (fresh equal constants each
    time): the second's kernels are the first's; a mask with another constant is computed."""
    rng = np.random.default_rng(0)
    n = D("seq", 16)

    def build(layers, neg2):
        b = mltensor.MLGraphBuilder(ctx)
        s = b.input("s", data_type="float32", shape=[1, n])
        x = b.input("x", data_type="float32", shape=[n, n])
        for k in range(layers):
            x = b.add(b.relu(x), _mask(b, s, -1e9 if k == 0 else neg2))
        return b.build_sync({"y": x})

    one, two, other = build(1, -1e9), build(2, -1e9), build(2, -5.0)
    f = {"s": rng.standard_normal((1, 7)).astype(np.float32), "x": rng.standard_normal((7, 7)).astype(np.float32)}
    sv = f["s"][0]

    def ref(negs):
        x = f["x"].astype(np.float64)
        for neg in negs:
            x = np.maximum(x, 0) + np.where(sv[:, None] > sv[None, :], neg, 0.0) + len(sv)
        return x

    np.testing.assert_allclose(dispatch_at(ctx, two, f)["y"], ref([-1e9, -1e9]), rtol=1e-6)
    np.testing.assert_allclose(dispatch_at(ctx, other, f)["y"], ref([-1e9, -5.0]), rtol=1e-6)
    if FUSION:
        # the second layer adds only its relu + add: the mask's kernels are not launched again
        k1, k2, k3 = (len(g.kernels_run({"s": (1, 7), "x": (7, 7)})) for g in (one, two, other))
        assert k2 < 2 * k1 and k3 > k2, (k1, k2, k3)
    for g in (one, two, other):
        g.destroy()


def test_noop_layout_nodes_read_through(ctx):
    """A transpose by the identity and a reshape to the same shape between a matmul and its
    epilogue: one kernel, as without them."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 12)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 5, 8])
    y = b.matmul(x, b.constant(w))
    y = b.reshape(b.transpose(y, permutation=[0, 1, 2]), [2, 5, 12])
    g = b.build_sync({"y": b.relu(y)})
    xa = rng.standard_normal((2, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(dispatch_at(ctx, g, {"x": xa})["y"], np.maximum(xa @ w, 0), rtol=1e-5, atol=1e-5)
    if FUSION:
        assert len(g.kernel_names) == 1, g.kernel_names
    g.destroy()


def test_whisper_causal_mask_runs_once(ctx):
    """Whisper's decoder writes its causal mask anew in each layer: expand a constant to
    [seq, seq], triangular, equal 0, where. The second layer's triangular (a pure node) and what
    follows it are the first's; a layer whose triangle has another diagonal keeps its own."""
    rng = np.random.default_rng(2)
    n = D("seq", 16)

    def build(diag2):
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[n, n])
        for diag in (1, diag2):
            ones = b.expand(b.constant(np.ones((1, 1), np.float32)), list(x.shape))
            keep = b.equal(b.triangular(ones, upper=True, diagonal=diag), b.constant(data_type="float32", value=0.0))
            mask = b.where(
                keep, b.constant(data_type="float32", value=0.0), b.constant(data_type="float32", value=-9.0)
            )
            x = b.add(b.relu(x), mask)
        return b.build_sync({"y": x})

    same, other = build(1), build(2)
    f = {"x": rng.standard_normal((6, 6)).astype(np.float32)}

    def ref(diags):
        x = f["x"].astype(np.float64)
        for d in diags:
            x = np.maximum(x, 0) + np.where(np.triu(np.ones((6, 6)), d) == 0, 0.0, -9.0)
        return x

    np.testing.assert_allclose(dispatch_at(ctx, same, f)["y"], ref([1, 1]), rtol=1e-6)
    np.testing.assert_allclose(dispatch_at(ctx, other, f)["y"], ref([1, 2]), rtol=1e-6)
    if FUSION:
        runs = [g.kernels_run({"x": (6, 6)}) for g in (same, other)]
        assert sum(k.startswith("triangular") for k in runs[0]) == 1, runs[0]
        assert sum(k.startswith("triangular") for k in runs[1]) == 2, runs[1]
    for g in (same, other):
        g.destroy()
