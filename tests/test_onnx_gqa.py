"""onnxruntime's LLM contrib operators (com.microsoft RotaryEmbedding, GroupQueryAttention,
mltensor/onnx/ops/contrib_llm.py) against onnxruntime's CPU kernels on random data: single-node
models over the attribute variants, prompt then decode steps feeding present back as past, and a
decode loop in one InferenceSession on a model shaped like onnxruntime-genai's exports."""

import zlib

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mltensor import InferenceSession
from mltensor.onnx.errors import UnsupportedError

ort = pytest.importorskip("onnxruntime")

TOL = 1e-4
NP_TP = {
    np.dtype(np.float32): TP.FLOAT,
    np.dtype(np.float16): TP.FLOAT16,
    np.dtype(np.int64): TP.INT64,
    np.dtype(np.int32): TP.INT32,
}


def _model(nodes, inputs, outputs, inits=()):
    """inputs: {name: array or (np dtype, shape)}; outputs: {name: np dtype}."""
    ins = []
    for k, v in inputs.items():
        dt, shape = (v.dtype, list(v.shape)) if isinstance(v, np.ndarray) else v
        ins.append(helper.make_tensor_value_info(k, NP_TP[np.dtype(dt)], shape))
    outs = [helper.make_tensor_value_info(k, NP_TP[np.dtype(dt)], None) for k, dt in outputs.items()]
    g = helper.make_graph(nodes, "g", ins, outs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def _ort(model, feeds):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def _close(ours, ref, tol=TOL, what=""):
    assert ours.shape == ref.shape, what
    assert ours.dtype == ref.dtype, what
    err = float(np.max(np.abs(ours.astype(np.float64) - ref))) if ref.size else 0.0
    assert err <= tol, f"{what}: max abs error {err}"


def _seed(*parts):
    """A seed per test case, the same in every process (str hashes are salted per process)."""
    return zlib.crc32(repr(parts).encode())


def _caches(rng, max_pos, half):
    ang = rng.uniform(0, 2 * np.pi, (max_pos, half))
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


# -- RotaryEmbedding -----------------------------------------------------------------------------


def _rotary(ctx, x, pos, cos, sin, **attrs):
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", **attrs)
    feeds = {"x": x, "pos": pos, "cos": cos, "sin": sin}
    m = _model([node], feeds, {"y": x.dtype})
    (ref,) = _ort(m, feeds)
    with InferenceSession(m, ctx) as sess:
        (ours,) = sess.run(None, feeds)
    return ours, ref


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("pos_kind", ["offset", "per_token"])
def test_rotary_embedding(ctx, interleaved, rank, partial, pos_kind):
    rng = np.random.default_rng(_seed(interleaved, rank, partial, pos_kind))
    bs, s, n, hd, max_pos = 2, 5, 3, 16, 24
    rot = 8 if partial else hd
    attrs = {"interleaved": interleaved}
    if partial:
        attrs.update(num_heads=n, rotary_embedding_dim=rot)
    elif rank == 3 and pos_kind == "offset":
        attrs.update(num_heads=n)  # with num_heads given and without (derived from the cache)
    cos, sin = _caches(rng, max_pos, rot // 2)
    shape = (bs, s, n * hd) if rank == 3 else (bs, n, s, hd)
    x = rng.standard_normal(shape).astype(np.float32)
    if pos_kind == "offset":
        pos = np.array([rng.integers(0, max_pos - s)], np.int64)
    else:
        pos = rng.integers(0, max_pos, (bs, s)).astype(np.int64)
    ours, ref = _rotary(ctx, x, pos, cos, sin, **attrs)
    _close(ours, ref)


def test_rotary_embedding_head_wide_cache_partial(ctx):
    # a cache of head_size/2 columns with a smaller rotary_embedding_dim: onnxruntime reads row
    # p at p * rotary_dim/2 of the flattened cache, not at p * width
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 2 * 16)).astype(np.float32)
    cos, sin = _caches(rng, 16, 8)
    pos = rng.integers(0, 8, (1, 4)).astype(np.int64)
    ours, ref = _rotary(ctx, x, pos, cos, sin, num_heads=2, rotary_embedding_dim=8)
    _close(ours, ref)


