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
import os

import numpy as np

from .. import dtypes
from ..dynamic.dims import Sym, is_static
from ..front.builder import MLOperand
from ..ops import OPS
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
                "batch_normalization", "instance_normalization", "layer_normalization"}


class Step:
    __slots__ = ("nodes", "epilogue", "const", "outputs", "prologue", "chain", "source", "views")

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
    return os.environ.get("MLTENSOR_FUSE_DEPTHWISE", "") not in ("", "0")


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
    """Distinct values the step's epilogue reads besides its chain value, in order of first use:
    the other operands of its binary nodes (extra bindings of the fused kernel)."""
    cur = step.nodes[0].outputs[0]
    seen, out = set(), []
    for n in step.epilogue:
        for x in n.inputs:
            if x is not None and x is not cur and id(x) not in seen:
                seen.add(id(x))
                out.append(x)
        cur = n.outputs[0]
    return out


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
        fuse_gates(steps, single_use, max_inputs)
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
