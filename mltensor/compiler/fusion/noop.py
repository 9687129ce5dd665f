"""Nodes that compute nothing new, read through before the patterns are matched.

- Layout nodes that change nothing, as exporters write einsum: torch.onnx.export lowers
  `torch.einsum("bphid,bphjd->bphij", q, k)` (MaxViT's attention) to transposes by the identity
  permutation and reshapes to the shape the value already has around a MatMul. Each is a copy or
  an alias standing between the patterns the passes after it look for (the attention pass sees
  no P @ V matmul reading the probabilities, only a reshape of a transpose of them).
- Repeated computations: exporters write a mask or a position computation once per layer (T5's
  causal mask: range, range, compare, where, in every decoder layer; Whisper's: expand, trilu,
  equal, where). A node doing what an earlier
  one did (same operator, same inputs, same attributes; small constants compared by value) is
  that node: its kernels run once.

drop_noops reads the earlier value in their place. Runs first in plan.rewrite_nodes.
"""

import numpy as np

from ...ir.graph import MLOperand, Node
from ...ir.registry import OPS

# operators without effects or state whose repeats are merged (elementwise ones too): a kernel
# that writes in place (a KV cache append) or draws random numbers is never one of these
PURE = frozenset(
    {
        "reshape",
        "transpose",
        "slice",
        "expand",
        "concat",
        "gather",
        "pad",
        "split",
        "tile",
        "triangular",
        "_range",
        "_size",
    }
)
SMALL = 64  # constants of at most this many elements are compared by value


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


def _noop(n):
    """Node n's input when n leaves it as it is (same shape, same order), else None."""
    x, y = n.inputs[0], n.outputs[0]
    if x is None or x.data_type != y.data_type or tuple(x.shape) != tuple(y.shape):
        return None
    if n.op == "reshape" or (n.op == "transpose" and list(n.attrs["permutation"]) == list(range(x.rank))):
        return x
    return None


def _key(v):
    """A hashable form of an attribute value or a small constant, None where it has none."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return (type(v).__name__, v)
    if isinstance(v, (list, tuple)):
        ks = [_key(x) for x in v]
        return None if any(k is None for k in ks) else ("seq", tuple(ks))
    if isinstance(v, dict):
        ks = [(k, _key(x)) for k, x in sorted(v.items())]
        return None if any(k[1] is None for k in ks) else ("map", tuple(ks))
    if isinstance(v, np.ndarray) and v.size <= SMALL:
        return ("array", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, np.generic):
        return ("scalar", v.dtype.str, v.tobytes())
    if type(v).__name__ == "Sym":  # (a size expression: equal when written alike)
        return ("sym", str(v))
    return None


def _operand_key(x):
    if x is None:
        return None
    if x._kind == "constant" and isinstance(x._value, np.ndarray) and x._value.size <= SMALL:
        return ("const", x.data_type, tuple(x.shape), x._value.tobytes())
    return ("value", id(x))


def _signature(n):
    """What node n computes, or None when it is not merged."""
    if n.op not in PURE and OPS[n.op].expr is None:
        return None
    attrs = _key(n.attrs)
    if attrs is None:
        return None
    outs = tuple((v.data_type, _key(tuple(v.shape))) for v in n.outputs)
    return (n.op, tuple(_operand_key(x) for x in n.inputs), attrs, outs)


def drop_noops(nodes, outputs):
    """The node list without no-op layout nodes and repeats, their readers reading the value
    they stand for (module doc)."""
    keep = {id(v) for v in outputs.values()} | _held(nodes)
    alias, seen, out = {}, {}, []
    for n in nodes:
        if any(x is not None and id(x) in alias for x in n.inputs):
            m = Node(n.op, [alias.get(id(x), x) if x is not None else None for x in n.inputs], dict(n.attrs), n.label)
            m.outputs = list(n.outputs)
            n = m
        if any(id(v) in keep for v in n.outputs):
            out.append(n)
            continue
        x = _noop(n) if len(n.outputs) == 1 else None
        if x is not None:
            alias[id(n.outputs[0])] = x
            continue
        sig = _signature(n)
        first = seen.get(sig) if sig is not None else None
        if first is not None:
            alias.update((id(v), w) for v, w in zip(n.outputs, first.outputs))
            continue
        if sig is not None:
            seen[sig] = n
        out.append(n)
    return out
