"""The eight WebNN data types, how they are stored on the GPU and how kernels compute on them.

Storage: 4-byte types are plain arrays; int64/uint64 are two 32-bit words (little endian);
float16, int8 and uint8 are packed into array<u32> (two or four per word). Buffers are rounded up
to a multiple of 4 bytes.

Compute: every kernel works on 32-bit values (f32, i32, u32). Graph inputs in a packed or 64-bit
type are unpacked into a 32-bit intermediate and outputs packed back, at the graph's edges only,
so each operator needs one kernel per compute type instead of one per storage type. float16 is
therefore computed in float32 (more precise than the spec requires); int64/uint64 are computed in
32 bits (values must fit; the edge kernels sign/zero-extend).
"""

import numpy as np

NUMPY = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
}
ALL = tuple(NUMPY)
FLOATS = ("float32", "float16")
INTS = ("int32", "uint32", "int64", "uint64", "int8", "uint8")
SIGNED = ("float32", "float16", "int32", "int64", "int8")

# WGSL scalar type each data type is computed in.
COMPUTE = {
    "float32": "f32", "float16": "f32",
    "int32": "i32", "int64": "i32", "int8": "i32",
    "uint32": "u32", "uint64": "u32", "uint8": "u32",
}
# Data types whose storage is the compute type itself (no edge conversion needed).
NATIVE = ("float32", "int32", "uint32")
# numpy dtype of the compute type, used for constants uploaded in compute form.
COMPUTE_NUMPY = {"f32": np.dtype(np.float32), "i32": np.dtype(np.int32), "u32": np.dtype(np.uint32)}


def normalize(data_type, where="data_type"):
    """A WebNN data type name from its string or a numpy dtype (or type) of the same kind."""
    expected = f"expected one of {', '.join(ALL)}"
    if isinstance(data_type, str):
        if data_type in NUMPY:
            return data_type
        raise TypeError(f"[{where}] unknown data type {data_type!r}; {expected}")
    try:
        dt = np.dtype(data_type)
    except (TypeError, ValueError):
        raise TypeError(f"[{where}] {data_type!r} is not a data type; {expected}") from None
    for name, ndt in NUMPY.items():
        if ndt == dt:
            return name
    raise TypeError(f"[{where}] unsupported data type {dt}; {expected}")


def itemsize(data_type):
    return NUMPY[data_type].itemsize


def byte_length(data_type, shape):
    n = 1
    for d in shape:
        n *= d
    return n * itemsize(data_type)


def padded(nbytes):
    """Buffer size for a byte length: a multiple of 4, at least 4 (WebGPU copy alignment)."""
    return max(4, (nbytes + 3) & ~3)


def to_compute_numpy(data_type, array):
    """Host array of `data_type` converted to the 32-bit form kernels compute on."""
    cdt = COMPUTE_NUMPY[COMPUTE[data_type]]
    a = np.asarray(array, dtype=NUMPY[data_type])
    if data_type in ("int64", "uint64"):
        info = np.iinfo(cdt)
        if a.size and (a.min() < info.min or a.max() > info.max):
            raise TypeError(f"[constant] {data_type} values outside the 32-bit range are not supported")
    return a.astype(cdt)
