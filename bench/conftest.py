import os

os.environ.setdefault("RENDERCANVAS_FORCE_OFFSCREEN", "1")

import mltensor  # noqa: E402,F401  (first: it gives wgpu an XDG_RUNTIME_DIR, see mltensor/_xdg.py)

import pytest  # noqa: E402

try:  # onnxruntime, a reference in some tests, warns about every unused initializer otherwise
    import onnxruntime as _ort

    _ort.set_default_logger_severity(3)
except ImportError:  # pragma: no cover
    pass

from mltensor import ml  # noqa: E402


@pytest.fixture(scope="session")
def ctx():
    return ml.create_context_sync(power_preference="high-performance")
