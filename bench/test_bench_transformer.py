"""Issue 28, transformers: BERT-base, ViT-B/16 and a Llama-style decoder, built here as ONNX with
seeded random weights in the graph shapes real exports have, run through InferenceSession.

Per model (and, for the decoder, per phase: a prompt of 128 tokens on an empty cache, then one
decode step after a past of 128):
- launches one run makes, fused and with MLTENSOR_NO_FUSION=1 (one kernel per node), and per
  layer: (launches of the L-layer model - launches of the same model one layer shallower), each
  count from a build made in this run. A graph with dynamic dimensions (the exports' symbolic
  batch and sequence) records every size variant of some kernels (a matmul's GEMV and tiled
  paths, attention's decode and prompt kernels) and gives those not chosen for the run's sizes
  no workgroups: `launches` counts the non-empty ones (from the graph's launch plan at the run's
  sizes), `dispatches` all of them (len(graph.kernel_names), what ctx.counters["kernel_launches"]
  grows by per run);
- time of one run, GPU tensors in and out (the wait reads the first output), the fused session
  against the same model built with MLTENSOR_NO_FUSION=1, alternated round by round
  (timing.measure_pair; the ratio recorded is the median of the per-round ratios unfused /
  fused, as a host shared with other work moves the two medians apart); then the fused session
  against onnxruntime CPU (numpy in and out) and against torch eager on CPU
  (F.scaled_dot_product_attention, the same weights), each alternated the same way (vs_*: the
  median per-round peer time / our time, > 1: we are faster). Every session's result, and
  torch's, is checked against onnxruntime before timing (no timed assertions).
- the intermediate bytes (graph.memory["intermediates"]) of one attention at S=2048, 12 heads of
  64, float32, fused vs unfused, built, not run: the target is O(S*d), no S x S buffer (and
  S=1024 beside it). The builder refuses any operand over max_tensor_byte_length, even one fusion
  never writes, and on lavapipe (128 MiB) the [12, 2048, 2048] scores are over it: there the heads
  come as two groups of 6 in one graph (`head_groups`).

The models (weights 1/sqrt(fan-in), so attention is not uniform and the check means something):
- BERT-base as transformers' BertModel exports: input_ids / attention_mask / token_type_ids
  [batch, sequence]; word + token type + position embeddings, LayerNorm; the extended padding
  mask (1 - mask) * finfo.min added to the scores; per layer Q/K/V MatMul + Add, heads split by
  Reshape (shape from Shape) + Transpose (K to [b, h, d, s]), Div by sqrt(d), Softmax, the
  output dense + residual + LayerNorm, the erf GELU FFN + residual + LayerNorm; the tanh pooler.
  Hidden 768, 12 heads, FFN 3072, vocabulary 30522, sequence 128 with the last 16 positions
  padding.
- ViT-B/16: mltensor.models_synthetic.vit (transformers' ViTModel export shape), 224x224.
- A Llama-style decoder as transformers' LlamaForCausalLM exports through optimum: input_ids,
  attention_mask, position_ids, past_key_values.{i}.key/value in; logits and present.{i}.* out.
  RMSNorm as Pow / ReduceMean / Add / Sqrt / Reciprocal / Mul, rotary embeddings computed from
  position_ids (Cos/Sin of position x inv_freq, rotate_half by Slice / Neg / Concat), grouped
  K/V heads repeated by Unsqueeze / Expand / Reshape (repeat_kv), the causal and padding mask as
  Where(keep, 0, finfo.min) added to the scaled scores, SwiGLU MLP (x * Sigmoid(x) * up).
  Hidden 1024, 16 heads / 4 KV heads, MLP 2816, vocabulary 8192 (MLTENSOR_BENCH_LLAMA_HIDDEN=2048
  gives Llama 3.2 1B's layer: 32 / 8 heads, MLP 8192).

Lavapipe (2 CPU cores) takes about half a second per ViT-B/16 layer, so every model has 2 layers
by default (the whole file then runs in about 3.5 minutes there) and the per-layer figures are the
ones to read; times are of the whole 2-layer model. MLTENSOR_BENCH_TRANSFORMER_LAYERS sets all
three (12 is the real BERT-base / ViT-B/16 depth), MLTENSOR_BENCH_BERT_LAYERS,
MLTENSOR_BENCH_VIT_LAYERS (also read by test_bench_memory.py) and MLTENSOR_BENCH_LLAMA_LAYERS one
each; MLTENSOR_BENCH_LLAMA_HIDDEN (1024 or 2048) and MLTENSOR_BENCH_LLAMA_VOCAB the decoder's
size; MLTENSOR_BENCH_TRANSFORMER_ROUNDS the timed rounds of each pair (default 5).
"""

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import mltensor
from mltensor import InferenceSession
from mltensor.models_synthetic import vit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from helpers import fusion as _fusion  # noqa: E402
from helpers import launches_run  # noqa: E402

from .timing import adapter_name, measure_pair, record

ort = pytest.importorskip("onnxruntime")
try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover
    torch = None


