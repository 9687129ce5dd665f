"""LlamaBatch: the serving engine's KV caches of several sequences and its batched step
(mltensor/llm/engine.py), one dispatch of the model's "rows" graph (model.py _Builder.build_rows,
ops/kvrows.py) per step."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .. import MLDynamicDimension
from .gguf import LlamaConfig


def rows_ring(c: LlamaConfig, max_context: int, max_rows: int) -> int:
    """Positions a slot of the serving step keeps for a sliding-window layer: the window plus a
    step's rows less one (ops/kvrows.py: then no row of a step overwrites a key another still
    reads); 0 (every position kept) when the model has no sliding layer or that is no smaller."""
    windows = {w for w in c.windows if w}
    if not windows:
        return 0
    ring = max(windows) + max_rows - 1
    return ring if ring < max_context else 0


class LlamaBatch:
    """The KV caches of `slots` sequences and one step over several of them (the serving engine's,
    mltensor/llm/engine.py): one dispatch of the "rows" graph (_Builder.build_rows). A sliding-window
    layer's cache keeps only `ring` positions a slot (rows_ring), the others every position. `run(entries)`:
    entries (slot, start, ids) feed `ids` to `slot`'s sequence at positions start, start + 1, ...
    (what the slot held from `start` on is overwritten); at most `rows` ids in all, one entry a
    slot; an entry (slot, start, ids, False) wants no logits (a prompt chunk that is not the
    prompt's last: the output head skips it). Returns the logits of the last token of each entry
    that wants them, in order, float32 [entries wanting them, vocab], read back to the host (the
    engine samples there). The caches never leave the GPU. `model`: a
    LlamaModel."""

    def __init__(self, model, slots, rows):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise TypeError(f"[LlamaBatch] slots must be a positive integer, got {slots!r}")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < slots:
            raise TypeError(f"[LlamaBatch] rows must be an integer >= slots ({slots}), got {rows!r}")
        self.model, self.ctx = model, model.ctx
        self.slots, self.rows = slots, rows
        c, ctx = model.config, model.ctx
        self._lock = threading.Lock()
        with self._lock:
            self._graph = model.rows_graph(slots, rows)
        # sliding-window layers keep `ring` positions a slot (rows_ring), the others every one
        self.ring = rows_ring(c, model.max_context, rows)
        self.window = max(c.windows)
        n = [slots * (self.ring if self.ring and c.windows[i] else model.max_context) for i in range(c.n_layers)]
        self._cache = {
            f"cache_{kv}{i}": ctx.create_tensor_sync(data_type="float32", shape=[n[i], c.n_kv_heads, c.head_dim])
            for i in range(c.n_layers)
            for kv in "kv"
        }
        dyn = MLDynamicDimension
        self._ins = {
            name: ctx.create_tensor_sync(data_type="int32", shape=[dyn(dim, size)], writable=True)
            for name, dim, size in (
                ("ids", "rows", rows),
                ("pos", "rows", rows),
                ("dst", "rows", rows),
                ("last", "seqs", slots),
            )
            + ((("ring_dst", "rows", rows),) if self.ring else ())
        }
        self._logits = ctx.create_tensor_sync(data_type="float32", shape=[dyn("seqs", slots), c.vocab], readable=True)

    def reusable(self, held, n):
        """How many of the `held` positions a slot's cache holds a sequence that shares their first
        `n` ids may keep: n, or 0 where a sliding layer's ring no longer holds the keys its next
        position reads (positions before held - ring are overwritten)."""
        if not self.ring or n == 0 or n - self.window + 1 >= held - self.ring:
            return n
        return 0

    def session_step(self, start: int, ids: Any, logits: Any) -> None:
        """Slot 0's ids at positions start, start + 1, ... (a LlamaSession of a model with
        sliding-window layers, model.py): `ids` a host array, or an int32 MLTensor [n] already on
        the GPU (a sampler's output: its values never come to the host); the last one's logits
        written into the MLTensor `logits` [1, vocab], where they stay."""
        m = self.model
        n = int(ids.shape[0]) if hasattr(ids, "data_type") else len(ids)
        if not 0 < n <= self.rows or start < 0 or start + n > m.max_context:
            raise ValueError(
                f"[LlamaBatch] {n} ids from position {start} (at most {self.rows} a step, {m.max_context} positions)"
            )
        pos = np.arange(start, start + n, dtype=np.int32)
        feeds = [("pos", pos), ("dst", pos), ("last", np.array([n - 1], np.int32))]
        if self.ring:
            feeds.append(("ring_dst", pos % self.ring))
        with self._lock:
            ctx = self.ctx
            ins = dict(self._ins)
            if hasattr(ids, "data_type"):
                ins["ids"] = ids
            else:
                feeds.append(("ids", np.asarray(ids, np.int32)))
            for name, values in feeds:
                ctx.write_tensor(self._ins[name], values)
            ctx.dispatch(self._graph.graph, ins, {"logits": logits, **self._cache})

    def run(self, entries):
        m = self.model
        ids, pos, dst, last, ring, slots = [], [], [], [], [], set()
        for entry in entries:
            slot, start, toks = entry[:3]
            toks = [int(t) for t in toks]
            if not 0 <= slot < self.slots or slot in slots:
                raise ValueError(f"[LlamaBatch] slot {slot!r} is not a free slot in [0, {self.slots}) of this step")
            if not toks or start < 0 or start + len(toks) > m.max_context:
                raise ValueError(
                    f"[LlamaBatch] {len(toks)} ids from position {start} do not fit {m.max_context} positions"
                )
            slots.add(slot)
            ids += toks
            pos += range(start, start + len(toks))
            dst += range(slot * m.max_context + start, slot * m.max_context + start + len(toks))
            if self.ring:
                ring += [slot * self.ring + p % self.ring for p in range(start, start + len(toks))]
            if len(entry) < 4 or entry[3]:
                last.append(len(ids) - 1)
        if len(ids) > self.rows:
            raise ValueError(f"[LlamaBatch] a step of {len(ids)} rows (at most {self.rows})")
        vocab = m.config.vocab
        wanted = len(last)
        if not wanted:  # (no entry wants its logits: the head still runs, on one row)
            last.append(len(ids) - 1)
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"[LlamaBatch] token ids must lie in [0, {vocab})")
        with self._lock:
            ctx = self.ctx
            feeds = [("ids", ids), ("pos", pos), ("dst", dst), ("last", last)] + (
                [("ring_dst", ring)] if self.ring else []
            )
            for name, values in feeds:
                ctx.write_tensor(self._ins[name], np.asarray(values, np.int32))
            ctx.dispatch(self._graph.graph, self._ins, {"logits": self._logits, **self._cache})
            if not wanted:
                return np.zeros((0, vocab), np.float32)
            return ctx.read_tensor_sync(self._logits).reshape(wanted, vocab)
