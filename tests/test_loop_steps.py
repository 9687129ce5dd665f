"""Loop bodies that index by the iteration number, executed on the GPU (issue 42, point 3), against
onnxruntime: a Slice whose starts and ends are the step (through Unsqueeze, Add, Cast), Gather by
the step, the step's result written into a preallocated buffer (ScatterND, ScatterElements), and
a carried tensor grown by Concat every iteration; then a step-indexed attention decoder scripted
with torch.jit.script and exported by torch.onnx.export (501 steps, teacher-forced inputs sliced
by the step, logits written by index, hidden states grown by torch.cat, an early exit).

The loops run past onnx/ops/control_flow.MAX_UNROLL iterations, so they are executed
(stages/loop.py), not unrolled; each is checked to have run with at most n/8 + 1 host round
trips."""

import hashlib
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import mltensor
from mltensor import InferenceSession, _xdg
from mltensor.onnx.ops.control_flow import MAX_UNROLL
from mltensor.stages.loop import BATCH

ort = pytest.importorskip("onnxruntime")

M, D = MAX_UNROLL + 44, 4  # executed, not unrolled


def _vi(name, et, shape):
    return h.make_tensor_value_info(name, et, shape)


def _loop_model(step_nodes, step_out, extra_ins=(), extra_outs=(), extra_init=(), carried=(), cond=None):
    """Loop(M) whose body is h = tanh(h W + row), `row` made by `step_nodes` from the step `i` and
    the outer input `tab` [M, D]; `carried`: extra (initial input name, body in, body out) pairs;
    `cond`: the node list computing `c_out` (default: the incoming condition)."""
    nodes = list(step_nodes) + [
        h.make_node("MatMul", ["h_in", "W"], ["hw"]),
        h.make_node("Add", ["hw", step_out], ["hx"]),
        h.make_node("Tanh", ["hx"], ["h_out"]),
        h.make_node("Identity", ["h_out"], ["y"]),
    ]
    nodes += cond if cond is not None else [h.make_node("Identity", ["c_in"], ["c_out"])]
    ins = [_vi("i", T.INT64, []), _vi("c_in", T.BOOL, []), _vi("h_in", T.FLOAT, [D])]
    outs = [_vi("c_out", T.BOOL, []), _vi("h_out", T.FLOAT, [D])]
    for _, bi, bo in carried:
        ins.append(_vi(bi, T.FLOAT, None))
        outs.append(_vi(bo, T.FLOAT, None))
    outs.append(_vi("y", T.FLOAT, [D]))
    inits = [
        h.make_tensor("one", T.INT64, [], [1]),
        h.make_tensor("ax0", T.INT64, [1], [0]),
        h.make_tensor("ax1", T.INT64, [1], [1]),
        h.make_tensor("row_shape", T.INT64, [1], [D]),
        h.make_tensor("row2", T.INT64, [2], [1, D]),
    ] + list(extra_init)
    body = h.make_graph(nodes, "body", ins, outs, inits)
    rng = np.random.default_rng(5)
    W = (rng.standard_normal((D, D)) * 0.5).astype(np.float32)
    loop_ins = ["M", "c0", "h0"] + [c[0] for c in carried]
    loop_outs = ["hf"] + [f"{c[0]}_final" for c in carried] + ["ys"]
    g = h.make_graph(
        [h.make_node("Loop", loop_ins, loop_outs, body=body)],
        "g",
        [_vi("h0", T.FLOAT, [D]), _vi("tab", T.FLOAT, [M, D])]
        + [_vi(c[0], T.FLOAT, None) for c in carried]
        + list(extra_ins),
        [_vi(n, T.FLOAT, None) for n in loop_outs] + list(extra_outs),
        [
            h.make_tensor("M", T.INT64, [], [M]),
            h.make_tensor("c0", T.BOOL, [], [True]),
            h.make_tensor("W", T.FLOAT, [D, D], W.ravel()),
        ],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _compare(m, feeds_list, rtol=1e-5):
    b = m.SerializeToString()
    ref = ort.InferenceSession(b, providers=["CPUExecutionProvider"])
    sess = InferenceSession(b, cache=False)
    try:
        for feeds in feeds_list:
            before = sess.stats["readbacks"]
            got = sess.run(None, feeds)
            want = ref.run(None, feeds)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape)
                np.testing.assert_allclose(g, w, rtol=rtol, atol=1e-6)
            assert sess.stats["readbacks"] - before <= M / BATCH + 1
        return sess.stats
    finally:
        sess.close()


