"""Sibling projections that do not fit one fused GEMM's bindings: matmuls of one A with constant
weights of one shape, each optionally plus a constant bias and times a constant scale (Whisper's
query), whose weights, biases and outputs
bound side by side (gemm_views.py's merged projections) exceed the binding cap, and whose values only reach
matmuls or graph outputs through layout nodes (head splits: no rotary embedding, no gated unit). Whisper's
self-attention (Q and V with biases, K without: 9 bindings), every decoder layer's
cross-attention K and V reading the encoder's output (T5: 4 weights and 4 outputs for 2 layers),
BERT's Q, K and V with their biases: gemm_views merged what fitted (Q + K) and launched the rest
apart.

merge_siblings makes them one matmul over the weights side by side (a copy of them, made once at
build, as split.py's blocks; the originals are then read by nothing) plus one bias (zeros for a
projection without one) times one scale (ones for one without: both exact), its output viewed [.., P, N] and each projection's value a slice of one
of the P rows reshaped back: gemm_views reads that as views of one GEMM's output (a slice of a
digit, as ViT's fused QKV), so the GEMM binds A, the weights, the bias and the P outputs. Runs in
plan.rewrite_nodes after split.py (which makes a sliced matmul blocks again) and before
gemm_views.py, only where the separate bindings exceed the cap (below it gemm_views merges them
without the copy).
"""

import numpy as np

from ...ir.graph import Node
from ..steps import Uses, host_constant, new_node, other_operand

FLOAT = ("float32", "float16")


def _vector(node, y, N):
    """The constant operand of binary `node` reading y, as a length-N vector (a scalar
    broadcast), when it broadcasts along y's last axis only and keeps y's shape; else None."""
    c = other_operand(node, y)
    if (
        c is None
        or c._kind != "constant"
        or not isinstance(c._value, np.ndarray)
        or c.data_type != y.data_type
        or c._value.size not in (1, N)
        or any(d != 1 for d in c.shape[:-1])
        or c.rank > y.rank
        or tuple(node.outputs[0].shape) != tuple(y.shape)
    ):
        return None
    return np.broadcast_to(c._value.reshape(-1), (N,))


def _views_only(y, uses):
    """Whether value y reaches only graph outputs and matmuls (the attention's), through layout
    nodes: a rotary embedding, a gated unit or an activation after it keeps its matmul apart
    (gemm_views fuses those over matmuls of their own)."""
    stack = [y]
    while stack:
        v = stack.pop()
        for r in uses.readers(v):
            if r.op in ("reshape", "transpose", "identity") or (r.op == "concat" and len(r.inputs) == 1):
                stack.extend(r.outputs)
            elif r.op != "matmul":
                return False
    return True


def _projection(n, uses):
    """(matmul n, [nodes after it], bias vector or None, scale vector or None, the value the
    projection ends in) for a matmul of a constant 2-D weight, then optionally `+ bias`, then
    optionally `* scale` (Whisper's query: (x Wq + bq) * D^-0.5), each a constant along the
    last axis; else None."""
    a, b = n.inputs[0], n.inputs[1]
    y = n.outputs[0]
    if a is None or a.data_type not in FLOAT or b.data_type != a.data_type or b.rank != 2 or a.rank < 2:
        return None
    if b._kind != "constant" or not isinstance(b._value, np.ndarray) or id(y) in uses.out_ids:
        return None
    N = b.shape[1]
    after, vec = [], {"add": None, "mul": None}
    for op in ("add", "mul"):
        r = uses.sole(y)
        if r is None or r.op != op:
            continue
        v = _vector(r, y, N)
        if v is None:
            break
        vec[op] = v
        after.append(r)
        y = r.outputs[0]
    if not _views_only(y, uses):
        return None
    return n, after, vec["add"], vec["mul"], y


def _merge(group, cap):
    """The chunks of `group` (projections of one A and weight shape) to merge: runs of as many as
    the cap allows (A, the weights, the bias, one output each), only where binding them apart
    would exceed it."""
    extras = [any(p[k] is not None for p in group) for k in (2, 3)]
    if len(group) < 2 or 1 + 2 * len(group) + sum(p[k] is not None for p in group for k in (2, 3)) <= cap:
        return []
    per = cap - 2 - sum(extras)
    chunks = [group[i : i + per] for i in range(0, len(group), per)]
    return [c for c in chunks if len(c) >= 2]


def merge_siblings(nodes, outputs, cap):
    """The node list with each oversize group of sibling projections one matmul (module doc)."""
    uses = Uses(nodes, outputs)
    groups = {}
    for n in nodes:
        if n.op != "matmul":
            continue
        p = _projection(n, uses)
        if p is not None:
            a, b = n.inputs
            groups.setdefault((id(a), tuple(b.shape), b.data_type), []).append(p)
    put, drop = {}, set()
    for group in groups.values():
        for chunk in _merge(group, cap):
            first = chunk[0][0]
            a, b0 = first.inputs
            K, N = b0.shape
            P = len(chunk)
            w = host_constant(b0, b0.data_type, np.concatenate([p[0].inputs[1]._value for p in chunk], axis=1))
            lead = tuple(a.shape[:-1])
            new = []
            mm, y = new_node("matmul", [a, w], {}, lead + (P * N,), a, first.label)
            new.append(mm)
            for k, op, fill in ((2, "add", 0), (3, "mul", 1)):  # (+ 0 and * 1: exact)
                if any(p[k] is not None for p in chunk):
                    dt = b0._value.dtype
                    vec = np.concatenate([p[k] if p[k] is not None else np.full(N, fill, dt) for p in chunk])
                    e, y = new_node(
                        op, [y, host_constant(b0, b0.data_type, vec.astype(dt))], {}, y.shape, y, first.label
                    )
                    new.append(e)
            rs, rows = new_node("reshape", [y], {}, lead + (P, N), y, first.label)
            new.append(rs)
            r = len(lead)
            for i, (n, after, _, _, v) in enumerate(chunk):
                starts = [0] * r + [i, 0]
                sizes = list(lead) + [1, N]
                attrs = {"starts": starts, "sizes": sizes, "strides": [1] * (r + 2)}
                sl, t = new_node("slice", [rows], attrs, lead + (1, N), rows, n.label)
                back = Node("reshape", [t], {}, n.label)
                back.outputs = [v]
                new += [sl, back]
                drop.update(id(m) for m in [n] + after)
            put[id(first)] = new
    if not put:
        return nodes
    out = []
    for n in nodes:
        if id(n) in put:
            out += put[id(n)]
        elif id(n) not in drop:
            out.append(n)
    return out
