"""_kv_append: rows appended in place to a KV cache that is the graph's output (internal operator).

A decoder's cache grows by the new tokens' keys and values every dispatch. Written as
`concat(past, new)` into a second tensor, every step copies the whole cache (WebNN forbids one
tensor being both an input and an output of a dispatch). `_kv_append(values, past)` instead
returns, for each value [seq, ...], an operand of shape [past + seq, ...] whose kernel writes
only rows [past, past + seq): the graph output bound to it is the cache tensor itself, and its
rows before `past` are what earlier dispatches wrote into that same tensor. Rows are the
outermost dimension (position-major, e.g. [positions, kv_heads, head_dim]), so the first `past`
rows are a prefix of the buffer whatever the tensor's current shape; `_attention(...,
layout="bshd")` reads the operand in that layout. `past` is an int or a dynamic size (a
dispatch-time dimension, e.g. the length of an input whose shape carries it).

Contract (checked at build where it can be): every output must be a graph output stored in
place (float32; float16 where the device computes in f16), i.e. written straight into the
caller's tensor by this kernel (compiler/build.py `compile_graph`: out_slot). It is not an
elementwise or epilogue operator, so no pass fuses, places or relocates it, and nothing else
writes the tensor. Reading the result inside the graph (attention) binds the caller's tensor for
reading in later kernels, which orders those reads after the append. The caller keeps the rows
before `past` valid: the same tensor, dispatch after dispatch (mltensor/llm/model.py).
All values are appended by one launch (one thread per element of the largest).
"""

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, smax, wgsl
from ..dynamic.kernels import grid
from ..errors import NotSupportedError
from ..ir.registry import builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, Kernel

TYPES = ("float32", "float16")
DYNAMIC_OPS = frozenset({"_kv_append"})


@builder_op
def _kv_append(b, values, past, *, label=None):
    """values: a list of operands [seq, ...] (one seq); past: int >= 0 or a dynamic size. Returns
    the list of operands [past + seq, ...] (module doc: only rows [past, past + seq) are written)."""
    where = "_kv_append"
    if not isinstance(values, (list, tuple)) or not values:
        raise TypeError(f"[{where}] values must be a non-empty list of operands, got {values!r}")
    for k, v in enumerate(values):
        b._operand(v, where, f"values[{k}]")
        if v.data_type not in TYPES:
            raise TypeError(f"[{where}] values[{k}] data type {v.data_type} is not one of {', '.join(TYPES)}")
        if v.rank < 1:
            raise TypeError(f"[{where}] values[{k}] must have rank >= 1 (rows first), got a scalar")
        if v.shape[0] != values[0].shape[0]:
            raise TypeError(f"[{where}] every value must have {values[0].shape[0]} rows, values[{k}] has {v.shape[0]}")
    if isinstance(past, bool) or not isinstance(past, (int, Sym)) or (isinstance(past, int) and past < 0):
        raise TypeError(f"[{where}] past must be an integer >= 0 or a dynamic size, got {past!r}")
    outs = [(v.data_type, (past + v.shape[0],) + tuple(v.shape[1:])) for v in values]
    return b._emit(where, list(values), {"past": past}, outs, label)


def _lower(kc, node):
    past = node.attrs["past"]
    srcs, dsts, counts, offs = [], [], [], []
    for k, (v, o) in enumerate(zip(node.inputs, node.outputs)):
        if not kc.is_caller_tensor(o) or kc.root(o) is not o:
            raise NotSupportedError(
                "[_kv_append] each result must be a graph output written in place (float32, or float16 where "
                "the device computes in f16): the rows before `past` live only in the caller's tensor"
            )
        row = 1
        for d in v.shape[1:]:
            row = row * d
        srcs.append(Binding(f"src{k}", kc.move_type(v)))
        dsts.append(Binding(f"dst{k}", kc.move_type(v), True))
        counts.append(v.shape[0] * row)
        offs.append(past * row)
    n = counts[0]
    for c in counts[1:]:
        n = smax(n, c)
    arrays = [(None if c == n else wgsl(c), wgsl(off)) for c, off in zip(counts, offs)]
    names = "_".join(f"{dtypes.compute_itemsize(v.data_type, kc.f16)}x{c}" for v, c in zip(node.inputs, counts))
    k = Kernel(f"kv_append_{len(srcs)}_{names}", "kvcache.wgsl", {"n": n, "arrays": arrays}, tuple(srcs + dsts))
    kc.launch(k, list(node.inputs) + list(node.outputs), grid(cdiv(n, WORKGROUP)))


register("_kv_append", {"values": TYPES, "output": TYPES}, lower=_lower)
