"""onnxruntime's quantized recurrent operator (com.microsoft): DynamicQuantizeLSTM, what
`onnxruntime.quantization.quantize_dynamic` writes for every LSTM.

Its weights are int8 (or uint8) constants, W [directions, input, 4 * hidden] and R [directions,
hidden, 4 * hidden] (transposed from LSTM's), gates in ONNX's i, o, f, c order, with a scale per
direction or per direction and column, and one zero point per direction (onnxruntime reads the
first: zero for int8, a constant for uint8). The products are computed the way onnxruntime's CPU
kernel computes them (core/providers/cpu/rnn/uni_directional_lstm.cc, rnn_helpers.cc
ComputeGemm): X, all its steps at once, is quantized to uint8 with DynamicQuantizeLinear's range
rule, multiplied by W exactly in int32 and scaled by x_scale * w_scale; at every step the hidden
state, the whole batch together, is quantized the same way and its product by R, scaled by
h_scale * r_scale, added; then (Wb + Rb), the gates and the cell as LSTM. The steps are unrolled
into the graph.

onnxruntime quantizes the hidden state over the whole batch when its LSTM does not split the
batch across threads; with a batch of 2 or more and several intra-op threads it quantizes groups
of rows separately (batch_parallel_), so its own results then depend on its thread count: tests
compare with intra_op_num_threads=1. Activations run in float32 on the GPU where onnxruntime uses
MLAS' approximations: a hidden value landing within an ulp of a rounding boundary may quantize
one step apart, the differences the tests bound."""

import numpy as np

from ..errors import unsupported
from ._helpers import X, const
from ._registry import op
from .integer import Weight, dynamic_quantize, integer_matmul
from .rnn import ACTIVATIONS

_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "input_forget")


def _weights(im, v, what, dirs, k, n):
    w = const(im, v, f"DynamicQuantizeLSTM {what} (quantized weights must be initializers)")
    if w.dtype not in (np.int8, np.uint8) or w.shape != (dirs, k, n):
        unsupported(
            f"DynamicQuantizeLSTM {what} of type {w.dtype} and shape {list(w.shape)} ({dirs}, {k}, {n} int8 or uint8 expected)"
        )
    return w


def _params(im, scale, zp, dirs, n, wtype, what):
    """Per direction: (scales [1] or [n] float32, zero point scalar of the weights' type)."""
    s = const(im, scale, f"DynamicQuantizeLSTM {what}_scale")
    z = const(im, zp, f"DynamicQuantizeLSTM {what}_zero_point")
    if s.dtype != np.float32 or s.shape not in ((dirs,), (dirs, n)):
        unsupported(
            f"DynamicQuantizeLSTM {what}_scale of type {s.dtype} and shape {list(s.shape)} ([{dirs}] or [{dirs}, {n}] float32 expected)"
        )
    if z.dtype != wtype or z.shape != s.shape:
        unsupported(
            f"DynamicQuantizeLSTM {what}_zero_point of type {z.dtype} and shape {list(z.shape)} (as its scale, {wtype} expected)"
        )
    s, z = s.reshape(dirs, -1), z.reshape(dirs, -1)
    if np.any(z != z[:, :1]):
        # (onnxruntime refuses these too: it multiplies by one zero point a direction)
        unsupported(f"DynamicQuantizeLSTM {what}_zero_point differs across columns")
    return [(s[d], z[d, 0]) for d in range(dirs)]


def _product(im, q, scale, zq, w, sw, zw):
    """float32 (q - zq) x (w - zw) * (scale * sw): the exact int32 product, then onnxruntime's
    output processor (multiplier a_scale * b_scale, per column where sw is)."""
    b = im.b
    mult = b.mul(scale, X(im, sw)) if sw.size > 1 else b.mul(scale, X(im, sw.reshape(())))
    zq_op = zq
    zw_op = X(im, np.asarray(zw).reshape(()))
    return integer_matmul(
        im,
        q,
        Weight(im, w, "W", "DynamicQuantizeLSTM"),
        zq_op,
        zw_op,
        post=lambda acc: b.mul(b.cast(acc, "float32"), mult),
    )


