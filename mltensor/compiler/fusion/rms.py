"""RMS normalization written as a chain of small operators (Pow / ReduceMean / Add / Sqrt /
Reciprocal / Mul, as exporters write RMSNorm) becomes one internal `_rms_normalization` node
(rewrite_rms); opt-in (RMS_PROLOGUE), GEMMs reading it compute it as they load A.

Emitter: ops/normalization.py `_rms_normalization`; shader hook: shaders/matmul.wgsl `fused_rms`.
"""

import math

from ...ir.graph import Node, scalar_value
from ..steps import Uses, other_operand
from .gemm_views import DigitView, FusedPlan, Leaf, Segment, plain_b


def _rms_chain(n, uses):
    """(x, scale or None, axes, epsilon, nodes of the chain, output) when reduce_mean node `n`
    begins an RMS normalization as exporters write it:
        ms = reduce_mean(x * x or pow(x, 2), axes, keeping them)
        r  = 1 / sqrt(ms + eps)  as reciprocal(sqrt(.)), div(1, sqrt(.)) or pow(., -0.5)
        y  = x * r  (or x / sqrt(ms + eps))
        [y = y * scale]  (either operand order; scale varies along the normalized axes only)
    with every intermediate read only by the next node; else None."""
    sq = n.inputs[0]
    sn = uses.prod.get(id(sq))
    if sn is None or not uses.only(sq, n) or sq.data_type not in ("float32", "float16"):
        return None
    if sn.op == "mul" and sn.inputs[0] is sn.inputs[1]:
        x = sn.inputs[0]
    elif sn.op == "pow" and scalar_value(sn.inputs[1]) == 2.0:
        x = sn.inputs[0]
    else:
        return None
    ms = n.outputs[0]
    if ms.rank != x.rank or x.data_type != sq.data_type:
        return None
    axes = tuple(n.attrs["axes"])
    chain = [sn, n]
    add = uses.sole(ms)
    if add is None or add.op != "add":
        return None
    eps = scalar_value(other_operand(add, ms))
    if eps is None or eps < 0:
        return None
    chain.append(add)
    v = add.outputs[0]
    nx = uses.sole(v)
    if nx is None:
        return None
    y = None
    if nx.op == "pow" and nx.inputs[0] is v and scalar_value(nx.inputs[1]) == -0.5:
        chain.append(nx)
        r = nx.outputs[0]
    elif nx.op == "sqrt":
        chain.append(nx)
        s = nx.outputs[0]
        m = uses.sole(s)
        if m is None:
            return None
        if m.op == "reciprocal":
            chain.append(m)
            r = m.outputs[0]
        elif m.op == "div" and m.inputs[1] is s and scalar_value(m.inputs[0]) == 1.0:
            chain.append(m)
            r = m.outputs[0]
        elif m.op == "div" and m.inputs[0] is x and m.inputs[1] is s:
            chain.append(m)
            y = m.outputs[0]
        else:
            return None
    else:
        return None
    if y is None:
        m = uses.sole(r)
        if m is None or m.op != "mul" or other_operand(m, r) is not x:
            return None
        chain.append(m)
        y = m.outputs[0]
    if tuple(y.shape) != tuple(x.shape) or y.data_type != x.data_type:
        return None
    scale = None
    m = uses.sole(y)
    if m is not None and m.op == "mul":
        w = other_operand(m, y)
        z = m.outputs[0]
        pshape = tuple(x.shape[a] for a in axes)
        if (
            w is not None
            and w.data_type == x.data_type
            and tuple(z.shape) == tuple(x.shape)
            and w.rank <= x.rank
            and math.prod(w.shape) == math.prod(pshape)
            and all(d == 1 for d in ((1,) * (x.rank - w.rank) + tuple(w.shape))[: min(axes)])
            and tuple(d for d in w.shape if d != 1) == tuple(d for d in pshape if d != 1)
            and list(axes) == list(range(min(axes), x.rank))
        ):
            scale, y = w, z
            chain.append(m)
    return x, scale, axes, eps, chain, y


