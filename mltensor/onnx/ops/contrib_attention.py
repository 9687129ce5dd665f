"""onnxruntime contrib attention operators (com.microsoft): Attention (packed QKV projection, as
the transformer optimizer fuses BERT and GPT-2), MultiHeadAttention, BiasSoftmax.

Lowered onto matmul / softmax / where: scores = scale * Q K^T + mask + attention_bias, causal
positions replaced by the type's lowest value, softmax over the keys, times V. Masks follow
onnxruntime's CPU kernel (attention_helper.h PrepareMask): a masked key adds mask_filter_value
(default -10000) to the score rather than removing it, so a row whose keys are all masked still
gets the softmax of its scores, as there.
"""

import numpy as np

from ...dynamic.dims import Sym
from ..errors import unsupported
from ._helpers import scalar, X
from .contrib_transformer import contrib_op, float_input, to_int32, wanted


def _given(ins, i):
    return len(ins) > i and ins[i] is not None


def _is_empty(v):
    """An optional input fed empty (a zero-sized past: the importer makes it a host array)."""
    return isinstance(v, np.ndarray) and v.size == 0


def _iota(im, n):
    """[0, 1, ..., n-1] as int32; n may be a dynamic size (written at dispatch)."""
    if isinstance(n, Sym):
        return im.b._range(im.ref(n), 0, 1, n, "int32")
    return im.b.constant(np.arange(int(n), dtype=np.int32))


def _same(a, c):
    """True if two sizes are the same (structurally, for dynamic ones)."""
    return a == c if isinstance(a, Sym) or isinstance(c, Sym) else int(a) == int(c)


def _heads(im, x, n, h, perm):
    """(B, S, n*h) viewed as (B, S, n, h), then permuted ([0, 2, 1, 3]: (B, n, S, h))."""
    return im.b.transpose(im.b.reshape(x, [x.shape[0], x.shape[1], n, h]), permutation=perm)


def _mask(im, mask, batch, seq, total, allow_start, what):
    """A uint8 operand, 1 where a key is masked, broadcasting against the scores (B, N, S, T).

    1-D (B): each batch's key count (keys at or after it masked); (2B): end positions then start
    positions (keys before the start masked too); 2-D (B, T) and 3-D (B, S, T): 0 masks, any
    positive value keeps; 4-D (B, 1, M, M) (Megatron GPT-2): row past + s of each batch's M x M
    mask, its first T columns."""
    b = im.b
    m = to_int32(im, X(im, mask))
    r = len(m.shape)
    zero = b.constant(np.array(0, np.int32))
    if r == 1:
        n = m.shape[0]
        keys = b.reshape(_iota(im, total), [1, total])
        if _same(n, batch):
            masked = b.greater_or_equal(keys, b.reshape(m, [batch, 1]))
        elif allow_start and _same(n, 2 * batch):
            end, start = b.split(m, 2, axis=0)
            masked = b.logical_or(
                b.greater_or_equal(keys, b.reshape(end, [batch, 1])), b.lesser(keys, b.reshape(start, [batch, 1]))
            )
        elif _same(n, 3 * batch + 2):
            unsupported(
                f"{what} of shape (3 * batch + 2) (cumulative sequence lengths, onnxruntime's "
                "CUDA-only format) is not supported"
            )
        else:
            unsupported(
                f"{what} of shape {list(m.shape)} is not supported for batch size {batch} "
                f"(expected ({batch}){' or (2 * batch)' if allow_start else ''})"
            )
        return b.reshape(masked, [batch, 1, 1, total])
    if r == 2:
        return b.reshape(b.lesser_or_equal(m, zero), [m.shape[0], 1, 1, m.shape[1]])
    if r == 3:
        return b.reshape(b.lesser_or_equal(m, zero), [m.shape[0], 1, m.shape[1], m.shape[2]])
    if r == 4:
        if not allow_start:
            unsupported(f"a 4-D {what} is not supported")
        if m.shape[1] != 1 or not _same(m.shape[2], m.shape[3]):
            unsupported(
                f"4-D {what} of shape {list(m.shape)} is not supported (expected "
                "(batch, 1, max_sequence_length, max_sequence_length))"
            )
        past = total - seq
        rows = b.slice(m, [0, 0, past, 0], [m.shape[0], 1, seq, total])
        return b.lesser_or_equal(rows, zero)
    unsupported(f"a {r}-D {what} is not supported")


