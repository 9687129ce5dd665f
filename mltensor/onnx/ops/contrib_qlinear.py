"""onnxruntime's QOperator-format int8 operators (domain com.microsoft), what
onnxruntime.quantization.quantize_static(..., quant_format=QuantFormat.QOperator) writes around
QLinearConv / QLinearMatMul (integer.py): QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearConcat, QLinearWhere, QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax, QGemm.

Semantics are onnxruntime's CPU kernels (MLAS), uint8 and int8, per-tensor scales and zero points:

- Elementwise operators whose result depends only on the 8-bit inputs are lookup tables computed
  at load, in float32 exactly as onnxruntime computes them, then one gather on the GPU (bit-exact
  on every device: no float arithmetic runs on the GPU).
  QLinearSigmoid / QLinearLeakyRelu / QLinearConcat / QLinearWhere: onnxruntime's own 256-entry
  tables (QlinearBuildLookupTable: dequantize x_scale * (x - x_zp), the function (sigmoid: MLAS's
  rational approximation, evaluated with FMA as its FMA3/AVX-512 kernels do), MlasQuantizeLinear:
  round_half_even(v / y_scale) + y_zp, saturated). QLinearAdd / QLinearMul: a 256 x 256 table
  (64 KiB) of MlasQLinearAdd's AVX2 arithmetic (fma(a, A/C, fma(b, B/C, C_zp - (A/C * a_zp +
  B/C * b_zp)))) and MlasQLinearMul's ((a - a_zp)(b - b_zp) * (A * B / C) + C_zp), then
  round_half_even and saturation. onnxruntime's other builds (SSE2 only, NEON fixed point) and
  its one-sided broadcast paths round a few near-tie values the other way: at most one step.
- QLinearGlobalAveragePool: the exact integer sum (x - x_zp) times x_scale / (y_scale * size) in
  float32, round half to even, + y_zp, saturated (MlasQLinearGlobalAveragePoolNchw): exact.
- QGemm: the exact int32 GEMM (+ C), times alpha * a_scale * b_scale / y_scale, as QLinearMatMul
  (exact); without y_scale a float32 output (acc * alpha * a_scale * b_scale).
- QLinearAveragePool: onnxruntime's order of float32 operations (dequantize, one add per kernel
  offset in row order, divide by the clipped count, round_half_even(avg / y_scale + y_zp)); a
  whole-input window is its global pool. Exact where f32 division is correctly rounded (lavapipe,
  CPUs; WGSL allows 2.5 ulp).
- QLinearSoftmax: onnxruntime's float exp table (indexed by max - x), a float32 sum per row, then
  round_half_even(e * floor(1 / y_scale) / sum) + y_zp, saturated;
  the sum's order and the division may differ by one step on near ties (bit-equal on lavapipe).

Scales and zero points must be constants (they always are in quantize_static models) and per
tensor; channels_last pools, 3-D pools, and transA / non-constant parameters are rejected with
UnsupportedError naming the input or attribute.
"""

import itertools

import numpy as np

from ..errors import unsupported
from ._helpers import X, norm_axis, prod
from ._registry import op
from ._window import explicit_pads, pool_out
from .integer import Weight, col_param, integer_matmul

_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}
_NP = {"uint8": np.uint8, "int8": np.int8}
_f32 = np.float32


# -- parameters ----------------------------------------------------------------------------------


def _q8(im, v, what, t):
    x = X(im, v)
    if x.data_type not in _RANGE:
        unsupported(f"{t}: {what} data type {x.data_type} is not supported (int8 and uint8 are)")
    return x


def _scale(v, what, t):
    if v is None:
        unsupported(f"{t}: input {what} is required")
    if not isinstance(v, np.ndarray):
        unsupported(f"{t}: input {what} must be a constant (known at load), got a computed tensor")
    if v.size != 1:
        unsupported(f"{t}: input {what} of shape {list(v.shape)} is not supported (one element, per tensor)")
    if v.dtype != np.float32:
        unsupported(f"{t}: input {what} data type {v.dtype.name} is not supported (float32 is)")
    return _f32(v.reshape(()))


def _zp(v, data_type, what, t):
    """A constant per-tensor zero point as a Python int (absent: 0)."""
    if v is None:
        return 0
    if not isinstance(v, np.ndarray):
        unsupported(f"{t}: input {what} must be a constant (known at load), got a computed tensor")
    if v.size != 1:
        unsupported(f"{t}: input {what} of shape {list(v.shape)} is not supported (one element, per tensor)")
    if v.dtype.name != data_type:
        unsupported(f"{t}: input {what} data type {v.dtype.name} differs from its tensor's {data_type}")
    return int(v.reshape(()))


