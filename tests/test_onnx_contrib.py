"""onnxruntime's transformer contrib operators (com.microsoft; onnx/ops/contrib_transformer.py and
contrib_attention.py) against onnxruntime's CPU kernels on random data: one single-node model
per operator and variant, then 2-layer BERT-like and GPT-2-like models built from standard ONNX
ops and fused by onnxruntime.transformers.optimizer, run at two sequence lengths in one session."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import mltensor
from mltensor import InferenceSession

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
MS = "com.microsoft"


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)], ir_version=8
    )


def _vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _check(ctx, model, feeds, rtol=1e-4, atol=1e-4, ref=None):
    """Run on mltensor and onnxruntime; compare every output (shape, dtype, values)."""
    ref = ref if ref is not None else _ort(model, feeds)
    sess = InferenceSession(model, ctx)
    got = sess.run(None, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        assert g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    return got


def _single(op_type, feeds, n_out=1, inits=None, out_names=None, float_outs=(), **attrs):
    """A one-node com.microsoft model: `feeds` in input order (name -> array, None for an absent
    optional input); those also named in `inits` become initializers, the rest graph inputs.
    Returns the model and the feeds of its graph inputs."""
    inits = inits or {}
    ins = [
        _vi(n, list(v.shape), helper.np_dtype_to_tensor_dtype(v.dtype))
        for n, v in feeds.items()
        if v is not None and n not in inits
    ]
    node_in = [n if v is not None else "" for n, v in feeds.items()]
    while node_in and not node_in[-1]:
        node_in.pop()
    outs = out_names or [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, node_in, outs, domain=MS, **attrs)
    # outputs typed by onnxruntime's inference (_out_types), unless its inference needs help
    model = _model(
        [node],
        ins,
        [_vi(o, None) if o in float_outs else helper.make_value_info(o, onnx.TypeProto()) for o in outs if o],
        [numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    live = {n: v for n, v in feeds.items() if v is not None and n not in inits}
    return model, live


def _out_types(model, feeds):
    """Give the graph outputs the types onnxruntime computes (our importer needs element types)."""
    res = _ort(model, feeds)
    outs = [o.name for o in model.graph.output]
    del model.graph.output[:]
    for n, r in zip(outs, res):
        model.graph.output.append(_vi(n, list(r.shape), helper.np_dtype_to_tensor_dtype(r.dtype)))
    return model, res


def _run_single(ctx, op_type, feeds, n_out=1, inits=None, out_names=None, rtol=1e-4, atol=1e-4, float_outs=(), **attrs):
    model, live = _single(op_type, feeds, n_out, inits, out_names, float_outs, **attrs)
    model, ref = _out_types(model, live)
    return _check(ctx, model, live, rtol=rtol, atol=atol, ref=ref)


def _r(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# -- activations -----------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (2, 3, 16), (1, 5, 33)])
def test_gelu_family(ctx, rng, shape):
    x = _r(rng, *shape, scale=3.0)
    bias = _r(rng, shape[-1])
    _run_single(ctx, "Gelu", {"x": x})
    _run_single(ctx, "BiasGelu", {"x": x, "b": bias})
    _run_single(ctx, "FastGelu", {"x": x})
    _run_single(ctx, "FastGelu", {"x": x, "b": bias})
    _run_single(ctx, "FastGelu", {"x": x, "b": bias}, inits={"b": bias})
    _run_single(ctx, "QuickGelu", {"x": x})
    _run_single(ctx, "QuickGelu", {"x": x}, alpha=0.75)
    _run_single(ctx, "QuickGelu", {"x": x}, alpha=1.0)


@pytest.mark.parametrize("shape", [(2, 3, 8), (1, 9, 5)])
def test_bias_add(ctx, rng, shape):
    # onnxruntime has only a CUDA kernel: X + bias + skip in numpy
    x, bias, skip = _r(rng, *shape), _r(rng, shape[-1]), _r(rng, *shape)
    node = helper.make_node("BiasAdd", ["x", "b", "s"], ["y"], domain=MS)
    model = _model(
        [node], [_vi("x", list(shape)), _vi("b", [shape[-1]]), _vi("s", list(shape))], [_vi("y", list(shape))]
    )
    _check(ctx, model, {"x": x, "b": bias, "s": skip}, ref=[x + bias + skip], atol=1e-6)


# -- layer normalizations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,skip", [((2, 3, 16), "full"), ((1, 5, 12), "one"), ((3, 4, 8), "2d"), ((6, 16), "full")]
)
@pytest.mark.parametrize("with_beta,with_bias", [(True, True), (False, False), (True, False), (False, True)])
def test_skip_layer_normalization(ctx, rng, shape, skip, with_beta, with_bias):
    h = shape[-1]
    x = _r(rng, *shape, scale=2.0) + 0.5
    sk = {"full": _r(rng, *shape), "one": _r(rng, 1, *shape[1:]), "2d": _r(rng, *shape[-2:])}[skip]
    feeds = {
        "x": x,
        "s": sk,
        "g": _r(rng, h),
        "be": _r(rng, h) if with_beta else None,
        "bi": _r(rng, h) if with_bias else None,
    }
    for outs in (["y"], ["y", "m", "iv", "sum"], ["y", "", "", "sum"], ["y", "m", "", ""]):
        _run_single(ctx, "SkipLayerNormalization", feeds, out_names=outs, epsilon=1e-5)
    _run_single(ctx, "SkipLayerNormalization", feeds)  # default epsilon


@pytest.mark.parametrize("shape", [(2, 3, 16), (7, 12)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_skip_simplified_layer_normalization(ctx, rng, shape, with_bias):
    h = shape[-1]
    feeds = {"x": _r(rng, *shape), "s": _r(rng, *shape), "g": _r(rng, h), "bi": _r(rng, h) if with_bias else None}
    _run_single(ctx, "SkipSimplifiedLayerNormalization", feeds, out_names=["y", "m", "iv", "sum"], epsilon=1e-6)
    _run_single(ctx, "SkipSimplifiedLayerNormalization", feeds)


@pytest.mark.parametrize("shape,axis", [((2, 3, 16), -1), ((2, 3, 4, 5), 2), ((6, 10), 1), ((2, 3, 8), 1)])
def test_simplified_layer_normalization(ctx, rng, shape, axis):
    x = _r(rng, *shape)
    scale = _r(rng, *shape[axis:])
    for outs in (["y"], ["y", "iv"]):
        nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], outs, axis=axis, epsilon=1e-5)]
        model = _model(
            nodes,
            [_vi("x", list(shape)), _vi("g", list(scale.shape))],
            [helper.make_value_info(o, onnx.TypeProto()) for o in outs],
        )
        model, ref = _out_types(model, {"x": x, "g": scale})
        _check(ctx, model, {"x": x, "g": scale}, ref=ref)


@pytest.mark.parametrize("variant", ["full", "no_segment", "position_ids", "position_ids_1s", "no_mask"])
def test_embed_layer_normalization(ctx, rng, variant):
    bsz, seq, h, vocab, npos = 3, 5, 16, 30, 9
    ids = rng.integers(0, vocab, (bsz, seq)).astype(np.int32)
    seg = rng.integers(0, 2, (bsz, seq)).astype(np.int32)
    mask = (rng.random((bsz, seq)) > 0.3).astype(np.int32)
    mask[0, 1] = 2  # onnxruntime counts the entries equal to 1
    feeds = {"ids": ids, "seg": None if variant == "no_segment" else seg}
    inits = {"we": _r(rng, vocab, h), "pe": _r(rng, npos, h)}
    feeds.update(we=inits["we"], pe=inits["pe"])
    if variant != "no_segment":
        inits["se"] = _r(rng, 2, h)
    feeds["se"] = inits.get("se")
    inits.update(g=_r(rng, h), be=_r(rng, h))
    feeds.update(g=inits["g"], be=inits["be"], mask=None if variant == "no_mask" else mask)
    if variant == "position_ids":
        feeds["pid"] = rng.integers(0, npos, (bsz, seq)).astype(np.int32)
    elif variant == "position_ids_1s":
        feeds["pid"] = rng.integers(0, npos, (1, seq)).astype(np.int32)
    _run_single(ctx, "EmbedLayerNormalization", feeds, inits=inits, out_names=["y", "mi", "es"], epsilon=1e-5)
    _run_single(ctx, "EmbedLayerNormalization", feeds, inits=inits, out_names=["y", "mi"])


# -- FusedConv, FusedMatMul --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "act,params",
    [
        (None, None),
        ("Relu", None),
        ("Tanh", None),
        ("Sigmoid", None),
        ("LeakyRelu", [0.3]),
        ("Clip", [-0.5, 0.7]),
        ("HardSigmoid", [0.3, 0.4]),
    ],
)
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(ctx, rng, act, params, with_z):
    x = _r(rng, 1, 3, 7, 6)
    w = _r(rng, 4, 3, 3, 3, scale=0.5)
    attrs = {"pads": [1, 0, 1, 2], "strides": [2, 1]}
    if act is not None:
        attrs["activation"] = act
    if params is not None:
        attrs["activation_params"] = params
    feeds = {"x": x, "w": w, "b": _r(rng, 4), "z": _r(rng, 1, 4, 4, 6) if with_z else None}
    _run_single(ctx, "FusedConv", feeds, inits={"w": w}, **attrs)


def test_fused_conv_1d_and_groups(ctx, rng):
    x = _r(rng, 2, 4, 9)
    w = _r(rng, 4, 2, 3)
    _run_single(
        ctx,
        "FusedConv",
        {"x": x, "w": w, "b": _r(rng, 4)},
        inits={"w": w},
        group=2,
        activation="Relu",
        auto_pad="SAME_UPPER",
    )


@pytest.mark.parametrize("sa,sb", [((2, 3, 4, 5), None), ((3, 4, 5), None), ((4, 5), None), ((2, 1, 4, 5), (3, 0, 6))])
@pytest.mark.parametrize(
    "flags",
    [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 0), (1, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1), (1, 1, 1, 1), (0, 1, 1, 0)],
)
@pytest.mark.parametrize("alpha", [1.0, 0.125])
def test_fused_matmul(ctx, rng, sa, sb, flags, alpha):
    from mltensor.onnx.ops.contrib_transformer import _fused_perm

    ta, tb, tba, tbb = flags
    if (sb is not None or len(sa) < 3) and (tba or tbb):
        pytest.skip("transBatch needs equal ranks >= 3 (onnxruntime rejects the others, as we do)")
    a = _r(rng, *sa)
    ap = np.transpose(a, _fused_perm(a.ndim, ta, tba))
    if sb is None:  # B' = (batch of A', K, 6), stored so that its permutation gives B'
        bp = _r(rng, *ap.shape[:-2], ap.shape[-1], 6)
    else:  # broadcast batch dimensions: (3, K, 6) against A' (2, 1, M, K)
        bp = _r(rng, *sb[:-2], ap.shape[-1], sb[-1])
    perm = _fused_perm(bp.ndim, tb, tbb)
    b = np.ascontiguousarray(np.transpose(bp, np.argsort(perm)))
    ref = _run_single(
        ctx, "FusedMatMul", {"a": a, "b": b}, alpha=alpha, transA=ta, transB=tb, transBatchA=tba, transBatchB=tbb
    )
    np.testing.assert_allclose(ref[0], alpha * np.matmul(ap, bp), rtol=1e-4, atol=1e-4)


def test_fused_matmul_vector(ctx, rng):
    _run_single(ctx, "FusedMatMul", {"a": _r(rng, 5), "b": _r(rng, 5, 3)}, alpha=2.0)
    _run_single(ctx, "FusedMatMul", {"a": _r(rng, 2, 4, 5), "b": _r(rng, 5)}, alpha=0.5)


# -- BiasSoftmax (onnxruntime has only a CUDA kernel: numpy reference of its semantics) ------------


@pytest.mark.parametrize(
    "shape,bshape,axis,inner",
    [
        ((2, 3, 4, 5), (2, 1, 4, 5), 2, 1),
        ((2, 3, 4, 5), (1, 3, 4, 5), 2, 0),
        ((2, 3, 4, 5), (2, 3, 4, 5), 3, 0),
        ((2, 3, 4, 5), (4, 5), 2, 0),
        ((2, 3, 4, 5), (2, 1, 1, 5), 3, 1),
        ((4, 6), (1, 6), 1, 0),
    ],
)
def test_bias_softmax(ctx, rng, shape, bshape, axis, inner):
    x, bias = _r(rng, *shape, scale=2.0), _r(rng, *bshape, scale=2.0)
    rows, elems = int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))
    brows = bias.size // elems
    x2, b2 = x.reshape(rows, elems), bias.reshape(brows, elems)
    idx = np.arange(rows) // (rows // brows) if inner else np.arange(rows) % brows
    s = x2 + b2[idx]
    e = np.exp(s - s.max(1, keepdims=True))
    ref = (e / e.sum(1, keepdims=True)).reshape(shape)
    node = helper.make_node("BiasSoftmax", ["x", "b"], ["y"], domain=MS, axis=axis, is_inner_broadcast=inner)
    model = _model([node], [_vi("x", list(shape)), _vi("b", list(bshape))], [_vi("y", list(shape))])
    _check(ctx, model, {"x": x, "b": bias}, ref=[ref], atol=1e-5)


# -- Attention -----------------------------------------------------------------------------------------


def _attention_feeds(rng, bsz, seq, d_in, sizes, mask=None, past=None, attn_bias=None):
    feeds = {
        "x": _r(rng, bsz, seq, d_in),
        "w": _r(rng, d_in, sum(sizes), scale=0.3),
        "b": _r(rng, sum(sizes), scale=0.3),
        "mask": mask,
        "past": past,
        "ab": attn_bias,
    }
    return feeds


def _mask_variant(rng, kind, bsz, seq, total, all_masked_row=True):
    if kind is None:
        return None
    if kind == "1d":
        return rng.integers(1, total + 1, bsz).astype(np.int32)
    if kind == "1d_start":
        end = rng.integers(total // 2 + 1, total + 1, bsz)
        start = rng.integers(0, total // 2 + 1, bsz)
        return np.concatenate([end, start]).astype(np.int32)
    if kind == "2d":
        m = (rng.random((bsz, total)) > 0.3).astype(np.int32)
        m[:, 0] = 1
        if all_masked_row:  # every key masked: scores - 10000, softmax over them as onnxruntime
            m[-1, :] = 0
        return m
    if kind == "3d":
        return (rng.random((bsz, seq, total)) > 0.4).astype(np.int32)
    raise AssertionError(kind)


@pytest.mark.parametrize("bsz,seq,heads,hidden", [(2, 5, 2, 16), (1, 7, 4, 32), (3, 1, 1, 8)])
@pytest.mark.parametrize("mask", [None, "1d", "1d_start", "2d", "3d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention(ctx, rng, bsz, seq, heads, hidden, mask, unidirectional):
    feeds = _attention_feeds(rng, bsz, seq, hidden + 3, [hidden] * 3, _mask_variant(rng, mask, bsz, seq, seq))
    _run_single(
        ctx,
        "Attention",
        feeds,
        inits={"w": feeds["w"], "b": feeds["b"]},
        num_heads=heads,
        unidirectional=unidirectional,
    )


@pytest.mark.parametrize("sizes,heads", [([8, 8, 16], 2), ([12, 12, 6], 3)])
def test_attention_qkv_hidden_sizes_scale_filter(ctx, rng, sizes, heads):
    feeds = _attention_feeds(rng, 2, 4, 10, sizes, _mask_variant(rng, "2d", 2, 4, 4))
    _run_single(ctx, "Attention", feeds, num_heads=heads, qkv_hidden_sizes=sizes)
    _run_single(ctx, "Attention", feeds, num_heads=heads, qkv_hidden_sizes=sizes, scale=0.3, mask_filter_value=-50.0)
    feeds["b"] = None  # the projection bias is optional
    _run_single(ctx, "Attention", feeds, num_heads=heads, qkv_hidden_sizes=sizes)


@pytest.mark.parametrize("mask", [None, "2d", "1d", "3d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_past_present(ctx, rng, mask, unidirectional):
    bsz, seq, heads, hidden, past_len = 2, 3, 2, 8, 4
    total = seq + past_len
    past = _r(rng, 2, bsz, heads, past_len, hidden // heads)
    feeds = _attention_feeds(rng, bsz, seq, hidden, [hidden] * 3, _mask_variant(rng, mask, bsz, seq, total), past)
    _run_single(ctx, "Attention", feeds, out_names=["y", "present"], num_heads=heads, unidirectional=unidirectional)


def test_attention_bias_input(ctx, rng):
    bsz, seq, heads, hidden = 2, 4, 2, 8
    for ab_shape in [(bsz, heads, seq, seq), (1, heads, seq, seq), (bsz, 1, seq, seq)]:
        feeds = _attention_feeds(
            rng, bsz, seq, hidden, [hidden] * 3, _mask_variant(rng, "1d", bsz, seq, seq), attn_bias=_r(rng, *ab_shape)
        )
        _run_single(ctx, "Attention", feeds, num_heads=heads)


def test_attention_4d_mask(ctx, rng):
    """Megatron's (B, 1, M, M) mask: onnxruntime's CPU kernel lacks it; its CUDA semantics (row
    past + s, first T columns) are those of the equivalent 3-D mask, which the CPU kernel has."""
    bsz, seq, heads, hidden, past_len, m = 2, 3, 2, 8, 2, 8
    total = seq + past_len
    mask4 = (rng.random((bsz, 1, m, m)) > 0.3).astype(np.int32)
    past = _r(rng, 2, bsz, heads, past_len, hidden // heads)
    feeds = _attention_feeds(rng, bsz, seq, hidden, [hidden] * 3, mask4[:, 0, past_len : past_len + seq, :total], past)
    m3, _ = _single("Attention", feeds, out_names=["y", "present"], num_heads=heads, unidirectional=1)
    _, ref = _out_types(m3, {k: v for k, v in feeds.items() if v is not None})
    feeds["mask"] = mask4
    model, live = _single("Attention", feeds, out_names=["y", "present"], num_heads=heads, unidirectional=1)
    del model.graph.output[:]
    model.graph.output.extend([_vi("y", list(ref[0].shape)), _vi("present", list(ref[1].shape))])
    _check(ctx, model, live, ref=ref)


# -- MultiHeadAttention ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bsz,seq,kv,heads,hidden,v_hidden", [(2, 4, 4, 2, 16, 16), (1, 3, 6, 4, 16, 8), (2, 1, 5, 2, 8, 12)]
)
@pytest.mark.parametrize("mask", [None, "1d", "2d", "3d"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_multi_head_attention(ctx, rng, bsz, seq, kv, heads, hidden, v_hidden, mask, with_bias):
    feeds = {
        "q": _r(rng, bsz, seq, hidden),
        "k": _r(rng, bsz, kv, hidden),
        "v": _r(rng, bsz, kv, v_hidden),
        "b": _r(rng, 2 * hidden + v_hidden) if with_bias else None,
        "mask": _mask_variant(rng, mask, bsz, seq, kv),
    }
    _run_single(ctx, "MultiHeadAttention", feeds, num_heads=heads)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", [None, "2d"])
def test_multi_head_attention_past_bias_qk(ctx, rng, unidirectional, mask):
    bsz, seq, heads, hidden, past_len = 2, 3, 2, 8, 5
    total = seq + past_len
    hs = hidden // heads
    feeds = {
        "q": _r(rng, bsz, seq, hidden),
        "k": _r(rng, bsz, seq, hidden),
        "v": _r(rng, bsz, seq, hidden),
        # (no fully masked row: at -10000 float32 keeps ~3 decimals of the bias added after)
        "b": _r(rng, 3 * hidden),
        "mask": _mask_variant(rng, mask, bsz, seq, total, all_masked_row=False),
        "ab": _r(rng, 1, heads, seq, total),
        "pk": _r(rng, bsz, heads, past_len, hs),
        "pv": _r(rng, bsz, heads, past_len, hs),
    }
    _run_single(
        ctx,
        "MultiHeadAttention",
        feeds,
        out_names=["y", "pk_out", "pv_out"],
        num_heads=heads,
        unidirectional=unidirectional,
        scale=0.4,
    )


def test_multi_head_attention_qk_output(ctx, rng):
    bsz, seq, heads, hidden = 2, 3, 2, 8
    for mask, uni, kv in ((None, 0, 5), ("2d", 0, 5), ("1d", 1, 3)):
        # qk: the scores softmax takes (mask, attention_bias and causal positions included)
        feeds = {
            "q": _r(rng, bsz, seq, hidden),
            "k": _r(rng, bsz, kv, hidden),
            "v": _r(rng, bsz, kv, hidden),
            "b": None,
            "mask": _mask_variant(rng, mask, bsz, seq, kv, all_masked_row=False),
            "ab": _r(rng, bsz, 1, seq, kv),
        }
        _run_single(
            ctx,
            "MultiHeadAttention",
            feeds,
            out_names=["y", "", "", "qk"],
            float_outs=("qk",),
            num_heads=heads,
            unidirectional=uni,
        )


def test_multi_head_attention_bnsh_key_value(ctx, rng):
    bsz, seq, kv, heads, hidden = 2, 3, 6, 2, 8
    feeds = {
        "q": _r(rng, bsz, seq, hidden),
        "k": _r(rng, bsz, heads, kv, hidden // heads),
        "v": _r(rng, bsz, heads, kv, hidden // heads),
        "b": None,
        "mask": _mask_variant(rng, "2d", bsz, seq, kv),
    }
    _run_single(ctx, "MultiHeadAttention", feeds, num_heads=heads)


# -- float16 (onnxruntime's CPU kernels take it for these) -------------------------------------------


@pytest.mark.parametrize(
    "op_type,outs",
    [
        ("SkipLayerNormalization", ["y", "m", "iv", "sum"]),
        ("SkipSimplifiedLayerNormalization", ["y", "m", "iv", "sum"]),
        ("FastGelu", ["y"]),
        ("BiasGelu", ["y"]),
        ("Gelu", ["y"]),
        ("QuickGelu", ["y"]),
        ("Attention", ["y"]),
        ("MultiHeadAttention", ["y"]),
    ],
)
def test_float16(ctx, rng, op_type, outs):
    h = 16
    x, s, g = (_r(rng, 2, 3, h).astype(np.float16), _r(rng, 2, 3, h).astype(np.float16), _r(rng, h).astype(np.float16))
    feeds = {
        "SkipLayerNormalization": {"x": x, "s": s, "g": g, "be": g[::-1].copy()},
        "SkipSimplifiedLayerNormalization": {"x": x, "s": s, "g": g},
        "FastGelu": {"x": x, "b": g},
        "BiasGelu": {"x": x, "b": g},
        "Gelu": {"x": x},
        "QuickGelu": {"x": x},
        "Attention": {
            "x": x,
            "w": _r(rng, h, 3 * h, scale=0.3).astype(np.float16),
            "b": _r(rng, 3 * h).astype(np.float16),
        },
        "MultiHeadAttention": {"q": x, "k": s, "v": s[:, ::-1].copy()},
    }[op_type]
    attrs = {"num_heads": 2} if "Attention" in op_type else {}
    # float16 results: within a few float16 steps of onnxruntime's (statistics outputs are float32)
    _run_single(ctx, op_type, feeds, out_names=outs, rtol=1e-2, atol=1e-2, **attrs)


# -- whole models through onnxruntime's transformer optimizer -----------------------------------------


class _Graph:
    """Nodes and initializers of a test model, built in order."""

    def __init__(self, rng):
        self.rng, self.nodes, self.inits = rng, [], []

    def init(self, name, arr):
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def w(self, name, *shape, scale=0.2):
        return self.init(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def n(self, op_type, ins, outs, **attrs):
        outs = [outs] if isinstance(outs, str) else outs
        self.nodes.append(helper.make_node(op_type, ins, outs, name=outs[0] + "_node", **attrs))
        return outs[0]

    def model(self, inputs, output, hidden):
        g = helper.make_graph(self.nodes, "g", inputs, [_vi(output, ["batch", "seq", hidden])], self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _bert_like(rng, layers=2, hidden=32, heads=4, ffn=64, vocab=50, max_pos=32, segments=2):
    """Embeddings (word + position + segment, LayerNormalization), then per layer: Q/K/V MatMul+Add,
    heads Reshape/Transpose, scaled QK^T plus the (1 - mask) * -10000 mask, Softmax, context,
    output projection, residual LayerNormalization, Erf-GELU feed-forward, residual LayerNormalization:
    the shapes a PyTorch BERT export has, which the optimizer fuses."""
    hs = hidden // heads
    m = _Graph(rng)
    n, w, init = m.n, m.w, m.init
    for name, v in (("i0", [0]), ("i1", [1]), ("i2", [2])):
        init(name, np.array(v, np.int64))
    for name, v in (
        ("f_1", 1.0),
        ("f_neg", -10000.0),
        ("f_sqrth", np.sqrt(hs)),
        ("f_sqrt2", np.sqrt(2.0)),
        ("f_half", 0.5),
    ):
        init(name, np.array(v, np.float32))
    init("shape_heads", np.array([0, 0, heads, hs], np.int64))
    init("shape_merge", np.array([0, 0, hidden], np.int64))
    init("pos_ids_all", np.arange(max_pos, dtype=np.int64)[None, :])
    # embeddings
    e_w = n("Gather", [w("word_emb", vocab, hidden, scale=1.0), "input_ids"], "e_word")
    seq_len = n("Gather", [n("Shape", ["input_ids"], "ids_shape"), "i1"], "seq_len", axis=0)
    pos = n("Slice", ["pos_ids_all", "i0", seq_len, "i1"], "pos_ids")
    e_p = n("Gather", [w("pos_emb", max_pos, hidden, scale=1.0), pos], "e_pos")
    e_s = n("Gather", [w("seg_emb", segments, hidden, scale=1.0), "token_type_ids"], "e_seg")
    e = n("Add", [n("Add", [e_w, e_p], "e_sum1"), e_s], "e_sum2")
    h = n(
        "LayerNormalization",
        [e, w("emb_ln_g", hidden, scale=0.1), w("emb_ln_b", hidden, scale=0.1)],
        "emb_ln",
        epsilon=1e-12,
    )
    # the additive mask (1 - mask) * -10000, broadcast over heads and queries
    mask = n("Unsqueeze", [n("Unsqueeze", ["attention_mask", "i1"], "mask_u1"), "i2"], "mask_u2")
    mask = n("Cast", [mask], "mask_f", to=F)
    mask_add = n("Mul", [n("Sub", ["f_1", mask], "mask_sub"), "f_neg"], "mask_add")
    for layer in range(layers):
        p = f"l{layer}_"

        def proj(name, x, din, dout):
            mm = n("MatMul", [x, w(p + name + "_w", din, dout)], p + name + "_mm")
            return n("Add", [mm, w(p + name + "_b", dout, scale=0.1)], p + name)

        def heads_of(name, perm):
            r = n("Reshape", [proj(name, h, hidden, hidden), "shape_heads"], p + name + "_r")
            return n("Transpose", [r], p + name + "_t", perm=perm)

        q, k, v = heads_of("q", [0, 2, 1, 3]), heads_of("k", [0, 2, 3, 1]), heads_of("v", [0, 2, 1, 3])
        qk = n("Div", [n("MatMul", [q, k], p + "qk"), "f_sqrth"], p + "qk_div")
        probs = n("Softmax", [n("Add", [qk, mask_add], p + "qk_mask")], p + "probs", axis=3)
        ctx = n("Transpose", [n("MatMul", [probs, v], p + "ctx")], p + "ctx_t", perm=[0, 2, 1, 3])
        ctx = n("Reshape", [ctx, "shape_merge"], p + "ctx_r")
        r1 = n("Add", [proj("ao", ctx, hidden, hidden), h], p + "res1")
        h1 = n(
            "LayerNormalization",
            [r1, w(p + "ln1_g", hidden, scale=0.1), w(p + "ln1_b", hidden, scale=0.1)],
            p + "ln1",
            epsilon=1e-12,
        )
        f = proj("ff1", h1, hidden, ffn)
        g = n("Add", [n("Erf", [n("Div", [f, "f_sqrt2"], p + "g_div")], p + "g_erf"), "f_1"], p + "g_add")
        g = n("Mul", [n("Mul", [f, g], p + "g_mul"), "f_half"], p + "gelu")
        r2 = n("Add", [proj("ff2", g, ffn, hidden), h1], p + "res2")
        h = n(
            "LayerNormalization",
            [r2, w(p + "ln2_g", hidden, scale=0.1), w(p + "ln2_b", hidden, scale=0.1)],
            p + "ln2",
            epsilon=1e-12,
        )
    n("Identity", [h], "last_hidden_state")
    ins = [_vi(name, ["batch", "seq"], I64) for name in ("input_ids", "token_type_ids", "attention_mask")]
    return m.model(ins, "last_hidden_state", hidden)


def _gpt2_like(rng, layers=2, hidden=32, heads=4, vocab=50, max_pos=32):
    """GPT-2 as exported from PyTorch without past: Conv1D projections as Reshape/Gemm/Reshape, one
    QKV projection split in three, the causal mask sliced from a lower-triangular buffer by the
    score's shape (w * b - 10000 * (1 - b)), tanh-GELU MLP, pre-LayerNormalization residuals."""
    hs = hidden // heads
    m = _Graph(rng)
    n, w, init = m.n, m.w, m.init
    for v in (0, 1, 2, 3, -1, -2):
        init(f"i{v}", np.array([v], np.int64))
    init("i_max", np.array([2**62], np.int64))
    for name, v in (
        ("f_1", 1.0),
        ("f_1e4", 10000.0),
        ("f_sqrth", np.sqrt(hs)),
        ("f_half", 0.5),
        ("f_c1", 0.044715),
        ("f_c2", np.sqrt(2 / np.pi)),
        ("f_3", 3.0),
    ):
        init(name, np.array(v, np.float32))
    init("shape_heads", np.array([0, 0, heads, hs], np.int64))
    init("shape_merge", np.array([0, 0, hidden], np.int64))
    init("shape_2d", np.array([-1, hidden], np.int64))
    init("d3", np.array([3 * hidden], np.int64))
    init("dh", np.array([hidden], np.int64))
    init("split3", np.array([hidden] * 3, np.int64))
    init("causal", np.tril(np.ones((max_pos, max_pos), np.float32))[None, None])
    init("pos_all", np.arange(max_pos, dtype=np.int64)[None, :])
    e_w = n("Gather", [w("wte", vocab, hidden, scale=1.0), "input_ids"], "e_word")
    shp = n("Shape", ["input_ids"], "ids_shape")
    pos = n("Slice", ["pos_all", "i0", n("Gather", [shp, "i1"], "seq_len", axis=0), "i1"], "pos_ids")
    h = n("Add", [e_w, n("Gather", [w("wpe", max_pos, hidden, scale=1.0), pos], "e_pos")], "embed")
    bs = n("Slice", [shp, "i0", "i2", "i0"], "bs_shape")  # [B, S]
    shape3 = n("Concat", [bs, "d3"], "shape_bs3d", axis=0)
    shapeh = n("Concat", [bs, "dh"], "shape_bsd", axis=0)
    for layer in range(layers):
        p = f"l{layer}_"
        ln1 = n(
            "LayerNormalization",
            [h, w(p + "ln1_g", hidden, scale=0.1), w(p + "ln1_b", hidden, scale=0.1)],
            p + "ln1",
            epsilon=1e-5,
        )
        x2 = n("Reshape", [ln1, "shape_2d"], p + "x2d")
        qkv = n(
            "Gemm", [x2, w(p + "c_attn_w", hidden, 3 * hidden), w(p + "c_attn_b", 3 * hidden, scale=0.1)], p + "qkv2d"
        )
        qkv = n("Reshape", [qkv, shape3], p + "qkv")
        n("Split", [qkv, "split3"], [p + "q", p + "k", p + "v"], axis=2)

        def heads_of(name, perm):
            r = n("Reshape", [p + name, "shape_heads"], p + name + "_r")
            return n("Transpose", [r], p + name + "_t", perm=perm)

        q, k, v = heads_of("q", [0, 2, 1, 3]), heads_of("k", [0, 2, 3, 1]), heads_of("v", [0, 2, 1, 3])
        wd = n("Div", [n("MatMul", [q, k], p + "w"), "f_sqrth"], p + "w_div")
        # b = causal[:, :, ns - nd:ns, :ns] with nd, ns the score's last two sizes
        ws = n("Shape", [wd], p + "w_shape")
        ns = n("Squeeze", [n("Slice", [ws, "i-1", "i_max", "i0"], p + "ns_s"), "i0"], p + "ns")
        nd = n("Squeeze", [n("Slice", [ws, "i-2", "i-1", "i0"], p + "nd_s"), "i0"], p + "nd")
        start = n("Unsqueeze", [n("Sub", [ns, nd], p + "ns_nd"), "i0"], p + "start")
        end = n("Unsqueeze", [ns, "i0"], p + "end")
        bias = n("Slice", [n("Slice", ["causal", start, end, "i2"], p + "b1"), "i0", end, "i3"], p + "b2")
        off = n("Mul", [n("Sub", ["f_1", bias], p + "not_b"), "f_1e4"], p + "w_off")
        masked = n("Sub", [n("Mul", [wd, bias], p + "w_keep"), off], p + "w_masked")
        probs = n("Softmax", [masked], p + "probs", axis=-1)
        a = n("Transpose", [n("MatMul", [probs, v], p + "a")], p + "a_t", perm=[0, 2, 1, 3])
        a = n("Reshape", [n("Reshape", [a, "shape_merge"], p + "a_merge"), "shape_2d"], p + "a2d")
        o = n("Gemm", [a, w(p + "c_proj_w", hidden, hidden), w(p + "c_proj_b", hidden, scale=0.1)], p + "o2d")
        h = n("Add", [h, n("Reshape", [o, shapeh], p + "o")], p + "res1")
        ln2 = n(
            "LayerNormalization",
            [h, w(p + "ln2_g", hidden, scale=0.1), w(p + "ln2_b", hidden, scale=0.1)],
            p + "ln2",
            epsilon=1e-5,
        )
        f = n("MatMul", [ln2, w(p + "fc_w", hidden, 4 * hidden)], p + "fc_mm")
        f = n("Add", [f, w(p + "fc_b", 4 * hidden, scale=0.1)], p + "fc")
        # gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = n("Pow", [f, "f_3"], p + "g_pow")
        t = n("Add", [f, n("Mul", [x3, "f_c1"], p + "g_mul1")], p + "g_add1")
        t = n("Add", [n("Tanh", [n("Mul", [t, "f_c2"], p + "g_mul2")], p + "g_tanh"), "f_1"], p + "g_add2")
        g = n("Mul", [n("Mul", [f, "f_half"], p + "g_half"), t], p + "gelu")
        f2 = n(
            "Add",
            [n("MatMul", [g, w(p + "proj_w", 4 * hidden, hidden)], p + "proj_mm"), w(p + "proj_b", hidden, scale=0.1)],
            p + "proj",
        )
        h = n("Add", [h, f2], p + "res2")
    n(
        "LayerNormalization",
        [h, w("lnf_g", hidden, scale=0.1), w("lnf_b", hidden, scale=0.1)],
        "last_hidden_state",
        epsilon=1e-5,
    )
    return m.model([_vi("input_ids", ["batch", "seq"], I64)], "last_hidden_state", hidden)


