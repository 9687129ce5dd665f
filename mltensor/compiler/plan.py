"""Planning: live nodes -> Steps in topological order, with every fusion decision. This module
alone sets the order of the passes: the node rewrites (rewrite_nodes: no-op layout nodes, flattened linear layers,
column blocks of fused projections, attention's scales and masks as exporters write them,
torch.roll, RMS chains, fused GEMMs)
before planning, then the chains and prologues planned node by node (plan_steps), then the
fusions over planned steps (attention, grouped heads, gates, DAG epilogues, normalization
sources, post-norms). Each fusion lives in its own file under compiler/fusion/; module flags
that tests switch (norm.POST_NORM, rms.RMS_PROLOGUE) are read through their module.
"""

from ..dynamic.dims import Sym, is_static
from ..ir.graph import external_inputs
from ..ir.registry import OPS
from .fusion import norm, rms
from .fusion.attention import fuse_attention
from .fusion.conv_prologue import constant_pad, conv_prologue
from .fusion.epilogue import epilogue_target, fuse_dag_epilogues
from .fusion.gate import fuse_gates
from .fusion.gemm_views import rewrite_gemms
from .fusion.grouped import fuse_grouped_heads
from .fusion.norm import fuse_norm_sources, fuse_post_norms
from .fusion.report import unfused
from .fusion.linear import rewrite_flat_gemms
from .fusion.noop import drop_noops
from .fusion.roll import rewrite_rolls
from .fusion.sdpa import rewrite_sdpa
from .fusion.siblings import merge_siblings
from .fusion.split import split_sliced_gemms
from .steps import MAX_FUSED_BINDINGS, PROLOGUE_OPS, Step, Uses


def plan_steps(nodes, outputs, fuse=True, max_inputs=7, cpu=False, report=None):
    """`max_inputs`: the most inputs a fused elementwise kernel may bind (storage buffers per
    shader stage, less one for the output); `cpu`: the adapter is a CPU (POST_NORM); `report`: a
    list getting what fusion left undone (fusion/report.py: (kind, node, reason))."""
    if fuse:
        nodes = rewrite_nodes(nodes, outputs, max_inputs + 1)  # transformer patterns (module end)
    out_values = {id(v) for v in outputs.values()}
    consumers = {}
    for n in nodes:
        for x in n.inputs:
            if x is not None:
                consumers.setdefault(id(x), []).append(n)

    const_values = set()

    def is_const(v):
        return v._kind == "constant" or id(v) in const_values

    def single_use(v):
        return id(v) not in out_values and len(consumers.get(id(v), ())) == 1

    def read_only_by(v, nodes):
        return id(v) not in out_values and all(any(n is m for m in nodes) for n in consumers.get(id(v), ()))

    steps = []
    producer = {}  # id(value) -> step producing it
    for n in nodes:
        # (a node reading sizes known only at dispatch is never computed at build, whatever
        # its inputs: its result depends on the dispatch)
        const = (
            all(is_const(x) for x in n.inputs if x is not None)
            and not any(id(v) in out_values for v in n.outputs)
            and not _reads_sizes(n)
        )
        if const:
            const_values.update(id(v) for v in n.outputs)
        op = OPS[n.op]
        if fuse and op.expr is not None:
            target = epilogue_target(n, op, const, producer, single_use, max_inputs)
            if target is not None:
                prev, other = target
                if other is not None:
                    pad = producer.get(id(other))
                    if (
                        pad is not None
                        and pad in steps
                        and constant_pad(pad)
                        and pad.const == const
                        and single_use(other)
                        and tuple(other.shape) == tuple(n.outputs[0].shape)
                        and is_static(other.shape)
                    ):
                        steps.remove(pad)  # read through (the pad's input is bound instead)
                        prev.views[id(other)] = pad.node
                        other = pad.node.inputs[0]
                    # the kernel reads `other`: run it after the step producing `other`
                    src = producer.get(id(other))
                    if src in steps and steps.index(src) > steps.index(prev):
                        steps.remove(prev)
                        steps.append(prev)
                prev.epilogue.append(n)
                prev.outputs = list(n.outputs)
                producer[id(n.outputs[0])] = prev
                continue
            # Elementwise chains: absorb producers used only here, of the same shape.
            step = Step(n, const)
            for x in n.inputs:
                if x is None:
                    continue
                p = producer.get(id(x))
                if (
                    p is not None
                    and p in steps
                    and not p.epilogue
                    and OPS[p.nodes[-1].op].expr is not None
                    and p.const == const
                    and p.outputs[0] is x
                    and x.shape == n.outputs[0].shape
                    and single_use(x)
                    and len(external_inputs(p.nodes + step.nodes)) <= max_inputs
                ):
                    steps.remove(p)
                    step.nodes[:0] = [m for m in p.nodes if m not in step.nodes]
            steps.append(step)
            producer[id(n.outputs[0])] = step
            continue
        step = Step(n, const)
        if fuse and n.op in PROLOGUE_OPS:
            pro = conv_prologue(n, producer, single_use, const, max_inputs, consumers)
            if pro is not None and pro.step in steps:
                steps.remove(pro.step)
                step.prologue = pro
        steps.append(step)
        for v in n.outputs:
            producer[id(v)] = step
    if fuse:
        attention_notes = []
        fuse_attention(steps, single_use, max_inputs, read_only_by, attention_notes)  # one kernel
        fuse_grouped_heads(steps, single_use)
        fuse_gates(steps, single_use, max_inputs)
        fuse_dag_epilogues(steps, consumers, out_values, max_inputs)  # last: others see chains only
        fuse_norm_sources(steps, consumers, out_values, max_inputs)
        if norm.POST_NORM is True or (norm.POST_NORM == "cpu" and cpu):
            fuse_post_norms(steps, consumers, out_values, max_inputs)
        if report is not None:
            report += unfused(steps, attention_notes, consumers, out_values)
    return steps


def _reads_sizes(n):
    """Node `n` depends on sizes given at dispatch: a dynamic dimension in an output's shape or
    in an attribute (a slice starting at `past`, a range of `seq` elements)."""
    if any(not is_static(v.shape) for v in n.outputs):
        return True
    stack = list(n.attrs.values())
    while stack:
        v = stack.pop()
        if isinstance(v, Sym):
            return True
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
    return False


def rewrite_nodes(nodes, outputs, cap=MAX_FUSED_BINDINGS):
    """The live nodes with the transformer patterns replaced (module comment above); `cap`: the
    storage buffers a fused kernel may bind."""
    nodes = drop_noops(nodes, outputs)  # first: einsum's identity transposes and reshapes
    nodes = rewrite_flat_gemms(nodes, Uses(nodes, outputs))  # matmuls in their real shapes
    nodes = split_sliced_gemms(nodes, Uses(nodes, outputs))  # a fused QKV / gate-up: one matmul a block
    nodes = rewrite_sdpa(nodes, outputs)  # scales and masks as the attention pass reads them
    nodes = rewrite_rolls(nodes, Uses(nodes, outputs))  # torch.roll: one gather
    nodes = rms.rewrite_rms(nodes, Uses(nodes, outputs))
    nodes = merge_siblings(nodes, outputs, cap)  # projections of one A past the binding cap: one matmul
    nodes = rewrite_gemms(nodes, outputs, cap)
    return rms.rms_prologues(nodes, outputs, cap) if rms.RMS_PROLOGUE else nodes
