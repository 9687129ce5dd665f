"""Read a .tflite flatbuffer (with the `tflite` package) into plain Python objects.

Only what the importer needs: tensors (name, type, shape, signature, constant data, quantization)
and operators (name, custom code, inputs, outputs, options table, custom options bytes) of the
first subgraph.
"""

import os
from dataclasses import dataclass, field

import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

from ..errors import DataError

IDENTIFIER = b"TFL3"

# TFLite TensorType -> (WebNN data type or None, numpy dtype)
TENSOR_TYPES = {
    tflite.TensorType.FLOAT32: ("float32", np.float32),
    tflite.TensorType.FLOAT16: ("float16", np.float16),
    tflite.TensorType.INT32: ("int32", np.int32),
    tflite.TensorType.UINT8: ("uint8", np.uint8),
    tflite.TensorType.INT64: ("int64", np.int64),
    tflite.TensorType.INT8: ("int8", np.int8),
    tflite.TensorType.UINT32: ("uint32", np.uint32),
    tflite.TensorType.UINT64: ("uint64", np.uint64),
    tflite.TensorType.INT16: (None, np.int16),
    tflite.TensorType.BOOL: (None, np.bool_),
    tflite.TensorType.FLOAT64: (None, np.float64),
}
TYPE_NAMES = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}


@dataclass
class Tensor:
    index: int
    name: str
    type: int  # tflite.TensorType
    shape: tuple
    signature: tuple  # shape_signature: -1 marks a free dimension
    data: np.ndarray = None  # constant value (in the tensor's shape), None for activations
    scale: np.ndarray = None  # quantization (None when not quantized)
    zero_point: np.ndarray = None
    quantized_dimension: int = 0

    @property
    def data_type(self):
        return TENSOR_TYPES.get(self.type, (None, None))[0]

    @property
    def type_name(self):
        return TYPE_NAMES.get(self.type, str(self.type))


@dataclass
class Operator:
    index: int
    name: str  # builtin name ("CONV_2D") or "CUSTOM"
    custom_code: str  # custom operators' code ("Convolution2DTransposeBias"), else None
    version: int
    inputs: list  # tensor indices, -1 for an omitted optional input
    outputs: list
    options: object = None  # the builtin options table (tflite.*Options), or None
    custom_options: bytes = b""

    @property
    def display(self):
        return f"CUSTOM '{self.custom_code}'" if self.custom_code is not None else self.name


@dataclass
class Model:
    tensors: list
    operators: list
    inputs: list  # tensor indices
    outputs: list
    description: str = ""
    extra: dict = field(default_factory=dict)


def load_bytes(source):
    """A path (str / os.PathLike), bytes, bytearray or memoryview -> bytes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read()
    raise TypeError(f"[tflite] expected a path, bytes or bytearray, got {type(source).__name__}")


def is_tflite(data):
    """True when `data` carries the TFLite flatbuffer identifier (bytes 4..8 == b"TFL3")."""
    return len(data) >= 8 and bytes(data[4:8]) == IDENTIFIER


# Builtin options: the union type number -> the options class (by name, as in the schema).
_OPTION_CLASSES = {
    v: getattr(tflite, k)
    for k, v in vars(tflite.BuiltinOptions).items()
    if not k.startswith("_") and hasattr(tflite, k)
}


def _options(op):
    t = op.BuiltinOptionsType()
    if t == 0:
        return None
    table = op.BuiltinOptions()
    cls = _OPTION_CLASSES.get(t)
    if table is None or cls is None:
        return None
    opt = cls()
    opt.Init(table.Bytes, table.Pos)
    return opt


def _buffer_data(model, raw, index):
    if index <= 0 or index >= model.BuffersLength():
        return None
    buf = model.Buffers(index)
    off, size = buf.Offset(), buf.Size()
    if off > 1:  # large models keep buffers after the flatbuffer
        return raw[off : off + size] if size else None
    if buf.DataLength() == 0:
        return None
    return buf.DataAsNumpy().tobytes()


def read(raw):
    """Parse the flatbuffer bytes `raw` into a Model."""
    if not is_tflite(raw):
        head = bytes(raw[4:8])
        raise DataError(f"[tflite] not a TFLite flatbuffer: file identifier is {head!r}, expected b'TFL3'")
    try:
        m = tflite.Model.GetRootAsModel(raw, 0)
        n_sub = m.SubgraphsLength()
    except Exception as e:  # malformed flatbuffer
        raise DataError(f"[tflite] cannot parse the model: {e}") from e
    if n_sub < 1:
        raise DataError("[tflite] the model has no subgraph")
    sg = m.Subgraphs(0)

    tensors = []
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        sig = tuple(int(d) for d in t.ShapeSignatureAsNumpy()) if t.ShapeSignatureLength() else shape
        name = (t.Name() or b"").decode("utf-8", "replace")
        tt = Tensor(i, name, t.Type(), shape, sig)
        data = _buffer_data(m, raw, t.Buffer())
        if data is not None:
            np_type = TENSOR_TYPES.get(t.Type(), (None, None))[1]
            if np_type is None:
                raise DataError(f"[tflite] constant tensor {i} ('{name}') has unsupported type {tt.type_name}")
            arr = np.frombuffer(data, dtype=np.dtype(np_type).newbyteorder("<"))
            n = int(np.prod(shape)) if shape else 1
            if arr.size != n:
                raise DataError(
                    f"[tflite] constant tensor {i} ('{name}') holds {arr.size} values, its shape {list(shape)} needs {n}"
                )
            tt.data = arr.astype(np_type).reshape(shape)
        q = t.Quantization()
        if q is not None and q.ScaleLength():
            tt.scale = q.ScaleAsNumpy().astype(np.float32)
            tt.zero_point = (
                q.ZeroPointAsNumpy().astype(np.int64) if q.ZeroPointLength() else np.zeros_like(tt.scale, np.int64)
            )
            tt.quantized_dimension = q.QuantizedDimension()
        tensors.append(tt)

    codes = []
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        name = BUILTIN_OPCODE2NAME.get(code, f"BUILTIN_{code}")
        custom = oc.CustomCode()
        codes.append((name, custom.decode("utf-8", "replace") if custom is not None else None, oc.Version()))

    ops = []
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        name, custom, version = codes[op.OpcodeIndex()]
        ins = [int(x) for x in op.InputsAsNumpy()] if op.InputsLength() else []
        outs = [int(x) for x in op.OutputsAsNumpy()] if op.OutputsLength() else []
        copts = op.CustomOptionsAsNumpy().tobytes() if op.CustomOptionsLength() else b""
        ops.append(
            Operator(i, name, custom if name == "CUSTOM" else None, version, ins, outs, _options(op), copts)
        )

    inputs = [int(x) for x in sg.InputsAsNumpy()] if sg.InputsLength() else []
    outputs = [int(x) for x in sg.OutputsAsNumpy()] if sg.OutputsLength() else []
    desc = (m.Description() or b"").decode("utf-8", "replace")
    return Model(tensors, ops, inputs, outputs, desc)
