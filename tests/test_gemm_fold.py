"""Batch folding in the GEMM lowering (issue 41): a matmul whose B is one matrix for every batch
entry (a projection's 2-D weight, or batch dimensions of 1) and whose A is not broadcast runs as
one GEMM of batch * M rows, with its fused epilogue, normalization and views, static or dynamic;
the GEMV path is left to rows that are really few. Values against float64 numpy, the launch
against the built graph's kernel names."""

import math

import numpy as np
import pytest
from helpers import FUSION
from helpers import dispatch_at as _run

import mltensor
from mltensor.dynamic.dims import MLDynamicDimension as D


def _close(got, want, rtol=1e-4):
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


def _matmuls(g):
    return [k for k in g.kernel_names if k.startswith("matmul")]


@pytest.mark.parametrize(
    "a_shape, b_shape, rows",
    [
        ((197, 1, 64), (64, 96), 197),  # torchvision ViT's sequence-first in-projection (was 197 GEMVs)
        ((1, 7, 7, 24), (24, 40), 49),  # ConvNeXt's channels-last Linear (was 7 GEMMs of 7 rows)
        ((3, 5, 16), (1, 16, 8), 15),  # B's batch dimension of 1
        ((2, 3, 4, 8), (8, 12), 24),
        ((2, 1, 8), (8, 12), 2),  # 2 rows: still the GEMV path, one launch reading B once
    ],
)
def test_folded_matmul(ctx, a_shape, b_shape, rows):
    """relu(x @ W + r): one GEMM of every row, the epilogue (residual, activation) fused."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal(b_shape).astype(np.float32)
    r = rng.standard_normal(a_shape[:-1] + b_shape[-1:]).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(a_shape))
    g = b.build_sync({"y": b.relu(b.add(b.matmul(x, b.constant(w)), b.constant(r)))})
    xa = rng.standard_normal(a_shape).astype(np.float32)
    _close(_run(ctx, g, {"x": xa})["y"], np.maximum(xa.astype(np.float64) @ w + r, 0))
    if FUSION:
        (k,) = _matmuls(g)
        K, N = b_shape[-2:]
        assert k.startswith(f"matmul_f32_{rows}x{K}x{N}_"), k
        assert ("gemv" in k) == (rows <= 4), k
    g.destroy()


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((1, 6, 8), (3, 8, 5)),  # A broadcast over B's batch: B differs per entry
        ((3, 6, 8), (3, 8, 5)),  # a batch of different B matrices (attention's scores)
    ],
)
def test_not_folded(ctx, a_shape, b_shape):
    """Where B differs between batch entries the GEMM stays batched, and right."""
    rng = np.random.default_rng(1)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(a_shape))
    y = b.input("y", data_type="float32", shape=list(b_shape))
    g = b.build_sync({"z": b.matmul(x, y)})
    xa, ya = (rng.standard_normal(s).astype(np.float32) for s in (a_shape, b_shape))
    _close(_run(ctx, g, {"x": xa, "y": ya})["z"], xa.astype(np.float64) @ ya)
    assert all("_b3_" in k for k in _matmuls(g)), g.kernel_names
    g.destroy()


def test_folded_dynamic_batch(ctx):
    """Batch and sequence known only at dispatch: one GEMM of b * s rows at every size, the GEMV
    bucket taking the sizes of 4 rows or fewer."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 24)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("b", 8), D("s", 16), 16])
    g = b.build_sync({"y": b.gelu(b.matmul(x, b.constant(w)))})
    assert all(k.startswith("matmul_f32_b*sx16x24_") for k in _matmuls(g)), g.kernel_names  # M = b * s
    for shape in [(1, 1, 16), (2, 2, 16), (3, 5, 16), (8, 16, 16)]:
        xa = rng.standard_normal(shape).astype(np.float32)
        h = xa.astype(np.float64) @ w
        want = 0.5 * h * (1 + np.vectorize(math.erf)(h / np.sqrt(2)))
        before = ctx.counters["kernel_launches"]
        _close(_run(ctx, g, {"x": xa})["y"], want)
        # one GEMM runs at each size (the GEMV bucket for 4 rows or fewer): kernels_run names it,
        # and the context counts the launches the dispatch made
        (k,) = g.kernels_run({"x": shape})
        assert ("gemv" in k) == (shape[0] * shape[1] <= 4), (shape, k)
        assert ctx.counters["kernel_launches"] - before == 1
    g.destroy()