def _attend(im, q, k, v, *, scale, masked, filter_value, attn_bias, causal_past, out_shape):
    """softmax(scale * q k^T + mask + bias) v: q (B, N, S, H), k (B, N, T, H), v (B, N, T, Hv);
    returns (B, S, N*Hv) and the scores softmax takes (B, N, S, T): MultiHeadAttention's qk output
    (onnxruntime's holds the mask, the bias and the causal lowest values too)."""
    b = im.b
    kt = b.transpose(k, permutation=[0, 1, 3, 2])
    scores = b.mul(b.matmul(q, kt), scalar(im, scale, q))
    if masked is not None:
        scores = b.add(scores, b.where(masked, scalar(im, filter_value, q), scalar(im, 0.0, q)))
    if attn_bias is not None:
        scores = b.add(scores, X(im, attn_bias, q))
    if causal_past is not None:
        # query s (at position past + s) sees keys t <= past + s; the others take the lowest
        # finite value (onnxruntime adds it), so their weight is exactly 0
        seq, total = q.shape[2], k.shape[2]
        if any(isinstance(d, Sym) for d in (seq, total, causal_past)):
            ones = b.expand(b.constant(np.ones((1, 1), np.uint8)), [seq, total])
            keep = b.triangular(ones, upper=False, diagonal=causal_past)
        else:  # static sizes: the pattern is a constant
            keep = b.constant(np.tril(np.ones((seq, total), np.uint8), causal_past))
        lowest = float(np.finfo(np.float16 if q.data_type == "float16" else np.float32).min)
        scores = b.where(keep, scores, scalar(im, lowest, q))
    p = b.softmax(scores, 3)
    y = b.matmul(p, v)  # (B, N, S, Hv)
    y = b.reshape(b.transpose(y, permutation=[0, 2, 1, 3]), out_shape)
    return y, scores


def _scale(attrs, head_size):
    s = float(attrs.get("scale", 0.0))
    return s if s != 0.0 else 1.0 / float(np.sqrt(head_size))


# -- Attention -------------------------------------------------------------------------------------


