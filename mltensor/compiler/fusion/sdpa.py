"""The forms exporters give scaled dot-product attention, rewritten into the chain that
compiler/fusion/attention.py recognises (node rewrites: plan.rewrite_nodes runs them first).

- Scales on the operands: torch exports `scaled_dot_product_attention` as (q * s) @ (k^T * s),
  s = 1 / sqrt(sqrt(D)), and other exporters scale q alone or divide k (before or after its
  transpose). Each matmul whose
  operands are such scalings of values read only there becomes matmul(q, k^T) * (s_q * s_k): one
  scalar scale after the matmul, the attention kernel's scale (any other matmul takes it as an
  epilogue, the elementwise launches of the scalings gone either way).
- Swin's shifted-window mask: scores [b, H, N, N] viewed as [b / nW, nW, H, N, N], plus a mask
  [1, nW, 1, N, N] per window, viewed back: becomes scores + the mask expanded to the b windows
  ([b, 1, N, N]; computed at build when the batch is static). A second bias added after a first
  (the relative position bias, then that mask) joins it: scores + (bias1 + bias2), one bias the
  attention kernel adds.
- A mask added as a where of two constants, scores + where(cond, 0, c) with c = -inf (or, in
  float32, as negative as finfo.min, where adding a finite score gives c back exactly): becomes
  where(cond, scores, c), which the attention kernel reads as its condition: the mask's float
  tensor is never computed.

Emitter: ops/attention.py `_attention` (through compiler/fusion/attention.py).
"""

import math

import numpy as np

from ... import dtypes
from ...ir.graph import Node, scalar_value
from ...ops._checks import broadcast_shapes
from ...ops._index import is_one
from ..steps import Uses, host_constant, new_node, other_operand, replace_each

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
    return replace_each(nodes, lambda n: _hoisted(n, uses), _scaled_matmul)


def _hoisted(n, uses):
    """(matmul's operands without their scalings, the scales' product, nodes made dead, layout
    nodes moved before the scalings) when matmul node n reads scaled operands; else None."""
    if n.op != "matmul" or n.outputs[0].data_type not in FLOAT:
        return None
    ins, factor, gone, moved = list(n.inputs), 1.0, [], []
    for i, x in enumerate(n.inputs):
        if i == 1 and n.inputs[1] is n.inputs[0]:
            continue
        s = _scaling(x, uses, n)
        lay = uses.prod.get(id(x))
        if s is None and lay is not None and lay.op in ("transpose", "reshape") and uses.only(x, n):
            # (the scaling before a layout node: MaxViT scales K, then transposes it)
            s = _scaling(lay.inputs[0], uses, lay)
            if s is not None:
                m, t = new_node(lay.op, [s[0]], dict(lay.attrs), x.shape, x, lay.label)
                moved.append(m)
                gone.append(lay)
                s = (t, s[1], uses.prod[id(lay.inputs[0])])
        elif s is not None:
            s = (s[0], s[1], uses.prod[id(x)])
        if s is not None:
            ins[i], factor = s[0], factor * s[1]
            gone.append(s[2])
    if not gone or not math.isfinite(factor) or factor == 0.0:
        return None
    return ins, factor, gone, moved


def _scaled_matmul(n, hit):
    ins, factor, gone, moved = hit
    y = n.outputs[0]
    mm, t = new_node("matmul", ins, dict(n.attrs), y.shape, y, n.label)
    mul = Node("mul", [t, host_constant(y, y.data_type, np.array(factor, dtypes.NUMPY[y.data_type]))], {}, n.label)
    mul.outputs = [y]
    return moved + [mm, mul], gone


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


