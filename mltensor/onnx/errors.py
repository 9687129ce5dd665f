"""The importer's errors: what a model or a caller got wrong, what the importer cannot map, and
what is our own bug.

UnsupportedError (a construct WebNN or this importer lacks) and NeedsValue (a graph input used
where a value known at load is required) are NotSupportedErrors; FeedError is the caller's;
Unsupported is what handlers raise (onnx/ops/), wrapped by the importer with the node's identity.
`model_errors` sorts any other exception raised while reading a model: DataError when
onnx.checker rejects the model too, else InternalError (a bug in mltensor, naming the node).
"""

import contextlib

from ..errors import DataError, DOMException, InternalError, NotSupportedError, OperationError
from .model import checker_complaint


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
    from mltensor's own code, which becomes InternalError)."""


class Unsupported(Exception):
    """Raised by handlers; wrapped into UnsupportedError with the node's identity."""


def unsupported(msg):
    raise Unsupported(msg)


def node_label(node):
    """ "node 'name' (domain.OpType)" for messages."""
    dom = f"{node.domain}." if node.domain not in ("", "ai.onnx") else ""
    return f"node {node.name or '(unnamed)'!r} ({dom}{node.op_type})"


@contextlib.contextmanager
def model_errors(name, importer=None, model=None, weights=None):
    """The documented errors pass (a DataError gains the model's name). Any other exception
    raised while reading or importing a model is sorted by evidence: when onnx.checker
    (full_check) rejects the model (`model`, else the importer's), it is a DataError quoting the
    checker; otherwise it is an InternalError, a bug in mltensor, naming the node being imported.
    Both keep the original exception as __cause__."""
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
    except MemoryError as e:
        raise OperationError(f"[onnx] {name}: out of host memory while importing the model") from e
    except Exception as e:
        node = getattr(importer, "node", None)
        where = f" {node_label(node)}:" if node is not None else ""
        if model is None and importer is not None:
            model, weights = importer.model, importer.weights
        what = f"{type(e).__name__}: {e}"
        complaint = checker_complaint(model, weights)
        if complaint is not None:
            raise DataError(
                f"[onnx] {name}:{where} malformed model: onnx.checker rejects it ({complaint}); {what}"
            ) from e
        raise InternalError(
            f"[onnx] {name}:{where} internal error in mltensor, a bug (the model passes onnx.checker): "
            f"{what}. Please report it with the model"
        ) from e
