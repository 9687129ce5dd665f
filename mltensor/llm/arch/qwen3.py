"""`qwen3`: Qwen3 (dense). Qwen2's layer without the biases, with QK-norm: an RMSNorm of each
query and key head (blk.N.attn_q_norm / attn_k_norm, head_dim weights) before the rotary
embeddings; the head size from attention.key_length (128 where hidden / heads is less)."""

from .base import Arch


class Qwen3(Arch):
    name = "qwen3"
    rope = "neox"
    qk_norm = True


ARCH = Qwen3()
