"""Attention recognition (called by plan.plan_steps once the steps are planned).

The chain

    scores = matmul(Q, Kt) [* or / scalar constant] [+ bias]     (a matmul step and its epilogue)
    [scores = scores + bias] [where(cond, scores, c) or where(cond, c, scores)]   (one elementwise
                                                                  step; c a scalar constant)
    P = softmax(scores, last axis)
    [P = where(isnan(P), 0, P)]                                  (torch's SDPA export: a fully
                                                                  masked row gives 0, not NaN)
    out = matmul(P, V) [+ the P @ V step's own epilogue]

whose intermediates are read only inside it becomes one step running ops/attention.py's
`_attention` kernel: the Sq x Sk scores and probabilities are never written. (The bias joins the
matmul's epilogue when its shape lets it, else it forms an elementwise step with the where: a
dynamic mask length that only equals the scores' at dispatch.) Kt may be a transpose swapping
K's last two axes, read only here (the transpose launches nothing and the kernel reads K through
strides), or any [.., D, Sk] value (read as transposed). Q, Kt and V have rank 3, 4 or 5, their
batch dimensions Q's or 1 (matmul broadcasting: one K/V head for all query heads); grouped
heads expressed by expand + reshape of K/V are fused too, the expand copies staying. float32 and
float16. Sizes may be dynamic (Sq, Sk, batch); head sizes are static.

Not fused (left exactly as planned): any other order or extra node in the chain (a scale after
the bias, a where before the bias; two biases are one by then: sdpa.py merge_biases), a scale that is not one host constant, a where
whose other value is not one host constant, a softmax over another axis, intermediates read
elsewhere or graph outputs, mixed data types, an empty size, head sizes over
ops.attention.MAX_HEAD, and a kernel that would bind more than the binding cap.
MLTENSOR_NO_ATTENTION=1 turns the pass off (for comparison; MLTENSOR_NO_FUSION=1 too).
"""

from ...dynamic.dims import Sym, low
from ...ir.graph import Node, scalar_value
from ...ops.attention import FLOAT, MAX_HEAD
from ...switches import switch
from ..steps import Step, epilogue_operands


# MLTENSOR_NO_ATTENTION=1 leaves the chain as planned (the steps fusion makes without this pass),
# for comparison
def enabled():
    return not switch("MLTENSOR_NO_ATTENTION")


def _broadcasts(shape, target):
    """`shape` broadcasts to `target`: each size 1 or equal; dynamic sizes that differ by name
    were unified by the builder's broadcasting and are checked equal at dispatch."""
    if len(shape) > len(target):
        return False
    return all(
        (isinstance(a, int) and a == 1) or a == b or isinstance(a, Sym) or isinstance(b, Sym)
        for a, b in zip(reversed(shape), reversed(target))
    )


def _elementwise(step):
    """`step` is a plain non-constant elementwise group."""
    return (
        step is not None
        and not step.epilogue
        and not step.const
        and step.prologue is None
        and not step.chain
        and step.source is None
        and len(step.outputs) == 1
    )


def _parse_post(e, producer):
    """(scores, bias, cond, where value, where keeps the scores) when elementwise step `e` is
    [add(scores, bias)] then [where(cond, ., scalar) or where(cond, scalar, .)], the scores made
    by a matmul step; else None."""
    if not _elementwise(e):
        return None
    ns = e.nodes
    ops = [n.op for n in ns]
    if ops not in (["add"], ["where"], ["add", "where"]):
        return None
    cond, wv, keeps = None, None, True
    if ops[-1] == "where":
        cond, tv, fv = ns[-1].inputs
        if scalar_value(fv) is not None and tv is not fv:
            inner, wv = tv, scalar_value(fv)
        elif scalar_value(tv) is not None and fv is not tv:
            inner, wv, keeps = fv, scalar_value(tv), False
        else:
            return None
        if cond.data_type != "uint8" or not _broadcasts(tuple(cond.shape), tuple(ns[-1].outputs[0].shape)):
            return None
    else:
        inner = ns[-1].outputs[0]
    if ops[0] != "add":
        return inner, None, cond, wv, keeps
    add = ns[0]
    if len(ns) == 2 and inner is not add.outputs[0]:
        return None
    a, b = add.inputs
    for sc, bias in ((a, b), (b, a)):
        st = producer.get(id(sc))
        if st is not None and st is not e and st.nodes[0].op == "matmul" and st.outputs[0] is sc and sc is not bias:
            if _broadcasts(tuple(bias.shape), tuple(add.outputs[0].shape)):
                return sc, bias, cond, wv, keeps
    return None


