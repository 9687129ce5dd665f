"""The GGUF architectures mltensor.llm runs, one description a file (base.py: `Arch`, the parts
of the decoder model.py writes once): llama (Llama 1-3, Mistral), qwen2, qwen3, gemma2, gemma3,
phi3."""

from . import gemma2, gemma3, llama, phi3, qwen2, qwen3
from .base import Arch, read_rope_scaling

ARCHS = {a.ARCH.name: a.ARCH for a in (llama, qwen2, qwen3, gemma2, gemma3, phi3)}

__all__ = ["ARCHS", "Arch", "read_rope_scaling"]
