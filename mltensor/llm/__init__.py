"""Large language models from GGUF files (llama.cpp's format) on the GPU: `mltensor.llm`.

- gguf.py: read and validate a GGUF file (the `gguf` package), repack Q4_0/Q4_1/Q8_0 blocks into
  the packed layout of the `_matmul_nbits` / `_gather_nbits` kernels, and keep the K-quants,
  Q5_0/Q5_1, IQ4_NL/IQ4_XS and BF16 as the file's bytes for `_matmul_blocks` / `_gather_blocks`
  (mltensor/ops/blocks.py);
- model.py: every architecture's decoder with MLGraphBuilder (LlamaModel; LlamaSession: one
  conversation's KV cache on the GPU; the serving step's "rows" graph);
- kernels.py: `_llm_gemv`, the decode step's 4/8-bit GEMV on CPU adapters and the serving step's
  on every adapter (a tile of rows, sums that do not depend on the rows beside);
- sampling.py: `_sample_token`: greedy / temperature / top-k / top-p on the GPU; sampler.py: Sampler,
  its graph per setting;
- tokenizer.py: GGUFTokenizer, the file's byte-level BPE or SentencePiece vocabulary;
  templates.py: its chat template, or the architecture's built-in one;
- api.py: LLM (generate, chat, token ids in and out) and Conversation (a dialogue whose KV cache
  stays on the GPU): the Python API, which mltensor-chat is a thin layer over;
- batch.py: LlamaBatch, the KV caches of several sequences and one batched step over them (the
  model's "rows" graph); engine.py: Engine, continuous batching of requests over it (what
  `mltensor serve` runs).

Needs the `gguf` and `tokenizers` packages (the `llm` extra). The console entry point is
`mltensor-chat` (mltensor/apps/chat.py).
"""

from .api import DEFAULTS, LLM, Conversation
from .gguf import GGUFFile, LlamaConfig, QuantizedWeight, repack
from .model import LlamaModel, LlamaSession, LlamaWeights
from .sampler import Sampler
from .tokenizer import GGUFTokenizer

__all__ = [
    "LLM",
    "Conversation",
    "DEFAULTS",
    "GGUFFile",
    "LlamaConfig",
    "QuantizedWeight",
    "repack",
    "LlamaModel",
    "LlamaSession",
    "LlamaWeights",
    "Sampler",
    "GGUFTokenizer",
]
