"""gru, gru_cell, lstm, lstm_cell: composed from other builder operators, as the WebNN spec's own
emulation does, so they emit no nodes of their own.

Unlike the spec's step-by-step emulation, the input projection of a whole sequence is one gemm per
direction ([steps * batch, input] x W^T, with the bias folded in as gemm's C); each step then costs
one recurrent gemm and one kernel for all the gate math (internal nodes _lstm_gates / _gru_gates,
shaders/rnn.wgsl), which reads the gates in place: 2 launches a step instead of 7-8 (gemm, slice,
a split per gate, two elementwise chains). GRU with reset_after=false needs r before its recurrent
gemm and keeps the composed form, as does everything under MLTENSOR_NO_FUSION=1.
Semantics follow the spec's emulation code, including the LSTM output gate's peephole term, which
uses the incoming cell state.

Dynamic dimensions (mltensor/dynamic/): the batch may be a size known at dispatch: the composed
operators take it, the gate kernel reads it and this step's offset into the projection at
dispatch, and a zero initial state is a slice of a constant sized for the largest batch (read in
place). The number of steps stays static: the
recurrence is unrolled at build, so a dynamic steps dimension is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

import numpy as np

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, is_static
from ..errors import NotSupportedError
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, store_fn
from ..switches import switch
from ._checks import check_bool, check_support, same_type
from .reduce import groups

FLOAT = dtypes.FLOATS
ACTIVATIONS = ("relu", "sigmoid", "tanh")
DIRECTIONS = ("forward", "backward", "both")
GRU_LAYOUTS = {"zrn": "zrn", "rzn": "rzn"}
LSTM_LAYOUTS = {"iofg": "iofg", "ifgo": "ifgo"}
# Builder methods taking operands with dynamic dimensions (the batch; the steps stay static)
DYNAMIC_OPS = frozenset({"gru", "gru_cell", "lstm", "lstm_cell"})

register(
    "gru",
    {
        k: FLOAT
        for k in ("input", "weight", "recurrent_weight", "bias", "recurrent_bias", "initial_hidden_state", "outputs")
    },
    ranks={
        "input": (3, 3),
        "weight": (3, 3),
        "recurrent_weight": (3, 3),
        "bias": (2, 2),
        "recurrent_bias": (2, 2),
        "initial_hidden_state": (3, 3),
    },
)
register(
    "gru_cell",
    {k: FLOAT for k in ("input", "weight", "recurrent_weight", "hidden_state", "bias", "recurrent_bias", "output")},
    ranks={
        "input": (2, 2),
        "weight": (2, 2),
        "recurrent_weight": (2, 2),
        "hidden_state": (2, 2),
        "bias": (1, 1),
        "recurrent_bias": (1, 1),
    },
)
register(
    "lstm",
    {
        k: FLOAT
        for k in (
            "input",
            "weight",
            "recurrent_weight",
            "bias",
            "recurrent_bias",
            "peephole_weight",
            "initial_hidden_state",
            "initial_cell_state",
            "outputs",
        )
    },
    ranks={
        "input": (3, 3),
        "weight": (3, 3),
        "recurrent_weight": (3, 3),
        "bias": (2, 2),
        "recurrent_bias": (2, 2),
        "peephole_weight": (2, 2),
        "initial_hidden_state": (3, 3),
        "initial_cell_state": (3, 3),
    },
)
register(
    "lstm_cell",
    {
        k: FLOAT
        for k in (
            "input",
            "weight",
            "recurrent_weight",
            "hidden_state",
            "cell_state",
            "bias",
            "recurrent_bias",
            "peephole_weight",
            "outputs",
        )
    },
    ranks={
        "input": (2, 2),
        "weight": (2, 2),
        "recurrent_weight": (2, 2),
        "hidden_state": (2, 2),
        "cell_state": (2, 2),
        "bias": (1, 1),
        "recurrent_bias": (1, 1),
        "peephole_weight": (1, 1),
    },
)


# -- the fused gate kernel -----------------------------------------------------------------------

# WGSL of the activations a recurrent op accepts (ACTIVATIONS), as the elementwise ops write them;
# relu keeps NaN (max() need not pass it through on GPUs).
_ACT_WGSL = {"sigmoid": "sigmoid_f32(x)", "tanh": "tanh_f32(x)", "relu": "select(max(x, 0.0), x, is_nan_f32(x))"}


def _fuse_gates():
    return not switch("MLTENSOR_NO_FUSION")


def _lower_gates(kc, node):
    a = node.attrs
    lstm = node.op == "_lstm_gates"
    H, layout = a["H"], a["layout"]
    n = math.prod(node.outputs[0].shape)
    params = {
        "mode": "lstm" if lstm else "gru",
        "n": n,
        "H": H,
        "G": len(layout),
        "gx_off": a["gx_off"],
        "pos": {k: p for p, k in enumerate(layout)},
        "peep": lstm and len(node.inputs) == 4,
    }
    for k, name in enumerate(a["acts"]):
        params[f"act{k}"] = _ACT_WGSL[name]
    names = ["gx", "rec", "c" if lstm else "h"] + (["peep"] if params["peep"] else [])
    outs = ["h_out", "c_out"] if lstm else ["h_out"]
    t = kc.wtype(node.inputs[0])  # f32, or f16 (loaded into f32 gate math, stored through ST)
    params["ST"] = store_fn(t)
    bindings = [Binding(x, t) for x in names] + [Binding(x, t, True) for x in outs]
    args = list(node.inputs) + [kc.out(node, i) for i in range(len(outs))]
    name = f"{'lstm' if lstm else 'gru'}_gates_{layout}_b{n // H}_h{H}" + ("_p" if params["peep"] else "") + f"_{t}"
    kc.launch(Kernel(name, "rnn.wgsl", params, bindings), args, groups(node.op, cdiv(n, WORKGROUP)))


register("_lstm_gates", {"input": FLOAT, "output": FLOAT}, lower=_lower_gates)
register("_gru_gates", {"input": FLOAT, "output": FLOAT}, lower=_lower_gates)


def _lstm_step_fused(b, gx_src, gx_off, h, c, rec, layout, acts):
    """One LSTM step as a recurrent gemm + one gate kernel; gx_src[gx_off:] holds this step's
    input projection rows ([batch, 4h], bias included). Returns (h, c)."""
    recg = b.gemm(h, rec["R"], c=rec["rb"], b_transpose=True)
    ins = [gx_src, recg, c] + ([rec["peep_full"]] if rec.get("peep_full") is not None else [])
    attrs = {"layout": layout, "acts": tuple(acts), "gx_off": gx_off, "H": h.shape[1]}
    return b._emit("_lstm_gates", ins, attrs, [(h.data_type, h.shape)] * 2)


def _gru_step_fused(b, gx_src, gx_off, h, rec, layout, acts):
    """One GRU step (reset_after) as a recurrent gemm + one gate kernel."""
    recg = b.gemm(h, rec["R"], c=rec["rb"], b_transpose=True)
    attrs = {"layout": layout, "acts": tuple(acts), "gx_off": gx_off, "H": h.shape[1]}
    return b._emit1("_gru_gates", [gx_src, recg, h], attrs, h.data_type, h.shape)


# -- validation ---------------------------------------------------------------------------------


def _positive(where, what, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < v < 2**32:
        raise TypeError(f"[{where}] {what} must be a positive integer, got {v!r}")
    return int(v)


def _enum(where, what, v, allowed):
    if v not in allowed:
        raise TypeError(f"[{where}] {what} must be one of {', '.join(allowed)}, got {v!r}")
    return v


def _activations(where, acts, default):
    if acts is None:
        return list(default)
    if isinstance(acts, str) or not hasattr(acts, "__iter__"):
        raise TypeError(f"[{where}] activations must be a sequence of {', '.join(ACTIVATIONS)}, got {acts!r}")
    acts = list(acts)
    if len(acts) != len(default):
        raise TypeError(f"[{where}] activations must have {len(default)} entries, got {len(acts)}")
    for a in acts:
        _enum(where, "activations entries", a, ACTIVATIONS)
    return acts


def _operands(b, where, named):
    """named: dict what -> operand or None. Validates builder, support table, shared type."""
    for what, v in named.items():
        if v is not None:
            b._operand(v, where, what)
    check_support(where, **named)
    first = next(iter(named))
    same_type(where, *[(w, v) for w, v in named.items()])
    return named[first]


def _shape(where, what, v, want):
    if v is not None and tuple(v.shape) != tuple(want):
        raise TypeError(f"[{where}] {what} shape {list(v.shape)} must be {list(want)}")


def _sequence_args(
    b,
    where,
    named,
    steps,
    hidden_size,
    return_sequence,
    direction,
    layout,
    activations,
    *,
    gates,
    layouts,
    default_activations,
):
    """The checks gru and lstm share (operands, options, and the shapes of the `gates`-gate
    weights, biases and initial hidden state); returns
    (steps, hidden_size, return_sequence, activations, batch, input_size, directions)."""
    x = _operands(b, where, named)
    steps = _positive(where, "steps", steps)
    hs = _positive(where, "hidden_size", hidden_size)
    return_sequence = check_bool(where, "return_sequence", return_sequence)
    _enum(where, "direction", direction, DIRECTIONS)
    _enum(where, "layout", layout, tuple(layouts))
    acts = _activations(where, activations, default_activations)
    if isinstance(x.shape[0], Sym):
        raise NotSupportedError(
            f"[{where}] input.shape[0] ({x.shape[0]}) is a dynamic dimension: the number of steps must be "
            "fixed at build (the recurrence is unrolled at build, one set of kernels per step)"
        )
    if x.shape[0] != steps:
        raise TypeError(f"[{where}] input.shape[0] ({x.shape[0]}) must equal steps ({steps})")
    _, batch, isz = x.shape
    nd = 2 if direction == "both" else 1
    g = gates * hs
    _shape(where, "weight", named["weight"], (nd, g, isz))
    _shape(where, "recurrent_weight", named["recurrent_weight"], (nd, g, hs))
    _shape(where, "bias", named["bias"], (nd, g))
    _shape(where, "recurrent_bias", named["recurrent_bias"], (nd, g))
    _shape(where, "initial_hidden_state", named["initial_hidden_state"], (nd, batch, hs))
    return steps, hs, return_sequence, acts, batch, isz, nd


def _act(b, name, x):
    return getattr(b, name)(x)


# -- the gate math of one step ------------------------------------------------------------------


def _gru_step(b, gx, h, rec, hs, reset_after, layout, acts, one):
    """gx: [batch, 3h] input projection (bias included); rec: per-direction recurrent pieces."""
    parts = b.split(gx, 3, axis=1)
    g = dict(zip(layout, parts))
    if reset_after:
        hp = dict(zip(layout, b.split(b.gemm(h, rec["R"], c=rec["rb"], b_transpose=True), 3, axis=1)))
        z = _act(b, acts[0], b.add(g["z"], hp["z"]))
        r = _act(b, acts[0], b.add(g["r"], hp["r"]))
        n = _act(b, acts[1], b.add(g["n"], b.mul(r, hp["n"])))
    else:
        z = _act(b, acts[0], b.add(g["z"], b.gemm(h, rec["Rg"]["z"], c=rec["rbg"]["z"], b_transpose=True)))
        r = _act(b, acts[0], b.add(g["r"], b.gemm(h, rec["Rg"]["r"], c=rec["rbg"]["r"], b_transpose=True)))
        hn = b.gemm(b.mul(r, h), rec["Rg"]["n"], c=rec["rbg"]["n"], b_transpose=True)
        n = _act(b, acts[1], b.add(g["n"], hn))
    return b.add(b.mul(z, h), b.mul(n, b.sub(one, z)))


def _lstm_step(b, gx, h, c, rec, layout, acts):
    gates = b.add(gx, b.gemm(h, rec["R"], c=rec["rb"], b_transpose=True))
    g = dict(zip(layout, b.split(gates, 4, axis=1)))
    p = rec["peep"]

    def peep(x, k):
        return x if p is None else b.add(x, b.mul(c, p[k]))

    i = _act(b, acts[0], peep(g["i"], "i"))
    f = _act(b, acts[0], peep(g["f"], "f"))
    cg = _act(b, acts[1], g["g"])
    o = _act(b, acts[0], peep(g["o"], "o"))
    c2 = b.add(b.mul(f, c), b.mul(i, cg))
    h2 = b.mul(o, _act(b, acts[2], c2))
    return h2, c2


def _gate_slices(b, x, layout, hs):
    """Per-gate [hs(, ...)] slices of a packed [G*hs(, ...)] operand (None stays None)."""
    if x is None:
        return {k: None for k in layout}
    out = {}
    for j, k in enumerate(layout):
        starts = [j * hs] + [0] * (x.rank - 1)
        sizes = [hs] + list(x.shape[1:])
        out[k] = b.slice(x, starts, sizes)
    return out


def _dir(b, x, d, nd):
    """Direction d of a [nd, ...] operand, without the leading dimension (None stays None)."""
    if x is None:
        return None
    rest = list(x.shape[1:])
    y = x if nd == 1 else b.slice(x, [d] + [0] * len(rest), [1] + rest)
    return b.reshape(y, rest)


def _zeros(b, dt, shape):
    """Zeros of `shape`; for a dynamic shape, the leading part of a constant sized for its largest
    sizes (a slice from 0 of a row-major constant: read in place, no kernel)."""
    if is_static(shape):
        return b.constant(np.zeros(shape, dtypes.NUMPY[dt]))
    full = b.constant(np.zeros([high(d) for d in shape], dtypes.NUMPY[dt]))
    return b.slice(full, [0] * len(shape), list(shape))


# -- gru ------------------------------------------------------------------------------------------


@builder_op(renamed={"x": "input"})
def gru(
    self: Any,
    input: MLOperand,
    weight: MLOperand,
    recurrent_weight: MLOperand,
    steps: int,
    hidden_size: int,
    *,
    bias: MLOperand | None = None,
    recurrent_bias: MLOperand | None = None,
    initial_hidden_state: MLOperand | None = None,
    reset_after: bool = True,
    return_sequence: bool = False,
    direction: str = "forward",
    layout: str = "zrn",
    activations: Sequence[str] | None = None,
    label: str | None = None,
) -> list[MLOperand]:
    """A GRU over `steps` time steps of `input` [steps, batch, input_size]; returns a list: the
    last hidden state [num_directions, batch, hidden_size], and with `return_sequence` every
    step's. weight / recurrent_weight: [num_directions, 3 * hidden_size, ...]; optional
    `bias`, `recurrent_bias`, `initial_hidden_state`; reset_after; direction "forward",
    "backward" or "both"; layout "zrn" or "rzn" (gate order); activations: two of "relu",
    "sigmoid", "tanh" (default sigmoid, tanh). Unrolled at build, the gates of a step fused."""
    # IDL: sequence<MLOperand> gru(MLOperand input, MLOperand weight, MLOperand recurrentWeight,
    #                              unsigned long steps, unsigned long hiddenSize, optional MLGruOptions options = {});
    where = "gru"
    named = {
        "input": input,
        "weight": weight,
        "recurrent_weight": recurrent_weight,
        "bias": bias,
        "recurrent_bias": recurrent_bias,
        "initial_hidden_state": initial_hidden_state,
    }
    steps, hs, return_sequence, acts, batch, isz, nd = _sequence_args(
        self,
        where,
        named,
        steps,
        hidden_size,
        return_sequence,
        direction,
        layout,
        activations,
        gates=3,
        layouts=GRU_LAYOUTS,
        default_activations=("sigmoid", "tanh"),
    )
    reset_after = check_bool(where, "reset_after", reset_after)

    dt = input.data_type
    one = self.constant(data_type=dt, value=1.0)
    x2 = self.reshape(input, [steps * batch, isz])
    finals, seqs = [], []
    for d in range(nd):
        backward = direction == "backward" or d == 1
        W = _dir(self, weight, d, nd)
        R = _dir(self, recurrent_weight, d, nd)
        bb = _dir(self, bias, d, nd)
        rb = _dir(self, recurrent_bias, d, nd)
        rec = {"R": R, "rb": rb}
        if not reset_after:
            rec["Rg"] = _gate_slices(self, R, layout, hs)
            rec["rbg"] = _gate_slices(self, rb, layout, hs)
        gx_all = self.gemm(x2, W, c=bb, b_transpose=True)  # [steps * batch, 3h]
        h = (
            _dir(self, initial_hidden_state, d, nd)
            if initial_hidden_state is not None
            else _zeros(self, dt, (batch, hs))
        )
        per_t = [None] * steps
        for s in range(steps):
            t = steps - 1 - s if backward else s
            if reset_after and _fuse_gates():
                h = _gru_step_fused(self, gx_all, t * batch * 3 * hs, h, rec, layout, acts)
            else:
                gx = self.slice(gx_all, [t * batch, 0], [batch, 3 * hs])
                h = _gru_step(self, gx, h, rec, hs, reset_after, layout, acts, one)
            per_t[t] = h
        finals.append(self.reshape(h, [1, batch, hs]))
        if return_sequence:
            seqs.append(self.concat([self.reshape(v, [1, 1, batch, hs]) for v in per_t], 0))
    out = [finals[0] if nd == 1 else self.concat(finals, 0)]
    if return_sequence:
        out.append(seqs[0] if nd == 1 else self.concat(seqs, 1))
    return out


@builder_op(renamed={"x": "input"})
def gru_cell(
    self: Any,
    input: MLOperand,
    weight: MLOperand,
    recurrent_weight: MLOperand,
    hidden_state: MLOperand,
    hidden_size: int,
    *,
    bias: MLOperand | None = None,
    recurrent_bias: MLOperand | None = None,
    reset_after: bool = True,
    layout: str = "zrn",
    activations: Sequence[str] | None = None,
    label: str | None = None,
) -> MLOperand:
    """One GRU step: the new hidden state [batch, hidden_size] from `input` [batch, input_size]
    and `hidden_state`; weights, bias, reset_after, layout and activations as in gru."""
    # IDL: MLOperand gruCell(MLOperand input, MLOperand weight, MLOperand recurrentWeight,
    #                        MLOperand hiddenState, unsigned long hiddenSize, optional MLGruCellOptions options = {});
    where = "gru_cell"
    _operands(
        self,
        where,
        {
            "input": input,
            "weight": weight,
            "recurrent_weight": recurrent_weight,
            "hidden_state": hidden_state,
            "bias": bias,
            "recurrent_bias": recurrent_bias,
        },
    )
    hs = _positive(where, "hidden_size", hidden_size)
    reset_after = check_bool(where, "reset_after", reset_after)
    _enum(where, "layout", layout, tuple(GRU_LAYOUTS))
    acts = _activations(where, activations, ("sigmoid", "tanh"))
    batch, isz = input.shape
    _shape(where, "weight", weight, (3 * hs, isz))
    _shape(where, "recurrent_weight", recurrent_weight, (3 * hs, hs))
    _shape(where, "hidden_state", hidden_state, (batch, hs))
    _shape(where, "bias", bias, (3 * hs,))
    _shape(where, "recurrent_bias", recurrent_bias, (3 * hs,))
    rec = {"R": recurrent_weight, "rb": recurrent_bias}
    if not reset_after:
        rec["Rg"] = _gate_slices(self, recurrent_weight, layout, hs)
        rec["rbg"] = _gate_slices(self, recurrent_bias, layout, hs)
    one = self.constant(data_type=input.data_type, value=1.0)
    gx = self.gemm(input, weight, c=bias, b_transpose=True)
    if reset_after and _fuse_gates():
        return _gru_step_fused(self, gx, 0, hidden_state, rec, layout, acts)
    return _gru_step(self, gx, hidden_state, rec, hs, reset_after, layout, acts, one)


# -- lstm -----------------------------------------------------------------------------------------


def _peep(b, p, hs):
    """Peephole [3h] packed as input, output, forget -> per-gate [h] operands."""
    if p is None:
        return None
    return {k: b.slice(p, [j * hs], [hs]) for j, k in enumerate("iof")}


@builder_op(renamed={"x": "input"})
def lstm(
    self: Any,
    input: MLOperand,
    weight: MLOperand,
    recurrent_weight: MLOperand,
    steps: int,
    hidden_size: int,
    *,
    bias: MLOperand | None = None,
    recurrent_bias: MLOperand | None = None,
    peephole_weight: MLOperand | None = None,
    initial_hidden_state: MLOperand | None = None,
    initial_cell_state: MLOperand | None = None,
    return_sequence: bool = False,
    direction: str = "forward",
    layout: str = "iofg",
    activations: Sequence[str] | None = None,
    label: str | None = None,
) -> list[MLOperand]:
    """An LSTM over `steps` time steps of `input` [steps, batch, input_size]; returns a list: the
    last hidden and cell states, and with `return_sequence` every step's hidden state.
    weight / recurrent_weight: [num_directions, 4 * hidden_size, ...]; optional `bias`,
    `recurrent_bias`, `peephole_weight`, initial states; direction "forward", "backward" or
    "both"; layout "iofg" or "ifgo" (gate order); activations: three of "relu", "sigmoid",
    "tanh" (default sigmoid, tanh, tanh). Unrolled at build."""
    # IDL: sequence<MLOperand> lstm(MLOperand input, MLOperand weight, MLOperand recurrentWeight,
    #                               unsigned long steps, unsigned long hiddenSize, optional MLLstmOptions options = {});
    where = "lstm"
    named = {
        "input": input,
        "weight": weight,
        "recurrent_weight": recurrent_weight,
        "bias": bias,
        "recurrent_bias": recurrent_bias,
        "peephole_weight": peephole_weight,
        "initial_hidden_state": initial_hidden_state,
        "initial_cell_state": initial_cell_state,
    }
    steps, hs, return_sequence, acts, batch, isz, nd = _sequence_args(
        self,
        where,
        named,
        steps,
        hidden_size,
        return_sequence,
        direction,
        layout,
        activations,
        gates=4,
        layouts=LSTM_LAYOUTS,
        default_activations=("sigmoid", "tanh", "tanh"),
    )
    _shape(where, "peephole_weight", peephole_weight, (nd, 3 * hs))
    _shape(where, "initial_cell_state", initial_cell_state, (nd, batch, hs))

    dt = input.data_type
    x2 = self.reshape(input, [steps * batch, isz])
    hfin, cfin, seqs = [], [], []
    for d in range(nd):
        backward = direction == "backward" or d == 1
        W = _dir(self, weight, d, nd)
        peep = _dir(self, peephole_weight, d, nd)
        rec = {
            "R": _dir(self, recurrent_weight, d, nd),
            "rb": _dir(self, recurrent_bias, d, nd),
            "peep": _peep(self, peep, hs),
            "peep_full": peep,
        }
        gx_all = self.gemm(x2, W, c=_dir(self, bias, d, nd), b_transpose=True)  # [steps * batch, 4h]
        h = (
            _dir(self, initial_hidden_state, d, nd)
            if initial_hidden_state is not None
            else _zeros(self, dt, (batch, hs))
        )
        c = _dir(self, initial_cell_state, d, nd) if initial_cell_state is not None else _zeros(self, dt, (batch, hs))
        per_t = [None] * steps
        for s in range(steps):
            t = steps - 1 - s if backward else s
            if _fuse_gates():
                h, c = _lstm_step_fused(self, gx_all, t * batch * 4 * hs, h, c, rec, layout, acts)
            else:
                gx = self.slice(gx_all, [t * batch, 0], [batch, 4 * hs])
                h, c = _lstm_step(self, gx, h, c, rec, layout, acts)
            per_t[t] = h
        hfin.append(self.reshape(h, [1, batch, hs]))
        cfin.append(self.reshape(c, [1, batch, hs]))
        if return_sequence:
            seqs.append(self.concat([self.reshape(v, [1, 1, batch, hs]) for v in per_t], 0))
    out = [hfin[0], cfin[0]] if nd == 1 else [self.concat(hfin, 0), self.concat(cfin, 0)]
    if return_sequence:
        out.append(seqs[0] if nd == 1 else self.concat(seqs, 1))
    return out


@builder_op(renamed={"x": "input"})
def lstm_cell(
    self: Any,
    input: MLOperand,
    weight: MLOperand,
    recurrent_weight: MLOperand,
    hidden_state: MLOperand,
    cell_state: MLOperand,
    hidden_size: int,
    *,
    bias: MLOperand | None = None,
    recurrent_bias: MLOperand | None = None,
    peephole_weight: MLOperand | None = None,
    layout: str = "iofg",
    activations: Sequence[str] | None = None,
    label: str | None = None,
) -> list[MLOperand]:
    """One LSTM step: returns [hidden_state, cell_state] from `input` [batch, input_size] and the
    previous states; weights, bias, peephole, layout and activations as in lstm."""
    # IDL: sequence<MLOperand> lstmCell(MLOperand input, MLOperand weight, MLOperand recurrentWeight,
    #                                   MLOperand hiddenState, MLOperand cellState, unsigned long hiddenSize,
    #                                   optional MLLstmCellOptions options = {});
    where = "lstm_cell"
    _operands(
        self,
        where,
        {
            "input": input,
            "weight": weight,
            "recurrent_weight": recurrent_weight,
            "hidden_state": hidden_state,
            "cell_state": cell_state,
            "bias": bias,
            "recurrent_bias": recurrent_bias,
            "peephole_weight": peephole_weight,
        },
    )
    hs = _positive(where, "hidden_size", hidden_size)
    _enum(where, "layout", layout, tuple(LSTM_LAYOUTS))
    acts = _activations(where, activations, ("sigmoid", "tanh", "tanh"))
    batch, isz = input.shape
    _shape(where, "weight", weight, (4 * hs, isz))
    _shape(where, "recurrent_weight", recurrent_weight, (4 * hs, hs))
    _shape(where, "hidden_state", hidden_state, (batch, hs))
    _shape(where, "cell_state", cell_state, (batch, hs))
    _shape(where, "bias", bias, (4 * hs,))
    _shape(where, "recurrent_bias", recurrent_bias, (4 * hs,))
    _shape(where, "peephole_weight", peephole_weight, (3 * hs,))
    rec = {
        "R": recurrent_weight,
        "rb": recurrent_bias,
        "peep": _peep(self, peephole_weight, hs),
        "peep_full": peephole_weight,
    }
    gx = self.gemm(input, weight, c=bias, b_transpose=True)
    if _fuse_gates():
        h, c = _lstm_step_fused(self, gx, 0, hidden_state, cell_state, rec, layout, acts)
    else:
        h, c = _lstm_step(self, gx, hidden_state, cell_state, rec, layout, acts)
    return [h, c]