def _ins(ins, n):
    return list(ins) + [None] * (n - len(ins))


# -- host float32 arithmetic as MLAS does it -----------------------------------------------------


def _fma(a, b, c):
    """float32 fused multiply-add: the product of two float32 values is exact in float64."""
    return _f32(np.float64(_f32(a)) * np.float64(_f32(b)) + np.float64(_f32(c)))


def _saturate(v, data_type):
    """round half to even, saturated into the type (v already holds the zero point)."""
    lo, hi = _RANGE[data_type]
    return np.clip(np.rint(v), lo, hi).astype(_NP[data_type])


def _quantize(v, scale, zp, data_type):
    """MlasQuantizeLinear: clamp(round_half_even(v / scale), lo - zp, hi - zp) + zp."""
    lo, hi = _RANGE[data_type]
    with np.errstate(all="ignore"):
        q = np.rint(_f32(v) / _f32(scale))
    return (np.clip(q, lo - zp, hi - zp) + zp).astype(_NP[data_type])


def _values(data_type):
    lo, hi = _RANGE[data_type]
    return np.arange(lo, hi + 1, dtype=np.int32)


def _dequantized(data_type, scale, zp):
    """x_scale * (x - x_zp) in float32 for every code, in code order."""
    return _f32(scale) * (_values(data_type) - zp).astype(_f32)


_LOGISTIC = [
    _f32(c)
    for c in (
        4.37031012579801e-11,
        1.15627324459942e-07,
        6.08574864600143e-05,
        8.51377133304701e-03,
        2.48287947061529e-01,
        6.10247389755681e-13,
        5.76102136993427e-09,
        6.29106785017040e-06,
        1.70198817374094e-03,
        1.16817656904453e-01,
        9.93151921023180e-01,
    )
]


def _logistic(x):
    """MlasComputeLogistic (Eigen's rational approximation, clamped to [-18, 18]) with FMA."""
    a9, a7, a5, a3, a1, b10, b8, b6, b4, b2, b0 = _LOGISTIC
    v = np.minimum(np.maximum(_f32(x), _f32(-18.0)), _f32(18.0))
    v2 = _f32(v * v)
    p = _fma(v2, a9, a7)
    for c in (a5, a3, a1):
        p = _fma(p, v2, c)
    p = _f32(p * v)
    q = _fma(v2, b10, b8)
    for c in (b6, b4, b2, b0):
        q = _fma(q, v2, c)
    with np.errstate(all="ignore"):
        return np.clip(_f32(_f32(p / q) + _f32(0.5)), _f32(0.0), _f32(1.0)).astype(_f32)


# -- lookups on the GPU --------------------------------------------------------------------------


def _index(im, x):
    """The table row of each code: int32(x) - the type's minimum."""
    b = im.b
    i = b.cast(x, "int32")
    lo = _RANGE[x.data_type][0]
    return i if lo == 0 else b.add(i, b.constant(np.array(-lo, np.int32)))


def _lookup(im, table, x):
    return im.b.gather(im.b.constant(np.ascontiguousarray(table)), _index(im, x), axis=0)


def _lookup2(im, table, a, b_):
    """table[256 * row(a) + row(b)] with a and b broadcast against each other."""
    b = im.b
    i = b.add(b.mul(_index(im, a), b.constant(np.array(256, np.int32))), _index(im, b_))
    return b.gather(b.constant(np.ascontiguousarray(table.reshape(-1))), i, axis=0)


def _unary_table(im, node, ins, fn):
    """QLinearSigmoid / QLinearLeakyRelu: X, X_scale, X_zero_point, Y_scale, Y_zero_point."""
    t = node.op_type
    ins = _ins(ins, 5)
    x = _q8(im, ins[0], "X", t)
    dt = x.data_type
    xs, zx = _scale(ins[1], "X_scale", t), _zp(ins[2], dt, "X_zero_point", t)
    ys, zy = _scale(ins[3], "Y_scale", t), _zp(ins[4], dt, "Y_zero_point", t)
    table = _quantize(fn(_dequantized(dt, xs, zx)), ys, zy, dt)
    return _lookup(im, table, x)