def test_rotary_embedding_float16(ctx):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 2, 16)).astype(np.float16)
    cos, sin = (c.astype(np.float16) for c in _caches(rng, 8, 8))
    pos = np.array([1], np.int64)
    ours, ref = _rotary(ctx, x, pos, cos, sin, interleaved=1)
    _close(ours, ref, tol=4e-3)


def test_rotary_embedding_packed_batching_rejected(ctx):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 16)).astype(np.float32)
    cos, sin = _caches(rng, 8, 8)
    node = helper.make_node(
        "RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", is_packed_batching=1
    )
    feeds = {"x": x, "pos": np.array([0], np.int64), "cos": cos, "sin": sin}
    m = _model([node], feeds, {"y": np.float32})
    with pytest.raises(UnsupportedError, match="is_packed_batching"):
        with InferenceSession(m, ctx) as sess:
            sess.run(None, feeds)


# -- GroupQueryAttention ---------------------------------------------------------------------------


class GQA:
    """A single GroupQueryAttention node with graph inputs for everything, run by both runtimes."""

    def __init__(self, heads, kv_heads, hd, packed=False, rotary=False, max_pos=64, dtype=np.float32, **attrs):
        self.heads, self.kv_heads, self.hd, self.packed, self.rotary = heads, kv_heads, hd, packed, rotary
        self.dtype = dtype
        self.attrs = dict(num_heads=heads, kv_num_heads=kv_heads, **attrs)
        if rotary:
            self.attrs["do_rotary"] = 1
        self.rng = np.random.default_rng(_seed(heads, kv_heads, hd, packed, rotary, sorted(attrs.items())))
        self.cos, self.sin = _caches(self.rng, max_pos, hd // 2)

    def feeds(self, bs, s, past, seqlens, total):
        r, d = self.rng, self.dtype
        f = {}
        if self.packed:
            f["query"] = r.standard_normal((bs, s, (self.heads + 2 * self.kv_heads) * self.hd)).astype(d)
        else:
            f["query"] = r.standard_normal((bs, s, self.heads * self.hd)).astype(d)
            f["key"] = r.standard_normal((bs, s, self.kv_heads * self.hd)).astype(d)
            f["value"] = r.standard_normal((bs, s, self.kv_heads * self.hd)).astype(d)
        if past is not None:
            f["past_key"], f["past_value"] = past
        f["seqlens_k"] = np.asarray(seqlens, np.int32)
        f["total_sequence_length"] = np.array(total, np.int32)
        if self.rotary:
            f["cos_cache"], f["sin_cache"] = self.cos.astype(d), self.sin.astype(d)
        return f

    def model(self, feeds):
        names = [
            "query",
            "key",
            "value",
            "past_key",
            "past_value",
            "seqlens_k",
            "total_sequence_length",
            "cos_cache",
            "sin_cache",
        ]
        node = helper.make_node(
            "GroupQueryAttention",
            [n if n in feeds else "" for n in names],
            ["output", "present_key", "present_value"],
            domain="com.microsoft",
            **self.attrs,
        )
        # the sequence dimensions are symbolic: one model serves prompt and decode steps
        ins = {}
        for k, v in feeds.items():
            shape = list(v.shape)
            if k in ("query", "key", "value"):
                shape = ["batch", "seq", shape[2]]
            elif k.startswith("past"):
                shape = ["batch", self.kv_heads, "past", self.hd]
            ins[k] = (v.dtype, shape)
        return _model([node], ins, {"output": self.dtype, "present_key": self.dtype, "present_value": self.dtype})


def _valid_rows(x, lens):
    """present rows [0, L_b) of each batch entry (onnxruntime leaves the rest unspecified)."""
    return [x[i, :, :n] for i, n in enumerate(lens)]


def _compare_step(ours, ref, lens, what, tol=TOL):
    _close(ours[0], ref[0], tol, f"{what} output")
    for j, name in ((1, "present_key"), (2, "present_value")):
        assert ours[j].shape == ref[j].shape, f"{what} {name}"
        for a, r in zip(_valid_rows(ours[j], lens), _valid_rows(ref[j], lens)):
            _close(a, r, tol, f"{what} {name}")


def _run_steps(ctx, g, bs, prompt, steps, tol=TOL):
    """A prompt of `prompt` tokens then `steps` single-token steps, each step's present (ours
    and onnxruntime's, each its own) fed back as past; compared at every step."""
    empty = np.zeros((bs, g.kv_heads, 0, g.hd), g.dtype)  # the model builder's first past
    feeds = g.feeds(bs, prompt, (empty, empty), [prompt - 1] * bs, prompt)
    m = g.model(feeds)
    ref_s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with InferenceSession(m, ctx) as sess:
        ours, ref = sess.run(None, feeds), ref_s.run(None, feeds)
        _compare_step(ours, ref, [prompt] * bs, "prompt", tol)
        n = prompt
        for i in range(steps):
            n += 1
            f = g.feeds(bs, 1, None, [n - 1] * bs, n)
            f_ref = dict(f, past_key=ref[1], past_value=ref[2])
            f_our = dict(f, past_key=ours[1], past_value=ours[2])
            ours, ref = sess.run(None, f_our), ref_s.run(None, f_ref)
            _compare_step(ours, ref, [n] * bs, f"step {i}", tol)


@pytest.mark.parametrize(
    "heads,kv_heads,packed,rotary,attrs",
    [
        (2, 2, False, False, {}),
        (6, 2, False, False, {}),
        (6, 2, True, False, {}),
        (3, 1, False, True, {}),
        (6, 2, True, True, {"rotary_interleaved": 1}),
        (6, 2, False, False, {"local_window_size": 3}),
        (2, 1, False, False, {"softcap": 2.0, "scale": 0.3}),
        (4, 2, False, True, {"smooth_softmax": 1}),
        (4, 2, True, True, {"causal": 0}),
    ],
)
def test_gqa_prompt_then_decode(ctx, heads, kv_heads, packed, rotary, attrs):
    g = GQA(heads, kv_heads, 16, packed=packed, rotary=rotary, **attrs)
    _run_steps(ctx, g, 1, 5, 3)


def test_gqa_batch2_same_lengths(ctx):
    g = GQA(6, 2, 16, rotary=True)
    _run_steps(ctx, g, 2, 4, 2)


def _single(ctx, g, feeds, lens, what, tol=TOL, rows=None):
    """One run of a single-node model; rows: {b: query rows to compare} (padding rows of a
    batched first prompt are unspecified in onnxruntime)."""
    m = g.model(feeds)
    ref = _ort(m, feeds)
    with InferenceSession(m, ctx) as sess:
        ours = sess.run(None, feeds)
    if rows is None:
        _compare_step(ours, ref, lens, what, tol)
        return
    assert ours[0].shape == ref[0].shape
    for bi, n in rows.items():
        _close(ours[0][bi, :n], ref[0][bi, :n], tol, f"{what} output[{bi}]")
    for j in (1, 2):
        assert ours[j].shape == ref[j].shape
        for a, r in zip(_valid_rows(ours[j], lens), _valid_rows(ref[j], lens)):
            _close(a, r, tol, what)


def _past(g, bs, p, lens):
    """A past cache of p rows whose rows beyond each entry's length are zero (right padding)."""
    k = g.rng.standard_normal((bs, g.kv_heads, p, g.hd)).astype(g.dtype)
    v = g.rng.standard_normal((bs, g.kv_heads, p, g.hd)).astype(g.dtype)
    for i, n in enumerate(lens):
        k[i, :, n:] = 0
        v[i, :, n:] = 0
    return k, v


@pytest.mark.parametrize("rotary", [False, True])
def test_gqa_batch_decode_differing_lengths(ctx, rotary):
    # entries of 5 and 3 cached tokens in a 5-row past: each appends at its own length
    g = GQA(6, 2, 16, rotary=rotary, local_window_size=4)
    past = _past(g, 2, 5, [5, 3])
    _single(ctx, g, g.feeds(2, 1, past, [5, 3], 6), [6, 4], "decode")


@pytest.mark.parametrize("rotary", [False, True])
def test_gqa_batch_first_prompt_padded(ctx, rotary):
    # a batched first prompt whose second entry has 2 real tokens (right padding)
    g = GQA(4, 2, 16, rotary=rotary)
    empty = np.zeros((2, 2, 0, 16), np.float32)
    _single(ctx, g, g.feeds(2, 5, (empty, empty), [4, 1], 5), [5, 2], "prompt", rows={0: 5, 1: 2})


def test_gqa_prompt_without_past_inputs(ctx):
    g = GQA(6, 2, 16, packed=True, rotary=True)
    _single(ctx, g, g.feeds(1, 6, None, [5], 6), [6], "prompt")


@pytest.mark.parametrize("local_window_size", [-1, 2])
def test_gqa_subsequent_prompt(ctx, local_window_size):
    # batch 1, a chunk of 3 tokens after 4 cached ones (continuous decoding)
    g = GQA(6, 2, 16, rotary=True, local_window_size=local_window_size)
    _single(ctx, g, g.feeds(1, 3, _past(g, 1, 4, [4]), [6], 7), [7], "chunk")


def test_gqa_not_causal_batch_decode(ctx):
    g = GQA(4, 2, 16, causal=0)
    _single(ctx, g, g.feeds(2, 1, _past(g, 2, 5, [5, 2]), [5, 2], 6), [6, 3], "decode")
    g = GQA(4, 2, 16, causal=0)
    _single(ctx, g, g.feeds(1, 3, _past(g, 1, 4, [4]), [6], 7), [7], "chunk")


def test_gqa_shared_max_length_buffer(ctx):
    # a past buffer of max length (10 rows, 4 valid): present keeps its 10 rows, the new token
    # goes to row 4
    g = GQA(4, 4, 16, rotary=True)
    _single(ctx, g, g.feeds(1, 1, _past(g, 1, 10, [4]), [4], 5), [5], "decode")


def test_gqa_head_sink(ctx):
    g = GQA(4, 2, 16)
    empty = np.zeros((1, 2, 0, 16), np.float32)
    feeds = g.feeds(1, 4, (empty, empty), [3], 4)
    feeds["head_sink"] = g.rng.standard_normal(4).astype(np.float32)
    names = [
        "query",
        "key",
        "value",
        "past_key",
        "past_value",
        "seqlens_k",
        "total_sequence_length",
        "",
        "",
        "",
        "",
        "head_sink",
    ]
    node = helper.make_node(
        "GroupQueryAttention", names, ["output", "present_key", "present_value"], domain="com.microsoft", **g.attrs
    )
    m = _model([node], feeds, {"output": np.float32, "present_key": np.float32, "present_value": np.float32})
    ref = _ort(m, feeds)
    with InferenceSession(m, ctx) as sess:
        ours = sess.run(None, feeds)
    _compare_step(ours, ref, [4], "head_sink")


def test_gqa_float16(ctx):
    g = GQA(4, 2, 16, rotary=True, dtype=np.float16)
    _run_steps(ctx, g, 1, 4, 2, tol=4e-3)


@pytest.mark.parametrize(
    "extra",
    [
        {"attrs": {"causal": 0, "local_window_size": 2}, "match": "causal"},
        {"attrs": {"sliding_window_cache": 1, "local_window_size": 4}, "match": "sliding_window_cache"},
        {"attrs": {"qk_output": 1}, "match": "qk_output"},
        {"input": (16, "query_seqlens"), "match": "query_seqlens"},
        {"attrs": {"k_quant_type": "PER_TENSOR"}, "match": "k_quant_type"},
    ],
)
def test_gqa_rejected_variants(ctx, extra):
    g = GQA(2, 2, 16)
    feeds = g.feeds(1, 3, None, [2], 3)
    names = ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length"]
    attrs = dict(g.attrs, **extra.get("attrs", {}))
    if "input" in extra:
        i, name = extra["input"]
        names += [""] * (i - len(names)) + [name]
        feeds[name] = np.array([3], np.int32)
    node = helper.make_node(
        "GroupQueryAttention", names, ["output", "present_key", "present_value"], domain="com.microsoft", **attrs
    )
    m = _model([node], feeds, {"output": np.float32, "present_key": np.float32, "present_value": np.float32})
    with pytest.raises(UnsupportedError, match=extra["match"]):
        with InferenceSession(m, ctx) as sess:
            sess.run(None, feeds)


def _genai_model(heads, kv_heads, hd, rotary, max_pos=64, seed=0):
    """One attention layer as onnxruntime-genai's model builder exports it: seqlens_k and
    total_sequence_length computed from attention_mask (ReduceSum - 1, and its Shape), BNSH
    past/present caches with symbolic lengths, the cos/sin caches as initializers."""
    from onnx import numpy_helper

    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("ReduceSum", ["attention_mask", "one_axis"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["mask_sum_1"]),
        helper.make_node("Cast", ["mask_sum_1"], ["seqlens_k"], to=TP.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["total64"], axis=0),
        helper.make_node("Cast", ["total64"], ["total"], to=TP.INT32),
        helper.make_node(
            "GroupQueryAttention",
            ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total"]
            + (["cos_cache", "sin_cache"] if rotary else []),
            ["output", "present_key", "present_value"],
            domain="com.microsoft",
            num_heads=heads,
            kv_num_heads=kv_heads,
            do_rotary=int(rotary),
        ),
    ]
    inits = [
        numpy_helper.from_array(np.array([1], np.int64), "one_axis"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
    ]
    if rotary:
        cos, sin = _caches(rng, max_pos, hd // 2)
        inits += [numpy_helper.from_array(cos, "cos_cache"), numpy_helper.from_array(sin, "sin_cache")]
    ins = {
        "query": (np.float32, ["batch", "seq", heads * hd]),
        "key": (np.float32, ["batch", "seq", kv_heads * hd]),
        "value": (np.float32, ["batch", "seq", kv_heads * hd]),
        "attention_mask": (np.int64, ["batch", "total_seq"]),
        "past_key": (np.float32, ["batch", kv_heads, "past_seq", hd]),
        "past_value": (np.float32, ["batch", kv_heads, "past_seq", hd]),
    }
    return _model(nodes, ins, {"output": np.float32, "present_key": np.float32, "present_value": np.float32}, inits)


@pytest.mark.parametrize("bs,steps,location", [(1, 2, "cpu"), (1, 2, "ml-tensor"), (2, 5, "ml-tensor")])
def test_gqa_decode_loop_one_session(ctx, bs, steps, location):
    """A prompt and decode steps in one InferenceSession, each step's present fed back as past
    (as MLTensors with output_location="ml-tensor"), against onnxruntime at every step. With a
    batch of 2, the second entry is 2 tokens shorter (right padding in attention_mask): its
    tokens go at its own length."""
    heads, kv_heads, hd, prompt = 6, 2, 16, 5
    m = _genai_model(heads, kv_heads, hd, rotary=True)
    rng = np.random.default_rng(11 + bs)
    ref_s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    short = [0, 2][:bs]  # padding per entry

    def feeds(s, total):
        mask = np.ones((bs, total), np.int64)
        for i, p in enumerate(short):
            mask[i, total - p :] = 0
        return {
            "query": rng.standard_normal((bs, s, heads * hd)).astype(np.float32),
            "key": rng.standard_normal((bs, s, kv_heads * hd)).astype(np.float32),
            "value": rng.standard_normal((bs, s, kv_heads * hd)).astype(np.float32),
            "attention_mask": mask,
        }

    def compare(ours, ref, n, what):
        host = [ctx.read_tensor_sync(o) if location == "ml-tensor" else o for o in ours]
        lens = [n - p for p in short]
        assert host[0].shape == ref[0].shape
        for i, n_i in enumerate(lens):  # a padded entry's padding rows are unspecified
            rows = min(n_i, host[0].shape[1]) if n == prompt else host[0].shape[1]
            _close(host[0][i, :rows], ref[0][i, :rows], TOL, f"{what} output[{i}]")
        for j in (1, 2):
            assert host[j].shape == ref[j].shape
            for a, r in zip(_valid_rows(host[j], lens), _valid_rows(ref[j], lens)):
                _close(a, r, TOL, f"{what} present")

    empty = np.zeros((bs, kv_heads, 0, hd), np.float32)
    with InferenceSession(m, ctx) as sess:
        f = feeds(prompt, prompt)
        ref = ref_s.run(None, dict(f, past_key=empty, past_value=empty))
        ours = sess.run(None, dict(f, past_key=empty, past_value=empty), output_location=location)
        compare(ours, ref, prompt, "prompt")
        n = prompt
        for step in range(steps):
            n += 1
            f = feeds(1, n)
            ref = ref_s.run(None, dict(f, past_key=ref[1], past_value=ref[2]))
            ours = sess.run(None, dict(f, past_key=ours[1], past_value=ours[2]), output_location=location)
            compare(ours, ref, n, f"step {step}")
        builds = 2
        if bs == 1:
            # then a chunk of 3 tokens after the cache (continuous decoding): the first-prompt
            # test (S == total_sequence_length) is made per dispatch in this build
            for chunk in (3, 2):
                n += chunk
                f = feeds(chunk, n)
                ref = ref_s.run(None, dict(f, past_key=ref[1], past_value=ref[2]))
                ours = sess.run(None, dict(f, past_key=ours[1], past_value=ours[2]), output_location=location)
                compare(ours, ref, n, f"chunk {chunk}")
            builds = 3
        # one dynamic build for the prompt, one serving every decode step (its cache lengths
        # grow by doubling, which rebuilds without compiling anything new), one for the chunks
        assert sess.stats["dynamic"] and sess.stats["specializations"] == builds, sess.stats["static_reason"]


def test_rotary_embedding_dynamic_sequence(ctx):
    """One dynamic build serves several sequence lengths (the offset is a graph input)."""
    rng = np.random.default_rng(5)
    cos, sin = _caches(rng, 32, 8)
    from onnx import numpy_helper

    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", interleaved=1)
    m = _model(
        [node],
        {"x": (np.float32, [1, "seq", 32]), "pos": (np.int64, [1])},
        {"y": np.float32},
        [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")],
    )
    ref_s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with InferenceSession(m, ctx) as sess:
        for s, off in ((3, 0), (7, 5), (4, 20), (2, 1)):
            f = {"x": rng.standard_normal((1, s, 32)).astype(np.float32), "pos": np.array([off], np.int64)}
            _close(sess.run(None, f)[0], ref_s.run(None, f)[0], TOL, f"seq {s}")
        assert sess.stats["dynamic"] and sess.stats["builds"] <= 3, sess.stats["static_reason"]


def _extra_inputs_model(g, feeds):
    names = [
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
    ]
    node = helper.make_node(
        "GroupQueryAttention",
        [n if n in feeds else "" for n in names],
        ["output", "present_key", "present_value"],
        domain="com.microsoft",
        **g.attrs,
    )
    return _model([node], feeds, {"output": g.dtype, "present_key": g.dtype, "present_value": g.dtype})


def _run_extra(ctx, g, feeds, lens, what):
    m = _extra_inputs_model(g, feeds)
    ref = _ort(m, feeds)
    with InferenceSession(m, ctx) as sess:
        ours = sess.run(None, feeds)
    _compare_step(ours, ref, lens, what)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_gqa_position_ids(ctx, interleaved):
    # rotary positions from position_ids: a first prompt uses the first one as an offset, a
    # decode step each entry's own
    g = GQA(6, 2, 16, rotary=True, rotary_interleaved=interleaved)
    empty = np.zeros((2, 2, 0, 16), np.float32)
    f = g.feeds(2, 4, (empty, empty), [3, 3], 4)
    f["position_ids"] = g.rng.integers(0, 40, (2, 4)).astype(np.int64)
    _run_extra(ctx, g, f, [4, 4], "prompt")
    f = g.feeds(2, 1, _past(g, 2, 4, [4, 2]), [4, 2], 5)
    f["position_ids"] = np.array([[17], [30]], np.int64)
    _run_extra(ctx, g, f, [5, 3], "decode")


@pytest.mark.parametrize(
    "bias_shape,softcap,past", [((1, 1), 0.0, 0), ((2, 6), 0.0, 0), ((1, 6), 1.5, 3), ((2, 1), 0.0, 3)]
)
def test_gqa_attention_bias(ctx, bias_shape, softcap, past):
    attrs = {"softcap": softcap} if softcap else {}
    g = GQA(6, 2, 16, **attrs)
    s = 1 if past else 4
    total = past + s
    pk = _past(g, 2, past, [past, past]) if past else (np.zeros((2, 2, 0, 16), np.float32),) * 2
    f = g.feeds(2, s, pk, [total - 1] * 2, total)
    f["attention_bias"] = g.rng.standard_normal(bias_shape + (s, total)).astype(np.float32)
    _run_extra(ctx, g, f, [total, total], "bias")


def test_gqa_attention_bias_shared_buffer(ctx):
    # a max-length past buffer (8 rows) longer than total_sequence_length (5): the bias covers
    # the first 5 key positions
    g = GQA(4, 2, 16)
    f = g.feeds(1, 1, _past(g, 1, 8, [4]), [4], 5)
    f["attention_bias"] = g.rng.standard_normal((1, 4, 1, 5)).astype(np.float32)
    _run_extra(ctx, g, f, [5], "bias")
