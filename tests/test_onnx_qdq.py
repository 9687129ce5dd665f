"""ONNX QuantizeLinear / DequantizeLinear (mltensor/onnx/ops/quantize.py over the kernels of
mltensor/ops/quantize.py) and whole QDQ models from onnxruntime.quantization.quantize_static.

References: onnx.reference.ReferenceEvaluator (the spec's arithmetic) and onnxruntime CPU with
graph optimisations off (ORT_DISABLE_ALL: the QDQ nodes run literally, no fused QLinear kernels).
Quantized integers must be bit-exact: round half to even, saturation at both ends of uint8, int8,
uint16 and int16, per tensor, per axis (every axis), blocked (opset 21 block_size, a partial last
block included), float16 inputs and scales, output_dtype / precision. Data are random (seeded per
case), scales are not powers of two."""

import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

import mltensor
from mltensor import InferenceSession

from helpers import assert_exact

QTYPES = {
    "uint8": (np.uint8, TP.UINT8),
    "int8": (np.int8, TP.INT8),
    "uint16": (np.uint16, TP.UINT16),
    "int16": (np.int16, TP.INT16),
}


def _rng(*key):
    """A generator per test case, the same in every process (str hashes are salted)."""
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def _tp(a):
    return h.np_dtype_to_tensor_dtype(a.dtype)


def _model(op, feeds, inits, attrs=None, opset=21, out_type=None):
    """One-node model: `feeds` (name -> array) are graph inputs, `inits` (name -> array or
    TensorProto, None: an omitted optional input) initializers, in the node's input order."""
    names, vis, tensors = [], [], []
    for name, a in feeds.items():
        names.append(name)
        vis.append(h.make_tensor_value_info(name, _tp(a), a.shape))
    for name, a in inits.items():
        if a is None:
            names.append("")
            continue
        names.append(name)
        tensors.append(a if isinstance(a, TP) else nh.from_array(a, name))
    node = h.make_node(op, names, ["y"], **(attrs or {}))
    out = h.make_tensor_value_info("y", out_type or TP.UNDEFINED, None)
    g = h.make_graph([node], "g", vis, [out], tensors)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    if out_type is None:  # the output type the reference gives (ORT needs one)
        m.graph.output[0].type.tensor_type.elem_type = _tp(_ref(m, feeds))
    return m


def _ref(model, feeds):
    return ReferenceEvaluator(model).run(None, feeds)[0]


def _ort_session(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _ort(model, feeds):
    return _ort_session(model).run(None, feeds)[0]


def _ours(ctx, model, feeds):
    s = InferenceSession(model, ctx)
    try:
        return s.run(None, feeds)[0]
    finally:
        s.close()


def _check_q(ctx, model, feeds, ort_too=True):
    got = _ours(ctx, model, feeds)
    want = _ref(model, feeds)
    assert_exact(got, want)
    if ort_too:
        assert_exact(got, _ort(model, feeds))
    return got


def _params(rng, qt, shape, ft=np.float32):
    """Scales (not powers of two) and zero points within the type's range."""
    info = np.iinfo(QTYPES[qt][0])
    scale = rng.uniform(0.02, 0.9, shape).astype(ft)
    mid = (int(info.min) + int(info.max)) // 2
    zp = rng.integers(mid - 20, mid + 21, shape).astype(QTYPES[qt][0])
    return scale, zp


def _x_for(rng, qt, shape, scale_max, ft=np.float32):
    """Inputs spanning the whole range and past both ends (saturation), some exact ties."""
    info = np.iinfo(QTYPES[qt][0])
    span = (int(info.max) - int(info.min)) * scale_max
    x = rng.uniform(-0.8 * span, 0.8 * span, shape).astype(ft)
    return x


# -- QuantizeLinear ---------------------------------------------------------------------------


@pytest.mark.parametrize("qt", list(QTYPES))
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1])
def test_quantize_per_tensor_and_axis(ctx, qt, axis):
    rng = _rng("q", qt, axis)
    shape = (3, 5, 7)
    n = 1 if axis is None else shape[axis]
    scale, zp = _params(rng, qt, () if axis is None else (n,))
    x = _x_for(rng, qt, shape, float(scale.max()))
    attrs = {} if axis is None else {"axis": axis}
    got = _check_q(ctx, _model("QuantizeLinear", {"x": x}, {"s": scale, "z": zp}, attrs), {"x": x})
    info = np.iinfo(QTYPES[qt][0])
    assert got.min() == info.min and got.max() == info.max  # both ends saturated