def _env_int(name, default):
    if name.endswith("_LAYERS"):  # the model's own setting, else the shared one
        default = os.environ.get("MLTENSOR_BENCH_TRANSFORMER_LAYERS", default)
    return int(os.environ.get(name, default))


BERT_LAYERS = _env_int("MLTENSOR_BENCH_BERT_LAYERS", 2)
VIT_LAYERS = _env_int("MLTENSOR_BENCH_VIT_LAYERS", 2)
LLAMA_LAYERS = _env_int("MLTENSOR_BENCH_LLAMA_LAYERS", 2)
LLAMA_HIDDEN = _env_int("MLTENSOR_BENCH_LLAMA_HIDDEN", 1024)
LLAMA_VOCAB = _env_int("MLTENSOR_BENCH_LLAMA_VOCAB", 8192)
ROUNDS = _env_int("MLTENSOR_BENCH_TRANSFORMER_ROUNDS", 5)
SEQ = 128  # BERT's sequence, the decoder's prompt
PAD = 16  # BERT: the last PAD positions are padding
PAST = 128  # the decoder's past before the timed decode step
TOL = 2e-3  # max abs error relative to the largest reference value
GROUP = "transformer: one run, fused vs MLTENSOR_NO_FUSION=1 (onnxruntime CPU, torch eager as peers)"
MIN32 = np.finfo(np.float32).min


def _rel(got, want):
    want = np.asarray(want, np.float64)
    return float(np.abs(np.asarray(got, np.float64) - want).max() / max(np.abs(want).max(), 1e-30))


