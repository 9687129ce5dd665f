"""test_op_support_limits.py again, on a context that ignores "shader-int64" (the internal switch
MLTENSOR_DISABLE_INT64=1): every listed operator x data type must also build and run where
int64/uint64 compute with two 32-bit words, as on an adapter without the feature."""

import pytest

from mltensor import ml
from test_op_support_limits import *  # noqa: F401,F403  (the same tests, collected with the ctx below)


@pytest.fixture(scope="module")
def ctx():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLTENSOR_DISABLE_INT64", "1")
        c = ml.create_context_sync()
    assert not c._int64
    yield c
    c.destroy()
