"""Dynamic-range ("hybrid") TFLite operators: float activations, int8 weights with per-channel
scales, as `TFLiteConverter` writes them with `optimizations=[DEFAULT]` and no representative
dataset.

LiteRT runs them by quantizing the float input at run time, per row, to int8 (asymmetric: the
row's range, 0 included, over 255 steps, zero point nudged to an integer), multiplying in
integers and scaling back. That rounding is part of the result (about 1% of a value), so the
importer reproduces it: the input goes through the same quantize / dequantize (`fake_quantize`),
then a float convolution or matmul with the dequantized weights gives LiteRT's values to float
rounding (the integer sums are exact in float32 at these sizes). The rows are those of LiteRT's
default CPU path (ai-edge-litert 2.3, measured): the XNNPACK delegate takes FULLY_CONNECTED (each
row of its [batch, K] input) and 1x1 CONV_2D (each pixel's channels); it leaves larger
convolutions and DEPTHWISE_CONV_2D to LiteRT's own hybrid kernels, which quantize each batch
entry (the whole image) with the same parameters. XNNPACK's parameters
(xnn_f32_qd8_asymmetric_quantization_params): scale = 255 / (rmax - rmin), zero point from
the end with the smaller error, rounded half to even, as are the values.
"""

import numpy as np

HYBRID_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")


def quantized_weight(imp, op, k):
    """Input k of `op` as a float32 constant operand when it is an int8 / uint8 quantized constant
    (dequantized with its per-tensor or per-channel scales and zero points), else None."""
    if len(op.inputs) <= k or op.inputs[k] < 0:
        return None
    i = op.inputs[k]
    t = imp.tensor(i)
    if not imp.is_const(i) or t.scale is None or t.data_type not in ("int8", "uint8"):
        return None
    arr = imp.consts[i]
    shape = [1] * arr.ndim
    if t.scale.size > 1:
        shape[t.quantized_dimension] = -1
    deq = (arr.astype(np.float32) - t.zero_point.reshape(shape).astype(np.float32)) * t.scale.reshape(shape)
    return imp.b.constant(np.ascontiguousarray(deq, dtype=np.float16 if imp.float16 else np.float32))


def fake_quantize(b, x, axes):
    """x quantized to int8 per slice over `axes` as XNNPACK's dynamic quantization does, then
    dequantized: (q - zero_point) / scale."""
    dt = np.float16 if x.data_type == "float16" else np.float32

    def c(v):
        return b.constant(np.array(v, dt))

    zero = c(0)
    rmin = b.min(b.reduce_min(x, axes=axes, keep_dimensions=True), zero)
    rmax = b.max(b.reduce_max(x, axes=axes, keep_dimensions=True), zero)
    span = b.sub(rmax, rmin)
    scale = b.where(b.equal(span, zero), c(1), b.div(c(255), b.where(b.equal(span, zero), c(1), span)))
    rmin_s, rmax_s = b.mul(rmin, scale), b.mul(rmax, scale)
    from_min = b.greater(b.add(b.add(rmin_s, c(-128)), b.add(rmax_s, c(127))), zero)
    zp = b.where(from_min, b.sub(c(-128), rmin_s), b.sub(c(127), rmax_s))
    zp = b.round_even(b.clamp(zp, min_value=-128.0, max_value=127.0))
    q = b.clamp(b.add(b.round_even(b.mul(x, scale)), zp), min_value=-128.0, max_value=127.0)
    return b.div(b.sub(q, zp), scale)


def hybrid_inputs(imp, op, x, w_index):
    """(input, weight) for a float operator whose weight may be int8: the weight dequantized and the
    input fake-quantized over LiteRT's rows (module doc); (x, None) when the weight is float."""
    t = imp.tensor(op.inputs[0])
    if t.data_type not in ("float32", "float16") or t.scale is not None:
        return x, None  # a full-integer operator (quantized.py)
    w = quantized_weight(imp, op, w_index)
    if w is None:
        return x, None
    if op.name == "FULLY_CONNECTED" or op.name == "CONV_2D" and tuple(w.shape[1:3]) == (1, 1):
        axes = [x.rank - 1]  # XNNPACK: per row / pixel
    else:
        axes = list(range(1, x.rank))  # LiteRT's kernels: per batch entry
    return fake_quantize(imp.b, x, axes), w
