"""matmul and gemm against float64 numpy references."""

import numpy as np
import pytest
from helpers import FUSION, run_graph

import mltensor


def _check(got, ref, dtype, rtol=1e-4, atol=1e-4):
    assert got.shape == ref.shape
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=atol)


def _mm(ctx, rng, sa, sb, dtype="float32", epilogue=None):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("a", data_type=dtype, shape=sa)
    y = b.input("b", data_type=dtype, shape=sb)
    z = b.matmul(x, y)
    if epilogue:
        z = epilogue(b, z)
    A = rng.standard_normal(sa).astype(dtype)
    B = rng.standard_normal(sb).astype(dtype)
    out = run_graph(ctx, {"z": z}, {"a": A, "b": B}, b)["z"]
    return out, np.matmul(A.astype(np.float64), B.astype(np.float64))


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((5, 7), (7, 9)),  # tiny, edges everywhere
        ((64, 64), (64, 64)),  # exact tiles
        ((33, 70), (70, 45)),  # ragged tiles
        ((70, 33), (33, 130)),  # ragged 64x64 tiles (8x8 outputs per thread)
        ((20, 40), (40, 100)),  # 32x64 tiles
        ((100, 40), (40, 20)),  # 64x32 tiles
        ((1, 100), (100, 37)),  # GEMV path
        ((3, 5), (5, 8)),  # GEMV path, M < 4
        ((40, 3), (3, 2)),  # K smaller than a tile
    ],
)
def test_matmul_2d(ctx, rng, sa, sb):
    got, ref = _mm(ctx, rng, sa, sb)
    _check(got, ref, np.float32)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3, 9, 6), (2, 3, 6, 5)),  # same batch
        ((2, 1, 9, 6), (1, 3, 6, 5)),  # broadcast both ways
        ((4, 9, 6), (6, 5)),  # rank 3 x rank 2
        ((6, 40), (3, 40, 36)),  # rank 2 x rank 3
        ((2, 2, 2, 36, 6), (2, 1, 6, 40)),  # rank 5 x rank 4
        ((3, 2, 8), (3, 8, 3)),  # batched GEMV
    ],
)
def test_matmul_batched_broadcast(ctx, rng, sa, sb):
    got, ref = _mm(ctx, rng, sa, sb)
    _check(got, ref, np.float32)


def test_matmul_float16(ctx, rng):
    got, ref = _mm(ctx, rng, (10, 20), (20, 12), dtype="float16")
    # computed in f32 internally; only the f16 storage of the result rounds
    _check(got, ref, np.float16, rtol=2e-3, atol=2e-3)


def test_matmul_fused_relu(ctx, rng):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("a", data_type="float32", shape=[40, 16])
    w = rng.standard_normal((16, 24)).astype(np.float32)
    z = b.relu(b.matmul(x, b.constant(w)))
    g = b.build_sync({"z": z})
    assert not FUSION or (len(g.kernel_names) == 1 and g.kernel_names[0].startswith("matmul")), g.kernel_names
    A = rng.standard_normal((40, 16)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("a", data_type="float32", shape=[40, 16])
    z = b.relu(b.matmul(x, b.constant(w)))
    got = run_graph(ctx, {"z": z}, {"a": A}, b)["z"]
    _check(got, np.maximum(A.astype(np.float64) @ w, 0), np.float32)


def test_matmul_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="float32", shape=[3, 4])
    with pytest.raises(TypeError, match=r"\[matmul\] columns of a \(4\) must equal rows of b \(5\)"):
        b.matmul(a, b.input("b", data_type="float32", shape=[5, 2]))
    with pytest.raises(TypeError, match="rank"):
        b.matmul(a, b.input("v", data_type="float32", shape=[4]))
    with pytest.raises(TypeError, match="data type"):
        b.matmul(a, b.input("h", data_type="float16", shape=[4, 2]))
    with pytest.raises(TypeError, match="int32"):
        b.matmul(b.input("i", data_type="int32", shape=[2, 2]), b.input("j", data_type="int32", shape=[2, 2]))
    with pytest.raises(TypeError, match="broadcast"):
        b.matmul(b.input("x", data_type="float32", shape=[2, 3, 4]), b.input("y", data_type="float32", shape=[3, 4, 2]))


