"""mltensor: the W3C WebNN API (MLContext, MLGraphBuilder, MLGraph, MLTensor) on wgpu-py."""

from .errors import DataError, DOMException, InvalidStateError, NotSupportedError, OperationError, UnknownError
from .front.context import ML, MLContext, ml
from .front.tensor import MLTensor

__version__ = "0.1.0"

__all__ = [
    "ml", "ML", "MLContext", "MLTensor",
    "DOMException", "InvalidStateError", "NotSupportedError", "OperationError", "UnknownError", "DataError",
]