def _optimize(model, model_type, options=None):
    import copy

    from onnxruntime.transformers import optimizer

    # optimize_model rewrites the ModelProto it is given: hand it a copy
    return optimizer.optimize_model(
        copy.deepcopy(model),
        model_type=model_type,
        num_heads=4,
        hidden_size=32,
        optimization_options=options,
        opt_level=0,
    ).model


def _contrib_ops(model):
    return sorted({n.op_type for n in model.graph.node if n.domain == MS})


def _run_two_lengths(ctx, model, make_feeds, lengths):
    """One session, several sequence lengths, each compared with onnxruntime on the same model."""
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(model, ctx)
    for seq in lengths:
        feeds = make_feeds(seq)
        want = ref.run(None, feeds)
        got = sess.run(None, feeds)
        for g, r in zip(got, want):
            assert g.shape == r.shape
            assert g.dtype == r.dtype
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)
    return sess


@pytest.mark.parametrize("variant", ["mask_index", "raw_mask", "multi_head", "fast_gelu"])
def test_bert_like_optimized(ctx, variant):
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions

    rng = np.random.default_rng(11)
    opts = FusionOptions("bert")
    if variant == "raw_mask":
        opts.attention_mask_format = AttentionMaskFormat.AttentionMask
    elif variant == "multi_head":
        opts.use_multi_head_attention = True
    elif variant == "fast_gelu":
        opts.enable_gelu_approximation = True
    model = _optimize(_bert_like(rng), "bert", opts)
    attention = "MultiHeadAttention" if variant == "multi_head" else "Attention"
    gelu = "FastGelu" if variant == "fast_gelu" else "BiasGelu"
    assert _contrib_ops(model) == sorted({attention, "EmbedLayerNormalization", "SkipLayerNormalization", gelu})
    assert not any(n.op_type in ("Softmax", "LayerNormalization", "Erf") for n in model.graph.node)

    def feeds(seq):
        bsz = 2
        mask = np.ones((bsz, seq), np.int64)
        mask[1, seq - 2 :] = 0  # right padding in the second sequence
        return {
            "input_ids": rng.integers(0, 50, (bsz, seq)).astype(np.int64),
            "token_type_ids": rng.integers(0, 2, (bsz, seq)).astype(np.int64),
            "attention_mask": mask,
        }

    _run_two_lengths(ctx, model, feeds, (5, 9, 5))


