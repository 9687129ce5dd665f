"""Graph passes on the builder's nodes: dead-node removal, constant classification, fusion.

The result is a list of Steps in topological order. A step is one node, a fused elementwise
group, or a conv2d/matmul/gemm with an epilogue: unary activations and binary elementwise nodes
whose other operand (a residual, a scale) is read at the stored element's index. A convolution
step may also have a prologue, the step producing its input applied per input channel as the
convolution loads each input element, so that tensor is never written: a batch_normalization
(+ unary activations; densenet's BatchNormalization -> Relu -> Conv), a multiplication by a
per-(batch, channel) operand (the squeeze-and-excitation scale of MobileNetV3-style blocks), or,
opt-in (MLTENSOR_FUSE_DEPTHWISE=1, see fuse_depthwise), for a 1x1 convolution the depthwise
convolution (+ activations) before it (the depthwise output computed as the 1x1 conv stages it),
or the resample2d producing its input (each input element interpolated as it is loaded).
A global average pool may carry the chain of fully connected 1x1 convolutions after it (the
squeeze-and-excitation gate: pool -> FC -> act -> FC -> act), all of it one single-workgroup
kernel per batch item (fuse_gates), and read its input through the elementwise step producing it.
"""

import math

import numpy as np

from .. import dtypes
from ..dynamic.dims import Sym, high, is_static, wgsl
from ..front.builder import MLOperand, Node
from ..ops import OPS
from ..ops.matmul import post_norm_fits
from ..switches import switch
from .attention import fuse_attention

# Storage buffers one fused kernel may bind, whatever the adapter allows (and never more than it
# allows). Adapters report from 8 (WebGPU's default, so the same fusion everywhere) up to 524,288
# (NVIDIA's Vulkan driver): growing kernels towards that only makes slow kernels and slow builds.
MAX_FUSED_BINDINGS = 8


def binding_cap(device):
    """The most storage buffers (inputs and the output) a fused kernel binds on `device`."""
    return min(MAX_FUSED_BINDINGS, device.limits["max-storage-buffers-per-shader-stage"])


# Operators whose kernels apply a fused epilogue (`kc.epilogue(bindings, args)`).
EPILOGUE_OPS = {"conv2d", "conv_transpose2d", "matmul", "gemm", "average_pool2d", "l2_pool2d", "max_pool2d",
                "batch_normalization", "instance_normalization", "layer_normalization", "_rms_normalization",
                "_fused_matmul"}


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
    """The step a convolution absorbs, applied as it loads its input (conv.py `_prologue`).
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


def _host(v):
    """A constant operand's host array (None for anything else, constant tensors included)."""
    if v is not None and v._kind == "constant" and isinstance(v._value, np.ndarray):
        return np.asarray(v._value, dtype=np.float64)
    return None


def _per_channel(v, rank, axis):
    """A host constant that broadcasts along every dimension but `axis`: its values (C or 1)."""
    a = _host(v)
    if a is None or a.ndim > rank:
        return None
    shape = (1,) * (rank - a.ndim) + a.shape
    if any(d != 1 for k, d in enumerate(shape) if k != axis):
        return None
    return a.reshape(-1)


def _fold(p, axis):
    """(scale, shift, activations) when the batch_normalization step `p` is a per-channel affine
    map of host constants (its parameters, then mul/add/sub/div by per-channel constants, as in
    densenet's BatchNormalization -> Mul -> Add -> Relu) followed by unary activations only."""
    bn = p.node
    mean, var, scale, bias = (_host(v) for v in bn.inputs[1:])
    if mean is None or var is None or any(v is not None and a is None for v, a in zip(bn.inputs[3:], (scale, bias))):
        return None
    a = 1.0 / np.sqrt(var + bn.attrs["epsilon"]) * (1.0 if scale is None else scale)
    b = (0.0 if bias is None else bias) - mean * a
    cur, acts, rank = bn.outputs[0], [], len(bn.outputs[0].shape)
    for e in p.epilogue:
        ins = [v for v in e.inputs if v is not None]
        if _unary([e]):
            acts.append(e)
        elif acts or len(ins) != 2 or e.op not in ("add", "sub", "mul", "div"):
            return None
        else:
            first = ins[0] is cur
            o = _per_channel(ins[1] if first else ins[0], rank, axis)
            if o is None or (e.op == "div" and not first):
                return None
            if e.op == "mul":
                a, b = a * o, b * o
            elif e.op == "div":
                a, b = a / o, b / o
            elif e.op == "add":
                b = b + o
            else:
                a, b = (a, b - o) if first else (-a, o - b)
        cur = e.outputs[0]
    C = bn.outputs[0].shape[axis]
    return np.broadcast_to(a, (C,)), np.broadcast_to(b, (C,)), acts


def _scale_prologue(p, x, axis):
    """(input, factor, addend or None) when step `p` multiplies a tensor shaped like `x` by an
    operand that varies along the batch and channel axes only (squeeze-and-excitation), then
    optionally adds a tensor shaped like `x` (a residual, as in MobileNetV3-style decoders)."""
    if p.epilogue or len(p.nodes) > 2 or p.nodes[0].op != "mul":
        return None
    a, b = p.nodes[0].inputs
    full, s = (a, b) if tuple(a.shape) == tuple(x.shape) else (b, a)
    if full is s or tuple(full.shape) != tuple(x.shape) or len(s.shape) > 4 or s.data_type != x.data_type:
        return None
    shape = (1,) * (4 - len(s.shape)) + tuple(s.shape)
    if any(d != 1 for k, d in enumerate(shape) if k not in (0, axis)):
        return None
    r = None
    if len(p.nodes) == 2:
        add, prod = p.nodes[1], p.nodes[0].outputs[0]
        if add.op != "add" or prod not in add.inputs:
            return None
        r = add.inputs[1] if add.inputs[0] is prod else add.inputs[0]
        if r is prod or tuple(r.shape) != tuple(x.shape) or r.data_type != x.data_type:
            return None
    return full, s, r


def _constant_pad(step):
    """Step `step` is a lone pad with a constant value (merged into a conv, read through by an epilogue)."""
    n = step.node
    return n.op == "pad" and len(step.nodes) == 1 and not step.epilogue and n.attrs["mode"] == "constant"


def _zero_pad(p, n):
    """[top, bottom, left, right] when step `p` pads conv node `n`'s input with zeros along its
    spatial dimensions only (TensorFlow's explicit padding before a strided convolution): the
    convolution pads those itself, and the pad kernel goes."""
    pn = p.node
    if not _constant_pad(p) or float(pn.attrs["value"]) != 0.0:
        return None
    h, w = (2, 3) if n.attrs["input_layout"] == "nchw" else (1, 2)
    b, e = pn.attrs["beginning_padding"], pn.attrs["ending_padding"]
    if any(b[d] or e[d] for d in range(4) if d not in (h, w)):
        return None
    return [b[h], e[h], b[w], e[w]]


def fuse_depthwise():
    """The depthwise prologue is opt-in (MLTENSOR_FUSE_DEPTHWISE=1): it saves a launch and the
    depthwise output's round trip through memory, but each 1x1-conv workgroup recomputes the
    depthwise outputs of its A tile with scalar loads, once per output-channel tile, where the
    depthwise kernel shares its input columns between 4 outputs. On lavapipe that made the
    MediaPipe detectors 1.6-3x slower (palm_detection_full 175 -> 590 ms); unmeasured on GPUs."""
    return switch("MLTENSOR_FUSE_DEPTHWISE")


def _pointwise(n):
    """conv2d node `n` is a 1x1 convolution, stride 1, no padding, one group."""
    a = n.attrs
    dims = dict(zip(a["filter_layout"], n.inputs[1].shape))
    return (n.op == "conv2d" and dims["h"] == dims["w"] == 1 and a["strides"] == [1, 1]
            and a["padding"] == [0, 0, 0, 0] and a["groups"] == 1)


