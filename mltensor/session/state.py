"""The state a stateful TFLite model carries between runs (its resource variables,
mltensor/tflite/control.py), kept in GPU tensors the session owns.

Each variable has two tensors: the current state, bound as the graph's state input, and the one
the run writes the next state into, bound as its state output; after the dispatch they trade
places. The state is never read back: a run's only host traffic is its feeds and outputs.

Threads: the binding, the dispatch and the swap happen under one lock, so runs form a single
chain in the order they dispatch, whatever thread makes them: each run reads the state the run
dispatched before it left. Runs of one stream on several threads at once are safe but interleave
their frames in one state; give each independent stream its own session. `reset` (the
session's `reset_state`) writes the initial values into the current tensors: runs dispatched
after it returns start over; work already dispatched is unaffected (the write is ordered after
it on the device's timeline).
"""

import threading

import numpy as np

from .. import dtypes


class VariableState:
    def __init__(self, ctx, initial, inputs, outputs):
        """initial: {state name: numpy array}; inputs / outputs: the graph's state inputs and
        outputs as {name: (data_type, shape)} (a variable the model only reads has no output)."""
        self._ctx = ctx
        self._lock = threading.Lock()
        self._initial = {n: np.ascontiguousarray(a) for n, a in initial.items()}
        self.inputs = dict(inputs)
        self.outputs = dict(outputs)
        self.names = set(self.inputs) | set(self.outputs)
        self._cur = {}
        self._next = {}
        for n, (dt, shape) in self.inputs.items():
            self._cur[n] = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
            if n in self.outputs:
                self._next[n] = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
        self.reset()

    def reset(self):
        with self._lock:
            for n, t in self._cur.items():
                arr = self._initial[n]
                store = dtypes.NUMPY[t.data_type]
                self._ctx.write_tensor(t, arr if arr.dtype == store else arr.astype(store))

    def dispatch(self, graph, ins, outs):
        """Dispatch `graph` with its state bound, then make the state it wrote the current one."""
        with self._lock:
            ins = dict(ins, **self._cur)
            outs = dict(outs, **{n: self._next[n] for n in self.outputs})
            self._ctx.dispatch(graph, ins, outs)
            for n in self.outputs:
                self._cur[n], self._next[n] = self._next[n], self._cur[n]

    def destroy(self):
        with self._lock:
            for t in [*self._cur.values(), *self._next.values()]:
                t.destroy()
            self._cur.clear()
            self._next.clear()