# -- gemm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("at", [False, True])
@pytest.mark.parametrize("bt", [False, True])
@pytest.mark.parametrize("c_shape", [None, (), (1,), (11,), (9, 1), (9, 11)])
def test_gemm(ctx, rng, at, bt, c_shape):
    M, K, N = 9, 13, 11
    A = rng.standard_normal((K, M) if at else (M, K)).astype(np.float32)
    B = rng.standard_normal((N, K) if bt else (K, N)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="float32", shape=A.shape)
    w = b.input("b", data_type="float32", shape=B.shape)
    opts = {"alpha": 0.5, "beta": -2.0, "a_transpose": at, "b_transpose": bt}
    ref = 0.5 * ((A.T if at else A).astype(np.float64) @ (B.T if bt else B))
    feeds = {"a": A, "b": B}
    if c_shape is not None:
        C = rng.standard_normal(c_shape).astype(np.float32)
        opts["c"] = b.input("c", data_type="float32", shape=c_shape)
        feeds["c"] = C
        ref = ref - 2.0 * C
    got = run_graph(ctx, {"y": b.gemm(a, w, **opts)}, feeds, b)["y"]
    _check(got, ref, np.float32)


def test_gemm_large_fused_clamp(ctx, rng):
    M, K, N = 70, 50, 65
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = rng.standard_normal((N,)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="float32", shape=[M, K])
    y = b.clamp(b.gemm(a, b.constant(B), c=b.constant(C)), min_value=-1.0, max_value=2.0)
    g = b.build_sync({"y": y})
    assert not FUSION or (len(g.kernel_names) == 1 and g.kernel_names[0].startswith("gemm")), g.kernel_names
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="float32", shape=[M, K])
    y = b.clamp(b.gemm(a, b.constant(B), c=b.constant(C)), min_value=-1.0, max_value=2.0)
    got = run_graph(ctx, {"y": y}, {"a": A}, b)["y"]
    _check(got, np.clip(A.astype(np.float64) @ B + C, -1, 2), np.float32)


def test_gemm_float16(ctx, rng):
    A = rng.standard_normal((6, 8)).astype(np.float16)
    B = rng.standard_normal((8, 5)).astype(np.float16)
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="float16", shape=[6, 8])
    got = run_graph(ctx, {"y": b.gemm(a, b.constant(B))}, {"a": A}, b)["y"]
    _check(got, A.astype(np.float64) @ B, np.float16, rtol=2e-3, atol=2e-3)


def test_gemm_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    a = b.input("a", data_type="float32", shape=[3, 4])
    w = b.input("b", data_type="float32", shape=[4, 5])
    with pytest.raises(TypeError, match=r"\[gemm\] K of a \(3\) must equal K of b \(4\)"):
        b.gemm(a, w, a_transpose=True)
    with pytest.raises(TypeError, match="rank"):
        b.gemm(b.input("x", data_type="float32", shape=[1, 3, 4]), w)
    with pytest.raises(TypeError, match="broadcast"):
        b.gemm(a, w, c=b.input("c", data_type="float32", shape=[4]))
    with pytest.raises(TypeError, match="rank"):
        b.gemm(a, w, c=b.input("c3", data_type="float32", shape=[1, 3, 5]))
    with pytest.raises(TypeError, match="alpha"):
        b.gemm(a, w, alpha="2")
    with pytest.raises(TypeError, match="a_transpose"):
        b.gemm(a, w, a_transpose=1)
    with pytest.raises(TypeError, match="data type"):
        b.gemm(a, w, c=b.input("h", data_type="float16", shape=[5]))