def test_folded_post_norm(ctx):
    """layer_norm(x @ W + x) over a batch: the norm fused after the folded GEMM (whole rows)."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((32, 32)) * 0.2).astype(np.float32)
    s, bias = rng.standard_normal(32).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, 5, 32])
    h = b.add(b.matmul(x, b.constant(w)), x)
    y = b.layer_normalization(h, scale=b.constant(s), bias=b.constant(bias), axes=[2])
    g = b.build_sync({"y": y})
    xa = rng.standard_normal((3, 5, 32)).astype(np.float32)
    hh = xa.astype(np.float64) @ w + xa
    want = (hh - hh.mean(-1, keepdims=True)) / np.sqrt(hh.var(-1, keepdims=True) + 1e-5) * s + bias
    _close(_run(ctx, g, {"x": xa})["y"], want)
    if FUSION:
        assert [k for k in _matmuls(g) if k.startswith("matmul_f32_15x32x32_")], g.kernel_names
    g.destroy()


def test_folded_head_split(ctx):
    """A projection of [B, S, E] written through the head split (reshape, transpose: a fused
    GEMM's views): one GEMM of B * S rows, each stored where its batch entry's heads go."""
    rng = np.random.default_rng(4)
    B, S, H, Dh = 2, 6, 4, 8
    E = H * Dh
    wq, wk = (rng.standard_normal((E, E)).astype(np.float32) for _ in range(2))
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[B, S, E])

    def heads(w):
        return b.transpose(b.reshape(b.matmul(x, b.constant(w)), [B, S, H, Dh]), permutation=[0, 2, 1, 3])

    g = b.build_sync({"q": heads(wq), "k": heads(wk)})
    xa = rng.standard_normal((B, S, E)).astype(np.float32)
    got = _run(ctx, g, {"x": xa})
    for name, w in (("q", wq), ("k", wk)):
        want = (xa.astype(np.float64) @ w).reshape(B, S, H, Dh).transpose(0, 2, 1, 3)
        _close(got[name], want)
    if FUSION:
        assert not any("transpose" in k for k in g.kernel_names), g.kernel_names
        assert all(k.startswith(f"matmul_f32_{B * S}x{E}x") for k in _matmuls(g)), g.kernel_names
    g.destroy()


def test_sequence_first_projections_dynamic_batch(ctx):
    """nn.MultiheadAttention's projections around a batch-first layer, batch known at dispatch:
    the in-projection reads its A through the [B, S, E] -> [S, B, E] transpose, the
    out-projection (a Gemm with a transposed weight and a bias) reads the head merge
    [B, H, S, D] -> [S * B, E] and writes back through [S, B, E] -> [B, S, E]: each one GEMM of
    S * b rows (the view read per folded row), no transpose launched."""
    rng = np.random.default_rng(5)
    S, H, Dh = 5, 2, 8
    E = H * Dh
    w_in = rng.standard_normal((E, E)).astype(np.float32)
    w_out, bias = rng.standard_normal((E, E)).astype(np.float32), rng.standard_normal(E).astype(np.float32)
    bd = D("batch", 6)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[bd, S, E])
    h = b.input("h", data_type="float32", shape=[bd, H, S, Dh])
    q = b.matmul(b.transpose(x, permutation=[1, 0, 2]), b.constant(w_in))  # [S, b, E]
    n = x.shape[0]  # (the batch as a size expression)
    merged = b.reshape(b.transpose(h, permutation=[2, 0, 1, 3]), [S * n, E])
    o = b.gemm(merged, b.constant(w_out), c=b.constant(bias), b_transpose=True)
    y = b.add(b.transpose(b.reshape(o, [S, n, E]), permutation=[1, 0, 2]), x)
    g = b.build_sync({"q": b.relu(q), "y": y})
    for n in (1, 3, 6):
        xa = rng.standard_normal((n, S, E)).astype(np.float32)
        ha = rng.standard_normal((n, H, S, Dh)).astype(np.float32)
        got = _run(ctx, g, {"x": xa, "h": ha})
        _close(got["q"], np.maximum(xa.transpose(1, 0, 2).astype(np.float64) @ w_in, 0))
        m = ha.transpose(2, 0, 1, 3).reshape(S * n, E).astype(np.float64)
        _close(got["y"], (m @ w_out.T + bias).reshape(S, n, E).transpose(1, 0, 2) + xa)
        run = g.kernels_run({"x": (n, S, E), "h": (n, H, S, Dh)})
        if FUSION:
            assert not [k for k in run if "transpose" in k], run
            assert len(run) == 2 and all(k.startswith("matmul_f32_") and "aview" in k for k in run), run
    g.destroy()


def test_folded_integer_matmul(ctx):
    """ONNX MatMulInteger of a [2, 3, K] activation by a [K, N] int8 weight (per-column zero
    points), as onnxruntime's quantize_dynamic writes: folded, against onnxruntime."""
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from mltensor import InferenceSession

    rng = np.random.default_rng(5)
    K, N = 16, 12
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    zb = rng.integers(-3, 4, (N,), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "w", "za", "zb"], ["y"])],
        "mmi",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 3, K])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3, N])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(128, np.uint8), "za"),
            numpy_helper.from_array(zb, "zb"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    data = model.SerializeToString()
    a = rng.integers(0, 256, (2, 3, K), dtype=np.uint8)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    sess = InferenceSession(data, context=ctx)
    np.testing.assert_array_equal(sess.run(None, {"a": a})[0], want)
    assert [k for k in sess.graph.kernel_names if k.startswith("int_matmul_uint8_int8") and f"_6x{K}x{N}_" in k], (
        sess.graph.kernel_names
    )


def test_products_meeting_in_one_epilogue_are_not_fused_twice(ctx):
    """x_r C - x_i S and x_r S + x_i C (a complex product: DFT), their results reshaped and
    concatenated: x_r's two products fuse into one GEMM, and x_i's may not take the same
    subtraction and addition into their own (each would read the other's product, which neither
    GEMM then writes: wrong values). Against numpy."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 64, 2)).astype(np.float32)
    C, S = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 64, 2])
    xr = b.reshape(b.slice(x, [0, 0, 0], [2, 64, 1]), [2, 64])
    xi = b.reshape(b.slice(x, [0, 0, 1], [2, 64, 1]), [2, 64])
    c, s = b.constant(C), b.constant(S)
    re = b.sub(b.matmul(xr, c), b.matmul(xi, s))
    im = b.add(b.matmul(xr, s), b.matmul(xi, c))
    y = b.concat([b.reshape(re, [2, 64, 1]), b.reshape(im, [2, 64, 1])], 2)
    g = b.build_sync({"y": y})
    got = _run(ctx, g, {"x": X})["y"]
    Xr, Xi = X[..., 0].astype(np.float64), X[..., 1].astype(np.float64)
    want = np.stack([Xr @ C - Xi @ S, Xr @ S + Xi @ C], axis=-1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    if FUSION:
        assert any("plain+plain" in k for k in g.kernel_names), g.kernel_names  # (x_r's pair still fused)
