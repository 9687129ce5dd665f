"""mltensor.models.fetch: cache location, cache hits, checksum errors, the download path (with a
fake wheel, so these tests need no network; the real download is exercised by test_tflite)."""

import hashlib
import os
import subprocess
import sys
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


# -- a real first-use fetch: stdout stays the program's (issue 46) -------------------------------

FETCH = (
    "import sys\n"
    "from mltensor import models\n"
    "try:\n"
    "    models.fetch_onnx('silero_vad')\n"
    "except models.FetchError as e:\n"
    "    sys.stderr.write(f'FETCH-ERROR {e}\\n')\n"
    "    sys.exit(3)\n"
)
# pip's words for an index it cannot reach (no network, a proxy refusing, DNS failing)
UNREACHABLE = (
    "Could not find a version",
    "No matching distribution",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
    "ProxyError",
    "Read timed out",
)


def _fetch_in_subprocess(cache, stderr):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MLTENSOR_CACHE=str(cache), PYTHONPATH=root)
    return subprocess.run(
        [sys.executable, "-c", FETCH], stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=root, timeout=600
    )


def _skip_if_unreachable(rc, err):
    if rc == 3 and any(s in err for s in UNREACHABLE):
        pytest.skip(f"the package index is unreachable: {err[-300:]}")


@pytest.mark.timeout(600)
def test_first_fetch_writes_nothing_on_stdout(tmp_path):
    """A real download of the smallest registry wheel (silero-vad, 11 MB) into an empty cache,
    stdout captured at the file-descriptor level: not a byte, while stderr says what is fetched."""
    r = _fetch_in_subprocess(tmp_path / "cache", subprocess.PIPE)
    err = r.stderr.decode(errors="replace")
    _skip_if_unreachable(r.returncode, err)
    assert r.returncode == 0, err[-3000:]
    assert r.stdout == b"", r.stdout[:2000]
    assert "mltensor: fetching silero_vad" in err
    assert (tmp_path / "cache" / "silero-vad-6.2.3" / "silero_vad.onnx").is_file()


@pytest.mark.timeout(600)
@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_first_fetch_draws_its_progress_on_a_terminal_stderr(tmp_path):
    """With stderr a terminal pip draws its progress bar there; stdout (a pipe) still gets nothing."""
    import threading

    master, slave = os.openpty()
    chunks = []

    def drain():
        while True:
            try:
                b = os.read(master, 4096)
            except OSError:  # the terminal's other end closed
                return
            if not b:
                return
            chunks.append(b)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        r = _fetch_in_subprocess(tmp_path / "cache", slave)
    finally:
        os.close(slave)
        reader.join(timeout=10)
        os.close(master)
    err = b"".join(chunks).decode(errors="replace")
    _skip_if_unreachable(r.returncode, err)
    assert r.returncode == 0, err[-3000:]
    assert r.stdout == b"", r.stdout[:2000]
    assert "mltensor: fetching silero_vad" in err
    assert "silero_vad-6.2.3-py3-none-any.whl" in err  # pip's own lines (and its bar) went to stderr


def _fake_sdist(monkeypatch, tmp_path, contents):
    """VOCABS of two fake vocabularies whose files are `contents` (member suffix -> bytes, per
    name), a cache under tmp, and a fake pip that writes them into a llama-cpp-python .tar.gz."""
    import io
    import tarfile

    names = ("alpha", "beta")
    good = {n: {sfx: f"{n}{sfx} bytes".encode() for sfx in models._VOCAB_SUFFIXES} for n in names}
    table = {n: tuple(hashlib.sha256(good[n][sfx]).hexdigest() for sfx in models._VOCAB_SUFFIXES) for n in names}
    monkeypatch.setattr(models, "VOCABS", table)
    monkeypatch.setenv("MLTENSOR_CACHE", str(tmp_path / "cache"))
    calls = []

    def fake_pip(cmd, tmp, progress, prefix="", suffix=".whl"):
        calls.append(cmd)
        assert models.LLAMA_CPP_PYTHON in cmd and ":all:" in cmd and suffix == ".tar.gz"
        path = os.path.join(tmp, "llama_cpp_python-0.3.36.tar.gz")
        with tarfile.open(path, "w:gz") as tar:
            for n in names:
                for sfx in models._VOCAB_SUFFIXES:
                    data = contents.get(n, good[n])[sfx]
                    info = tarfile.TarInfo(f"{models._VOCAB_DIR}/ggml-vocab-{n}{sfx}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        return path

    monkeypatch.setattr(models, "_run_pip", fake_pip)
    return calls, good


def test_fetch_vocab_takes_every_vocabulary_out_of_one_download(monkeypatch, tmp_path):
    calls, good = _fake_sdist(monkeypatch, tmp_path, {})
    p = models.fetch_vocab("alpha", progress=False)
    assert p == str(tmp_path / "cache" / "llama-cpp-python-0.3.36" / "ggml-vocab-alpha.gguf")
    for sfx in models._VOCAB_SUFFIXES:
        assert open(p[: -len(".gguf")] + sfx, "rb").read() == good["alpha"][sfx]
    q = models.fetch_vocab("beta", progress=False)  # (from the same download)
    assert open(q + ".out", "rb").read() == good["beta"][".gguf.out"] and len(calls) == 1
    with pytest.raises(KeyError, match="alpha"):
        models.fetch_vocab("gamma")


def test_fetch_vocab_refuses_a_wrong_file(monkeypatch, tmp_path):
    bad = {"alpha": {".gguf": b"alpha.gguf bytes", ".gguf.inp": b"tampered", ".gguf.out": b"alpha.gguf.out bytes"}}
    _fake_sdist(monkeypatch, tmp_path, bad)
    with pytest.raises(models.FetchError) as e:
        models.fetch_vocab("alpha", progress=False)
    msg = str(e.value)
    assert hashlib.sha256(b"tampered").hexdigest() in msg and "ggml-vocab-alpha.gguf.inp" in msg
    assert f"pip download {models.LLAMA_CPP_PYTHON} --no-deps --no-binary :all:" in msg
    d = tmp_path / "cache" / "llama-cpp-python-0.3.36"
    assert not (d / "ggml-vocab-alpha.gguf.inp").exists() and not [f for f in os.listdir(d) if ".part" in f]