def test_quantize_scalar_input(ctx):
    # rank 0: the parameters are scalars too (a [1] scale is accepted as one)
    rng = _rng("q0")
    for x in rng.uniform(-100, 100, 3).astype(np.float32):
        x = np.array(x)
        m = _model("QuantizeLinear", {"x": x}, {"s": np.array([0.37], np.float32), "z": np.array([7], np.int8)})
        _check_q(ctx, m, {"x": x})


@pytest.mark.parametrize("qt", list(QTYPES))
@pytest.mark.parametrize("scale", [0.75, 3.0, 1.25, 0.5])
def test_quantize_ties_round_half_to_even(ctx, qt, scale):
    # x / scale = k + 0.5 exactly: (k + 0.5) * scale is exact in float32 for these scales (a few
    # significant bits), and a correctly rounded division gives k + 0.5 back
    info = np.iinfo(QTYPES[qt][0])
    zp = np.array(0 if info.min == 0 else -3, QTYPES[qt][0])
    k = np.arange(-40, 40, dtype=np.float64)
    x = ((k + 0.5) * scale).astype(np.float32)
    assert np.array_equal(x.astype(np.float64) / scale, k + 0.5)
    got = _check_q(ctx, _model("QuantizeLinear", {"x": x}, {"s": np.array(scale, np.float32), "z": zp}), {"x": x})
    even = np.clip(
        np.where(np.floor(k + 0.5) % 2 == 0, np.floor(k + 0.5), np.ceil(k + 0.5)) + int(zp), info.min, info.max
    )
    np.testing.assert_array_equal(got.astype(np.int64), even.astype(np.int64))


@pytest.mark.parametrize("qt", list(QTYPES))
def test_quantize_saturation_edges(ctx, qt):
    # values around both saturation bounds, shifted by a zero point: lo - 0.5 rounds to lo (even or
    # not), lo - 1 saturates, likewise at the top; and far beyond both ends
    info = np.iinfo(QTYPES[qt][0])
    lo, hi = int(info.min), int(info.max)
    zp = np.array(lo + 5 if lo == 0 else -7, QTYPES[qt][0])
    s = np.float32(0.5)
    q = np.array([lo - 1.5, lo - 1, lo - 0.5, lo, lo + 0.5, hi - 0.5, hi, hi + 0.5, hi + 1, hi + 1.5], np.float64)
    x = np.concatenate([((q - int(zp)) * s), [-1e6, 1e6, -3e4, 7e4]]).astype(np.float32)
    got = _check_q(ctx, _model("QuantizeLinear", {"x": x}, {"s": np.array(s), "z": zp}), {"x": x})
    assert got[0] == lo and got[-4] == lo and got[-3] == hi and got[9] == hi