def _window_mask(r2, uses):
    """(x, mask, [nodes replaced]) when reshape node r2 gives back the shape of x from
    reshape(x) + mask, the first reshape splitting x's first axis in two and mask [1, nW, ...]
    broadcasting to it (module doc); else None."""
    z = r2.inputs[0]
    a = uses.prod.get(id(z))
    if a is None or a.op != "add" or not uses.only(z, r2) or z.data_type not in FLOAT or z.rank < 3:
        return None
    for w, m in (a.inputs, a.inputs[::-1]):
        r1 = uses.prod.get(id(w))
        if r1 is None or r1.op != "reshape" or not uses.only(w, a) or w is m:
            continue
        x, s5 = r1.inputs[0], tuple(w.shape)
        if tuple(x.shape) != tuple(r2.outputs[0].shape) or len(s5) != x.rank + 1 or s5[2:] != tuple(x.shape[1:]):
            continue
        mp = (1,) * (len(s5) - m.rank) + tuple(m.shape)
        if m.rank > len(s5) or not is_one(mp[0]) or tuple(z.shape) != s5:
            continue
        if all(is_one(d) or d == e for d, e in zip(mp, s5)) and s5[0] * s5[1] == x.shape[0]:
            return x, m, mp, s5, [r1, a]
    return None


def window_masks(nodes, uses):
    """reshape(reshape(x) + mask) -> x + the mask expanded to x's first axis (module doc)."""

    def replace(n, hit):
        x, m, mp, s5, gone = hit
        r5, m5 = new_node("reshape", [m], {}, mp, m, n.label)
        if is_one(mp[1]):  # (one mask for every window: a plain broadcast)
            r4, m4 = new_node("reshape", [m5], {}, mp[1:], m, n.label)
            new = [r5, r4]
        else:
            big = (s5[0],) + mp[1:]
            ex, e5 = new_node("expand", [m5], {"new_shape": big}, big, m, n.label)
            r4, m4 = new_node("reshape", [e5], {}, (x.shape[0],) + mp[2:], m, n.label)
            new = [r5, ex, r4]
        add = Node("add", [x, m4], {}, n.label)
        add.outputs = list(n.outputs)
        return new + [add], gone

    return replace_each(nodes, lambda n: _window_mask(n, uses) if n.op == "reshape" else None, replace)


def _scores(v, uses):
    """v is a matmul's output, or one scaled by a host scalar (the attention's scores)."""
    p = uses.prod.get(id(v))
    if p is not None and p.op in ("mul", "div") and any(scalar_value(x) is not None for x in p.inputs):
        p = uses.prod.get(id(p.inputs[0]))
    return p is not None and p.op == "matmul"


def _two_biases(n, uses):
    """(first add, scores, b1, b2) when add node n is (scores + b1) + b2 read by a softmax only."""
    y = n.outputs[0]
    sm = uses.sole(y)
    if sm is None or sm.op != "softmax" or y.data_type not in FLOAT:
        return None
    for p, b2 in (n.inputs, n.inputs[::-1]):
        pa = uses.prod.get(id(p))
        if pa is None or pa.op != "add" or not uses.only(p, n) or p is b2:
            continue
        for sc, b1 in (pa.inputs, pa.inputs[::-1]):
            if sc is not b1 and tuple(sc.shape) == tuple(y.shape) and _scores(sc, uses):
                return pa, sc, b1, b2
    return None


def merge_biases(nodes, uses):
    """(scores + b1) + b2 -> scores + (b1 + b2) before a softmax (module doc)."""

    def replace(n, hit):
        pa, sc, b1, b2 = hit
        y = n.outputs[0]
        both, t = new_node("add", [b1, b2], {}, broadcast_shapes("add", b1.shape, b2.shape), y, n.label)
        add = Node("add", [sc, t], {}, n.label)
        add.outputs = [y]
        return [both, add], [pa]

    return replace_each(nodes, lambda n: _two_biases(n, uses) if n.op == "add" else None, replace)


def rewrite_sdpa(nodes, outputs):
    nodes = hoist_scales(nodes, Uses(nodes, outputs))
    nodes = window_masks(nodes, Uses(nodes, outputs))
    nodes = merge_biases(nodes, Uses(nodes, outputs))
    return where_masks(nodes, Uses(nodes, outputs))
