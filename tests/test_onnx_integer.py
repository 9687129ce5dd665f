"""ONNX integer operators (mltensor/onnx/ops/integer.py over the exact i32 GEMMs of
mltensor/ops/integer.py): DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul,
QLinearConv, and a small BERT-like model quantized by onnxruntime.quantization.quantize_dynamic.

Every result is compared with onnxruntime CPU on random data; variants onnxruntime does not
implement (per-row zero points of A, per-channel filter zero points of ConvInteger, int8 x uint8)
are compared with an int64 numpy reference, itself checked against onnxruntime where both run.
Integer results must be exact."""

import functools
import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

import mltensor
from mltensor import InferenceSession

from helpers import assert_exact, fed_values, one_node_model

_TP = {
    np.dtype(np.int8): TP.INT8,
    np.dtype(np.uint8): TP.UINT8,
    np.dtype(np.float32): TP.FLOAT,
    np.dtype(np.int32): TP.INT32,
}
_one = functools.partial(one_node_model, opset=21)  # (an ONNX operator of this file, one node)


def _ort(model, feeds):
    """onnxruntime's result, or None where it does not implement the variant."""
    try:
        s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return s.run(None, feeds)
    except Exception as e:  # NOT_IMPLEMENTED kernels, ORT_ENFORCE on unsupported zero point shapes
        msg = str(e)
        if any(
            t in msg
            for t in ("NOT_IMPLEMENTED", "Could not find an implementation", "zero point", "not supported", "must be")
        ):
            return None
        raise


def _ours(ctx, model, feeds):
    s = InferenceSession(model, ctx)
    try:
        return s.run(None, feeds)
    finally:
        s.close()


def _seed(*key):
    """A seed per test case, the same in every process (str hashes are salted per process)."""
    return zlib.crc32(repr(key).encode())


def _q(rng, dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    return rng.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape, dtype=dtype)


# -- numpy references (int64, wrapped to int32 as onnxruntime's accumulation) -------------------


def _ref_matmul_integer(a, b, za, zb):
    a = a.astype(np.int64) - (0 if za is None else (za.reshape(-1, 1) if za.ndim == 1 else za).astype(np.int64))
    b = b.astype(np.int64) - (0 if zb is None else zb.astype(np.int64))
    return np.matmul(a, b).astype(np.int32)


