"""Convolution prologues: the step producing a convolution's input, applied per input channel as
the convolution loads each input element, so that tensor is never written: a
batch_normalization (+ unary activations; densenet's BatchNormalization -> Relu -> Conv), a
multiplication by a per-(batch, channel) operand (the squeeze-and-excitation scale of
MobileNetV3-style blocks), a zero pad of the spatial dimensions, or, opt-in
(MLTENSOR_FUSE_DEPTHWISE=1, see fuse_depthwise), for a 1x1 convolution the depthwise convolution
(+ activations) before it, or the resample2d producing its input (each input element
interpolated as it is loaded).

Emitter: ops/conv.py `_prologue` (the WGSL of `pro`); shader hook: shaders/conv2d.wgsl `x_at` /
`x_at4` (every read of x goes through them).
"""

import numpy as np

from ... import dtypes
from ...ir.graph import MLOperand
from ...ir.registry import OPS
from ...switches import switch
from ..steps import ConvPrologue, all_unary


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
        if all_unary([e]):
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


def constant_pad(step):
    """Step `step` is a lone pad with a constant value (merged into a conv, read through by an epilogue)."""
    n = step.node
    return n.op == "pad" and len(step.nodes) == 1 and not step.epilogue and n.attrs["mode"] == "constant"


def _zero_pad(p, n):
    """[top, bottom, left, right] when step `p` pads conv node `n`'s input with zeros along its
    spatial dimensions only (TensorFlow's explicit padding before a strided convolution): the
    convolution pads those itself, and the pad kernel goes."""
    pn = p.node
    if not constant_pad(p) or float(pn.attrs["value"]) != 0.0:
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
    return (
        n.op == "conv2d"
        and dims["h"] == dims["w"] == 1
        and a["strides"] == [1, 1]
        and a["padding"] == [0, 0, 0, 0]
        and a["groups"] == 1
    )


def _depthwise(n):
    """conv2d node `n` is depthwise with one output channel per input channel."""
    if n.op != "conv2d":
        return False
    a = n.attrs
    c = n.inputs[0].shape[1 if a["input_layout"] == "nchw" else 3]
    dims = dict(zip(a["filter_layout"], n.inputs[1].shape))
    return a["groups"] == c > 1 and dims["o"] == c and dims["i"] == 1


def conv_prologue(n, producer, single_use, const, max_inputs, consumers):
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
        return any(
            c.op == "concat" or (hops < 4 and OPS[c.op].expr is not None and in_concat(c.outputs[0], hops + 1))
            for c in cs
        )

    if in_concat(n.outputs[0]) and any(in_concat(v) for v in p.nodes[0].inputs):
        # a conv reading a concat (or a slab of one) and writing a slab of a concat, which may be
        # the same buffer (densenet-style growth): one dispatch may not read and write one
        # buffer, so the prologue would cost the concat its copy-free placement
        return None
    axis = 1 if n.attrs["input_layout"] == "nchw" else 3
    pro = None
    if (
        fuse_depthwise()
        and _depthwise(p.node)
        and _pointwise(n)
        and p.node.attrs["input_layout"] == n.attrs["input_layout"]
        and all_unary(p.epilogue)
    ):
        pro = ConvPrologue("dw", p, p.node.inputs[0], p.epilogue)
    elif n.op == "conv2d" and (pad := _zero_pad(p, n)) is not None:
        pro = ConvPrologue("pad", p, p.node.inputs[0], pads=pad)
    elif p.node.op == "resample2d" and all_unary(p.epilogue) and x.data_type in ("float32", "float16"):
        pro = ConvPrologue("resample", p, p.node.inputs[0], p.epilogue)
    elif (sc := _scale_prologue(p, x, axis)) is not None:
        pro = ConvPrologue("scaled", p, sc[0], scale=sc[1], add=sc[2])
    elif p.node.op == "batch_normalization" and p.node.attrs["axis"] == axis:
        folded = _fold(p, axis)
        if folded is not None:
            a, b, acts = folded
            dt = x.data_type
            ab = MLOperand(
                x._builder,
                dt,
                (2, len(a)),
                "constant",
                value=np.concatenate([a, b]).astype(dtypes.NUMPY[dt]).reshape(2, -1),
            )
            pro = ConvPrologue("bn", p, p.node.inputs[0], acts, const=ab)
        elif all_unary(p.epilogue):
            pro = ConvPrologue("bn", p, p.node.inputs[0], p.epilogue)
    bound = len([v for v in n.inputs if v is not None])
    if pro is None or bound + len(pro.reads()) > max_inputs:
        return None
    return pro
