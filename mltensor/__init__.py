"""mltensor: the W3C WebNN API (MLContext, MLGraphBuilder, MLGraph, MLTensor) on wgpu-py.

The public API is exactly what this module exports; see API.md of the project for the contract.
"""

import typing as _typing

from ._xdg import ensure_runtime_dir as _ensure_runtime_dir

_ensure_runtime_dir()  # before wgpu loads (see _xdg.py)

from .runtime.cffi_types import cache_cdef as _cache_cdef  # noqa: E402
from .runtime.cffi_types import install as _install_types  # noqa: E402

_cache_cdef()  # before wgpu loads: its header's C parse comes from the cache (runtime/cffi_types.py)

from wgpu.backends.wgpu_native._ffi import ffi as _ffi  # noqa: E402  (the cached parse: first, as before the split)

_install_types(_ffi)  # start-up: type strings parse fast from here on (runtime/cffi_types.py)

from .front.graph import MLGraph  # noqa: E402
from .dynamic.dims import MLDynamicDimension  # noqa: E402
from .errors import (
    DataError,
    DOMException,
    InternalError,
    InvalidStateError,
    NotFoundError,
    NotSupportedError,
    OperationError,
    UnknownError,
)
from .front.builder import MLGraphBuilder, MLOperand
from .front.context import ML, MLContext, ml
from .front.tensor import MLTensor


__version__ = "0.1.0"

__all__ = [
    "ml",
    "ML",
    "MLContext",
    "MLTensor",
    "MLGraphBuilder",
    "MLOperand",
    "MLGraph",
    "MLDynamicDimension",
    "DOMException",
    "InvalidStateError",
    "InternalError",
    "NotSupportedError",
    "OperationError",
    "UnknownError",
    "DataError",
    "NotFoundError",
    "import_external_buffer_sync",
    "import_external_buffer_async",
    "InferenceSession",
    "onnx",
    "tflite",
    "models",
]

# Imported on first use (start-up): the session, onnx, tflite, the model fetcher and the interop
# machinery (about 1 MB of a process that never lends a tensor).
_LAZY = {
    "import_external_buffer_sync": ("mltensor.front.interop", "import_external_buffer_sync"),
    "import_external_buffer_async": ("mltensor.front.interop", "import_external_buffer_async"),
    "InferenceSession": ("mltensor.session", "InferenceSession"),
    "onnx": ("mltensor.onnx", None),
    "tflite": ("mltensor.tflite", None),
    "models": ("mltensor.models", None),
}


if _typing.TYPE_CHECKING:
    # what the lazy names are, for type checkers and IDEs (at run time __getattr__ imports them)
    from . import models, onnx, tflite
    from .front.interop import import_external_buffer_async, import_external_buffer_sync
    from .session import InferenceSession


# (hidden from type checkers, so that a misspelt name is an error there and not Any)
if not _typing.TYPE_CHECKING:

    def __getattr__(name):
        if name in _LAZY:
            import importlib

            module, attr = _LAZY[name]
            m = importlib.import_module(module)
            value = m if attr is None else getattr(m, attr)
            globals()[name] = value
            return value
        raise AttributeError(f"module 'mltensor' has no attribute {name!r}")