@contrib_op(
    "Attention",
    attrs=(
        "num_heads",
        "qkv_hidden_sizes",
        "unidirectional",
        "scale",
        "mask_filter_value",
        "do_rotary",
        "past_present_share_buffer",
        "rotary_embedding_dim",
    ),
)
def _attention(im, node, ins, attrs):
    # inputs: input, weights, bias?, mask_index?, past?, attention_bias?, past_sequence_length?
    # outputs: output, present?
    if attrs.get("do_rotary", 0):
        unsupported("attribute do_rotary=1 is not supported")
    if attrs.get("past_present_share_buffer", 0):
        unsupported("attribute past_present_share_buffer=1 is not supported")
    if _given(ins, 6):
        unsupported("input past_sequence_length (past_present_share_buffer) is not supported")
    b = im.b
    x = float_input(X(im, ins[0]), "input")
    if len(x.shape) != 3:
        unsupported(f"input of rank {len(x.shape)} is not supported (3-D (batch, sequence, hidden))")
    w = X(im, ins[1], x)
    if len(w.shape) != 2:
        unsupported(f"weights of rank {len(w.shape)} are not supported (2-D)")
    heads = int(attrs["num_heads"])
    width = w.shape[1]
    sizes = attrs.get("qkv_hidden_sizes")
    if sizes is None:
        if isinstance(width, Sym) or width % 3:
            unsupported(f"weights of width {width} without qkv_hidden_sizes (must divide by 3)")
        sizes = [width // 3] * 3
    sizes = [int(s) for s in sizes]
    if len(sizes) != 3 or sum(sizes) != width or sizes[0] != sizes[1] or any(s <= 0 or s % heads for s in sizes):
        unsupported(
            f"qkv_hidden_sizes={sizes} do not fit weights of width {width} and num_heads={heads} "
            "(Q and K sizes equal, each a positive multiple of num_heads)"
        )
    hq, hv = sizes[0] // heads, sizes[2] // heads
    batch, seq = x.shape[0], x.shape[1]
    qkv = b.matmul(x, w)
    if _given(ins, 2):
        qkv = b.add(qkv, X(im, ins[2], x))
    q, k, v = b.split(qkv, sizes, axis=2)
    q = _heads(im, q, heads, hq, [0, 2, 1, 3])
    k = _heads(im, k, heads, hq, [0, 2, 1, 3])
    v = _heads(im, v, heads, hv, [0, 2, 1, 3])
    past_len = 0
    if _given(ins, 4) and not _is_empty(ins[4]):
        past = X(im, ins[4], x)
        if len(past.shape) != 5 or past.shape[0] != 2:
            unsupported(f"past of shape {list(past.shape)} is not supported (2, batch, num_heads, past, head_size)")
        if hq != hv:
            unsupported("past with different Q/K and V hidden sizes (qkv_hidden_sizes) is not supported")
        pk, pv = (b.reshape(t, list(past.shape[1:])) for t in b.split(past, 2, axis=0))
        past_len = past.shape[3]
        k = b.concat([pk, k], 2)
        v = b.concat([pv, v], 2)
    total = k.shape[2]
    masked = None
    if _given(ins, 3):
        masked = _mask(im, ins[3], batch, seq, total, True, "mask_index")
    y, _ = _attend(
        im,
        q,
        k,
        v,
        scale=_scale(attrs, hq),
        masked=masked,
        filter_value=float(attrs.get("mask_filter_value", -10000.0)),
        attn_bias=ins[5] if _given(ins, 5) else None,
        causal_past=past_len if attrs.get("unidirectional", 0) else None,
        out_shape=[batch, seq, sizes[2]],
    )
    outs = [y]
    if wanted(node, 1):
        if hq != hv:
            unsupported("output present with different Q/K and V hidden sizes is not supported")
        shp = [1] + list(k.shape)
        outs.append(b.concat([b.reshape(k, shp), b.reshape(v, shp)], 0))
    return outs


# -- MultiHeadAttention ----------------------------------------------------------------------------


@contrib_op("MultiHeadAttention", attrs=("num_heads", "scale", "mask_filter_value", "unidirectional"))
def _multi_head_attention(im, node, ins, attrs):
    # inputs: query, key?, value?, bias?, key_padding_mask?, attention_bias?, past_key?,
    # past_value?, past_sequence_length?, cache_indirection?
    # outputs: output, present_key?, present_value?, qk?
    if _given(ins, 8):
        unsupported("input past_sequence_length (shared past/present buffers) is not supported")
    if _given(ins, 9):
        unsupported("input cache_indirection (beam search) is not supported")
    b = im.b
    heads = int(attrs["num_heads"])
    query = float_input(X(im, ins[0]), "query")
    if len(query.shape) == 5:
        unsupported("packed QKV query (batch, sequence, num_heads, 3, head_size) is not supported")
    if len(query.shape) != 3:
        unsupported(f"query of rank {len(query.shape)} is not supported (3-D)")
    if _given(ins, 1) and len(X(im, ins[1], query).shape) == 5:
        unsupported("packed KV key (batch, sequence, num_heads, 2, head_size) is not supported")
    if not _given(ins, 1) or not _given(ins, 2):
        unsupported("MultiHeadAttention without separate key and value inputs is not supported")
    key, value = X(im, ins[1], query), X(im, ins[2], query)
    batch, seq, hidden = query.shape
    if isinstance(hidden, Sym) or hidden % heads:
        unsupported(f"query hidden size {hidden} is not a multiple of num_heads={heads}")
    hq = hidden // heads
    bias = X(im, ins[3], query) if _given(ins, 3) else None
    bq = bk = bv = None
    if len(key.shape) == 4 and len(value.shape) == 4:
        # key and value already projected, in (B, N, L, H): used as they are (no bias, no past)
        if bias is not None:
            unsupported("bias with 4-D key/value (batch, num_heads, kv_sequence, head_size) is not supported")
        if _given(ins, 6) or _given(ins, 7):
            unsupported("past_key/past_value with 4-D key/value are not supported")
        if not _same(key.shape[1], heads) or not _same(key.shape[3], hq):
            unsupported(f"key of shape {list(key.shape)} does not fit num_heads={heads}, head_size={hq}")
        hv = value.shape[3]
        hidden_v = heads * hv
        k, v = key, value
        q = query
    elif len(key.shape) == 3 and len(value.shape) == 3:
        hidden_v = value.shape[2]
        if isinstance(hidden_v, Sym) or hidden_v % heads:
            unsupported(f"value hidden size {hidden_v} is not a multiple of num_heads={heads}")
        hv = hidden_v // heads
        if bias is not None:
            bq, bk, bv = b.split(bias, [hidden, hidden, hidden_v], axis=0)
        k = key if bk is None else b.add(key, bk)
        v = value if bv is None else b.add(value, bv)
        k = _heads(im, k, heads, hq, [0, 2, 1, 3])
        v = _heads(im, v, heads, hv, [0, 2, 1, 3])
        q = query
    else:
        unsupported(f"key of rank {len(key.shape)} with value of rank {len(value.shape)} is not supported")
    if bq is not None:
        q = b.add(q, bq)
    q = _heads(im, q, heads, hq, [0, 2, 1, 3])
    past_len = 0
    has_pk = _given(ins, 6) and not _is_empty(ins[6])
    has_pv = _given(ins, 7) and not _is_empty(ins[7])
    if has_pk != has_pv:
        unsupported("past_key and past_value must be given together")
    if has_pk:
        pk, pv = X(im, ins[6], query), X(im, ins[7], query)
        if len(pk.shape) != 4 or len(pv.shape) != 4:
            unsupported("past_key/past_value must be 4-D (batch, num_heads, past, head_size)")
        past_len = pk.shape[2]
        k = b.concat([pk, k], 2)
        v = b.concat([pv, v], 2)
    total = k.shape[2]
    causal = bool(attrs.get("unidirectional", 0))
    if causal and not _same(k.shape[2] - past_len, seq):
        # onnxruntime's CPU kernel masks keys past past + s on every row but the last (which it
        # assumes sees them all), its CUDA kernel aligns the diagonal to the last key: the two
        # agree only when the new keys are as many as the queries
        unsupported(
            f"unidirectional=1 with {k.shape[2] - past_len} new keys for {seq} queries (cross "
            "attention) is not supported"
        )
    masked = None
    if _given(ins, 4):
        masked = _mask(im, ins[4], batch, seq, total, False, "key_padding_mask")
    y, qk = _attend(
        im,
        q,
        k,
        v,
        scale=_scale(attrs, hq),
        masked=masked,
        filter_value=float(attrs.get("mask_filter_value", -10000.0)),
        attn_bias=ins[5] if _given(ins, 5) else None,
        causal_past=past_len if causal else None,
        out_shape=[batch, seq, hidden_v],
    )
    outs = [y, k if wanted(node, 1) else None, v if wanted(node, 2) else None]
    if wanted(node, 3):
        outs.append(qk)
    return outs


# -- BiasSoftmax -----------------------------------------------------------------------------------


@contrib_op("BiasSoftmax", attrs=("axis", "is_inner_broadcast"))
def _bias_softmax(im, node, ins, attrs):
    """softmax(data + bias) over the dimensions from `axis` on (flattened), as onnxruntime's CUDA
    kernel (the only one): data is [rows, E] (E = the product of those dimensions), bias
    [bias_rows, E]; row i takes bias row i // (rows / bias_rows) with is_inner_broadcast=1, else
    i % bias_rows."""
    b = im.b
    x = float_input(X(im, ins[0]), "data")
    bias = X(im, ins[1], x)
    r = len(x.shape)
    axis = int(attrs.get("axis", 1))
    axis = axis + r if axis < 0 else axis
    if not 0 <= axis < r:
        unsupported(f"axis {attrs.get('axis', 1)} is out of range for rank {r}")
    if any(isinstance(d, Sym) for d in list(x.shape) + list(bias.shape)):
        unsupported("BiasSoftmax with dynamic dimensions is not supported")
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    elems = int(np.prod(x.shape[axis:], dtype=np.int64))
    bsize = int(np.prod(bias.shape, dtype=np.int64))
    if bsize % elems or rows % (bsize // elems):
        unsupported(f"bias of shape {list(bias.shape)} does not broadcast to data {list(x.shape)} from axis {axis}")
    brows = bsize // elems
    inner = bool(attrs.get("is_inner_broadcast", 0))
    if inner:
        xs, bs = [brows, rows // brows, elems], [brows, 1, elems]
    else:
        xs, bs = [rows // brows, brows, elems], [1, brows, elems]
    y = b.softmax(b.add(b.reshape(x, xs), b.reshape(bias, bs)), 2)
    return b.reshape(y, list(x.shape))
