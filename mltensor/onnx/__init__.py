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

from .importer import Imported, IOInfo, UnsupportedError, import_onnx, load_model  # noqa: F401 (re-exported)
from .ops import supported_ops

__all__ = ["import_model", "supported_ops", "UnsupportedError"]


def import_model(source, context, *, free_dimensions=None):
    """Load an ONNX model (path, bytes or onnx.ModelProto) and build it on `context`.

    Returns (graph, inputs, outputs), inputs/outputs being lists of (name, data_type, shape).
    Outputs folded to constants at load are still graph outputs (an identity of the constant).
    """
    imp = import_onnx(source, context, free_dimensions=free_dimensions, const_outputs_as_ops=True)
    ins = [(i.name, i.data_type, i.shape) for i in imp.inputs]
    outs = [(o.name, o.data_type, o.shape) for o in imp.outputs]
    return imp.graph, ins, outs
