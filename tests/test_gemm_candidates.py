"""Every configuration the autotuner may pick (tile shape, threads, split-K) against float64 numpy,
for matmul, gemm and each conv2d variant, on ragged and aligned shapes: the tuner chooses by speed
only, so each candidate must be correct on its own. Small shapes by default, bigger ones `slow`."""

import numpy as np
import pytest
from helpers import run_graph
from test_ops_conv import _run_conv

import mltensor
from mltensor.ops import _gemm as gemm_engine
from mltensor.ops._gemm import gemm_candidates
from mltensor.runtime import autotune


def _close(got, ref):
    assert got.shape == ref.shape
    assert got.dtype == np.float32
    np.testing.assert_allclose(
        got.astype(np.float64), ref, rtol=2e-4, atol=2e-4 * np.sqrt(ref.size and np.abs(ref).max())
    )


def _each_candidate(M, N, K, batch, direct=False):
    """Indices of the candidates; `direct`: matmul.wgsl's list, the DIRECT tile first."""
    cands, _ = gemm_candidates(M, N, K, batch, direct=direct)
    assert len(cands) >= 1
    return range(len(cands))


MATMUL = [
    ((70, 45), (45, 130)),  # ragged M, N, K
    ((128, 64), (64, 128)),  # aligned to every tile
    ((96, 600), (600, 72)),  # deep K: split-K candidates, K not a multiple of the chunk
    ((2, 3, 37, 200), (1, 3, 200, 65)),  # batch with broadcasting, split-K
]
MATMUL_SLOW = [((257, 1031), (1031, 263)), ((4, 130, 1000), (1000, 129))]


def _matmul(ctx, rng, sa, sb, epilogue):
    A = rng.standard_normal(sa).astype(np.float32)
    B = rng.standard_normal(sb).astype(np.float32)
    R = rng.standard_normal(np.broadcast_shapes(sa[:-2], sb[:-2]) + (sa[-2], sb[-1])).astype(np.float32)
    M, K, N = sa[-2], sa[-1], sb[-1]
    batch = int(np.prod(np.broadcast_shapes(sa[:-2], sb[:-2])))
    ref = np.matmul(A.astype(np.float64), B.astype(np.float64))
    if epilogue:
        ref = np.maximum(ref + R, 0)
    for i in _each_candidate(M, N, K, batch, direct=True):
        with autotune.force(i):
            b = mltensor.MLGraphBuilder(ctx)
            z = b.matmul(b.input("a", data_type="float32", shape=sa), b.input("b", data_type="float32", shape=sb))
            if epilogue:
                z = b.relu(b.add(z, b.input("r", data_type="float32", shape=R.shape)))
            got = run_graph(ctx, {"z": z}, {"a": A, "b": B, "r": R} if epilogue else {"a": A, "b": B}, b)["z"]
        _close(got, ref)


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("sa,sb", MATMUL)
def test_matmul_every_candidate(ctx, rng, monkeypatch, sa, sb, vec):
    # vec4 global loads are the hardware-adapter default; force each way on any adapter
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    _matmul(ctx, rng, sa, sb, epilogue=False)


# (a batch of GEMVs where B differs per batch entry: a 2-D B folds the batch into the rows,
# ops/_gemm.py folds_batch, and 12 rows take the tiled path)
@pytest.mark.parametrize("sa,sb", [((1, 300), (300, 70)), ((3, 4, 129), (3, 129, 8)), ((2, 64), (64, 1030))])
@pytest.mark.parametrize("sg", [0, 1], ids=["workgroup_memory", "subgroups"])
def test_matmul_gemv_variants(ctx, rng, sa, sb, sg):
    # M <= 4: the GEMV path, reduced in workgroup memory or (candidate 1) within subgroups first
    if sg and "subgroup" not in ctx.device.features:
        pytest.skip("the adapter has no subgroups")
    A = rng.standard_normal(sa).astype(np.float32)
    B = rng.standard_normal(sb).astype(np.float32)
    with autotune.force(sg):
        for check_name in (True, False):
            b = mltensor.MLGraphBuilder(ctx)
            z = b.relu(b.matmul(b.input("a", data_type="float32", shape=sa), b.constant(B)))
            if check_name:
                assert b.build_sync({"z": z}).kernel_names[0].endswith("_gemv_sg" if sg else "_gemv")
        got = run_graph(ctx, {"z": z}, {"a": A}, b)["z"]
    _close(got, np.maximum(np.matmul(A.astype(np.float64), B), 0))


def test_matmul_every_candidate_residual_relu(ctx, rng):
    _matmul(ctx, rng, (96, 600), (600, 72), epilogue=True)