@pytest.mark.parametrize("qt", ["uint8", "int8", "int16"])
@pytest.mark.parametrize("axis,bs", [(0, 2), (1, 3), (1, 4), (-1, 2), (-1, 5)])
def test_quantize_blocked(ctx, qt, axis, bs):
    # block_size dividing the axis (WebNN's blockwise broadcast) or not (a last partial block)
    rng = _rng("qb", qt, axis, bs)
    shape = (4, 6, 10)
    sshape = list(shape)
    sshape[axis] = -(-shape[axis] // bs)
    scale, zp = _params(rng, qt, tuple(sshape))
    x = _x_for(rng, qt, shape, float(scale.max()))
    m = _model("QuantizeLinear", {"x": x}, {"s": scale, "z": zp}, {"axis": axis, "block_size": bs})
    _check_q(ctx, m, {"x": x})


def test_quantize_blocked_params_as_inputs(ctx):
    # the scale and zero point computed at run time (graph inputs): the partial block is built
    # with expand / reshape / slice instead of on the host
    rng = _rng("qbi")
    x = rng.uniform(-60, 60, (3, 7)).astype(np.float32)
    scale, zp = _params(rng, "int8", (3, 3))
    m = _model("QuantizeLinear", {"x": x, "s": scale, "z": zp}, {}, {"axis": 1, "block_size": 3})
    feeds = {"x": x, "s": scale, "z": zp}
    _check_q(ctx, m, feeds)
    md = _model("DequantizeLinear", {"x": _ref(m, feeds), "s": scale, "z": zp}, {}, {"axis": 1, "block_size": 3})
    fd = {"x": _ref(m, feeds), "s": scale, "z": zp}
    assert_exact(_ours(ctx, md, fd), _ref(md, fd))
    assert_exact(_ours(ctx, md, fd), _ort(md, fd))


@pytest.mark.parametrize("qt", ["uint8", "int8", "int16", "uint16"])
@pytest.mark.parametrize("axis", [None, 1])
def test_quantize_float16(ctx, qt, axis):
    # ONNX divides in the scale's type: the reference rounds the float16 quotient to float16
    # before rounding it to an integer, which can land on a tie the float32 quotient misses.
    # onnxruntime divides in float32 instead, so it is compared where the model asks for that
    # (opset 23 precision=FLOAT); both are matched bit for bit.
    rng = _rng("qh", qt, axis)
    shape = (4, 6, 8)
    scale, zp = _params(rng, qt, () if axis is None else (6,), np.float16)
    x = _x_for(rng, qt, shape, float(scale.max()), np.float16)
    # keep |x / scale| within float16's range: past it the reference's quotient is inf, whose
    # numpy conversion to int32 is undefined
    lim = 60000 * float(scale.min())
    x = np.clip(x, -lim, lim).astype(np.float16)
    x.flat[::7] = (np.round(x.flat[::7] / 0.5) * 0.5).astype(np.float16)  # many ties
    attrs = {} if axis is None else {"axis": axis}
    m = _model("QuantizeLinear", {"x": x}, {"s": scale, "z": zp}, attrs)
    got = _check_q(ctx, m, {"x": x}, ort_too=False)
    m32 = _model("QuantizeLinear", {"x": x}, {"s": scale, "z": zp}, dict(attrs, precision=TP.FLOAT), opset=23)
    got32 = _check_q(ctx, m32, {"x": x})
    # the two arithmetics must differ somewhere on this data, or the test proves nothing
    assert (got != got32).any()


@pytest.mark.parametrize("xt,st", [(np.float16, np.float32), (np.float32, np.float16)])
def test_quantize_mixed_float_types(ctx, xt, st):
    # opset 23 lets x and the scale differ: without `precision` the division is in the scale's
    # type, as the spec says and onnxruntime does. The reference divides in numpy's promotion
    # (float32 both ways), which agrees for a float32 scale only.
    rng = _rng("qm", xt, st)
    scale, zp = _params(rng, "int8", (5,), st)
    x = _x_for(rng, "int8", (5, 9), float(scale.max()), xt)
    x.flat[::3] = (np.round(x.flat[::3] * 2) / 2).astype(xt)  # near-ties, where the types differ
    m = _model("QuantizeLinear", {"x": x}, {"s": scale, "z": zp}, {"axis": 0}, opset=23)
    _check_q(ctx, m, {"x": x}) if st == np.float32 else assert_exact(_ours(ctx, m, {"x": x}), _ort(m, {"x": x}))


def test_quantize_precision_float16(ctx):
    # precision=FLOAT16 with float32 data: x and the scale are rounded to float16 first
    rng = _rng("qp16")
    scale, zp = _params(rng, "uint8", ())
    x = _x_for(rng, "uint8", (64,), float(scale))
    m = _model("QuantizeLinear", {"x": x}, {"s": scale, "z": zp}, {"precision": TP.FLOAT16}, opset=23)
    assert_exact(_ours(ctx, m, {"x": x}), _ref(m, {"x": x}))


@pytest.mark.parametrize("od", ["uint8", "int8", "uint16", "int16"])
def test_quantize_output_dtype_without_zero_point(ctx, od):
    rng = _rng("qod", od)
    x = rng.uniform(-9e4, 9e4, (50,)).astype(np.float32)
    scale = np.array(0.37 * 256 if od.endswith("16") else 0.37, np.float32)
    m = _model("QuantizeLinear", {"x": x}, {"s": scale}, {"output_dtype": QTYPES[od][1], "saturate": 1})
    _check_q(ctx, m, {"x": x})


def test_quantize_nan_gives_the_minimum(ctx):
    # not specified by ONNX; onnxruntime clamps NaN to the range's minimum (max/min with NaN
    # first), and we do the same rather than leave it undefined (the reference's numpy cast of
    # NaN to int is platform-defined, so it is not compared here)
    x = np.array([np.nan, 1.0, -np.nan, 3.0], np.float32)
    for qt in ("uint8", "int8", "int16"):
        zp = np.array(2, QTYPES[qt][0])
        m = _model("QuantizeLinear", {"x": x}, {"s": np.array(0.3, np.float32), "z": zp})
        assert_exact(_ours(ctx, m, {"x": x}), _ort(m, {"x": x}))


# -- DequantizeLinear -------------------------------------------------------------------------


@pytest.mark.parametrize("qt", ["uint8", "int8", "uint16", "int16", "int32"])
@pytest.mark.parametrize("mode", ["tensor", "axis0", "axis2", "block"])
@pytest.mark.parametrize("ft", [np.float32, np.float16])
def test_dequantize(ctx, qt, mode, ft):
    rng = _rng("dq", qt, mode, ft)
    shape = (4, 5, 6)
    dt = np.int32 if qt == "int32" else QTYPES[qt][0]
    info = np.iinfo(dt)
    x = rng.integers(max(int(info.min), -(2**30)), min(int(info.max), 2**30) + 1, shape).astype(dt)
    x.flat[:2] = [info.min, info.max]
    sshape, attrs = {
        "tensor": ((), {}),
        "axis0": ((4,), {"axis": 0}),
        "axis2": ((6,), {"axis": -1}),
        "block": ((4, 5, 2), {"axis": 2, "block_size": 4}),
    }[mode]
    scale = rng.uniform(0.001, 0.9, sshape).astype(ft)
    # int32 zero points must be 0 (onnxruntime enforces it; ONNX says they are usually unused)
    zp = np.zeros(sshape, dt) if qt == "int32" else _params(rng, qt, sshape)[1]
    m = _model("DequantizeLinear", {"x": x}, {"s": scale, "z": zp}, attrs)
    got = _ours(ctx, m, {"x": x})
    assert_exact(got, _ref(m, {"x": x}))
    assert_exact(got, _ort(m, {"x": x}))


@pytest.mark.parametrize("st,ot", [(np.float16, TP.FLOAT), (np.float32, TP.FLOAT16)])
def test_dequantize_output_dtype(ctx, st, ot):
    # (x - zero point) * scale in float32, rounded once to output_dtype (opset 23)
    rng = _rng("dqo", st, ot)
    x = rng.integers(-128, 128, (6, 7)).astype(np.int8)
    scale = rng.uniform(0.001, 0.9, (7,)).astype(st)
    zp = rng.integers(-10, 10, (7,)).astype(np.int8)
    m = _model("DequantizeLinear", {"x": x}, {"s": scale, "z": zp}, {"axis": 1, "output_dtype": ot}, opset=23)
    got = _ours(ctx, m, {"x": x})
    assert_exact(got, _ref(m, {"x": x}))
    assert_exact(got, _ort(m, {"x": x}))


# -- what is refused --------------------------------------------------------------------------


def _refused(ctx, m, feeds, match):
    with pytest.raises(mltensor.NotSupportedError, match=match):
        _ours(ctx, m, feeds)


@pytest.mark.parametrize("t", [TP.INT4, TP.UINT4, TP.FLOAT8E4M3FN])
def test_refused_types(ctx, t):
    # WebNN has no 4-bit or float8 operand type here: refused at load, naming the type
    x = np.ones((2, 4), np.float32)
    z = h.make_tensor("z", t, [], [0])
    m = _model("QuantizeLinear", {"x": x}, {"s": np.array(0.5, np.float32), "z": z}, out_type=t)
    _refused(ctx, m, {"x": x}, TP.DataType.Name(t))
    # a DequantizeLinear of such a constant is folded at load (by onnx.reference): it runs
    q = h.make_tensor("q", t, [2, 2], [1, 2, 3, 0])
    g = h.make_graph(
        [h.make_node("DequantizeLinear", ["q", "s"], ["y"])],
        "g",
        [],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        [q, nh.from_array(np.array(0.5, np.float32), "s")],
    )
    md = h.make_model(g, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
    assert_exact(_ours(ctx, md, {}), _ref(md, {}))


def test_refused_variants(ctx):
    x = np.ones((2, 4), np.float32)
    s = np.array(0.5, np.float32)
    m = _model(
        "QuantizeLinear",
        {"x": x},
        {"s": s, "z": np.array(0, np.int8)},
        {"precision": TP.BFLOAT16},
        opset=23,
        out_type=TP.INT8,
    )
    _refused(ctx, m, {"x": x}, "precision BFLOAT16")
    xi = np.ones((2, 4), np.int32)
    m = _model("QuantizeLinear", {"x": xi}, {"s": np.array(2, np.int32), "z": np.array(0, np.int8)}, out_type=TP.INT8)
    _refused(ctx, m, {"x": xi}, "input type INT32")
    # blocked parameter whose shape does not match ceil(n / block_size)
    m = _model(
        "QuantizeLinear",
        {"x": x},
        {"s": np.ones((2, 3), np.float32), "z": np.zeros((2, 3), np.int8)},
        {"axis": 1, "block_size": 3},
        out_type=TP.INT8,
    )
    _refused(ctx, m, {"x": x}, "blocked parameter shape")


# -- whole models from quantize_static ----------------------------------------------------------


def _cnn(rng):
    """conv -> relu -> conv -> add (residual) -> relu -> global average pool -> flatten -> gemm."""
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.15).astype(np.float32)
    wg = (rng.standard_normal((10, 8)) * 0.4).astype(np.float32)
    inits = [
        nh.from_array(w1, "w1"),
        nh.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b1"),
        nh.from_array(w2, "w2"),
        nh.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b2"),
        nh.from_array(wg, "wg"),
        nh.from_array(rng.standard_normal(10).astype(np.float32) * 0.1, "bg"),
    ]
    nodes = [
        h.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        h.make_node("Add", ["c2", "r1"], ["a"]),
        h.make_node("Relu", ["a"], ["r2"]),
        h.make_node("GlobalAveragePool", ["r2"], ["p"]),
        h.make_node("Flatten", ["p"], ["f"]),
        h.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
    ]
    g = h.make_graph(
        nodes,
        "cnn",
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 3, 8, 8])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["N", 10])],
        inits,
    )
    return g, (3, 8, 8)


