"""Graph passes on the builder's nodes: dead-node removal, constant classification, fusion.

The result is a list of Steps in topological order. A step is one node, a fused elementwise
group, or a conv2d/matmul/gemm with an epilogue of activations.
"""

from ..ops import OPS

# Operators whose kernels apply an activation epilogue (`kc.activation(step)`).
EPILOGUE_OPS = {"conv2d", "conv_transpose2d", "matmul", "gemm"}


class Step:
    __slots__ = ("nodes", "epilogue", "const", "outputs")

    def __init__(self, node, const):
        self.nodes = [node]  # one node, or a fused elementwise group in topological order
        self.epilogue = []  # activation nodes applied to the (single) output, in order
        self.const = const
        self.outputs = list(node.outputs)

    @property
    def node(self):
        return self.nodes[-1] if not self.epilogue else self.nodes[0]

    @property
    def fused(self):
        return len(self.nodes) > 1 or bool(self.epilogue)

    def __repr__(self):
        return f"<Step {'+'.join(n.op for n in self.nodes + self.epilogue)}{' const' if self.const else ''}>"


def live_nodes(builder, outputs):
    """Nodes reachable from the outputs, in creation (= topological) order."""
    needed = set()
    stack = [v for v in outputs.values()]
    while stack:
        v = stack.pop()
        n = v._node
        if n is None or id(n) in needed:
            continue
        needed.add(id(n))
        stack.extend(x for x in n.inputs if x is not None)
    return [n for n in builder._nodes if id(n) in needed]


def external_inputs(nodes):
    """Distinct values a group of nodes reads that it does not produce (its kernel's inputs)."""
    produced = {id(v) for n in nodes for v in n.outputs}
    seen, out = set(), []
    for n in nodes:
        for x in n.inputs:
            if x is not None and id(x) not in produced and id(x) not in seen:
                seen.add(id(x))
                out.append(x)
    return out


def plan_steps(nodes, outputs, fuse=True, max_inputs=7):
    """`max_inputs`: the most inputs a fused elementwise kernel may bind (storage buffers per
    shader stage, less one for the output)."""
    out_values = {id(v) for v in outputs.values()}
    consumers = {}
    for n in nodes:
        for x in n.inputs:
            if x is not None:
                consumers.setdefault(id(x), []).append(n)

    const_values = set()

    def is_const(v):
        return v._kind == "constant" or id(v) in const_values

    steps = []
    producer = {}  # id(value) -> step producing it
    for n in nodes:
        const = all(is_const(x) for x in n.inputs if x is not None) and not any(
            id(v) in out_values for v in n.outputs
        )
        if const:
            const_values.update(id(v) for v in n.outputs)
        op = OPS[n.op]

        def single_use(v):
            return id(v) not in out_values and len(consumers.get(id(v), ())) == 1

        if fuse and op.expr is not None:
            x = n.inputs[0]
            prev = producer.get(id(x)) if x is not None else None
            # Activation epilogue onto conv2d/matmul/gemm.
            if (
                op.activation
                and prev is not None
                and prev.node.op in EPILOGUE_OPS
                and prev.const == const
                and len(prev.outputs) == 1
                and prev.outputs[0] is x
                and single_use(x)
                and all(y is None for y in n.inputs[1:])
            ):
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
        steps.append(step)
        for v in n.outputs:
            producer[id(v)] = step
    return steps