def _depthwise(n):
    """conv2d node `n` is depthwise with one output channel per input channel."""
    if n.op != "conv2d":
        return False
    a = n.attrs
    c = n.inputs[0].shape[1 if a["input_layout"] == "nchw" else 3]
    dims = dict(zip(a["filter_layout"], n.inputs[1].shape))
    return a["groups"] == c > 1 and dims["o"] == c and dims["i"] == 1


def _unary(nodes):
    """Every node is a unary activation (fusable after a prologue's affine or depthwise part)."""
    return all(OPS[e.op].activation and len([v for v in e.inputs if v is not None]) == 1 for e in nodes)


def _prologue(n, producer, single_use, const, max_inputs, consumers):
    """A ConvPrologue when the step producing conv node `n`'s input can be applied as the conv
    loads it, its output read by this conv only: a batch_normalization over the conv's channel
    axis, then either a per-channel affine tail of host constants (folded into one [scale; shift]
    constant) or unary activations only (parameters read as they are); a per-(batch, channel)
    multiplication (+ a same-shaped addend); a resample2d; a zero pad of the spatial dimensions
    (merged into the convolution's padding); or, opt-in, a depthwise conv before a 1x1 conv.
    None when not, or when the kernel would bind more than `max_inputs` inputs."""
    x = n.inputs[0]
    p = producer.get(id(x))
    if p is None or p.const != const or p.outputs[0] is not x:
        return None
    if not single_use(x) or len(p.outputs) != 1 or p.prologue is not None:
        return None

    def in_concat(v, hops=0):
        """v is, or may be placed inside, a concat's output (through the elementwise nodes an
        epilogue may fuse after it)."""
        if v is None:
            return False
        if v._node is not None and v._node.op == "concat" and hops == 0:
            return True
        cs = consumers.get(id(v), ())
        return any(c.op == "concat" or (hops < 4 and OPS[c.op].expr is not None and in_concat(c.outputs[0], hops + 1))
                   for c in cs)

    if in_concat(n.outputs[0]) and any(in_concat(v) for v in p.nodes[0].inputs):
        # a conv reading a concat (or a slab of one) and writing a slab of a concat, which may be
        # the same buffer (densenet-style growth): one dispatch may not read and write one
        # buffer, so the prologue would cost the concat its copy-free placement
        return None
    axis = 1 if n.attrs["input_layout"] == "nchw" else 3
    pro = None
    if (fuse_depthwise() and _depthwise(p.node) and _pointwise(n)
            and p.node.attrs["input_layout"] == n.attrs["input_layout"] and _unary(p.epilogue)):
        pro = ConvPrologue("dw", p, p.node.inputs[0], p.epilogue)
    elif n.op == "conv2d" and (pad := _zero_pad(p, n)) is not None:
        pro = ConvPrologue("pad", p, p.node.inputs[0], pads=pad)
    elif p.node.op == "resample2d" and _unary(p.epilogue) and x.data_type in ("float32", "float16"):
        pro = ConvPrologue("resample", p, p.node.inputs[0], p.epilogue)
    elif (sc := _scale_prologue(p, x, axis)) is not None:
        pro = ConvPrologue("scaled", p, sc[0], scale=sc[1], add=sc[2])
    elif p.node.op == "batch_normalization" and p.node.attrs["axis"] == axis:
        folded = _fold(p, axis)
        if folded is not None:
            a, b, acts = folded
            dt = x.data_type
            ab = MLOperand(x._builder, dt, (2, len(a)), "constant",
                           value=np.concatenate([a, b]).astype(dtypes.NUMPY[dt]).reshape(2, -1))
            pro = ConvPrologue("bn", p, p.node.inputs[0], acts, const=ab)
        elif _unary(p.epilogue):
            pro = ConvPrologue("bn", p, p.node.inputs[0], p.epilogue)
    bound = len([v for v in n.inputs if v is not None])
    if pro is None or bound + len(pro.reads()) > max_inputs:
        return None
    return pro


# Gates (fuse_gates): one workgroup per batch item pools the plane, then runs the FC chain from
# workgroup memory. Channels per layer are capped by that memory (two arrays of GATE_MAX_CHANNELS
# f32); the plane by what one workgroup should read: GPUs stream about 100 GB/s into one compute
# unit, so 2^18 elements (1 MiB of f32) cost about what the launches the fusion saves cost
# (~5 us each measured on an H100); bigger planes keep their multi-workgroup pool kernel and only
# the FC chain is fused. Both are guesses until a GPU run measures them.
GATE_MAX_CHANNELS = 1024
GATE_MAX_POOL = 1 << 18


def global_average_pool(n):
    """The layout ("nchw" | "nhwc") in which node `n` averages whole planes of a 4-D tensor into a
    1x1 plane: an average_pool2d over the plane without padding, or a reduce_mean over both
    spatial axes that keeps them (TFLite's MEAN); else None."""
    x, y = n.inputs[0], n.outputs[0]
    if n.op == "average_pool2d":
        a = n.attrs
        plane = list(x.shape[2:] if a["layout"] == "nchw" else x.shape[1:3])
        out = list(y.shape[2:] if a["layout"] == "nchw" else y.shape[1:3])
        if a["window_dimensions"] == plane and a["padding"] == [0, 0, 0, 0] and out == [1, 1]:
            return a["layout"]
    elif n.op == "reduce_mean" and x.rank == 4 and y.rank == 4:
        return {(1, 2): "nhwc", (2, 3): "nchw"}.get(tuple(n.attrs["axes"]))
    return None


def fully_connected(n):
    """conv2d node `n` is a fully connected layer: a 1x1 filter over a 1x1 plane, one group."""
    if n.op != "conv2d":
        return False
    a, x = n.attrs, n.inputs[0]
    plane = x.shape[2:] if a["input_layout"] == "nchw" else x.shape[1:3]
    dims = dict(zip(a["filter_layout"], n.inputs[1].shape))
    return (tuple(plane) == (1, 1) and dims["h"] == dims["w"] == 1 and a["groups"] == 1
            and a["padding"] == [0, 0, 0, 0])


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
        return s.prologue is None and not s.chain and s.source is None and _unary(s.epilogue)

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
            if (f.const or not unary_only(f) or not fully_connected(f.node) or f.node.inputs[0] is not cur
                    or len(f.outputs) != 1 or f.outputs[0].data_type != x.data_type
                    or _gate_channels(f.outputs[0]) > GATE_MAX_CHANNELS):
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
        if (src is not None and src in steps and not src.const and not src.epilogue and src.outputs[0] is x
                and OPS[src.nodes[-1].op].expr is not None and single_use(x) and len(reader.get(id(x), [])) == 1
                and all(n.outputs[0].data_type in floats for n in src.nodes)
                and all(v.data_type in floats for v in external_inputs(src.nodes))):
            ins = external_inputs(src.nodes)
            if bound - 1 + len(ins) <= max_inputs:
                steps.remove(src)
                head.source = src


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


def inline_scalar(v):
    """The value of a float32/float16 host constant of one element (fused epilogues write it
    as a literal instead of binding it), else None."""
    if v.data_type not in ("float32", "float16"):
        return None
    return scalar_value(v)


def _broadcasts_to(shape, target):
    """`shape` broadcasts unidirectionally to `target` (numpy rules)."""
    if len(shape) > len(target):
        return False
    return all(a in (1, b) for a, b in zip(reversed(shape), reversed(target)))


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


