"""Real pretrained ONNX models shipped inside PyPI wheels (PaddleOCR det/rec/cls from
rapidocr-onnxruntime, the silero-vad family), fetched and checksummed by
mltensor.models.fetch_onnx, each compared with onnxruntime CPU on real-looking inputs: a synthetic
text-line image, a voiced audio signal fed chunk by chunk with its recurrent state carried over.
The quick ones run by default, the rest with -m slow."""

import time

import numpy as np
import pytest

from mltensor import InferenceSession, models

ort = pytest.importorskip("onnxruntime")

TOL = 1e-3  # max abs error against onnxruntime


def _path(name):
    try:
        return models.fetch_onnx(name, progress=False)
    except models.FetchError as e:  # pragma: no cover
        pytest.skip(f"the package registry is unreachable, so the model cannot be fetched: {e}")


def _text_image(rng, n, h, w):
    """Dark strokes on a light, slightly noisy page, normalized as PaddleOCR does ((x - .5) / .5)."""
    a = np.full((n, h, w, 3), 0.92, np.float32)
    for k in range(n):
        x = 2
        while x < w - 6:
            cw = int(rng.integers(3, 9))
            y0, y1 = int(rng.integers(h // 5, h // 3)), int(rng.integers(2 * h // 3, 4 * h // 5))
            a[k, y0:y1, x : x + 2] = rng.uniform(0.05, 0.2)
            a[k, y0 : y0 + 2, x : x + cw] = rng.uniform(0.05, 0.2)
            x += cw + int(rng.integers(2, 6))
    a += rng.normal(0, 0.02, a.shape).astype(np.float32)
    return np.ascontiguousarray(((a - 0.5) / 0.5).transpose(0, 3, 1, 2))


def _voice(rng, n, t, sr=16000, offset=0):
    """A vowel-like harmonic signal with a syllable envelope and a little noise."""
    tt = (np.arange(t) + offset) / sr
    f0 = 140 + 20 * np.sin(2 * np.pi * 1.5 * tt)
    x = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / sr) / k for k in range(1, 6))
    x = 0.2 * x * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * tt))
    return (x[None, :] + rng.normal(0, 0.005, (n, t))).astype(np.float32)


def _compare(name, feeds_list, carry=None):
    """Run feeds through both runtimes; `carry` maps an output index to the input it feeds next
    (recurrent state). Returns (max error, ms per run on our side after the first)."""
    path = _path(name)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    sess = InferenceSession(path)
    err, times = 0.0, []
    state_ref = state_ours = None
    for feeds in feeds_list:
        f_ref, f_ours = dict(feeds), dict(feeds)
        if carry and state_ref is not None:
            for i, name_in in carry.items():
                f_ref[name_in], f_ours[name_in] = state_ref[i], state_ours[i]
        want = ref.run(None, f_ref)
        t = time.perf_counter()
        got = sess.run(None, f_ours)
        times.append(time.perf_counter() - t)
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert g.dtype == w.dtype
            err = max(err, float(np.max(np.abs(g.astype(np.float64) - w))))
        state_ref, state_ours = want, got
    sess.close()
    assert err < TOL, f"{name}: max error {err:.2e} against onnxruntime"
    return err, 1000 * float(np.median(times[1:] or times))


def _vad_feeds(rng, chunks, size, sr=16000, with_sr=True):
    out = []
    for c in range(chunks):
        f = {"input": _voice(rng, 1, size, sr, c * size), "state": np.zeros((2, 1, 128), np.float32)}
        if with_sr:
            f["sr"] = np.array(sr, np.int64)
        out.append(f)
    return out


VAD = {
    "silero_vad": True,
    "silero_vad_16k_op15": True,
    "silero_vad_op18_ifless": True,
    "silero_vad_half": False,
    "silero_vad_openvino_16k": False,
}
QUICK = {"silero_vad", "silero_vad_op18_ifless"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK else pytest.mark.slow) for n in VAD])
def test_silero_vad_stream_16k(name, rng):
    size = 576 if name == "silero_vad_openvino_16k" else 512
    _compare(name, _vad_feeds(rng, 4, size, with_sr=VAD[name]), carry={1: "state"})


def test_silero_vad_both_sample_rates(rng):
    """sr picks a branch of an If: the session specializes to each rate (8 kHz: 256 samples)."""
    feeds = _vad_feeds(rng, 2, 512) + _vad_feeds(rng, 2, 256, sr=8000)
    _compare("silero_vad", feeds, carry={1: "state"})


@pytest.mark.slow
def test_silero_vad_16k_sequence_lstm(rng):
    x = _voice(rng, 1, 6 * 576).reshape(6, 576)
    z = np.zeros((1, 1, 128), np.float32)
    _compare("silero_vad_16k_sequence", [{"input": x, "h": z, "c": z}])


def test_ppocr_cls(rng):
    _compare("ppocr_mobile_v2_cls", [{"x": _text_image(rng, 1, 48, 192)}, {"x": _text_image(rng, 2, 48, 192)}])


@pytest.mark.slow
def test_ppocr_rec_dynamic_width_and_batch(rng):
    """The issue's case: width 192, then batch 2 at width 160, in one session."""
    _compare(
        "ppocr_v4_rec",
        [{"x": _text_image(rng, 1, 48, 192)}, {"x": _text_image(rng, 2, 48, 160)}, {"x": _text_image(rng, 1, 48, 192)}],
    )


@pytest.mark.slow
def test_ppocr_det(rng):
    _compare("ppocr_v4_det", [{"x": _text_image(rng, 1, 96, 128)}, {"x": _text_image(rng, 1, 64, 160)}])
