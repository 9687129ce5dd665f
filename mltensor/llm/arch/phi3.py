"""`phi3`: Phi-3 and Phi-4(-mini). Q, K and V in one matrix (blk.N.attn_qkv: the query rows, then
the key rows, then the value rows) and the gate and up projections in one (blk.N.ffn_up: the
gate rows first), split after one matmul each; NEOX rope on rope.dimension_count channels (a
partial rotary factor); SwiGLU. The file's attention.sliding_window is ignored, as llama.cpp
does ("Phi SWA is currently disabled"); LongRoPE (rope_factors_long / short) is not supported."""

from .base import Arch


class Phi3(Arch):
    name = "phi3"
    rope = "neox"
    fused_qkv = True
    fused_gate_up = True


ARCH = Phi3()