def plan_steps(nodes, outputs, fuse=True, max_inputs=7, cpu=False):
    """`max_inputs`: the most inputs a fused elementwise kernel may bind (storage buffers per
    shader stage, less one for the output); `cpu`: the adapter is a CPU (POST_NORM)."""
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

    steps = []
    producer = {}  # id(value) -> step producing it
    for n in nodes:
        # (a node reading sizes known only at dispatch is never computed at build, whatever
        # its inputs: its result depends on the dispatch)
        const = all(is_const(x) for x in n.inputs if x is not None) and not any(
            id(v) in out_values for v in n.outputs
        ) and not _reads_sizes(n)
        if const:
            const_values.update(id(v) for v in n.outputs)
        op = OPS[n.op]
        if fuse and op.expr is not None:
            target = _epilogue_target(n, op, const, producer, single_use, max_inputs)
            if target is not None:
                prev, other = target
                if other is not None:
                    pad = producer.get(id(other))
                    if (pad is not None and pad in steps and _constant_pad(pad) and pad.const == const
                            and single_use(other) and tuple(other.shape) == tuple(n.outputs[0].shape)
                            and is_static(other.shape)):
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
            pro = _prologue(n, producer, single_use, const, max_inputs, consumers)
            if pro is not None and pro.step in steps:
                steps.remove(pro.step)
                step.prologue = pro
        steps.append(step)
        for v in n.outputs:
            producer[id(v)] = step
    if fuse:
        fuse_attention(steps, single_use, max_inputs)  # matmul -> softmax -> matmul: one kernel
        fuse_grouped_heads(steps, single_use)
        fuse_gates(steps, single_use, max_inputs)
        fuse_dag_epilogues(steps, consumers, out_values, max_inputs)  # last: others see chains only
        fuse_norm_sources(steps, consumers, out_values, max_inputs)
        if POST_NORM is True or (POST_NORM == "cpu" and cpu):
            fuse_post_norms(steps, consumers, out_values, max_inputs)
    return steps


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
        if (node.op not in NORM_SOURCE_OPS or st.const or st.prologue is not None or st.chain
                or st.source is not None or len(st.outputs) != 1):
            continue
        x = node.inputs[0]
        e = producer.get(id(x))
        if (e is None or e not in steps or e.const or e.epilogue or e.prologue is not None or e.chain
                or e.source is not None or len(e.outputs) != 1 or e.outputs[0] is not x
                or OPS[e.nodes[-1].op].expr is None):
            continue
        ins = external_inputs(e.nodes)
        if any(n.outputs[0].data_type != x.data_type for n in e.nodes) or any(
                v.data_type not in ("float32", "float16") for v in ins):
            continue
        if any(v is x for v in epilogue_operands(st)):
            continue
        others = [n for n in consumers.get(id(x), ()) if n is not node]
        i = steps.index(st)
        reader_steps = [s for s in steps for n in others if n in s.nodes or n in s.epilogue
                        or (s.prologue is not None and n in s.prologue.step.nodes)]
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


# LayerNorm in the epilogue of the GEMM producing its input (fuse_post_norms). "cpu": on CPU
# adapters only. The GEMM then runs one workgroup per tile of rows, walking every column tile
# itself (the rows' statistics need all columns): on lavapipe's few cores a handful of row tiles
# keep them busy and the normalization's launch and round trip go; on a GPU a 128-token
# sequence would leave 2-4 workgroups for the whole GEMM (a per-row statistics buffer written by
# the producer and the normalization applied where it is read is the GPU design; not built), so
# it stays off there until measured. True: everywhere (tests), False: off.
POST_NORM = "cpu"
POST_NORM_MAX_N = 8192  # columns of the row walk: up to BERT-large / Llama-70B widths


def _row_view(v, seg):
    """The plain segment's leaf writes v as the GEMM output's own row-major layout (an identity
    view: reshapes that keep the order only), so row m is v's elements m*N .. m*N + N - 1."""
    if len(seg.leaves) != 1 or seg.leaves[0].values != [v] or seg.leaves[0].cat is not None \
            or seg.leaves[0].rope is not None:
        return False
    view = seg.leaves[0].view
    slots = [sl for dim in view.dims for sl in dim]
    digits = [d for ax in view.axes for d in ax]
    return len(slots) == len(digits) and all(sl[0] is d and sl[1] == 0 and sl[2] == d.size
                                             for sl, d in zip(slots, digits))


