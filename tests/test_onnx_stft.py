"""ONNX STFT (issue 42): single-operator models against onnxruntime (real and complex signals,
windows, onesided or not, a signal length known only at run time), and torch.stft as
torch.onnx.export writes it (exported in a child process: torch must not load in a process where
lavapipe has, see tests/corpus.py), against onnxruntime and torch."""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mltensor import InferenceSession

ort = pytest.importorskip("onnxruntime")


def _model(length, step, frame_length, window, onesided, channels, dynamic=False):
    inits = [numpy_helper.from_array(np.array(step, np.int64), "step")]
    ins = ["signal", "step"]
    if window is not None:
        inits.append(numpy_helper.from_array(window.astype(np.float32), "window"))
        ins.append("window")
    else:
        ins.append("")
    if frame_length is not None:
        inits.append(numpy_helper.from_array(np.array(frame_length, np.int64), "frame_length"))
        ins.append("frame_length")
    node = helper.make_node("STFT", ins, ["y"], onesided=onesided)
    t = "T" if dynamic else length
    graph = helper.make_graph(
        [node],
        "stft",
        [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [2, t, channels])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _close(got, want):
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize(
    "length, step, frame_length, window, onesided, channels",
    [
        (64, 8, 16, "hann", 1, 1),
        (100, 10, 32, None, 1, 1),  # frame_length alone: a rectangular window
        (64, 16, None, "hamming", 0, 1),  # the window alone gives the frame length; both sides
        (64, 8, 16, "hann", 0, 2),  # a complex signal
        (50, 7, 12, "hann", 1, 1),  # frames not covering the signal's end
    ],
)
def test_stft_matches_onnxruntime(ctx, length, step, frame_length, window, onesided, channels):
    L = frame_length or 16
    w = {"hann": np.hanning(L + 1)[:-1], "hamming": np.hamming(L), None: None}[window]
    data = _model(length, step, frame_length, w, onesided, channels)
    x = np.random.default_rng(0).standard_normal((2, length, channels)).astype(np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"signal": x})[0]
    got = InferenceSession(data, context=ctx).run(None, {"signal": x})[0]
    _close(got, want)


def test_stft_signal_length_at_run_time(ctx):
    """One session, signals of several lengths: the frame count follows the length."""
    w = np.hanning(33)[:-1]
    data = _model(None, 8, 32, w, 1, 1, dynamic=True)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    sess = InferenceSession(data, context=ctx)
    for n in (64, 97, 200):
        x = np.random.default_rng(n).standard_normal((2, n, 1)).astype(np.float32)
        _close(sess.run(None, {"signal": x})[0], ref.run(None, {"signal": x})[0])


def test_stft_bad_input_is_named(ctx):
    data = _model(64, 0, 16, None, 1, 1)
    with pytest.raises(Exception, match="frame_step"):
        InferenceSession(data, context=ctx).run(None, {"signal": np.zeros((2, 64, 1), np.float32)})


_EXPORT = """
import sys, torch
class M(torch.nn.Module):
    def forward(self, x):
        # (return_complex=False: the TorchScript exporter cannot write complex tensors, so
        # audio models export the real-pair form)
        return torch.stft(x, n_fft=64, hop_length=16, window=torch.hann_window(64), center=False,
                          return_complex=False)
torch.onnx.export(M(), (torch.randn(2, 400),), sys.argv[1], input_names=["x"], output_names=["y"],
                  opset_version=17, dynamo=False, dynamic_axes={"x": {0: "b", 1: "t"}})
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch: pip install -e '.[models]'")
def test_torch_stft_export(ctx, tmp_path):
    """torch.stft (a Hann window, hop 16, not centered) as the TorchScript exporter writes it
    (STFT, then a Transpose to torch's [batch, bins, frames, 2]), at two signal lengths."""
    path = str(tmp_path / "stft.onnx")
    r = subprocess.run([sys.executable, "-c", _EXPORT, path], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-2000:]
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = InferenceSession(path, context=ctx)
    for n in (400, 1000):
        x = np.random.default_rng(n).standard_normal((2, n)).astype(np.float32)
        _close(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
