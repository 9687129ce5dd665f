"""What InferenceSession needs of ONNX to run a graph, without importing the onnx package: ONNX
element type numbers, their onnxruntime type strings and numpy dtypes, IOInfo (a graph input or
output), how errors name a model source, the names of unknown input dimensions.

A session whose graph comes from the graph cache (session/cache.py) runs on these alone:
onnx is imported, and the model parsed, only when something is built (onnx/importer.py, which
re-exports these names).
"""

import os

import numpy as np

# onnx.TensorProto.DataType values (fixed by onnx.proto; tests/test_graph_cache.py checks them)
FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, STRING, BOOL, FLOAT16, DOUBLE, UINT32, UINT64 = range(1, 14)

ONNX_OF_WEBNN = {
    "float32": FLOAT,
    "float16": FLOAT16,
    "int32": INT32,
    "uint32": UINT32,
    "int64": INT64,
    "uint64": UINT64,
    "int8": INT8,
    "uint8": UINT8,
}
# onnxruntime's type strings, for NodeArg.type
TYPE_STRING = {
    FLOAT: "tensor(float)",
    FLOAT16: "tensor(float16)",
    DOUBLE: "tensor(double)",
    INT32: "tensor(int32)",
    UINT32: "tensor(uint32)",
    INT64: "tensor(int64)",
    UINT64: "tensor(uint64)",
    INT8: "tensor(int8)",
    UINT8: "tensor(uint8)",
    BOOL: "tensor(bool)",
    INT16: "tensor(int16)",
    UINT16: "tensor(uint16)",
}
# onnx.helper.tensor_dtype_to_np_dtype of the numeric types (the others ask onnx)
NUMPY = {
    FLOAT: np.dtype(np.float32),
    UINT8: np.dtype(np.uint8),
    INT8: np.dtype(np.int8),
    UINT16: np.dtype(np.uint16),
    INT16: np.dtype(np.int16),
    INT32: np.dtype(np.int32),
    INT64: np.dtype(np.int64),
    BOOL: np.dtype(np.bool_),
    FLOAT16: np.dtype(np.float16),
    DOUBLE: np.dtype(np.float64),
    UINT32: np.dtype(np.uint32),
    UINT64: np.dtype(np.uint64),
}


def np_dtype(onnx_type):
    """The numpy dtype of an ONNX element type, as onnx.helper.tensor_dtype_to_np_dtype gives it
    (KeyError for an unknown type)."""
    dt = NUMPY.get(onnx_type)
    if dt is None:
        from onnx import helper

        dt = np.dtype(helper.tensor_dtype_to_np_dtype(onnx_type))
    return dt


def source_name(source):
    """How errors name a model source: its path, or what it is."""
    if isinstance(source, (str, os.PathLike)):
        return repr(os.fspath(source))
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<ONNX bytes, {len(source)} bytes>"
    return "<onnx.ModelProto>"


def dim_name(input_name, axis, param):
    """The name of an input's unknown dimension: its dim_param, else "<input>_<axis>"."""
    return param or f"{input_name}_{axis}"


class IOInfo:
    """One graph input or output: name, ONNX element type, WebNN data type, static shape."""

    __slots__ = ("name", "onnx_type", "data_type", "shape", "const")

    def __init__(self, name, onnx_type, data_type, shape, const=None):
        self.name, self.onnx_type, self.data_type, self.shape = name, onnx_type, data_type, tuple(shape)
        self.const = const  # host value of an output folded at load (not computed by the graph)

    @property
    def np_dtype(self):
        return np_dtype(self.onnx_type)

    def __repr__(self):
        return f"<IOInfo {self.name} {TYPE_STRING.get(self.onnx_type)} {self.data_type} {list(self.shape)}>"
