"""A small Llama-style decoder in the form onnxruntime-genai's model builder exports (int4),
end to end through InferenceSession against onnxruntime CPU: the contrib operators of issue #26
(tests/test_onnx_nbits.py, test_onnx_gqa.py, test_onnx_contrib.py) together in one graph.

The model (`llama_decoder`): input_ids, attention_mask and past_key_values.{i}.key/value in;
logits and present.{i}.key/value out. seqlens_k (ReduceSum(mask) - 1) and total_sequence_length
(Shape(mask)[1]) are computed in-graph as genai does; each layer is SimplifiedLayerNormalization
(the first) or SkipSimplifiedLayerNormalization (carrying the residual), Q/K/V projections,
GroupQueryAttention (do_rotary=1, cos/sin caches, kv_num_heads < num_heads), the output
projection, a SkipSimplifiedLayerNormalization, the gate/up/down MLP with SiLU gating; then the
final norm and the lm_head. The projections start as float MatMuls (random weights) and are
quantized by onnxruntime's MatMulNBitsQuantizer to com.microsoft.MatMulNBits: the attention and
gate/up projections symmetric in blocks of 32, down and lm_head asymmetric in blocks of 128 (the
down projection's K is not a multiple of 128: its last block is padding). The embedding is a
float Gather, or (genai's int4 shared embeddings) a GatherBlockQuantized reading the lm_head's
packed 4-bit weights. bench/test_bench_quant.py times the same builder at a larger size.
"""

import dataclasses
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mltensor import InferenceSession

from helpers import without_accuracy_level

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
TOL = 1e-3  # max abs logit error, relative to the largest reference logit


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int = 2
    hidden: int = 128
    heads: int = 4
    kv_heads: int = 2
    inter: int = 320  # not a multiple of 128: the down projection's last block is padding
    vocab: int = 512
    max_pos: int = 256  # rows of the cos/sin caches
    eps: float = 1e-5
    theta: float = 10000.0

    @property
    def head_size(self):
        return self.hidden // self.heads


def _seed(*parts):
    """A seed per case, the same in every process (str hashes are salted per process)."""
    return zlib.crc32(repr(parts).encode())


def _proj_names(cfg):
    """{kind: [MatMul node names]}: 'small' blocks of 32 (attention, gate, up), 'large' blocks
    of 128 (down, lm_head)."""
    small, large = [], ["/lm_head/MatMul"]
    for i in range(cfg.layers):
        small += [f"/model/layers.{i}/attn/{p}_proj/MatMul" for p in "qkvo"]
        small += [f"/model/layers.{i}/mlp/{p}_proj/MatMul" for p in ("gate", "up")]
        large.append(f"/model/layers.{i}/mlp/down_proj/MatMul")
    return small, large


