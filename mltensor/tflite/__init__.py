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
IF and WHILE: control.py.
"""

import os

from ..errors import DataError, NotSupportedError
from ..front.builder import MLGraphBuilder
from .importer import convert, supported_operators
from .reader import is_tflite, load_bytes, read


def import_model(source, context, *, free_dimensions=None, float16=False, initial_state=None):
    """Load `source` (a path, bytes or bytearray of a .tflite file) and build it on `context`.

    free_dimensions: {input name: full shape} (or {"batch": n}) for inputs whose shape signature
    has free (-1) dimensions; by default the shape stored in the model is used.
    float16: compute the model in float16 (in f16 on a context with "shader-f16"): half the
    memory traffic, float16 precision; inputs and outputs keep the model's types.
    initial_state: a dict that receives {name: numpy array}, the initial state of a model with
    resource variables (tflite/control.py). Such a model's graph has one more input per variable
    it carries between calls (`control.STATE_PREFIX` + the variable's name: its value before the
    call) and one more output of the same name for each it assigns (its value after): feed each
    call the state the last one left, the initial values first. InferenceSession does this on
    the GPU (`reset_state()` starts over). With initial_state given, the variable tensors of
    UNIDIRECTIONAL_SEQUENCE_LSTM (its hidden and cell state, which LiteRT carries between
    invokes) are state as well; without it they are zeros at the start of each call.
    Returns (graph, inputs, outputs); unsupported operators raise NotSupportedError at load, naming
    the operator, its index and the supported ones; a malformed or truncated file raises DataError
    naming the file (when given by path), the table / field or operator, and what was wrong.
    """
    name = os.path.basename(os.fspath(source)) if isinstance(source, (str, os.PathLike)) else None
    model = read(load_bytes(source), name)
    b = MLGraphBuilder(context)
    try:
        outs, inputs, outputs = convert(model, b, free_dimensions, float16, initial_state)
    except (DataError, NotSupportedError) as e:
        if name is None:
            raise
        msg = str(e)
        raise type(e)(f"[tflite] {name}: {msg[len('[tflite] ') :] if msg.startswith('[tflite] ') else msg}") from None
    graph = b.build_sync(outs)
    return graph, inputs, outputs


__all__ = ["import_model", "is_tflite", "supported_operators"]
