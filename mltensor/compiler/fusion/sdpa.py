"""The forms exporters give scaled dot-product attention, rewritten into the chain that
compiler/fusion/attention.py recognises (node rewrites: plan.rewrite_nodes runs them first).

- Scales on the operands: torch exports `scaled_dot_product_attention` as (q * s) @ (k^T * s),
  s = 1 / sqrt(sqrt(D)), and other exporters scale q alone or divide k. Each matmul whose
  operands are such scalings of values read only there becomes matmul(q, k^T) * (s_q * s_k): one
  scalar scale after the matmul, the attention kernel's scale (any other matmul takes it as an
  epilogue, the elementwise launches of the scalings gone either way).
- A mask added as a where of two constants, scores + where(cond, 0, c) with c = -inf (or, in
  float32, as negative as finfo.min, where adding a finite score gives c back exactly): becomes
  where(cond, scores, c), which the attention kernel reads as its condition: the mask's float
  tensor is never computed.

Emitter: ops/attention.py `_attention` (through compiler/fusion/attention.py).
"""

import math

import numpy as np

from ... import dtypes
from ...ir.graph import MLOperand, Node, scalar_value
from ..steps import Uses, other_operand

FLOAT = ("float32", "float16")
# a float32 constant this negative absorbs any finite score below 2**100 exactly (its ulp is
# 2**104), as the unfused add would
ABSORBING = -1e37


def _scaling(x, uses, mm):
    """(value, factor) when x = value * c or value / c (c a host scalar) read only by matmul
    `mm`, else None."""
    n = uses.prod.get(id(x))
    if n is None or n.op not in ("mul", "div") or not uses.only(x, mm) or len(n.outputs) != 1:
        return None
    a, b = n.inputs
    if n.op == "div":
        c = scalar_value(b)
        return (a, 1.0 / c) if c not in (None, 0.0) and a is not b and a.shape == x.shape else None
    for v, k in ((a, b), (b, a)):
        c = scalar_value(k)
        if c is not None and v is not k and v.shape == x.shape:
            return v, c
    return None


def hoist_scales(nodes, uses):
    """matmul(x * a, y * b) -> matmul(x, y) * (a * b) (module doc); the node list, rewritten."""
    drop, out = set(), []
    for n in nodes:
        if n.op != "matmul" or n.outputs[0].data_type not in FLOAT:
            out.append(n)
            continue
        ins, factor, gone = list(n.inputs), 1.0, []
        for i, x in enumerate(n.inputs):
            s = None if i == 1 and n.inputs[1] is n.inputs[0] else _scaling(x, uses, n)
            if s is not None:
                ins[i], factor = s[0], factor * s[1]
                gone.append(uses.prod[id(x)])
        if not gone or not math.isfinite(factor) or factor == 0.0:
            out.append(n)
            continue
        drop.update(id(g) for g in gone)
        y = n.outputs[0]
        t = MLOperand(y._builder, y.data_type, y.shape, "op")
        mm = Node("matmul", ins, dict(n.attrs), n.label)
        mm.outputs = [t]
        t._node = mm
        c = MLOperand(y._builder, y.data_type, (), "constant", value=np.array(factor, dtypes.NUMPY[y.data_type]))
        mul = Node("mul", [t, c], {}, n.label)
        mul.outputs = [y]
        out += [mm, mul]
    return [n for n in out if id(n) not in drop]


def _absorbing(c, data_type):
    return c == -math.inf or (data_type == "float32" and c <= ABSORBING)


def where_masks(nodes, uses):
    """scores + where(cond, 0, c) -> where(cond, scores, c) (module doc); the node list."""
    out, rewritten = [], set()
    for n in nodes:
        if n.op != "add" or n.outputs[0].data_type not in FLOAT:
            out.append(n)
            continue
        hit = None
        for m in (n.inputs[1], n.inputs[0]):
            w = uses.prod.get(id(m))
            if w is None or w.op != "where":
                continue
            cond, tv, fv = w.inputs
            s = other_operand(n, m)
            if s is None or s.shape != n.outputs[0].shape or s.data_type != m.data_type:
                continue
            a, b = scalar_value(tv), scalar_value(fv)
            if a == 0.0 and b is not None and _absorbing(b, m.data_type):
                hit = (w, [cond, s, fv])
            elif b == 0.0 and a is not None and _absorbing(a, m.data_type):
                hit = (w, [cond, tv, s])
            if hit:
                break
        if hit is None:
            out.append(n)
            continue
        w, ins = hit
        rewritten.add(id(w.outputs[0]))
        nw = Node("where", ins, dict(w.attrs), n.label)
        nw.outputs = list(n.outputs)
        out.append(nw)
    # a mask where read by nothing else any more is dropped
    used = {id(x) for n in out for x in n.inputs if x is not None} | uses.out_ids
    return [n for n in out if not (n.op == "where" and id(n.outputs[0]) in rewritten and id(n.outputs[0]) not in used)]


def rewrite_sdpa(nodes, outputs):
    nodes = hoist_scales(nodes, Uses(nodes, outputs))
    return where_masks(nodes, Uses(nodes, outputs))