def _lone(step, op):
    """`step` is a single non-constant `op` node without epilogue, prologue or gate."""
    return (
        step is not None
        and len(step.nodes) == 1
        and not step.epilogue
        and not step.const
        and step.prologue is None
        and not step.chain
        and step.source is None
        and step.nodes[0].op == op
    )


def _parse_scores(step):
    """(scale_op, scale, bias) of the epilogue of the Q K^T matmul step, None if it is not
    [mul or div by a scalar constant] then [add of one operand]."""
    epi, k = step.epilogue, 0
    cur = step.nodes[0].outputs[0]
    scale_op, scale, bias = None, None, None
    if k < len(epi) and epi[k].op in ("mul", "div"):
        a, b = epi[k].inputs
        other = b if a is cur else a if b is cur else None
        c = scalar_value(other)
        if c is None or (epi[k].op == "div" and a is not cur) or a is b:
            return None
        scale_op, scale = epi[k].op, c
        cur = epi[k].outputs[0]
        k += 1
    if k < len(epi) and epi[k].op == "add":
        a, b = epi[k].inputs
        bias = b if a is cur else a if b is cur else None
        if bias is None or a is b or not _broadcasts(tuple(bias.shape), tuple(cur.shape)):
            return None
        k += 1
    if k != len(epi):
        return None
    return scale_op, scale, bias


def _nan_guard(p, steps, read_only_by):
    """The elementwise step where(isnan(p), 0, p) reading softmax output p, p read by nothing
    else (torch's export of scaled_dot_product_attention: a fully masked row's NaN
    probabilities become 0), else None."""
    for g in steps:
        if not _elementwise(g) or [n.op for n in g.nodes] != ["is_nan", "where"]:
            continue
        isnan, where = g.nodes
        c, tv, fv = where.inputs
        if isnan.inputs[0] is p and c is isnan.outputs[0] and scalar_value(tv) == 0.0 and fv is p:
            return g if read_only_by(p, g.nodes) and read_only_by(c, [where]) else None
    return None


def fuse_attention(steps, single_use, max_inputs, read_only_by, notes=None):
    """Replace, in place, each recognised chain's steps by one `_attention` step (module doc).
    `read_only_by(v, nodes)`: value v is read by those nodes only and is not a graph output;
    `notes`: a list getting (softmax node, why it was not fused) for each softmax left."""
    if not enabled():
        return
    producer = {id(v): s for s in steps for v in s.outputs}
    for sm in list(steps):
        if sm not in steps or not _lone(sm, "softmax"):
            continue
        why = _fuse_one(sm, steps, producer, single_use, max_inputs, read_only_by)
        if why is not None and notes is not None:
            notes.append((sm.nodes[0], why))


