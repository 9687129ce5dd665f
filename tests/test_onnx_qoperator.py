"""onnxruntime's QOperator-format int8 operators (mltensor/onnx/ops/contrib_qlinear.py): QLinearAdd,
QLinearMul, QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearWhere,
QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax, QGemm; single nodes against
onnxruntime CPU (uint8 and int8, random codes over the whole range, saturating outputs), and small
CNN / MLP models quantized by onnxruntime.quantization.quantize_static in QOperator format.

Exact where onnxruntime's arithmetic is reproduced (tables computed at load, integer sums);
otherwise at most one quantization step, with at least 95% of values bit-equal (the reason is
given at each such comparison)."""

import functools
import zlib

import numpy as np
import onnx
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
    np.dtype(np.bool_): TP.BOOL,
}
_TYPES = [np.uint8, np.int8]
_one = functools.partial(one_node_model, opset=13, domain="com.microsoft")  # (a contrib operator, one node)


def _seed(*key):
    return zlib.crc32(repr(key).encode())


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _ours(ctx, model, feeds):
    s = InferenceSession(model, ctx)
    try:
        return s.run(None, feeds)
    finally:
        s.close()


def _q(rng, dt, shape):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape, dtype=dt)


def _zp(rng, dt):
    return np.array((128 if dt == np.uint8 else 0) + rng.integers(-12, 13), dt)


def _s(v):
    return np.array(v, np.float32)


def _one_step(got, want, frac=0.95):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    d = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert d.max() <= 1, f"max difference {d.max()} steps"
    assert (d == 0).mean() >= frac, f"only {(d == 0).mean():.3f} bit-equal"


def _saturates(y, dt):
    info = np.iinfo(dt)
    return ((y == info.min) | (y == info.max)).any()


# -- QLinearAdd / QLinearMul -------------------------------------------------------------------

_BIN_SHAPES = [
    ((2, 3, 5, 7), (2, 3, 5, 7)),
    ((4, 70), (4, 70)),
    ((2, 3, 4, 4), (1, 3, 1, 1)),
    ((3, 1, 6), (1, 4, 6)),
    ((5, 8), ()),
]


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("shapes", _BIN_SHAPES, ids=str)
def test_qlinear_binary(ctx, dt, op, shapes):
    rng = np.random.default_rng(_seed(np.dtype(dt).name, op, shapes))
    sa, sb = rng.uniform(0.01, 0.1, 2)
    # an output scale that makes some results saturate
    sc = sa * sb * 40 if op == "QLinearMul" else (sa + sb) * 0.4
    ins = [
        ("a", _q(rng, dt, shapes[0]), True),
        ("as", _s(sa), False),
        ("az", _zp(rng, dt), False),
        ("b", _q(rng, dt, shapes[1]), True),
        ("bs", _s(sb), False),
        ("bz", _zp(rng, dt), False),
        ("cs", _s(sc), False),
        ("cz", _zp(rng, dt), False),
    ]
    m = _one(op, ins, [("c", _TP[np.dtype(dt)])])
    (got,) = _ours(ctx, m, fed_values(ins))
    (want,) = _ort(m, fed_values(ins))
    assert _saturates(want, dt) or want.size < 100
    if op == "QLinearAdd" and shapes[0] != shapes[1]:
        # onnxruntime's one-sided broadcast path folds the scalar side into the constant before
        # the FMA (another rounding of the same sum): a near-tie value may round the other way
        _one_step(got, want, 0.99)
    else:
        assert_exact(got, want)  # the table reproduces MLAS's arithmetic for every pair of codes


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_every_pair(ctx, dt, op):
    """All 65536 pairs of codes, several scale sets: the whole table."""
    info = np.iinfo(dt)
    vals = np.arange(info.min, info.max + 1)
    a, b = np.repeat(vals, 256).astype(dt), np.tile(vals, 256).astype(dt)
    for trial in range(10):  # (a sub-ulp difference in the arithmetic shows on a pair or two)
        rng = np.random.default_rng(_seed(np.dtype(dt).name, op, trial))
        sa, sb = rng.uniform(0.005, 0.2, 2)
        sc = sa * sb * rng.uniform(30, 200) if op == "QLinearMul" else (sa + sb) * rng.uniform(0.5, 2)
        ins = [
            ("a", a, True),
            ("as", _s(sa), False),
            ("az", _zp(rng, dt), False),
            ("b", b, True),
            ("bs", _s(sb), False),
            ("bz", _zp(rng, dt), False),
            ("cs", _s(sc), False),
            ("cz", _zp(rng, dt), False),
        ]
        m = _one(op, ins, [("c", _TP[np.dtype(dt)])])
        assert_exact(_ours(ctx, m, fed_values(ins))[0], _ort(m, fed_values(ins))[0])


