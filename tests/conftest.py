import os

import numpy as np
import pytest

try:  # onnxruntime, a reference in some tests, warns about every unused initializer otherwise
    import onnxruntime as _ort

    _ort.set_default_logger_severity(3)
except ImportError:  # pragma: no cover
    pass

os.environ.setdefault("RENDERCANVAS_FORCE_OFFSCREEN", "1")

import mltensor  # noqa: E402,F401  (first: it gives wgpu an XDG_RUNTIME_DIR, see mltensor/_xdg.py)

wgpu = pytest.importorskip("wgpu")
_adapter = wgpu.gpu.request_adapter_sync()
if _adapter is None or _adapter.info["backend_type"] == "OpenGL":  # pragma: no cover
    # fail loudly rather than skip: a run with no adapter would pass without testing anything
    raise pytest.UsageError("no Vulkan/Metal/D3D12 adapter for wgpu: run setup.sh")

from mltensor import ml  # noqa: E402


@pytest.fixture(scope="session")
def ctx():
    """One shared context for tests that do not destroy it (device creation costs ~0.3 s)."""
    c = ml.create_context_sync()
    yield c


@pytest.fixture
def fresh_ctx():
    c = ml.create_context_sync()
    yield c
    c.destroy()


@pytest.fixture
def rng():
    return np.random.default_rng(0)
