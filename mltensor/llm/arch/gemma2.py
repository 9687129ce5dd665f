"""`gemma2`: Gemma 2. NEOX rope, GeGLU (tanh GELU), the embeddings times sqrt(hidden), norms
after attention and after the FFN too (post_attention_norm, post_ffw_norm), every other layer
sliding-window (layers 0, 2, 4, ...: attention.sliding_window keys), attention logits and final
logits soft-capped (c * tanh(x / c): attn_logit_softcapping, final_logit_softcapping), head size
from attention.key_length. Hugging Face's norms multiply by (1 + w); llama.cpp's converter
already stored 1 + w, so the norms are plain RMSNorms here. Attention scale 1/sqrt(head size),
sqrt(hidden / heads) for the 46-layer 27B (as llama.cpp)."""

from .base import Arch


class Gemma2(Arch):
    name = "gemma2"
    rope = "neox"
    activation = "gelu"
    post_norms = True
    embed_scale = True
    swa_pattern = 2
    big_layers = 46

    def configure(self, c, num):
        c.window = num("attention.sliding_window", 0)
        c.attn_softcap = num("attn_logit_softcapping", 0.0, float)
        c.final_softcap = num("final_logit_softcapping", 0.0, float)


ARCH = Gemma2()