def fuse_post_norms(steps, consumers, out_values, max_inputs):
    """A layer normalization over the last axis whose input is a GEMM step's output joins that
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
        if (node.op != "layer_normalization" or st.const or st.epilogue or st.prologue is not None
                or st.chain or st.source is not None or len(st.nodes) != 1 or len(st.outputs) != 1):
            continue
        x = node.inputs[0]
        if tuple(node.attrs["axes"]) != (x.rank - 1,) or not isinstance(x.shape[-1], int) \
                or x.shape[-1] > POST_NORM_MAX_N or x.shape[-1] % 4:
            continue
        g = producer.get(id(x))
        if (g is None or g not in steps or g.const or g.prologue is not None or g.chain or g.source is not None
                or g.post_norm is not None or len(g.outputs) != 1 or g.outputs[0] is not x or g.views):
            continue
        gn = g.node
        if gn.op == "matmul":
            if len(g.nodes) != 1 or gn.outputs[0].shape[-1] != x.shape[-1]:
                continue
        elif gn.op == "_fused_matmul":
            plan = gn.attrs["plan"]
            if (len(plan.segments) != 1 or plan.segments[0].kind != "plain" or plan.rms is not None
                    or len(gn.outputs) != 1 or not _row_view(gn.outputs[0], plan.segments[0])):
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


def _lone_step(s, op):
    """Step s is a single non-constant `op` node without epilogue, prologue or gate."""
    return (s is not None and len(s.nodes) == 1 and not s.epilogue and not s.const and s.prologue is None
            and not s.chain and s.source is None and s.nodes[0].op == op and len(s.outputs) == 1)


def _grouped_source(v, q, producer, single_use):
    """(kv, steps made redundant) when attention operand v ([.., H, S, D]) is K or V heads repeated
    for grouped-query attention by copies the attention kernel need not make: reshape(expand(
    reshape(kv [.., Hkv, S, D] -> [.., Hkv, 1, S, D]) -> [.., Hkv, H / Hkv, S, D]) -> [.., H, S, D])
    (transformers' repeat_kv), or expand(kv) along size-1 leading dimensions (one K/V head for all,
    or one batch entry); else None. Head h of v is kv head h // (H / Hkv), which is how
    ops/attention.py indexes a K/V operand with fewer heads."""
    r = v.rank
    if r < 3 or not single_use(v):
        return None
    st = producer.get(id(v))
    if _lone_step(st, "expand"):
        kv = st.nodes[0].inputs[0]
        if (kv.rank == r and tuple(kv.shape[-2:]) == tuple(v.shape[-2:])
                and all(_int1(a) or a == b for a, b in zip(kv.shape[:-2], v.shape[:-2]))):
            return kv, [st]
        return None
    if not _lone_step(st, "reshape"):
        return None
    e = st.nodes[0].inputs[0]
    ex = producer.get(id(e))
    if not _lone_step(ex, "expand") or not single_use(e) or e.rank != r + 1:
        return None
    u = ex.nodes[0].inputs[0]
    r0 = producer.get(id(u))
    if not _lone_step(r0, "reshape") or not single_use(u):
        return None
    kv = r0.nodes[0].inputs[0]
    if kv.rank != r:
        return None
    lead, hkv, tail = tuple(kv.shape[:-3]), kv.shape[-3], tuple(kv.shape[-2:])
    rep = e.shape[-3]
    if (tuple(u.shape) != lead + (hkv, 1) + tail or tuple(e.shape) != lead + (hkv, rep) + tail
            or tuple(v.shape) != lead + (hkv * rep,) + tail or tuple(q.shape[:-2]) != tuple(v.shape[:-2])):
        return None
    return kv, [st, ex, r0]


# The attention kernel reads the K/V heads a query-head group shares instead of their repeat
# copies (expand + reshape of grouped-query attention): on by default.
FUSE_GROUPED_HEADS = True


def fuse_grouped_heads(steps, single_use):
    """Let each fused attention read grouped K/V heads as they are (_grouped_source): the
    repeat copies go (FUSE_GROUPED_HEADS)."""
    if not FUSE_GROUPED_HEADS:
        return
    producer = {id(v): s for s in steps for v in s.outputs}
    for st in list(steps):
        n = st.nodes[0]
        if n.op != "_attention" or st.const or n.attrs.get("layout", "bhsd") != "bhsd":
            continue
        for slot in (1, 2):
            got = _grouped_source(n.inputs[slot], n.inputs[0], producer, single_use)
            if got is None or any(s not in steps for s in got[1]):
                continue
            n.inputs[slot] = got[0]
            for s in got[1]:
                steps.remove(s)


def fuse_dag_epilogues(steps, consumers, out_values, max_inputs):
    """Merge, in place, each elementwise group step reading the output x of a step that takes
    epilogues (several times: GELU's x * 0.5 * (1 + erf(x / sqrt 2)), the tanh approximation,
    x * sigmoid(x)) into that step's epilogue, as a DAG: x read only by the group, every other
    operand a float scalar constant (inlined) or a value broadcasting to x's shape, every node
    of x's shape and data type. The merged step runs where the group ran (its inputs are all
    computed by then). Runs after the other passes, which expect chains."""
    producer = {id(v): s for s in steps for v in s.outputs}
    for e in list(steps):
        if (e not in steps or e.const or e.epilogue or e.prologue is not None or e.chain or e.source is not None
                or len(e.outputs) != 1 or OPS[e.nodes[-1].op].expr is None):
            continue
        ins = external_inputs(e.nodes)
        for x in ins:
            p = producer.get(id(x))
            if (p is None or p not in steps or p is e or p.const or p.node.op not in EPILOGUE_OPS or p.chain
                    or p.source is not None or len(p.outputs) != 1 or p.outputs[0] is not x
                    or id(x) in out_values or any(n not in e.nodes for n in consumers.get(id(x), ()))):
                continue
            shape, dt = tuple(x.shape), x.data_type
            if any(tuple(n.outputs[0].shape) != shape or n.outputs[0].data_type != dt for n in e.nodes):
                break
            others = [v for v in ins if v is not x and inline_scalar(v) is None]
            if any(v.data_type != dt or not _broadcasts_to(tuple(v.shape), shape) for v in others):
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


def _epilogue_target(n, op, const, producer, single_use, max_inputs):
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
            or not _broadcasts_to(tuple(other.shape), tuple(x.shape))
        ):
            return None
        extra = epilogue_operands(prev)
        bound = read_bindings(prev)
        if all(v is not other for v in extra) and bound + 1 > max_inputs:
            return None  # one more read binding would exceed the limit (the output takes one more)
        return prev, other
    return None


# -- node rewrites: transformer patterns (before the steps are planned) ------------------------
#
# Exporters write some operators as chains of small ones (RMSNorm as Pow / ReduceMean / Add /
# Sqrt / Reciprocal / Mul). rewrite_nodes replaces each recognised chain by one internal node
# computing the same function in one kernel; everything else is planned as before. The chains'
# intermediates must be read only inside the chain (and not be graph outputs); the replacement
# node keeps the chain's last output operand, so the nodes reading it are unchanged.


class _Uses:
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


def scalar_value(v):
    """The value of a host constant with one element, else None."""
    if v is None or v._kind != "constant" or not isinstance(v._value, np.ndarray) or v._value.size != 1:
        return None
    return float(np.asarray(v._value, dtype=np.float64).reshape(()))


def _other(n, x):
    """The operand of binary node `n` that is not `x` (None when x is not an operand, or both)."""
    a, b = n.inputs[0], n.inputs[1]
    if a is x and b is not x:
        return b
    if b is x and a is not x:
        return a
    return None


def _rms_chain(n, uses):
    """(x, scale or None, axes, epsilon, nodes of the chain, output) when reduce_mean node `n`
    begins an RMS normalization as exporters write it:
        ms = reduce_mean(x * x or pow(x, 2), axes, keeping them)
        r  = 1 / sqrt(ms + eps)  as reciprocal(sqrt(.)), div(1, sqrt(.)) or pow(., -0.5)
        y  = x * r  (or x / sqrt(ms + eps))
        [y = y * scale]  (either operand order; scale varies along the normalized axes only)
    with every intermediate read only by the next node; else None."""
    sq = n.inputs[0]
    sn = uses.prod.get(id(sq))
    if sn is None or not uses.only(sq, n) or sq.data_type not in ("float32", "float16"):
        return None
    if sn.op == "mul" and sn.inputs[0] is sn.inputs[1]:
        x = sn.inputs[0]
    elif sn.op == "pow" and scalar_value(sn.inputs[1]) == 2.0:
        x = sn.inputs[0]
    else:
        return None
    ms = n.outputs[0]
    if ms.rank != x.rank or x.data_type != sq.data_type:
        return None
    axes = tuple(n.attrs["axes"])
    chain = [sn, n]
    add = uses.sole(ms)
    if add is None or add.op != "add":
        return None
    eps = scalar_value(_other(add, ms))
    if eps is None or eps < 0:
        return None
    chain.append(add)
    v = add.outputs[0]
    nx = uses.sole(v)
    if nx is None:
        return None
    y = None
    if nx.op == "pow" and nx.inputs[0] is v and scalar_value(nx.inputs[1]) == -0.5:
        chain.append(nx)
        r = nx.outputs[0]
    elif nx.op == "sqrt":
        chain.append(nx)
        s = nx.outputs[0]
        m = uses.sole(s)
        if m is None:
            return None
        if m.op == "reciprocal":
            chain.append(m)
            r = m.outputs[0]
        elif m.op == "div" and m.inputs[1] is s and scalar_value(m.inputs[0]) == 1.0:
            chain.append(m)
            r = m.outputs[0]
        elif m.op == "div" and m.inputs[0] is x and m.inputs[1] is s:
            chain.append(m)
            y = m.outputs[0]
        else:
            return None
    else:
        return None
    if y is None:
        m = uses.sole(r)
        if m is None or m.op != "mul" or _other(m, r) is not x:
            return None
        chain.append(m)
        y = m.outputs[0]
    if tuple(y.shape) != tuple(x.shape) or y.data_type != x.data_type:
        return None
    scale = None
    m = uses.sole(y)
    if m is not None and m.op == "mul":
        w = _other(m, y)
        z = m.outputs[0]
        pshape = tuple(x.shape[a] for a in axes)
        if (w is not None and w.data_type == x.data_type and tuple(z.shape) == tuple(x.shape)
                and w.rank <= x.rank and math.prod(w.shape) == math.prod(pshape)
                and all(d == 1 for d in ((1,) * (x.rank - w.rank) + tuple(w.shape))[:min(axes)])
                and tuple(d for d in w.shape if d != 1) == tuple(d for d in pshape if d != 1)
                and list(axes) == list(range(min(axes), x.rank))):
            scale, y = w, z
            chain.append(m)
    return x, scale, axes, eps, chain, y


def _rewrite_rms(nodes, uses):
    """RMS normalization chains (_rms_chain) -> one _rms_normalization node each."""
    out, drop, put = [], set(), {}
    for n in nodes:
        if n.op != "reduce_mean" or id(n) in drop:
            continue
        found = _rms_chain(n, uses)
        if found is None:
            continue
        x, scale, axes, eps, chain, y = found
        # (a scale shaped [1, .., C] is read as [C]: the same elements in the same order; the
        # lowering indexes it by the normalized dimensions)
        node = Node("_rms_normalization", [x, scale, None], {"axes": axes, "epsilon": eps}, chain[-1].label)
        node.outputs = [y]
        drop.update(id(c) for c in chain)
        put[id(chain[-1])] = node
    for n in nodes:
        if id(n) in put:
            out.append(put[id(n)])
        elif id(n) not in drop:
            out.append(n)
    return out


def rewrite_nodes(nodes, outputs, cap=MAX_FUSED_BINDINGS):
    """The live nodes with the transformer patterns replaced (module comment above); `cap`: the
    storage buffers a fused kernel may bind."""
    nodes = _rewrite_rms(nodes, _Uses(nodes, outputs))
    nodes = _rewrite_gemms(nodes, outputs, cap)
    return _rms_prologues(nodes, outputs, cap) if RMS_PROLOGUE else nodes


# Off: the GEMMs computing the normalization they read (_rms_prologues) measured 10-13% slower
# on lavapipe (Llama-style layer, hidden 1024: 357 -> 397 ms for the SwiGLU GEMM of a 128-token
# prompt, 29 -> 32 ms for its decode-step GEMV: the staged rows' sums of squares and a load of
# the scale per k cost more than the normalization kernel they save, about 0.3 ms there). On a
# GPU the GEMV would hide both behind the weights' stream; unmeasured: switch it on where a GPU
# run shows it pays (tests/test_fusion_transformer.py checks it).
RMS_PROLOGUE = False


def _rms_prologues(nodes, outputs, cap):
    """An RMS normalization over the last axis read only as the A operand of GEMMs (matmuls with
    one [K, N] B, _fused_matmul nodes reading it as it is) is computed by each of them as it
    loads A: the sum of squares of each row from the staged A tiles, the scale applied to B's
    rows, the row's factor 1 / sqrt(mean + eps) to the sums before the store (matmul.wgsl
    `fused_rms`); the normalized tensor is never written. Only where every reader takes it
    within the binding cap."""
    uses = _Uses(nodes, outputs)
    put, drop = {}, set()
    for r in nodes:
        if r.op != "_rms_normalization":
            continue
        x, scale = r.inputs[0], r.inputs[1]
        h = r.outputs[0]
        if id(h) in uses.out_ids or tuple(r.attrs["axes"]) != (x.rank - 1,) or not uses.readers(h):
            continue
        new = []
        for n in uses.readers(h):
            if n.op == "matmul" and n.inputs[0] is h and n.inputs[1] is not h and _plain_b(n) and id(n) not in put:
                seg = Segment("plain", [n], [], n.outputs[0], [Leaf(DigitView(n.outputs[0].shape), [n.outputs[0]])], [n])
                plan = FusedPlan([seg], h, None)
                base = Node("_fused_matmul", [h, n.inputs[1]], {"plan": plan}, n.label)
                base.outputs = list(n.outputs)
            elif n.op == "_fused_matmul" and n.inputs[0] is h and n.attrs["plan"].a_view is None \
                    and n.attrs["plan"].rms is None and all(v is not h for v in n.inputs[1:]) and id(n) not in put:
                base, plan = n, n.attrs["plan"]
            else:
                break
            narrow = any(s.width <= 16 for s in plan.segments)  # (one thread a row of a tile: TX >= RM)
            if narrow or len(base.inputs) + len(base.outputs) + (scale is not None) > cap:
                break
            p2 = FusedPlan(plan.segments, plan.a, None, (scale, r.attrs["epsilon"]))
            node = Node("_fused_matmul", [x] + base.inputs[1:] + ([scale] if scale is not None else []),
                        {"plan": p2}, base.label)
            node.outputs = list(base.outputs)
            new.append((n, node))
        else:
            for n, node in new:
                put[id(n)] = node
            drop.add(id(r))
    if not put:
        return nodes
    return [put.get(id(n), n) for n in nodes if id(n) not in drop]


# -- fused GEMMs: views, rotary pairs, gated units, merged projections -------------------------
#
# A matmul whose output only goes through layout operators (reshape, transpose, slice, split,
# identity: the head split of attention projections, a fused QKV split) is written by the GEMM
# straight to the values those operators produce: each written value is a view of the GEMM's
# output, and the store computes the element's index in it (DigitView). Likewise a matmul whose
# A operand is such a view (the head merge before the output projection) reads A through it.
# On top of that, _fused_matmul nodes carry:
# - a rotary position embedding of a view (rotate-half: t * cos + concat(-t2, t1) * sin, as
#   transformers' Llama exports write it): the GEMM's columns are permuted (in load_b's index
#   arithmetic, the weights stay as they are) so that column d and d + D/2 of each head are
#   computed by one thread (the x/z and y/w lanes of one vec4 of accumulators), which stores
#   both rotated values;
# - a gated unit (SwiGLU's silu(x W_gate) * (x W_up), GeGLU): the two matmuls of one A are one
#   GEMM whose columns interleave gate and up (lanes x, y: gate; z, w: up), the elementwise nodes
#   combining them applied as the pair is stored;
# - several projections of one A (Q, K, V) as one GEMM over their B operands side by side, as
#   many as the binding cap allows (each its own storage binding: the weights are not copied).


class _Digit:
    """One mixed-radix digit of a base value's axis (axes are split into digits by reshapes)."""

    __slots__ = ("axis", "size")

    def __init__(self, axis, size):
        self.axis, self.size = axis, size


