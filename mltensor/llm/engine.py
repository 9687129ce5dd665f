"""Continuous batching over one LLM: the engine behind `mltensor serve` (mltensor/serve).

    engine = Engine(llm, slots=8)
    req = engine.submit(llm.tokenize("Once upon a time"), max_tokens=32, temperature=0)
    for piece in req:               # or `async for piece in req` from asyncio
        print(piece, end="")
    req.finish_reason, req.prompt_tokens, req.completion_tokens

One thread runs the steps. A step is one dispatch of the model's batched graph (model.py,
"rows"): the next token of every request that is generating, and at most `prefill_chunk` prompt
tokens of requests still reading their prompt, each row with its own KV-cache slot and position.
Requests wait in a bounded queue (QueueFull past `max_queue`), take a free slot at a step
boundary, read their prompt a chunk per step (so a long prompt delays the streams already running
by one chunk's work per step, not by its whole length), generate, and leave: their slot is free for
the next step. The logits of the rows that sample come back to the host (one read a step) and are
sampled there per request, with the request's own options and random generator, as llama.cpp's
server does; a row's logits do not depend on the other rows of its step (every kernel computes a
row alone), so a greedy reply in a batch equals the same request served alone.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DOMException, as_internal
from .api import PENALTY_LAST_N, TextTail
from .batch import LlamaBatch
from .sampler import check_penalty
from .sampling import check_settings

if TYPE_CHECKING:
    import numpy.typing as npt

    from .api import LLM
    from .tokenizer import GGUFTokenizer


class QueueFull(Exception):
    """The engine's queue of waiting requests is full; `retry_after`: seconds to wait (an estimate)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineClosed(RuntimeError):
    """The engine is shutting down (or shut down): it takes no new request."""


class _Options:
    """One request's validated options."""

    def __init__(
        self,
        max_tokens: int,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int | None,
        stop: str | Sequence[str] | None,
        presence_penalty: float,
        frequency_penalty: float,
        repeat_penalty: float,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise TypeError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.temperature, self.top_k, self.top_p = check_settings(temperature, top_k, top_p)
        self.repeat_penalty, _ = check_penalty(repeat_penalty, PENALTY_LAST_N)
        for name, v in (("presence_penalty", presence_penalty), ("frequency_penalty", frequency_penalty)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -2.0 <= float(v) <= 2.0:
                raise TypeError(f"{name} must be a number in [-2, 2], got {v!r}")
        self.presence, self.frequency = float(presence_penalty), float(frequency_penalty)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise TypeError(f"seed must be an integer >= 0 or None (random), got {seed!r}")
        self.seed = seed
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        if not all(isinstance(s, str) and s for s in stops):
            raise TypeError(f"stop must be a non-empty string or a list of them, got {stops!r}")
        self.stop = stops


def sample(logits: npt.NDArray[Any], context_ids: Sequence[int], o: _Options, rng: np.random.Generator) -> int:
    """The next token from one row of logits (float32 [vocab]) on the host, llama.cpp's sampler
    chain: penalties over the last PENALTY_LAST_N ids of the context (repeat: divide a positive
    logit, multiply a negative one; frequency: minus count times it; presence: minus it once), then
    greedy (temperature 0) or top-k, temperature, top-p and a draw from `rng`."""
    x = logits.astype(np.float64)
    if o.repeat_penalty != 1.0 or o.presence or o.frequency:
        ids, counts = np.unique(np.asarray(context_ids[-PENALTY_LAST_N:], np.int64), return_counts=True)
        if ids.size:
            v = x[ids]
            if o.repeat_penalty != 1.0:
                v = np.where(v > 0, v / o.repeat_penalty, v * o.repeat_penalty)
            x[ids] = v - counts * o.frequency - o.presence
    if o.temperature == 0.0 or o.top_k == 1:
        return int(np.argmax(x))
    if o.top_k and o.top_k < x.size:
        keep = np.argpartition(-x, o.top_k - 1)[: o.top_k]
    else:
        keep = np.arange(x.size)
    order = keep[np.argsort(-x[keep], kind="stable")]
    z = x[order] / o.temperature
    p = np.exp(z - z[0])
    p /= p.sum()
    if o.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(p), o.top_p)) + 1  # the smallest head reaching top_p
        p = p[:cut] / p[:cut].sum()
        order = order[:cut]
    return int(order[min(int(np.searchsorted(np.cumsum(p), rng.random())), p.size - 1)])


