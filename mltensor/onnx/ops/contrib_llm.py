"""onnxruntime's LLM attention contrib operators (com.microsoft): RotaryEmbedding and
GroupQueryAttention, as onnxruntime-genai's model builder emits them for Llama/Qwen/Phi models.

Both are lowered onto WebNN operators (slice, concat, gather, where, matmul, softmax...), with
onnxruntime's CPU kernels (contrib_ops/cpu/bert/rotary_embedding.cc, group_query_attention.cc,
gqa_attention_base.h) as the definition:

- RotaryEmbedding rotates the first `rotary_dim` channels of each head by the cos/sin rows of
  each token's position; the cache row of position p starts at p * rotary_dim/2 in the flattened
  cache (onnxruntime's stride, whatever the cache's width), the other channels pass through.
- GroupQueryAttention appends the new keys/values of batch entry b at its past length
  past_b = seqlens_k[b] + 1 - S (0 for the first prompt, S == total_sequence_length) in a present
  cache of max(total_sequence_length, past_seq) rows (zero beyond the entry's length), and
  attends causally: query row s sees keys [0, past_b + s] (the last local_window_size of them
  when set; all of the entry's keys [0, seqlens_k[b] + 1) with causal=0).
  Sizes that follow from values (past_b, the entry's length) are computed on the GPU from
  seqlens_k, so one build serves every step whose shapes match; total_sequence_length decides a
  shape and must be known at load (a Shape-derived size, as the model builder exports it, or an
  input InferenceSession binds at the run).

The scores chain (matmul, scale, where(mask), softmax, matmul) is built in the shape the
compiler's attention fusion recognizes (compiler/fusion/attention.py), without softcap or smooth
softmax; the present caches and masks are a few small index computations and one gather.
"""

import numpy as np

from ...dynamic.dims import Sym, low, smax
from ..errors import unsupported
from ._helpers import X, sizes
from ._registry import op

_FLOAT = ("float32", "float16")
# a masked score: finite, so a row with every key masked (padding rows of a batched first
# prompt) stays a defined uniform softmax instead of NaN, and exp() of it minus a real maximum
# is exactly 0
_MASKED = float(np.finfo(np.float32).min)


def _ival(im, v):
    """A 0-D int32 operand holding a size (a Sym is read at dispatch: ops/sizes.py)."""
    if isinstance(v, Sym):
        return im.b._size(im.ref(v), v, "int32")
    return im.b.constant(np.array(v, dtype=np.int32))


def _iota(im, n):
    """[0, 1, ..., n-1] as int32 (n may be a Sym)."""
    if isinstance(n, Sym):
        return im.b._range(im.ref(n), 0, 1, n, "int32")
    return im.b.constant(np.arange(n, dtype=np.int32))


def _int32(im, v):
    x = X(im, v)
    return x if x.data_type == "int32" else im.b.cast(x, "int32")


def _last(b, x, start, size):
    """x[..., start:start+size]."""
    r = len(x.shape)
    return b.slice(x, [0] * (r - 1) + [start], list(x.shape[:-1]) + [size])


def _rope(b, x, cos, sin, rot, interleaved):
    """onnxruntime's rotation of x's last axis (head channels): the first `rot` channels rotated
    by cos/sin (shape [..., rot/2], broadcasting to x's leading axes), the rest passed through.
    Pairs are (i, i + rot/2), or (2i, 2i+1) when interleaved."""
    hd = x.shape[-1]
    half = rot // 2
    lead = list(x.shape[:-1])
    xr = _last(b, x, 0, rot) if rot < hd else x
    if interleaved:
        pairs = b.reshape(xr, lead + [half, 2])
        xe = b.reshape(_last(b, pairs, 0, 1), lead + [half])
        xo = b.reshape(_last(b, pairs, 1, 1), lead + [half])
        ye = b.sub(b.mul(xe, cos), b.mul(xo, sin))
        yo = b.add(b.mul(xo, cos), b.mul(xe, sin))
        y = b.concat([b.reshape(ye, lead + [half, 1]), b.reshape(yo, lead + [half, 1])], len(lead) + 1)
        y = b.reshape(y, lead + [rot])
    else:
        x1, x2 = _last(b, xr, 0, half), _last(b, xr, half, half)
        y = b.concat([b.sub(b.mul(x1, cos), b.mul(x2, sin)), b.add(b.mul(x2, cos), b.mul(x1, sin))], len(lead))
    if rot < hd:
        y = b.concat([y, _last(b, x, rot, hd - rot)], len(lead))
    return y