def _feeds(rng, **extra):
    return {
        "h0": rng.standard_normal(D).astype(np.float32),
        "tab": rng.standard_normal((M, D)).astype(np.float32),
        **extra,
    }


_SLICE_FORMS = {
    # Slice(tab, i, i + 1) as torch's TorchScript exporter writes x[i:i+1]
    "unsqueeze_add": [
        h.make_node("Unsqueeze", ["i", "ax0"], ["st"]),
        h.make_node("Add", ["i", "one"], ["ip1"]),
        h.make_node("Unsqueeze", ["ip1", "ax0"], ["en"]),
        h.make_node("Slice", ["tab", "st", "en", "ax0"], ["r2"]),
        h.make_node("Reshape", ["r2", "row_shape"], ["row"]),
    ],
    # the step cast to int32 and reshaped, ends computed from the cast value, no axes input
    "cast_reshape": [
        h.make_node("Cast", ["i", ""][:1], ["i32"], to=T.INT32),
        h.make_node("Reshape", ["i32", "ax1"], ["st"]),
        h.make_node("Constant", [], ["one32"], value=h.make_tensor("one32", T.INT32, [1], [1])),
        h.make_node("Add", ["st", "one32"], ["en"]),
        h.make_node("Slice", ["tab", "st", "en"], ["r2"]),
        h.make_node("Reshape", ["r2", "row_shape"], ["row"]),
    ],
    # a window of 3 rows ending at the step, read from a table padded by 2 in front, the start
    # a Sub; two axes, the second static (starts = Concat(i - 0, 0))
    "window": [
        h.make_node("Pad", ["tab", "pads"], ["tabp"]),
        h.make_node("Sub", ["i", "zero"], ["i0"]),
        h.make_node("Unsqueeze", ["i0", "ax0"], ["s0"]),
        h.make_node("Concat", ["s0", "zero1"], ["st"], axis=0),
        h.make_node("Add", ["i", "three"], ["i3"]),
        h.make_node("Unsqueeze", ["i3", "ax0"], ["e0"]),
        h.make_node("Concat", ["e0", "dd"], ["en"], axis=0),
        h.make_node("Slice", ["tabp", "st", "en", "axes01"], ["win"]),
        h.make_node("ReduceSum", ["win", "ax0"], ["r2"], keepdims=0),
        h.make_node("Identity", ["r2"], ["row"]),
    ],
}
_WINDOW_INITS = [
    h.make_tensor("pads", T.INT64, [4], [2, 0, 0, 0]),
    h.make_tensor("zero", T.INT64, [], [0]),
    h.make_tensor("zero1", T.INT64, [1], [0]),
    h.make_tensor("three", T.INT64, [], [3]),
    h.make_tensor("dd", T.INT64, [1], [D]),
    h.make_tensor("axes01", T.INT64, [2], [0, 1]),
]


@pytest.mark.parametrize("form", sorted(_SLICE_FORMS))
def test_slice_by_the_step(form, rng):
    m = _loop_model(_SLICE_FORMS[form], "row", extra_init=_WINDOW_INITS if form == "window" else ())
    stats = _compare(m, [_feeds(rng), _feeds(rng)])
    assert stats["readbacks"] == 0  # a trip count and a constant condition: nothing to wait for


def test_gather_by_the_step(rng):
    m = _loop_model([h.make_node("Gather", ["tab", "i"], ["row"], axis=0)], "row")
    _compare(m, [_feeds(rng)])


@pytest.mark.parametrize("op", ["ScatterND", "ScatterElements"])
def test_step_written_into_a_preallocated_buffer(op, rng):
    if op == "ScatterND":
        write = [
            h.make_node("Unsqueeze", ["i", "ax0"], ["i1"]),
            h.make_node("Unsqueeze", ["i1", "ax0"], ["idx"]),
            h.make_node("ScatterND", ["buf_in", "idx", "upd"], ["buf_out"]),
        ]
    else:
        write = [
            h.make_node("Unsqueeze", ["i", "ax0"], ["i1"]),
            h.make_node("Unsqueeze", ["i1", "ax0"], ["i2"]),
            h.make_node("Expand", ["i2", "row2"], ["idx"]),
            h.make_node("ScatterElements", ["buf_in", "idx", "upd"], ["buf_out"], axis=0),
        ]
    nodes = [h.make_node("Gather", ["tab", "i"], ["row"], axis=0)]
    m = _loop_model(nodes, "row", carried=[("buf0", "buf_in", "buf_out")])
    body = m.graph.node[0].attribute[0].g
    body.node.extend([h.make_node("Reshape", ["h_out", "row2"], ["upd"])] + write)
    _compare(m, [_feeds(rng, buf0=np.zeros((M, D), np.float32))])


