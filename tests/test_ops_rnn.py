"""gru, gru_cell, lstm, lstm_cell against numpy references that follow the WebNN spec's
emulation code: 16 steps, batch 3, all directions, with and without initial states."""

import numpy as np
import pytest
from helpers import run_graph

import mltensor

ACT = {
    "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)),
    "tanh": np.tanh,
    "relu": lambda v: np.maximum(v, 0.0),
}
T, B, I, H = 16, 3, 4, 5


def _gates(v, layout, hs):
    return {k: v[..., j * hs : (j + 1) * hs] for j, k in enumerate(layout)}


def ref_gru_cell(x, W, R, h, hs, b=None, rb=None, reset_after=True, layout="zrn", acts=("sigmoid", "tanh")):
    f, g = ACT[acts[0]], ACT[acts[1]]
    b = np.zeros(3 * hs) if b is None else b
    rb = np.zeros(3 * hs) if rb is None else rb
    gx = _gates(x @ W.T + b, layout, hs)
    Wr = _gates(R.T, layout, hs)  # per gate [hs_in, hs]
    rbg = _gates(rb, layout, hs)
    z = f(gx["z"] + h @ Wr["z"] + rbg["z"])
    r = f(gx["r"] + h @ Wr["r"] + rbg["r"])
    if reset_after:
        n = g(gx["n"] + r * (h @ Wr["n"] + rbg["n"]))
    else:
        n = g(gx["n"] + (r * h) @ Wr["n"] + rbg["n"])
    return z * h + (1 - z) * n


def ref_lstm_cell(x, W, R, h, c, hs, b=None, rb=None, p=None, layout="iofg", acts=("sigmoid", "tanh", "tanh")):
    f, g, hh = (ACT[a] for a in acts)
    b = np.zeros(4 * hs) if b is None else b
    rb = np.zeros(4 * hs) if rb is None else rb
    p = np.zeros(3 * hs) if p is None else p
    gt = _gates(x @ W.T + b + h @ R.T + rb, layout, hs)
    pi, po, pf = p[:hs], p[hs : 2 * hs], p[2 * hs :]
    i = f(gt["i"] + c * pi)
    fg = f(gt["f"] + c * pf)
    cg = g(gt["g"])
    o = f(gt["o"] + c * po)  # the spec's emulation: peephole on the incoming cell state
    c2 = fg * c + i * cg
    return o * hh(c2), c2


def ref_rnn(kind, x, W, R, hs, direction, b=None, rb=None, p=None, h0=None, c0=None, **kw):
    nd = 2 if direction == "both" else 1
    steps, batch = x.shape[:2]
    hs_out, cs_out, seqs = [], [], []
    for d in range(nd):
        backward = direction == "backward" or d == 1
        h = np.zeros((batch, hs)) if h0 is None else h0[d]
        c = np.zeros((batch, hs)) if c0 is None else c0[d]
        seq = [None] * steps
        for s in range(steps):
            t = steps - 1 - s if backward else s
            if kind == "gru":
                h = ref_gru_cell(
                    x[t], W[d], R[d], h, hs, None if b is None else b[d], None if rb is None else rb[d], **kw
                )
            else:
                h, c = ref_lstm_cell(
                    x[t],
                    W[d],
                    R[d],
                    h,
                    c,
                    hs,
                    None if b is None else b[d],
                    None if rb is None else rb[d],
                    None if p is None else p[d],
                    **kw,
                )
            seq[t] = h
        hs_out.append(h)
        cs_out.append(c)
        seqs.append(np.stack(seq))
    return np.stack(hs_out), np.stack(cs_out), np.stack(seqs, axis=1)


def _check(got, want, tol=1e-4):
    assert got.shape == want.shape
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=tol, atol=tol)