# -- lookup-table activations ------------------------------------------------------------------


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize(
    "op,attrs",
    [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1}), ("QLinearLeakyRelu", {})],
    ids=["sigmoid", "leaky0.1", "leaky"],
)
def test_qlinear_lookup(ctx, dt, op, attrs):
    info = np.iinfo(dt)
    every = np.arange(info.min, info.max + 1).astype(dt)
    for trial in range(6):
        rng = np.random.default_rng(_seed(np.dtype(dt).name, op, str(attrs), trial))
        x = np.concatenate([every, _q(rng, dt, (300,))]).reshape(4, 139)
        xs = rng.uniform(0.005, 0.2)
        if op == "QLinearSigmoid":
            ys, yz = rng.uniform(0.7, 1.1) / 256, np.array(0 if dt == np.uint8 else -128, dt)
        else:
            ys, yz = xs * rng.uniform(0.3, 1.5), _zp(rng, dt)
        ins = [
            ("x", x, True),
            ("xs", _s(xs), False),
            ("xz", _zp(rng, dt), False),
            ("ys", _s(ys), False),
            ("yz", yz, False),
        ]
        m = _one(op, ins, [("y", _TP[np.dtype(dt)])], attrs)
        (want,) = _ort(m, fed_values(ins))
        assert_exact(_ours(ctx, m, fed_values(ins))[0], want)  # onnxruntime's own table, computed alike


# -- QLinearConcat / QLinearWhere --------------------------------------------------------------


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("axis", [1, -1])
def test_qlinear_concat(ctx, dt, axis):
    rng = np.random.default_rng(_seed(np.dtype(dt).name, axis))
    shapes = [(2, 3, 4), (2, 5, 4), (2, 2, 4)] if axis == 1 else [(2, 3, 4), (2, 3, 1), (2, 3, 6)]
    ys, yz = _s(0.05), _zp(rng, dt)
    ins = [("ys", ys, False), ("yz", yz, False)]
    for k, shp in enumerate(shapes):
        same = k == 1  # one input already in the output's parameters (copied as is)
        ins += [
            (f"x{k}", _q(rng, dt, shp), True),
            (f"s{k}", ys if same else _s(rng.uniform(0.02, 0.12)), False),
            (f"z{k}", yz if same else _zp(rng, dt), False),
        ]
    m = _one("QLinearConcat", ins, [("y", _TP[np.dtype(dt)])], {"axis": axis})
    (want,) = _ort(m, fed_values(ins))
    assert _saturates(want, dt)
    assert_exact(_ours(ctx, m, fed_values(ins))[0], want)


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
def test_qlinear_where(ctx, dt):
    rng = np.random.default_rng(_seed(np.dtype(dt).name, "where"))
    cond = rng.random((3, 1, 8)) < 0.5
    ins = [
        ("c", cond, True),
        ("x", _q(rng, dt, (3, 5, 8)), True),
        ("xs", _s(0.07), False),
        ("xz", _zp(rng, dt), False),
        ("y", _q(rng, dt, (5, 1)), True),
        ("ys", _s(0.03), False),
        ("yz", _zp(rng, dt), False),
        ("zs", _s(0.05), False),
        ("zz", _zp(rng, dt), False),
    ]
    m = _one("QLinearWhere", ins, [("z", _TP[np.dtype(dt)])])
    (want,) = _ort(m, fed_values(ins))
    assert_exact(_ours(ctx, m, fed_values(ins))[0], want)


