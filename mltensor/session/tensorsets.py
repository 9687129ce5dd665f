"""A specialization (one build of the model for one combination of input sizes) and the tensor
sets its runs take: a thread keeps reusing its own, concurrent runs get one each from a pool."""

import threading


class TensorSet:
    """The tensors one run binds: an input tensor per numpy feed, an output tensor per output
    (and a spare per output fed back into the session, so a decode loop alternates two)."""

    __slots__ = ("inputs", "outputs", "spare")

    def __init__(self):
        self.inputs = {}
        self.outputs = {}
        self.spare = {}

    def destroy(self):
        for d in (self.inputs, self.outputs, self.spare):
            for t in d.values():
                t.destroy()
            d.clear()


class Specialization:
    """One build of the model for one combination of input sizes (and load-time input values):
    the graph, its inputs/outputs (IOInfo) and the tensor sets runs with these sizes reuse.

    Sets: `owned` maps a thread to the set its last run used (its ml-tensor outputs live there
    until that thread runs again), `free` holds sets no run uses. A run takes its thread's own
    set, else a free one, else a new one; `users` counts runs in flight, so an evicted or closed
    specialization is destroyed only once none is (the session's lock guards all of this)."""

    __slots__ = (
        "graph",
        "inputs",
        "outputs",
        "owned",
        "free",
        "busy",
        "seq",
        "const_tensors",
        "values",
        "users",
        "dropped",
        "stage",
        "retired",
        "state",
    )

    def __init__(self, graph, inputs, outputs, values=None, stage=None):
        # stage: a model with data-dependent shapes runs as a tree of graphs (stages/plan.py);
        # graph is None then. retired: stages evicted from it while runs were in flight
        self.stage = stage
        self.retired = []
        self.graph = graph
        self.inputs = {i.name: i for i in inputs}
        self.outputs = {o.name: o for o in outputs}
        self.owned = {}  # thread ident -> (ticket, TensorSet) of its latest ml-tensor run
        self.free = []
        self.busy = {}  # id(set) -> ticket (take order) of the run in flight using it
        self.seq = 0
        self.const_tensors = {}
        self.values = values or {}  # input name -> the value the graph is specialized to
        self.users = 0
        self.dropped = False  # evicted or closed: destroyed when the last run in flight ends
        self.state = None  # a stateful TFLite model's variables (session/state.py)

    def take(self):
        """The tensor set for a run on this thread (lock held)."""
        me = threading.get_ident()
        mine = self.owned.get(me)
        if mine is not None and id(mine[1]) not in self.busy:
            s = mine[1]
        else:  # none yet, or the thread's earlier run (run_async) is still in flight
            s = self.free.pop() if self.free else TensorSet()
        self.seq += 1
        self.busy[id(s)] = self.seq
        self.users += 1
        return s

    def give_back(self, s, keep):
        """A run ended (lock held). keep: its outputs were returned as tensors, so the set stays
        this thread's until the thread's next run (of the thread's runs in flight at once, the
        latest keeps it). True when the specialization is to be destroyed now."""
        ticket = self.busy.pop(id(s))
        self.users -= 1
        me = threading.get_ident()
        mine = self.owned.get(me)
        if keep and (mine is None or mine[0] <= ticket):
            self.owned[me] = (ticket, s)
            if mine is not None and mine[1] is not s and id(mine[1]) not in self.busy:
                self.free.append(mine[1])
            if len(self.owned) > 8:  # sets of threads that ended go back to the pool
                alive = {t.ident for t in threading.enumerate()}
                for ident in [i for i in self.owned if i not in alive]:
                    self.free.append(self.owned.pop(ident)[1])
        elif mine is None or mine[1] is not s:
            self.free.append(s)
        return self.dropped and self.users == 0

    def last_outputs(self):
        """The output tensors of this thread's last ml-tensor run, else of any set."""
        mine = self.owned.get(threading.get_ident()) or next(iter(self.owned.values()), None)
        s = mine[1] if mine is not None else (self.free[-1] if self.free else None)
        return s.outputs if s is not None else {}

    def destroy_retired(self):
        for st in self.retired:
            st.destroy()
        self.retired.clear()

    def destroy(self):
        for s in [*(s for _, s in self.owned.values()), *self.free]:
            s.destroy()
        self.owned.clear()
        self.free.clear()
        for t in self.const_tensors.values():
            t.destroy()
        self.const_tensors.clear()
        self.destroy_retired()
        if self.stage is not None:
            self.stage.destroy()
            self.stage = None
        if self.state is not None:
            self.state.destroy()
            self.state = None
        if self.graph is not None:
            self.graph.destroy()
            self.graph = None
