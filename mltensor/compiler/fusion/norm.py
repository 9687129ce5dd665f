"""Normalizations fused with their neighbours: a layer/RMS normalization reading an elementwise
step computes it as it loads (fuse_norm_sources), and a GEMM whose rows feed a layer or RMS
normalization applies it after its epilogue (fuse_post_norms, POST_NORM).

Emitters: ops/normalization.py (the source's `group_fn`), ops/matmul.py `_post_norm`; shader
hooks: shaders/normalization.wgsl's source expression, shaders/matmul.wgsl `post_ln`.
"""

import math

from ...dynamic.dims import high
from ...ir.graph import external_inputs
from ...ir.registry import OPS
from ...ops._gemm import post_norm_fits
from ..steps import epilogue_operands, read_bindings


NORM_SOURCE_OPS = ("layer_normalization", "_rms_normalization")


def fuse_norm_sources(steps, consumers, out_values, max_inputs):
    """A layer / RMS normalization reads its input through the elementwise step producing it
    (a residual add, an embedding sum: `Step.source`), the step's launch gone: the kernel
    evaluates the step's expression at each element it reads (three times for a layer norm:
    two statistics passes and the output, each reading the step's inputs, where the separate
    kernel wrote the sum once and the norm read it three times). Where the sum is also read
    elsewhere (the residual stream of a pre-norm model) or is a graph output, the kernel writes
    it too, once. Not where another reader runs before the normalization, the normalization's
    epilogue reads the sum, or the kernel would exceed the binding cap."""
    producer = {id(v): s for s in steps for v in s.outputs}
    for st in list(steps):
        node = st.nodes[0]
        if (
            node.op not in POST_NORM_OPS
            or st.const
            or st.prologue is not None
            or st.chain
            or st.source is not None
            or len(st.outputs) != 1
        ):
            continue
        x = node.inputs[0]
        e = producer.get(id(x))
        if (
            e is None
            or e not in steps
            or e.const
            or e.epilogue
            or e.prologue is not None
            or e.chain
            or e.source is not None
            or len(e.outputs) != 1
            or e.outputs[0] is not x
            or OPS[e.nodes[-1].op].expr is None
        ):
            continue
        ins = external_inputs(e.nodes)
        if any(n.outputs[0].data_type != x.data_type for n in e.nodes) or any(
            v.data_type not in ("float32", "float16") for v in ins
        ):
            continue
        if any(v is x for v in epilogue_operands(st)):
            continue
        others = [n for n in consumers.get(id(x), ()) if n is not node]
        i = steps.index(st)
        reader_steps = [
            s
            for s in steps
            for n in others
            if n in s.nodes or n in s.epilogue or (s.prologue is not None and n in s.prologue.step.nodes)
        ]
        if len(reader_steps) < len(others) or any(steps.index(s) < i for s in reader_steps):
            continue  # (a reader not found as a step, or running before the normalization)
        write = bool(others) or id(x) in out_values
        params = len([v for v in node.inputs[1:] if v is not None])
        if len(ins) + params + len(epilogue_operands(st)) + (1 if write else 0) > max_inputs:
            continue
        steps.remove(e)
        st.source = e
        if write:
            st.outputs.append(x)
            producer[id(x)] = st


# LayerNorm (or RMSNorm) in the epilogue of the GEMM producing its input (fuse_post_norms). "cpu": on CPU
# adapters only. The GEMM then runs one workgroup per tile of rows, walking every column tile
# itself (the rows' statistics need all columns): on lavapipe's few cores a handful of row tiles
# keep them busy and the normalization's launch and round trip go; on a GPU a 128-token
# sequence would leave 2-4 workgroups for the whole GEMM (a per-row statistics buffer written by
# the producer and the normalization applied where it is read is the GPU design; not built), so
# it stays off there until measured. True: everywhere (tests), False: off.
POST_NORM = "cpu"
POST_NORM_MAX_N = 8192  # columns of the row walk: up to BERT-large / Llama-70B widths
POST_NORM_OPS = NORM_SOURCE_OPS  # the normalizations that join (RMS too: T5's, Llama's residual stream)


