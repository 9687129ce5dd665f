"""ONNX QuantizeLinear / DequantizeLinear, bit-exact with the ONNX reference
(onnx.reference, and onnxruntime with graph optimisations off) for the integer types WebNN can
carry: uint8, int8, and uint16 / int16 (carried as uint32 / int32 operands, saturated into their
own range), plus int32 for DequantizeLinear. Per tensor, per axis and blocked (opset 21
block_size, a last partial block included).

QuantizeLinear divides in the `precision` type, by default the scale's type (the spec's rule): a
float16 quotient is rounded to float16 before it is rounded to an integer, as the reference does
(onnxruntime divides float16 / float16 in float32 unless precision=FLOAT says so; the reference
divides float32 x by a float16 scale in float32, onnxruntime and we in float16). Then it rounds
half to even, adds the zero point and saturates; NaN gives the range's minimum, as onnxruntime.
DequantizeLinear computes (x - zero point) * scale in float32 and rounds once to output_dtype.

Refused with UnsupportedError: int4 / uint4 / int2 / uint2, float8 / float4 and bfloat16 types
(WebNN has no such operand type here), and integer inputs of QuantizeLinear."""

import numpy as np
from onnx import TensorProto, helper

from ...dynamic.dims import Sym
from ..errors import unsupported
from ._helpers import norm_axis, prod, X
from ._registry import op

# Integer types each op handles -> (saturation range, WebNN type carrying it).
_QTYPES = {
    TensorProto.UINT8: ((0, 255), "uint8"),
    TensorProto.INT8: ((-128, 127), "int8"),
    TensorProto.UINT16: ((0, 65535), "uint32"),
    TensorProto.INT16: ((-32768, 32767), "int32"),
}
_FLOATS = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16", TensorProto.DOUBLE: "float32"}


def _name(t):
    return TensorProto.DataType.Name(t)


def _q_axis(attrs, scale, r):
    n = prod(scale.shape)
    if n == 1 or not r:
        return 0
    return norm_axis(attrs.get("axis", 1), r)


