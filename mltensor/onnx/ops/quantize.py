"""ONNX QuantizeLinear / DequantizeLinear."""

import numpy as np
from onnx import TensorProto, helper

from ..importer import WEBNN_TYPE
from . import norm_axis, op, prod, to_float, unsupported, X

# -- quantization ---------------------------------------------------------------------------------


def _q_axis(attrs, scale, r):
    n = prod(scale.shape)
    if n == 1 or not r:
        return 0
    return norm_axis(attrs.get("axis", 1), r)


def _q_param(im, p, x, axis, block_size):
    """Scale / zero point shaped to broadcast against x (per tensor, per axis or blocked)."""
    r = len(x.shape)
    t = X(im, p)
    if len(t.shape) == 0 or prod(t.shape) == 1:
        return im.b.reshape(t, [1] * r) if r else t
    if len(t.shape) == 1 and not block_size:
        shp = [1] * r
        shp[axis] = t.shape[0]
        return im.b.reshape(t, shp)
    return t  # blocked: the parameter has x's rank and WebNN broadcasts it blockwise


def _q_inputs(im, ins, attrs):
    """(x, axis, block size, scale operand) of QuantizeLinear / DequantizeLinear."""
    x = X(im, ins[0])
    axis = _q_axis(attrs, ins[1], len(x.shape))
    bs = attrs.get("block_size", 0)
    return x, axis, bs, _q_param(im, ins[1], x, axis, bs)


@op("QuantizeLinear", attrs=("axis", "saturate", "block_size", "output_dtype", "precision"))
def _quantize(im, node, ins, attrs):
    x, axis, bs, scale = _q_inputs(im, ins, attrs)
    zp = ins[2] if len(ins) > 2 else None
    if zp is None:
        od = attrs.get("output_dtype", 0) or TensorProto.UINT8
        if od not in (TensorProto.UINT8, TensorProto.INT8):
            unsupported(f"output type {TensorProto.DataType.Name(od)}")
        zp = np.zeros(ins[1].shape if isinstance(ins[1], np.ndarray) else scale.shape,
                      dtype=helper.tensor_dtype_to_np_dtype(od))
    zdt = zp.dtype if isinstance(zp, np.ndarray) else np.dtype(
        helper.tensor_dtype_to_np_dtype(im.onnx_type(zp, node.input[2])))
    if zdt not in (np.uint8, np.int8):
        if zdt not in (np.int16, np.uint16, np.int32, np.uint32) or bs:
            unsupported(f"zero point type {zdt}")
        # wider integer types: round(x / scale) + zero point, saturated, in float32
        b = im.b
        info = np.iinfo(zdt)
        zf = b.cast(_q_param(im, zp, x, axis, bs), "float32")
        q = b.add(b.round_even(b.div(to_float(im, x), to_float(im, scale))), zf)
        q = b.clamp(q, min_value=float(info.min), max_value=float(info.max))
        return b.cast(q, WEBNN_TYPE[helper.np_dtype_to_tensor_dtype(zdt)])
    zpo = _q_param(im, zp, x, axis, bs)
    return im.b.quantize_linear(x, scale, zpo)


@op("DequantizeLinear", attrs=("axis", "block_size", "output_dtype"))
def _dequantize(im, node, ins, attrs):
    x, axis, bs, scale = _q_inputs(im, ins, attrs)
    zp = ins[2] if len(ins) > 2 else None
    if zp is None:
        zp = np.zeros(ins[1].shape if isinstance(ins[1], np.ndarray) else scale.shape,
                      dtype=np.dtype(x.data_type))
    zpo = _q_param(im, zp, x, axis, bs)
    return im.b.dequantize_linear(x, scale, zpo)
