"""Constants above the context's largest tensor (`ctx._max_bytes`, `op_support_limits()`
`["max_tensor_byte_length"]`: 128 MiB on lavapipe, WebGPU's default max storage buffer binding
size): GPT-2's and RoBERTa's 50k x 768 float32 word tables (147 MiB), VGG's first fully
connected layer. The builder refuses such a constant (WebNN's TypeError), so the importer never
makes one: the readers that can be rewritten onto blocks of it read those instead, each block a
constant that fits.

- Gather on axis 0 (an embedding lookup, `gather`): one gather per row block, the indices offset
  and clamped into the block, the block that holds each index selected (`where` on the index
  range). Indices stay dynamic, negative ones count from the end as ONNX says.
- MatMul / Gemm with the constant as B in either orientation (`[K, N]`, or `[N, K]` with transB;
  the LM head tied to the word table reads its transpose, folded on the host at import): one
  product per column block of the output, concatenated along the last axis (onnx/ops/matmul.py).
  The compiler may run the blocks as one GEMM (compiler/fusion/gemm_views.py merges matmuls of
  one A): each block stays its own storage binding there, so none is bound above the limit.
- Any other reader fails at import with the node's name and the limit (the builder's TypeError,
  Importer.fail).

Tests lower the limit of one context by setting `ctx._max_bytes` (tests/test_onnx_big_constants.py).
"""

import numpy as np

from ... import dtypes
from ..errors import unsupported
from ._helpers import reshape, X


def byte_length(w, like=None):
    """Bytes of host array `w` as the importer would upload it (a float weight takes the data type
    of the operand it meets: Importer.operand)."""
    dt = w.dtype
    if like is not None and dt.kind == "f" and like.data_type in ("float32", "float16"):
        dt = np.dtype(dtypes.NUMPY[like.data_type])
    return w.size * dt.itemsize


def oversize(im, w, like=None):
    """Whether host array `w` would be a constant above the context's largest tensor."""
    return isinstance(w, np.ndarray) and byte_length(w, like) > im.ctx._max_bytes


def blocks(n, unit, limit, what):
    """[(lo, hi)] splitting range(n) into as few blocks of whole units (`unit` bytes each: a row
    or a column) as keep each block within `limit` bytes, their sizes as equal as can be."""
    per = limit // unit
    if per < 1:
        unsupported(f"{what}: one row of {unit} bytes exceeds max_tensor_byte_length {limit}")
    count = -(-n // per)
    step = -(-n // count)  # <= per
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def gather_rows(im, table, indices):
    """gather(table, indices, axis=0) of host array `table` above the limit, on row blocks."""
    b = im.b
    rows = table.shape[0]
    unit = byte_length(table) // rows
    parts = blocks(rows, unit, im.ctx._max_bytes, "Gather of a constant table")
    idx = X(im, indices)
    dt = dtypes.NUMPY[idx.data_type]

    def k(v):
        return b.constant(np.array(v, dtype=dt))

    # negative indices count from the end (ONNX); WebNN's gather would too, but the offsets
    # below need the row number
    i = b.where(b.lesser(idx, k(0)), b.add(idx, k(rows)), idx)
    # the selection broadcasts over the gathered rows' trailing axes
    sel_shape = list(idx.shape) + [1] * (table.ndim - 1)
    out = None
    for lo, hi in parts:
        local = b.clamp(b.sub(i, k(lo)) if lo else i, min_value=0, max_value=hi - lo - 1)
        g = b.gather(X(im, np.ascontiguousarray(table[lo:hi])), local, axis=0)
        out = g if out is None else b.where(reshape(im, b.greater_or_equal(i, k(lo)), sel_shape), g, out)
    return out
