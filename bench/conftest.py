import os

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
os.environ.setdefault("RENDERCANVAS_FORCE_OFFSCREEN", "1")

import pytest  # noqa: E402

from mltensor import ml  # noqa: E402


@pytest.fixture(scope="session")
def ctx():
    return ml.create_context_sync(power_preference="high-performance")