def _row_view(v, seg):
    """The plain segment's leaf writes v as the GEMM output's own row-major layout (an identity
    view: reshapes that keep the order only), so row m is v's elements m*N .. m*N + N - 1."""
    if (
        len(seg.leaves) != 1
        or seg.leaves[0].values != [v]
        or seg.leaves[0].cat is not None
        or seg.leaves[0].rope is not None
    ):
        return False
    view = seg.leaves[0].view
    slots = [sl for dim in view.dims for sl in dim]
    digits = [d for ax in view.axes for d in ax]
    return len(slots) == len(digits) and all(
        sl[0] is d and sl[1] == 0 and sl[2] == d.size for sl, d in zip(slots, digits)
    )


def fuse_post_norms(steps, consumers, out_values, max_inputs):
    """A layer or RMS normalization over the last axis whose input is a GEMM step's output joins that
    step (`Step.post_norm`): after its epilogue (a bias, a residual add) the GEMM stores the sum
    as before, then each workgroup, owning whole rows, normalizes them (matmul.wgsl `post_ln`:
    two passes, mean then the sum of squared deviations, in f32). Where nothing else reads the
    sum (post-LN BERT: the output projection + bias + residual, the FFN's second GEMM + bias +
    residual) it is stored into the normalization's output and normalized in place: it is never
    a value of its own. Where it is read again or is an output (pre-LN ViT: the residual stream
    the next residual add reads) it is stored as itself and the normalized rows go to the
    normalization's output (Step.outputs: [normalized, sum]). Either way the normalization
    launches nothing. Not where the normalization has an epilogue, its parameters are computed
    after the GEMM, the columns are dynamic or over POST_NORM_MAX_N, or the bindings exceed
    the cap."""
    producer = {id(v): s for s in steps for v in s.outputs}
    for st in list(steps):
        node = st.nodes[0]
        if (
            node.op not in POST_NORM_OPS
            or st.const
            or st.epilogue
            or st.prologue is not None
            or st.chain
            or st.source is not None
            or len(st.nodes) != 1
            or len(st.outputs) != 1
        ):
            continue
        x = node.inputs[0]
        if (
            tuple(node.attrs["axes"]) != (x.rank - 1,)
            or not isinstance(x.shape[-1], int)
            or x.shape[-1] > POST_NORM_MAX_N
            or x.shape[-1] % 4
        ):
            continue
        g = producer.get(id(x))
        if (
            g is None
            or g not in steps
            or g.const
            or g.prologue is not None
            or g.chain
            or g.source is not None
            or g.post_norm is not None
            or len(g.outputs) != 1
            or g.outputs[0] is not x
            or g.views
        ):
            continue
        gn = g.node
        if gn.op == "matmul":
            if len(g.nodes) != 1 or gn.outputs[0].shape[-1] != x.shape[-1]:
                continue
        elif gn.op == "_fused_matmul":
            plan = gn.attrs["plan"]
            if (
                len(plan.segments) != 1
                or plan.segments[0].kind != "plain"
                or plan.rms is not None
                or len(gn.outputs) != 1
                or not _row_view(gn.outputs[0], plan.segments[0])
            ):
                continue
        else:
            continue
        # its workgroups walk whole rows (N x K a row) in one invocation: only where a tile keeps
        # that under llvmpipe's loop cap (BERT-large's 1024 x 4096 FFN does not: two kernels)
        a = gn.attrs["plan"].a if gn.op == "_fused_matmul" else gn.inputs[0]
        rows = math.prod(high(d) for d in x.shape[:-1])
        if not post_norm_fits(rows, x.shape[-1], a.shape[-1]):
            continue
        # the sum read elsewhere too (a pre-norm residual stream: ViT) or an output: the kernel
        # keeps storing it, and writes the normalized rows to the normalization's output
        keep = id(x) in out_values or any(n is not node for n in consumers.get(id(x), ()))
        # the normalization's parameters exist when the GEMM runs (constants, or earlier steps)
        gi = steps.index(g)
        params = [v for v in node.inputs[1:] if v is not None]
        if any(v.data_type != x.data_type for v in params):
            continue
        if any(producer.get(id(v)) in steps and steps.index(producer[id(v)]) >= gi for v in params):
            continue
        if read_bindings(g) + len(params) + keep > max_inputs:
            continue
        steps.remove(st)
        g.post_norm = node
        g.outputs = list(node.outputs) + ([x] if keep else [])
        producer[id(node.outputs[0])] = g
