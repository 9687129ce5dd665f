"""Test helpers for mltensor.llm: a small synthetic GGUF file written with the gguf package's
GGUFWriter, and an independent numpy Llama over the gguf package's own dequantization
(`gguf.quants.dequantize`), written from llama.cpp's definitions, not from mltensor's code."""

import numpy as np

# tensor types of the synthetic model, chosen so that every supported format is on the path
SYNTH_TYPES = {
    "attn_q": "Q4_0",
    "attn_k": "Q4_1",
    "attn_v": "Q8_0",
    "attn_output": "F16",
    "ffn_gate": "Q4_1",
    "ffn_up": "Q4_0",
    "ffn_down": "Q8_0",
}


def write_synthetic(
    path,
    *,
    layers=2,
    hidden=64,
    heads=4,
    kv_heads=2,
    ffn=96,
    vocab=256,
    seed=0,
    embd="Q8_0",
    output="Q4_1",
    tied=False,
    rope_dims=None,
    context=256,
    arch="llama",
    types=None,
    tokenizer=False,
):
    """A random Llama GGUF file of the given sizes (weights scaled so activations stay O(1))."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    types = dict(SYNTH_TYPES, **(types or {}))
    w = gguf.GGUFWriter(path, arch)
    if tokenizer:
        tokens, merges, ttypes = byte_level_vocab()
        vocab = len(tokens)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
        w.add_token_merges(merges)
        w.add_token_types(ttypes)
        w.add_bos_token_id(tokens.index("<|im_start|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_add_bos_token(False)
        w.add_chat_template(CHAT_TEMPLATE)
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(rope_dims or hidden // heads)
    w.add_vocab_size(vocab)

    def put(name, shape, kind, scale):
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        if kind == "F32":
            w.add_tensor(name, a)
        elif kind == "F16":
            w.add_tensor(name, a.astype(np.float16))
        else:
            t = getattr(gguf.GGMLQuantizationType, kind)
            try:
                data = quantize(a, t)
            except NotImplementedError:  # K-quants, IQ4: no quantizer in the gguf package
                data = random_blocks(kind, shape[0], shape[1], rng, std=scale)
            w.add_tensor(name, data, raw_dtype=t)

    hd = hidden // heads
    put("token_embd.weight", (vocab, hidden), embd, 1.0)
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        w.add_tensor(p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
        put(p + "attn_q.weight", (hidden, hidden), types["attn_q"], 1.0 / np.sqrt(hidden))
        put(p + "attn_k.weight", (kv_heads * hd, hidden), types["attn_k"], 1.0 / np.sqrt(hidden))
        put(p + "attn_v.weight", (kv_heads * hd, hidden), types["attn_v"], 1.0 / np.sqrt(hidden))
        put(p + "attn_output.weight", (hidden, hidden), types["attn_output"], 1.0 / np.sqrt(hidden))
        put(p + "ffn_gate.weight", (ffn, hidden), types["ffn_gate"], 1.0 / np.sqrt(hidden))
        put(p + "ffn_up.weight", (ffn, hidden), types["ffn_up"], 1.0 / np.sqrt(hidden))
        put(p + "ffn_down.weight", (hidden, ffn), types["ffn_down"], 1.0 / np.sqrt(ffn))
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    if not tied:
        put("output.weight", (vocab, hidden), output, 2.0 / np.sqrt(hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# byte offsets of the float16 fields of each block (scales, mins) of the types random_blocks makes
F16_FIELDS = {
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "IQ4_NL": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_XS": (0,),
}


def random_blocks(kind, rows, cols, rng, std=None):
    """The bytes [rows, row bytes] of a well-formed `kind` tensor: random quant bytes, float16
    scales (and mins) of magnitude 0.01-0.1 with both signs, one all-zero block; BF16: random
    normal values. `std`: the float16 fields rescaled so that the values' standard deviation (as
    the gguf package dequantizes them) is about `std`."""
    import gguf
    from gguf.quants import dequantize

    if kind == "F32":  # (no GGML block type: the serving step's float32 "blocks" of 32 values)
        return (rng.standard_normal(rows * cols) * (std or 1.0)).astype(np.float32).view(np.uint8).reshape(rows, -1)
    t = getattr(gguf.GGMLQuantizationType, kind)
    bv, bb = gguf.GGML_QUANT_SIZES[t]
    if kind == "F16":
        v = (rng.standard_normal(rows * cols) * (std or 1.0)).astype(np.float16)
        return v.view(np.uint8).reshape(rows, -1)
    if kind == "BF16":
        v = (rng.standard_normal(rows * cols) * (std or 1.0)).astype(np.float32)
        return (v.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    nb = rows * cols // bv
    raw = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    fields = []
    for off in F16_FIELDS[kind]:
        d = rng.uniform(0.01, 0.1, nb) * rng.choice([-1, 1], nb)
        fields.append((off, d))
        raw[:, off : off + 2] = d.astype(np.float16).view(np.uint8).reshape(nb, 2)
    if std is not None:
        k = std / dequantize(raw.reshape(rows, -1), t).std()
        for off, d in fields:
            raw[:, off : off + 2] = (d * k).astype(np.float16).view(np.uint8).reshape(nb, 2)
    raw[min(1, nb - 1)] = 0  # an all-zero block (d == 0)
    return raw.reshape(rows, -1)


# SmolLM2's template (ChatML with a default system message)
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MERGES = ["h e", "t he", "Ġ t", "Ġt he", "1 2"]


def bytes_to_unicode():
    """GPT-2's byte -> printable character map (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def byte_level_vocab():
    """(tokens, merges, token types): special tokens first (CONTROL, 3), the 256 byte symbols,
    then the merged symbols (NORMAL, 1)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    syms = [bytes_to_unicode()[b] for b in range(256)]
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = specials + syms + merged
    return tokens, list(MERGES), [3] * len(specials) + [1] * (len(syms) + len(merged))


class NumpyLlama:
    """llama.cpp's Llama (LLM_ARCH_LLAMA, rope type NORM) in float64 numpy over weights that
    the gguf package dequantizes."""

    def __init__(self, path):
        import gguf
        from gguf.quants import dequantize

        r = gguf.GGUFReader(path)
        meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.")}
        arch = meta["general.architecture"]
        self.n_layers = meta[f"{arch}.block_count"]
        self.heads = meta[f"{arch}.attention.head_count"]
        self.kv_heads = meta[f"{arch}.attention.head_count_kv"]
        self.eps = meta[f"{arch}.attention.layer_norm_rms_epsilon"]
        self.base = meta[f"{arch}.rope.freq_base"]
        self.hidden = meta[f"{arch}.embedding_length"]
        self.hd = self.hidden // self.heads
        self.rot = meta.get(f"{arch}.rope.dimension_count", self.hd)
        self.t = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float64)
            self.t[t.name] = a.reshape([int(x) for x in reversed(t.shape.tolist())])
        if "output.weight" not in self.t:
            self.t["output.weight"] = self.t["token_embd.weight"]
        self.reset()

    def reset(self):
        self.k = [np.zeros((self.kv_heads, 0, self.hd)) for _ in range(self.n_layers)]
        self.v = [np.zeros((self.kv_heads, 0, self.hd)) for _ in range(self.n_layers)]
        self.pos = 0

    def _norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def _rope(self, x, pos):
        # x [seq, heads, hd]; pairs (2i, 2i+1) of the first `rot` channels
        half = self.rot // 2
        theta = self.base ** (-2.0 * np.arange(half) / self.rot)
        ang = pos[:, None] * theta[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        y = x.copy()
        x0, x1 = x[..., 0 : self.rot : 2], x[..., 1 : self.rot : 2]
        y[..., 0 : self.rot : 2] = x0 * c - x1 * s
        y[..., 1 : self.rot : 2] = x0 * s + x1 * c
        return y

    def forward(self, ids):
        """Logits [vocab] of the last of `ids` after the cached positions; extends the cache."""
        t = self.t
        ids = np.asarray(ids)
        n = len(ids)
        pos = np.arange(self.pos, self.pos + n, dtype=np.float64)
        h = t["token_embd.weight"][ids]
        group = self.heads // self.kv_heads
        for i in range(self.n_layers):
            p = f"blk.{i}."
            x = self._norm(h, t[p + "attn_norm.weight"])
            q = self._rope((x @ t[p + "attn_q.weight"].T).reshape(n, self.heads, self.hd), pos)
            k = self._rope((x @ t[p + "attn_k.weight"].T).reshape(n, self.kv_heads, self.hd), pos)
            v = (x @ t[p + "attn_v.weight"].T).reshape(n, self.kv_heads, self.hd)
            self.k[i] = np.concatenate([self.k[i], k.transpose(1, 0, 2)], 1)
            self.v[i] = np.concatenate([self.v[i], v.transpose(1, 0, 2)], 1)
            total = self.k[i].shape[1]
            out = np.zeros((n, self.heads, self.hd))
            for hh in range(self.heads):
                kk, vv = self.k[i][hh // group], self.v[i][hh // group]
                s = q[:, hh] @ kk.T / np.sqrt(self.hd)  # [n, total]
                mask = np.arange(total)[None, :] > (self.pos + np.arange(n))[:, None]
                s[mask] = -np.inf
                s = np.exp(s - s.max(-1, keepdims=True))
                out[:, hh] = (s / s.sum(-1, keepdims=True)) @ vv
            h = h + out.reshape(n, -1) @ t[p + "attn_output.weight"].T
            x = self._norm(h, t[p + "ffn_norm.weight"])
            g = x @ t[p + "ffn_gate.weight"].T
            u = x @ t[p + "ffn_up.weight"].T
            h = h + (g / (1 + np.exp(-g)) * u) @ t[p + "ffn_down.weight"].T
        self.pos += n
        return self._norm(h[-1], t["output_norm.weight"]) @ t["output.weight"].T