def rewrite_rms(nodes, uses):
    """RMS normalization chains (_rms_chain) -> one _rms_normalization node each."""
    out, drop, put = [], set(), {}
    for n in nodes:
        if n.op != "reduce_mean" or id(n) in drop:
            continue
        found = _rms_chain(n, uses)
        if found is None:
            continue
        x, scale, axes, eps, chain, y = found
        # (a scale shaped [1, .., C] is read as [C]: the same elements in the same order; the
        # lowering indexes it by the normalized dimensions)
        node = Node("_rms_normalization", [x, scale, None], {"axes": axes, "epsilon": eps}, chain[-1].label)
        node.outputs = [y]
        drop.update(id(c) for c in chain)
        put[id(chain[-1])] = node
    for n in nodes:
        if id(n) in put:
            out.append(put[id(n)])
        elif id(n) not in drop:
            out.append(n)
    return out


# Off: the GEMMs computing the normalization they read (rms_prologues) measured 10-13% slower
# on lavapipe (Llama-style layer, hidden 1024: 357 -> 397 ms for the SwiGLU GEMM of a 128-token
# prompt, 29 -> 32 ms for its decode-step GEMV: the staged rows' sums of squares and a load of
# the scale per k cost more than the normalization kernel they save, about 0.3 ms there). On a
# GPU the GEMV would hide both behind the weights' stream; unmeasured: switch it on where a GPU
# run shows it pays (tests/test_fusion_transformer.py checks it). Remeasured with the DIRECT tile
# (lavapipe, RMSNorm + SwiGLU GEMM 1024 -> 2 x 2816, CPU time, A/B alternated): 1.06x for 128
# rows, 1.07x for 1 row: still off. An RMSNorm reading a GEMM's residual sum joins that GEMM
# instead (norm.py fuse_post_norms), which leaves only a model's first RMSNorm a kernel.
RMS_PROLOGUE = False


def rms_prologues(nodes, outputs, cap):
    """An RMS normalization over the last axis read only as the A operand of GEMMs (matmuls with
    one [K, N] B, _fused_matmul nodes reading it as it is) is computed by each of them as it
    loads A: the sum of squares of each row from the staged A tiles, the scale applied to B's
    rows, the row's factor 1 / sqrt(mean + eps) to the sums before the store (matmul.wgsl
    `fused_rms`); the normalized tensor is never written. Only where every reader takes it
    within the binding cap."""
    uses = Uses(nodes, outputs)
    put, drop = {}, set()
    for r in nodes:
        if r.op != "_rms_normalization":
            continue
        x, scale = r.inputs[0], r.inputs[1]
        h = r.outputs[0]
        if id(h) in uses.out_ids or tuple(r.attrs["axes"]) != (x.rank - 1,) or not uses.readers(h):
            continue
        new = []
        for n in uses.readers(h):
            if n.op == "matmul" and n.inputs[0] is h and n.inputs[1] is not h and plain_b(n) and id(n) not in put:
                seg = Segment(
                    "plain", [n], [], n.outputs[0], [Leaf(DigitView(n.outputs[0].shape), [n.outputs[0]])], [n]
                )
                plan = FusedPlan([seg], h, None)
                base = Node("_fused_matmul", [h, n.inputs[1]], {"plan": plan}, n.label)
                base.outputs = list(n.outputs)
            elif (
                n.op == "_fused_matmul"
                and n.inputs[0] is h
                and n.attrs["plan"].a_view is None
                and n.attrs["plan"].rms is None
                and all(v is not h for v in n.inputs[1:])
                and id(n) not in put
            ):
                base, plan = n, n.attrs["plan"]
            else:
                break
            narrow = any(s.width <= 16 for s in plan.segments)  # (one thread a row of a tile: TX >= RM)
            if narrow or len(base.inputs) + len(base.outputs) + (scale is not None) > cap:
                break
            p2 = FusedPlan(plan.segments, plan.a, None, (scale, r.attrs["epsilon"]))
            node = Node(
                "_fused_matmul",
                [x] + base.inputs[1:] + ([scale] if scale is not None else []),
                {"plan": p2},
                base.label,
            )
            node.outputs = list(base.outputs)
            new.append((n, node))
        else:
            for n, node in new:
                put[id(n)] = node
            drop.add(id(r))
    if not put:
        return nodes
    return [put.get(id(n), n) for n in nodes if id(n) not in drop]
