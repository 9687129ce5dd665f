"""The step model the compiler plans in: a Step is one node, a fused elementwise group, or a
conv2d/matmul/gemm with an epilogue (unary activations and binary elementwise nodes whose other
operand, a residual or a scale, is read at the stored element's index); a convolution step may
also carry a ConvPrologue (fusion/conv_prologue.py). Also the node queries the passes share."""

from ..ir.graph import MLOperand, Node, inline_scalar
from ..ir.registry import OPS


# Storage buffers one fused kernel may bind, whatever the adapter allows (and never more than it
# allows). Adapters report from 8 (WebGPU's default, so the same fusion everywhere) up to 524,288
# (NVIDIA's Vulkan driver): growing kernels towards that only makes slow kernels and slow builds.
MAX_FUSED_BINDINGS = 8


def binding_cap(device):
    """The most storage buffers (inputs and the output) a fused kernel binds on `device`."""
    return min(MAX_FUSED_BINDINGS, device.limits["max-storage-buffers-per-shader-stage"])


# Operators whose kernels apply a fused epilogue (`kc.epilogue(bindings, args)`).
EPILOGUE_OPS = {
    "conv2d",
    "conv_transpose2d",
    "matmul",
    "gemm",
    "average_pool2d",
    "l2_pool2d",
    "max_pool2d",
    "batch_normalization",
    "instance_normalization",
    "layer_normalization",
    "_rms_normalization",
    "_fused_matmul",
}


class Step:
    __slots__ = ("nodes", "epilogue", "const", "outputs", "prologue", "chain", "source", "views", "post_norm")

    def __init__(self, node, const):
        self.nodes = [node]  # one node, or a fused elementwise group in topological order
        # Elementwise nodes applied to the (single) output, in order: unary activations and binary
        # nodes with one operand the chain's value (see epilogue_operands for the other)
        self.epilogue = []
        self.const = const
        self.outputs = list(node.outputs)
        # conv2d / conv_transpose2d: the batch_normalization step it absorbed, the unary
        # activations to apply after the normalization's affine part, and that part folded into
        # one constant [scale; shift] of 2C values where all its operands are host constants
        self.prologue = None  # conv2d / conv_transpose2d: a ConvPrologue
        # A gate (fuse_gates): the fully connected conv steps applied after this global pool (or
        # after this fully connected conv), and the elementwise step the pool reads through
        self.chain = []
        self.source = None
        # Epilogue operands read through a constant pad: id(pad output) -> the pad node, whose
        # input the kernel binds instead (the pad launches nothing; lower.KernelContext.epilogue)
        self.views = {}
        # A GEMM step: the layer_normalization node applied to its rows after the epilogue
        # (fuse_post_norms); outputs is then [the normalization's output(, the sum it reads,
        # where that is read elsewhere too)]
        self.post_norm = None

    @property
    def node(self):
        return self.nodes[-1] if not self.epilogue else self.nodes[0]

    @property
    def fused(self):
        return len(self.nodes) > 1 or bool(self.epilogue)

    def __repr__(self):
        p = self.prologue and self.prologue.step
        pro = "+".join(n.op for n in p.nodes + p.epilogue) + ">" if p else ""
        return f"<Step {pro}{'+'.join(n.op for n in self.nodes + self.epilogue)}{' const' if self.const else ''}>"


def read_bindings(step):
    """Storage buffers a fused step's kernel reads: its node's inputs, the prologue's parameters
    (its input replaces the convolution's) and the epilogue's other operands."""
    n = len([v for v in step.node.inputs if v is not None]) + len(epilogue_operands(step))
    if step.post_norm is not None:
        n += len([v for v in step.post_norm.inputs[1:] if v is not None])
    return n + (len(step.prologue.reads()) if step.prologue is not None else 0)


class ConvPrologue:
    """The step a convolution absorbs, applied as it loads its input (ops/conv.py `_prologue`).
    (Not the build-time "prologue" launches of constant steps, lower.py.)

    kind "bn": step is a batch_normalization (+ its epilogue), `const` its affine part folded into
    a [scale; shift] constant of 2C values or None (parameters read as they are), `acts` the
    unary activations after it. kind "scaled": step multiplies `input` by `scale` (varying along
    batch and channel only), then adds `add` (or None). kind "dw": step is a depthwise conv2d,
    `acts` its activations. kind "resample": step is a resample2d (+ unary `acts`). kind "pad":
    step pads with zeros along the spatial dimensions, `pads` the amounts [top, bottom, left,
    right] added to the convolution's own padding. `input` is what the convolution reads instead
    of its own input."""

    __slots__ = ("kind", "step", "input", "acts", "const", "scale", "add", "pads")

    def __init__(self, kind, step, input, acts=(), const=None, scale=None, add=None, pads=None):
        self.kind, self.step, self.input, self.acts = kind, step, input, list(acts)
        self.const, self.scale, self.add, self.pads = const, scale, add, pads

    def reads(self):
        """Values the convolution's kernel binds besides its own operands."""
        if self.kind == "scaled":
            return [v for v in (self.scale, self.add) if v is not None]
        if self.kind in ("resample", "pad"):
            return []
        if self.const is not None:
            return [self.const]
        return [v for v in self.step.node.inputs[1:] if v is not None]