def float_decoder(cfg, seed=0):
    """The float32 model, graph as onnxruntime-genai's model builder lays it out; the embedding
    table is the lm_head's transpose (tied weights, as in Llama 3.2 1B or Qwen2.5)."""
    rng = np.random.default_rng(seed)
    H, hd, kvh = cfg.hidden, cfg.head_size, cfg.kv_heads
    inits = {}

    def w(name, k, n):
        inits[name] = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        return name

    def norm(name):
        inits[name] = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
        return name

    lm_head = (rng.standard_normal((H, cfg.vocab)) / np.sqrt(H)).astype(np.float32)
    inits["lm_head.weight"] = lm_head
    inits["model.embed_tokens.weight"] = np.ascontiguousarray(lm_head.T)
    inv_freq = 1.0 / cfg.theta ** (np.arange(0, hd, 2) / hd)
    ang = np.outer(np.arange(cfg.max_pos), inv_freq)
    inits["cos_cache"] = np.cos(ang).astype(np.float32)
    inits["sin_cache"] = np.sin(ang).astype(np.float32)
    inits["one64"] = np.array(1, np.int64)
    inits["axes1"] = np.array([1], np.int64)

    mm = lambda name, x, wname, y: helper.make_node("MatMul", [x, wname], [y], name=name)  # noqa: E731
    nodes = [
        # attention_mask -> seqlens_k (tokens - 1 per entry), total_sequence_length (its width)
        helper.make_node("ReduceSum", ["attention_mask", "axes1"], ["/model/attn_mask_reformat/sum"], keepdims=0),
        helper.make_node("Sub", ["/model/attn_mask_reformat/sum", "one64"], ["/model/attn_mask_reformat/sub"]),
        helper.make_node("Cast", ["/model/attn_mask_reformat/sub"], ["seqlens_k"], to=TP.INT32),
        helper.make_node("Shape", ["attention_mask"], ["/model/attn_mask_reformat/shape"]),
        helper.make_node(
            "Gather", ["/model/attn_mask_reformat/shape", "one64"], ["/model/attn_mask_reformat/total64"], axis=0
        ),
        helper.make_node("Cast", ["/model/attn_mask_reformat/total64"], ["total_seq_len"], to=TP.INT32),
        helper.make_node(
            "Gather", ["model.embed_tokens.weight", "input_ids"], ["embeds"], name="/model/embed_tokens/Gather"
        ),
    ]
    x, residual = "embeds", None
    for i in range(cfg.layers):
        p = f"/model/layers.{i}"
        ln1 = norm(f"model.layers.{i}.input_layernorm.weight")
        if residual is None:
            nodes.append(
                helper.make_node(
                    "SimplifiedLayerNormalization", [x, ln1], [f"{p}/ln1"], epsilon=cfg.eps, axis=-1, stash_type=1
                )
            )
            residual = x
        else:
            nodes.append(
                helper.make_node(
                    "SkipSimplifiedLayerNormalization",
                    [x, residual, ln1],
                    [f"{p}/ln1", "", "", f"{p}/res1"],
                    domain=MS,
                    epsilon=cfg.eps,
                )
            )
            residual = f"{p}/res1"
        for n, width in (("q", cfg.heads * hd), ("k", kvh * hd), ("v", kvh * hd)):
            nodes.append(
                mm(
                    f"{p}/attn/{n}_proj/MatMul",
                    f"{p}/ln1",
                    w(f"model.layers.{i}.attn.{n}_proj.weight", H, width),
                    f"{p}/{n}",
                )
            )
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [
                    f"{p}/q",
                    f"{p}/k",
                    f"{p}/v",
                    f"past_key_values.{i}.key",
                    f"past_key_values.{i}.value",
                    "seqlens_k",
                    "total_seq_len",
                    "cos_cache",
                    "sin_cache",
                ],
                [f"{p}/attn", f"present.{i}.key", f"present.{i}.value"],
                domain=MS,
                name=f"{p}/attn/GroupQueryAttention",
                num_heads=cfg.heads,
                kv_num_heads=kvh,
                do_rotary=1,
                rotary_interleaved=0,
                local_window_size=-1,
                scale=float(hd**-0.5),
            )
        )
        nodes.append(
            mm(
                f"{p}/attn/o_proj/MatMul",
                f"{p}/attn",
                w(f"model.layers.{i}.attn.o_proj.weight", cfg.heads * hd, H),
                f"{p}/o",
            )
        )
        ln2 = norm(f"model.layers.{i}.post_attention_layernorm.weight")
        nodes.append(
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                [f"{p}/o", residual, ln2],
                [f"{p}/ln2", "", "", f"{p}/res2"],
                domain=MS,
                epsilon=cfg.eps,
            )
        )
        residual = f"{p}/res2"
        nodes += [
            mm(
                f"{p}/mlp/gate_proj/MatMul",
                f"{p}/ln2",
                w(f"model.layers.{i}.mlp.gate_proj.weight", H, cfg.inter),
                f"{p}/gate",
            ),
            mm(
                f"{p}/mlp/up_proj/MatMul",
                f"{p}/ln2",
                w(f"model.layers.{i}.mlp.up_proj.weight", H, cfg.inter),
                f"{p}/up",
            ),
            helper.make_node("Sigmoid", [f"{p}/gate"], [f"{p}/gate_sig"]),
            helper.make_node("Mul", [f"{p}/gate", f"{p}/gate_sig"], [f"{p}/silu"]),
            helper.make_node("Mul", [f"{p}/silu", f"{p}/up"], [f"{p}/act"]),
            mm(
                f"{p}/mlp/down_proj/MatMul",
                f"{p}/act",
                w(f"model.layers.{i}.mlp.down_proj.weight", cfg.inter, H),
                f"{p}/down",
            ),
        ]
        x = f"{p}/down"
    nodes.append(
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            [x, residual, norm("model.norm.weight")],
            ["/model/norm"],
            domain=MS,
            epsilon=cfg.eps,
        )
    )
    nodes.append(mm("/lm_head/MatMul", "/model/norm", "lm_head.weight", "logits"))

    vi = helper.make_tensor_value_info
    ins = [
        vi("input_ids", TP.INT64, ["batch_size", "sequence_length"]),
        vi("attention_mask", TP.INT64, ["batch_size", "total_sequence_length"]),
    ]
    outs = [vi("logits", TP.FLOAT, ["batch_size", "sequence_length", cfg.vocab])]
    for i in range(cfg.layers):
        for kv in ("key", "value"):
            ins.append(vi(f"past_key_values.{i}.{kv}", TP.FLOAT, ["batch_size", kvh, "past_sequence_length", hd]))
            outs.append(vi(f"present.{i}.{kv}", TP.FLOAT, ["batch_size", kvh, "total_sequence_length", hd]))
    g = helper.make_graph(nodes, "llama", ins, outs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)], ir_version=9)