def _fuse_one(sm, steps, producer, single_use, max_inputs, read_only_by):
    """Fuse the chain ending in softmax step `sm`; None when fused, else why not."""
    x = sm.nodes[0].inputs[0]
    p = sm.nodes[0].outputs[0]
    if x.rank not in (3, 4, 5) or sm.nodes[0].attrs["axis"] != x.rank - 1 or not single_use(x):
        return "the softmax is not over the last axis of rank-3/4/5 scores, or its input is read elsewhere"
    guard = None if single_use(p) else _nan_guard(p, steps, read_only_by)
    if guard is not None:
        p = guard.outputs[0]  # (P @ V reads the guarded probabilities)
    elif not single_use(p):
        return "the probabilities are read by more than the P @ V matmul"
    # the P @ V step: the only reader of P, as the matmul's first operand
    pv = next(
        (
            s
            for s in steps
            if not s.const and s.nodes[0].op == "matmul" and s.nodes[0].inputs[0] is p and s.nodes[0].inputs[1] is not p
        ),
        None,
    )
    if pv is None or pv.prologue is not None or pv.chain or len(pv.nodes) != 1:
        return "no P @ V matmul reads the probabilities alone"
    # optional elementwise step [+ bias] [where(cond, ., c)] between the scores and the softmax
    e = producer.get(id(x))
    post = _parse_post(e, producer) if e is not None and e.outputs[0] is x else None
    if post is not None:
        sc, post_bias, cond, where_value, where_keeps = post
    else:
        e, sc, post_bias, cond, where_value, where_keeps = None, x, None, None, None, True
    if not single_use(sc) or tuple(sc.shape) != tuple(x.shape):
        return "the scores are read elsewhere or change shape before the softmax"
    qk = producer.get(id(sc))
    if (
        qk is None
        or qk.const
        or qk.nodes[0].op != "matmul"
        or len(qk.nodes) != 1
        or qk.prologue is not None
        or qk.chain
        or qk.views
        or len(qk.outputs) != 1
        or qk.outputs[0] is not sc
    ):
        return "the scores are not one plain matmul's output (Q @ K^T)"
    parsed = _parse_scores(qk)
    if parsed is None:
        return "the scores' epilogue is not [* or / a scalar constant] [+ one bias]"
    scale_op, scale, bias = parsed
    if bias is not None and post_bias is not None:
        return "two biases are added to the scores"
    bias = bias if bias is not None else post_bias
    q, kt = qk.nodes[0].inputs
    v = pv.nodes[0].inputs[1]
    ob = tuple(x.shape[:-2])
    if not (q.rank == kt.rank == v.rank == x.rank) or tuple(q.shape[:-2]) != ob:
        return "Q, K^T and V do not share the scores' rank and batch dimensions"
    if any(not (isinstance(d, int) and d == 1) and d != o for t in (kt, v) for d, o in zip(t.shape[:-2], ob)):
        return "K or V batch dimensions neither equal nor broadcast to Q's"
    dts = {q.data_type, kt.data_type, v.data_type, x.data_type} | ({bias.data_type} if bias is not None else set())
    if len(dts) != 1 or q.data_type not in FLOAT:
        return "mixed data types or not float"
    D, DV = q.shape[-1], v.shape[-1]
    sizes = list(x.shape) + [D, DV, v.shape[-2]]
    if not (isinstance(D, int) and isinstance(DV, int)) or max(D, DV) > MAX_HEAD or any(low(s) < 1 for s in sizes):
        return "head size dynamic or over MAX_HEAD, or an empty size"
    if v.shape[-2] != x.shape[-1]:
        # (equal at dispatch by the matmul's check, but read with the scores' Sk)
        return "V's rows are not the scores' keys"
    # K read in place when Kt is a transpose of its last two axes read only here
    tr = producer.get(id(kt))
    r = kt.rank
    if (
        _lone(tr, "transpose")
        and tr.outputs[0] is kt
        and single_use(kt)
        and list(tr.nodes[0].attrs["permutation"]) == list(range(r - 2)) + [r - 1, r - 2]
    ):
        k, k_transposed = tr.nodes[0].inputs[0], False
    else:
        k, k_transposed, tr = kt, True, None
    inputs = [q, k, v, bias, cond]
    # within the binding cap, counted as steps.read_bindings counts the new step
    if len([a for a in inputs if a is not None]) + len(epilogue_operands(pv)) > max_inputs:
        return "the kernel would bind more than the binding cap"
    attrs = {
        "scale": 1.0 if scale is None else scale,
        "scale_op": scale_op,
        "causal": False,
        "k_transposed": k_transposed,
        "where_value": where_value,
        "where_keeps": where_keeps,
        "nan_zero": guard is not None,
    }
    node = Node("_attention", inputs, attrs, pv.nodes[0].label)
    node.outputs = [pv.nodes[0].outputs[0]]
    step = Step(node, False)
    step.epilogue = list(pv.epilogue)
    step.outputs = list(pv.outputs)
    step.views = dict(pv.views)
    steps[steps.index(pv)] = step
    for s in (sm, guard, e, qk, tr):
        if s is not None:
            steps.remove(s)
    for o in step.outputs:
        producer[id(o)] = step
