"""Epilogues: elementwise nodes applied as a kernel stores its output. epilogue_target decides
whether an elementwise node joins the step producing its input (planned in plan.plan_steps);
fuse_dag_epilogues joins elementwise DAGs (a residual read twice, gated sums) after planning.

Emitter: compiler/lower.py `KernelContext.epilogue` with ops/elementwise.py `epilogue_fn`; shader
hook: every store of an EPILOGUE_OPS kernel is `out[i] = act(v, i)`.
"""

from ...ir.graph import external_inputs, inline_scalar
from ...ir.registry import OPS
from ..steps import EPILOGUE_OPS, broadcasts_to, epilogue_operands, read_bindings


def fuse_dag_epilogues(steps, consumers, out_values, max_inputs):
    """Merge, in place, each elementwise group step reading the output x of a step that takes
    epilogues (several times: GELU's x * 0.5 * (1 + erf(x / sqrt 2)), the tanh approximation,
    x * sigmoid(x)) into that step's epilogue, as a DAG: x read only by the group, every other
    operand a float scalar constant (inlined) or a value broadcasting to x's shape, every node
    of x's shape and data type. The merged step runs where the group ran (its inputs are all
    computed by then). Runs after the other passes, which expect chains."""
    producer = {id(v): s for s in steps for v in s.outputs}
    for e in list(steps):
        if (
            e not in steps
            or e.const
            or e.epilogue
            or e.prologue is not None
            or e.chain
            or e.source is not None
            or len(e.outputs) != 1
            or OPS[e.nodes[-1].op].expr is None
        ):
            continue
        ins = external_inputs(e.nodes)
        for x in ins:
            p = producer.get(id(x))
            if (
                p is None
                or p not in steps
                or p is e
                or p.const
                or p.node.op not in EPILOGUE_OPS
                or p.chain
                or p.source is not None
                or len(p.outputs) != 1
                or p.outputs[0] is not x
                or id(x) in out_values
                or any(n not in e.nodes for n in consumers.get(id(x), ()))
            ):
                continue
            shape, dt = tuple(x.shape), x.data_type
            if any(tuple(n.outputs[0].shape) != shape or n.outputs[0].data_type != dt for n in e.nodes):
                break
            others = [v for v in ins if v is not x and inline_scalar(v) is None]
            if any(v.data_type != dt or not broadcasts_to(tuple(v.shape), shape) for v in others):
                break
            extra = epilogue_operands(p)
            if read_bindings(p) + len([v for v in others if all(v is not o for o in extra)]) > max_inputs:
                break
            steps.remove(p)
            steps[steps.index(e)] = p
            p.epilogue += e.nodes
            p.outputs = list(e.outputs)
            producer[id(p.outputs[0])] = p
            break


def epilogue_target(n, op, const, producer, single_use, max_inputs):
    """(step, other operand or None) when elementwise node `n` can join the epilogue of the
    conv2d/matmul/gemm step producing one of its inputs, else None. Unary activations join as
    before; a binary node joins when its other operand broadcasts to the chain value's shape
    (it is read at the stored element's index through baked strides), the data type and shape
    are kept, and the kernel stays within the storage-buffer limit."""
    ins = [x for x in n.inputs if x is not None]
    for x in ins:
        prev = producer.get(id(x))
        if (
            prev is None
            or prev.node.op not in EPILOGUE_OPS
            or prev.const != const
            or len(prev.outputs) != 1
            or prev.outputs[0] is not x
            or not single_use(x)
        ):
            continue
        if op.activation:
            if len(ins) == 1 and n.inputs[0] is x:
                return prev, None
            return None
        if len(ins) != 2 or len(n.inputs) != 2 or len(n.outputs) != 1:
            return None
        other = ins[1] if ins[0] is x else ins[0]
        y = n.outputs[0]
        if (
            other is x
            or producer.get(id(other)) is prev
            or y.shape != x.shape
            or y.data_type != x.data_type
            or other.data_type != x.data_type
            or not broadcasts_to(tuple(other.shape), tuple(x.shape))
        ):
            return None
        extra = epilogue_operands(prev)
        bound = read_bindings(prev)
        if all(v is not other for v in extra) and bound + 1 > max_inputs:
            return None  # one more read binding would exceed the limit (the output takes one more)
        return prev, other
    return None
