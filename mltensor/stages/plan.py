"""The session's side of a staged model: the tree of stage graphs of one specialization, and a run
along it.

A specialization whose import was cut (onnx/resume.py) holds a root Stage: the graph up to the first
cut. Each Stage that ends at a cut has children keyed by the outcome of its step (the bytes read
back, or a loop's trip count where its scan outputs take it as a size), each built at the first
run that meets that outcome and kept (the `max_specializations` most recently used per stage).

A run binds the feeds, then walks the tree: dispatch the stage's graph into its output tensors
(named in the run's `avail` namespace: feeds by input name, stage outputs by the names
resume.end_stage gave them), run the step, move to the child. A stage's output tensors come from
its pool (`Stage.take`): a set no other run holds, taken for the run and given back when it ends
(`give_back`), so repeated runs allocate nothing for the stages and concurrent runs share no
tensor. An executed loop's tensors come from a pool of its own likewise (loop.execute), but for
its scan outputs' stacks, sized by the count. The outputs an ml-tensor run returns leave their
set (they stay the thread's until its next run, as InferenceSession's own outputs do; the set
makes new ones when next taken). The stacks and constants returned as tensors are the run's own
and are destroyed when it ends.
"""

from collections import OrderedDict

import numpy as np

from .. import dtypes
from ..dynamic.dims import MLDynamicDimension
from ..errors import NotSupportedError
from . import loop
from .cut import Carried
from .pool import Pool


class Stage:
    """One graph of a staged specialization. `cut`: where it ends (importer.StageCut), None for the
    last stage, whose `outputs` are the model's (IOInfo)."""

    __slots__ = ("graph", "inputs", "outputs", "cut", "children", "pool")

    def __init__(self, imported):
        self.graph = imported.graph
        self.inputs = imported.inputs
        self.outputs = {o.name: o for o in imported.outputs}
        self.cut = imported.cut
        self.children = OrderedDict()
        self.pool = Pool()  # sets of the graph's output tensors

    def take(self, ctx):
        """A set of this stage's output tensors for one run: a pooled one, else new ones. A tensor
        the set lacks (an ml-tensor result kept by an earlier run) is made again; the count-sized
        output of a counted cut is fit back to its padded size (the graph writes all of it)."""
        outs = self.pool.take()
        grow = _counted_output(self.cut)
        for n, (dt, shape) in self.graph.output_descriptors.items():
            t = outs.get(n)
            if t is not None:
                if grow is not None and n == grow[0]:
                    t._fit(shape, "InferenceSession.run")
                continue
            if grow is not None and n == grow[0]:  # resizable: cut to the count (_counted_stage)
                shape = grow[1]
            outs[n] = ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True)
        return outs

    def destroy(self):
        for child in self.children.values():
            child.destroy()
        self.children.clear()
        if self.cut is not None and self.cut.loop is not None:
            self.cut.loop.destroy()
        self.pool.close()
        if self.graph is not None:
            self.graph.destroy()
            self.graph = None


def _counted_dim(c):
    """The dynamic dimension a counted cut's padded output takes (cut.cut's `counted`)."""
    i, axis = c.counted
    d = c.carried[i]
    return d, axis, MLDynamicDimension("count" + "_".join(map(str, c.key)), d.shape[axis])


def _counted_output(c):
    """(name, resizable shape) of the stage output a counted cut cuts to the count, or None."""
    if c is None or c.counted is None or c.dynamic_ok is False:
        return None
    d, axis, dim = _counted_dim(c)
    shape = list(d.shape)
    shape[axis] = dim
    return d.avail, tuple(shape)


def _counted_stage(host, spec, stage, values, avail):
    """The next stage of a counted cut with the count as a dynamic dimension: one build for every
    count (the padded tensor resized to it, no copy). None when the count is 0 (an empty result:
    its own build) or when an operator after the cut needs fixed sizes (remembered: from then on
    one build per count)."""
    c = stage.cut
    if _counted_output(c) is None:
        return None
    n = int(np.asarray(values[0]).reshape(-1)[0])
    if n <= 0:
        return None
    d, axis, dim = _counted_dim(c)
    t = avail[d.avail]
    shape = list(d.shape)
    shape[axis] = n
    t._fit(shape, "InferenceSession.run")
    dyn = list(d.shape)
    dyn[axis] = dim
    carried = list(c.carried)
    carried[c.counted[0]] = Carried(d.avail, d.data_type, tuple(dyn), d.is_bool)
    try:
        child = host.next_stage(spec, stage, ("counted",), c, values, carried)
    except (NotSupportedError, TypeError):  # (a malformed model's DataError goes on)
        c.dynamic_ok = False
        t._fit(d.shape, "InferenceSession.run")
        return None
    c.dynamic_ok = True
    return child


