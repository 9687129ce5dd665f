"""Grouped attention heads: K/V heads repeated by expand + reshape before the attention matmuls
(grouped-query attention exports) are read by the fused attention kernel as they are.

Emitter: ops/attention.py; runs after fusion/attention.py's fuse_attention (plan.plan_steps).
"""

from ...ops._index import is_one


def _lone_step(s, op):
    """Step s is a single non-constant `op` node without epilogue, prologue or gate."""
    return (
        s is not None
        and len(s.nodes) == 1
        and not s.epilogue
        and not s.const
        and s.prologue is None
        and not s.chain
        and s.source is None
        and s.nodes[0].op == op
        and len(s.outputs) == 1
    )


def _grouped_source(v, q, producer, single_use):
    """(kv, steps made redundant) when attention operand v ([.., H, S, D]) is K or V heads repeated
    for grouped-query attention by copies the attention kernel need not make: reshape(expand(
    reshape(kv [.., Hkv, S, D] -> [.., Hkv, 1, S, D]) -> [.., Hkv, H / Hkv, S, D]) -> [.., H, S, D])
    (transformers' repeat_kv), or expand(kv) along size-1 leading dimensions (one K/V head for all,
    or one batch entry); else None. Head h of v is kv head h // (H / Hkv), which is how
    ops/attention.py indexes a K/V operand with fewer heads."""
    r = v.rank
    if r < 3 or not single_use(v):
        return None
    st = producer.get(id(v))
    if _lone_step(st, "expand"):
        kv = st.nodes[0].inputs[0]
        if (
            kv.rank == r
            and tuple(kv.shape[-2:]) == tuple(v.shape[-2:])
            and all(is_one(a) or a == b for a, b in zip(kv.shape[:-2], v.shape[:-2]))
        ):
            return kv, [st]
        return None
    if not _lone_step(st, "reshape"):
        return None
    e = st.nodes[0].inputs[0]
    ex = producer.get(id(e))
    if not _lone_step(ex, "expand") or not single_use(e) or e.rank != r + 1:
        return None
    u = ex.nodes[0].inputs[0]
    r0 = producer.get(id(u))
    if not _lone_step(r0, "reshape") or not single_use(u):
        return None
    kv = r0.nodes[0].inputs[0]
    if kv.rank != r:
        return None
    lead, hkv, tail = tuple(kv.shape[:-3]), kv.shape[-3], tuple(kv.shape[-2:])
    rep = e.shape[-3]
    if (
        tuple(u.shape) != lead + (hkv, 1) + tail
        or tuple(e.shape) != lead + (hkv, rep) + tail
        or tuple(v.shape) != lead + (hkv * rep,) + tail
        or tuple(q.shape[:-2]) != tuple(v.shape[:-2])
    ):
        return None
    return kv, [st, ex, r0]


# The attention kernel reads the K/V heads a query-head group shares instead of their repeat
# copies (expand + reshape of grouped-query attention): on by default.
FUSE_GROUPED_HEADS = True


def fuse_grouped_heads(steps, single_use):
    """Let each fused attention read grouped K/V heads as they are (_grouped_source): the
    repeat copies go (FUSE_GROUPED_HEADS)."""
    if not FUSE_GROUPED_HEADS:
        return
    producer = {id(v): s for s in steps for v in s.outputs}
    for st in list(steps):
        n = st.nodes[0]
        if n.op != "_attention" or st.const or n.attrs.get("layout", "bhsd") != "bhsd":
            continue
        for slot in (1, 2):
            got = _grouped_source(n.inputs[slot], n.inputs[0], producer, single_use)
            if got is None or any(s not in steps for s in got[1]):
                continue
            n.inputs[slot] = got[0]
            for s in got[1]:
                steps.remove(s)
