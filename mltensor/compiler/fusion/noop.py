"""Layout nodes that change nothing, as exporters write einsum: torch.onnx.export lowers
`torch.einsum("bphid,bphjd->bphij", q, k)` (MaxViT's attention) to transposes by the identity
permutation and reshapes to the shape the value already has around a MatMul. Each is a copy or an
alias that stands between the patterns the passes after it look for (the attention pass sees no
P @ V matmul reading the probabilities, only a reshape of a transpose of them). drop_noops reads
their input in their place. Runs first in plan.rewrite_nodes.
"""

from ...ir.graph import MLOperand, Node


def _held(nodes):
    """ids of the values nodes' attributes hold (kept: only an input can be read elsewhere)."""
    out, stack = set(), [v for n in nodes for v in n.attrs.values()]
    while stack:
        v = stack.pop()
        if isinstance(v, MLOperand):
            out.add(id(v))
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return out


def _noop(n, out_ids):
    """Node n's input, when n leaves it as it is (same shape, same order) and its output is
    neither a graph output nor held by an attribute; else None."""
    if len(n.outputs) != 1 or id(n.outputs[0]) in out_ids:
        return None
    x, y = n.inputs[0], n.outputs[0]
    if x is None or x.data_type != y.data_type or tuple(x.shape) != tuple(y.shape):
        return None
    if n.op == "reshape" or (n.op == "transpose" and list(n.attrs["permutation"]) == list(range(x.rank))):
        return x
    return None


def drop_noops(nodes, outputs):
    """The node list without no-op layout nodes, their readers reading the input (module doc)."""
    out_ids = {id(v) for v in outputs.values()} | _held(nodes)
    alias, out = {}, []
    for n in nodes:
        if any(x is not None and id(x) in alias for x in n.inputs):
            m = Node(n.op, [alias.get(id(x), x) if x is not None else None for x in n.inputs], dict(n.attrs), n.label)
            m.outputs = list(n.outputs)
            n = m
        x = _noop(n, out_ids)
        if x is not None:
            alias[id(n.outputs[0])] = x
            continue
        out.append(n)
    return out
