"""`qwen2`: Qwen2 and Qwen2.5. Llama's layer with biases on the q, k and v projections and
rotary embeddings on the halves of each head (llama.cpp's NEOX rope type: the converter does not
permute Wq and Wk)."""

from .base import Arch


class Qwen2(Arch):
    name = "qwen2"
    rope = "neox"
    qkv_bias = True


ARCH = Qwen2()