def outcome_key(values):
    """The cache key of a read step's outcome: the exact bytes read back."""
    return tuple((v.dtype.str, v.shape, v.tobytes()) for v in values)


def run(host, spec, tset, bind, names, output_location):
    """Run a staged specialization with the feeds bound in `bind` ({input name: tensor}) for
    `host` (host.StageHost: the session). Returns the results in `names` order: numpy arrays
    converted to the ONNX types (cpu), or tensors."""
    ctx = host.context
    avail = dict(bind)
    made = []  # tensors this run created: destroyed when it ends (but the ml-tensor results)
    taken = []  # (pool, tensor set) taken from the stages' and loops' pools: given back when it ends
    kept = set()
    stage = spec.stage
    try:
        while True:
            g = stage.graph
            if g is not None:
                outs = stage.take(ctx)
                taken.append((stage.pool, outs))
                ctx.dispatch(g, {n: avail[n] for n in g.input_descriptors}, outs)
                avail.update(outs)
            c = stage.cut
            if c is None:
                break
            if c.loop is None:  # only the bytes that decide the shape cross to the host
                values = read(host, [avail[n] for n in c.reads])
                key, carried = outcome_key(values), c.carried
                child = _counted_stage(host, spec, stage, values, avail)
                if child is not None:
                    stage = child
                    continue
            else:
                values, carried, key, exact = loop.execute(host, c, avail, made, taken)
                if exact is not None:  # the count as a dynamic dimension, if the rest takes it
                    try:
                        stage = host.next_stage(spec, stage, key, c, values, carried)
                        c.dynamic_ok = True
                        continue
                    except (NotSupportedError, TypeError):
                        c.dynamic_ok = False
                        values, carried, key = exact()
            stage = host.next_stage(spec, stage, key, c, values, carried)
        result = []
        for n in names:
            info = stage.outputs[n]
            if info.const is not None:
                if output_location == "ml-tensor":
                    t = _constant(ctx, info)
                    made.append(t)
                    result.append(t)
                else:
                    result.append(info.const.copy())
            else:
                result.append(avail[n])
        if output_location == "ml-tensor":
            # the thread's earlier results go (a run feeding them back has enqueued its reads of
            # them already: the destroy is ordered after those on the timeline)
            for t in tset.outputs.values():
                t.destroy()
            tset.outputs = {n: t for n, t in zip(names, result)}
            kept = {id(t) for t in result}
            return result
        got = host.read_all(result)
        return [to_onnx(stage.outputs[n], a) for n, a in zip(names, got)]
    finally:
        # (the next run's work on a pooled set is enqueued after this run's on the timeline)
        for pool, outs in taken:
            pool.give_back(outs, kept)
        for t in made:
            if id(t) not in kept:
                t.destroy()


def read(host, tensors):
    """Read tensors back in one submit (numpy values pass through); counted in the session's
    stats as the bytes a staged run reads."""
    vals = host.read_all(tensors)
    host.count_read(sum(v.nbytes for v in vals))
    return vals


def _constant(ctx, info):
    data = np.ascontiguousarray(info.const)
    store = dtypes.NUMPY[info.data_type]
    data = data.view(np.uint8) if data.dtype == np.bool_ else data.astype(store)
    t = ctx.create_tensor_sync(data_type=info.data_type, shape=info.shape or (), readable=True, writable=True)
    ctx.write_tensor(t, data)
    return t


def to_onnx(info, arr):
    """A result in its ONNX type (bool from uint8, double from float32...)."""
    if isinstance(arr, np.ndarray) and arr.dtype == info.np_dtype:
        return arr
    arr = np.asarray(arr)
    if info.np_dtype == np.bool_:
        return arr.view(np.bool_) if arr.dtype.itemsize == 1 else arr.astype(np.bool_)
    return arr.astype(info.np_dtype)
