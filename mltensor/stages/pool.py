"""Pools of tensor sets: a stage's output tensors (plan.Stage) and an executed loop's tensors
(loop.LoopSpec) are taken from one for a run and given back when it ends, so that repeated runs
allocate nothing and concurrent runs share no tensor."""

import threading


# Tensor sets a pool keeps for later runs: as many as runs have been in flight at once on it, up
# to this many (a set beyond is destroyed when its run ends).
POOL = 8


class Pool:
    """Sets of tensors ({name: MLTensor}) a run takes and gives back when it ends, so that
    repeated runs allocate nothing; a set belongs to one run at a time (the lock), so concurrent
    runs share none. The taker fills in what a set lacks."""

    __slots__ = ("free", "lock", "closed")

    def __init__(self):
        self.free, self.lock, self.closed = [], threading.Lock(), False

    def take(self):
        with self.lock:
            return self.free.pop() if self.free else {}

    def give_back(self, outs, kept):
        """A run ended: its set goes back, but the tensors it returned (ids in `kept`), which the
        caller now holds. A pool closed meanwhile (its stage evicted) destroys it."""
        for n in [n for n, t in outs.items() if id(t) in kept]:
            del outs[n]
        with self.lock:
            if not self.closed and len(self.free) < POOL:
                self.free.append(outs)
                return
        for t in outs.values():
            t.destroy()

    def close(self):
        with self.lock:
            self.closed = True
            free, self.free = self.free, []
        for outs in free:
            for t in outs.values():
                t.destroy()
