"""ONNX importer: `import_model(source, context)` turns an ONNX model into an MLGraph.

    graph, inputs, outputs = mltensor.onnx.import_model("model.onnx", ctx, free_dimensions={"batch": 1})

`inputs`/`outputs` are lists of (name, data_type, shape) in WebNN terms. ONNX types WebNN lacks
are carried as: double -> float32, bool -> uint8, int16/uint16 -> int32/uint32 (InferenceSession
converts them back). int64 stays int64 with its full range (see mltensor/dtypes.py).
See importer.py for the pipeline (the node loop; model.py loads and describes the model,
folding.py folds host constants, functions.py expands functions, batchnorm.py folds BatchNorm into
Conv, resume.py cuts and resumes a data-dependent import, errors.py and types.py are shared) and
ops/ (one module per operator family) for the operator mapping; `supported_ops()` lists the ONNX
operators with a handler (ops ONNX defines as functions of those are expanded too). A malformed
model raises mltensor.DataError, an unsupported construct mltensor.NotSupportedError
(UnsupportedError), a bug of ours on a model onnx.checker accepts mltensor.InternalError naming
the node (errors.py: model_errors).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .importer import Imported, IOInfo, UnsupportedError, import_onnx, load_model  # noqa: F401 (re-exported)
from .ops import supported_ops

if TYPE_CHECKING:
    from onnx import ModelProto

    from ..front.context import MLContext
    from ..front.graph import MLGraph

__all__ = ["import_model", "supported_ops", "UnsupportedError"]


def import_model(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview | ModelProto,
    context: MLContext,
    *,
    free_dimensions: Mapping[str, int] | None = None,
) -> tuple[MLGraph, list[tuple[str, str, tuple[int, ...]]], list[tuple[str, str, tuple[int, ...]]]]:
    """Load an ONNX model and build it on `context` as one MLGraph (for sizes that change per run,
    data-dependent shapes and ONNX types WebNN lacks, use `mltensor.InferenceSession`). Outputs
    folded to constants at load are still graph outputs (an identity of the constant).

    Parameters
    ----------
    source : str, os.PathLike, bytes, bytearray, memoryview or onnx.ModelProto
        The model: a path to an ``.onnx`` file (external data files beside it are mapped), its
        bytes, or a loaded ``onnx.ModelProto``.
    context : MLContext
        The context to build on.
    free_dimensions : dict of str to int, optional
        Sizes for the model's symbolic dimensions, by ``dim_param`` name (``{"batch": 1}``):
        every unknown dimension of an input must be fixed here.

    Returns
    -------
    graph : MLGraph
        The built graph, ready for `MLContext.dispatch`.
    inputs : list of tuple
        ``(name, data_type, shape)`` of each graph input, in model order, in WebNN terms.
    outputs : list of tuple
        ``(name, data_type, shape)`` of each graph output, in model order.

    Raises
    ------
    TypeError
        A source that is not a path, bytes or ModelProto, or an input dimension left unknown.
    FileNotFoundError
        No file at the path given.
    mltensor.DataError
        A malformed model.
    mltensor.NotSupportedError
        An operator, attribute or type the importer does not support (`UnsupportedError`),
        naming the node.
    mltensor.InternalError
        A bug of mltensor on a model ``onnx.checker`` accepts, naming the node.
    """
    imp = import_onnx(source, context, free_dimensions=free_dimensions, const_outputs_as_ops=True)
    ins = [(i.name, i.data_type, i.shape) for i in imp.inputs]
    outs = [(o.name, o.data_type, o.shape) for o in imp.outputs]
    return imp.graph, ins, outs