# -- pools -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(2, 3, 7, 5), (1, 16, 4, 4), (3, 4, 9)], ids=str)
def test_qlinear_global_average_pool(ctx, dt, shape):
    rng = np.random.default_rng(_seed(np.dtype(dt).name, shape))
    x = _q(rng, dt, shape)
    x[0, 0] = np.iinfo(dt).max  # a saturating channel
    xs = rng.uniform(0.01, 0.1)
    ins = [
        ("x", x, True),
        ("xs", _s(xs), False),
        ("xz", _zp(rng, dt), False),
        ("ys", _s(xs / 4), False),
        ("yz", _zp(rng, dt), False),
    ]
    m = _one("QLinearGlobalAveragePool", ins, [("y", _TP[np.dtype(dt)])], {"channels_last": 0})
    (want,) = _ort(m, fed_values(ins))
    assert _saturates(want, dt)
    assert_exact(_ours(ctx, m, fed_values(ins))[0], want)  # exact integer sums, one float32 multiply


_POOLS = [
    ((2, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ((1, 4, 7, 6), {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ((1, 4, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((1, 2, 9, 9), {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1}),
    ((2, 3, 10), {"kernel_shape": [3], "strides": [2]}),
    ((1, 3, 5, 4), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 4, 5), {"kernel_shape": [4, 5]}),
]  # the whole input: onnxruntime's global pool


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("case", range(len(_POOLS)))
@pytest.mark.parametrize("params", ["same", "other"])
def test_qlinear_average_pool(ctx, dt, case, params):
    shape, attrs = _POOLS[case]
    rng = np.random.default_rng(_seed(np.dtype(dt).name, case, params))
    xs, xz = rng.uniform(0.01, 0.1), _zp(rng, dt)
    # "same": the output keeps the input's parameters, as quantize_static writes it: averages of
    # 2 or 4 codes land on exact halves, which onnxruntime's float32 rounding noise decides
    ys, yz = (xs, xz) if params == "same" else (xs / 6.3, _zp(rng, dt))
    ins = [
        ("x", _q(rng, dt, shape), True),
        ("xs", _s(xs), False),
        ("xz", xz, False),
        ("ys", _s(ys), False),
        ("yz", yz, False),
    ]
    m = _one("QLinearAveragePool", ins, [("y", _TP[np.dtype(dt)])], attrs)
    (want,) = _ort(m, fed_values(ins))
    assert _saturates(want, dt) or params == "same" or want.size < 10  # (6 global averages may not)
    # the same float32 additions in the same order, then the division by the count: exact where
    # f32 division is correctly rounded (lavapipe, CPUs; WGSL allows 2.5 ulp on GPUs)
    assert_exact(_ours(ctx, m, fed_values(ins))[0], want)


# -- QLinearSoftmax ----------------------------------------------------------------------------


@pytest.mark.parametrize("dt", _TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape,axis,opset", [((4, 10), -1, 13), ((2, 3, 17), 1, 13), ((2, 5, 6), 1, 12)], ids=str)
def test_qlinear_softmax(ctx, dt, shape, axis, opset):
    rng = np.random.default_rng(_seed(np.dtype(dt).name, shape, axis, opset))
    yz = np.array(0 if dt == np.uint8 else -128, dt)
    ins = [
        ("x", _q(rng, dt, shape), True),
        ("xs", _s(rng.uniform(0.02, 0.08)), False),
        ("xz", _zp(rng, dt), False),
        ("ys", _s(1 / 256), False),
        ("yz", yz, False),
    ]
    m = _one("QLinearSoftmax", ins, [("y", _TP[np.dtype(dt)])], {"axis": axis, "opset": opset})
    (want,) = _ort(m, fed_values(ins))
    # a float32 sum per row (onnxruntime's order is sequential) and a float division: a near-tie
    # quotient may round one step the other way
    _one_step(_ours(ctx, m, fed_values(ins))[0], want)


# -- QGemm -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ta,tb", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)], ids=lambda t: np.dtype(t).name
)
@pytest.mark.parametrize("per", ["tensor", "column"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("out", ["quant", "float"])
def test_qgemm(ctx, ta, tb, per, bias, out):
    rng = np.random.default_rng(_seed(np.dtype(ta).name, np.dtype(tb).name, per, bias, out))
    M, K, N = 5, 40, 9
    a, w = _q(rng, ta, (M, K)), _q(rng, tb, (N, K))  # transB=1, as quantize_static writes Gemm
    bshape = () if per == "tensor" else (N,)
    sa, sb = rng.uniform(0.01, 0.05), rng.uniform(0.01, 0.05, bshape)
    bz = np.zeros(bshape, tb) if tb == np.int8 else (128 + rng.integers(-5, 6, bshape)).astype(tb)
    ins = [
        ("a", a, True),
        ("as", _s(sa), False),
        ("az", _zp(rng, ta), False),
        ("b", w, False),
        ("bs", _s(sb), False),
        ("bz", bz, False),
        ("c", rng.integers(-3000, 3000, (N,)).astype(np.int32) if bias else None, False),
    ]
    if out == "quant":
        ins += [("ys", _s(sa * np.mean(sb) * np.sqrt(K) * 45), False), ("yz", _zp(rng, ta), False)]
    m = _one("QGemm", ins, [("y", _TP[np.dtype(ta)] if out == "quant" else TP.FLOAT)], {"transB": 1, "alpha": 0.75})
    (want,) = _ort(m, fed_values(ins))
    (got,) = _ours(ctx, m, fed_values(ins))
    if out == "quant":
        assert _saturates(want, ta)
        assert_exact(got, want)
    else:
        # exact int32 sums times one float32 multiplier; onnxruntime's output processor does the
        # same multiply, so equality is expected
        np.testing.assert_array_equal(got, want)


# -- unsupported variants ----------------------------------------------------------------------


def test_unsupported(ctx):
    rng = np.random.default_rng(1)
    x = _q(rng, np.uint8, (1, 2, 4, 4))
    base = [
        ("x", x, True),
        ("xs", _s(0.1), False),
        ("xz", np.array(128, np.uint8), False),
        ("ys", _s(0.1), False),
        ("yz", np.array(128, np.uint8), False),
    ]
    with pytest.raises(mltensor.NotSupportedError, match="channels_last"):
        InferenceSession(_one("QLinearGlobalAveragePool", base, [("y", TP.UINT8)], {"channels_last": 1}), ctx)
    per_channel = [base[0], ("xs", _s([0.1, 0.2]), False)] + base[2:]
    with pytest.raises(mltensor.NotSupportedError, match="X_scale"):
        InferenceSession(_one("QLinearSigmoid", per_channel, [("y", TP.UINT8)]), ctx)
    fed_scale = [base[0], ("xs", _s([0.1]), True)] + base[2:]
    with pytest.raises(mltensor.NotSupportedError, match="constant"):
        InferenceSession(_one("QLinearLeakyRelu", fed_scale, [("y", TP.UINT8)]), ctx)
    with pytest.raises(mltensor.NotSupportedError, match="channels_last"):
        InferenceSession(
            _one("QLinearAveragePool", base, [("y", TP.UINT8)], {"kernel_shape": [2, 2], "channels_last": 1}), ctx
        )
    with pytest.raises(mltensor.NotSupportedError, match="opset"):
        InferenceSession(_one("QLinearSoftmax", base, [("y", TP.UINT8)], {"axis": -1}), ctx)
    a = _q(rng, np.uint8, (4, 6))
    gemm = [
        ("a", a, True),
        ("as", _s(0.1), False),
        ("az", np.array(128, np.uint8), False),
        ("b", _q(rng, np.int8, (4, 3)), False),
        ("bs", _s(0.1), False),
        ("bz", np.array(0, np.int8), False),
        ("c", None, False),
        ("ys", _s(0.5), False),
        ("yz", np.array(128, np.uint8), False),
    ]
    with pytest.raises(mltensor.NotSupportedError, match="transA"):
        InferenceSession(_one("QGemm", gemm, [("y", TP.UINT8)], {"transA": 1}), ctx)


# -- whole models quantized by onnxruntime.quantization (QOperator format) ---------------------


def _cnn(rng):
    """conv-relu, conv + residual add, mul, sigmoid / leaky relu, concat, average pool, global
    average pool, flatten, gemm, softmax."""

    def w(n, s, sd=0.3):
        return nh.from_array(rng.normal(0, sd, s).astype(np.float32), n)

    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        h.make_node("Add", ["c2", "r1"], ["a1"]),
        h.make_node("Relu", ["a1"], ["r2"]),
        h.make_node("Mul", ["r2", "c2"], ["m1"]),
        h.make_node("Sigmoid", ["m1"], ["s1"]),
        h.make_node("LeakyRelu", ["c2"], ["l1"], alpha=0.1),
        h.make_node("Concat", ["s1", "l1", "r2"], ["cat"], axis=1),
        h.make_node("AveragePool", ["cat"], ["ap"], kernel_shape=[2, 2], strides=[2, 2]),
        h.make_node("GlobalAveragePool", ["ap"], ["g"]),
        h.make_node("Flatten", ["g"], ["f"]),
        h.make_node("Gemm", ["f", "wg", "bg"], ["gm"], transB=1),
        h.make_node("Softmax", ["gm"], ["y"], axis=-1),
    ]
    inits = [
        w("w1", (6, 3, 3, 3)),
        w("b1", (6,), 0.1),
        w("w2", (6, 6, 3, 3)),
        w("b2", (6,), 0.1),
        w("wg", (10, 18)),
        w("bg", (10,), 0.1),
    ]
    g = h.make_graph(
        nodes,
        "cnn",
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 8, 8])],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8), (3, 8, 8)


def _mlp(rng):
    def w(n, s, sd=0.3):
        return nh.from_array(rng.normal(0, sd, s).astype(np.float32), n)

    nodes = [
        h.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
        h.make_node("Relu", ["h1"], ["r1"]),
        h.make_node("MatMul", ["r1", "w2"], ["h2"]),
        h.make_node("Add", ["h2", "b2"], ["h3"]),
        h.make_node("Sigmoid", ["h3"], ["s"]),
        h.make_node("Mul", ["s", "h3"], ["sw"]),
        h.make_node("Gemm", ["sw", "w3", "b3"], ["y"], transB=1),
    ]
    inits = [
        w("w1", (32, 20)),
        w("b1", (32,), 0.1),
        w("w2", (32, 24)),
        w("b2", (24,), 0.1),
        w("w3", (8, 24)),
        w("b3", (8,), 0.1),
    ]
    g = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 20])],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)], ir_version=8), (20,)


