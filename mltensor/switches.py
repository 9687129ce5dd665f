"""Environment switches that change what a build makes: its kernels or its graph.

Every such switch is listed in BUILD_SWITCHES, and the code reads it only through `switch(name)`
(on: set to anything but empty or "0") or `value(name)` (the raw string), which refuse a name not
listed. The graph cache keys a session's graphs on the switches set (session/cache.py
BUILD_SWITCHES, `build_key()`): a session started under other switches builds its own graph
rather than loading one made under these. tests/test_build_switches.py fails on a build switch
read from os.environ directly, and on an `MLTENSOR_*` name in the code that is in neither this
list nor the test's list of the other switches.

The other switches are read where they are used: they change how a build or a dispatch runs, not
what it makes (MLTENSOR_COMPILE_THREADS, MLTENSOR_NO_NATIVE_REPLAY, MLTENSOR_DUMP_WGSL, the
cache's place and size), or only whether a build is refused (MLTENSOR_LOOP_CAP), or they depend on
time (MLTENSOR_AUTOTUNE_BUDGET). What each does: docs/guides/environment.md.
"""

import os

BUILD_SWITCHES = (
    "MLTENSOR_NO_FUSION",  # one kernel per node (compiler/build.py, ops/rnn.py)
    "MLTENSOR_NO_PLACEMENT",  # concat and slices copy (compiler/build.py)
    "MLTENSOR_NO_ATTENTION",  # the attention pass is off (compiler/fusion/attention.py)
    "MLTENSOR_FUSE_DEPTHWISE",  # the depthwise prologue of 1x1 convolutions (compiler/fusion/conv_prologue.py)
    "MLTENSOR_AUTOTUNE",  # kernel configurations timed or chosen by a heuristic (runtime/autotune.py)
    "MLTENSOR_NO_SIZE_PARAMS",  # sizes as launch parameters (dynamic/kernels.py)
    "MLTENSOR_NO_DERIVED_SIZES",  # dynamic kernels' derived sizes (dynamic/kernels.py)
    "MLTENSOR_NO_DIRECT_GEMM",  # the DIRECT GEMM tile, CPU adapters' heuristic (ops/_gemm.py)
    "MLTENSOR_NO_ROW_ATTENTION",  # the ROWS attention kernel, CPU adapters' choice (ops/attention.py)
    # read when a context is created (front/context.py); the context's float16/int64 modes are
    # also part of the graph cache's adapter folder (graphcache/store.py)
    "MLTENSOR_DISABLE_F16",
    "MLTENSOR_DISABLE_INT64",
)
_KNOWN = frozenset(BUILD_SWITCHES)


def value(name):
    """The raw value of build switch `name` ("" when unset)."""
    if name not in _KNOWN:
        raise KeyError(f"{name} is not a build switch (mltensor/switches.py BUILD_SWITCHES)")
    return os.environ.get(name, "")


def switch(name: str) -> bool:
    """Whether build switch `name` is on: set to anything but empty or "0"."""
    return value(name) not in ("", "0")


def build_key():
    """{name: value} of the build switches set, for cache keys."""
    return {k: os.environ[k] for k in BUILD_SWITCHES if os.environ.get(k)}