def test_gpt2_like_optimized(ctx):
    rng = np.random.default_rng(12)
    model = _optimize(_gpt2_like(rng), "gpt2")
    assert {"Attention", "SkipLayerNormalization", "FastGelu"} <= set(_contrib_ops(model))
    att = [n for n in model.graph.node if n.op_type == "Attention"]
    assert len(att) == 2 and all(
        helper.get_attribute_value(a) == 1 for n in att for a in n.attribute if a.name == "unidirectional"
    )
    _run_two_lengths(ctx, model, lambda seq: {"input_ids": rng.integers(0, 50, (2, seq)).astype(np.int64)}, (6, 11, 6))


def test_attention_dynamic_past_and_mask(ctx):
    """A decoder-style Attention (past, present, 2-D mask over past + new keys, causal) with
    symbolic batch / sequence / past sizes: one session runs several shapes."""
    rng = np.random.default_rng(13)
    heads, hidden = 2, 8
    w, bias = _r(rng, hidden, 3 * hidden, scale=0.3), _r(rng, 3 * hidden, scale=0.3)
    node = helper.make_node(
        "Attention", ["x", "w", "b", "mask", "past"], ["y", "present"], domain=MS, num_heads=heads, unidirectional=1
    )
    model = _model(
        [node],
        [
            _vi("x", ["batch", "seq", hidden]),
            _vi("mask", ["batch", "total"], I32),
            _vi("past", [2, "batch", heads, "past", hidden // heads]),
        ],
        [_vi("y", ["batch", "seq", hidden]), _vi("present", [2, "batch", heads, "total", hidden // heads])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")],
    )
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = InferenceSession(model, ctx)
    for bsz, seq, past in ((2, 3, 4), (2, 1, 7), (1, 5, 2), (2, 4, 0)):  # (an empty past: a first step)
        mask = (rng.random((bsz, seq + past)) > 0.2).astype(np.int32)
        mask[:, -1] = 1
        feeds = {"x": _r(rng, bsz, seq, hidden), "mask": mask, "past": _r(rng, 2, bsz, heads, past, hidden // heads)}
        for g, r in zip(sess.run(None, feeds), ref.run(None, feeds)):
            assert g.shape == r.shape
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


# -- rejected variants -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "rotary",
        "share_buffer",
        "mask_3b2",
        "packed_qkv",
        "fused_conv_elu",
        "fused_conv_params",
        "cache_indirection",
        "causal_cross",
        "trans_batch_2d",
    ],
)
def test_unsupported_variants_are_named(ctx, rng, case):
    bsz, seq, hidden = 2, 3, 8
    feeds = _attention_feeds(rng, bsz, seq, hidden, [hidden] * 3)
    op_type, attrs, match = "Attention", {"num_heads": 2}, None
    if case == "rotary":
        attrs["do_rotary"], match = 1, "do_rotary"
    elif case == "share_buffer":
        attrs["past_present_share_buffer"], match = 1, "past_present_share_buffer"
    elif case == "mask_3b2":
        feeds["mask"], match = np.zeros(3 * bsz + 2, np.int32), r"3 \* batch \+ 2"
    elif case == "packed_qkv":
        op_type, match = "MultiHeadAttention", "packed QKV"
        feeds = {"q": _r(rng, bsz, seq, 2, 3, 4)}
    elif case == "cache_indirection":
        op_type, match = "MultiHeadAttention", "cache_indirection"
        feeds = {"q": _r(rng, bsz, seq, hidden), "k": _r(rng, bsz, seq, hidden), "v": _r(rng, bsz, seq, hidden)}
        feeds.update({n: None for n in ("b", "m", "ab", "pk", "pv", "psl")})
        feeds["ci"] = np.zeros((bsz, 1, seq), np.int32)
    elif case == "causal_cross":
        op_type, match = "MultiHeadAttention", "unidirectional=1"
        feeds = {"q": _r(rng, bsz, seq, hidden), "k": _r(rng, bsz, 5, hidden), "v": _r(rng, bsz, 5, hidden)}
        attrs["unidirectional"] = 1
    elif case == "trans_batch_2d":
        op_type, match, attrs = "FusedMatMul", "transBatchA", {"transBatchA": 1}
        feeds = {"a": _r(rng, 3, 4), "b": _r(rng, 4, 5)}
    elif case.startswith("fused_conv"):
        op_type = "FusedConv"
        feeds = {"x": _r(rng, 1, 2, 4, 4), "w": _r(rng, 2, 2, 3, 3)}
        attrs = {"activation": "Elu"} if case == "fused_conv_elu" else {"activation": "LeakyRelu"}
        match = "activation"
    model, live = _single(op_type, feeds, **attrs)
    del model.graph.output[:]
    model.graph.output.append(_vi("y0", None))
    with pytest.raises(mltensor.NotSupportedError, match=match):
        InferenceSession(model, ctx).run(None, live)