@op("com.microsoft.QLinearSigmoid")
def _qlinear_sigmoid(im, node, ins, attrs):
    return _unary_table(im, node, ins, _logistic)


@op("com.microsoft.QLinearLeakyRelu", attrs=("alpha",))
def _qlinear_leaky_relu(im, node, ins, attrs):
    alpha = _f32(attrs.get("alpha", 0.01))
    return _unary_table(im, node, ins, lambda v: np.where(v >= 0, v, _f32(alpha * v)).astype(_f32))


def _binary(im, node, ins, table_fn):
    """QLinearAdd / QLinearMul: A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
    C_zero_point (numpy broadcasting of A and B)."""
    t = node.op_type
    ins = _ins(ins, 8)
    a = _q8(im, ins[0], "A", t)
    c = _q8(im, ins[3], "B", t)
    dt = a.data_type
    if c.data_type != dt:
        unsupported(f"{t}: B data type {c.data_type} differs from A's {dt}")
    sa, za = _scale(ins[1], "A_scale", t), _zp(ins[2], dt, "A_zero_point", t)
    sb, zb = _scale(ins[4], "B_scale", t), _zp(ins[5], dt, "B_zero_point", t)
    sc, zc = _scale(ins[6], "C_scale", t), _zp(ins[7], dt, "C_zero_point", t)
    va = _values(dt).astype(_f32).reshape(-1, 1)
    vb = _values(dt).astype(_f32).reshape(1, -1)
    with np.errstate(all="ignore"):
        v = table_fn(va, vb, sa, za, sb, zb, sc, zc)
    return _lookup2(im, _saturate(v, dt), a, c)


def _add_values(va, vb, sa, za, sb, zb, sc, zc):
    # MlasQLinearAddKernelAvx2Helper, measured bit for bit against onnxruntime on every pair
    r_ac, r_bc = _f32(sa / sc), _f32(sb / sc)
    fixed = _f32(_f32(zc) - _fma(r_ac, za, _f32(r_bc * _f32(zb))))
    return _fma(va, r_ac, _fma(vb, r_bc, fixed))


def _mul_values(va, vb, sa, za, sb, zb, sc, zc):
    # MlasQLinearMulKernel: the exact product of the centred codes times A * B / C, + C_zp
    ratio = _f32(_f32(sa * sb) / sc)
    p = ((va - _f32(za)) * (vb - _f32(zb))).astype(_f32)  # |p| <= 65025: exact
    return _f32(_f32(p * ratio) + _f32(zc))


@op("com.microsoft.QLinearAdd")
def _qlinear_add(im, node, ins, attrs):
    return _binary(im, node, ins, _add_values)


@op("com.microsoft.QLinearMul")
def _qlinear_mul(im, node, ins, attrs):
    return _binary(im, node, ins, _mul_values)


@op("com.microsoft.QLinearConcat", attrs=("axis",))
def _qlinear_concat(im, node, ins, attrs):
    """Y_scale, Y_zero_point, then (X, X_scale, X_zero_point) per input: each input requantized
    to the output's parameters through its table (the identity when they are equal)."""
    t = "QLinearConcat"
    if "axis" not in attrs:
        unsupported(f"{t}: attribute axis is required")
    if len(ins) < 5 or (len(ins) - 2) % 3:
        unsupported(
            f"{t}: expected Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples, got {len(ins)} inputs"
        )
    ys = _scale(ins[0], "Y_scale", t)
    xs = []
    dt = None
    for k in range(2, len(ins), 3):
        x = _q8(im, ins[k], f"input {k}", t)
        dt = dt or x.data_type
        if x.data_type != dt:
            unsupported(f"{t}: input data types differ ({dt}, {x.data_type})")
        xs.append((x, _scale(ins[k + 1], f"X_scale {k + 1}", t), _zp(ins[k + 2], dt, f"X_zero_point {k + 2}", t)))
    zy = _zp(ins[1], dt, "Y_zero_point", t)
    parts = []
    for x, s, z in xs:
        if s == ys and z == zy:
            parts.append(x)  # onnxruntime copies these
        else:
            parts.append(_lookup(im, _quantize(_dequantized(dt, s, z), ys, zy, dt), x))
    axis = norm_axis(attrs["axis"], len(parts[0].shape))
    return im.b.concat(parts, axis)