class _Graph:
    """The onnx.helper shorthand of the builders: w() a seeded weight (kept in .weights for
    torch), c() a constant, n() a node named by its position."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.inits, self.nodes, self.weights = [], [], {}

    def w(self, name, *shape, scale=None, value=None):
        if value is None:
            value = self.rng.standard_normal(shape, dtype=np.float32)
            value *= np.float32(1 / np.sqrt(shape[0]) if scale is None else scale)
        value = np.asarray(value, np.float32)
        self.weights[name] = value
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def norm_w(self, name, n, bias=0.05):
        return self.w(name, value=1 + 0.1 * self.rng.standard_normal(n)), (
            self.w(name + "_bias", value=bias * self.rng.standard_normal(n)) if bias else None
        )

    def c(self, name, value, dtype=np.int64):
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def n(self, op, ins, out=None, **attrs):
        outs = [out or f"{op}_{len(self.nodes)}"]
        self.nodes.append(helper.make_node(op, ins, outs, name=f"{op}_{len(self.nodes)}", **attrs))
        return outs[0]

    def model(self, name, inputs, outputs, opset=17):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], producer_name="mltensor-bench")
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m.SerializeToString()


# -- BERT-base ---------------------------------------------------------------------------------


def bert(*, layers, hidden=768, heads=12, inter=3072, vocab=30522, max_pos=512, seed=0):
    """(ONNX bytes, weights) of the BertModel export described above."""
    G = _Graph(seed)
    w, c, n = G.w, G.c, G.n
    E, H, D = hidden, heads, hidden // heads
    c("ax0", [0]), c("ax1", [1]), c("ax2", [2]), c("ax12", [1, 2]), c("zero", 0)
    c("heads_dims", [H, D]), c("embed_dim", [E])
    c("sqrt_d", np.float32(np.sqrt(D)), np.float32), c("sqrt2", np.float32(np.sqrt(2)), np.float32)
    c("onef", np.float32(1), np.float32), c("half", np.float32(0.5), np.float32), c("minf", MIN32, np.float32)
    c("position_ids", np.arange(max_pos)[None])

    def ln(x, name):
        g, b = G.norm_w(name, E)
        return n("LayerNormalization", [x, g, b], axis=-1, epsilon=1e-12)

    def dense(x, name, k, m):
        return n(
            "Add",
            [n("MatMul", [x, w(name + ".weight", k, m)]), w(name + ".bias", value=G.rng.standard_normal(m) * 0.05)],
        )

    seq_1d = n("Slice", [n("Shape", ["input_ids"]), "ax1", "ax2"])
    pos = n("Slice", ["position_ids", "ax0", seq_1d, "ax1"])  # [1, sequence]
    x = n(
        "Add",
        [
            n(
                "Add",
                [
                    n("Gather", [w("word_embeddings", vocab, E, scale=0.5), "input_ids"]),
                    n("Gather", [w("token_type_embeddings", 2, E, scale=0.5), "token_type_ids"]),
                ],
            ),
            n("Gather", [w("position_embeddings", max_pos, E, scale=0.5), pos]),
        ],
    )
    x = ln(x, "embeddings.LayerNorm")
    ext = n("Unsqueeze", ["attention_mask", "ax12"])  # [batch, 1, 1, sequence]
    ext = n("Mul", [n("Sub", ["onef", n("Cast", [ext], to=TP.FLOAT)]), "minf"])
    bs = n("Slice", [n("Shape", ["input_ids"]), "ax0", "ax2"])
    split = n("Concat", [bs, "heads_dims"], axis=0)
    merge = n("Concat", [bs, "embed_dim"], axis=0)
    for i in range(layers):
        p = f"encoder.layer.{i}."
        q = n("Transpose", [n("Reshape", [dense(x, p + "query", E, E), split])], perm=[0, 2, 1, 3])
        kt = n("Transpose", [n("Reshape", [dense(x, p + "key", E, E), split])], perm=[0, 2, 3, 1])
        v = n("Transpose", [n("Reshape", [dense(x, p + "value", E, E), split])], perm=[0, 2, 1, 3])
        s = n("Add", [n("Div", [n("MatMul", [q, kt]), "sqrt_d"]), ext])
        a = n("MatMul", [n("Softmax", [s], axis=-1), v])
        a = n("Reshape", [n("Transpose", [a], perm=[0, 2, 1, 3]), merge])
        x = ln(n("Add", [dense(a, p + "attention.output", E, E), x]), p + "attention.LayerNorm")
        f = dense(x, p + "intermediate", E, inter)
        g = n("Mul", [n("Mul", [f, n("Add", [n("Erf", [n("Div", [f, "sqrt2"])]), "onef"])]), "half"])
        x = ln(n("Add", [dense(g, p + "output", inter, E), x]), p + "output.LayerNorm")
    n("Identity", [x], "last_hidden_state")
    first = n("Gather", [x, "zero"], axis=1)
    n("Tanh", [dense(first, "pooler", E, E)], "pooler_output")
    ins = [
        helper.make_tensor_value_info(k, TP.INT64, ["batch_size", "sequence_length"])
        for k in ("input_ids", "attention_mask", "token_type_ids")
    ]
    outs = [
        helper.make_tensor_value_info("last_hidden_state", TP.FLOAT, ["batch_size", "sequence_length", E]),
        helper.make_tensor_value_info("pooler_output", TP.FLOAT, ["batch_size", E]),
    ]
    return G.model("bert", ins, outs), G.weights


def bert_torch(W, layers, heads):
    """The same BERT in torch eager, SDPA attention."""
    T = {k: torch.from_numpy(v) for k, v in W.items()}
    E = T["word_embeddings"].shape[1]
    D = E // heads

    def ln(x, name):
        return F.layer_norm(x, (E,), T[name], T[name + "_bias"], 1e-12)

    def dense(x, name):
        return x @ T[name + ".weight"] + T[name + ".bias"]

    def run(input_ids, attention_mask, token_type_ids):
        B, S = input_ids.shape
        x = T["word_embeddings"][input_ids] + T["token_type_embeddings"][token_type_ids] + T["position_embeddings"][:S]
        x = ln(x, "embeddings.LayerNorm")
        ext = (1 - attention_mask[:, None, None, :].float()) * MIN32
        heads_of = lambda t: t.view(B, S, heads, D).transpose(1, 2)  # noqa: E731
        for i in range(layers):
            p = f"encoder.layer.{i}."
            a = F.scaled_dot_product_attention(
                heads_of(dense(x, p + "query")),
                heads_of(dense(x, p + "key")),
                heads_of(dense(x, p + "value")),
                attn_mask=ext,
            )
            x = ln(dense(a.transpose(1, 2).reshape(B, S, E), p + "attention.output") + x, p + "attention.LayerNorm")
            x = ln(dense(F.gelu(dense(x, p + "intermediate")), p + "output") + x, p + "output.LayerNorm")
        return x, torch.tanh(dense(x[:, 0], "pooler"))

    return run


# -- ViT-B/16 (mltensor.models_synthetic.vit) --------------------------------------------------


def vit_torch(model_bytes, layers, heads=12, patch=16):
    """The same ViT in torch eager, weights read from the ONNX model."""
    m = onnx.load_from_string(model_bytes)
    T = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in m.graph.initializer}
    E = T["cls"].shape[-1]
    D = E // heads

    def ln(x, p):
        return F.layer_norm(x, (E,), T[p + ".g"], T[p + ".b"], 1e-12)

    def run(pixel_values):
        B = pixel_values.shape[0]
        x = F.conv2d(pixel_values, T["patch.w"], T["patch.b"], stride=patch).flatten(2).transpose(1, 2)
        x = torch.cat([T["cls"].expand(B, 1, E), x], 1) + T["pos"]
        S = x.shape[1]
        for i in range(layers):
            p = f"layer{i}"
            q, k, v = (
                (ln(x, p + ".ln1") @ T[p + ".qkv.w"] + T[p + ".qkv.b"]).view(B, S, 3, heads, D).permute(2, 0, 3, 1, 4)
            )
            a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, E)
            x = x + a @ T[p + ".proj.w"] + T[p + ".proj.b"]
            x = x + F.gelu(ln(x, p + ".ln2") @ T[p + ".fc1.w"] + T[p + ".fc1.b"]) @ T[p + ".fc2.w"] + T[p + ".fc2.b"]
        return (F.linear(ln(x, "final")[:, 0], T["head.w"], T["head.b"]),)

    return run


# -- the Llama-style decoder -------------------------------------------------------------------


def llama_config(hidden):
    heads = hidden // 64
    return dict(
        hidden=hidden, heads=heads, kv_heads=heads // 4, inter={1024: 2816, 2048: 8192}.get(hidden, hidden * 11 // 4)
    )


def llama(*, layers, hidden, heads, kv_heads, inter, vocab, theta=10000.0, eps=1e-5, seed=0):
    """(ONNX bytes, weights) of the LlamaForCausalLM export described above (untied lm_head)."""
    G = _Graph(seed)
    w, c, n = G.w, G.c, G.n
    hd, rep = hidden // heads, heads // kv_heads
    c("ax0", [0]), c("ax1", [1]), c("ax2", [2]), c("ax4", [4]), c("ax_1", [-1]), c("ax01", [0, 1]), c("ax12", [1, 2])
    c("one", 1), c("zero", 0), c("half_lo", [0]), c("half_mid", [hd // 2]), c("half_hi", [hd]), c("axes3", [3])
    c("rep", [rep]), c("heads", [heads]), c("q_dims", [0, 0, heads, hd]), c("kv_dims", [0, 0, kv_heads, hd])
    c("merge_dims", [0, 0, heads * hd]), c("two", np.float32(2), np.float32), c("eps", np.float32(eps), np.float32)
    c("onef", np.float32(1), np.float32), c("zerof", np.float32(0), np.float32), c("minf", MIN32, np.float32)
    c("scaling", np.float32(hd**-0.5), np.float32)
    c("inv_freq", (1.0 / theta ** (np.arange(0, hd, 2) / hd)).astype(np.float32), np.float32)

    def rms(x, name):
        var = n("ReduceMean", [n("Pow", [x, "two"])], axes=[-1], keepdims=1)
        return n(
            "Mul",
            [
                w(name, value=1 + 0.1 * G.rng.standard_normal(hidden)),
                n("Mul", [x, n("Reciprocal", [n("Sqrt", [n("Add", [var, "eps"])])])]),
            ],
        )

    # rotary: cos/sin of position_ids x inv_freq, [batch, 1, sequence, head_size]
    freqs = n("Mul", [n("Unsqueeze", [n("Cast", ["position_ids"], to=TP.FLOAT), "ax_1"]), "inv_freq"])
    emb = n("Concat", [freqs, freqs], axis=-1)
    cos, sin = n("Unsqueeze", [n("Cos", [emb]), "ax1"]), n("Unsqueeze", [n("Sin", [emb]), "ax1"])
    # the mask: causal over positions past .. total, and the padding mask; additive
    total = n("Gather", [n("Shape", ["attention_mask"]), "one"], axis=0)
    seq = n("Gather", [n("Shape", ["input_ids"]), "one"], axis=0)
    qpos = n("Range", [n("Sub", [total, seq]), total, "one"])
    kpos = n("Range", ["zero", total, "one"])
    causal = n("LessOrEqual", [n("Unsqueeze", [kpos, "ax0"]), n("Unsqueeze", [qpos, "ax1"])])  # [seq, total]
    pad = n("Unsqueeze", [n("Cast", ["attention_mask"], to=TP.BOOL), "ax12"])  # [batch, 1, 1, total]
    keep = n("And", [n("Unsqueeze", [causal, "ax01"]), pad])
    mask = n("Where", [keep, "zerof", "minf"])

    def rope(t):
        x1 = n("Slice", [t, "half_lo", "half_mid", "axes3"])
        x2 = n("Slice", [t, "half_mid", "half_hi", "axes3"])
        rot = n("Concat", [n("Neg", [x2]), x1], axis=3)
        return n("Add", [n("Mul", [t, cos]), n("Mul", [rot, sin])])

    def repeat_kv(t):  # [b, kvh, T, hd] -> [b, kvh, rep, T, hd] -> [b, heads, T, hd]
        shp = n("Shape", [t])
        b_kv, t_hd = n("Slice", [shp, "ax0", "ax2"]), n("Slice", [shp, "ax2", "ax4"])
        e = n("Expand", [n("Unsqueeze", [t, "ax2"]), n("Concat", [b_kv, "rep", t_hd], axis=0)])
        return n("Reshape", [e, n("Concat", [n("Slice", [shp, "ax0", "ax1"]), "heads", t_hd], axis=0)])

    x = n("Gather", [w("model.embed_tokens.weight", vocab, hidden, scale=1.0), "input_ids"])
    ins = [
        helper.make_tensor_value_info("input_ids", TP.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TP.INT64, ["batch_size", "past_sequence_length + sequence_length"]
        ),
        helper.make_tensor_value_info("position_ids", TP.INT64, ["batch_size", "sequence_length"]),
    ]
    outs = [helper.make_tensor_value_info("logits", TP.FLOAT, ["batch_size", "sequence_length", vocab])]
    for i in range(layers):
        p = f"model.layers.{i}."
        h = rms(x, p + "input_layernorm.weight")
        q = rope(
            n(
                "Transpose",
                [n("Reshape", [n("MatMul", [h, w(p + "self_attn.q_proj", hidden, heads * hd)]), "q_dims"])],
                perm=[0, 2, 1, 3],
            )
        )
        k = rope(
            n(
                "Transpose",
                [n("Reshape", [n("MatMul", [h, w(p + "self_attn.k_proj", hidden, kv_heads * hd)]), "kv_dims"])],
                perm=[0, 2, 1, 3],
            )
        )
        v = n(
            "Transpose",
            [n("Reshape", [n("MatMul", [h, w(p + "self_attn.v_proj", hidden, kv_heads * hd)]), "kv_dims"])],
            perm=[0, 2, 1, 3],
        )
        k = n("Concat", [f"past_key_values.{i}.key", k], f"present.{i}.key", axis=2)
        v = n("Concat", [f"past_key_values.{i}.value", v], f"present.{i}.value", axis=2)
        s = n("Mul", [n("MatMul", [q, n("Transpose", [repeat_kv(k)], perm=[0, 1, 3, 2])]), "scaling"])
        a = n("MatMul", [n("Softmax", [n("Add", [s, mask])], axis=-1), repeat_kv(v)])
        a = n("Reshape", [n("Transpose", [a], perm=[0, 2, 1, 3]), "merge_dims"])
        x = n("Add", [x, n("MatMul", [a, w(p + "self_attn.o_proj", heads * hd, hidden)])])
        h = rms(x, p + "post_attention_layernorm.weight")
        gate = n("MatMul", [h, w(p + "mlp.gate_proj", hidden, inter)])
        up = n("MatMul", [h, w(p + "mlp.up_proj", hidden, inter)])
        act = n("Mul", [n("Mul", [gate, n("Sigmoid", [gate])]), up])
        x = n("Add", [x, n("MatMul", [act, w(p + "mlp.down_proj", inter, hidden)])])
        for kv in ("key", "value"):
            ins.append(
                helper.make_tensor_value_info(
                    f"past_key_values.{i}.{kv}", TP.FLOAT, ["batch_size", kv_heads, "past_sequence_length", hd]
                )
            )
            outs.append(
                helper.make_tensor_value_info(
                    f"present.{i}.{kv}",
                    TP.FLOAT,
                    ["batch_size", kv_heads, "past_sequence_length + sequence_length", hd],
                )
            )
    n("MatMul", [rms(x, "model.norm.weight"), w("lm_head", hidden, vocab)], "logits")
    return G.model("llama", ins, outs), G.weights


def llama_torch(W, layers, hidden, heads, kv_heads, theta=10000.0, eps=1e-5, **_):
    """The same decoder in torch eager: SDPA with enable_gqa (K/V heads not copied)."""
    T = {k: torch.from_numpy(v) for k, v in W.items()}
    hd = hidden // heads
    inv_freq = torch.from_numpy((1.0 / theta ** (np.arange(0, hd, 2) / hd)).astype(np.float32))

    def rms(x, name):
        return T[name] * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(t, cos, sin):
        x1, x2 = t[..., : hd // 2], t[..., hd // 2 :]
        return t * cos + torch.cat([-x2, x1], -1) * sin

    def run(input_ids, attention_mask, position_ids, *past):
        B, S = input_ids.shape
        total = attention_mask.shape[1]
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        keep = (torch.arange(total)[None, :] <= torch.arange(total - S, total)[:, None])[
            None, None
        ] & attention_mask.bool()[:, None, None, :]
        x = T["model.embed_tokens.weight"][input_ids]
        presents = []
        for i in range(layers):
            p = f"model.layers.{i}."
            h = rms(x, p + "input_layernorm.weight")
            q = rope((h @ T[p + "self_attn.q_proj"]).view(B, S, heads, hd).transpose(1, 2), cos, sin)
            k = rope((h @ T[p + "self_attn.k_proj"]).view(B, S, kv_heads, hd).transpose(1, 2), cos, sin)
            v = (h @ T[p + "self_attn.v_proj"]).view(B, S, kv_heads, hd).transpose(1, 2)
            k, v = torch.cat([past[2 * i], k], 2), torch.cat([past[2 * i + 1], v], 2)
            presents += [k, v]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(B, S, heads * hd) @ T[p + "self_attn.o_proj"]
            h = rms(x, p + "post_attention_layernorm.weight")
            x = x + (F.silu(h @ T[p + "mlp.gate_proj"]) * (h @ T[p + "mlp.up_proj"])) @ T[p + "mlp.down_proj"]
        return (rms(x, "model.norm.weight") @ T["lm_head"], *presents)

    return run


# -- the harness -------------------------------------------------------------------------------


def _counts(graph, feeds):
    """(launches, dispatches) of one run: a graph with dynamic dimensions records every size
    variant of a kernel (a matmul's GEMV and tile paths, attention's decode and prompt kernels),
    those not chosen for these sizes with no workgroups; launches counts the others."""
    return launches_run(graph, feeds), len(graph.kernel_names)


class _Model:
    """One model: its session built with fusion and one built with MLTENSOR_NO_FUSION=1 (one
    context: the weights are uploaded once, shared by content), onnxruntime CPU, and torch."""

    def __init__(self, ctx, model_bytes, torch_fn=None):
        self.ctx = ctx
        self.sess = {}
        for fused in (True, False):
            with _fusion(fused):
                self.sess[fused] = InferenceSession(model_bytes, ctx, cache=False)
        self.ort = ort.InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
        self.torch_fn = torch_fn if torch is not None else None
        self.tensors = []

    def phase(self, feeds):
        """Builds (under each setting) and checks the sizes of `feeds`; returns what a phase's
        test needs: kernel counts, errors against onnxruntime, and (enqueue, wait) pairs."""
        want = self.ort.run(None, feeds)
        gpu = {}
        for name, a in feeds.items():
            if a.size == 0:  # an empty cache: fed from the host (nothing to upload)
                gpu[name] = a
                continue
            t = self.ctx.create_tensor_sync(data_type=str(a.dtype), shape=a.shape, writable=True)
            self.ctx.write_tensor(t, a)
            self.tensors.append(t)
            gpu[name] = t
        ph = {"want": want, "kernels": {}, "err": {}, "steps": {}}
        for fused, s in self.sess.items():
            with _fusion(fused):  # the first run of these sizes builds
                got = s.run(None, feeds)
                s.run(None, gpu, output_location="ml-tensor")
            ph["kernels"][fused] = _counts(s.graph, feeds)
            ph["err"][fused] = max(_rel(g, r) for g, r in zip(got, want))
            ph["steps"][fused] = self._step(s, gpu)
        ph["builds"] = {f: s.stats["builds"] for f, s in self.sess.items()}
        ph["ort"] = (lambda: self.ort.run(None, feeds)), None
        if self.torch_fn is not None:
            tfeeds = [torch.from_numpy(a) for a in feeds.values()]

            def run_torch():
                with torch.inference_mode():
                    return self.torch_fn(*tfeeds)

            ph["err"]["torch"] = max(_rel(g.numpy(), r) for g, r in zip(run_torch(), want))
            ph["torch"] = run_torch, None
        return ph

    def _step(self, s, gpu):
        out = {}

        def enqueue():
            out["y"] = s.run(None, gpu, output_location="ml-tensor")[0]

        return enqueue, lambda: self.ctx.read_tensor_sync(out["y"])

    def close(self):
        for t in self.tensors:
            t.destroy()
        for s in self.sess.values():
            s.close()


def _base_layers(layers):
    """The depth of the model whose kernel count is subtracted: one layer less (the layers are
    alike; a 0-layer model would also drop what only layers use, such as the mask), 0 for 1."""
    return layers - 1 if layers > 1 else 0


def _kernels_of(ctx, model_bytes, phases):
    """{fused: [kernels per phase]} of a (shallower) model built in this run."""
    out = {}
    for fused in (True, False):
        with _fusion(fused):
            s = InferenceSession(model_bytes, ctx, cache=False)
            out[fused] = []
            for feeds in phases:
                s.run(None, feeds)
                out[fused].append(_counts(s.graph, feeds))
            s.close()
    return out


def _bench(benchmark, ctx, m, ph, base, layers, model, phase):
    """Time the phase and record it: fused against unfused alternated round by round, then the
    fused session against each peer the same way. `base`: {fused: (launches, dispatches)} of the
    model with _base_layers(layers) layers. step_ratio: the median per-round time fused / unfused;
    the recorded ratio is its inverse."""
    for f in (True, False):
        assert ph["err"][f] <= TOL, (model, phase, "fused" if f else "unfused", ph["err"][f])
    if "torch" in ph["err"]:
        assert ph["err"]["torch"] <= TOL, (model, phase, "torch", ph["err"]["torch"])
    fused, unfused, step_ratio = measure_pair(ph["steps"][True], ph["steps"][False], rounds=ROUNDS, warmup=1)
    # no build happened while timing (the switch is read at build)
    assert {f: s.stats["builds"] for f, s in m.sess.items()} == ph["builds"]
    # each peer alternated with the fused session round by round too: a shared host's load then
    # hits both alike (vs_*: the median of the per-round ratios peer time / our time)
    _, o, r = measure_pair(ph["steps"][True], ph["ort"], rounds=ROUNDS, warmup=1)
    vs_ort = 1 / r
    t = None
    if "torch" in ph:
        _, t, r = measure_pair(ph["steps"][True], ph["torch"], rounds=ROUNDS, warmup=1)
        vs_torch = 1 / r
    k = ph["kernels"]
    per = {f: [(k[f][j] - base[f][j]) / (layers - _base_layers(layers)) for j in (0, 1)] for f in (True, False)}
    per_layer = {f: per[f][0] for f in (True, False)}
    outside = {f: k[f][0] - per_layer[f] * layers for f in (True, False)}
    extra = (
        {"torch_s": t["total_s"], "vs_torch": vs_torch, "torch_err": ph["err"]["torch"]}
        if t
        else {"torch": "not installed"}
    )
    info = record(
        benchmark,
        fused,
        GROUP,
        unfused,
        "same model, MLTENSOR_NO_FUSION=1",
        adapter=adapter_name(ctx),
        model=model,
        phase=phase,
        layers=layers,
        launches_per_layer=per_layer[True],
        launches_per_layer_unfused=per_layer[False],
        launches_fused=k[True][0],
        launches_unfused=k[False][0],
        launches_outside_layers_fused=outside[True],
        launches_outside_layers_unfused=outside[False],
        dispatches_per_layer_fused=per[True][1],
        dispatches_per_layer_unfused=per[False][1],
        # the ratio column: the median of the per-round ratios unfused / fused (robust to a
        # shared host's load, which the ratio of the two medians is not: kept beside it)
        ratio=1 / step_ratio,
        ratio_of_medians=unfused["total_s"] / fused["total_s"],
        step_ratio=step_ratio,
        ort_s=o["total_s"],
        vs_onnxruntime=vs_ort,
        err_fused=ph["err"][True],
        err_unfused=ph["err"][False],
        **extra,
    )
    peers = f"onnxruntime CPU {o['total_s'] * 1e3:.1f} ms (x{vs_ort:.2f})"
    if t:
        peers += f", torch eager {t['total_s'] * 1e3:.1f} ms (x{vs_torch:.2f})"
    print(
        f"\n{model} {phase}, {layers} layers on {info['adapter']}: launches/layer {per_layer[True]:g} fused, "
        f"{per_layer[False]:g} unfused ({k[True][0]} / {k[False][0]} in all; dispatches recorded per layer "
        f"{per[True][1]:g} / {per[False][1]:g}); {fused['total_s'] * 1e3:.1f} ms fused vs "
        f"{unfused['total_s'] * 1e3:.1f} ms unfused (x{info['ratio']:.2f}); {peers}"
    )
    return info


def _bert_feeds(rng):
    ids = rng.integers(0, 30522, (1, SEQ)).astype(np.int64)
    mask = np.ones((1, SEQ), np.int64)
    mask[:, SEQ - PAD :] = 0
    tt = np.zeros((1, SEQ), np.int64)
    tt[:, SEQ // 2 :] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}


def test_bert_base(benchmark, ctx):
    model, W = bert(layers=BERT_LAYERS)
    feeds = _bert_feeds(np.random.default_rng(1))
    m = _Model(ctx, model, bert_torch(W, BERT_LAYERS, 12) if torch else None)
    try:
        ph = m.phase(feeds)
        base = _kernels_of(ctx, bert(layers=_base_layers(BERT_LAYERS))[0], [feeds])
        _bench(
            benchmark,
            ctx,
            m,
            ph,
            {f: v[0] for f, v in base.items()},
            BERT_LAYERS,
            "BERT-base",
            f"seq {SEQ} ({PAD} padding)",
        )
    finally:
        m.close()


def test_vit_b16(benchmark, ctx):
    model = vit(layers=VIT_LAYERS)
    feeds = {"pixel_values": np.random.default_rng(2).random((1, 3, 224, 224), dtype=np.float32)}
    m = _Model(ctx, model, vit_torch(model, VIT_LAYERS) if torch else None)
    try:
        ph = m.phase(feeds)
        base = _kernels_of(ctx, vit(layers=_base_layers(VIT_LAYERS)), [feeds])
        _bench(benchmark, ctx, m, ph, {f: v[0] for f, v in base.items()}, VIT_LAYERS, "ViT-B/16", "224x224")
    finally:
        m.close()


LLAMA = llama_config(LLAMA_HIDDEN)


def _llama_feeds(rng, seq, past):
    """Prompt (past None: an empty cache) or step feeds; past: the present outputs of a prompt."""
    kvh, hd = LLAMA["kv_heads"], LLAMA["hidden"] // LLAMA["heads"]
    n_past = 0 if past is None else past[0].shape[2]
    feeds = {
        "input_ids": rng.integers(0, LLAMA_VOCAB, (1, seq)).astype(np.int64),
        "attention_mask": np.ones((1, n_past + seq), np.int64),
        "position_ids": np.arange(n_past, n_past + seq, dtype=np.int64)[None],
    }
    for i in range(LLAMA_LAYERS):
        for j, kv in enumerate(("key", "value")):
            feeds[f"past_key_values.{i}.{kv}"] = (
                np.zeros((1, kvh, 0, hd), np.float32) if past is None else np.ascontiguousarray(past[2 * i + j])
            )
    return feeds


@pytest.fixture(scope="module")
def llama_model(ctx):
    model, W = llama(layers=LLAMA_LAYERS, vocab=LLAMA_VOCAB, **LLAMA)
    m = _Model(ctx, model, llama_torch(W, LLAMA_LAYERS, **LLAMA) if torch else None)
    rng = np.random.default_rng(3)
    prompt = _llama_feeds(rng, SEQ, None)
    # the decode step's past: the prompt's present outputs (onnxruntime's), PAST = SEQ long
    step = _llama_feeds(rng, 1, m.ort.run(None, prompt)[1:])
    assert step["attention_mask"].shape[1] == PAST + 1
    # per layer: the same decoder one layer shallower (its cache inputs dropped), the same sizes
    nb = _base_layers(LLAMA_LAYERS)
    base_model = llama(layers=nb, vocab=LLAMA_VOCAB, **LLAMA)[0]
    base_feeds = [
        {k: v for k, v in f.items() if not k.startswith("past_") or int(k.split(".")[1]) < nb} for f in (prompt, step)
    ]
    base = _kernels_of(ctx, base_model, base_feeds)
    yield m, prompt, step, base
    m.close()


def test_llama_prefill(benchmark, ctx, llama_model):
    m, prompt, _, base = llama_model
    _bench(
        benchmark,
        ctx,
        m,
        m.phase(prompt),
        {f: v[0] for f, v in base.items()},
        LLAMA_LAYERS,
        f"Llama-style decoder (hidden {LLAMA['hidden']}, {LLAMA['heads']}/{LLAMA['kv_heads']} heads)",
        f"prefill {SEQ} tokens",
    )


def test_llama_decode_step(benchmark, ctx, llama_model):
    m, _, step, base = llama_model
    _bench(
        benchmark,
        ctx,
        m,
        m.phase(step),
        {f: v[1] for f, v in base.items()},
        LLAMA_LAYERS,
        f"Llama-style decoder (hidden {LLAMA['hidden']}, {LLAMA['heads']}/{LLAMA['kv_heads']} heads)",
        f"decode step, past {PAST}",
    )


@pytest.mark.parametrize(
    "S,masked", [(2048, False), (2048, True), (1024, False)], ids=["S2048", "S2048_padding_mask", "S1024"]
)
def test_attention_intermediate_bytes(benchmark, ctx, S, masked):
    """graph.memory["intermediates"] of softmax(Q Kᵀ / sqrt(d) [+ mask]) V, 12 heads of 64,
    float32, built (not run) fused and with MLTENSOR_NO_FUSION=1. Target: O(S*d) fused, no
    S x S buffer. The builder refuses any operand over max_tensor_byte_length, fused away or not
    (lavapipe: 128 MiB, and the [12, 2048, 2048] scores are 192 MiB), so where the scores of all
    heads do not fit, the heads are split into the fewest equal groups whose scores fit (split
    along the head axis, one chain per group, outputs concatenated): still one graph, one output
    [1, 12, S, 64]; `head_groups` says how many."""
    H, D = 12, 64
    cap = ctx.op_support_limits()["max_tensor_byte_length"]
    groups = next(g for g in range(1, H + 1) if H % g == 0 and (H // g) * S * S * 4 <= cap)
    mem, kernels = {}, {}
    for fused in (True, False):
        with _fusion(fused):
            b = mltensor.MLGraphBuilder(ctx)
            mask = b.input("mask", data_type="float32", shape=[1, 1, 1, S]) if masked else None
            scale = b.constant(data_type="float32", value=float(D**-0.5))
            parts = [
                [b.input(f"{n}{j}", data_type="float32", shape=[1, H // groups, S, D]) for n in "qkv"]
                for j in range(groups)
            ]
            outs = []
            for qg, kg, vg in parts:
                s = b.mul(b.matmul(qg, b.transpose(kg, permutation=[0, 1, 3, 2])), scale)
                if masked:
                    s = b.add(s, mask)
                outs.append(b.matmul(b.softmax(s, 3), vg))
            g = b.build_sync({"out": b.concat(outs, 1) if groups > 1 else outs[0]})
            mem[fused], kernels[fused] = g.memory["intermediates"], list(g.kernel_names)
            g.destroy()
    sd, scores = S * D * H * 4, S * S * H * 4  # one [H, S, D] float32 tensor; the scores
    info = benchmark.extra_info
    info.update(
        group="transformer: intermediate bytes of one attention (12 heads of 64, float32, built)",
        adapter=adapter_name(ctx),
        ours_total_s=None,
        S=S,
        masked=masked,
        head_groups=groups,
        intermediate_bytes_fused=mem[True],
        intermediate_bytes_unfused=mem[False],
        fused_x_SHd=mem[True] / sd,
        unfused_x_SHd=mem[False] / sd,
        scores_bytes=scores,
        kernels_fused=len(kernels[True]),
        kernels_unfused=len(kernels[False]),
    )
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    print(
        f"\none attention S={S} ({'padding mask' if masked else 'no mask'}, {groups} head group(s)): "
        f"intermediates {mem[True]} B fused ({mem[True] / sd:.2f}x S*H*d*4 = {sd} B), {mem[False]} B unfused "
        f"({mem[False] / sd:.1f}x; all scores {scores} B); kernels {kernels[True]} vs {len(kernels[False])}"
    )