def _mlp(rng):
    """matmul + bias -> relu -> matmul + bias -> relu -> gemm."""
    inits = [
        nh.from_array((rng.standard_normal((16, 32)) * 0.3).astype(np.float32), "w1"),
        nh.from_array((rng.standard_normal(32) * 0.1).astype(np.float32), "b1"),
        nh.from_array((rng.standard_normal((32, 24)) * 0.2).astype(np.float32), "w2"),
        nh.from_array((rng.standard_normal(24) * 0.1).astype(np.float32), "b2"),
        nh.from_array((rng.standard_normal((24, 6)) * 0.3).astype(np.float32), "w3"),
        nh.from_array((rng.standard_normal(6) * 0.1).astype(np.float32), "b3"),
    ]
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["m1"]),
        h.make_node("Add", ["m1", "b1"], ["a1"]),
        h.make_node("Relu", ["a1"], ["r1"]),
        h.make_node("MatMul", ["r1", "w2"], ["m2"]),
        h.make_node("Add", ["m2", "b2"], ["a2"]),
        h.make_node("Relu", ["a2"], ["r2"]),
        h.make_node("Gemm", ["r2", "w3", "b3"], ["y"]),
    ]
    g = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", TP.FLOAT, ["N", 16])],
        [h.make_tensor_value_info("y", TP.FLOAT, ["N", 6])],
        inits,
    )
    return g, (16,)


