#!/usr/bin/env bash
# Set up mltensor on a fresh machine: a virtual environment in .venv with the package and its
# test/example/ray/serve/docs/models extras, and a GPU adapter for wgpu. Without a GPU (CI, containers) it installs
# Mesa's software Vulkan driver (lavapipe) via apt. Safe to run again: it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")"
# Without XDG_RUNTIME_DIR, libwayland prints "XDG_RUNTIME_DIR is invalid or not set" on every wgpu
# start; give it a private directory as mltensor itself does (mltensor/_xdg.py).
if [ -z "${XDG_RUNTIME_DIR:-}" ] && [ "$(uname -s)" = Linux ]; then
    d="${TMPDIR:-/tmp}/mltensor-runtime-$(id -u)"
    if mkdir -p -m 700 "$d" 2>/dev/null && [ -O "$d" ] && [ ! -L "$d" ]; then export XDG_RUNTIME_DIR="$d"; fi
fi
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: Python >= 3.11 is required ($("$PY" --version 2>&1))" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.mltensor-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "setup: installing mltensor and its extras into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[test,examples,ray,serve,docs,models]"
    touch "$stamp"
fi

# Optional (MLTENSOR_SETUP_TENSORFLOW=1): TensorFlow's TFLite converter in its own environment,
# .venv-tf (tensorflow-cpu and tf-keras, about 600 MB), for tests/test_tflite_keras.py, which finds
# it there (or through MLTENSOR_TENSORFLOW_PYTHON). Its first run converts the Keras models (minutes
# on 2 cores), then reads them from the cache. Never installed into .venv.
if [ "${MLTENSOR_SETUP_TENSORFLOW:-}" = 1 ] && [ ! -f .venv-tf/.mltensor-installed ]; then
    echo "setup: creating .venv-tf with tensorflow-cpu and tf-keras"
    "$PY" -m venv .venv-tf
    .venv-tf/bin/python -m pip install -q tensorflow-cpu tf-keras
    touch .venv-tf/.mltensor-installed
fi

# Optional (MLTENSOR_SETUP_IREE=1): IREE's ONNX importer, compiler and runtime (iree-base-compiler,
# iree-base-runtime, about 600 MB) in their own environment, .venv-iree, for the corpus benchmark's
# IREE peer (bench/test_bench_corpus.py finds it there, or through MLTENSOR_IREE_PYTHON). Never
# installed into .venv (the `iree` extra does that for whoever wants it there).
if [ "${MLTENSOR_SETUP_IREE:-}" = 1 ] && [ ! -f .venv-iree/.mltensor-installed ]; then
    echo "setup: creating .venv-iree with iree-base-compiler and iree-base-runtime"
    "$PY" -m venv .venv-iree
    .venv-iree/bin/python -m pip install -q iree-base-compiler==3.13.0 iree-base-runtime==3.13.0 onnx numpy
    touch .venv-iree/.mltensor-installed
fi

# Optional (MLTENSOR_SETUP_LITERT_TORCH=1): litert-torch, PyTorch's converter to LiteRT, in its own
# environment, .venv-litert (litert-torch pins torch < 2.15 and brings jax and transformers: a few
# GB), for tests/test_tflite_litert_torch.py, which finds it there (or through
# MLTENSOR_LITERT_TORCH_PYTHON) to convert torchvision models on first use. Never installed into .venv.
if [ "${MLTENSOR_SETUP_LITERT_TORCH:-}" = 1 ] && [ ! -f .venv-litert/.mltensor-installed ]; then
    echo "setup: creating .venv-litert with litert-torch and torchvision"
    "$PY" -m venv .venv-litert
    .venv-litert/bin/python -m pip install -q litert-torch==0.10.0 torchvision==0.29.1
    touch .venv-litert/.mltensor-installed
fi

# wgpu falls back to OpenGL when no Vulkan driver exists; mltensor needs Vulkan/Metal/D3D12.
probe='import wgpu, sys; a = wgpu.gpu.request_adapter_sync(); sys.exit(0 if a and a.info["backend_type"] != "OpenGL" else 1)'
if ! .venv/bin/python -c "$probe" >/dev/null 2>&1; then
    echo "setup: wgpu found no Vulkan adapter; installing Mesa's software Vulkan driver (lavapipe)"
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=sudo; else SUDO=; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq mesa-vulkan-drivers >/dev/null
    if ! .venv/bin/python -c "$probe" >/dev/null 2>&1; then
        echo "setup: still no Vulkan adapter after installing mesa-vulkan-drivers" >&2
        exit 1
    fi
fi
# Graph replay's compiled loop (mltensor/runtime/replay.c) needs a C compiler, once; without one
# graphs replay from Python at about 3x the host cost per kernel. Built into ~/.cache/mltensor.
if ! command -v cc >/dev/null && ! command -v gcc >/dev/null && command -v apt-get >/dev/null; then
    echo "setup: installing a C compiler (gcc) for the compiled graph-replay loop"
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO=sudo; else SUDO=; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq gcc libc6-dev >/dev/null || echo "setup: could not install gcc; graphs replay from Python"
fi
.venv/bin/python -c 'from mltensor.runtime import replay; replay.main()' | sed 's/^/setup: /'
.venv/bin/python - <<'PY'
import wgpu
a = wgpu.gpu.request_adapter_sync()
i = a.info
kind = "software (CPU)" if i["adapter_type"] == "CPU" else "hardware"
print(f"setup: adapter {i['device']} ({i['backend_type']}, {kind})")
PY
