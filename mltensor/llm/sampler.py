"""Sampler(ctx, vocab, ...): the next token chosen on the GPU with the `_sample_token` operator
(sampling.py). `sampler(logits_tensor)` dispatches the graph into its int32 [1] output tensor
(which a LlamaSession can feed straight back: the next step's input ids); `read()` brings back
those 4 bytes. The uniform numbers come from numpy's PCG64 seeded with `seed` (4 bytes written per
sampled step; `reseed(seed)` starts the sequence again).

The repeat penalty (llama.cpp's `penalties` sampler, applied before the others): each logit of a
token among the last `penalty_last_n` ids of the context is divided by `repeat_penalty` when
positive, multiplied by it when negative. Those ids go up with each call (`recent`, 4 bytes an id);
in the graph they gather their logits, which are penalized and scattered back (`scatter_nd`; an id
present twice writes the same value twice). repeat_penalty 1 leaves the graph as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import MLGraphBuilder
from .sampling import check_settings

if TYPE_CHECKING:
    from ..front.context import MLContext
    from ..front.tensor import MLTensor


def check_penalty(repeat_penalty: float, penalty_last_n: int) -> tuple[float, int]:
    if isinstance(repeat_penalty, bool) or not isinstance(repeat_penalty, (int, float)):
        raise TypeError(f"[Sampler] repeat_penalty must be a number > 0, got {repeat_penalty!r}")
    if not (0.0 < float(repeat_penalty) < float("inf")):
        raise TypeError(f"[Sampler] repeat_penalty must be a finite number > 0 (1: off), got {repeat_penalty}")
    if isinstance(penalty_last_n, bool) or not isinstance(penalty_last_n, int) or penalty_last_n < 1:
        raise TypeError(f"[Sampler] penalty_last_n must be a positive integer, got {penalty_last_n!r}")
    return float(repeat_penalty), penalty_last_n


class Sampler:
    """Chooses the next token on the GPU. temperature 0 (or top_k 1) is greedy; top_k 0, top_p 1
    and repeat_penalty 1 are off. Thread-safe (one lock per sampler). Calling it,
    ``sampler(logits, recent)``, dispatches the choice from `logits` (an MLTensor [1, vocab]) into
    `ids` (an int32 [1] MLTensor on the GPU) and returns `ids`; `recent` (the context's ids so far)
    is needed when repeat_penalty is not 1.

    Parameters
    ----------
    ctx : MLContext
        The context of the logits.
    vocab : int
        The vocabulary size.
    temperature : float, default 0.0
        0: greedy.
    top_k : int, default 0
        Keep the k likeliest tokens; 0: off.
    top_p : float, default 1.0
        Keep the likeliest tokens whose probabilities sum to p; 1: off.
    seed : int or None, default 0
        The random numbers' seed (numpy PCG64); None: from the OS.
    repeat_penalty : float, default 1.0
        Divides the positive logits (multiplies the negative ones) of the last `penalty_last_n`
        ids; 1: off.
    penalty_last_n : int, default 64
        How many of the last ids the penalty reads.

    Raises
    ------
    TypeError
        A setting out of range.
    """

    def __init__(
        self,
        ctx: MLContext,
        vocab: int,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = 0,
        repeat_penalty: float = 1.0,
        penalty_last_n: int = 64,
    ) -> None:
        self.temperature, self.top_k, self.top_p = check_settings(temperature, top_k, top_p)
        self.repeat_penalty, self.penalty_last_n = check_penalty(repeat_penalty, penalty_last_n)
        self.ctx = ctx
        self.vocab = vocab
        self.greedy = self.temperature == 0.0 or self.top_k == 1
        self.penalized = self.repeat_penalty != 1.0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        b = MLGraphBuilder(ctx)
        logits = b.input("logits", data_type="float32", shape=[1, vocab])
        rnd = None if self.greedy else b.input("rnd", data_type="float32", shape=[1])
        if self.penalized:
            n = self.penalty_last_n
            recent = b.input("recent", data_type="int32", shape=[n])
            flat = b.reshape(logits, [vocab])
            seen = b.gather(flat, recent, axis=0)
            p = np.float32(self.repeat_penalty)
            penalized = b.where(
                b.greater(seen, b.constant(np.array(0, np.float32))),
                b.mul(seen, b.constant(np.array(1 / p, np.float32))),
                b.mul(seen, b.constant(np.array(p, np.float32))),
            )
            logits = b.reshape(b.scatter_nd(flat, b.reshape(recent, [n, 1]), penalized), [1, vocab])
        ids = b._sample_token(  # type: ignore[attr-defined]  # (an internal operator: not in the builder stub)
            logits, rnd, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p
        )
        self._graph = b.build_sync({"ids": ids})
        self._rnd: Any = None if self.greedy else ctx.create_tensor_sync(data_type="float32", shape=[1], writable=True)
        self._recent: Any = (
            ctx.create_tensor_sync(data_type="int32", shape=[self.penalty_last_n], writable=True)
            if self.penalized
            else None
        )
        self.ids = ctx.create_tensor_sync(data_type="int32", shape=[1], readable=True)

    def reseed(self, seed: int | None) -> None:
        """Start the random numbers again from `seed`.

        Parameters
        ----------
        seed : int or None
            The seed; None: from the OS.
        """
        with self._lock:
            self._rng = np.random.default_rng(seed)

    def __call__(self, logits: MLTensor, recent: Sequence[int] | None = None) -> MLTensor:
        """Dispatch the choice from `logits` (an MLTensor [1, vocab]); returns self.ids (on the GPU).
        `recent`: the context's ids so far (its last penalty_last_n are penalized; needed when
        repeat_penalty is not 1)."""
        with self._lock:
            ins = {"logits": logits}
            if not self.greedy:
                self.ctx.write_tensor(self._rnd, np.array([self._rng.random(dtype=np.float32)], np.float32))
                ins["rnd"] = self._rnd
            if self.penalized:
                if recent is None or len(recent) == 0:
                    raise TypeError("[Sampler] a repeat penalty needs the recent token ids")
                last = np.asarray(recent[-self.penalty_last_n :], np.int32)
                # fewer ids than the window: the first one repeated (a repeated id changes nothing)
                window = np.concatenate([np.full(self.penalty_last_n - last.size, last[0], np.int32), last])
                self.ctx.write_tensor(self._recent, window)
                ins["recent"] = self._recent
            self.ctx.dispatch(self._graph, ins, {"ids": self.ids})
            return self.ids

    def read(self) -> int:
        """The last chosen id (4 bytes read back).

        Returns
        -------
        int
            The token id.
        """
        return int(self.ctx.read_tensor_sync(self.ids)[0])  # type: ignore[index]  # (no `out`: an array)
