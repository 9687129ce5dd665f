"""Fused projections as exporters write them: Phi-3 keeps its Q, K and V weights in one matrix
(qkv_proj) and its gate and up weights in another (gate_up_proj), so the export is one matmul
whose output is sliced into columns (Slice or Split on the last axis) before the head split, the
rotary embedding or the gated unit. gemm_views.py fuses the rotary embedding and the gated unit
over separate matmuls of one A (Llama's form) and merges those back into one GEMM; a sliced
output never reaches those patterns. split_sliced_gemms gives every column block its own matmul
over that block of the constant weight, so the passes after it see the Llama form. Nothing is
computed twice (the blocks are disjoint), and gemm_views puts the blocks side by side in one GEMM
again (each block's weights its own binding: a copy of its columns, made once at build). Runs in plan.rewrite_nodes after
linear.py (matmuls in their real shapes) and before gemm_views.py.
"""

import numpy as np

from ...ir.graph import Node
from ..steps import host_constant, replace_each

FLOAT = ("float32", "float16")


def _blocks(n, uses):
    """[(column start, width, output value, node read)] when every reader of matmul n's output
    takes a block of its last axis, whole along the others (a slice of stride 1 or a split on
    the last axis), the blocks static; else None."""
    y = n.outputs[0]
    a, b = n.inputs[0], n.inputs[1]
    if a.data_type not in FLOAT or b.rank != 2 or b._kind != "constant" or not isinstance(b._value, np.ndarray):
        return None
    rs = uses.readers(y)
    if id(y) in uses.out_ids or not rs:
        return None
    r, blocks = y.rank, []
    for m in rs:
        if m.inputs[0] is not y or any(x is y for x in m.inputs[1:]):
            return None
        if m.op == "slice":
            st, sz, step = m.attrs["starts"], m.attrs["sizes"], m.attrs["strides"]
            if any(s != 1 for s in step) or any(st[d] != 0 or sz[d] != y.shape[d] for d in range(r - 1)):
                return None
            if not isinstance(st[-1], int) or not isinstance(sz[-1], int):
                return None
            blocks.append((st[-1], sz[-1], m.outputs[0], m))
        elif m.op == "split" and m.attrs["axis"] == r - 1 and all(isinstance(s, int) for s in m.attrs["sizes"]):
            lo = 0
            for size, v in zip(m.attrs["sizes"], m.outputs):
                blocks.append((lo, size, v, m))
                lo += size
        else:
            return None
    blocks.sort(key=lambda t: t[0])
    if len(blocks) < 2 or any(p[0] + p[1] > q[0] for p, q in zip(blocks, blocks[1:])):
        return None  # (overlapping blocks: their columns would be computed twice)
    return blocks


def split_sliced_gemms(nodes, uses):
    """The node list with each matmul whose output is only read in column blocks replaced by one
    matmul per block (module doc)."""

    def replace(n, blocks):
        x, b = n.inputs
        new = []
        for lo, width, v, m in blocks:
            w = host_constant(b, b.data_type, np.ascontiguousarray(b._value[:, lo : lo + width]))
            mm = Node("matmul", [x, w], {}, m.label)
            mm.outputs = [v]
            new.append(mm)
        return new, [m for *_, m in blocks]

    return replace_each(nodes, lambda n: _blocks(n, uses) if n.op == "matmul" else None, replace)