def _blocked(im, t, x_shape, axis, bs, where):
    """A blocked parameter (x's rank, ceil(n / block_size) along the axis) as WebNN's blockwise
    broadcast needs it: WebNN infers the block size as n / s, which is ONNX's block_size only when
    block_size divides n. Otherwise (a last, partial block) the parameter is repeated block_size
    times along the axis and cut to n, which is what the reference's np.repeat + take does."""
    if bs <= 0:
        unsupported(f"{where} block_size {bs} must be positive")
    n = x_shape[axis]
    if isinstance(n, Sym) or isinstance(t.shape[axis], Sym):
        unsupported(f"{where} blocked quantization along a dynamic dimension")
    want = list(x_shape)
    want[axis] = -(-n // bs)
    if list(t.shape) != want:
        unsupported(
            f"{where} blocked parameter shape {list(t.shape)} must be {want} (input shape "
            f"{list(x_shape)}, axis {axis}, block_size {bs})"
        )
    if want[axis] * bs == n:
        return X(im, t) if isinstance(t, np.ndarray) else t
    if isinstance(t, np.ndarray):
        return X(im, np.ascontiguousarray(np.repeat(t, bs, axis=axis).take(range(n), axis=axis)))
    if any(isinstance(d, Sym) for d in x_shape):
        unsupported(f"{where} a computed blocked parameter with a partial last block and dynamic input dimensions")
    b = im.b
    s = want[axis]
    wide = want[: axis + 1] + [1] + want[axis + 1 :]
    e = b.expand(b.reshape(t, wide), wide[: axis + 1] + [bs] + wide[axis + 2 :])
    full = list(want)
    full[axis] = s * bs
    e = b.reshape(e, full)
    return b.slice(e, [0] * len(full), list(x_shape))


def _q_param(im, p, x, axis, block_size, where):
    """Scale / zero point shaped to broadcast against x (per tensor, per axis or blocked)."""
    r = len(x.shape)
    if len(p.shape) == 0 or prod(p.shape) == 1:
        return im.b.reshape(X(im, p), [1] * r)  # rank r (a scalar for a scalar x)
    if not block_size:
        if len(p.shape) != 1:
            unsupported(f"{where} a per-axis parameter must be 1-D, got shape {list(p.shape)} (or set block_size)")
        shp = [1] * r
        shp[axis] = p.shape[0]
        return im.b.reshape(X(im, p), shp)
    return _blocked(im, p, x.shape, axis, block_size, where)


def _float_type(im, v, name, where, what):
    t = im.onnx_type(v, name)
    if t not in _FLOATS:
        unsupported(f"{where} {what} type {_name(t)} (supported: float32, float16)")
    return t


def _as(im, v, data_type):
    """v as an operand of a WebNN float type (host constants converted on the host)."""
    if isinstance(v, np.ndarray):
        return X(im, v.astype(data_type))
    return v if v.data_type == data_type else im.b.cast(v, data_type)


@op("QuantizeLinear", attrs=("axis", "saturate", "block_size", "output_dtype", "precision"))
def _quantize(im, node, ins, attrs):
    where = "QuantizeLinear:"
    xt = im.onnx_type(ins[0], node.input[0])
    if xt not in _FLOATS:
        unsupported(f"{where} input type {_name(xt)} (supported: float32, float16)")
    st = _float_type(im, ins[1], node.input[1], where, "scale")
    zp = ins[2] if len(ins) > 2 else None
    od = attrs.get("output_dtype", 0)
    if zp is not None:
        zt = im.onnx_type(zp, node.input[2])
        if od and od != zt:
            unsupported(f"{where} output_dtype {_name(od)} differs from the zero point type {_name(zt)}")
        od = zt
    od = od or TensorProto.UINT8
    if od not in _QTYPES:
        unsupported(f"{where} output type {_name(od)} (supported: uint8, int8, uint16, int16)")
    (lo, hi), carry = _QTYPES[od]
    # `saturate` only applies to float8 outputs (integers always saturate): nothing to do.
    # The division's type: `precision` (opset 23), else the scale's type, as the spec says (and
    # onnxruntime does). Before opset 23 x and the scale share one type. (The reference divides
    # in numpy's promotion of the two types: the same except for float32 x with a float16 scale.)
    prec = attrs.get("precision", 0)
    if prec:
        if prec not in _FLOATS:
            unsupported(f"{where} precision {_name(prec)} (supported: float32, float16)")
        pt = _FLOATS[prec]
    else:
        pt = _FLOATS[st]
    x = _as(im, X(im, ins[0]), pt)
    axis = _q_axis(attrs, ins[1], len(x.shape))
    bs = attrs.get("block_size", 0)
    scale = _q_param(im, _host_as(ins[1], pt), x, axis, bs, where)
    scale = _as(im, scale, pt)
    if zp is None:
        zp = np.zeros(ins[1].shape, dtype=helper.tensor_dtype_to_np_dtype(od))
    zpo = _q_param(im, zp, x, axis, bs, where)
    return im.b.quantize_linear(
        x, scale, zpo, _saturate=(lo, hi) if carry.endswith("32") else None, _half_quotient=pt == "float16"
    )


def _host_as(v, data_type):
    return v.astype(data_type) if isinstance(v, np.ndarray) else v


@op("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"))
def _dequantize(im, node, ins, attrs):
    where = "DequantizeLinear:"
    xt = im.onnx_type(ins[0], node.input[0])
    if xt not in _QTYPES and xt != TensorProto.INT32:
        unsupported(f"{where} input type {_name(xt)} (supported: uint8, int8, uint16, int16, int32)")
    st = _float_type(im, ins[1], node.input[1], where, "scale")
    ot = attrs.get("output_dtype", 0) or st
    if ot not in _FLOATS:
        unsupported(f"{where} output_dtype {_name(ot)} (supported: float32, float16)")
    x = X(im, ins[0])
    axis = _q_axis(attrs, ins[1], len(x.shape))
    bs = attrs.get("block_size", 0)
    zp = ins[2] if len(ins) > 2 else None
    if zp is not None and im.onnx_type(zp, node.input[2]) != xt:
        unsupported(
            f"{where} zero point type {_name(im.onnx_type(zp, node.input[2]))} differs from the input type {_name(xt)}"
        )
    if zp is None:
        zp = np.zeros(ins[1].shape, dtype=np.dtype(x.data_type))
    zpo = _q_param(im, zp, x, axis, bs, where)
    # The reference computes (x - zero point) * scale in float32 and rounds once to the output
    # type: a float16 scale with a float32 output is widened first (exactly), a float32 scale with
    # a float16 output is rounded after.
    scale = ins[1]
    if _FLOATS[ot] == "float32":
        scale = _host_as(scale, "float32")
    scale = _q_param(im, scale, x, axis, bs, where)
    if _FLOATS[ot] == "float32":
        scale = _as(im, scale, "float32")
    y = im.b.dequantize_linear(x, scale, zpo)
    return _as(im, y, _FLOATS[ot])
