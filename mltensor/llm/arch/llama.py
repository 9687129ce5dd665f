"""`llama`: Llama 1-3.x, Mistral (written as `llama` by llama.cpp's converter), SmolLM2.

RMSNorm, rotary embeddings on adjacent pairs (the converter permutes Wq and Wk so that this
equals Hugging Face's rotate-half), grouped-query attention, SwiGLU. Llama 3.1+'s rope scaling is
the file's rope_freqs.weight (frequency factors, read by the model); biases where the file has
them."""

from .base import Arch


class Llama(Arch):
    name = "llama"


ARCH = Llama()
