"""ONNX recurrent operators: LSTM, GRU, RNN."""

import numpy as np

from ..errors import unsupported
from ._helpers import const, X
from ._registry import op

# -- recurrent --------------------------------------------------------------------------------------

_DIRECTION = {"forward": "forward", "reverse": "backward", "bidirectional": "both"}
ACTIVATIONS = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu"}  # ONNX name -> builder method


def _rnn_common(im, node, ins, attrs, gates):
    if "clip" in attrs:
        unsupported("clip is not supported")
    x = X(im, ins[0])
    if attrs.get("layout", 0):  # batch-first: [batch, seq, in] -> [seq, batch, in]
        x = im.b.transpose(x, permutation=[1, 0, 2])
    steps = x.shape[0]
    if len(ins) > 4 and ins[4] is not None:
        sl = const(im, ins[4], "sequence_lens")
        if not np.all(sl == steps):
            unsupported("sequence_lens shorter than the sequence")
    hidden = attrs.get("hidden_size") or ins[2].shape[-1]
    direction = _DIRECTION[attrs.get("direction", "forward")]
    acts = attrs.get("activations")
    kw = {"direction": direction}
    if acts is not None:
        n = len(acts) // (2 if direction == "both" else 1)
        if direction == "both" and acts[:n] != acts[n:]:
            unsupported("different activations per direction")
        if any(a not in ACTIVATIONS for a in acts):
            unsupported(f"activations {acts}")
        kw["activations"] = [ACTIVATIONS[a] for a in acts[:n]]
    if attrs.get("activation_alpha") or attrs.get("activation_beta"):
        unsupported("activation_alpha/beta")
    w = X(im, ins[1], x)
    r = X(im, ins[2], x)
    if len(ins) > 3 and ins[3] is not None:
        bias = X(im, ins[3], x)
        wb, rb = im.b.split(bias, 2, axis=1)
        kw["bias"], kw["recurrent_bias"] = wb, rb
    if len(ins) > 5 and ins[5] is not None:
        kw["initial_hidden_state"] = _state_in(im, X(im, ins[5], x), attrs)
    kw["return_sequence"] = bool(node.output and node.output[0])
    return x, w, r, steps, hidden, kw


def _state_in(im, s, attrs):
    return im.b.transpose(s, permutation=[1, 0, 2]) if attrs.get("layout", 0) else s


def _rnn_outs(im, attrs, y, states):
    """WebNN [steps, dirs, batch, hidden] / [dirs, batch, hidden] to ONNX layout=1 if asked."""
    if not attrs.get("layout", 0):
        return [y] + states
    b = im.b
    y = b.transpose(y, permutation=[2, 0, 1, 3]) if y is not None else None
    return [y] + [b.transpose(s, permutation=[1, 0, 2]) for s in states]


@op(
    "LSTM",
    attrs=(
        "activation_alpha",
        "activation_beta",
        "activations",
        "clip",
        "direction",
        "hidden_size",
        "input_forget",
        "layout",
    ),
)
def _lstm(im, node, ins, attrs):
    if attrs.get("input_forget", 0):
        unsupported("input_forget=1")
    x, w, r, steps, hidden, kw = _rnn_common(im, node, ins, attrs, 4)
    if len(ins) > 6 and ins[6] is not None:
        kw["initial_cell_state"] = _state_in(im, X(im, ins[6], x), attrs)
    if len(ins) > 7 and ins[7] is not None:
        kw["peephole_weight"] = X(im, ins[7], x)
    if "activations" in kw and len(kw["activations"]) != 3:
        unsupported("activations")
    outs = im.b.lstm(x, w, r, steps, hidden, **kw)
    # WebNN: [hidden state, cell state, sequence?]; ONNX: [Y, Y_h, Y_c]
    h, c = outs[0], outs[1]
    y = outs[2] if kw["return_sequence"] else None
    return _rnn_outs(im, attrs, y, [h, c])


@op(
    "GRU",
    attrs=(
        "activation_alpha",
        "activation_beta",
        "activations",
        "clip",
        "direction",
        "hidden_size",
        "layout",
        "linear_before_reset",
    ),
)
def _gru(im, node, ins, attrs):
    x, w, r, steps, hidden, kw = _rnn_common(im, node, ins, attrs, 3)
    if attrs.get("linear_before_reset", 0):
        kw["reset_after"] = True
    else:
        kw["reset_after"] = False
    if "activations" in kw and len(kw["activations"]) != 2:
        unsupported("activations")
    outs = im.b.gru(x, w, r, steps, hidden, **kw)
    h = outs[0]
    y = outs[1] if kw["return_sequence"] else None
    return _rnn_outs(im, attrs, y, [h])


@op("RNN", attrs=("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout"))
def _rnn(im, node, ins, attrs):
    """Simple RNN, unrolled: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    if "clip" in attrs:
        unsupported("clip")
    x = X(im, ins[0])
    if attrs.get("layout", 0):
        x = im.b.transpose(x, permutation=[1, 0, 2])
    steps, batch, _ = x.shape
    w, r = X(im, ins[1], x), X(im, ins[2], x)
    nd, hidden = w.shape[0], w.shape[1]
    direction = attrs.get("direction", "forward")
    acts = attrs.get("activations") or ["Tanh"] * nd
    if any(a not in ACTIVATIONS for a in acts) or attrs.get("activation_alpha"):
        unsupported(f"activations {acts}")
    if len(ins) > 4 and ins[4] is not None and not np.all(const(im, ins[4], "sequence_lens") == steps):
        unsupported("sequence_lens shorter than the sequence")
    b = im.b
    ys, hs = [], []
    for dnum in range(nd):
        wd = b.reshape(b.slice(w, [dnum, 0, 0], [1] + list(w.shape[1:])), list(w.shape[1:]))
        rd = b.reshape(b.slice(r, [dnum, 0, 0], [1] + list(r.shape[1:])), list(r.shape[1:]))
        bias = None
        if len(ins) > 3 and ins[3] is not None:
            bb = X(im, ins[3], x)
            bd = b.reshape(b.slice(bb, [dnum, 0], [1, 2 * hidden]), [2 * hidden])
            wb, rb = b.split(bd, 2, axis=0)
            bias = b.add(wb, rb)
        if len(ins) > 5 and ins[5] is not None:
            h0 = _state_in(im, X(im, ins[5], x), attrs)
            h = b.reshape(b.slice(h0, [dnum, 0, 0], [1, batch, hidden]), [batch, hidden])
        else:
            h = None
        act = getattr(b, ACTIVATIONS[acts[dnum]])
        back = direction == "reverse" or (direction == "bidirectional" and dnum == 1)
        order = range(steps - 1, -1, -1) if back else range(steps)
        outs = [None] * steps
        for t in order:
            xt = b.reshape(b.slice(x, [t, 0, 0], [1, batch, x.shape[2]]), [batch, x.shape[2]])
            g = b.gemm(xt, wd, b_transpose=True, **({"c": bias} if bias is not None else {}))
            if h is not None:
                g = b.add(g, b.gemm(h, rd, b_transpose=True))
            h = act(g)
            outs[t] = b.reshape(h, [1, 1, batch, hidden])
        ys.append(b.concat(outs, 0) if steps > 1 else outs[0])
        hs.append(b.reshape(h, [1, batch, hidden]))
    y = b.concat(ys, 1) if nd > 1 else ys[0]
    yh = b.concat(hs, 0) if nd > 1 else hs[0]
    return _rnn_outs(im, attrs, y, [yh])