def _quantize(tmp_path, model, in_shape, per_channel, rng):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": rng.normal(0, 1, (4,) + in_shape).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(model, src)
    quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=QuantFormat.QOperator,
        per_channel=per_channel,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )
    return onnx.load(str(dst))


_EXPECTED = {
    "cnn": {
        "QLinearConv",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearConcat",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QGemm",
        "QLinearSoftmax",
    },
    "mlp": {"QGemm", "QLinearMatMul", "QLinearAdd", "QLinearSigmoid", "QLinearMul"},
}


@pytest.mark.parametrize("which", ["cnn", "mlp"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_quantize_static_models(ctx, tmp_path, which, per_channel):
    rng = np.random.default_rng(_seed(which, per_channel))
    model, in_shape = (_cnn if which == "cnn" else _mlp)(rng)
    q = _quantize(tmp_path, model, in_shape, per_channel, rng)
    ops = {n.op_type for n in q.graph.node}
    missing = _EXPECTED[which] - ops
    assert not missing, f"the quantized model lacks {missing}: {sorted(ops)}"  # really QOperator ops
    ref = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    s = InferenceSession(q, ctx)
    try:
        for batch in (1, 3):
            x = rng.normal(0, 1, (batch,) + in_shape).astype(np.float32)
            (want,) = ref.run(None, {"x": x})
            (got,) = s.run(None, {"x": x})
            assert got.shape == want.shape and got.dtype == want.dtype
            # the outputs are dequantized codes: equal codes give equal floats
            if which == "mlp":
                np.testing.assert_array_equal(got, want)  # tables and integer sums only: exact
            else:
                # the CNN ends in QLinearSoftmax, whose float32 row sum and division may round a
                # near-tie code one step (1 / 256) the other way on another summation order
                err = np.abs(got - want)
                assert err.max() <= 1 / 256 + 1e-6, err.max()
                assert (err == 0).mean() >= 0.95, (err == 0).mean()
    finally:
        s.close()
