"""TFLite importer: a .tflite flatbuffer becomes an MLGraph built in NHWC.

    graph, inputs, outputs = mltensor.tflite.import_model("model.tflite", ctx)

`inputs` / `outputs` are lists of (name, data_type, shape) in model order; names are the TFLite
tensor names. Weights (float16 ones behind DEQUANTIZE included) become float32 constants at load,
or with float16=True the whole graph computes in float16 (float16 weights kept as they are, the
model's float32 inputs and outputs cast at the graph's edges);
sparse constants (TFLite's sparsity format) are densified by the reader. MediaPipe's custom
operators Convolution2DTransposeBias, Landmarks2TransformMatrix, TransformTensorBilinear and
TransformLandmarks are composed from builder ops (mediapipe_ops.py), so all 14 models of the
mediapipe 0.10.14 wheel (`mltensor.models`) run. Resource variables (streaming models' state),
IF and WHILE: control.py; those decided at run time run as stages in an InferenceSession
(staging.py, staged.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import DataError, NotSupportedError
from ..front.builder import MLGraphBuilder
from . import staged
from .importer import convert, supported_operators
from .reader import is_tflite, load_bytes, read

if TYPE_CHECKING:
    import numpy as np

    from ..front.context import MLContext
    from ..front.graph import MLGraph


def import_model(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    context: MLContext,
    *,
    free_dimensions: Mapping[str, int | Sequence[int]] | None = None,
    float16: bool = False,
    initial_state: dict[str, np.ndarray] | None = None,
) -> tuple[MLGraph, list[tuple[str, str, tuple[int, ...]]], list[tuple[str, str, tuple[int, ...]]]]:
    """Load a ``.tflite`` model and build it on `context` as one MLGraph, in NHWC (for state kept
    between runs on the GPU, use `mltensor.InferenceSession`).

    Parameters
    ----------
    source : str, os.PathLike, bytes, bytearray or memoryview
        A path to a ``.tflite`` file, or its bytes.
    context : MLContext
        The context to build on.
    free_dimensions : dict, optional
        ``{input name: full shape}`` (or ``{"batch": n}``, for free leading dimensions) for
        inputs whose shape signature has free (-1) dimensions; by default the shape stored in
        the model is used.
    float16 : bool, default False
        Compute the model in float16 (in f16 on a context with "shader-f16"): half the memory
        traffic, float16 precision; inputs and outputs keep the model's types.
    initial_state : dict or None, default None
        A dict that receives ``{name: numpy array}``, the initial state of a model with resource
        variables (tflite/control.py). Such a model's graph has one more input per variable it
        carries between calls (``control.STATE_PREFIX`` + the variable's name: its value before
        the call) and one more output of the same name for each it assigns (its value after):
        feed each call the state the last one left, the initial values first. InferenceSession
        does this on the GPU (``reset_state()`` starts over). With `initial_state` given, the
        variable tensors of UNIDIRECTIONAL_SEQUENCE_LSTM (its hidden and cell state, which
        LiteRT carries between invokes) are state as well; without it they are zeros at the
        start of each call.

    Returns
    -------
    graph : MLGraph
        The built graph, ready for `MLContext.dispatch`.
    inputs : list of tuple
        ``(name, data_type, shape)`` of each graph input, in model order (names are the TFLite
        tensor names).
    outputs : list of tuple
        ``(name, data_type, shape)`` of each graph output, in model order.

    Raises
    ------
    TypeError
        A source that is not a path or bytes, or `free_dimensions` naming no input or not
        fitting an input's shape signature.
    FileNotFoundError
        No file at the path given.
    mltensor.NotSupportedError
        An unsupported operator (named with its index and the supported ones) or input type.
    mltensor.DataError
        A malformed or truncated file, naming the file (when given by path), the table / field
        or operator, and what was wrong.
    """
    name = os.path.basename(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else None
    model = read(load_bytes(source), name)
    b = MLGraphBuilder(context)
    with _named(name):
        outs, inputs, outputs = convert(model, b, free_dimensions, float16, initial_state)
    graph = b.build_sync(outs)
    return graph, inputs, outputs


def import_stages(
    source: Any,
    context: Any,
    *,
    free_dimensions: Mapping[str, Any] | None = None,
    float16: bool = False,
    initial_state: Mapping[str, Any] | None = None,
    build: Any = None,
) -> tuple[Any, ...]:
    """As `import_model`, for InferenceSession: a model whose control flow is decided at run time
    (a WHILE whose trip count, an IF whose output shapes only a run gives) is imported up to
    there as the first of a chain of stages (staged.py). Returns (staged.Imported: its graph,
    inputs, outputs and cut, None when the whole model is one graph; the model's own inputs and
    outputs as IOInfo lists). build: how a stage's graph is made (staged.import_stage)."""
    name = os.path.basename(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else None
    model = read(load_bytes(source), name)
    with _named(name):
        first = staged.import_stage(model, context, free_dimensions, float16, initial_state=initial_state, build=build)
        return first, *staged.model_io(model, free_dimensions)


def resume_stage(snapshot: Any, context: Any, build: Any = None) -> Any:
    """The stage after a cut (the session's next_stage): staged.resume_stage."""
    return staged.resume_stage(snapshot, context, build)


@contextmanager
def _named(name: str | None) -> Iterator[None]:
    """Errors naming the file, when it was given by path."""
    try:
        yield
    except (DataError, NotSupportedError) as e:
        if name is None:
            raise
        msg = str(e)
        raise type(e)(f"[tflite] {name}: {msg[len('[tflite] ') :] if msg.startswith('[tflite] ') else msg}") from None


__all__ = ["import_model", "is_tflite", "supported_operators"]
