"""WebNN's DOMException names as Python exceptions (API.md, "Errors").

TypeError stays the builtin TypeError; everything else subclasses DOMException. `gpu_errors`
turns wgpu's own exceptions into them at the API's edge.
"""

from __future__ import annotations

from types import TracebackType
from typing import Literal, Self

import wgpu


class DOMException(Exception):
    """Base of the WebNN errors that are not TypeError."""


class InvalidStateError(DOMException):
    """A call on something no longer usable: a destroyed tensor or graph, a lost context, a
    builder that has already built, a tensor of a destroyed device."""


class NotSupportedError(DOMException):
    """What the input asks for is valid but not implemented here: an ONNX / TFLite operator,
    attribute or data type the importers do not handle, an operator given dynamic dimensions it
    cannot take, no usable GPU adapter."""


class OperationError(DOMException):
    """The GPU side failed: out of GPU memory, a kernel that failed to compile, a batch the
    device rejected, a graph cache that cannot be written. The message names the call."""


class InternalError(OperationError):
    """A bug in mltensor: an exception its own code raised (AttributeError, KeyError, an
    assertion...) while importing or running a model that is not malformed. The message says so
    and names the node; the original exception is kept as ``__cause__`` (its traceback with it).
    An OperationError, so code that catches OperationError catches it too."""


class UnknownError(DOMException):
    """WebNN's UnknownError: a failure with no better category."""


class DataError(DOMException):
    """Malformed input data: a corrupt or truncated model file (naming the file and the field or
    node), a GGUF file that does not parse."""


class NotFoundError(DOMException):
    """load_graph of a key the graph cache does not hold (for this adapter and code)."""


class gpu_errors:
    """Context manager: a wgpu error raised inside (out of memory, a lost device, a validation
    failure) becomes OperationError naming `where`; WebNN errors pass through."""

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if e is None or isinstance(e, (TypeError, DOMException)):
            return False
        if isinstance(e, wgpu.GPUError):
            what = (
                "out of GPU memory"
                if isinstance(e, wgpu.GPUOutOfMemoryError) or "memory" in str(e).lower()
                else "the GPU rejected the call"
            )
            msg = " ".join(str(e).split())
            raise OperationError(f"[{self.where}] {what}: {msg}") from e
        return False


class internal_errors:
    """Context manager: an exception of mltensor's own code raised inside (an AttributeError, a
    KeyError, an assertion...; not a WebNN error, not a TypeError of ours, which starts with
    "[call]", not an OSError) becomes InternalError naming `where`, the original as its cause."""

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, typ: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if e is None or not isinstance(e, Exception) or isinstance(e, (DOMException, OSError)):
            return False
        if isinstance(e, TypeError) and str(e).startswith("["):
            return False
        raise as_internal(self.where, e) from e


def as_internal(where: str, e: Exception) -> InternalError:
    """`e`, an exception of mltensor's own code, as the InternalError that says so (the original
    as its cause); an InternalError is returned as it is."""
    if isinstance(e, InternalError):
        return e
    err = InternalError(f"[{where}] internal error in mltensor, a bug: {type(e).__name__}: {e}. Please report it")
    err.__cause__ = e
    return err
