"""What a GGUF architecture's decoder is made of: `Arch`, the description each architecture's
file fills in (mltensor/llm/arch/<name>.py), and the hyperparameters every one reads.

The decoder itself is written once (mltensor/llm/model.py): per layer

    n = norm(h); q, k, v = projections(n) [+ biases]; [q, k = norm each head (QK-norm)]
    q, k = rope(q), rope(k)   (the layer's base and scale; "norm" rotates adjacent pairs, "neox"
                               the two halves of the rotated channels, as llama.cpp's rope types)
    a = attention(q, k, v)    (scale, [soft-cap], causal, [sliding window])
    h += [norm](Wo a);  h += [norm](W_down (act(W_gate n2) * W_up n2)) with n2 = norm(h)

then norm(h) times the output head, [soft-capped]. An architecture chooses among these parts
with the class attributes below and reads its own metadata keys in `configure`.
"""

import math

from ...errors import NotSupportedError


class Arch:
    """One GGUF `general.architecture`: the parts of the shared decoder it uses."""

    name = None
    rope = "norm"  # llama.cpp's LLAMA_ROPE_TYPE_NORM (adjacent pairs) or "neox" (halves)
    fused_qkv = False  # blk.N.attn_qkv: the q, k and v rows in one matrix (phi3)
    fused_gate_up = False  # blk.N.ffn_up: the gate rows, then the up rows (phi3)
    activation = "silu"  # the gate's: "silu" (SwiGLU) or "gelu" (GeGLU, tanh approximation)
    post_norms = False  # blk.N.post_attention_norm / post_ffw_norm after attention and FFN (gemma)
    qk_norm = False  # blk.N.attn_q_norm / attn_k_norm: RMSNorm of each head before rope
    qkv_bias = False  # blk.N.attn_q/k/v.bias required (they are read wherever a file has them)
    embed_scale = False  # embeddings times sqrt(hidden) (gemma)
    swa_pattern = 0  # layer i is sliding-window when i % n < n - 1 (llama.cpp's set_swa_pattern)
    big_layers = None  # block count of the model whose attention scale is sqrt(hidden / heads)

    def configure(self, c, num):
        """Read the architecture's own keys into config `c` (num(key, default, kind) reads
        `<arch>.<key>`). The default: no soft-capping, no sliding window."""

    def sliding(self, c, i):
        """Layer i attends within c.window keys."""
        n = self.swa_pattern
        return bool(c.window) and n > 0 and i % n < n - 1

    def layer_rope(self, c, i):
        """(base, position scale) of layer i's rotary embedding."""
        return c.rope_base, c.rope_scale

    def attn_scale(self, c):
        if self.big_layers is not None and c.n_layers == self.big_layers:
            return 1.0 / math.sqrt(c.hidden / c.n_heads)  # (llama.cpp: Gemma's 27B models)
        return 1.0 / math.sqrt(c.head_dim)


def read_rope_scaling(c, f, arch):
    """c.rope_scale: the linear position scale (1 / rope.scaling.factor) or 1.0; other scalings
    (YaRN, LongRoPE) are refused. Llama 3's scaling is a tensor, rope_freqs.weight (llama.cpp's
    converter writes its frequency factors there), read by the model."""
    scaling = f.get(f"{arch}.rope.scaling.type")
    c.rope_scale = 1.0
    if scaling in (None, "none"):
        return
    if scaling == "linear":
        factor = float(f.get(f"{arch}.rope.scaling.factor", 1.0))
        if not factor > 0:
            raise NotSupportedError(f"[gguf] rope.scaling.factor {factor} must be positive")
        c.rope_scale = 1.0 / factor
        return
    raise NotSupportedError(
        f"[gguf] rope scaling {scaling!r} is not supported (supported: none, linear; Llama 3's is rope_freqs.weight)"
    )
