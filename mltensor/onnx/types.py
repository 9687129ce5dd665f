"""ONNX element types <-> the WebNN data types that carry them, and host arrays.

ONNX types WebNN lacks are carried as: double -> float32, bool -> uint8, int16/uint16 ->
int32/uint32 (WEBNN_TYPE; storage_array converts a host constant the same way).
"""

import numpy as np
from onnx import TensorProto, helper

from ..dynamic.dims import Sym


# ONNX element type -> WebNN data type of the operand that carries it.
WEBNN_TYPE = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.DOUBLE: "float32",
    TensorProto.INT32: "int32",
    TensorProto.UINT32: "uint32",
    TensorProto.INT64: "int64",
    TensorProto.UINT64: "uint64",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.BOOL: "uint8",
    TensorProto.INT16: "int32",
    TensorProto.UINT16: "uint32",
}
_NP_TO_STORAGE = {
    np.dtype(np.float64): np.float32,
    np.dtype(np.bool_): np.uint8,
    np.dtype(np.int16): np.int32,
    np.dtype(np.uint16): np.uint32,
}


def onnx_type_of_np(dtype):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def storage_array(a):
    """A host constant in the dtype of the WebNN operand that carries its ONNX type."""
    a = np.asarray(a)
    to = _NP_TO_STORAGE.get(a.dtype)
    if to is not None:
        a = a.astype(to)
    return a


# Host arrays the importer may create at load (folded constants, expanded shapes): a corrupt
# dimension must fail cleanly, not allocate gigabytes (2**28 elements = 1 GiB of float32).
MAX_HOST_ELEMENTS = 1 << 28


def prod(dims):
    """The number of elements of a shape (a Sym when it holds dynamic dimensions)."""
    n = 1
    for d in dims:
        n *= d if isinstance(d, Sym) else int(d)
    return n