def _int1(x):
    return isinstance(x, int) and x == 1


class DigitView:
    """A value reached from a `base` value through reshape / transpose / slice / split /
    identity, as dimensions over the base's digits: each dimension is a list of slots
    [digit, lo, size] (outermost first; a slot takes digit values lo .. lo + size - 1), its
    coordinate the slots' values (minus lo) in mixed radix. Every element of the view is one
    element of the base; store_index gives where a base element lands in the view (and the
    condition that it lands at all), load_index where a view element is in the base."""

    def __init__(self, shape):
        self.base = tuple(shape)
        self.axes = [[] if _int1(s) else [_Digit(a, s)] for a, s in enumerate(shape)]
        self.dims = [[[d, 0, d.size] for d in ax] for ax in self.axes]

    def copy(self):
        v = DigitView.__new__(DigitView)
        v.base, v.axes = self.base, [list(a) for a in self.axes]
        v.dims = [[list(s) for s in dim] for dim in self.dims]
        return v

    @property
    def shape(self):
        return tuple(math.prod(s[2] for s in dim) for dim in self.dims)

    def _split(self, slot, q):
        """Split slot [digit, lo, size] into an outer part of q values and the inner rest
        (size / q); the digit is split alike. False where the slot's range does not align."""
        dg, lo, size = slot
        if not (isinstance(dg.size, int) and isinstance(size, int) and isinstance(q, int)):
            return None
        if q <= 0 or size % q:
            return None
        r = size // q
        if lo % r or dg.size % r:
            return None
        outer, inner = _Digit(dg.axis, dg.size // r), _Digit(dg.axis, r)
        ax = self.axes[dg.axis]
        i = ax.index(dg)
        ax[i:i + 1] = [outer, inner]
        return [outer, lo // r, q], [inner, 0, r]

    def reshape(self, shape):
        seq = [s for dim in self.dims for s in dim]
        out, pos = [], 0
        for want in shape:
            group, prod = [], 1
            while not (prod == want):
                if pos >= len(seq):
                    return False
                s = seq[pos]
                nxt = prod * s[2]
                if nxt == want or (isinstance(nxt, int) and isinstance(want, int) and want % nxt == 0):
                    group.append(s)
                    prod = nxt
                    pos += 1
                    continue
                if not (isinstance(want, int) and isinstance(prod, int) and want % prod == 0):
                    return False
                parts = self._split(s, want // prod)
                if parts is None:
                    return False
                seq[pos:pos + 1] = list(parts)
                group.append(parts[0])
                prod *= parts[0][2]
                pos += 1
            out.append(group)
        if pos != len(seq):
            return False
        self.dims = out
        return True

    def transpose(self, perm):
        self.dims = [self.dims[p] for p in perm]
        return True

    def slice(self, starts, sizes, strides=None):
        shape = self.shape
        for d, (st, sz) in enumerate(zip(starts, sizes)):
            if _int1(sz) and _int1(shape[d]):
                continue
            if st == 0 and sz == shape[d]:
                continue
            if strides is not None and strides[d] != 1:
                return False
            if not (isinstance(st, int) and isinstance(sz, int)) or not self.dims[d]:
                return False
            dim = self.dims[d]
            inner = math.prod(s[2] for s in dim[1:])
            if not isinstance(inner, int) or st % inner or sz % inner:
                return False
            dim[0][1] += st // inner
            dim[0][2] = sz // inner
        return True

    def apply(self, n, k=0):
        """This view after layout node `n` (output k); False where it cannot be expressed."""
        if n.op == "identity":
            return True
        if n.op == "reshape":
            return self.reshape(n.outputs[0].shape)
        if n.op == "transpose":
            return self.transpose(n.attrs["permutation"])
        if n.op == "slice":
            return self.slice(n.attrs["starts"], n.attrs["sizes"], n.attrs["strides"])
        if n.op == "split":
            axis = n.attrs["axis"]
            start = sum(n.attrs["sizes"][:k])
            r = len(self.dims)
            starts = [start if d == axis else 0 for d in range(r)]
            return self.slice(starts, list(n.outputs[k].shape))
        return False

    # -- index arithmetic (WGSL) --

    def _digit_expr(self, dg, coords):
        ax = self.axes[dg.axis]
        i = ax.index(dg)
        inner = math.prod(d.size for d in ax[i + 1:])
        c = coords[dg.axis]
        e = c if _int1(inner) else f"({c} / {wgsl(inner)})"
        return e if i == 0 else f"({e} % {wgsl(dg.size)})"

    def store_index(self, coords, into=None):
        """(flat index expression in the view, [conditions]) of the base element whose
        coordinates (one WGSL expression per base axis) are `coords`. into: (shape, axis,
        offset): the view is a slab of a tensor of that shape starting at `offset` along `axis`
        (a concat's output): the index there."""
        shape = self.shape
        rs = _row_strides(shape if into is None else into[0])
        terms, conds, const = [], [], 0
        if into is not None:
            const = into[2] * rs[into[1]]
        for d, dim in enumerate(self.dims):
            inner = 1
            for dg, lo, size in reversed(dim):
                e = self._digit_expr(dg, coords)
                w = inner * rs[d]
                if not (lo == 0 and size == dg.size):
                    conds.append(f"{e} >= {wgsl(lo)}" if lo else None)
                    conds.append(f"{e} < {wgsl(lo + size)}")
                terms.append(e if _int1(w) else f"{e} * {wgsl(w)}")
                const -= lo * w
                inner = inner * size
        expr = " + ".join(terms) or "0u"
        if isinstance(const, Sym) or const > 0:
            expr = f"({expr} + {wgsl(const)})"
        elif const:
            expr = f"({expr} - {wgsl(-const)})"
        return expr, [c for c in conds if c]

    def load_index(self, coords):
        """Flat index expression in the base of the view element whose coordinates (one WGSL
        expression per view dimension) are `coords`."""
        weight = {}
        rs = _row_strides(self.base)
        for a, ax in enumerate(self.axes):
            inner = 1
            for dg in reversed(ax):
                weight[id(dg)] = inner * rs[a]
                inner = inner * dg.size
        terms = []
        for d, dim in enumerate(self.dims):
            inner = 1
            for j in range(len(dim) - 1, -1, -1):
                dg, lo, size = dim[j]
                c = coords[d] if _int1(inner) else f"({coords[d]} / {wgsl(inner)})"
                if j > 0:
                    c = f"({c} % {wgsl(size)})"
                if lo:
                    c = f"({c} + {wgsl(lo)})"
                w = weight[id(dg)]
                terms.append(c if _int1(w) else f"{c} * {wgsl(w)}")
                inner = inner * size
        return " + ".join(terms) or "0u"

    def innermost(self):
        """The slot of the view's last dimension when it is exactly the base's innermost digit,
        whole (the axis rotary pairs are taken along), else None."""
        if not self.dims or len(self.dims[-1]) != 1 or not self.axes[-1]:
            return None
        dg, lo, size = self.dims[-1][0]
        if dg is not self.axes[-1][-1] or lo != 0 or size != dg.size:
            return None
        return dg


def _row_strides(shape):
    s, out = 1, [0] * len(shape)
    for d in range(len(shape) - 1, -1, -1):
        out[d] = s
        s = s * shape[d]
    return out


def coords_of_batch(shape, var="bt"):
    """WGSL coordinates of the batch axes `shape` of flat batch index `var` (row-major)."""
    out, inner = [], 1
    for d in range(len(shape) - 1, -1, -1):
        s = shape[d]
        if _int1(s):
            out.append("0u")
            continue
        c = var if _int1(inner) else f"({var} / {wgsl(inner)})"
        if any(not _int1(x) for x in shape[:d]):
            c = f"({c} % {wgsl(s)})"
        out.append(c)
        inner = inner * s
    return out[::-1]


LAYOUT_OPS = ("reshape", "transpose", "slice", "split", "identity")


class Leaf:
    """Values a fused GEMM writes at one view of a segment's output: `values` (a value and the
    identity copies of it, same shape), `view` (a DigitView of the segment's output), and for a
    rotary leaf `rope` = (cos, sin): the values are the rotation of the view."""

    __slots__ = ("view", "values", "rope", "cat")

    def __init__(self, view, values, rope=None, cat=None):
        self.view, self.values, self.rope, self.cat = view, values, rope, cat

    def into(self):
        """store_index's `into` for a leaf written into a concat's output (cat: (the input before
        it, axis)): the output's shape, the axis, the offset there."""
        if self.cat is None:
            return None
        p, axis = self.cat
        return tuple(self.values[0].shape), axis, p.shape[axis]


class Segment:
    """One projection of a fused GEMM: kind "plain" (matmuls [mm]), "rope" (one rotary leaf,
    columns paired within heads of `head` channels) or "glu" (matmuls [gate, up], columns
    interleaved). `pre`: elementwise nodes applied per element before the views (a bias; for
    "glu" the nodes combining gate and up), `x` the value they give (the views' base), `n` its
    columns, `width` the GEMM columns it takes, `leaves` what is written, `nodes` every node it
    replaces."""

    def __init__(self, kind, mms, pre, x, leaves, nodes, head=None):
        self.kind, self.mms, self.pre, self.x, self.leaves, self.nodes = kind, mms, pre, x, leaves, nodes
        self.head = head
        self.n = x.shape[-1]
        self.width = 2 * self.n if kind == "glu" else self.n
        self.bs = [m.inputs[1] for m in mms]

    def extras(self):
        """Values read besides A and the B operands (host scalars are inlined: not bound)."""
        out = []
        for n in self.pre:
            for v in n.inputs:
                if v is not None and v not in out and not _produced(v, self) and scalar_value(v) is None:
                    out.append(v)
        for leaf in self.leaves:
            if leaf.rope:
                out += [v for v in leaf.rope if not any(v is o for o in out)]
            if leaf.cat and not any(leaf.cat[0] is o for o in out):
                out.append(leaf.cat[0])
        return out

    def outputs(self):
        return [v for leaf in self.leaves for v in leaf.values]


def _produced(v, seg):
    return any(v is m.outputs[0] for m in seg.mms) or any(v is n.outputs[0] for n in seg.pre)


class FusedPlan:
    """attrs["plan"] of a _fused_matmul node: `segments` side by side along the GEMM's columns,
    `a_view` (a DigitView of inputs[0] that A is, or None: inputs[0] is A), `a` the A operand
    the matmuls read (its shape), `rms`: (scale or None, epsilon) where A is the RMS
    normalization of inputs[0] (_rms_prologues; the scale then the node's last input). The
    node's inputs: A's source, the segments' B operands, their extras[, the scale]."""

    def __init__(self, segments, a, a_view, rms=None):
        self.segments, self.a, self.a_view, self.rms = segments, a, a_view, rms


def _epilogue_operand_ok(n, cur):
    """Elementwise node `n` reading `cur` can be applied per element of cur's shape: unary, or
    binary with the other operand broadcasting to cur (same data type, same output shape)."""
    op = OPS[n.op]
    if op.expr is None or len(n.outputs) != 1:
        return False
    y = n.outputs[0]
    if tuple(y.shape) != tuple(cur.shape) or y.data_type != cur.data_type:
        return False
    ins = [v for v in n.inputs if v is not None]
    if op.activation and len(ins) == 1 and ins[0] is cur:
        return True
    if len(n.inputs) != 2 or len(ins) != 2:
        return False
    other = _other(n, cur)
    return (other is not None and other.data_type == cur.data_type
            and _broadcasts_to(tuple(other.shape), tuple(cur.shape)))


def _copies(v, uses):
    """[v if read by anything but identities or an output] + identity copies of v."""
    rs = uses.readers(v)
    vals = [v] if id(v) in uses.out_ids or any(r.op != "identity" for r in rs) else []
    return vals + [r.outputs[0] for r in rs if r.op == "identity"], [r for r in rs if r.op == "identity"]


def _concat_after(v, uses):
    """(concat node, input before v, axis) when v is read only by a concat of two inputs, v the
    second, along an axis other than the last: a KV cache's present = concat(past, new). The
    GEMM writing v then writes the concat's output: v's rows at their place, and (copy_in) the
    past's."""
    rs = uses.readers(v)
    if id(v) in uses.out_ids or len(rs) != 1:
        return None
    n = rs[0]
    if n.op != "concat" or len(n.inputs) != 2 or n.inputs[1] is not v or n.inputs[0] is v:
        return None
    axis = n.attrs["axis"]
    if axis == v.rank - 1 or n.inputs[0].data_type != v.data_type:
        return None
    return n, n.inputs[0], axis


def _leaf(view, v, uses, rope=None):
    """(Leaf writing value v (or the concat of a cache it ends, _concat_after), nodes absorbed)."""
    cat = _concat_after(v, uses)
    if cat is not None:
        vals, ids = _copies(cat[0].outputs[0], uses)
        return Leaf(view, vals, rope, (cat[1], cat[2])), [cat[0]] + ids
    vals, ids = _copies(v, uses)
    return Leaf(view, vals, rope), ids


def _rope_at(t, uses):
    """(cos, sin, nodes, output) when t's readers are exactly a rotate-half rotary embedding:
    add(mul(t, cos), mul(concat(neg(t[.., D/2:]), t[.., :D/2]), sin)) (operands in either order),
    intermediates read only there, D a multiple of 8 (the GEMM pairs channels d and d + D/2 in
    octets of columns); else None."""
    D = t.shape[-1] if t.rank else None
    if not isinstance(D, int) or D % 8 or id(t) in uses.out_ids:
        return None
    rs = uses.readers(t)
    if len(rs) != 3:
        return None
    half, r = D // 2, t.rank
    lo = hi = mc = None
    for n in rs:
        if n.op == "slice" and n.inputs[0] is t and all(s == 1 for s in n.attrs["strides"]):
            st, sz = n.attrs["starts"], n.attrs["sizes"]
            if any(st[d] != 0 or sz[d] != t.shape[d] for d in range(r - 1)) or sz[-1] != half:
                return None
            if st[-1] == 0:
                lo = n
            elif st[-1] == half:
                hi = n
            else:
                return None
        elif n.op == "mul":
            mc = n
        else:
            return None
    if lo is None or hi is None or mc is None:
        return None
    x1, x2 = lo.outputs[0], hi.outputs[0]
    neg = uses.sole(x2)
    if neg is None or neg.op != "neg" or not uses.only(x1):
        return None
    cat = uses.sole(neg.outputs[0])
    if cat is None or cat.op != "concat" or cat.attrs["axis"] != r - 1 or list(cat.inputs) != [neg.outputs[0], x1]:
        return None
    ms = uses.sole(cat.outputs[0])
    if ms is None or ms.op != "mul":
        return None
    cos, sin = _other(mc, t), _other(ms, cat.outputs[0])
    if cos is None or sin is None:
        return None
    add = uses.sole(mc.outputs[0])
    if add is None or add.op != "add" or uses.sole(ms.outputs[0]) is not add or _other(add, mc.outputs[0]) is not ms.outputs[0]:
        return None
    y = add.outputs[0]
    for v in (cos, sin):
        if v.data_type != t.data_type or not _broadcasts_to(tuple(v.shape), tuple(t.shape)):
            return None
    if any(tuple(n.outputs[0].shape) != tuple(t.shape) for n in (mc, ms, add)) or y.data_type != t.data_type:
        return None
    return cos, sin, [lo, hi, neg, cat, mc, ms, add], y


def _view_tree(x, uses, max_leaves):
    """(leaves, nodes) of the layout operators after value x (module comment): a value every
    reader of which is a layout operator that a DigitView expresses (not a graph output) is not
    written; the others are (their identity copies with them); a value whose readers are a
    rotary embedding gives a rotary leaf. None when nothing is gained (x itself the only leaf)."""
    leaves, nodes = [], []
    stack = [(x, DigitView(x.shape))]
    while stack:
        v, view = stack.pop()
        rs = uses.readers(v)
        rope = _rope_at(v, uses)
        if rope is not None and view.innermost() is not None:
            cos, sin, rnodes, y = rope
            leaf, ids = _leaf(view, y, uses, (cos, sin))
            if not leaf.values:
                return None
            leaves.append(leaf)
            nodes += rnodes + ids
            continue
        branches = []
        ok = id(v) not in uses.out_ids and bool(rs)
        for r in rs if ok else ():
            if r.op not in LAYOUT_OPS or r.inputs[0] is not v:
                ok = False
                break
            if r.op == "transpose" and _kt_transpose(r, uses):
                ok = False  # (attention reads K through its own Kᵀ transpose)
                break
            for k in range(len(r.outputs)):
                w = view.copy()
                if not w.apply(r, k):
                    ok = False
                    break
                branches.append((r.outputs[k], w))
            if not ok:
                break
        if ok:
            nodes += [r for r in rs if r not in nodes]
            stack.extend(branches)
            continue
        leaf, ids = _leaf(view, v, uses)
        leaves.append(leaf)
        nodes += ids
        if len(leaves) > max_leaves:
            return None
    if len(leaves) == 1 and leaves[0].values == [x] and not leaves[0].rope:
        return None
    return leaves, nodes


def _kt_transpose(n, uses):
    """Transpose node n swaps the last two axes and feeds a matmul's second operand (attention's
    K^T, which the attention kernel reads in place)."""
    p = list(n.attrs["permutation"])
    r = len(p)
    if r < 2 or p != list(range(r - 2)) + [r - 1, r - 2]:
        return False
    return any(m.op == "matmul" and m.inputs[1] is n.outputs[0] for m in uses.readers(n.outputs[0]))


def _plain_b(mm):
    """The matmul's B is one constant [K, N] matrix for every batch entry (a projection's
    weights: never the attention's K or V, which the attention pass needs as matmuls), N a
    static multiple of 4."""
    b = mm.inputs[1]
    n = b.shape[-1]
    return (b._kind == "constant" and all(_int1(d) for d in b.shape[:-2]) and isinstance(n, int) and n % 4 == 0
            and mm.inputs[0].data_type in ("float32", "float16"))


def _segment(mm, uses, max_leaves):
    """The plain or rotary Segment of matmul node `mm` (pre nodes, then the view tree), or None."""
    if not _plain_b(mm):
        return None
    x = mm.outputs[0]
    pre, cur = [], x
    while uses.only(cur):
        n = uses.sole(cur)
        if not _epilogue_operand_ok(n, cur):
            break
        pre.append(n)
        cur = n.outputs[0]
    tree = _view_tree(cur, uses, max_leaves)
    if tree is None and pre:  # the pre nodes without views are an ordinary epilogue
        pre, cur = [], x
        tree = _view_tree(cur, uses, max_leaves)
    if tree is None:
        return None
    leaves, vnodes = tree
    ropes = [lf for lf in leaves if lf.rope]
    if ropes:
        if len(leaves) != 1:
            return None
        head = leaves[0].view.innermost().size
        if x.shape[-1] % head:
            return None
        return Segment("rope", [mm], pre, cur, leaves, [mm] + pre + vnodes, head=head)
    return Segment("plain", [mm], pre, cur, leaves, [mm] + pre + vnodes)


def _glu(g_mm, u_mm, uses, order):
    """The "glu" Segment of matmuls g_mm (gate) and u_mm (up) of one A: the elementwise nodes
    reading only their outputs, scalar host constants and values made before both, with exactly
    one value y leaving them, depending on both; or None."""
    g, u = g_mm.outputs[0], u_mm.outputs[0]
    if (tuple(g.shape) != tuple(u.shape) or g.data_type != u.data_type or id(g) in uses.out_ids
            or id(u) in uses.out_ids or not (_plain_b(g_mm) and _plain_b(u_mm))):
        return None
    first = min(order[id(g_mm)], order[id(u_mm)])
    inside = {id(g), id(u)}
    region = []
    grew = True
    while grew:
        grew = False
        for v in [g, u] + [n.outputs[0] for n in region]:
            for n in uses.readers(v):
                if n in region or OPS[n.op].expr is None or len(n.outputs) != 1:
                    continue
                y = n.outputs[0]
                if tuple(y.shape) != tuple(g.shape) or y.data_type != g.data_type:
                    continue
                if all(x is None or id(x) in inside or scalar_value(x) is not None
                       or (id(x) not in uses.prod or order[id(uses.prod[id(x)])] < first)
                       and _broadcasts_to(tuple(x.shape), tuple(g.shape)) and x.data_type == g.data_type
                       for x in n.inputs):
                    region.append(n)
                    inside.add(id(y))
                    grew = True
    if not region:
        return None
    leaving = [n.outputs[0] for n in region
               if id(n.outputs[0]) in uses.out_ids or any(r not in region for r in uses.readers(n.outputs[0]))]
    if any(r not in region for v in (g, u) for r in uses.readers(v)) or len(leaving) != 1:
        return None
    y = leaving[0]
    # (both read: y depends on g and u)
    dep, stack = set(), [y]
    while stack:
        v = stack.pop()
        if id(v) in dep:
            continue
        dep.add(id(v))
        p = uses.prod.get(id(v))
        if v is not g and v is not u and p in region:
            stack.extend(x for x in p.inputs if x is not None and id(x) in inside)
    if id(g) not in dep or id(u) not in dep:
        return None
    region = [n for n in region if id(n.outputs[0]) in dep]
    # topological order (the node list's)
    region.sort(key=lambda n: order[id(n)])
    vals, ids = _copies(y, uses)
    leaves = [Leaf(DigitView(y.shape), vals)]
    return Segment("glu", [g_mm, u_mm], region, y, leaves, [g_mm, u_mm] + region + ids)


def _a_view(mm, uses):
    """(base value, DigitView) when matmul mm's A is a layout view (reshape / transpose of a value,
    read by nothing else) of another value: the head merge transpose; else None."""
    a = mm.inputs[0]
    chain = []
    v = a
    while id(v) in uses.prod and uses.prod[id(v)].op in ("reshape", "transpose") and uses.only(v):
        chain.append(uses.prod[id(v)])
        v = chain[-1].inputs[0]
    if not any(n.op == "transpose" for n in chain):
        return None
    view = DigitView(v.shape)
    for n in reversed(chain):
        if not view.apply(n):
            return None
    if tuple(view.shape) != tuple(a.shape) or any(not _int1(d) for d in a.shape[:-2]):
        return None
    return v, view, chain


def _bindings_of(segs, a_extra=0):
    """Storage buffers of one fused GEMM of these segments: A, the B operands, the extras (each
    distinct value once) and the written values."""
    extras = []
    for s in segs:
        extras += [v for v in s.extras() if not any(v is e for e in extras)]
    return 1 + a_extra + sum(len(s.bs) for s in segs) + len(extras) + sum(len(s.outputs()) for s in segs)


def _rewrite_gemms(nodes, outputs, cap):
    """Matmuls -> _fused_matmul nodes (module comment above); the node list re-sorted."""
    uses = _Uses(nodes, outputs)
    order = {id(n): i for i, n in enumerate(nodes)}
    mms = [n for n in nodes if n.op == "matmul" and n.inputs[0].data_type in ("float32", "float16")]
    taken = set()
    fused = []  # (segments, a_view info)
    # gated units first: two matmuls of one A whose outputs meet in elementwise nodes
    by_a = {}
    for m in mms:
        by_a.setdefault(id(m.inputs[0]), []).append(m)
    for group in by_a.values():
        for i, g in enumerate(group):
            for u in group[i + 1:]:
                if id(g) in taken or id(u) in taken:
                    continue
                if tuple(g.inputs[1].shape) != tuple(u.inputs[1].shape):
                    continue
                seg = None
                for gate, up in ((g, u), (u, g)):
                    seg = _glu(gate, up, uses, order)
                    if seg is not None:
                        break
                if seg is not None and _bindings_of([seg]) <= cap:
                    fused.append(([seg], None))
                    taken.update((id(g), id(u)))
    # projections: views after the output (merged when they share A), or a view before A
    for group in by_a.values():
        segs = []
        for m in group:
            if id(m) in taken:
                continue
            s = _segment(m, uses, cap - 2)
            if s is not None and _bindings_of([s]) <= cap:
                segs.append(s)
        run = []
        for s in segs:
            octets = any(x.kind != "plain" for x in run + [s])  # pair segments: 8-column stores
            if run and (_bindings_of(run + [s]) > cap or s.mms[0].inputs[1].shape[-2] != run[0].mms[0].inputs[1].shape[-2]
                        or octets and any(x.width % 8 for x in run + [s])):
                fused.append((run, None))
                run = []
            run.append(s)
            taken.add(id(s.mms[0]))
        if run:
            fused.append((run, None))
    absorbed = {id(n) for segs, _ in fused for s in segs for n in s.nodes}
    for m in mms:
        if id(m) in taken or not _plain_b(m):
            continue
        av = _a_view(m, uses)
        if av is None or any(id(n) in absorbed for n in av[2]):
            continue  # (a layout chain another GEMM writes the end of: A is that written value)
        seg = Segment("plain", [m], [], m.outputs[0], [Leaf(DigitView(m.outputs[0].shape), [m.outputs[0]])], [m])
        fused.append(([seg], av))
        taken.add(id(m))
    if not fused:
        return nodes
    return _place_fused(nodes, fused, order)


def _fused_node(segs, av):
    first = segs[0].mms[0]
    a = first.inputs[0]
    src, view, chain = (a, None, []) if av is None else av
    extras = []
    for s in segs:
        extras += [v for v in s.extras() if not any(v is e for e in extras)]
    inputs = [src] + [b for s in segs for b in s.bs] + extras
    node = Node("_fused_matmul", inputs, {"plan": FusedPlan(segs, a, view)}, first.label)
    node.outputs = [v for s in segs for v in s.outputs()]
    return node, [n for s in segs for n in s.nodes] + chain


def _place_fused(nodes, fused, order):
    """The node list with each fused group's nodes replaced by its _fused_matmul node, sorted
    topologically (stable: original order where free). A group that would make a cycle (one of
    its inputs computed from one of its outputs) is left unfused."""
    made = [_fused_node(segs, av) for segs, av in fused]
    while True:
        drop = {}
        for i, (node, gone) in enumerate(made):
            for n in gone:
                drop[id(n)] = i
        rest = [n for n in nodes if id(n) not in drop] + [node for node, _ in made]
        key = {id(n): order[id(n)] for n in nodes if id(n) not in drop}
        for node, gone in made:
            key[id(node)] = min(order[id(n)] for n in gone)
        out = _topo(rest, key)
        if out is not None:
            return out
        # a cycle: drop the group with the latest first node and try again
        made.pop(max(range(len(made)), key=lambda i: key[id(made[i][0])]))
        if not made:
            return nodes


def _topo(nodes, key):
    """Nodes in topological order (ties by key), or None on a cycle."""
    import heapq

    prod = {id(v): n for n in nodes for v in n.outputs}
    deps = {id(n): {id(prod[id(x)]) for x in n.inputs if x is not None and id(x) in prod} - {id(n)} for n in nodes}
    users = {}
    for n in nodes:
        for d in deps[id(n)]:
            users.setdefault(d, []).append(n)
    byid = {id(n): n for n in nodes}
    pos = {id(n): i for i, n in enumerate(nodes)}
    heap = [(key[id(n)], i, id(n)) for i, n in enumerate(nodes) if not deps[id(n)]]
    heapq.heapify(heap)
    left = {k: len(v) for k, v in deps.items()}
    out = []
    while heap:
        _, _, k = heapq.heappop(heap)
        out.append(byid[k])
        for u in users.get(k, ()):
            left[id(u)] -= 1
            if left[id(u)] == 0:
                heapq.heappush(heap, (key[id(u)], pos[id(u)], id(u)))
    return out if len(out) == len(nodes) else None
