"""Squeeze-and-excitation gates: a global average pool (or a fully connected conv) and the chain
of fully connected 1x1 convolutions after it (pool -> FC -> act -> FC -> act), all of it one
single-workgroup kernel per batch item, reading its input through the elementwise step
producing it.

Emitter: ops/pool.py `lower_gate`; shader: shaders/pool.wgsl's gate kernel.
"""

import math

from ...dynamic.dims import is_static
from ...ir.graph import external_inputs
from ...ir.registry import OPS
from ...ops.pool import global_average_pool
from ..steps import all_unary


# Gates (fuse_gates): one workgroup per batch item pools the plane, then runs the FC chain from
# workgroup memory. Channels per layer are capped by that memory (two arrays of GATE_MAX_CHANNELS
# f32); the plane by what one workgroup should read: GPUs stream about 100 GB/s into one compute
# unit, so 2^18 elements (1 MiB of f32) cost about what the launches the fusion saves cost
# (~5 us each measured on an H100); bigger planes keep their multi-workgroup pool kernel and only
# the FC chain is fused. Both are guesses until a GPU run measures them.
GATE_MAX_CHANNELS = 1024
GATE_MAX_POOL = 1 << 18


def fully_connected(n):
    """conv2d node `n` is a fully connected layer: a 1x1 filter over a 1x1 plane, one group."""
    if n.op != "conv2d":
        return False
    a, x = n.attrs, n.inputs[0]
    plane = x.shape[2:] if a["input_layout"] == "nchw" else x.shape[1:3]
    dims = dict(zip(a["filter_layout"], n.inputs[1].shape))
    return tuple(plane) == (1, 1) and dims["h"] == dims["w"] == 1 and a["groups"] == 1 and a["padding"] == [0, 0, 0, 0]


def _gate_channels(v):
    return v.shape[1] * v.shape[2] * v.shape[3]  # one of them is C, the others 1 (after a pool/FC)


def fuse_gates(steps, single_use, max_inputs):
    """Merge, in place, each global average pool step (global_average_pool: an average_pool2d or a
    reduce_mean over the plane; or a fully connected conv step) with the fully
    connected conv steps that follow it, one consuming the other's only output, into one gate step
    (its `chain`); and give such a pool the elementwise step producing its input (`source`) when
    nothing else reads that input. Every step in the merge computes float32 or float16, applies
    unary activations only, and the kernel stays within the binding cap. A pool whose plane is
    too big for one workgroup (GATE_MAX_POOL) stays its own step; its FC chain still merges."""
    producer = {id(v): s for s in steps for v in s.outputs}
    reader = {}  # id(value) -> the steps reading it
    for s in steps:
        for n in s.nodes + s.epilogue:
            for x in n.inputs:
                if x is not None:
                    reader.setdefault(id(x), []).append(s)
    floats = ("float32", "float16")

    def unary_only(s):
        return s.prologue is None and not s.chain and s.source is None and all_unary(s.epilogue)

    for head in list(steps):
        if head not in steps or head.const or not unary_only(head) or len(head.outputs) != 1:
            continue
        hn = head.node
        pool = global_average_pool(hn) is not None
        if not pool and not fully_connected(hn):
            continue
        x = hn.inputs[0]
        if x.data_type not in floats or x.rank != 4 or not is_static(x.shape):
            continue  # (a gate's kernel has fixed sizes)
        if pool and math.prod(x.shape[1:]) > GATE_MAX_POOL:
            continue  # the pool stays a multi-workgroup kernel; its first FC may head a chain

        bound = len([v for v in hn.inputs if v is not None])
        chain = []
        cur = head.outputs[0]
        while True:
            rs = reader.get(id(cur), [])
            if len(rs) != 1 or not single_use(cur):
                break
            f = rs[0]
            if (
                f.const
                or not unary_only(f)
                or not fully_connected(f.node)
                or f.node.inputs[0] is not cur
                or len(f.outputs) != 1
                or f.outputs[0].data_type != x.data_type
                or _gate_channels(f.outputs[0]) > GATE_MAX_CHANNELS
            ):
                break
            extra = len([v for v in f.node.inputs[1:] if v is not None])
            if bound + extra > max_inputs:
                break
            bound += extra
            chain.append(f)
            cur = f.outputs[0]
        if not chain or _gate_channels(hn.outputs[0] if pool else x) > GATE_MAX_CHANNELS:
            continue
        # the merged step runs where its last FC ran: every FC operand (runtime weights too) is
        # ready there, and nothing in between read the values the merge hides (single use)
        steps[steps.index(chain[-1])] = head
        steps.remove(head)
        for f in chain[:-1]:
            steps.remove(f)
        head.chain = chain
        head.outputs = list(chain[-1].outputs)
        for v in head.outputs:
            producer[id(v)] = head
        if not pool:
            continue
        src = producer.get(id(x))
        if (
            src is not None
            and src in steps
            and not src.const
            and not src.epilogue
            and src.outputs[0] is x
            and OPS[src.nodes[-1].op].expr is not None
            and single_use(x)
            and len(reader.get(id(x), [])) == 1
            and all(n.outputs[0].data_type in floats for n in src.nodes)
            and all(v.data_type in floats for v in external_inputs(src.nodes))
        ):
            ins = external_inputs(src.nodes)
            if bound - 1 + len(ins) <= max_inputs:
                steps.remove(src)
                head.source = src
