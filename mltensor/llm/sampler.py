"""Sampler(ctx, vocab, ...): the next token chosen on the GPU with the `_sample_token` operator
(sampling.py). `sampler(logits_tensor)` dispatches the graph into its int32 [1] output tensor
(which a LlamaSession can feed straight back: the next step's input ids); `read()` brings back
those 4 bytes. The uniform numbers come from numpy's PCG64 seeded with `seed` (4 bytes written per
sampled step).
"""

import threading

import numpy as np

from .. import MLGraphBuilder
from .sampling import check_settings


class Sampler:
    """Chooses the next token on the GPU. temperature 0 (or top_k 1) is greedy; top_k 0 and
    top_p 1 are off. Thread-safe (one lock per sampler)."""

    def __init__(self, ctx, vocab, *, temperature=0.0, top_k=0, top_p=1.0, seed=0):
        self.temperature, self.top_k, self.top_p = check_settings(temperature, top_k, top_p)
        self.ctx = ctx
        self.vocab = vocab
        self.greedy = self.temperature == 0.0 or self.top_k == 1
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        b = MLGraphBuilder(ctx)
        logits = b.input("logits", data_type="float32", shape=[1, vocab])
        rnd = None if self.greedy else b.input("rnd", data_type="float32", shape=[1])
        ids = b._sample_token(logits, rnd, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        self._graph = b.build_sync({"ids": ids})
        self._rnd = None if self.greedy else ctx.create_tensor_sync(data_type="float32", shape=[1], writable=True)
        self.ids = ctx.create_tensor_sync(data_type="int32", shape=[1], readable=True)

    def __call__(self, logits):
        """Dispatch the choice from `logits` (an MLTensor [1, vocab]); returns self.ids (on the GPU)."""
        with self._lock:
            ins = {"logits": logits}
            if not self.greedy:
                self.ctx.write_tensor(self._rnd, np.array([self._rng.random(dtype=np.float32)], np.float32))
                ins["rnd"] = self._rnd
            self.ctx.dispatch(self._graph, ins, {"ids": self.ids})
            return self.ids

    def read(self):
        """The last chosen id (4 bytes read back)."""
        return int(self.ctx.read_tensor_sync(self.ids)[0])