PROLOGUE_OPS = {"conv2d", "conv_transpose2d"}


def epilogue_operands(step):
    """Distinct values the step's epilogue reads besides the values it computes (the node's
    output and its own nodes' outputs: a chain, or a DAG joined by fuse_dag_epilogues), in order
    of first use: the extra bindings of the fused kernel. Float constants of one element are
    not among them: the epilogue inlines them (inline_scalar)."""
    seen = {id(step.nodes[0].outputs[0])} | {id(n.outputs[0]) for n in step.epilogue}
    out = []
    for n in step.epilogue:
        for x in n.inputs:
            if x is not None and id(x) not in seen and inline_scalar(x) is None:
                seen.add(id(x))
                out.append(x)
    return out


def broadcasts_to(shape, target):
    """`shape` broadcasts unidirectionally to `target` (numpy rules)."""
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


def all_unary(nodes):
    """Every node is a unary activation (fusable after a prologue's affine or depthwise part)."""
    return all(OPS[e.op].activation and len([v for v in e.inputs if v is not None]) == 1 for e in nodes)


# -- node rewrites: transformer patterns (before the steps are planned) ------------------------
#
# Exporters write some operators as chains of small ones (RMSNorm as Pow / ReduceMean / Add /
# Sqrt / Reciprocal / Mul). rewrite_nodes replaces each recognised chain by one internal node
# computing the same function in one kernel; everything else is planned as before. The chains'
# intermediates must be read only inside the chain (and not be graph outputs); the replacement
# node keeps the chain's last output operand, so the nodes reading it are unchanged.


class Uses:
    """Readers of every value among `nodes`, and the graph's outputs."""

    def __init__(self, nodes, outputs):
        self.out_ids = {id(v) for v in outputs.values()}
        self.by = {}
        self.prod = {id(v): n for n in nodes for v in n.outputs}  # (v._node may be a replaced node)
        self.index = {id(n): i for i, n in enumerate(nodes)}
        for n in nodes:
            for x in n.inputs:
                if x is not None:
                    lst = self.by.setdefault(id(x), [])
                    if n not in lst:
                        lst.append(n)

    def readers(self, v):
        return self.by.get(id(v), [])

    def only(self, v, node=None):
        """v is read by one node (`node` if given) and is not a graph output."""
        rs = self.readers(v)
        return id(v) not in self.out_ids and len(rs) == 1 and (node is None or rs[0] is node)

    def sole(self, v):
        """The one node reading v (v not a graph output), else None."""
        return self.readers(v)[0] if self.only(v) else None


def new_node(op, inputs, attrs, shape, like, label, data_type=None):
    """(node, its one output value) of a node a rewrite adds: the value shaped `shape`, of
    `like`'s builder and data type (or `data_type`)."""
    y = MLOperand(like._builder, data_type or like.data_type, tuple(shape), "op")
    n = Node(op, inputs, attrs, label)
    n.outputs = [y]
    y._node = n
    return n, y


def host_constant(like, data_type, value):
    """A constant of `like`'s builder holding numpy array `value` (in `data_type`)."""
    return MLOperand(like._builder, data_type, value.shape, "constant", value=value)


def replace_each(nodes, match, replace):
    """The node rewrites' loop: each node n with a hit = match(n) (not None) is replaced by the
    nodes of replace(n, hit) -> (new nodes, nodes the replacement makes dead), the new ones where n
    stood; the dead ones leave the list wherever they are. Other nodes keep their order."""
    out, drop = [], set()
    for n in nodes:
        hit = match(n)
        if hit is None:
            out.append(n)
            continue
        new, dead = replace(n, hit)
        out += new
        drop.update(id(d) for d in dead)
    return [n for n in out if id(n) not in drop]


def other_operand(n, x):
    """The operand of binary node `n` that is not `x` (None when x is not an operand, or both)."""
    a, b = n.inputs[0], n.inputs[1]
    if a is x and b is not x:
        return b
    if b is x and a is not x:
        return a
    return None