def _quantized(tmp_path, which, per_channel, act):
    from onnxruntime import quantization as q

    rng = _rng("model", which, per_channel, act)
    g, item = {"cnn": _cnn, "mlp": _mlp}[which](rng)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(m.SerializeToString())

    class Reader(q.CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": rng.standard_normal((2, *item)).astype(np.float32)} for _ in range(8)])

        def get_next(self):
            return next(self.batches, None)

    q.quantize_static(
        str(src),
        str(dst),
        Reader(),
        quant_format=q.QuantFormat.QDQ,
        per_channel=per_channel,
        activation_type=q.QuantType.QUInt8 if act == "uint8" else q.QuantType.QInt8,
        weight_type=q.QuantType.QInt8,
    )
    import onnx

    model = onnx.load(str(dst))
    assert {n.op_type for n in model.graph.node} >= {"QuantizeLinear", "DequantizeLinear"}
    return model, item, rng


@pytest.mark.parametrize("which", ["cnn", "mlp"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("act", ["uint8", "int8"])
def test_quantize_static_model(ctx, tmp_path, which, per_channel, act):
    model, item, rng = _quantized(tmp_path, which, per_channel, act)
    # the output's quantization step: the scale of the last DequantizeLinear
    inits = {t.name: nh.to_array(t) for t in model.graph.initializer}
    last = next(n for n in reversed(model.graph.node) if n.op_type == "DequantizeLinear")
    step = float(inits[last.input[1]])
    ref = _ort_session(model)
    s = InferenceSession(model, ctx)
    try:
        for batch in (1, 5):
            x = rng.standard_normal((batch, *item)).astype(np.float32)
            (got,) = s.run(None, {"x": x})
            (want,) = ref.run(None, {"x": x})
            assert got.shape == want.shape and got.dtype == want.dtype
            # Between the QDQ pairs convs / matmuls / pools run in float on dequantized values,
            # and our summation order (tiled GEMM, workgroup reductions) differs from MLAS's: a sum
            # landing within an ulp of a rounding boundary (k + 0.5 steps) may quantize to the
            # neighbouring integer. The quantized values are otherwise exact, so outputs agree
            # to the bit almost everywhere and never by more than one output step.
            diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
            assert diff.max() <= step * 1.001, (diff.max(), step)
            assert (diff == 0).mean() >= 0.95, (diff == 0).mean()
    finally:
        s.close()
