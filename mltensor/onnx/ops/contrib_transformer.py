"""onnxruntime contrib operators (com.microsoft) that its transformer optimizer and older graph
fusions emit, other than attention (contrib_attention.py): the skip / simplified layer
normalizations, EmbedLayerNormalization, the GELU family, BiasAdd, FusedConv, FusedMatMul.

Each is lowered onto WebNN operators the compiler fuses again where it can (a bias add or an
activation becomes a matmul/conv epilogue). Semantics follow onnxruntime's CPU kernels, which the
tests compare against (tests/test_onnx_contrib.py).
"""

import numpy as np

from ..errors import unsupported
from ._helpers import norm_axis, scalar, X
from ._registry import op
from .conv import conv
from .elementwise import gelu as _onnx_gelu
from .matmul import matmul


def contrib_op(name, attrs=()):
    return op(f"com.microsoft.{name}", attrs=attrs)


def wanted(node, i):
    return len(node.output) > i and bool(node.output[i])


def float_input(x, what):
    if x.data_type not in ("float32", "float16"):
        unsupported(f"{what} of data type {x.data_type} is not supported (float32/float16 only)")
    return x


# -- GELU family ---------------------------------------------------------------------------------


def _tanh_gelu(im, x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): onnxruntime's FastGelu is ONNX's
    Gelu(approximate="tanh"), whose handler builds it."""
    return _onnx_gelu(im, None, [x], {"approximate": "tanh"})


@contrib_op("Gelu")
def _gelu(im, node, ins, attrs):
    return im.b.gelu(float_input(X(im, ins[0]), "X"))


@contrib_op("BiasGelu")
def _bias_gelu(im, node, ins, attrs):
    x = float_input(X(im, ins[0]), "A")
    return im.b.gelu(im.b.add(x, X(im, ins[1], x)))


@contrib_op("FastGelu")
def _fast_gelu(im, node, ins, attrs):
    x = float_input(X(im, ins[0]), "X")
    if len(ins) > 1 and ins[1] is not None:
        x = im.b.add(x, X(im, ins[1], x))
    return _tanh_gelu(im, x)


@contrib_op("QuickGelu", attrs=("alpha",))
def _quick_gelu(im, node, ins, attrs):
    x = float_input(X(im, ins[0]), "X")
    alpha = float(attrs.get("alpha", 1.702))
    b = im.b
    return b.mul(x, b.sigmoid(b.mul(x, scalar(im, alpha, x)) if alpha != 1.0 else x))


@contrib_op("BiasAdd")
def _bias_add(im, node, ins, attrs):
    x = float_input(X(im, ins[0]), "X")
    return im.b.add(im.b.add(x, X(im, ins[1], x)), X(im, ins[2], x))


# -- layer normalizations --------------------------------------------------------------------------


def _skip_sum(im, ins, bias_at):
    """input + skip (+ bias): the skip may be (B, S, H), (1, S, H) or (S, H), which broadcasts."""
    x = float_input(X(im, ins[0]), "input")
    if len(x.shape) < 2:
        unsupported(f"input of rank {len(x.shape)} is not supported (2-D or 3-D)")
    s = im.b.add(x, X(im, ins[1], x))
    if len(ins) > bias_at and ins[bias_at] is not None:
        s = im.b.add(s, X(im, ins[bias_at], x))
    return s


def _f32(im, x):
    return x if x.data_type == "float32" else im.b.cast(x, "float32")


def _rms(im, x, axes, eps):
    """1 / sqrt(mean(x^2) + eps) over `axes`, kept as size-1 dimensions."""
    b = im.b
    ms = b.reduce_mean(b.mul(x, x), axes=axes, keep_dimensions=True)
    return b.reciprocal(b.sqrt(b.add(ms, scalar(im, eps, x))))


@contrib_op("SkipLayerNormalization", attrs=("epsilon",))
def _skip_layer_norm(im, node, ins, attrs):
    # inputs: input, skip, gamma, beta?, bias?; outputs: output, mean?, inv_std_var?, sum?
    s = _skip_sum(im, ins, 4)
    b = im.b
    eps = float(attrs.get("epsilon", 1e-12))
    r = len(s.shape)
    kw = {"axes": [r - 1], "epsilon": eps, "scale": X(im, ins[2], s)}
    if len(ins) > 3 and ins[3] is not None:
        kw["bias"] = X(im, ins[3], s)
    y = b.layer_normalization(s, **kw)
    outs = [y, None, None, None]
    if wanted(node, 1) or wanted(node, 2):
        # onnxruntime's statistics, shaped like the input with the hidden axis kept as 1, float32
        # whatever the input's type
        s32 = _f32(im, s)
        mean = b.reduce_mean(s32, axes=[r - 1], keep_dimensions=True)
        c = b.sub(s32, mean)
        var = b.reduce_mean(b.mul(c, c), axes=[r - 1], keep_dimensions=True)
        outs[1] = mean
        outs[2] = b.reciprocal(b.sqrt(b.add(var, scalar(im, eps, s32))))
    if wanted(node, 3):
        outs[3] = s
    return outs


@contrib_op("SkipSimplifiedLayerNormalization", attrs=("epsilon",))
def _skip_simplified_layer_norm(im, node, ins, attrs):
    # inputs: input, skip, gamma, bias?; outputs: output, mean?, inv_std_var?, sum?
    s = _skip_sum(im, ins, 3)
    b = im.b
    r = len(s.shape)
    inv = _rms(im, s, [r - 1], float(attrs.get("epsilon", 1e-12)))
    y = b.mul(b.mul(s, inv), X(im, ins[2], s))
    outs = [y, None, None, None]
    inv32 = _f32(im, inv)  # the statistics are float32 whatever the input's type
    if wanted(node, 1):
        # RMS normalization has no mean: onnxruntime writes zeros there, and so do we
        outs[1] = b.expand(b.constant(np.zeros([1] * r, np.float32)), list(inv32.shape))
    if wanted(node, 2):
        outs[2] = inv32
    if wanted(node, 3):
        outs[3] = s
    return outs


# onnxruntime registers SimplifiedLayerNormalization (RMSNorm) in the default ONNX domain
@op("SimplifiedLayerNormalization", attrs=("axis", "epsilon", "stash_type"))
def _simplified_layer_norm(im, node, ins, attrs):
    x = float_input(X(im, ins[0]), "X")
    scale = X(im, ins[1])
    float_input(scale, "scale")
    b = im.b
    r = len(x.shape)
    axis = norm_axis(attrs.get("axis", -1), r)
    xs = x if x.data_type == scale.data_type else b.cast(x, "float32")
    sc = scale if x.data_type == scale.data_type else b.cast(scale, "float32")
    inv = _rms(im, xs, list(range(axis, r)), float(attrs.get("epsilon", 1e-5)))
    y = b.mul(b.mul(xs, inv), sc)
    if y.data_type != scale.data_type:  # Y has the scale's type (V), X may differ (T)
        y = b.cast(y, scale.data_type)
    outs = [y]
    if wanted(node, 1):
        outs.append(_f32(im, inv))
    return outs


@contrib_op("EmbedLayerNormalization", attrs=("epsilon", "mask_index_type"))
def _embed_layer_norm(im, node, ins, attrs):
    # inputs: input_ids, segment_ids?, word_embedding, position_embedding, segment_embedding?,
    # gamma, beta, mask?, position_ids?; outputs: output, mask_index?, embedding_sum?
    ins = list(ins) + [None] * (9 - len(ins))
    ids, seg_ids, word, pos, seg, gamma, beta, mask, pos_ids = ins[:9]
    b = im.b
    ids = to_int32(im, X(im, ids))
    if len(ids.shape) != 2:
        unsupported(f"input_ids of rank {len(ids.shape)} is not supported (2-D [batch, sequence])")
    batch, seq = ids.shape
    word = float_input(X(im, word), "word_embedding")
    e = b.gather(word, ids, axis=0)  # (B, S, H)
    pos = X(im, pos, word)
    if pos_ids is not None:
        # (B, S) or (1, S): the positions of each token (the latter broadcast over the batch)
        e = b.add(e, b.gather(pos, to_int32(im, X(im, pos_ids)), axis=0))
    else:
        # positions 0 .. S-1: the first S rows of the table, broadcast over the batch
        rows = b.slice(pos, [0, 0], [seq, pos.shape[1]])
        e = b.add(e, rows)
    if (seg_ids is None) != (seg is None):
        unsupported("segment_ids and segment_embedding must be given together")
    if seg_ids is not None:
        e = b.add(e, b.gather(X(im, seg, word), to_int32(im, X(im, seg_ids)), axis=0))
    y = b.layer_normalization(
        e, axes=[2], scale=X(im, gamma, word), bias=X(im, beta, word), epsilon=float(attrs.get("epsilon", 1e-12))
    )
    outs = [y, None, None]
    if wanted(node, 1):
        if mask is not None:
            # onnxruntime counts the entries equal to 1 (not the nonzero ones)
            m = to_int32(im, X(im, mask))
            ones = b.cast(b.equal(m, b.constant(np.array(1, np.int32))), "int32")
            outs[1] = b.reduce_sum(ones, axes=[1], keep_dimensions=False)
        else:
            outs[1] = b.expand(b.constant(np.zeros([1], np.int32)), [batch])
    if wanted(node, 2):
        outs[2] = e
    return outs


def to_int32(im, x):
    return x if x.data_type == "int32" else im.b.cast(x, "int32")


# -- FusedConv, FusedMatMul ------------------------------------------------------------------------


def _activation_params(attrs, name, n):
    p = attrs.get("activation_params")
    if p is None or len(p) < n:
        unsupported(f"activation={name!r} needs {n} activation_params, got {list(p or [])}")
    return [float(v) for v in p]


@contrib_op(
    "FusedConv",
    attrs=("activation", "activation_params", "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"),
)
def _fused_conv(im, node, ins, attrs):
    """activation(Conv(X, W, B) + Z): onnxruntime adds the optional Z before the activation."""
    act = attrs.get("activation")
    b = im.b
    # validate the activation before building the convolution
    if act is not None and act not in ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid"):
        unsupported(f"activation={act!r} is not supported (Relu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid)")
    params = None
    if act in ("LeakyRelu", "Clip", "HardSigmoid"):
        params = _activation_params(attrs, act, 1 if act == "LeakyRelu" else 2)
    y = conv(im, node, list(ins[:3]), attrs)
    if len(ins) > 3 and ins[3] is not None:
        y = b.add(y, X(im, ins[3], y))
    if act is None:
        return y
    if act == "Relu":
        return b.relu(y)
    if act == "Tanh":
        return b.tanh(y)
    if act == "Sigmoid":
        return b.sigmoid(y)
    if act == "LeakyRelu":
        return b.leaky_relu(y, alpha=params[0])
    if act == "HardSigmoid":
        return b.hard_sigmoid(y, alpha=params[0], beta=params[1])
    lo, hi = params[0], params[1]
    # onnxruntime computes min(max(x, lo), hi): with lo > hi every element is hi
    return b.clamp(y, min_value=min(lo, hi), max_value=hi)


def _fused_perm(rank, trans, trans_batch):
    """The permutation onnxruntime applies to a FusedMatMul operand: transBatch moves the first
    dimension behind the other batch dimensions ([1, ..., r-2, 0, r-1]), then trans swaps the
    last two."""
    perm = list(range(1, rank - 1)) + [0, rank - 1] if trans_batch else list(range(rank))
    if trans:
        perm[-2], perm[-1] = perm[-1], perm[-2]
    return perm


@contrib_op("FusedMatMul", attrs=("alpha", "transA", "transB", "transBatchA", "transBatchB"))
def _fused_matmul(im, node, ins, attrs):
    a = float_input(X(im, ins[0]), "A")
    c = X(im, ins[1], a)
    b = im.b
    flags = {k: int(attrs.get(k, 0)) for k in ("transA", "transB", "transBatchA", "transBatchB")}
    if (flags["transBatchA"] or flags["transBatchB"]) and (len(a.shape) < 3 or len(a.shape) != len(c.shape)):
        # as onnxruntime: transBatch needs two operands of the same rank, at least 3
        unsupported(
            f"transBatchA/transBatchB with A of rank {len(a.shape)} and B of rank {len(c.shape)} "
            "(they need equal ranks >= 3)"
        )
    xs = []
    for v, which in ((a, "A"), (c, "B")):
        trans, tb = flags[f"trans{which}"], flags[f"transBatch{which}"]
        r = len(v.shape)
        if r < 2:
            if trans or tb:
                unsupported(f"trans{which}/transBatch{which} on a {r}-D {which} is not supported")
            xs.append(v)
            continue
        perm = _fused_perm(r, trans, tb)
        xs.append(b.transpose(v, permutation=perm) if perm != list(range(r)) else v)
    y = matmul(im, node, xs, {})
    alpha = float(attrs.get("alpha", 1.0))
    return y if alpha == 1.0 else b.mul(y, scalar(im, alpha, y))
