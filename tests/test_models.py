"""mltensor.models.fetch: cache location, cache hits, checksum errors, the download path (with a
fake wheel, so these tests need no network; the real download is exercised by test_tflite)."""

import hashlib
import os
import subprocess
import zipfile

import pytest

from mltensor import models

FAKE = {name: f"{name} model bytes".encode() for name in models.MODELS}


@pytest.fixture
def fake_models(monkeypatch, tmp_path):
    """MODELS with digests of small fake files, a cache dir under tmp, and a counting fake pip."""
    table = {name: (member, hashlib.sha256(FAKE[name]).hexdigest()) for name, (member, _) in models.MODELS.items()}
    monkeypatch.setattr(models, "MODELS", table)
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_download(tmp, progress, contents=FAKE):
        calls.append(tmp)
        wheel = os.path.join(tmp, "mediapipe-0.10.14-cp311-cp311-manylinux_2_17_x86_64.whl")
        with zipfile.ZipFile(wheel, "w") as z:
            for name, (member, _) in table.items():
                z.writestr(member, contents[name])
        return wheel

    monkeypatch.setattr(models, "_download_wheel", fake_download)
    return calls


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == str(tmp_path / "mine")
    monkeypatch.delenv("MLTENSOR_CACHE")
    assert models.cache_dir() == str(tmp_path / "xdg" / "mltensor")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert models.cache_dir() == str(tmp_path / "home" / ".cache" / "mltensor")


def test_fetch_downloads_once_and_extracts_both(fake_models, tmp_path):
    p = models.fetch("selfie_segmentation", progress=False)
    assert isinstance(p, str)
    assert p == str(tmp_path / "cache" / "selfie_segmentation.tflite")
    assert open(p, "rb").read() == FAKE["selfie_segmentation"]
    # The landscape model came out of the same wheel: no second download.
    q = models.fetch("selfie_segmentation_landscape", progress=False)
    assert open(q, "rb").read() == FAKE["selfie_segmentation_landscape"]
    assert len(fake_models) == 1
    # One wheel, every model of it.
    assert sorted(os.listdir(tmp_path / "cache")) == sorted(f"{name}.tflite" for name in models.MODELS)


def test_cache_hit_needs_no_download(fake_models, tmp_path, monkeypatch):
    d = tmp_path / "cache"
    d.mkdir()
    (d / "selfie_segmentation.tflite").write_bytes(FAKE["selfie_segmentation"])

    def no_download(*a, **k):
        raise AssertionError("a cache hit must not download")

    monkeypatch.setattr(models, "_download_wheel", no_download)
    assert models.fetch("selfie_segmentation") == str(d / "selfie_segmentation.tflite")


def test_env_override_points_at_existing_copy(fake_models, tmp_path, monkeypatch):
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "selfie_segmentation_landscape.tflite").write_bytes(FAKE["selfie_segmentation_landscape"])
    monkeypatch.setenv("MLTENSOR_CACHE", str(other))
    assert models.fetch("selfie_segmentation_landscape") == str(other / "selfie_segmentation_landscape.tflite")
    assert fake_models == []


def test_cached_checksum_mismatch_says_what_to_do(fake_models, tmp_path):
    d = tmp_path / "cache"
    d.mkdir()
    (d / "selfie_segmentation.tflite").write_bytes(b"corrupted")
    with pytest.raises(models.FetchError) as e:
        models.fetch("selfie_segmentation")
    msg = str(e.value)
    assert hashlib.sha256(b"corrupted").hexdigest() in msg
    assert models.MODELS["selfie_segmentation"][1] in msg  # the expected digest
    assert "Delete it" in msg and str(d / "selfie_segmentation.tflite") in msg
    assert "MLTENSOR_CACHE" in msg and "InferenceSession" in msg and "pip" in msg and "download" in msg
    assert fake_models == []


def test_downloaded_checksum_mismatch(fake_models, monkeypatch, tmp_path):
    bad = dict(FAKE, selfie_segmentation=b"tampered")
    original = models._download_wheel
    monkeypatch.setattr(models, "_download_wheel", lambda tmp, progress: original(tmp, progress, bad))
    with pytest.raises(models.FetchError) as e:
        models.fetch("selfie_segmentation", progress=False)
    msg = str(e.value)
    assert "SHA-256" in msg and hashlib.sha256(b"tampered").hexdigest() in msg
    assert "mediapipe==0.10.14" in msg and "MLTENSOR_CACHE" in msg
    assert not (tmp_path / "cache" / "selfie_segmentation.tflite").exists()  # nothing half-written left
    assert not [f for f in os.listdir(tmp_path / "cache") if ".part" in f]


def test_pip_failure_names_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path / "cache"))

    def failing_run(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement")

    monkeypatch.setattr(models.subprocess, "run", failing_run)
    with pytest.raises(models.FetchError) as e:
        models.fetch("selfie_segmentation", progress=False)
    msg = str(e.value)
    assert "pip download mediapipe==0.10.14 --no-deps --only-binary=:all:" in msg
    assert "--platform manylinux2014_x86_64" in msg and "Could not find a version" in msg
    assert "InferenceSession(path)" in msg and "MLTENSOR_CACHE" in msg


def test_unknown_model():
    with pytest.raises(KeyError, match="selfie_segmentation"):
        models.fetch("resnet")


def test_registry_holds_the_fourteen_mediapipe_models():
    assert len(models.MODELS) == 14
    for name, (member, digest) in models.MODELS.items():
        assert member.startswith("mediapipe/modules/") and member.endswith(f"/{name}.tflite")
        assert len(digest) == 64 and int(digest, 16) >= 0


def test_pinned_checksums_match_design():
    assert models.MODELS["selfie_segmentation"][1] == (
        "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c"
    )
    assert models.MODELS["selfie_segmentation_landscape"][1] == (
        "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd"
    )