@pytest.mark.slow
@pytest.mark.parametrize("sa,sb", MATMUL_SLOW)
def test_matmul_every_candidate_big(ctx, rng, sa, sb):
    _matmul(ctx, rng, sa, sb, epilogue=True)


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("at,bt", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_every_candidate(ctx, rng, monkeypatch, at, bt, vec):
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)  # vec: transposed B staged k-major
    M, K, N = 67, 530, 90
    A = rng.standard_normal((K, M) if at else (M, K)).astype(np.float32)
    B = rng.standard_normal((N, K) if bt else (K, N)).astype(np.float32)
    C = rng.standard_normal((N,)).astype(np.float32)
    ref = 0.5 * ((A.T if at else A).astype(np.float64) @ (B.T if bt else B)) + 2.0 * C
    for i in _each_candidate(M, N, K, 1, direct=True):
        with autotune.force(i):
            b = mltensor.MLGraphBuilder(ctx)
            z = b.gemm(
                b.input("a", data_type="float32", shape=A.shape),
                b.constant(B),
                c=b.constant(C),
                alpha=0.5,
                beta=2.0,
                a_transpose=at,
                b_transpose=bt,
            )
            got = run_graph(ctx, {"z": z}, {"a": A}, b)["z"]
        _close(got, ref)


def _conv_mnk(xshape, wshape, transpose, opts):
    n, ic, ih, iw = xshape
    g = opts.get("groups", 1)
    pad = opts.get("padding", [0, 0, 0, 0])
    (sh, sw), (dh, dw) = opts.get("strides", [1, 1]), opts.get("dilations", [1, 1])
    if transpose:
        _, ocg, kh, kw = wshape
        oh = (ih - 1) * sh + (kh - 1) * dh + 1 - pad[0] - pad[1]
        ow = (iw - 1) * sw + (kw - 1) * dw + 1 - pad[2] - pad[3]
        icg = ic // g
    else:
        oc, icg, kh, kw = wshape
        ocg = oc // g
        oh = (ih + pad[0] + pad[1] - ((kh - 1) * dh + 1)) // sh + 1
        ow = (iw + pad[2] + pad[3] - ((kw - 1) * dw + 1)) // sw + 1
    return n * oh * ow, ocg, icg * kh * kw, g


CONV = [
    # (xshape NCHW, wshape, options)
    ((1, 16, 14, 14), (64, 16, 3, 3), dict(padding=[1, 1, 1, 1])),  # 3x3, K = 144
    (
        (2, 24, 13, 11),
        (40, 24, 3, 3),
        dict(strides=[2, 2], padding=[1, 0, 1, 1], input_layout="nhwc", filter_layout="ohwi"),
    ),  # strided, ragged, NHWC
    ((1, 32, 9, 9), (64, 16, 3, 3), dict(groups=2, dilations=[2, 2], padding=[2, 2, 2, 2])),  # grouped, dilated
    ((1, 256, 7, 7), (72, 256, 1, 1), dict(input_layout="nhwc", filter_layout="hwio")),  # 1x1 deep: split-K
    ((1, 256, 7, 7), (72, 256, 1, 1), dict()),  # 1x1 NCHW
    ((1, 128, 5, 5), (40, 128, 3, 3), dict(padding=[1, 1, 1, 1], filter_input=True)),  # filter as input, split-K
    (
        (2, 32, 10, 9),
        (48, 16, 3, 3),
        dict(groups=2, strides=[1, 2], padding=[1, 1, 0, 1], input_layout="nhwc", filter_layout="ohwi"),
    ),  # NHWC grouped, 4-channel quads per group
    ((1, 8, 12, 12), (36, 8, 1, 1), dict(strides=[2, 2], input_layout="nhwc", filter_layout="ihwo")),  # strided 1x1
    ((1, 20, 16, 16), (24, 20, 1, 1), dict(input_layout="nhwc", filter_layout="ohwi")),  # 1x1 NHWC, K % BK != 0
]
CONV_SLOW = [
    ((1, 512, 14, 14), (256, 512, 1, 1), dict()),
    ((1, 256, 14, 14), (256, 256, 3, 3), dict(padding=[1, 1, 1, 1], input_layout="nhwc", filter_layout="ohwi")),
]


def _conv(ctx, rng, xshape, wshape, opts, transpose=False):
    opts = dict(opts)
    M, N, K, g = _conv_mnk(xshape, wshape, transpose, opts)
    for i in _each_candidate(M, N, K, g):
        with autotune.force(i):
            got, ref = _run_conv(
                ctx, rng, xshape, wshape, use_bias=True, transpose=transpose, epilogue=lambda b, y: b.relu(y), **opts
            )
        _close(got, np.maximum(ref, 0))


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("xshape,wshape,opts", CONV)
def test_conv2d_every_candidate(ctx, rng, monkeypatch, xshape, wshape, opts, vec):
    # vec: the hardware-adapter staging (16-byte NHWC input loads, k-major filter reads)
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    _conv(ctx, rng, xshape, wshape, opts)


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
def test_conv_transpose2d_every_candidate(ctx, rng, monkeypatch, vec):
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    _conv(ctx, rng, (1, 32, 6, 7), (32, 24, 3, 3), dict(strides=[2, 2], padding=[1, 0, 0, 1]), transpose=True)


@pytest.mark.slow
@pytest.mark.parametrize("xshape,wshape,opts", CONV_SLOW)
def test_conv2d_every_candidate_big(ctx, rng, xshape, wshape, opts):
    _conv(ctx, rng, xshape, wshape, opts)