def _arrays(rng, kind, nd, init):
    G = 3 if kind == "gru" else 4
    a = {
        "x": rng.standard_normal((T, B, I)),
        "W": rng.standard_normal((nd, G * H, I)) * 0.5,
        "R": rng.standard_normal((nd, G * H, H)) * 0.5,
        "b": rng.standard_normal((nd, G * H)) * 0.3,
        "rb": rng.standard_normal((nd, G * H)) * 0.3,
    }
    if kind == "lstm":
        a["p"] = rng.standard_normal((nd, 3 * H)) * 0.3
    if init:
        a["h0"] = rng.standard_normal((nd, B, H)) * 0.5
        if kind == "lstm":
            a["c0"] = rng.standard_normal((nd, B, H)) * 0.5
    return {k: v.astype(np.float32) for k, v in a.items()}


@pytest.mark.parametrize("direction", ["forward", "backward", "both"])
@pytest.mark.parametrize("init", [False, True])
def test_gru(ctx, rng, direction, init):
    nd = 2 if direction == "both" else 1
    a = _arrays(rng, "gru", nd, init)
    b = mltensor.MLGraphBuilder(ctx)
    ins = {k: b.input(k, data_type="float32", shape=v.shape) for k, v in a.items()}
    outs = b.gru(
        ins["x"],
        ins["W"],
        ins["R"],
        T,
        H,
        bias=ins["b"],
        recurrent_bias=ins["rb"],
        initial_hidden_state=ins.get("h0"),
        return_sequence=True,
        direction=direction,
    )
    assert [o.shape for o in outs] == [(nd, B, H), (T, nd, B, H)]
    res = run_graph(ctx, {"h": outs[0], "seq": outs[1]}, a, b)
    h, _, seq = ref_rnn("gru", a["x"], a["W"], a["R"], H, direction, a["b"], a["rb"], h0=a.get("h0"))
    _check(res["h"], h)
    _check(res["seq"], seq)


@pytest.mark.parametrize("direction", ["forward", "backward", "both"])
@pytest.mark.parametrize("init", [False, True])
def test_lstm(ctx, rng, direction, init):
    nd = 2 if direction == "both" else 1
    a = _arrays(rng, "lstm", nd, init)
    b = mltensor.MLGraphBuilder(ctx)
    ins = {k: b.input(k, data_type="float32", shape=v.shape) for k, v in a.items()}
    outs = b.lstm(
        ins["x"],
        ins["W"],
        ins["R"],
        T,
        H,
        bias=ins["b"],
        recurrent_bias=ins["rb"],
        peephole_weight=ins["p"],
        initial_hidden_state=ins.get("h0"),
        initial_cell_state=ins.get("c0"),
        return_sequence=True,
        direction=direction,
    )
    assert [o.shape for o in outs] == [(nd, B, H), (nd, B, H), (T, nd, B, H)]
    res = run_graph(ctx, {"h": outs[0], "c": outs[1], "seq": outs[2]}, a, b)
    h, c, seq = ref_rnn(
        "lstm", a["x"], a["W"], a["R"], H, direction, a["b"], a["rb"], a["p"], h0=a.get("h0"), c0=a.get("c0")
    )
    _check(res["h"], h)
    _check(res["c"], c)
    _check(res["seq"], seq)


@pytest.mark.parametrize("reset_after", [True, False])
@pytest.mark.parametrize("layout", ["zrn", "rzn"])
def test_gru_options(ctx, rng, reset_after, layout):
    # no biases, custom activations, no return_sequence, a short sequence
    steps = 3
    a = _arrays(rng, "gru", 1, True)
    a["x"] = a["x"][:steps].copy()
    del a["b"], a["rb"]
    acts = ("sigmoid", "relu")
    b = mltensor.MLGraphBuilder(ctx)
    ins = {k: b.input(k, data_type="float32", shape=v.shape) for k, v in a.items()}
    outs = b.gru(
        ins["x"],
        ins["W"],
        ins["R"],
        steps,
        H,
        initial_hidden_state=ins["h0"],
        reset_after=reset_after,
        layout=layout,
        activations=acts,
    )
    assert len(outs) == 1
    res = run_graph(ctx, {"h": outs[0]}, a, b)
    h, _, _ = ref_rnn(
        "gru", a["x"], a["W"], a["R"], H, "forward", h0=a["h0"], reset_after=reset_after, layout=layout, acts=acts
    )
    _check(res["h"], h)