def _ref_conv_integer(x, w, zx, zw, pads, strides, dilations, group):
    """NCHW integer convolution; padding reads as the input zero point (contributes 0)."""
    n, c, hh, ww = x.shape
    oc, cg, kh, kw = w.shape
    xs = x.astype(np.int64) - (0 if zx is None else int(zx))
    ws = w.astype(np.int64) - (0 if zw is None else zw.astype(np.int64).reshape(-1, 1, 1, 1))
    xp = np.pad(xs, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    sh, sw = strides
    dh, dw = dilations
    oh = (hh + pads[0] + pads[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (ww + pads[1] + pads[3] - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, oc, oh, ow), np.int64)
    mg = oc // group
    for g in range(group):
        xg = xp[:, g * cg : (g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xg[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
                out[:, g * mg : (g + 1) * mg] += np.einsum("nchw,mc->nmhw", patch, ws[g * mg : (g + 1) * mg, :, i, j])
    return out.astype(np.int32)


# -- MatMulInteger ----------------------------------------------------------------------------

_TYPES = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8), (np.int8, np.uint8)]
# (A shape, B shape): 2-D, batched 3-D, batch broadcast, 4-D, a vector A, a vector B
_SHAPES = [
    ((5, 70), (70, 9)),
    ((3, 7, 33), (3, 33, 40)),
    ((2, 5, 70), (70, 9)),
    ((2, 1, 4, 16), (3, 16, 5)),
    ((37,), (37, 6)),
    ((4, 37), (37,)),
]


@pytest.mark.parametrize("ta,tb", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("zps", ["none", "scalar", "per_column", "per_row", "both"])
@pytest.mark.parametrize("shapes", _SHAPES, ids=str)
def test_matmul_integer(ctx, ta, tb, zps, shapes):
    rng = np.random.default_rng(_seed((np.dtype(ta).name, np.dtype(tb).name, zps, str(shapes))))
    sa, sb = shapes
    a, b = _q(rng, ta, sa), _q(rng, tb, sb)
    M = sa[-2] if len(sa) > 1 else 1
    N = sb[-1] if len(sb) > 1 else 1
    za = zb = None
    if zps in ("scalar", "both"):
        za = _q(rng, ta, ())
    if zps in ("scalar", "per_column", "both"):
        zb = _q(rng, tb, (N,) if zps != "scalar" and len(sb) > 1 else ())
    if zps in ("per_row", "both") and len(sa) > 1:
        za = _q(rng, ta, (M,))
    ins = [("a", a, True), ("b", b, False), ("za", za, False), ("zb", zb, False)]
    m = _one("MatMulInteger", ins[:2] if za is None and zb is None else ins, [("y", TP.INT32)])
    (got,) = _ours(ctx, m, fed_values(ins))
    want = _ref_matmul_integer(a, b, za, zb)
    ref = _ort(m, fed_values(ins))
    if ref is not None:
        assert_exact(want, ref[0])  # the numpy reference agrees with onnxruntime
    elif (zps in ("none", "scalar") or (zps == "per_column" and len(sb) == 2)) and (ta, tb) != (np.int8, np.uint8):
        # (onnxruntime wants a batched B's zero point as [batch, 1, N], not [N])
        pytest.fail("onnxruntime implements this variant: it must be the reference")
    assert_exact(got, want)


# Shapes that reach each tile configuration of ops/integer._config: 64 x 64 tiles of 8 x 8 outputs
# a thread in whole tiles (no bounds tests) and with ragged edges, 4-wide rows, narrow N (16 x 4
# and 32 x 2 threads), a 256-row tile with BK halved to fit the workgroup memory, K below a tile.
_TILE_SHAPES = [
    ((64, 96), (96, 128)),
    ((130, 70), (70, 100)),
    ((5, 20), (20, 12)),
    ((40, 10), (10, 6)),
    ((300, 33), (33, 8)),
    ((2, 70, 64), (2, 64, 64)),
]


@pytest.mark.parametrize("shapes", _TILE_SHAPES, ids=str)
def test_matmul_integer_tiles(ctx, shapes):
    rng = np.random.default_rng(_seed("tiles", str(shapes)))
    sa, sb = shapes
    a, b = _q(rng, np.uint8, sa), _q(rng, np.int8, sb)
    za, zb = _q(rng, np.uint8, ()), _q(rng, np.int8, (sb[-1],) if len(sb) == 2 else ())
    ins = [("a", a, True), ("b", b, False), ("za", za, False), ("zb", zb, False)]
    m = _one("MatMulInteger", ins, [("y", TP.INT32)])
    (got,) = _ours(ctx, m, fed_values(ins))
    want = _ref_matmul_integer(a, b, za, zb)
    assert_exact(want, _ort(m, fed_values(ins))[0])
    assert_exact(got, want)


def test_matmul_integer_zero_points_as_inputs(ctx):
    """Zero points computed in the graph (as DynamicQuantizeLinear's), B a graph input too, and
    B's zero point per column and per batch ([batch, 1, N])."""
    rng = np.random.default_rng(1)
    a, b = _q(rng, np.uint8, (2, 6, 50)), _q(rng, np.int8, (2, 50, 12))
    za, zb = _q(rng, np.uint8, ()), _q(rng, np.int8, (2, 1, 12))
    ins = [("a", a, True), ("b", b, True), ("za", za, True), ("zb", zb, True)]
    m = _one("MatMulInteger", ins, [("y", TP.INT32)])
    (got,) = _ours(ctx, m, fed_values(ins))
    assert_exact(got, _ref_matmul_integer(a, b, za, zb))
    ref = _ort(m, fed_values(ins))
    if ref is not None:
        assert_exact(got, ref[0])


@pytest.mark.parametrize("ta,tb", [(np.uint8, np.int8), (np.int8, np.int8)], ids=lambda t: np.dtype(t).name)
def test_matmul_integer_large_k_is_exact(ctx, ta, tb):
    """K = 3072 products of values near the type's extremes: sums beyond 2**24, where an f32
    accumulation would round (asserted below, so the test can tell)."""
    rng = np.random.default_rng(2)
    K = 3072
    lo_a, hi_a = (250, 255) if ta == np.uint8 else (120, 127)
    a = _q(rng, ta, (2, 9, K), lo_a, hi_a)
    b = _q(rng, tb, (K, 20), 120, 127)
    b[:, ::2] = -b[:, ::2] - 1  # -128..-121 in every other column: large sums of both signs
    za = np.array(0 if ta == np.uint8 else -3, ta)
    ins = [("a", a, True), ("b", b, False), ("za", za, False)]
    m = _one("MatMulInteger", ins, [("y", TP.INT32)])
    (got,) = _ours(ctx, m, fed_values(ins))
    want = _ref_matmul_integer(a, b, za, None)
    assert np.abs(want).max() > 2**24
    f32 = np.zeros(want.shape, np.float32)
    af, bf = (a.astype(np.float32) - np.float32(za)), b.astype(np.float32)
    for k in range(K):  # f32 accumulation in order, as a float kernel would
        f32 += af[..., k : k + 1] * bf[k]
    assert (f32.astype(np.int64) != want).any(), "f32 accumulation would be exact here: the test proves nothing"
    ref = _ort(m, fed_values(ins))
    assert_exact(want, ref[0])
    assert_exact(got, want)


# -- DynamicQuantizeLinear ----------------------------------------------------------------------


@pytest.mark.parametrize("case", ["normal", "positive", "negative", "zeros", "ties", "wide", "scalar", "4d"])
def test_dynamic_quantize_linear(ctx, case):
    rng = np.random.default_rng(len(case))
    x = rng.standard_normal((7, 33)).astype(np.float32)
    if case == "positive":
        x = np.abs(x) + 0.5  # min > 0: the range is widened to include 0 (zero point 0)
    elif case == "negative":
        x = -np.abs(x) - 0.5  # max < 0: zero point 255
    elif case == "zeros":
        x = np.zeros((3, 5), np.float32)  # empty range: scale 1
    elif case == "ties":
        # scale 1 (range [-100, 155]) puts x.5 values exactly on rounding ties: half to even
        x = np.concatenate(
            [np.array([-100.0, 155.0], np.float32), (rng.integers(-100, 155, 60) + 0.5).astype(np.float32)]
        )
    elif case == "wide":
        x = x * 1e4
    elif case == "scalar":
        x = np.array(-2.75, np.float32)
    elif case == "4d":
        x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32) * 3 + 1
    ins = [("x", x, True)]
    m = _one("DynamicQuantizeLinear", ins, [("y", TP.UINT8), ("s", TP.FLOAT), ("z", TP.UINT8)])
    got = _ours(ctx, m, fed_values(ins))
    ref = _ort(m, fed_values(ins))
    for g, r in zip(got, ref):
        assert_exact(g, r)


# -- ConvInteger ------------------------------------------------------------------------------

# (x shape, w shape, attributes)
_CONVS = [
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),
    ((2, 4, 10, 11), (6, 2, 3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 1], "group": 2}),
    ((1, 5, 12, 10), (7, 5, 3, 2), {"pads": [2, 1, 2, 1], "dilations": [2, 3]}),
    ((2, 6, 8, 8), (6, 1, 3, 3), {"auto_pad": "SAME_UPPER", "group": 6}),  # depthwise
    ((1, 3, 9, 8), (5, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    ((1, 3, 9, 8), (5, 3, 2, 2), {"auto_pad": "VALID", "strides": [3, 2]}),
    ((1, 8, 7, 7), (40, 8, 1, 1), {}),  # 1x1, more channels than one tile
    ((2, 4, 30), (3, 4, 5), {"pads": [2, 1], "strides": [2]}),  # 1-D
    ((1, 40, 6, 6), (9, 40, 3, 3), {"pads": [1, 1, 1, 1]}),  # K = 360: several K tiles
    ((1, 16, 20, 20), (72, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # 64 x 64 tiles, ragged
    ((1, 8, 16, 16), (64, 8, 2, 2), {"strides": [2, 2]}),  # whole 64 x 64 tiles, K = 32: no bounds tests
]


def _conv_pads(xs, ws, attrs):
    """Explicit [top, left, bottom, right] pads of the 2-D form (for the numpy reference)."""
    sp = len(xs) - 2
    k = ws[2:]
    s = attrs.get("strides", [1] * sp)
    d = attrs.get("dilations", [1] * sp)
    auto = attrs.get("auto_pad", "NOTSET")
    if auto == "NOTSET":
        p = attrs.get("pads", [0] * 2 * sp)
        begin, end = p[:sp], p[sp:]
    elif auto == "VALID":
        begin, end = [0] * sp, [0] * sp
    else:
        begin, end = [], []
        for i in range(sp):
            out = -(-xs[2 + i] // s[i])
            total = max(0, (out - 1) * s[i] + (k[i] - 1) * d[i] + 1 - xs[2 + i])
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - begin[-1])
    if sp == 1:
        return [0, begin[0], 0, end[0]], [1] + list(s), [1] + list(d)
    return [begin[0], begin[1], end[0], end[1]], list(s), list(d)


@pytest.mark.parametrize("tx,tw", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("zps", ["none", "scalar", "per_channel"])
@pytest.mark.parametrize("conv", _CONVS, ids=lambda c: f"{c[0]}x{c[1]}{''.join(f'_{k}' for k in c[2])}")
def test_conv_integer(ctx, tx, tw, zps, conv):
    xs, ws, attrs = conv
    rng = np.random.default_rng(_seed((np.dtype(tx).name, np.dtype(tw).name, zps, str(conv))))
    x, w = _q(rng, tx, xs), _q(rng, tw, ws)
    zx = zw = None
    if zps != "none":
        zx = _q(rng, tx, ())
        zw = _q(rng, tw, () if zps == "scalar" else (ws[0],))
    ins = [("x", x, True), ("w", w, False), ("zx", zx, False), ("zw", zw, False)]
    m = _one("ConvInteger", ins[:2] if zps == "none" else ins, [("y", TP.INT32)], attrs)
    (got,) = _ours(ctx, m, fed_values(ins))
    pads, s, d = _conv_pads(xs, ws, attrs)
    x4 = x.reshape(xs[:2] + (1, xs[2])) if len(xs) == 3 else x
    w4 = w.reshape(ws[:2] + (1, ws[2])) if len(ws) == 3 else w
    want = _ref_conv_integer(x4, w4, zx, zw, pads, s, d, attrs.get("group", 1)).reshape(got.shape)
    ref = _ort(m, fed_values(ins))
    if ref is not None:
        assert_exact(want, ref[0])
    elif zps != "per_channel" and tx == np.uint8:
        pytest.fail("onnxruntime implements this variant: it must be the reference")
    assert_exact(got, want)


def test_conv_integer_filter_as_input(ctx):
    """A filter fed as a graph input (bound as it is, not a packed constant), per-channel zero
    point computed in the graph too."""
    rng = np.random.default_rng(4)
    x, w = _q(rng, np.uint8, (2, 6, 9, 7)), _q(rng, np.int8, (4, 3, 3, 2))
    zx, zw = _q(rng, np.uint8, ()), _q(rng, np.int8, (4,))
    ins = [("x", x, True), ("w", w, True), ("zx", zx, False), ("zw", zw, True)]
    attrs = {"pads": [1, 0, 1, 1], "strides": [1, 2], "group": 2}
    m = _one("ConvInteger", ins, [("y", TP.INT32)], attrs)
    (got,) = _ours(ctx, m, fed_values(ins))
    assert_exact(got, _ref_conv_integer(x, w, zx, zw, [1, 0, 1, 1], [1, 2], [1, 1], 2))


# -- QLinearMatMul / QLinearConv ---------------------------------------------------------------


def _scale(rng, shape, lo=0.001, hi=0.05):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def _zp(rng, dtype, shape):
    """A zero point near the middle of uniformly drawn data (else the products' mean dwarfs their
    spread and every output saturates)."""
    mid = 128 if dtype == np.uint8 else 0
    return (mid + rng.integers(-10, 11, shape)).astype(dtype)


def _y_scale(rng, x_scale, w_scale, k, shape=()):
    """An output scale that spreads the outputs (rms about 74 * 74 * sqrt(k) steps of the input
    scales' product) over about 120 output steps rms: they cover the range, some saturate."""
    return (np.mean(x_scale) * np.mean(w_scale) * np.sqrt(k) * rng.uniform(40, 50, shape)).astype(np.float32)


# (onnxruntime implements a uint8 a with a uint8 output, an int8 a with an int8 output)
@pytest.mark.parametrize(
    "ta,tb", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)], ids=lambda t: np.dtype(t).name
)
@pytest.mark.parametrize("per", ["tensor", "column"])
@pytest.mark.parametrize("shapes", [((6, 40), (40, 10)), ((2, 5, 64), (64, 17)), ((2, 3, 20), (2, 20, 8))], ids=str)
def test_qlinear_matmul(ctx, ta, tb, per, shapes):
    rng = np.random.default_rng(_seed(np.dtype(ta).name, np.dtype(tb).name, per, str(shapes)))
    sa, sb = shapes
    a, b = _q(rng, ta, sa), _q(rng, tb, sb)
    N = sb[-1]
    # per column: [N], or for a batched B [batch, 1, N] (onnxruntime's form)
    bshape = () if per == "tensor" else (N,) if len(sb) == 2 else sb[:-2] + (1, N)
    a_scale, b_scale = _scale(rng, ()), _scale(rng, bshape)
    ins = [
        ("a", a, True),
        ("as", a_scale, False),
        ("az", _zp(rng, ta, ()), False),
        ("b", b, False),
        ("bs", b_scale, False),
        ("bz", _zp(rng, tb, bshape), False),
        ("ys", _y_scale(rng, a_scale, b_scale, sa[-1]), False),
        ("yz", _zp(rng, ta, ()), False),
    ]
    m = _one("QLinearMatMul", ins, [("y", _TP[np.dtype(ta)])])
    (got,) = _ours(ctx, m, fed_values(ins))
    ref = _ort(m, fed_values(ins))
    assert ref is not None
    assert_exact(got, ref[0])
    info = np.iinfo(ta)
    assert 0 < (got == info.min).sum() + (got == info.max).sum() < got.size * 0.6  # some saturate


def test_qlinear_matmul_per_row(ctx):
    """Per-row a / y parameters and a batched A: onnxruntime takes only per-tensor ones, so the
    reference is numpy (float32 multiplier, round half to even, saturate)."""
    rng = np.random.default_rng(6)
    a, b = _q(rng, np.uint8, (2, 5, 24)), _q(rng, np.uint8, (24, 7))
    az, a_scale = _zp(rng, np.uint8, (2, 5, 1)), _scale(rng, (2, 5, 1))
    bz, b_scale = _zp(rng, np.uint8, (7,)), _scale(rng, (7,))
    yz, y_scale = _zp(rng, np.uint8, (5,)), _y_scale(rng, a_scale, b_scale, 24, (5,))
    ins = [
        ("a", a, True),
        ("as", a_scale, False),
        ("az", az, False),
        ("b", b, False),
        ("bs", b_scale, False),
        ("bz", bz, False),
        ("ys", y_scale, False),
        ("yz", yz, False),
    ]
    m = _one("QLinearMatMul", ins, [("y", TP.UINT8)])
    (got,) = _ours(ctx, m, fed_values(ins))
    acc = np.matmul(a.astype(np.int64) - az, b.astype(np.int64) - bz).astype(np.int32)
    mult = (a_scale * b_scale) / y_scale.reshape(5, 1)
    zy = yz.reshape(5, 1).astype(np.int32)
    v = np.clip(acc.astype(np.float32) * mult, (0 - zy).astype(np.float32), (255 - zy).astype(np.float32))
    want = (np.round(v).astype(np.int32) + zy).astype(np.uint8)
    assert_exact(got, want)
    assert 0 < ((got == 0) | (got == 255)).sum() < got.size * 0.6


def test_qlinear_matmul_scales_as_inputs(ctx):
    """Scales computed in the graph (the multiplier is then computed on the GPU)."""
    rng = np.random.default_rng(5)
    a, b = _q(rng, np.uint8, (4, 30)), _q(rng, np.int8, (30, 9))
    ins = [
        ("a", a, True),
        ("as", _scale(rng, ()), True),
        ("az", _zp(rng, np.uint8, ()), False),
        ("b", b, False),
        ("bs", _scale(rng, (9,)), False),
        ("bz", _zp(rng, np.int8, (9,)), False),
        ("ys", _scale(rng, (), 0.005, 0.01), True),
        ("yz", _zp(rng, np.uint8, ()), False),
    ]
    m = _one("QLinearMatMul", ins, [("y", TP.UINT8)])
    (got,) = _ours(ctx, m, fed_values(ins))
    assert_exact(got, _ort(m, fed_values(ins))[0])


@pytest.mark.parametrize(
    "tx,tw", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)], ids=lambda t: np.dtype(t).name
)
@pytest.mark.parametrize("per", ["tensor", "channel"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "conv", [_CONVS[1], _CONVS[2], _CONVS[3], _CONVS[7]], ids=lambda c: f"{c[0]}x{c[1]}{''.join(f'_{k}' for k in c[2])}"
)
def test_qlinear_conv(ctx, tx, tw, per, bias, conv):
    xs, ws, attrs = conv
    rng = np.random.default_rng(_seed((np.dtype(tx).name, np.dtype(tw).name, per, bias, str(conv))))
    x, w = _q(rng, tx, xs), _q(rng, tw, ws)
    oc = ws[0]
    wshape = () if per == "tensor" else (oc,)
    k = int(np.prod(ws[1:]))
    wz = np.zeros(wshape, tw) if tw == np.int8 else _zp(rng, tw, wshape)  # onnxruntime: int8 filters symmetric
    x_scale, w_scale = _scale(rng, ()), _scale(rng, wshape)
    ins = [
        ("x", x, True),
        ("xs", x_scale, False),
        ("xz", _zp(rng, tx, ()), False),
        ("w", w, False),
        ("ws", w_scale, False),
        ("wz", wz, False),
        ("ys", _y_scale(rng, x_scale, w_scale, k), False),
        ("yz", _zp(rng, tx, ()), False),
    ]
    if bias:
        ins.append(("B", rng.integers(-20000, 20000, (oc,)).astype(np.int32), False))
    m = _one("QLinearConv", ins, [("y", _TP[np.dtype(tx)])], attrs)
    (got,) = _ours(ctx, m, fed_values(ins))
    ref = _ort(m, fed_values(ins))
    assert ref is not None
    assert_exact(got, ref[0])
    info = np.iinfo(tx)
    assert 0 < (got == info.min).sum() + (got == info.max).sum() < got.size * 0.6  # some saturate


# -- unsupported variants fail cleanly ---------------------------------------------------------


def test_unsupported_variants(ctx):
    rng = np.random.default_rng(3)
    a = _q(rng, np.uint8, (4, 8))
    bad_zp = [("a", a, True), ("b", _q(rng, np.uint8, (8, 5)), False), ("za", _q(rng, np.uint8, (2, 2)), False)]
    with pytest.raises(mltensor.NotSupportedError, match="a_zero_point shape"):
        InferenceSession(_one("MatMulInteger", bad_zp, [("y", TP.INT32)]), ctx)
    x = _q(rng, np.uint8, (1, 2, 4, 4, 4))
    conv3d = [("x", x, True), ("w", _q(rng, np.uint8, (2, 2, 1, 1, 1)), False)]
    with pytest.raises(mltensor.NotSupportedError, match="3-D convolutions"):
        InferenceSession(_one("ConvInteger", conv3d, [("y", TP.INT32)]), ctx)
    zx = [
        ("x", _q(rng, np.uint8, (1, 2, 4, 4)), True),
        ("w", _q(rng, np.uint8, (2, 2, 1, 1)), False),
        ("zx", _q(rng, np.uint8, (2,)), False),
    ]
    with pytest.raises(mltensor.NotSupportedError, match="x_zero_point"):
        InferenceSession(_one("ConvInteger", zx, [("y", TP.INT32)]), ctx)


# -- a BERT-like model quantized by onnxruntime ------------------------------------------------


def _bert(hidden=32, heads=2, ff=64, layers=2, seed=0):
    """A float encoder: per layer Q/K/V/output projections (MatMul + Add), softmax attention,
    residual + LayerNormalization, an Erf GELU feed-forward, residual + LayerNormalization."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def w(name, shape, s=0.2):
        inits.append(nh.from_array((rng.standard_normal(shape) * s).astype(np.float32), name))
        return name

    def c(name, arr):
        inits.append(nh.from_array(np.asarray(arr), name))
        return name

    def n(op, ins, out, **kw):
        nodes.append(h.make_node(op, ins, [out], **kw))
        return out

    dh = hidden // heads
    c("split", np.array([0, 0, heads, dh], np.int64))
    c("merge", np.array([0, 0, hidden], np.int64))
    c("qk_scale", np.array(1.0 / np.sqrt(dh), np.float32))
    c("half", np.array(0.5, np.float32))
    c("one", np.array(1.0, np.float32))
    c("rsqrt2", np.array(1 / np.sqrt(2), np.float32))
    x = "x"
    for layer in range(layers):
        p = f"l{layer}_"

        def proj(inp, name, k, m):
            y = n("MatMul", [inp, w(p + name + "_w", [k, m])], p + name + "_mm")
            return n("Add", [y, w(p + name + "_b", [m], 0.05)], p + name)

        qkv = []
        for nm in ("q", "k", "v"):
            t = n("Reshape", [proj(x, nm, hidden, hidden), "split"], p + nm + "_r")
            qkv.append(n("Transpose", [t], p + nm + "_t", perm=[0, 2, 3, 1] if nm == "k" else [0, 2, 1, 3]))
        s = n("Mul", [n("MatMul", qkv[:2], p + "qk"), "qk_scale"], p + "qks")
        a = n("MatMul", [n("Softmax", [s], p + "sm", axis=-1), qkv[2]], p + "av")
        a = n("Reshape", [n("Transpose", [a], p + "avt", perm=[0, 2, 1, 3]), "merge"], p + "avr")
        r = n("Add", [proj(a, "o", hidden, hidden), x], p + "res1")
        x1 = n(
            "LayerNormalization",
            [r, w(p + "ln1_g", [hidden]), w(p + "ln1_b", [hidden])],
            p + "ln1",
            axis=-1,
            epsilon=1e-5,
        )
        f = proj(x1, "f1", hidden, ff)
        e = n("Add", [n("Erf", [n("Mul", [f, "rsqrt2"], p + "g0")], p + "g1"), "one"], p + "g2")
        e = n("Mul", [n("Mul", [f, e], p + "g3"), "half"], p + "g4")
        r2 = n("Add", [proj(e, "f2", ff, hidden), x1], p + "res2")
        x = n(
            "LayerNormalization",
            [r2, w(p + "ln2_g", [hidden]), w(p + "ln2_b", [hidden])],
            p + "ln2",
            axis=-1,
            epsilon=1e-5,
        )
    nodes.append(h.make_node("Identity", [x], ["y"]))
    g = h.make_graph(
        nodes,
        "bert",
        [h.make_tensor_value_info("x", TP.FLOAT, ["batch", "seq", hidden])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["batch", "seq", hidden])],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_quantize_dynamic_bert(ctx, tmp_path, weight_type):
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_bert(), src)
    quantize_dynamic(str(src), str(dst), weight_type=getattr(QuantType, weight_type))
    q = onnx.load(dst)
    ops = {nd.op_type for nd in q.graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    # expose the first layer's integer intermediates: computed from the input alone, they must
    # be bit-exact (later ones follow float activations, equal only to rounding)
    dql = next(nd for nd in q.graph.node if nd.op_type == "DynamicQuantizeLinear")
    mmi = next(nd for nd in q.graph.node if nd.op_type == "MatMulInteger" and nd.input[0] == dql.output[0])
    extra = [(dql.output[0], TP.UINT8), (dql.output[1], TP.FLOAT), (dql.output[2], TP.UINT8), (mmi.output[0], TP.INT32)]
    q.graph.output.extend([h.make_tensor_value_info(nm, t, None) for nm, t in extra])
    ref_sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(q, ctx)
    try:
        rng = np.random.default_rng(7)
        for seq in (5, 11):  # two sequence lengths in one session
            x = rng.standard_normal((2, seq, 32)).astype(np.float32)
            got = sess.run(None, {"x": x})
            ref = ref_sess.run(None, {"x": x})
            for g, r in zip(got[1:], ref[1:]):
                assert_exact(g, r)
            y, yr = got[0], ref[0]
            assert y.shape == yr.shape and y.dtype == yr.dtype
            err = np.abs(y - yr).max() / np.abs(yr).max()
            assert err <= 1e-3, err
    finally:
        sess.close()


# -- onnxruntime's fused forms (com.microsoft), as its optimizer saves them ----------------------


def _ms_model(op, inputs, outputs):
    m = _one(op, inputs, outputs)
    m.graph.node[0].domain = "com.microsoft"
    m.opset_import.append(h.make_opsetid("com.microsoft", 1))
    return m


@pytest.mark.parametrize("tb", [np.int8, np.uint8], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("variant", ["plain", "per_column_bias", "batched"])
def test_contrib_integer_matmuls(ctx, tb, variant):
    """MatMulIntegerToFloat and DynamicQuantizeMatMul against onnxruntime (float results: the
    int32 product is exact, then the same float32 scale and bias steps)."""
    rng = np.random.default_rng(_seed(np.dtype(tb).name, variant))
    sa = (2, 7, 48) if variant == "batched" else (9, 48)
    N = 20
    b = _q(rng, tb, (48, N))
    bshape = (N,) if variant == "per_column_bias" else ()
    bs, bz = _scale(rng, bshape), _zp(rng, tb, bshape)
    bias = rng.standard_normal(N).astype(np.float32) if variant != "plain" else None
    x = (rng.standard_normal(sa) * 2).astype(np.float32)
    ins = [("x", x, True), ("b", b, False), ("bs", bs, False), ("bz", bz, False), ("bias", bias, False)]
    m = _ms_model("DynamicQuantizeMatMul", ins, [("y", TP.FLOAT)])
    (got,) = _ours(ctx, m, fed_values(ins))
    (ref,) = _ort(m, fed_values(ins))
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    a = _q(rng, np.uint8, sa)
    ins = [
        ("a", a, True),
        ("b", b, False),
        ("as", _scale(rng, ()), False),
        ("bs", bs, False),
        ("az", _zp(rng, np.uint8, ()), False),
        ("bz", bz, False),
        ("bias", bias, False),
    ]
    m = _ms_model("MatMulIntegerToFloat", ins, [("y", TP.FLOAT)])
    (got,) = _ours(ctx, m, fed_values(ins))
    (ref,) = _ort(m, fed_values(ins))
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("weight_type", ["QInt8", "QUInt8"])
def test_optimized_quantized_bert(ctx, tmp_path, weight_type):
    """The quantized BERT-like model after onnxruntime's graph optimizer (the model it saves with
    optimized_model_filepath): DynamicQuantizeMatMul, MatMulIntegerToFloat, SkipLayerNormalization."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, dst, opt = tmp_path / "f.onnx", tmp_path / "q.onnx", tmp_path / "o.onnx"
    onnx.save(_bert(), src)
    quantize_dynamic(str(src), str(dst), weight_type=getattr(QuantType, weight_type))
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(opt)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    ref_sess = ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    o = onnx.load(opt)
    assert {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"} <= {nd.op_type for nd in o.graph.node}
    sess = InferenceSession(o, ctx)
    try:
        rng = np.random.default_rng(8)
        for seq in (6, 3):
            x = rng.standard_normal((2, seq, 32)).astype(np.float32)
            (y,) = sess.run(None, {"x": x})
            (yr,) = ref_sess.run(None, {"x": x})
            assert y.shape == yr.shape and y.dtype == yr.dtype
            err = np.abs(y - yr).max() / np.abs(yr).max()
            assert err <= 1e-3, err
    finally:
        sess.close()


# -- dynamic dimensions (the builder operator directly) -------------------------------------


@pytest.mark.parametrize("dyn", ["m", "batch", "mkn"])
@pytest.mark.parametrize("requant", [False, True])
def test_int_matmul_dynamic(ctx, dyn, requant):
    """_int_matmul built once with dynamic dimensions, run at several sizes (1, the maxima, odd
    ones): exact against numpy and equal to a static build of each size."""
    from helpers import dispatch_at

    from mltensor.dynamic.dims import MLDynamicDimension as D

    maxs = {"batch": 3, "m": 70, "k": 70, "n": 68}  # tiles chosen at the maxima: 64 x 64
    static = {"batch": 2, "m": 9, "k": 45, "n": 20}
    names = {"batch"} if dyn == "batch" else set(dyn)
    dims = {d: D(d, maxs[d]) if d in names else static[d] for d in maxs}
    rng = np.random.default_rng(_seed("dyn", dyn, requant))
    scale = _scale(rng, ()) * _scale(rng, ()) / np.float32(0.5)

    def build(shape_of):
        b = mltensor.MLGraphBuilder(ctx)
        a = b.input("a", data_type="uint8", shape=[shape_of("batch"), shape_of("m"), shape_of("k")])
        w = b.input("w", data_type="int8", shape=[shape_of("k"), shape_of("n")])
        za = b.input("za", data_type="uint8", shape=[])
        zb = b.input("zb", data_type="int8", shape=[shape_of("n")])
        kw = {}
        if requant:
            kw = {"scale": b.constant(np.asarray(scale)), "output_zero_point": b.constant(np.array(120, np.uint8))}
        return b.build_sync({"y": b._int_matmul(a, w, a_zero_point=za, b_zero_point=zb, **kw)})

    g = build(lambda d: dims[d])
    assert g.dynamic_dimensions
    size_sets = [
        dict(batch=1, m=1, k=1, n=1),
        dict(maxs),
        dict(batch=2, m=7, k=33, n=35),
        dict(batch=3, m=37, k=5, n=3),
    ]
    for sizes in size_sets:
        cur = {d: sizes[d] if isinstance(dims[d], D) else static[d] for d in maxs}
        feeds = {
            "a": _q(rng, np.uint8, (cur["batch"], cur["m"], cur["k"])),
            "w": _q(rng, np.int8, (cur["k"], cur["n"])),
            "za": _q(rng, np.uint8, ()),
            "zb": _q(rng, np.int8, (cur["n"],)),
        }
        got = dispatch_at(ctx, g, feeds)["y"]
        acc = _ref_matmul_integer(feeds["a"], feeds["w"], feeds["za"], feeds["zb"])
        if requant:
            v = np.clip(acc.astype(np.float32) * scale, np.float32(-120), np.float32(135))
            want = (np.round(v).astype(np.int32) + 120).astype(np.uint8)
        else:
            want = acc
        assert_exact(got, want)
        gs = build(lambda d: cur[d])
        assert_exact(dispatch_at(ctx, gs, feeds)["y"], got)
        gs.destroy()
    g.destroy()


# -- the ONNX backend test kit's cases of these operators --------------------------------------


def _onnx_cases():
    import importlib

    import onnx.backend.test.case.node as node_pkg

    mods = ["matmulinteger", "convinteger", "dynamicquantizelinear", "qlinearmatmul", "qlinearconv"]
    for m in mods:
        importlib.import_module(f"onnx.backend.test.case.node.{m}")
    return sorted(
        (
            c
            for c in node_pkg._NodeTestCases
            if any(c.name.startswith(f"test_{p}") for p in mods + ["basic_convinteger"])
        ),
        key=lambda c: c.name,
    )


@pytest.mark.parametrize("case", _onnx_cases(), ids=lambda c: c.name)
def test_onnx_node_cases(ctx, case):
    """The ONNX backend kit's node cases (float16 scales included); mltensor/onnx/exclusions.py
    lists these operators as out of scope for the conformance sweep, so they are run here."""
    for inputs, outputs in case.data_sets:
        names = [i.name for i in case.model.graph.input]
        got = _ours(ctx, case.model, dict(zip(names, inputs)))
        assert len(got) == len(outputs)
        for g, w in zip(got, outputs):
            assert_exact(g, np.asarray(w))