@pytest.mark.parametrize("axis, init_rows", [(0, 0), (0, 3), (1, 0), (1, 2)])
def test_concat_grows_a_carried_tensor(axis, init_rows, rng):
    """torch.cat((acc, step)) in a scripted loop: executed as a scan output of the step joined to
    the initial value (an empty one included)."""
    shape = [1, D] if axis == 0 else [D, 1]
    m = _loop_model(
        [h.make_node("Gather", ["tab", "i"], ["row"], axis=0)],
        "row",
        carried=[("acc0", "acc_in", "acc_out")],
        extra_init=[h.make_tensor("piece_shape", T.INT64, [2], shape)],
    )
    body = m.graph.node[0].attribute[0].g
    body.node.extend(
        [
            h.make_node("Reshape", ["h_out", "piece_shape"], ["piece"]),
            h.make_node("Concat", ["acc_in", "piece"], ["acc_out"], axis=axis),
        ]
    )
    acc0 = rng.standard_normal((init_rows, D) if axis == 0 else (D, init_rows)).astype(np.float32)
    _compare(m, [_feeds(rng, acc0=acc0)])


def test_slice_by_the_step_with_an_early_exit(rng):
    """The condition computed from the row sliced at the step: the loop stops where the table says,
    its gated iterations past the exit harmless."""
    cond = [
        h.make_node("ReduceMax", ["row"], ["mx"], keepdims=0),
        h.make_node("Less", ["mx", "stop"], ["c_out"]),
    ]
    m = _loop_model(
        _SLICE_FORMS["unsqueeze_add"], "row", extra_init=[h.make_tensor("stop", T.FLOAT, [], [50.0])], cond=cond
    )
    cases = []
    for k in (0, 17, M - 1, None):
        f = _feeds(rng)
        if k is not None:
            f["tab"][k, 1] = 100.0
        cases.append(f)
    _compare(m, cases)


def _counter_model(start_shift):
    """Slice(tab, j, j + 1) with j a counter the body carries (j_out = j_in + 1), starting at the
    input j0: the start is not the iteration number, so it is checked at run time."""
    nodes = [
        h.make_node("Unsqueeze", ["j_in", "ax0"], ["st"]),
        h.make_node("Add", ["j_in", "one"], ["j_out"]),
        h.make_node("Unsqueeze", ["j_out", "ax0"], ["en"]),
        h.make_node("Slice", ["tab", "st", "en", "ax0"], ["r2"]),
        h.make_node("Reshape", ["r2", "row_shape"], ["row"]),
    ]
    m = _loop_model(nodes, "row")
    body = m.graph.node[0].attribute[0].g
    body.input.append(_vi("j_in", T.INT64, []))
    body.output.insert(2, _vi("j_out", T.INT64, []))
    loop = m.graph.node[0]
    loop.input.append("j0")
    loop.output.insert(1, "j_final")
    m.graph.output.insert(1, _vi("j_final", T.INT64, None))
    m.graph.input.append(_vi("j0", T.INT64, []))
    return m


def test_slice_by_a_carried_counter_checked_at_run_time(rng):
    """In range: as onnxruntime, with one extra read (the check) for a loop that otherwise never
    waits; from j0 = 5 the last 5 starts leave the table: onnxruntime fails (a shorter slice), and
    so does mltensor, with a clear error and no wrong result."""
    m = _counter_model(0)
    stats = _compare(m, [_feeds(rng, j0=np.array(0, np.int64))])
    assert stats["readbacks"] == 1
    b = m.SerializeToString()
    sess = InferenceSession(b, cache=False)
    feeds = _feeds(rng, j0=np.array(5, np.int64))
    with pytest.raises(Exception):
        ort.InferenceSession(b, providers=["CPUExecutionProvider"]).run(None, feeds)
    with pytest.raises(mltensor.NotSupportedError, match="left the sliced tensor"):
        sess.run(None, feeds)
    got = sess.run(None, _feeds(rng, j0=np.array(0, np.int64)))  # the session still runs
    assert got[2].shape == (M, D)