@pytest.mark.parametrize("layout", ["iofg", "ifgo"])
def test_lstm_cell_layouts(ctx, rng, layout):
    a = {
        "x": rng.standard_normal((B, I)),
        "W": rng.standard_normal((4 * H, I)),
        "R": rng.standard_normal((4 * H, H)),
        "h": rng.standard_normal((B, H)),
        "c": rng.standard_normal((B, H)),
        "b": rng.standard_normal(4 * H),
        "rb": rng.standard_normal(4 * H),
        "p": rng.standard_normal(3 * H),
    }
    a = {k: v.astype(np.float32) for k, v in a.items()}
    acts = ("sigmoid", "relu", "tanh")
    b = mltensor.MLGraphBuilder(ctx)
    ins = {k: b.input(k, data_type="float32", shape=v.shape) for k, v in a.items()}
    h, c = b.lstm_cell(
        ins["x"],
        ins["W"],
        ins["R"],
        ins["h"],
        ins["c"],
        H,
        bias=ins["b"],
        recurrent_bias=ins["rb"],
        peephole_weight=ins["p"],
        layout=layout,
        activations=acts,
    )
    res = run_graph(ctx, {"h": h, "c": c}, a, b)
    wh, wc = ref_lstm_cell(a["x"], a["W"], a["R"], a["h"], a["c"], H, a["b"], a["rb"], a["p"], layout, acts)
    _check(res["h"], wh)
    _check(res["c"], wc)


def test_gru_cell_float16(ctx, rng):
    a = {
        "x": rng.standard_normal((B, I)),
        "W": rng.standard_normal((3 * H, I)) * 0.5,
        "R": rng.standard_normal((3 * H, H)) * 0.5,
        "h": rng.standard_normal((B, H)),
        "b": rng.standard_normal(3 * H) * 0.3,
    }
    a = {k: v.astype(np.float16) for k, v in a.items()}
    b = mltensor.MLGraphBuilder(ctx)
    ins = {k: b.input(k, data_type="float16", shape=v.shape) for k, v in a.items()}
    y = b.gru_cell(ins["x"], ins["W"], ins["R"], ins["h"], H, bias=ins["b"], layout="rzn")
    assert y.shape == (B, H) and y.data_type == "float16"
    got = run_graph(ctx, {"y": y}, a, b)["y"]
    f = {k: v.astype(np.float32) for k, v in a.items()}
    want = ref_gru_cell(f["x"], f["W"], f["R"], f["h"], H, f["b"], layout="rzn")
    assert got.shape == want.shape and got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-3, atol=2e-3)


def test_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[T, B, I])
    W = b.input("W", data_type="float32", shape=[1, 3 * H, I])
    R = b.input("R", data_type="float32", shape=[1, 3 * H, H])
    with pytest.raises(TypeError, match="steps"):
        b.gru(x, W, R, T + 1, H)
    with pytest.raises(TypeError, match="weight"):
        b.gru(x, W, R, T, H, direction="both")
    with pytest.raises(TypeError, match="layout"):
        b.gru(x, W, R, T, H, layout="nzr")
    with pytest.raises(TypeError, match="activations"):
        b.gru(x, W, R, T, H, activations=["sigmoid"])
    with pytest.raises(TypeError, match="activations"):
        b.gru(x, W, R, T, H, activations=["sigmoid", "gelu"])
    with pytest.raises(TypeError, match="bias"):
        b.gru(x, W, R, T, H, bias=b.input("bb", data_type="float32", shape=[1, H]))
    with pytest.raises(TypeError, match="lstm"):
        b.lstm(x, W, R, T, H)  # 3h weights for an lstm
    xi = b.input("xi", data_type="int32", shape=[T, B, I])
    with pytest.raises(TypeError, match="gru"):
        b.gru(xi, W, R, T, H)