def quantize_decoder(model, cfg, embedding="gather", accuracy_level=4):
    """The int4 model: MatMulNBitsQuantizer in two passes (symmetric blocks of 32, then the rest
    asymmetric in blocks of 128), with accuracy_level=4 as genai sets it for CPU (onnxruntime
    then quantizes A to int8: compare with `without_accuracy_level(model)`); embedding "gather" keeps the float
    table, "tied" replaces it with genai's shared int4 embeddings (GatherBlockQuantized over the
    lm_head's packed bytes, scales and zero points, which needs hidden % 128 == 0)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    m = onnx.ModelProto()
    m.CopyFrom(model)  # the quantizer rewrites the model it is given
    small, large = _proj_names(cfg)
    for bs, sym, exclude in ((32, True, large), (128, False, small)):
        q = MatMulNBitsQuantizer(
            m, bits=4, block_size=bs, is_symmetric=sym, nodes_to_exclude=exclude, accuracy_level=accuracy_level
        )
        q.process()
        m = q.model.model
    kinds = {n.name: n for n in m.graph.node if n.op_type == "MatMulNBits"}
    assert len(kinds) == len(small) + len(large), sorted(n.op_type for n in m.graph.node)
    if embedding == "tied":
        assert cfg.hidden % 128 == 0
        lm = next(n for n in m.graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits")
        init = {t.name: t for t in m.graph.initializer}
        data = numpy_helper.to_array(init[lm.input[1]]).reshape(cfg.vocab, cfg.hidden // 2)
        scales = numpy_helper.to_array(init[lm.input[2]]).reshape(cfg.vocab, -1)
        zp = numpy_helper.to_array(init[lm.input[3]]).reshape(cfg.vocab, -1)
        m.graph.initializer.extend(
            [
                numpy_helper.from_array(data, "embed_q4"),
                numpy_helper.from_array(scales, "embed_scales"),
                numpy_helper.from_array(zp, "embed_zp"),
            ]
        )
        gi = next(i for i, n in enumerate(m.graph.node) if n.name == "/model/embed_tokens/Gather")
        node = helper.make_node(
            "GatherBlockQuantized",
            ["embed_q4", "input_ids", "embed_scales", "embed_zp"],
            ["embeds"],
            domain=MS,
            name="/model/embed_tokens/GatherBlockQuantized",
            gather_axis=0,
            quantize_axis=1,
            block_size=128,
            bits=4,
        )
        m.graph.node[gi].CopyFrom(node)
        keep = [t for t in m.graph.initializer if t.name != "model.embed_tokens.weight"]
        del m.graph.initializer[:]
        m.graph.initializer.extend(keep)
    return m


def _rel(got, want):
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


class Decoder:
    """Runs one model through both runtimes, step by step, each feeding its own present back
    as past: ours as MLTensors (location "ml-tensor": the cache never leaves the GPU) or as
    numpy arrays ("cpu")."""

    def __init__(self, ctx, model, cfg, location="ml-tensor", **session_args):
        self.ctx, self.cfg, self.location = ctx, cfg, location
        self.ref = ort.InferenceSession(
            without_accuracy_level(model).SerializeToString(), providers=["CPUExecutionProvider"]
        )
        self.sess = InferenceSession(model, ctx, **session_args)

    def close(self):
        self.sess.close()

    def start(self, ids):
        empty = np.zeros((1, self.cfg.kv_heads, 0, self.cfg.head_size), np.float32)
        self.past = {"ours": [empty] * (2 * self.cfg.layers), "ref": [empty] * (2 * self.cfg.layers)}
        self.n = 0
        return self.step(ids)

    def step(self, ids):
        """Runs ids (1-D) after the cache: (our logits, onnxruntime's), both [1, len(ids), V]."""
        ids = np.asarray(ids, np.int64)[None]
        self.n += ids.shape[1]
        base = {"input_ids": ids, "attention_mask": np.ones((1, self.n), np.int64)}
        logits = {}
        for who in ("ours", "ref"):
            feeds = dict(base)
            for i in range(self.cfg.layers):
                feeds[f"past_key_values.{i}.key"] = self.past[who][2 * i]
                feeds[f"past_key_values.{i}.value"] = self.past[who][2 * i + 1]
            if who == "ours":
                out = self.sess.run(None, feeds, output_location=self.location)
                gpu = self.location == "ml-tensor"
                logits[who] = self.ctx.read_tensor_sync(out[0]) if gpu else out[0]
            else:
                out = self.ref.run(None, feeds)
                logits[who] = out[0]
            self.past[who] = out[1:]
        return logits["ours"], logits["ref"]


def _check(ours, ref, what):
    assert ours.shape == ref.shape, what
    assert ours.dtype == ref.dtype, what
    err = _rel(ours, ref)
    assert err <= TOL, f"{what}: logits differ by {err:.2e} of their scale"
    # greedy choice at the last position: the same token
    tok = int(np.argmax(ref[0, -1]))
    assert int(np.argmax(ours[0, -1])) == tok, f"{what}: greedy token {np.argmax(ours[0, -1])} != {tok}"
    return tok


def _generate(dec, rng, prompt, steps, what):
    """A prompt then `steps` greedy steps, compared at each; returns the builds each took."""
    tok = _check(*dec.start(rng.integers(0, dec.cfg.vocab, prompt)), f"{what} prompt")
    builds = [dec.sess.stats["builds"]]
    for s in range(steps):
        tok = _check(*dec.step([tok]), f"{what} step {s}")
        builds.append(dec.sess.stats["builds"])
    return builds


@pytest.fixture(scope="module")
def small_models():
    cfg = Config()
    f32 = float_decoder(cfg, seed=_seed("decoder", cfg))
    return cfg, f32, {e: quantize_decoder(f32, cfg, e) for e in ("gather", "tied")}


@pytest.mark.parametrize("embedding", ["gather", "tied"])
def test_int4_decoder_greedy(ctx, small_models, embedding):
    """A 7-token prompt then 4 greedy steps, then a 4-token prompt (a new conversation) and 2
    steps, in one session: logits and greedy tokens against onnxruntime at every step, and
    the decode steps served without a build per step."""
    cfg, _, models = small_models
    m = models[embedding]
    ops = {n.op_type for n in m.graph.node}
    assert {
        "MatMulNBits",
        "GroupQueryAttention",
        "SkipSimplifiedLayerNormalization",
        "SimplifiedLayerNormalization",
    } <= ops and "MatMul" not in ops
    assert ("GatherBlockQuantized" in ops) == (embedding == "tied")
    levels = [
        a.i for n in m.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"
    ]
    assert levels == [4] * (7 * cfg.layers + 1), levels
    rng = np.random.default_rng(_seed("tokens", embedding))
    dec = Decoder(ctx, m, cfg)
    try:
        first = _generate(dec, rng, 7, 4, "prompt 7")
        second = _generate(dec, rng, 4, 2, "prompt 4")
        stats = dec.sess.stats
    finally:
        dec.close()
    assert stats["dynamic"], stats["static_reason"]
    # the prompt's build (empty past), then one serving every decode step: later steps and the
    # second prompt (a new length) build nothing
    assert first[-1] == first[1] and second[-1] == first[-1], (first, second)
    assert stats["builds"] <= 3, stats


def test_int4_decoder_long_decode(ctx, small_models):
    """60 greedy steps after a 9-token prompt (69 positions, into the rotary caches' second
    quarter), with the cache dimensions' maxima given: one build serves every step."""
    cfg, _, models = small_models
    rng = np.random.default_rng(_seed("long"))
    dec = Decoder(ctx, models["tied"], cfg, max_dimensions={"past_sequence_length": 128, "total_sequence_length": 128})
    try:
        builds = _generate(dec, rng, 9, 60, "long")
    finally:
        dec.close()
    assert builds[-1] == builds[1], builds


def test_int4_decoder_outgrows_capacity_host_feeds(ctx, small_models):
    """Without maxima the session's capacities start at 64 and double when outgrown (a rebuild
    that compiles nothing new): a loop feeding numpy caches crosses 64 positions and goes on."""
    cfg, _, models = small_models
    rng = np.random.default_rng(_seed("grow"))
    dec = Decoder(ctx, models["gather"], cfg, location="cpu")
    try:
        builds = _generate(dec, rng, 60, 8, "grow")
        cap = dec.sess.dynamic_dimensions
    finally:
        dec.close()
    assert cap["past_sequence_length"] >= 67, cap
    # total_sequence_length outgrows 64 one step before past_sequence_length does: a rebuild
    # each, then none
    assert builds[-1] <= builds[1] + 2 and builds[-1] == builds[-3], builds


def test_int4_decoder_outgrows_capacity_gpu_feeds(ctx, small_models):
    """As above with the caches fed back as MLTensors (the decode loop of examples/generate.py)."""
    cfg, _, models = small_models
    rng = np.random.default_rng(_seed("grow"))
    dec = Decoder(ctx, models["gather"], cfg)
    try:
        builds = _generate(dec, rng, 60, 8, "grow")
    finally:
        dec.close()
    assert builds[-1] <= builds[1] + 2 and builds[-1] == builds[-3], builds


def test_float_decoder_matches(ctx, small_models):
    """The float model the int4 one was quantized from (the benchmark's reference) through the
    same loop: plain MatMul projections with the same graph around them."""
    cfg, f32, _ = small_models
    rng = np.random.default_rng(_seed("float"))
    dec = Decoder(ctx, f32, cfg)
    try:
        builds = _generate(dec, rng, 5, 2, "float")
    finally:
        dec.close()
    assert builds[-1] == builds[1], builds