@op("com.microsoft.DynamicQuantizeLSTM", attrs=_ATTRS)
def _dynamic_quantize_lstm(im, node, ins, attrs):
    t = "DynamicQuantizeLSTM"
    ins = list(ins) + [None] * (12 - len(ins))
    if any(ins[k] is None for k in (8, 9, 10, 11)):
        im.malformed("DynamicQuantizeLSTM needs W_scale, W_zero_point, R_scale and R_zero_point")
    if attrs.get("input_forget", 0):
        unsupported("input_forget=1")
    if attrs.get("activation_alpha") or attrs.get("activation_beta"):
        unsupported("activation_alpha/beta")
    if attrs.get("clip") is not None:
        unsupported("clip")
    if ins[7] is not None:
        unsupported("peephole weights P")
    b = im.b
    x = X(im, ins[0])
    if x.data_type != "float32" or len(x.shape) != 3 or not all(isinstance(d, int) for d in x.shape):
        unsupported(
            f"{t}: X of type {x.data_type} and shape {list(x.shape)} (float32 [seq, batch, input] of static sizes)"
        )
    steps, batch, k = x.shape
    direction = attrs.get("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    w0 = const(im, ins[1], f"{t} W (quantized weights must be initializers)")
    hidden = int(attrs.get("hidden_size") or w0.shape[-1] // 4)
    n = 4 * hidden
    w = _weights(im, w0, "W", dirs, k, n)
    r = _weights(im, ins[2], "R", dirs, hidden, n)
    if r.dtype != w.dtype:
        unsupported(f"{t}: W of type {w.dtype} and R of type {r.dtype}")
    wq = _params(im, ins[8], ins[9], dirs, n, w.dtype, "W")
    rq = _params(im, ins[10], ins[11], dirs, n, r.dtype, "R")
    if ins[4] is not None:
        sl = const(im, ins[4], "sequence_lens")
        if not np.all(sl == steps):
            unsupported("sequence_lens shorter than the sequence")
    acts = attrs.get("activations") or ["Sigmoid", "Tanh", "Tanh"] * dirs
    if len(acts) != 3 * dirs or any(a not in ACTIVATIONS for a in acts):
        unsupported(f"activations {acts}")
    bias = None
    if ins[3] is not None:
        bias = const(im, ins[3], f"{t} B")
        if bias.dtype != np.float32 or bias.shape != (dirs, 2 * n):
            unsupported(f"{t}: B of type {bias.dtype} and shape {list(bias.shape)}")
        bias = bias[:, :n] + bias[:, n:]  # Wb + Rb, summed first as onnxruntime does

    def state(v, what):
        if v is None:
            return None
        s = X(im, v)
        if s.data_type != "float32" or tuple(s.shape) != (dirs, batch, hidden):
            unsupported(f"{t}: {what} of type {s.data_type} and shape {list(s.shape)}")
        return [b.reshape(b.slice(s, [d, 0, 0], [1, batch, hidden]), [batch, hidden]) for d in range(dirs)]

    h0, c0 = state(ins[5], "initial_h"), state(ins[6], "initial_c")
    # X quantized once, every step together (the same for both directions)
    qx, sx, zx = dynamic_quantize(im, b.reshape(x, [steps * batch, k]), t)
    ys, hs, cs = [], [], []
    for d in range(dirs):
        f_act, g_act, h_act = (getattr(b, ACTIVATIONS[a]) for a in acts[3 * d : 3 * d + 3])
        xw = b.reshape(_product(im, qx, sx, zx, w[d], *wq[d]), [steps, batch, n])
        h = None if h0 is None else h0[d]
        c = None if c0 is None else c0[d]
        back = direction == "reverse" or d == 1
        outs = [None] * steps
        for s in range(steps - 1, -1, -1) if back else range(steps):
            g = b.reshape(b.slice(xw, [s, 0, 0], [1, batch, n]), [batch, n])
            if h is not None:  # (a zero state quantizes to zeros: its product adds nothing)
                qh, sh, zh = dynamic_quantize(im, h, t)
                g = b.add(g, _product(im, qh, sh, zh, r[d], *rq[d]))
            if bias is not None:
                g = b.add(g, X(im, bias[d]))
            gi, go, gf, gc = b.split(g, 4, axis=1)
            i_t, o_t, f_t, c_t = f_act(gi), f_act(go), f_act(gf), g_act(gc)
            c = b.mul(i_t, c_t) if c is None else b.add(b.mul(f_t, c), b.mul(i_t, c_t))
            h = b.mul(o_t, h_act(c))
            outs[s] = b.reshape(h, [1, 1, batch, hidden])
        ys.append(b.concat(outs, 0) if steps > 1 else outs[0])
        hs.append(b.reshape(h, [1, batch, hidden]))
        cs.append(b.reshape(c, [1, batch, hidden]))
    y = b.concat(ys, 1) if dirs > 1 else ys[0]
    yh = b.concat(hs, 0) if dirs > 1 else hs[0]
    yc = b.concat(cs, 0) if dirs > 1 else cs[0]
    return [y, yh, yc]