def test_a_slice_that_may_leave_the_table_is_still_refused(rng):
    """Slice(tab, i, i + 2) on a table of M rows: at the last step ONNX would give one row, so the
    size is not constant and the slice stays refused inside the executed body (clearly)."""
    nodes = [
        h.make_node("Unsqueeze", ["i", "ax0"], ["st"]),
        h.make_node("Add", ["i", "two"], ["ip2"]),
        h.make_node("Unsqueeze", ["ip2", "ax0"], ["en"]),
        h.make_node("Slice", ["tab", "st", "en", "ax0"], ["r2"]),
        h.make_node("ReduceSum", ["r2", "ax0"], ["row"], keepdims=0),
    ]
    m = _loop_model(nodes, "row", extra_init=[h.make_tensor("two", T.INT64, [], [2])])
    sess = InferenceSession(m.SerializeToString(), cache=False)
    with pytest.raises(mltensor.NotSupportedError, match="inside a Loop or Scan body"):
        sess.run(None, _feeds(rng))


# -- a scripted decoder, exported --------------------------------------------------------------

HAVE_TORCH = importlib.util.find_spec("torch") is not None

# Exported in a child process (from a file: torch.jit.script reads the source): torch loads triton, whose own LLVM crashes a process in which a
# wgpu device already runs on Mesa's lavapipe (LLVM too).
EXPORT = r'''
import sys, torch

class Decoder(torch.nn.Module):
    """An attention decoder as a table-structure recognizer's: attention over encoder features, a
    GRU step whose input is the teacher-forced row sliced at the step plus the previous step's
    softmax, each step's logits written by index into a preallocated buffer, the hidden states
    grown by torch.cat, and an exit once a forced row's first entry passes `stop` (with the break,
    torch writes the step as a counter the Loop carries, not as its iteration number)."""

    def __init__(self, H: int, V: int):
        super().__init__()
        self.q = torch.nn.Linear(H, H)
        self.wi = torch.nn.Linear(H + V, 3 * H)
        self.wh = torch.nn.Linear(H, 3 * H)
        self.out = torch.nn.Linear(H, V)

    def forward(self, feats, targets, stop):
        h = torch.zeros_like(feats[:, 0, :])
        logits = torch.zeros_like(targets)
        hs = feats[:, :0, :]
        prev = torch.zeros_like(targets[:, 0, :])
        for i in range(targets.size(1)):
            q = self.q(h).unsqueeze(1)
            a = torch.softmax((feats * q).sum(-1), dim=1)
            ctx = (a.unsqueeze(-1) * feats).sum(1)
            x = targets[:, i : i + 1, :].squeeze(1) + prev
            ir, iz, i_n = self.wi(torch.cat([ctx, x], 1)).chunk(3, 1)
            hr, hz, h_n = self.wh(h).chunk(3, 1)
            r = torch.sigmoid(ir + hr)
            z = torch.sigmoid(iz + hz)
            h = (1 - z) * torch.tanh(i_n + r * h_n) + z * h
            o = self.out(h)
            logits[:, i, :] = o
            prev = torch.softmax(o, 1)
            hs = torch.cat([hs, h.unsqueeze(1)], 1)
            if bool((x[:, 0] > stop).any()):
                break
        return logits, h, hs

torch.manual_seed(0)
m = torch.jit.script(Decoder(16, 8).eval())
args = (torch.randn(2, 5, 16), torch.randn(2, 9, 8), torch.tensor(50.0))
torch.onnx.export(m, args, sys.argv[1], opset_version=17, dynamo=False,
                  input_names=["feats", "targets", "stop"], output_names=["logits", "h", "hs"],
                  dynamic_axes={"feats": {0: "b", 1: "t"}, "targets": {0: "b", 1: "steps"}})
print(torch.__version__)
'''


