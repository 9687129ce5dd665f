"""The importer's errors: what a model or a caller got wrong, and what the importer cannot map.

UnsupportedError (a construct WebNN or this importer lacks) and NeedsValue (a graph input used
where a value known at load is required) are NotSupportedErrors; FeedError is the caller's;
Unsupported is what handlers raise (onnx/ops/), wrapped by the importer with the node's identity.
`data_errors` turns any other exception raised while reading a model into a DataError.
"""

import contextlib

from ..errors import DataError, DOMException, NotSupportedError


class UnsupportedError(NotSupportedError):
    """A node, attribute, data type or model feature this importer cannot map onto WebNN."""


class NeedsValue(UnsupportedError):
    """A graph input is used where a value known at load is required (a shape, axes, pads...).
    InferenceSession handles it by binding the input's value at the first run."""

    def __init__(self, name, what):
        super().__init__(
            f"[onnx] graph input {name!r} is used as {what}, which must be known at load "
            "(make it an initializer, or run through InferenceSession, which binds it "
            "at the first run)"
        )
        self.input_name = name


class FeedError(TypeError):
    """The sizes asked for do not fit the model's inputs (a caller's error, unlike a TypeError
    from a corrupt model, which becomes DataError)."""


class Unsupported(Exception):
    """Raised by handlers; wrapped into UnsupportedError with the node's identity."""


def unsupported(msg):
    raise Unsupported(msg)


@contextlib.contextmanager
def data_errors(name, importer=None):
    """Anything but the documented errors raised while reading a model (a corrupt field makes
    onnx, numpy or the builder raise IndexError, KeyError, ValueError...) becomes a DataError
    naming the model, and the node being imported if any."""
    try:
        yield
    except DataError as e:
        if name in str(e):
            raise
        msg = str(e).removeprefix("[onnx] ")
        raise DataError(f"[onnx] {name}: {msg}") from None
    except (DOMException, FeedError, OSError):
        raise
    except RecursionError:
        raise DataError(f"[onnx] {name}: the model nests too deeply to be read") from None
    except Exception as e:
        node = getattr(importer, "node", None)
        where = ""
        if node is not None:
            where = f" node {node.name or '(unnamed)'!r} ({node.op_type}):"
        raise DataError(f"[onnx] {name}:{where} malformed model ({type(e).__name__}: {e})") from e
