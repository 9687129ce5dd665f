"""Linear layers as exporters flatten them: TorchScript writes a linear layer on a [B, S, K] input
(transformers' GPT-2 Conv1D, nn.Linear where the exporter keeps a Gemm) as reshape to [B*S, K],
Gemm, reshape back to [B, S, N]. rewrite_flat_gemms makes that one matmul over the 3-D input
(plus the bias as an add): ops/_gemm.py folds its batch into one GEMM of B*S rows, as before, and
the passes after it (the projection's views in gemm_views.py, activations as epilogues, the
attention pass) see the matmul's output in its real shape. A Gemm between transposes
(nn.MultiheadAttention's out-projection: head merge, Gemm, back to batch-first) becomes a matmul
too, so that the view pass reads its A and writes its output through them. Runs in
plan.rewrite_nodes before them.
"""

import numpy as np

from ...ir.graph import Node
from ..steps import host_constant, new_node, replace_each

FLOAT = ("float32", "float16")


def _flat_gemm(n, uses):
    """(x, weight, bias, output) when gemm node n reads reshape(x) of an x of rank >= 3 merging
    its leading dimensions, and only a reshape of its output back to x's leading dimensions
    reads it; else None."""
    a, b, c = n.inputs
    at = n.attrs
    if at["a_transpose"] or at["alpha"] != 1.0 or (c is not None and at["beta"] != 1.0):
        return None
    if a.data_type not in FLOAT or (c is not None and c.rank == 2 and not (c.shape[0] == 1)):
        return None
    r1 = uses.prod.get(id(a))
    if r1 is None or r1.op != "reshape" or not uses.only(a, n):
        return None
    x = r1.inputs[0]
    if x.rank < 3 or x.shape[-1] != a.shape[-1]:
        return None
    y = n.outputs[0]
    r2 = uses.sole(y)
    if r2 is None or r2.op != "reshape":
        return None
    z = r2.outputs[0]
    if tuple(z.shape[:-1]) != tuple(x.shape[:-1]) or z.shape[-1] != y.shape[-1]:
        return None
    b = _plain_b(n)
    return None if b is None else (x, b, c, z, (r1, r2))


def _plain_b(n):
    """Gemm node n's B as a matmul reads it ([K, N]): B itself, or a transposed constant
    transposed at build; None when B is transposed and given at dispatch."""
    b = n.inputs[1]
    if not n.attrs["b_transpose"]:
        return b
    if b._kind != "constant" or not isinstance(b._value, np.ndarray):
        return None  # (a weight given at dispatch: left as the gemm reads it, transposed)
    return host_constant(b, b.data_type, np.ascontiguousarray(b._value.T))


def _gemm_in_views(n, uses):
    """(A, B, bias, output, ()) when gemm node n reads A through a transpose, or its output goes
    through one (nn.MultiheadAttention's out-projection between the head merge and the
    batch-first transpose): as a matmul, the view pass absorbs those; else None."""
    a, _, c = n.inputs
    at = n.attrs
    if at["a_transpose"] or at["alpha"] != 1.0 or (c is not None and at["beta"] != 1.0) or a.data_type not in FLOAT:
        return None
    if not (_transposed(a, uses, up=True) or _transposed(n.outputs[0], uses, up=False)):
        return None
    b = _plain_b(n)
    return None if b is None else (a, b, c, n.outputs[0], ())


def _transposed(v, uses, up):
    """A chain of reshapes and transposes, each value read once, with a transpose in it, makes v
    (up) or reads v (down); the chains a GEMM's views take (fusion/gemm_views.py)."""
    while True:
        n = uses.prod.get(id(v)) if up else uses.sole(v)
        if n is None or n.op not in ("reshape", "transpose") or (up and not uses.only(v)):
            return False
        if n.op == "transpose":
            return True
        v = n.inputs[0] if up else n.outputs[0]


def rewrite_flat_gemms(nodes, uses):
    """reshape -> gemm -> reshape back, as one matmul [+ bias] (module doc), and a gemm between
    layout operators as a matmul [+ bias]; the node list. (The second reshape comes after the
    gemm: the replacement stands where the gemm stood.)"""

    def match(n):
        return (_flat_gemm(n, uses) or _gemm_in_views(n, uses)) if n.op == "gemm" else None

    def replace(n, hit):
        x, b, c, z, reshapes = hit
        if c is None:
            mm = Node("matmul", [x, b], {}, n.label)
            mm.outputs = [z]
            return [mm], reshapes
        mm, t = new_node("matmul", [x, b], {}, z.shape, z, n.label)
        add = Node("add", [t, c], {}, n.label)
        add.outputs = [z]
        return [mm, add], reshapes

    return replace_each(nodes, match, replace)
