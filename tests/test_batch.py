"""The Ray Data batch app (mltensor/apps/batch.py) on a local Ray with 2 actors, on whatever
adapter runs the tests: every output equals what a single-process InferenceSession pipeline makes
of the same input, bad inputs are skipped and reported, and the example runs."""

import os
import subprocess
import sys

import numpy as np
import pytest

ray = pytest.importorskip("ray")
av = pytest.importorskip("av")
Image = pytest.importorskip("PIL.Image")

import mltensor  # noqa: E402
from mltensor.apps import batch  # noqa: E402
from mltensor.apps.video_copy import CopyingPipeline  # noqa: E402
from mltensor.apps.video_frames import DemoSource, Mp4Writer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model():
    try:
        return mltensor.models.fetch("selfie_segmentation", progress=False)
    except Exception as e:  # pragma: no cover
        pytest.skip(f"selfie segmentation model not available here: {type(e).__name__}: {e}")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A folder of images (two sizes, a nested one) and a short video from the demo scene, plus a
    corrupt image, a truncated video and a too-small image."""
    d = tmp_path_factory.mktemp("in")
    src = DemoSource(96, 64, frames=6)
    frames = list(src)
    Image.fromarray(frames[0]).save(d / "a.png")
    os.makedirs(d / "sub")
    Image.fromarray(DemoSource(80, 48, frames=1).frame(0)).save(d / "sub" / "b.jpg", quality=95)
    w = Mp4Writer(str(d / "clip.mp4"), 96, 64, fps=10)
    for f in frames:
        w.write(f)
    w.close()
    (d / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (d / "cut.mp4").write_bytes((d / "clip.mp4").read_bytes()[:200])
    Image.fromarray(frames[1][:8, :8]).save(d / "tiny.png")
    (d / "notes.txt").write_text("not an image")  # ignored inside folders
    return d


def _read_png(p):
    return np.asarray(Image.open(p).convert("RGB"))


def _decode(p):
    with av.open(str(p)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_two_actors_match_a_single_process_session(model, inputs, tmp_path):
    out = tmp_path / "out"
    s = batch.run_batch(
        [str(inputs)], str(out), workers=2, lossless=True, ray_init={"num_cpus": 1, "num_gpus": 0}
    )  # 2 actors share 1 CPU
    # every good file done, every bad one reported with a reason, nothing fatal
    assert s["files"] == 6 and s["ok"] == 3, batch.format_summary(s)
    failed = {os.path.basename(p): why for p, why in s["failed"]}
    assert set(failed) == {"broken.jpg", "cut.mp4", "tiny.png"}, failed
    assert "decode" in failed["broken.jpg"] and "16x16" in failed["tiny.png"]
    assert s["frames"] == 2 + 6 and s["workers"] == 2 and s["resources"] == "CPU"
    assert sum(w["files"] for w in s["per_worker"].values()) == 3

    sess = mltensor.InferenceSession(model)
    for rel in ("a.png", "sub/b.jpg"):
        rgb = _read_png(inputs / rel)
        ref = CopyingPipeline(sess, rgb.shape[1], rgb.shape[0], smoothing=0.0)
        want = ref.process(rgb)
        comp, mask = batch.output_paths(str(out), rel, "image")
        np.testing.assert_array_equal(_read_png(comp), want)
        np.testing.assert_array_equal(_read_png(mask), batch.mask_rgb(ref.mask))
        assert ref.mask.min() < 0.2 and ref.mask.max() > 0.8  # the demo person is found

    # the video: the same frames through the same pipeline and (lossless) encoder, in this process
    frames = _decode(inputs / "clip.mp4")
    ref = CopyingPipeline(sess, 96, 64, smoothing=0.5)
    want_comp, want_mask = tmp_path / "want.mp4", tmp_path / "want_mask.mp4"
    w1, w2 = (Mp4Writer(str(p), 96, 64, fps=10, crf=0) for p in (want_comp, want_mask))
    for f in frames:
        w1.write(ref.process(f))
        w2.write(batch.mask_rgb(ref.mask))
    w1.close()
    w2.close()
    comp, mask = batch.output_paths(str(out), "clip.mp4", "video")
    for got, want in ((comp, want_comp), (mask, want_mask)):
        g, w = _decode(got), _decode(want)
        assert len(g) == len(w) == 6
        for a, b in zip(g, w):
            np.testing.assert_array_equal(a, b)


def test_inputs_from_globs_files_and_missing_paths(inputs):
    files, rejected = batch.expand_inputs(
        [
            str(inputs / "*.png"),
            str(inputs / "sub" / "b.jpg"),
            str(inputs / "nope"),
            str(inputs / "notes.txt"),
            str(inputs / "*.gif"),
        ]
    )
    assert sorted(f["rel"] for f in files) == ["a.png", "b.jpg", "tiny.png"]
    assert {os.path.basename(p) for p, _ in rejected} == {"nope", "notes.txt", "*.gif"}


def test_custom_model_options_are_checked(model):
    with pytest.raises(ValueError, match="preprocess"):
        batch.Segmenter(model, preprocess="bogus")


def test_the_package_imports_without_ray_and_says_how_to_get_it():
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import mltensor, mltensor.apps.batch as b\n"
        "from mltensor.apps.cli import AppError\n"
        "try:\n    b.run_batch(['x'], 'y')\nexcept AppError as e:\n    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "pip install 'mltensor[ray]'" in r.stdout


def test_batch_example_runs(model, inputs, tmp_path):
    env = dict(os.environ, RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")
    r = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "batch_segmentation.py"),
            str(inputs / "a.png"),
            "-o",
            str(tmp_path / "o"),
            "--workers",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 of 1 files done" in r.stdout
    assert (tmp_path / "o" / "a.png").is_file() and (tmp_path / "o" / "a_mask.png").is_file()
