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


def _close(got, want, rel=1e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=rel * scale)


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


# -- DFT, MelWeightMatrix, a window known at run time -------------------------------------------


def _dft_model(shape, opset, axis, inverse, onesided, dft_length):
    ins, inits = ["x"], []
    if dft_length is not None:
        inits.append(numpy_helper.from_array(np.array(dft_length, np.int64), "n"))
        ins.append("n")
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        ins += [""] if dft_length is None else []
        inits.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
        ins.append("axis")
    else:
        attrs["axis"] = axis
    node = helper.make_node("DFT", ins, ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "dft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def _numpy_dft(x, axis, inverse, onesided, n):
    sig = x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
    if inverse and onesided:
        return np.fft.irfft(sig, n=n, axis=axis)[..., None]
    y = (np.fft.ifft if inverse else np.fft.fft)(sig, n=n, axis=axis)
    if onesided:
        y = np.take(y, np.arange(n // 2 + 1), axis=axis)
    return np.stack([y.real, y.imag], axis=-1)


@pytest.mark.parametrize(
    "shape, opset, axis, inverse, onesided, dft_length",
    [
        ((2, 400, 1), 17, 1, 0, 1, None),  # a real frame of 400 samples (Whisper's n_fft), one-sided
        ((2, 512, 2), 17, 1, 0, 0, None),  # complex, full
        ((3, 10, 6, 2), 20, -3, 0, 0, None),  # opset 20: axis an input
        ((3, 10, 6, 1), 20, -2, 0, 1, 16),  # padded to dft_length
        ((2, 24, 2), 17, 1, 0, 0, 16),  # truncated to dft_length
        ((2, 64, 2), 17, 1, 1, 0, None),  # inverse
        ((2, 33, 2), 17, 1, 1, 1, 64),  # inverse of a half spectrum (irfft)
        ((2, 1024, 1), 20, 1, 0, 1, 2048),  # n_fft 2048
    ],
)
def test_dft_matches_numpy_and_onnxruntime(ctx, shape, opset, axis, inverse, onesided, dft_length):
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    model = _dft_model(shape, opset, axis, inverse, onesided, dft_length)
    got = InferenceSession(model, ctx).run(None, {"x": x})[0]
    ax = axis % len(shape)
    n = dft_length or (2 * (shape[ax] - 1) if inverse and onesided else shape[ax])
    _close(got, _numpy_dft(x.astype(np.float64), ax, inverse, onesided, n).astype(np.float32))
    if not (inverse and onesided):  # (onnxruntime's inverse of a half spectrum differs by version)
        # (onnxruntime's float32 transform is itself ~3e-5 of the largest value off numpy's float64
        # one at n = 400; ours, float64 twiddles and float32 sums, within 1e-5)
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        _close(got, want, 2e-4)


@pytest.mark.parametrize(
    "bins, n_fft, rate, lo, hi", [(80, 400, 16000, 0.0, 8000.0), (128, 2048, 22050, 20.0, 11025.0)]
)
def test_mel_weight_matrix_matches_onnxruntime(ctx, bins, n_fft, rate, lo, hi):
    inits = [
        numpy_helper.from_array(np.array(bins, np.int64), "bins"),
        numpy_helper.from_array(np.array(n_fft, np.int64), "n"),
        numpy_helper.from_array(np.array(rate, np.int64), "rate"),
        numpy_helper.from_array(np.array(lo, np.float32), "lo"),
        numpy_helper.from_array(np.array(hi, np.float32), "hi"),
    ]
    # spectrogram [frames, n_fft / 2 + 1] times the filter bank: a mel spectrogram
    node = helper.make_node("MelWeightMatrix", ["bins", "n", "rate", "lo", "hi"], ["w"])
    mm = helper.make_node("MatMul", ["spec", "w"], ["mel"])
    graph = helper.make_graph(
        [node, mm],
        "mel",
        [helper.make_tensor_value_info("spec", TensorProto.FLOAT, [7, n_fft // 2 + 1])],
        [helper.make_tensor_value_info("mel", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    spec = np.abs(np.random.default_rng(bins).standard_normal((7, n_fft // 2 + 1))).astype(np.float32)
    got = InferenceSession(model, ctx).run(None, {"spec": spec})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"spec": spec})[0]
    _close(got, want)


def test_stft_window_at_run_time(ctx):
    """A window fed as a graph input (its values known only at run time) scales the filters in
    the graph."""
    node = helper.make_node("STFT", ["signal", "step", "window"], ["y"], onesided=1)
    graph = helper.make_graph(
        [node],
        "stft",
        [
            helper.make_tensor_value_info("signal", TensorProto.FLOAT, [2, 1000, 1]),
            helper.make_tensor_value_info("window", TensorProto.FLOAT, [400]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(160, np.int64), "step")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    rng = np.random.default_rng(3)
    feeds = {
        "signal": rng.standard_normal((2, 1000, 1)).astype(np.float32),
        "window": np.hanning(400).astype(np.float32),
    }
    sess = InferenceSession(model, ctx)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for window in (np.hanning(400), np.hamming(400)):  # another window: the same build
        feeds["window"] = window.astype(np.float32)
        got = sess.run(None, feeds)[0]
        sig = feeds["signal"][..., 0].astype(np.float64)
        frames = np.stack([sig[:, t * 160 : t * 160 + 400] for t in range((1000 - 400) // 160 + 1)], axis=1)
        spec = np.fft.rfft(frames * feeds["window"].astype(np.float64), axis=-1)
        _close(got, np.stack([spec.real, spec.imag], axis=-1))
        _close(got, ref.run(None, feeds)[0], 2e-4)  # (onnxruntime's float32 transform: ~3e-5 off)