@op("com.microsoft.QLinearWhere")
def _qlinear_where(im, node, ins, attrs):
    """condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale, z_zero_point."""
    t = "QLinearWhere"
    ins = _ins(ins, 9)
    cond = X(im, ins[0])
    x = _q8(im, ins[1], "X", t)
    y = _q8(im, ins[4], "Y", t)
    dt = x.data_type
    if y.data_type != dt:
        unsupported(f"{t}: Y data type {y.data_type} differs from X's {dt}")
    zs, zz = _scale(ins[7], "z_scale", t), _zp(ins[8], dt, "z_zero_point", t)
    out = []
    for v, s_in, z_in, nm in ((x, ins[2], ins[3], "x"), (y, ins[5], ins[6], "y")):
        s, z = _scale(s_in, f"{nm}_scale", t), _zp(z_in, dt, f"{nm}_zero_point", t)
        out.append(v if (s == zs and z == zz) else _lookup(im, _quantize(_dequantized(dt, s, z), zs, zz, dt), v))
    if cond.data_type != "uint8":
        cond = im.b.cast(cond, "uint8")
    return im.b.where(cond, out[0], out[1])


# -- pools ---------------------------------------------------------------------------------------


def _requant_float(im, v, zp, data_type):
    """round_half_even(v) + zp saturated, v float32 (the value without the zero point)."""
    b = im.b
    lo, hi = _RANGE[data_type]
    r = b.round_even(v)
    r = b.clamp(r, min_value=float(lo - zp), max_value=float(hi - zp))
    r = b.add(r, b.constant(np.array(zp, _f32)))
    return b.cast(r, data_type)  # integral and in range: exact


@op("com.microsoft.QLinearGlobalAveragePool", attrs=("channels_last",))
def _qlinear_gap(im, node, ins, attrs):
    t = "QLinearGlobalAveragePool"
    if attrs.get("channels_last", 0):
        unsupported(f"{t}: attribute channels_last=1 is not supported")
    ins = _ins(ins, 5)
    x = _q8(im, ins[0], "X", t)
    dt = x.data_type
    if len(x.shape) < 3:
        unsupported(f"{t}: input rank {len(x.shape)} is not supported (3 or more)")
    xs, zx = _scale(ins[1], "x_scale", t), _zp(ins[2], dt, "x_zero_point", t)
    ys, zy = _scale(ins[3], "y_scale", t), _zp(ins[4], dt, "y_zero_point", t)
    return _gap(im, x, xs, zx, ys, zy, t)


def _gap(im, x, xs, zx, ys, zy, t):
    """MlasQLinearGlobalAveragePoolNchw: sum(x - x_zp) * (x_scale / (y_scale * size)), rounded."""
    dt = x.data_type
    axes = list(range(2, len(x.shape)))
    size = prod(x.shape[2:])
    if not isinstance(size, int) or size * 255 >= 1 << 24:
        unsupported(f"{t}: a spatial size of {size} is not supported (static, below 65793)")
    scale = _f32(xs / _f32(ys * _f32(size)))
    b = im.b
    # integers below 2**24 are exact in float32, whatever the summation order
    s = b.reduce_sum(b.cast(x, "float32"), axes=axes, keep_dimensions=True)
    acc = b.sub(s, b.constant(np.array(zx * size, _f32)))
    return _requant_float(im, b.mul(acc, b.constant(np.array(scale, _f32))), zy, dt)


