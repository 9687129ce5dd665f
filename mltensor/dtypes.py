"""The eight WebNN data types, how they are stored on the GPU and how kernels compute on them.

Storage: 4-byte types are plain arrays; int64/uint64 are two 32-bit words (little endian);
float16 is 2 bytes an element (IEEE binary16, numpy's layout); int8 and uint8 are packed four to a
32-bit word. Buffers are rounded up to a multiple of 4 bytes.

Compute: kernels work on one WGSL scalar type per data type, its compute type (`compute_type`).
Graph inputs in a packed type are unpacked into a compute-form intermediate and outputs packed
back, at the graph's edges only, so each operator needs one kernel per compute type instead of one
per storage type. int8/uint8 compute in i32/u32.

float16: where the device has the WebGPU feature "shader-f16" (requested by the context when the
adapter offers it, unless MLTENSOR_DISABLE_F16=1) float16 computes in WGSL f16 and is native: its
storage is its compute form (array<f16>), bound in place, no edge conversion, 2 bytes an element in
every intermediate. Operators whose precision needs it (matmul, gemm, conv, reductions, softmax,
normalizations, pooling averages) load f16, accumulate in f32 and store f16, as WebNN
implementations do; transcendental functions are evaluated in f32 and rounded (shaders/common.wgsl
`f16_of`, which gives +-inf past 65504 like numpy's float16). Without the feature float16 is
unpacked to f32 at the edges and computed in f32 (more precise than the spec requires). The `f16`
flag of the functions below selects the native mode; the compiler passes the context's
(MLContext._f16).

int64/uint64 keep their full 64-bit range on every device and are bound in place (no edge
conversion). Where the device has the WebGPU feature "shader-int64" (requested by the context when
the adapter offers it) they compute natively in i64/u64. Otherwise they compute in "i64e"/"u64e":
two 32-bit words (vec2<u32>, low word first, exactly the storage form) with the arithmetic,
comparisons and conversions of shaders/int64e.wgsl, spelled by runtime/wgsl.py (binop, compare,
unop, convert, lit). The `int64` flag of the functions below selects native 64-bit integers; the
compiler passes the context's (MLContext._int64).
"""

import math
from typing import Any

import numpy as np

NUMPY: dict[str, np.dtype[Any]] = {
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

# WGSL type each data type is computed in on a device without native 64-bit integers (use
# compute_type(), which also knows the native 64-bit mode). i64e/u64e are emulated (see above).
COMPUTE = {
    "float32": "f32",
    "float16": "f32",
    "int32": "i32",
    "int64": "i64e",
    "int8": "i32",
    "uint32": "u32",
    "uint64": "u64e",
    "uint8": "u32",
}
COMPUTE_INT64 = dict(COMPUTE, int64="i64", uint64="u64")
# Data types whose storage is the compute type itself (no edge conversion needed); float16 too
# when it computes in f16 (is_native).
NATIVE = ("float32", "int32", "uint32", "int64", "uint64")
# WGSL float compute types: kernels test `t in FLOAT_COMPUTE` where float semantics differ from
# integer ones (division, NaN, clamp bounds).
FLOAT_COMPUTE = ("f32", "f16")
# numpy dtype of each compute type, used for constants uploaded in compute form.
COMPUTE_NUMPY = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "i32": np.dtype(np.int32),
    "u32": np.dtype(np.uint32),
    "i64": np.dtype(np.int64),
    "u64": np.dtype(np.uint64),
    "i64e": np.dtype(np.int64),
    "u64e": np.dtype(np.uint64),
}

# Value range of each integer compute type.
INT_RANGE = {
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u64": (0, 2**64 - 1),
    "i64e": (-(2**63), 2**63 - 1),
    "u64e": (0, 2**64 - 1),
}


def compute_type(data_type, int64=False, f16=False):
    """The WGSL type kernels compute `data_type` in: f32, i32, u32, for int64/uint64 i64/u64
    with native 64-bit integers (int64=True, the device has "shader-int64"), else the emulated
    i64e/u64e, and for float16 f16 when f16=True (the context uses "shader-f16"), else f32. The
    single source of truth for the compiler (KernelContext.wtype) and constants."""
    if f16 and data_type == "float16":
        return "f16"
    return (COMPUTE_INT64 if int64 else COMPUTE)[data_type]


def is_native(data_type, f16=False):
    """True when `data_type` is stored in its compute form: bound in place, no edge conversion."""
    return data_type in NATIVE or (f16 and data_type == "float16")


def compute_itemsize(data_type, f16=False):
    """Bytes per element of the compute form: 4, 8 for int64/uint64 (native or emulated), 2 for
    float16 computed in f16."""
    return COMPUTE_NUMPY[compute_type(data_type, f16=f16)].itemsize


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
    return math.prod(shape) * itemsize(data_type)


def padded(nbytes: int) -> int:
    """Buffer size for a byte length: a multiple of 4, at least 4 (WebGPU copy alignment)."""
    return max(4, (nbytes + 3) & ~3)


def to_compute_numpy(data_type, array, f16=False):
    """Host array of `data_type` converted to the form kernels compute on (see compute_type)."""
    cdt = COMPUTE_NUMPY[compute_type(data_type, f16=f16)]  # the same numpy type in both 64-bit modes
    return np.asarray(array, dtype=NUMPY[data_type]).astype(cdt, copy=False)