class Request:
    """One submitted generation: iterate it (or `async for`) for its text pieces; `cancel()` ends
    it at the next step. After the end: finish_reason ("stop", "length", "cancelled", "error"),
    prompt_tokens, cached_tokens (the prompt's start found in the cache), completion_tokens, ttft_s (seconds from submit to the first token), token_times
    (perf_counter of each generated token), error (the exception of an "error" end, re-raised by
    the iteration after the pieces it gave)."""

    def __init__(self, rid: int, ids: Sequence[int], options: _Options) -> None:
        self.id = rid
        self.ids = list(ids)
        self.options = options
        self.prompt_tokens = len(ids)
        self.cached_tokens = 0  # of the prompt, found in a slot's cache (not computed again)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.ttft_s: float | None = None
        self.token_times: list[float] = []
        self.submitted = time.perf_counter()
        self._items: collections.deque[str] = collections.deque()
        self._done = False
        self._cancelled = False
        self._cond = threading.Condition()
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    @property
    def done(self) -> bool:
        """Whether the request has ended (`finish_reason` says how)."""
        return self._done

    def cancel(self) -> None:
        """End the request at the next step (its slot is freed); finish_reason "cancelled"."""
        self._cancelled = True

    def _notify(self) -> None:
        for loop, ev in list(self._wakers):
            try:
                loop.call_soon_threadsafe(ev.set)
            except RuntimeError:  # that event loop is closed: its consumer is gone
                pass

    def _put(self, piece: str) -> None:
        with self._cond:
            self._items.append(piece)
            self._cond.notify_all()
            self._notify()

    def _finish(self, reason: str, error: BaseException | None = None) -> None:
        with self._cond:
            if self._done:
                return
            self.finish_reason, self.error, self._done = reason, error, True
            self._cond.notify_all()
            self._notify()

    def __iter__(self) -> Iterator[str]:
        while True:
            with self._cond:
                while not self._items and not self._done:
                    self._cond.wait()
                if not self._items:
                    break
                piece = self._items.popleft()
            yield piece
        if self.error is not None:
            raise self.error

    def __aiter__(self) -> AsyncIterator[str]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[str]:
        waker = (asyncio.get_running_loop(), asyncio.Event())
        with self._cond:
            self._wakers.append(waker)
        try:
            while True:
                with self._cond:
                    piece = self._items.popleft() if self._items else None
                    if piece is None:
                        if self._done:
                            break
                        waker[1].clear()  # (under the lock: a later _put sets it again)
                if piece is None:
                    await waker[1].wait()
                    continue
                yield piece
        finally:
            with self._cond:
                self._wakers.remove(waker)
        if self.error is not None:
            raise self.error

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request ends.

        Parameters
        ----------
        timeout : float or None, default None
            The most seconds to wait; None: no limit.

        Returns
        -------
        bool
            Whether it ended.
        """
        with self._cond:
            return self._cond.wait_for(lambda: self._done, timeout)


class _Active:
    """A request in a slot: what it has fed, what it generates."""

    def __init__(self, req: Request, slot: int, tokenizer: GGUFTokenizer, limit: int, cached: int) -> None:
        self.req, self.slot = req, slot
        self.context = list(req.ids)  # ids whose keys and values are or will be in the slot, in order
        self.fed = cached  # positions of the slot written so far (a cached prefix counts)
        self.pending = list(req.ids[cached:])  # ids still to feed
        self.limit = limit  # tokens it may generate
        self.tail = TextTail(tokenizer, req.options.stop)
        self.rng = np.random.default_rng(req.options.seed)


class Engine:
    """Continuous batching of generation requests over `llm` (an mltensor.llm.LLM): `slots`
    sequences decode together (one KV-cache slot each, sized for llm.max_context), at most
    `max_queue` wait for a slot, a step reads at most `prefill_chunk` prompt tokens. Thread-safe:
    submit from any thread; each request is consumed by one reader.

    Parameters
    ----------
    llm : mltensor.llm.LLM
        The model (its tokenizer and ``max_context`` apply to every request).
    slots : int, default 8
        How many requests generate together (one KV-cache slot each).
    max_queue : int, default 64
        How many requests may wait for a slot; `submit` raises QueueFull past it.
    prefill_chunk : int, default 64
        The most prompt tokens a step reads (a long prompt is read over several steps).

    Raises
    ------
    TypeError
        `slots`, `max_queue` or `prefill_chunk` not a positive integer.
    """

    def __init__(self, llm: LLM, *, slots: int = 8, max_queue: int = 64, prefill_chunk: int = 64) -> None:
        for name, v in (("slots", slots), ("max_queue", max_queue), ("prefill_chunk", prefill_chunk)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise TypeError(f"[Engine] {name} must be a positive integer, got {v!r}")
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.slots = slots
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self.batch = LlamaBatch(llm.model, slots, rows=slots + prefill_chunk)
        self._cond = threading.Condition()
        self._waiting: collections.deque[Request] = collections.deque()
        self._active: list[_Active] = []
        self._free = list(range(slots))
        self._held: list[list[int]] = [[] for _ in range(slots)]  # the ids whose keys and values each slot holds
        self._closing = False
        self._cancel_all = False
        self._ids = itertools.count(1)
        self._step_s = 0.05  # a running estimate of a step's time (for Retry-After)
        self._m = dict.fromkeys(
            (
                "requests_total",
                "requests_finished_total",
                "prompt_tokens_total",
                "generated_tokens_total",
                "steps_total",
                "batch_rows_total",
                "decode_rows_total",
            ),
            0,
        )
        self._thread = threading.Thread(target=self._loop, name="mltensor-engine", daemon=True)
        self._thread.start()

    # -- the public surface ---------------------------------------------------------------------

    def submit(
        self,
        ids: Iterable[int],
        *,
        max_tokens: int = 16,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] = (),
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
    ) -> Request:
        """Queue a generation after the prompt `ids`. Sampling is llama.cpp's chain: penalties
        over the last 64 ids, then greedy (temperature 0) or top-k, temperature, top-p and a draw.

        Parameters
        ----------
        ids : iterable of int
            The prompt's token ids (``llm.tokenize(text)``), each in the vocabulary.
        max_tokens : int, default 16
            The most tokens to generate.
        temperature : float, default 1.0
            0: greedy.
        top_k : int, default 0
            Keep the k likeliest tokens; 0: off.
        top_p : float, default 1.0
            Keep the likeliest tokens whose probabilities sum to p; 1: off.
        seed : int or None, default None
            The request's random generator; None: random.
        stop : str or sequence of str, default ()
            The text ends before the first one found (not returned).
        presence_penalty : float, default 0.0
            In [-2, 2]: subtracted once from the logit of each token already in the context.
        frequency_penalty : float, default 0.0
            In [-2, 2]: subtracted per occurrence of a token in the context.
        repeat_penalty : float, default 1.0
            Divides a positive logit of a token in the context (multiplies a negative one); 1: off.

        Returns
        -------
        Request
            The queued request: iterate it for its text.

        Raises
        ------
        TypeError
            A bad option, or `ids` not a sequence of ids.
        ValueError
            An empty prompt, an id outside the vocabulary, or the prompt plus `max_tokens` past
            ``llm.max_context``.
        QueueFull
            `max_queue` requests wait already (``retry_after`` says how long to wait).
        EngineClosed
            `shutdown` has started.
        """
        o = _Options(
            max_tokens, temperature, top_k, top_p, seed, stop, presence_penalty, frequency_penalty, repeat_penalty
        )
        if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
            raise TypeError(f"ids must be a list of token ids, got {type(ids).__name__}")
        ids = list(ids)
        vocab = self.tokenizer.vocab_size
        if not ids:
            raise ValueError("the prompt has no tokens")
        if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
            raise ValueError(f"token ids must be integers in [0, {vocab})")
        ctx = self.llm.max_context
        if len(ids) + o.max_tokens > ctx:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) plus max_tokens ({o.max_tokens}) exceed the context of {ctx} tokens"
            )
        with self._cond:
            if self._closing:
                raise EngineClosed("the engine is shutting down")
            if len(self._waiting) >= self.max_queue:
                ahead = len(self._waiting) + len(self._active)
                raise QueueFull(
                    f"{len(self._waiting)} requests wait already (the queue holds {self.max_queue})",
                    retry_after=max(1.0, round(self._step_s * ahead / self.slots * 8, 1)),
                )
            req = Request(next(self._ids), [int(i) for i in ids], o)
            self._waiting.append(req)
            self._m["requests_total"] += 1
            self._cond.notify_all()
        return req

    def metrics(self) -> dict[str, int]:
        """Counters and gauges, a snapshot (the server's ``/metrics``).

        Returns
        -------
        dict of str to int
            queue_depth, active, slots, requests_total, requests_finished_total,
            prompt_tokens_total, generated_tokens_total, steps_total, batch_rows_total (rows of
            all steps), decode_rows_total (rows that sampled a token), and any further counter
            the engine keeps.
        """
        with self._cond:
            return dict(self._m, queue_depth=len(self._waiting), active=len(self._active), slots=self.slots)

    def shutdown(self, *, cancel: bool = False, timeout: float | None = None) -> None:
        """Take no new request; finish the queued and running ones, and wait for the step thread.

        Parameters
        ----------
        cancel : bool, default False
            End the queued and running requests now (finish_reason "cancelled").
        timeout : float or None, default None
            Wait at most this many seconds for them to finish, then cancel the rest; None: no
            limit.
        """
        with self._cond:
            self._closing = True
            self._cancel_all = self._cancel_all or cancel
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            with self._cond:
                self._cancel_all = True
                self._cond.notify_all()
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(cancel=True)

    # -- the step thread --------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._waiting or self._active or self._closing):
                    self._cond.wait()
                if self._cancel_all:
                    for r in self._waiting:
                        r._finish("cancelled")
                    self._waiting.clear()
                    for a in self._active:
                        a.req.cancel()
                if self._closing and not self._waiting and not self._active:
                    return
                while self._waiting and self._free:
                    req = self._waiting.popleft()
                    if req._cancelled:
                        req._finish("cancelled")
                        continue
                    limit = min(req.options.max_tokens, self.llm.max_context - len(req.ids))
                    slot, cached = self._slot_for(req.ids)
                    self._free.remove(slot)
                    req.cached_tokens = cached
                    self._active.append(_Active(req, slot, self.tokenizer, limit, cached))
                    self._m["prompt_tokens_total"] += req.prompt_tokens  # (admitted: read, whatever its end)
            t0 = time.perf_counter()
            try:
                self._step()
            except Exception as e:  # noqa: BLE001 - a bug here must end the requests, not hang them
                err = _internal(e)
                for a in list(self._active):
                    if not a.req.done:
                        a.req._finish("error", err)
                    self._held[a.slot] = []
                with self._cond:
                    self._free = sorted(set(self._free) | {a.slot for a in self._active})
                    self._m["requests_finished_total"] += len(self._active)
                    self._active.clear()
            self._step_s = 0.8 * self._step_s + 0.2 * (time.perf_counter() - t0)

    def _slot_for(self, ids: Sequence[int]) -> tuple[int, int]:
        """The free slot whose cache holds the longest start of `ids` (as llama.cpp's server
        reuses a slot's prompt cache: a chat resent with one more message computes only that),
        and how many of its ids to keep (at least the last id is fed: its logits are needed)."""
        best, best_n = self._free[0], -1
        for slot in self._free:
            n = 0
            for x, y in zip(self._held[slot], ids[:-1]):
                if x != y:
                    break
                n += 1
            n = self.batch.reusable(len(self._held[slot]), n)
            if n > best_n:
                best, best_n = slot, n
        return best, best_n

    def _leave(self, a: _Active, reason: str, error: BaseException | None = None) -> None:
        a.req._finish(reason, error)
        # what the slot's cache now holds: the positions written (an error may leave a step's
        # rows half written: nothing is kept then)
        self._held[a.slot] = [] if reason == "error" else a.context[: a.fed]
        with self._cond:
            self._active.remove(a)
            self._free.append(a.slot)
            self._free.sort()
            self._m["requests_finished_total"] += 1

    def _step(self) -> None:
        for a in [a for a in self._active if a.req._cancelled]:
            self._leave(a, "cancelled")
        # the rows: every generating request's next token, then prompt chunks up to prefill_chunk
        rows: list[tuple[_Active, list[int]]] = []
        budget = self.prefill_chunk
        for a in self._active:
            if a.pending and a.fed >= len(a.req.ids):  # generating: one token
                rows.append((a, a.pending[:1]))
        for a in self._active:
            if budget and a.pending and a.fed < len(a.req.ids):
                take = a.pending[: min(budget, len(a.req.ids) - a.fed)]
                budget -= len(take)
                rows.append((a, take))
        if not rows:
            return
        try:
            logits = iter(self.batch.run([self._entry(a, toks) for a, toks in rows]))
        except Exception as e:  # noqa: BLE001 - one failing step must not kill the others' streams
            self._isolate(rows, e)
            return
        with self._cond:
            self._m["steps_total"] += 1
            self._m["batch_rows_total"] += sum(len(t) for _, t in rows)
        for a, toks in rows:
            self._took(a, toks, next(logits) if self._entry(a, toks)[3] else None)

    @staticmethod
    def _entry(a: _Active, toks: list[int]) -> tuple[int, int, list[int], bool]:
        """LlamaBatch.run's entry of row `toks` of `a`: its logits wanted only where it ends the
        prompt or is a generated token (a sample follows)."""
        return a.slot, a.fed, toks, a.fed + len(toks) >= len(a.req.ids)

    def _took(self, a: _Active, toks: Sequence[int], row: npt.NDArray[Any] | None) -> None:
        """Row `toks` of request `a` ran (row: the logits of its last token, None mid-prompt)."""
        a.fed += len(toks)
        del a.pending[: len(toks)]
        if a.pending or row is None:  # more prompt to read: no sample yet
            return
        try:
            self._advance(a, row)
        except Exception as e:  # noqa: BLE001 - this request's bug ends this request only
            self._leave(a, "error", _internal(e))

    def _isolate(self, rows: Sequence[tuple[_Active, list[int]]], error: BaseException) -> None:
        """A step failed: run its rows one request at a time, so that only the requests that fail
        end (with an error) and the others go on."""
        for a, toks in rows:
            entry = self._entry(a, toks)
            try:
                out = self.batch.run([entry])
            except Exception as e:  # noqa: BLE001
                self._leave(a, "error", _internal(e))
                continue
            self._took(a, toks, out[0] if entry[3] else None)

    def _advance(self, a: _Active, row: npt.NDArray[Any]) -> None:
        req, o = a.req, a.req.options
        token = sample(row, a.context, o, a.rng)
        now = time.perf_counter()
        if req.ttft_s is None:
            req.ttft_s = now - req.submitted
        if token in self.tokenizer.stop_ids:
            self._end(a, "stop")
            return
        req.completion_tokens += 1
        req.token_times.append(now)
        with self._cond:
            self._m["generated_tokens_total"] += 1
            self._m["decode_rows_total"] += 1
        piece = a.tail.push(token)
        if piece:
            req._put(piece)
        if a.tail.stopped:
            self._end(a, "stop")
            return
        if req.completion_tokens >= a.limit:
            self._end(a, "length")
            return
        a.context.append(token)
        a.pending.append(token)

    def _end(self, a: _Active, reason: str) -> None:
        rest = a.tail.flush()
        if rest:
            a.req._put(rest)
        self._leave(a, reason)


def _internal(e: Exception) -> Exception:
    """What a request that hit `e` ends with: a WebNN error (the device out of memory or lost, a
    rejected call) as it is, any other exception as the InternalError of a bug in mltensor."""
    return e if isinstance(e, DOMException) else as_internal("Engine", e)