def _cache_rows(im, cache, pos, half):
    """cos/sin values of each position: [*pos.shape, half], read as onnxruntime does, from
    cache.flat[p * half + i] (the cache's own row when its width is half)."""
    b = im.b
    m, w = cache.shape
    if not (isinstance(m, int) and isinstance(w, int)):
        unsupported("cos_cache/sin_cache must have static shapes")
    if w == half:
        return b.gather(cache, pos, axis=0)
    flat = b.reshape(cache, [m * w])
    idx = b.add(
        b.mul(b.reshape(pos, list(pos.shape) + [1]), b.constant(np.array(half, np.int32))),
        b.constant(np.arange(half, dtype=np.int32)),
    )
    return b.gather(flat, idx, axis=0)


def _check_caches(cos, sin, x):
    if len(cos.shape) != 2 or tuple(cos.shape) != tuple(sin.shape):
        unsupported(f"cos_cache and sin_cache must be 2-D of one shape, got {list(cos.shape)} and {list(sin.shape)}")
    if cos.data_type != x.data_type or sin.data_type != x.data_type:
        unsupported("cos_cache and sin_cache must have the input's data type")


# -- RotaryEmbedding ---------------------------------------------------------------------------


@op(
    "com.microsoft.RotaryEmbedding",
    attrs=("num_heads", "rotary_embedding_dim", "interleaved", "is_packed_batching", "scale"),
)
def _rotary_embedding(im, node, ins, attrs):
    # `scale` only matters to onnxruntime's CUDA kernel when it regenerates a cache shorter than
    # the sequence; the CPU kernel (the reference) ignores it, as we do
    if attrs.get("is_packed_batching", 0):
        unsupported("attribute is_packed_batching=1 (ragged packed batches) is not supported")
    b = im.b
    x = X(im, ins[0])
    if x.data_type not in _FLOAT:
        unsupported(f"input data type {x.data_type} is not supported (float32, float16)")
    cos, sin = X(im, ins[2], x), X(im, ins[3], x)
    _check_caches(cos, sin, x)
    nh = int(attrs.get("num_heads", 0))
    rd = int(attrs.get("rotary_embedding_dim", 0))
    if rd > 0 and nh <= 0:
        unsupported("rotary_embedding_dim needs num_heads (onnxruntime rejects it too)")
    r = len(x.shape)
    if r not in (3, 4):
        unsupported(f"input must be 3-D or 4-D, got rank {r}")
    if r == 4:
        bs, n4, s, h4 = x.shape
        hidden = n4 * h4
    else:
        bs, s, hidden = x.shape
    w = cos.shape[1]
    head = 2 * w if rd == 0 else hidden // nh
    heads = nh if nh > 0 else hidden // head
    rot = rd if rd > 0 else head
    if not isinstance(head, int) or heads * head != hidden or (r == 4 and (heads, head) != (n4, h4)):
        unsupported(
            f"num_heads={nh}, rotary_embedding_dim={rd} and cos_cache width {w} do not "
            f"split the input {list(x.shape)} into heads"
        )
    if rot > head or rot % 2 or (w != head // 2 and w != rot // 2):
        unsupported(f"rotary_embedding_dim={rot} does not fit head size {head} and cos_cache width {w}")

    # position of each token: [B or 1, S]
    p = ins[1]
    pshape = tuple(p.shape)
    if len(pshape) <= 1 and (not pshape or pshape[0] == 1):
        # one offset for every batch entry: positions offset + s
        off = b.reshape(_int32(im, p), [1, 1])
        pos = b.add(off, b.reshape(_iota(im, s), [1, s]))
    elif len(pshape) == 2:
        if pshape != (bs, s):
            unsupported(f"position_ids shape {list(pshape)} is not [batch, sequence] = {[bs, s]}")
        pos = _int32(im, p)
    else:
        unsupported(f"position_ids must be [1] or [batch, sequence], got {list(pshape)}")

    c, sn = _cache_rows(im, cos, pos, rot // 2), _cache_rows(im, sin, pos, rot // 2)
    pb = pos.shape[0]
    if r == 4:  # [B, N, S, hd]: rows [B, 1, S, half]
        c, sn = (b.reshape(t, [pb, 1, s, rot // 2]) for t in (c, sn))
        return _rope(b, x, c, sn, rot, attrs.get("interleaved", 0))
    xh = b.reshape(x, [bs, s, heads, head])
    c, sn = (b.reshape(t, [pb, s, 1, rot // 2]) for t in (c, sn))
    return b.reshape(_rope(b, xh, c, sn, rot, attrs.get("interleaved", 0)), [bs, s, hidden])


# -- GroupQueryAttention -------------------------------------------------------------------------

_GQA_INPUTS = (
    "query",
    "key",
    "value",
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
    "k_scale",
    "v_scale",
    "q_norm_weight",
    "k_norm_weight",
    "query_seqlens",
)


@op(
    "com.microsoft.GroupQueryAttention",
    attrs=(
        "num_heads",
        "kv_num_heads",
        "scale",
        "softcap",
        "local_window_size",
        "do_rotary",
        "rotary_interleaved",
        "smooth_softmax",
        "causal",
        "sliding_window_cache",
        "qk_output",
        "k_quant_type",
        "v_quant_type",
        "kv_cache_bit_width",
        "qk_norm_epsilon",
        "q_norm_epsilon",
        "k_norm_epsilon",
    ),
)
def _group_query_attention(im, node, ins, attrs):
    ins = list(ins) + [None] * (len(_GQA_INPUTS) - len(ins))
    for i in (12, 13, 14, 15, 16):
        if ins[i] is not None:
            unsupported(f"input {_GQA_INPUTS[i]} is not supported")
    if len(node.output) > 3 and node.output[3]:
        unsupported("output output_qk is not supported")
    for name, default in (("sliding_window_cache", 0), ("qk_output", 0)):
        if int(attrs.get(name, default)) != default:
            unsupported(f"attribute {name}={attrs[name]} is not supported")
    for name in ("k_quant_type", "v_quant_type"):
        v = attrs.get(name, "NONE")
        v = v.decode() if isinstance(v, bytes) else v
        if v != "NONE":
            unsupported(f"attribute {name}={v} (a quantized KV cache) is not supported")
    # kv_cache_bit_width only matters to a quantized cache (rejected above); the norm epsilons
    # only with q_norm_weight/k_norm_weight (rejected above)
    causal = int(attrs.get("causal", 1))
    lw = int(attrs.get("local_window_size", -1))
    if causal not in (0, 1) or (not causal and lw > 0):
        unsupported(f"attribute causal={causal} (with local_window_size={lw}) is not supported")
    smooth = int(attrs.get("smooth_softmax", 0))
    if smooth not in (-1, 0, 1):
        unsupported(f"attribute smooth_softmax={smooth} is not supported")

    b = im.b
    heads, kv_heads = int(attrs.get("num_heads", 0)), int(attrs.get("kv_num_heads", 0))
    if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
        unsupported(f"num_heads={heads} must be a positive multiple of kv_num_heads={kv_heads}")
    group = heads // kv_heads

    q = X(im, ins[0])
    if q.data_type not in _FLOAT:
        unsupported(f"query data type {q.data_type} is not supported (float32, float16)")
    if len(q.shape) != 3:
        unsupported(f"query must be 3-D, got {list(q.shape)}")
    bs, s, d = q.shape
    if not isinstance(d, int):
        unsupported("the query's hidden size must be static")
    if ins[1] is None:  # packed QKV: [B, S, (H + 2 H_kv) * hd]
        if ins[2] is not None:
            unsupported("key and value must both be given or both absent (packed QKV)")
        hd = d // (heads + 2 * kv_heads)
        if hd * (heads + 2 * kv_heads) != d:
            unsupported(f"packed QKV width {d} is not (num_heads + 2 kv_num_heads) * head_size")
        qq = _last(b, q, 0, heads * hd)
        k = _last(b, q, heads * hd, kv_heads * hd)
        v = _last(b, q, (heads + kv_heads) * hd, kv_heads * hd)
        q = qq
    else:
        if ins[2] is None:
            unsupported("key and value must both be given or both absent (packed QKV)")
        hd = d // heads
        k, v = X(im, ins[1], q), X(im, ins[2], q)
        if hd * heads != d or list(k.shape) != [bs, s, kv_heads * hd] or list(v.shape) != list(k.shape):
            unsupported(
                f"query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} do not "
                f"fit num_heads={heads}, kv_num_heads={kv_heads}"
            )
    if k.data_type != q.data_type or v.data_type != q.data_type:
        unsupported("query, key and value must have one data type")

    # past cache [B, H_kv, P, hd] (absent or empty: P = 0)
    pk, pv = ins[3], ins[4]
    if (pk is None) != (pv is None):
        unsupported("past_key and past_value must both be given or both absent")
    past = 0
    if pk is not None and any(isinstance(t, np.ndarray) and t.ndim == 4 and t.shape[2] == 0 for t in (pk, pv)):
        pk = pv = None  # an empty past (a first prompt's): host constants WebNN cannot hold
    if pk is not None:
        pk, pv = X(im, pk, q), X(im, pv, q)
        if (
            len(pk.shape) != 4
            or list(pk.shape[:2]) + [pk.shape[3]] != [bs, kv_heads, hd]
            or list(pv.shape) != list(pk.shape)
        ):
            unsupported(
                f"past_key {list(pk.shape)} / past_value {list(pv.shape)} are not "
                f"[batch, kv_num_heads, past, head_size] = [{bs}, {kv_heads}, past, {hd}]"
            )
        if pk.data_type != q.data_type or pv.data_type != q.data_type:
            unsupported("past_key/past_value must have the query's data type")
        past = pk.shape[2]
        if isinstance(past, int) and past == 0:
            pk = pv = None

    tot = sizes(im, ins[6], "GroupQueryAttention's total_sequence_length")
    if len(tot) != 1:
        unsupported("total_sequence_length must hold one value")
    total = tot[0]
    # present rows, as onnxruntime sizes them: max(total_sequence_length, past buffer)
    t_len = smax(total, past) if pk is not None else total

    # BNSH
    def bnsh(x, n):
        return b.transpose(b.reshape(x, [bs, s, n, hd]), permutation=[0, 2, 1, 3])

    q4, k4, v4 = bnsh(q, heads), bnsh(k, kv_heads), bnsh(v, kv_heads)

    # past_b: where this step's rows go in entry b's cache. The first prompt (S equal to
    # total_sequence_length) starts at 0 whatever seqlens_k says; otherwise it is
    # seqlens_k[b] + 1 - S. With no past, a valid input always starts at 0 too.
    lens = b.add(b.reshape(_int32(im, ins[5]), [bs]), b.constant(np.array(1, np.int32)))  # L_b
    zero = b.constant(np.zeros([1], np.int32))  # broadcasts over the batch (which may be dynamic)
    if pk is None:
        first = True
    elif isinstance(s, int) and isinstance(total, int):
        first = s == total
    elif isinstance(s, int) and s == 1 and isinstance(total, Sym) and low(total) >= 2:
        first = False
    else:
        first = None  # decided per dispatch from the sizes
    if first is False and isinstance(s, int) and s > 1 and isinstance(bs, int) and bs > 1:
        unsupported(
            f"a chunk of {s} tokens after a past with batch_size {bs} (onnxruntime "
            "accepts sequence_length > 1 with past context only for batch_size 1)"
        )
    if first is True:
        start = zero
    else:
        start = b.sub(lens, _ival(im, s))
        if first is None:
            start = b.where(b.equal(_ival(im, s), _ival(im, total)), zero, start)

    # position of each query row: start + s ([B or 1, S]); rotary positions are the same
    sb = start.shape[0]
    qpos = b.add(b.reshape(start, [sb, 1]), b.reshape(_iota(im, s), [1, s]))

    if int(attrs.get("do_rotary", 0)):
        if ins[7] is None or ins[8] is None:
            unsupported("do_rotary=1 needs cos_cache and sin_cache")
        cos, sin = X(im, ins[7], q), X(im, ins[8], q)
        _check_caches(cos, sin, q)
        rot = 2 * cos.shape[1]
        if rot > hd:
            unsupported(f"cos_cache width {cos.shape[1]} is more than head_size/2 = {hd // 2}")
        rpos = qpos
        if ins[9] is not None:
            # given position ids: a first prompt takes only the first one, as an offset
            pid = _int32(im, ins[9])
            if list(pid.shape) != [bs, s]:
                unsupported(f"position_ids must be [batch, sequence] = {[bs, s]}, got {list(pid.shape)}")
            off = b.add(b.slice(pid, [0, 0], [1, 1]), b.reshape(_iota(im, s), [1, s]))
            rpos = (
                off
                if first is True
                else pid
                if first is False
                else b.where(b.equal(_ival(im, s), _ival(im, total)), off, pid)
            )
        rb = rpos.shape[0]
        c = b.reshape(_cache_rows(im, cos, rpos, rot // 2), [rb, 1, s, rot // 2])
        sn = b.reshape(_cache_rows(im, sin, rpos, rot // 2), [rb, 1, s, rot // 2])
        il = int(attrs.get("rotary_interleaved", 0))
        q4, k4 = _rope(b, q4, c, sn, rot, il), _rope(b, k4, c, sn, rot, il)

    # present caches
    if pk is None and t_len == s:
        kp, vp = k4, v4
    else:
        kp, vp = (
            _present(im, pk, k4, start, past, s, t_len, bs, kv_heads, hd),
            _present(im, pv, v4, start, past, s, t_len, bs, kv_heads, hd),
        )

    # scores [B, H_kv, g*S, T]: the `group` query heads of a kv head are consecutive, so they
    # share one matmul as a [group * S, hd] block (row j*S + s: head h_kv*g + j, query row s).
    # The chain matmul -> scale -> where(mask) -> softmax -> matmul keeps no reshape between its
    # steps, the shape compiler/fusion/attention.py fuses into one kernel.
    f16 = q.data_type == "float16"
    # onnxruntime accumulates float16 attention in float32: so do we
    qc, kc, vc = (b.cast(t, "float32") for t in (q4, kp, vp)) if f16 else (q4, kp, vp)
    gs = group * s
    alpha = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(hd))
    sc = b.matmul(b.reshape(qc, [bs, kv_heads, gs, hd]), b.transpose(kc, permutation=[0, 1, 3, 2]))
    sc = b.mul(sc, b.constant(np.array(alpha, np.float32)))
    softcap = float(attrs.get("softcap", 0.0))
    if softcap > 0:
        cap = b.constant(np.array(softcap, np.float32))
        sc = b.mul(b.tanh(b.div(sc, cap)), cap)
    if ins[10] is not None:  # added after the softcap, as onnxruntime does
        sc = b.add(sc, _bias(im, ins[10], bs, heads, kv_heads, s, total, t_len))

    # mask: key t is seen by row s of entry b when t < L_b and, when causal, t <= start_b + s
    # and, with a local window, t > start_b + s - local_window_size (the window holds
    # local_window_size keys, the row's own included, as onnxruntime 1.32's CPU kernel counts it)
    t = b.reshape(_iota(im, t_len), [1, 1, t_len])
    ok = b.lesser(t, b.reshape(lens, [bs, 1, 1]))
    if causal:
        qp = b.reshape(qpos, [sb, s, 1])
        ok = b.logical_and(b.lesser_or_equal(t, qp), ok)
        if lw > 0:
            ok = b.logical_and(ok, b.greater(t, b.sub(qp, b.constant(np.array(lw, np.int32)))))
    else:
        ok = b.expand(ok, [bs, s, t_len])
    if group > 1:  # the same mask for each head of a group
        ok = b.expand(b.reshape(ok, [bs, 1, 1, s, t_len]), [bs, 1, group, s, t_len])
    sc = b.where(b.reshape(ok, [bs, 1, gs, t_len]), sc, b.constant(np.array(_MASKED, np.float32)))

    if smooth == 1 or ins[11] is not None:
        probs = _smooth_softmax(im, sc, ins[11], kv_heads, group, s)
    else:
        probs = b.softmax(sc, 3)
    out = b.matmul(probs, vc)  # [B, H_kv, g*S, hd]
    out = b.transpose(b.reshape(out, [bs, heads, s, hd]), permutation=[0, 2, 1, 3])
    out = b.reshape(out, [bs, s, heads * hd])
    if f16:
        out = b.cast(out, "float16")
    return [out, kp, vp]


def _present(im, past_x, new, start, past, s, t_len, bs, kv_heads, hd):
    """present[b, h, t] = past[b, h, t] for t < start_b, new[b, h, t - start_b] for
    start_b <= t < start_b + S, 0 beyond (onnxruntime zeroes a present it does not share with
    the past), as one gather from [past | new | a zero row] of each (b, h)."""
    b = im.b
    dt = new.data_type
    zrow = b.constant(np.zeros([1, kv_heads, 1, hd], dtype=np.float16 if dt == "float16" else np.float32))
    zrow = b.expand(zrow, [bs, kv_heads, 1, hd])
    parts = ([past_x] if past_x is not None else []) + [new, zrow]
    cat = b.concat(parts, 2)  # [B, H_kv, Z + 1, hd]
    z = past + s  # the zero row
    t = b.reshape(_iota(im, t_len), [1, t_len])
    st = b.reshape(start, [start.shape[0], 1])
    rel = b.sub(t, st)
    in_new = b.logical_and(b.greater_or_equal(rel, b.constant(np.array(0, np.int32))), b.lesser(rel, _ival(im, s)))
    zi = _ival(im, z)
    idx = b.where(in_new, b.add(rel, _ival(im, past)), zi)
    if past_x is not None:
        in_past = b.logical_and(b.lesser(t, st), b.lesser(t, _ival(im, past)))
        idx = b.where(in_past, t, idx)
    # flat row index into cat viewed as [B * H_kv * (Z + 1), hd]
    # (b * H_kv + h) * (Z + 1), the first row of each (b, h) (the batch may be dynamic)
    bh = b.add(
        b.mul(b.reshape(_iota(im, bs), [bs, 1, 1]), b.constant(np.array(kv_heads, np.int32))),
        b.constant(np.arange(kv_heads, dtype=np.int32).reshape(1, kv_heads, 1)),
    )
    flat = b.add(b.mul(bh, _ival(im, z + 1)), b.reshape(idx, [idx.shape[0], 1, t_len]))
    return b.gather(b.reshape(cat, [bs * kv_heads * (z + 1), hd]), flat, axis=0)


def _bias(im, v, bs, heads, kv_heads, s, total, t_len):
    """attention_bias [B or 1, H or 1, S, total_sequence_length] in the scores' layout
    [B or 1, H_kv or 1, g*S, T] (columns past total_sequence_length are masked: zero there)."""
    b = im.b
    x = X(im, v)
    if x.data_type not in _FLOAT:
        unsupported(f"attention_bias data type {x.data_type} is not supported")
    if x.data_type != "float32":
        x = b.cast(x, "float32")
    group = heads // kv_heads
    if (
        len(x.shape) != 4
        or x.shape[0] not in (1, bs)
        or x.shape[1] not in (1, heads)
        or list(x.shape[2:]) != [s, total]
    ):
        unsupported(
            f"attention_bias {list(x.shape)} is not [batch or 1, num_heads or 1, "
            f"sequence, total_sequence_length] = [{bs}, {heads}, {s}, {total}]"
        )
    if t_len != total:
        if not (isinstance(t_len, int) and isinstance(total, int)):
            unsupported(
                "attention_bias with a past buffer longer than total_sequence_length "
                "is not supported with dynamic sizes"
            )
        x = b.concat([x, b.constant(np.zeros(list(x.shape[:3]) + [t_len - total], np.float32))], 3)
    b0, h0 = x.shape[0], x.shape[1]
    if h0 == heads:  # head k*g + j is row block j of kv head k
        return b.reshape(x, [b0, kv_heads, group * s, t_len])
    if group > 1:
        x = b.expand(b.reshape(x, [b0, 1, 1, s, t_len]), [b0, 1, group, s, t_len])
    return b.reshape(x, [b0, 1, group * s, t_len])


def _smooth_softmax(im, x, sink, kv_heads, group, s):
    """onnxruntime's smooth softmax of scores x [B, H_kv, g*S, T]: a softmax with one more logit
    per row, 0 (smooth_softmax=1) or the row's head's head_sink value, that takes part in the max
    and the sum but is not output."""
    b = im.b
    heads = kv_heads * group
    if sink is None:
        sk = b.constant(np.zeros([1, 1, 1, 1], np.float32))
    else:
        sk = X(im, sink)
        if list(sk.shape) != [heads]:
            unsupported(f"head_sink must be [num_heads] = [{heads}], got {list(sk.shape)}")
        if sk.data_type != "float32":
            sk = b.cast(sk, "float32")
        # row j*S + s of kv head k belongs to head k*g + j
        sk = b.expand(b.reshape(sk, [1, kv_heads, group, 1]), [1, kv_heads, group, s])
        sk = b.reshape(sk, [1, kv_heads, group * s, 1])
    m = b.max(b.reduce_max(x, axes=[3], keep_dimensions=True), sk)
    e = b.exp(b.sub(x, m))
    den = b.add(b.reduce_sum(e, axes=[3], keep_dimensions=True), b.exp(b.sub(sk, m)))
    return b.div(e, den)