def _export_decoder():
    """The decoder's export, made on first use in the cache directory (keyed on torch's version and
    the export script)."""
    v = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    tag = hashlib.sha256(EXPORT.encode()).hexdigest()[:12]
    folder = os.path.join(_xdg.cache_dir(), "corpus", f"torch{v.split('+')[0]}")
    path = os.path.join(folder, f"step_decoder-{tag}.onnx")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        script = f"{path}.{os.getpid()}.py"  # (torch.jit.script reads the module's source file)
        with open(script, "w") as f:
            f.write(EXPORT)
        try:
            r = subprocess.run([sys.executable, script, tmp], capture_output=True, text=True)
        finally:
            os.remove(script)
        assert r.returncode == 0, r.stderr[-3000:]
        os.replace(tmp, path)
    return path


@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed (pip install torch==2.14.1)")
def test_scripted_attention_decoder_501_steps():
    import onnx

    path = _export_decoder()
    body = next(n for n in onnx.load(path).graph.node if n.op_type == "Loop").attribute[0].g
    assert "Slice" in {n.op_type for n in body.node}  # the step-indexed forms are in the export
    assert "ScatterND" in {n.op_type for n in body.node}
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = InferenceSession(path, cache=False)
    rng = np.random.default_rng(0)
    steps = 501
    try:
        for b, t, exit_at in ((2, 5, None), (3, 7, 123), (3, 7, 0), (2, 5, None)):
            targets = rng.standard_normal((b, steps, 8)).astype(np.float32)
            if exit_at is not None:
                targets[1, exit_at, 0] = 100.0
            feeds = {"feats": rng.standard_normal((b, t, 16)).astype(np.float32), "targets": targets}
            feeds["stop"] = np.array(50.0, np.float32)
            before = sess.stats["readbacks"]
            got = sess.run(None, feeds)
            want = ref.run(None, feeds)
            n = steps if exit_at is None else exit_at + 1
            assert want[2].shape == (b, n, 16)
            for g, w in zip(got, want):
                assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape)
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
            assert sess.stats["readbacks"] - before <= n / BATCH + 1
    finally:
        sess.close()


# -- torchvision's paste-masks loop ----------------------------------------------------------------

PASTE = r"""
import sys, torch
from torchvision.models.detection.roi_heads import paste_masks_in_image

class M(torch.nn.Module):
    def forward(self, masks, boxes):
        return paste_masks_in_image(masks, boxes, (64, 80), padding=1)

boxes = torch.tensor([[1.0, 2.0, 30.0, 40.0], [10.0, 5.0, 60.0, 50.0], [0.0, 0.0, 79.0, 63.0]])
torch.onnx.export(M(), (torch.rand(3, 1, 28, 28), boxes), sys.argv[1], opset_version=17, dynamo=False,
                  input_names=["masks", "boxes"], output_names=["out"],
                  dynamic_axes={"masks": {0: "n"}, "boxes": {0: "n"}})
"""


@pytest.mark.skipif(
    not HAVE_TORCH or importlib.util.find_spec("torchvision") is None, reason="torch and torchvision are not installed"
)
def test_torchvision_paste_masks_loop():
    """Mask R-CNN's paste-masks Loop as torchvision exports it (one iteration a detection, each
    mask resized to its box: a Resize whose sizes a run gives, a carried tensor grown by Concat):
    unrolled, each Resize's sizes read back. Its first resumed import took the outcome of the
    first Resize's cut for the Loop's own and failed with an internal error."""
    v = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    tag = hashlib.sha256(PASTE.encode()).hexdigest()[:12]
    folder = os.path.join(_xdg.cache_dir(), "corpus", f"torch{v.split('+')[0]}")
    path = os.path.join(folder, f"paste_masks-{tag}.onnx")
    if not os.path.exists(path):
        os.makedirs(folder, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        r = subprocess.run([sys.executable, "-c", PASTE, tmp], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        os.replace(tmp, path)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = InferenceSession(path, cache=False)
    rng = np.random.default_rng(0)
    try:
        for n in (3, 12):  # 12 boxes: more than the 16 elements a session binds by value
            xy = rng.uniform(0, 60, (n, 2))
            boxes = np.concatenate([xy, xy + rng.uniform(2, 40, (n, 2))], 1).astype(np.float32)
            feeds = {"masks": rng.random((n, 1, 28, 28), dtype=np.float32), "boxes": boxes}
            got, want = sess.run(None, feeds)[0], ref.run(None, feeds)[0]
            assert got.shape == want.shape == (n, 1, 64, 80)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    finally:
        sess.close()
