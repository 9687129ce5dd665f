"""What the TFLite converters share: an operator's builtin options, its fused activation, errors
in the importer's format."""

import tflite

from ..errors import DataError, NotSupportedError

ACT = tflite.ActivationFunctionType
PAD = tflite.Padding


def op_error(op, msg, cls=DataError):
    """An error about operator `op`, in the importer's format."""
    return cls(f"[tflite] operator {op.index} ({op.display}): {msg}")


def opt(op, getter, default):
    """The builtin option `getter` of `op` (its FlatBuffers accessor name), or `default`."""
    o = op.options
    if o is None or not hasattr(o, getter):
        return default
    return getattr(o, getter)()


def activation(imp, op, y, code=None):
    """`y` through the operator's fused activation (or `code`)."""
    if code is None:
        code = opt(op, "FusedActivationFunction", ACT.NONE)
    b = imp.b
    if code == ACT.NONE:
        return y
    if code == ACT.RELU:
        return b.relu(y)
    if code == ACT.RELU6:
        return b.clamp(y, min_value=0.0, max_value=6.0)
    if code == ACT.RELU_N1_TO_1:
        return b.clamp(y, min_value=-1.0, max_value=1.0)
    if code == ACT.TANH:
        return b.tanh(y)
    raise NotSupportedError(
        f"[tflite] operator {op.index} ({op.display}): fused activation {code} is not supported "
        f"(supported: NONE, RELU, RELU6, RELU_N1_TO_1, TANH)"
    )