@op(
    "com.microsoft.QLinearAveragePool",
    attrs=("auto_pad", "ceil_mode", "channels_last", "count_include_pad", "kernel_shape", "pads", "strides"),
)
def _qlinear_average_pool(im, node, ins, attrs):
    """onnxruntime's QLinearPool2DTask: the window's dequantized values summed in float32 in row
    order (one add per kernel offset, in that order: the same roundings), divided by the count
    (clipped to the input unless count_include_pad), then QuantizeLinear. A window covering the
    whole input without padding is onnxruntime's global average pool (exact integer sum)."""
    t = "QLinearAveragePool"
    if attrs.get("channels_last", 0):
        unsupported(f"{t}: attribute channels_last=1 is not supported")
    ins = _ins(ins, 5)
    x = _q8(im, ins[0], "X", t)
    dt = x.data_type
    sp = len(x.shape) - 2
    if sp not in (1, 2):
        unsupported(f"{t}: {sp}-D pooling is not supported (1-D and 2-D are)")
    xs, zx = _scale(ins[1], "x_scale", t), _zp(ins[2], dt, "x_zero_point", t)
    ys, zy = _scale(ins[3], "y_scale", t), _zp(ins[4], dt, "y_zero_point", t)
    in_sp = list(x.shape[2:])
    if any(not isinstance(v, int) for v in in_sp):
        unsupported(f"{t}: dynamic spatial dimensions are not supported")
    if "kernel_shape" not in attrs:
        unsupported(f"{t}: attribute kernel_shape is required")
    k = list(attrs["kernel_shape"])
    s = list(attrs.get("strides") or [1] * sp)
    begin, end = explicit_pads(attrs, in_sp, k, s, [1] * sp)
    if k == in_sp and not any(begin + end):
        return _gap(im, x, xs, zx, ys, zy, t)
    if attrs.get("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-in_sp[i] // s[i]) for i in range(sp)]
    else:
        out = pool_out(in_sp, k, s, [1] * sp, begin, end, bool(attrs.get("ceil_mode", 0)))
    include = bool(attrs.get("count_include_pad", 0))
    b = im.b
    r = len(x.shape)
    xf = b.dequantize_linear(x, b.constant(np.full([1] * r, xs, _f32)), b.constant(np.full([1] * r, zx, _NP[dt])))
    ext = [max(0, (out[i] - 1) * s[i] + k[i] - in_sp[i] - begin[i]) for i in range(sp)]
    if any(begin) or any(ext):
        xf = b.pad(xf, [0, 0] + list(begin), [0, 0] + ext)
    total = None
    for off in itertools.product(*[range(v) for v in k]):
        win = b.slice(
            xf, [0, 0] + list(off), list(x.shape[:2]) + [(out[i] - 1) * s[i] + 1 for i in range(sp)], strides=[1, 1] + s
        )
        total = win if total is None else b.add(total, win)
    # the element count of each window, clipped to the input (onnxruntime's hend = min(., size))
    counts = np.ones([1, 1] + out, np.float32)
    for i in range(sp):
        o = np.arange(out[i]) * s[i] - begin[i]
        n = np.full(out[i], k[i]) if include else np.minimum(o + k[i], in_sp[i]) - np.maximum(o, 0)
        counts = counts * n.reshape([1, 1] + [1] * i + [-1] + [1] * (sp - 1 - i)).astype(np.float32)
    avg = b.div(total, b.constant(counts))
    # quantize_value: round_half_even(avg / y_scale + y_zp) (the zero point added before the
    # rounding, in float32: not QuantizeLinear's round(avg / y_scale) + y_zp), saturated
    v = b.add(b.div(avg, b.constant(np.array(ys, _f32))), b.constant(np.array(zy, _f32)))
    lo, hi = _RANGE[dt]
    return b.cast(b.clamp(b.round_even(v), min_value=float(lo), max_value=float(hi)), dt)


# -- softmax -------------------------------------------------------------------------------------


def _softmax_table(x_scale, reduce_len):
    """QlinearBuildLookupTableUint32 (float entries): e[k] = exp((bit_shift - k) * x_scale) for
    k = max - x in 0..255, bit_shift = max(0, log(FLT_MAX / D) - 5) / x_scale, in double."""
    fmax = np.finfo(np.float32).max
    shift = max(0.0, float(np.log(np.float64(_f32(fmax / _f32(reduce_len))))) - 5.0) / float(x_scale)
    k = np.arange(256, dtype=np.float64)
    return np.exp((shift - k) * np.float64(x_scale)).astype(_f32)


@op("com.microsoft.QLinearSoftmax", attrs=("axis", "opset"))
def _qlinear_softmax(im, node, ins, attrs):
    t = "QLinearSoftmax"
    if "opset" not in attrs:
        unsupported(f"{t}: attribute opset is required")
    opset = int(attrs["opset"])
    ins = _ins(ins, 5)
    x = _q8(im, ins[0], "X", t)
    dt = x.data_type
    xs = _scale(ins[1], "X_scale", t)
    _zp(ins[2], dt, "x_zero_point", t)  # cancels out in softmax (onnxruntime ignores it)
    ys, zy = _scale(ins[3], "y_scale", t), _zp(ins[4], dt, "y_zero_point", t)
    shape = list(x.shape)
    r = len(shape)
    axis = norm_axis(attrs.get("axis", 1 if opset < 13 else -1), r)
    b = im.b
    xv = x
    if opset < 13:  # the input as [N, D], D the size from axis on
        d = prod(shape[axis:])
        xv = b.reshape(x, [prod(shape[:axis]), d])
        axis = 1
    else:
        d = shape[axis]
    if not isinstance(d, int):
        unsupported(f"{t}: a dynamic softmax axis is not supported")
    table = _softmax_table(xs, d)
    xi = b.cast(xv, "int32")
    k = b.sub(b.reduce_max(xi, axes=[axis], keep_dimensions=True), xi)  # 0..255
    e = b.gather(b.constant(table), k, axis=0)
    s = b.reduce_sum(e, axes=[axis], keep_dimensions=True)
    y_mult = _f32(np.floor(_f32(1.0) / ys))
    q = b.round_even(b.div(b.mul(e, b.constant(np.array(y_mult, _f32))), s))
    # + y_zp, saturated (onnxruntime 1.32 saturates int8 too: measured; older kernels wrapped)
    lo, hi = _RANGE[dt]
    vq = b.clamp(b.add(q, b.constant(np.array(zy, _f32))), min_value=float(lo), max_value=float(hi))
    y = b.cast(vq, dt)
    return b.reshape(y, shape) if opset < 13 else y


# -- QGemm ---------------------------------------------------------------------------------------


@op("com.microsoft.QGemm", attrs=("alpha", "transA", "transB"))
def _qgemm(im, node, ins, attrs):
    """A, a_scale, a_zero_point, B, b_scale, b_zero_point, C (int32), y_scale, y_zero_point."""
    t = "QGemm"
    ins = _ins(ins, 9)
    if attrs.get("transA", 0):
        unsupported(f"{t}: attribute transA=1 is not supported")
    a = _q8(im, ins[0], "A", t)
    if len(a.shape) != 2:
        unsupported(f"{t}: A of rank {len(a.shape)} is not supported (2)")
    dt = a.data_type
    bb = Weight(im, ins[3], "B", t)
    if len(bb.shape) != 2:
        unsupported(f"{t}: B of rank {len(bb.shape)} is not supported (2)")
    b = im.b
    if attrs.get("transB", 0):
        if bb.operand is None:
            w = ins[3]
            bb = Weight(im, np.ascontiguousarray(w.T), "B", t)
        else:
            bb.operand = b.transpose(bb.operand, permutation=[1, 0])
            bb.shape = tuple(bb.operand.shape)
    N = bb.shape[1]
    sa, za = _scale(ins[1], "a_scale", t), _zp(ins[2], dt, "a_zero_point", t)
    sb = ins[4]
    if not isinstance(sb, np.ndarray) or sb.dtype != np.float32 or sb.size not in (1, N) or sb.ndim > 1:
        unsupported(f"{t}: input b_scale must be a float32 constant of one element or [N]")
    zb = ins[5]
    if zb is None or not isinstance(zb, np.ndarray) or zb.size not in (1, N) or zb.ndim > 1:
        unsupported(f"{t}: input b_zero_point must be a constant of one element or [N]")
    if zb.dtype.name != bb.data_type:
        unsupported(f"{t}: b_zero_point data type {zb.dtype.name} differs from B's {bb.data_type}")
    alpha = _f32(attrs.get("alpha", 1.0))
    with np.errstate(all="ignore"):
        scales = _f32(_f32(alpha * sa) * sb.reshape(-1))  # (alpha * a_scale) * b_scale[i]
    ys = ins[7]
    if ys is not None:
        ys = _scale(ys, "y_scale", t)
        zy = _zp(ins[8], dt, "y_zero_point", t)
        with np.errstate(all="ignore"):
            scales = _f32(scales / ys)
    scales = scales.reshape(()) if scales.size == 1 else scales
    zao = b.constant(np.array(za, _NP[dt]))
    zbo = X(im, col_param(im, zb.reshape(()) if zb.size == 1 else zb.reshape(-1), bb.shape, "b_zero_point", t))
    c = ins[6]
    if c is None and ys is not None:
        return integer_matmul(im, a, bb, zao, zbo, (X(im, scales), b.constant(np.array(zy, _NP[dt]))))
    acc = integer_matmul(im, a, bb, zao, zbo)  # int32
    if c is not None:
        c = X(im, c)
        if c.data_type != "int32":
            unsupported(f"{t}: C data type {c.data_type} is not supported (int32 is)")
        acc = b.add(acc, c)
    v = b.mul(b.cast(acc, "float32"), b.constant(scales))
    if ys is None:
        return v
    return _requant_float(im, v, zy, dt)
