"""The importer's side of a cut: where a handler meets a value that decides a shape at run time.

A handler asks `outcome(im)` first: on a resumed import (the next stage) it returns what the step
between the stages found (the values read back, and the operands it carried over, now inputs of
this stage's builder). Otherwise it builds what the step needs (a count, padded results) and calls
`cut(...)`, which raises Cut. Importer.run catches it at the top-level node being imported, ends
the stage there (`end_stage`) and returns a stage result instead of the whole graph. The next
stage is imported from that very node again, with the snapshot taken here (`restore`): host
values as they were, every value the remaining nodes read turned into an input of the new builder,
bound at run time to the tensor the earlier stage left.

Cuts are numbered per top-level node (its index, then the k-th cut the node makes), so a handler
that cuts twice (a computed k, then the count) finds both outcomes when it is imported again. An
unrolled loop numbers its iterations' cuts apart (`loop_base`, `iteration`): iteration j's s-th
cut is keyed (node, ..., base, j, s) whatever the other iterations cut, so that a read batched
over the iterations (control_flow.py, `Cut.batch`) gives each iteration its own outcome.
"""

from contextlib import contextmanager

import numpy as np
from onnx import TensorProto

from ..dynamic.dims import MLDynamicDimension
from ..front.builder import MLOperand
from ..onnxio import IOInfo, ONNX_OF_WEBNN
from ..stages.cut import Carried
from .errors import UnsupportedError, unsupported
from .model import outer_names

# A value read back to decide a shape holds sizes, a count or a k: a few bytes. Reading more than
# this many elements would be a readback of data, not of a shape: refused with a clear error.
MAX_READ_ELEMENTS = 4096


class Cut(BaseException):
    """A handler needs a value only a run can give. BaseException: a handler's own `except
    Exception` (folding attempts, optional paths) must not swallow it on its way to Importer.run."""

    def __init__(self, key, read, carry, loop, what, drop_inputs, counted):
        super().__init__(what)
        self.key, self.read, self.carry, self.loop = key, list(read), list(carry), loop
        self.what, self.drop_inputs, self.counted = what, frozenset(drop_inputs), counted
        self.batch = None  # [(cut key, number of reads)]: the reads of several cuts at once


class Snapshot:
    """The import at a cut: resume at top-level node `index` with the importer's counter `uid`;
    `host` {name: array}, `ops` {name: Carried} of the values the remaining nodes read, `gone`
    the names the cut node no longer reads when resumed, `types` the ONNX types, `folded` the
    BatchNormalization nodes (indices) folded into an earlier Conv, `outcomes` {cut key: (values,
    [Carried])} of the cuts already passed whose nodes are imported again, `batch` the Cut's (the
    values read back belong to several cuts: [(key, count)] in order)."""

    __slots__ = ("index", "uid", "depth", "host", "ops", "gone", "types", "folded", "outcomes", "batch")

    def with_outcome(self, key, values, carried):
        s = Snapshot()
        for f in self.__slots__:
            setattr(s, f, getattr(self, f))
        s.outcomes = dict(self.outcomes)
        s.batch = None
        if self.batch is None:
            s.outcomes[key] = (list(values), list(carried))
            return s
        at = 0
        for k, n in self.batch:  # each iteration's values under its own cut's key
            s.outcomes[k] = (list(values[at : at + n]), list(carried) if k == key else [])
            at += n
        return s


def outcome(im):
    """(values, operands) of the next cut of the node being imported, when a resumed import has
    it; None otherwise (the handler then builds its step's inputs and calls cut)."""
    got = im.resumed.get((im._top_index, *im._cut_prefix, im._cut_seq + 1))
    if got is not None:
        im._cut_seq += 1
    return got


def cut(im, *, read=(), carry=(), loop=None, what, drop_inputs=(), counted=None):
    """End the stage here: run it, then read `read` back (operands of a few elements) or run
    `loop` (stages/loop.LoopSpec, its inputs in `carry`), and import the rest again from this node with
    the outcome. drop_inputs: positions of the node's inputs its handler does not read once
    resumed (they are not kept for it: None then). counted: (position in `carry`, axis) when the
    value read is a count of the valid leading entries of that padded operand along that axis:
    the next stage is then first tried with the count as a dynamic dimension (one build for
    every count, plan.run; the handler gets the padded operand already of the count's size)."""
    reason = im.cut_refusal
    if reason is None and im._top_index is None:
        reason = "inside a Loop, Scan or If body"
    if reason is not None:  # (not the importer's fail(): no list of supported operators here)
        n = im.node
        where = f"node {n.name or '(unnamed)'!r} ({n.op_type})" if n is not None else "model"
        raise UnsupportedError(
            f"[onnx] {where}: {what} is only known at run time (a data-dependent "
            f"shape), which is not supported {reason}"
        )
    for v in read:
        n = int(np.prod(v.shape))
        if n > MAX_READ_ELEMENTS:
            unsupported(
                f"{what} is computed at run time and has {n} elements; a value read back to decide a "
                f"shape may have at most {MAX_READ_ELEMENTS}"
            )
    if im.node is not im.top_node:
        # a node inside the top-level node's subgraph (an If branch) or function body cuts: the
        # positions it drops are its own inputs', not those of the node the import resumes at
        drop_inputs = ()
    im._cut_seq += 1
    raise Cut((im._top_index, *im._cut_prefix, im._cut_seq), read, carry, loop, what, drop_inputs, counted)


def loop_base(im):
    """The key base of an unrolled loop's iterations (it takes one cut number of the scope the
    loop is in)."""
    im._cut_seq += 1
    return (*im._cut_prefix, im._cut_seq)


@contextmanager
def iteration(im, base, j):
    """Import iteration j of the unrolled loop whose `loop_base` is `base`: its cuts are
    numbered from 1 under (base, j)."""
    saved = im._cut_prefix, im._cut_seq
    im._cut_prefix, im._cut_seq = (*base, j), 0
    try:
        yield
    finally:
        im._cut_prefix, im._cut_seq = saved


def read(im, v, what):
    """The value of operand `v` (a shape, an axis list, a k), read back at run time: ends the stage
    the first time, the host array once resumed."""
    got = outcome(im)
    if got is None:
        cut(im, read=[v], what=what)
    return got[0][0]


# -- ending a stage ---------------------------------------------------------------------------


def live_names(im, nodes, i, drop):
    """Names the import reads from node i on: inputs of the nodes (and of their subgraphs, from
    the enclosing scope) and the graph's outputs; not node i's inputs at positions `drop`."""
    names = set(im.graph_outputs)
    for j, n in enumerate(nodes[i:]):
        names.update(x for k, x in enumerate(n.input) if x and (j or k not in drop))
        names.update(outer_names(n))
    return names


def end_stage(im, c, nodes, i, uid, folded):
    """The stage graph's outputs for a Cut raised at top-level node i, and the snapshot to resume
    from. Returns (outputs {name: operand}, snapshot, reads [avail names], carried [Carried])."""
    depth = im.resume.depth + 1 if im.resume is not None else 0
    outputs = {}
    b = im.b

    def export(v):
        if isinstance(v, np.ndarray):
            return Carried(host=v)
        name = im.avail_of.get(id(v))
        if name is None:
            name = f"~stage{depth}.{len(outputs)}"
            outputs[name] = v if v._kind == "op" else b.identity(v)
            im.avail_of[id(v)] = name
        return Carried(name, v.data_type, v.shape, id(v) in im.bools)

    live = live_names(im, nodes, i, c.drop_inputs)
    s = Snapshot()
    s.index, s.uid, s.depth, s.folded, s.batch = i, uid, depth, frozenset(folded), c.batch
    s.host, s.ops = {}, {}
    for name in sorted(live):
        v = im.env.get(name)
        if isinstance(v, MLOperand):
            s.ops[name] = export(v)
        elif v is not None:
            s.host[name] = v
    s.gone = frozenset(x for x in nodes[i].input if x and x not in live)
    s.types = dict(im.types)
    prior = im.resume.outcomes if im.resume is not None else {}
    s.outcomes = {k: v for k, v in prior.items() if k[0] >= i}  # cuts of nodes imported again
    # (a value read back is a stage output: a feed's tensor need not be readable)
    reads = [export(v if v._kind == "op" else b.identity(v)).avail for v in c.read]
    carried = [export(v) for v in c.carry]
    return outputs, s, reads, carried


def restore(im, snap):
    """Start a resumed import (Importer.run with resume=snap): the environment at the cut, every
    value a tensor of the run as an input of the new builder. Returns the builder's inputs
    (IOInfo, named by the run's tensor names)."""
    b = im.b
    made, inputs = {}, []

    def make(d):
        if d.host is not None:
            return d.host
        op = made.get(d.avail)
        if op is None:
            op = made[d.avail] = b.input(d.avail, data_type=d.data_type, shape=d.shape)
            for dim in d.shape:  # a count as a dynamic dimension (plan.run): read through this input
                if isinstance(dim, MLDynamicDimension):
                    im.dim_refs.setdefault(dim.name, op)
            im.avail_of[id(op)] = d.avail
            im.stage_inputs.add(id(op))
            if d.is_bool:
                im.bools.add(id(op))
            et = TensorProto.BOOL if d.is_bool else ONNX_OF_WEBNN[d.data_type]
            inputs.append(IOInfo(d.avail, et, d.data_type, d.shape))
        return op

    im.env = dict(snap.host)
    for name, d in snap.ops.items():
        im.env[name] = make(d)
    dynamic = any(
        isinstance(dim, MLDynamicDimension) for _, carried in snap.outcomes.values() for d in carried for dim in d.shape
    )
    if dynamic:  # a count as a dynamic dimension: no further cut in this build (its shapes are Syms)
        im.cut_refusal = "in a build with dynamic dimensions"
    for name in snap.gone:
        im.env.setdefault(name, None)
    im.types = dict(snap.types)
    im._uid = snap.uid
    im.resumed = {k: (vals, [make(d) for d in carried]) for k, (vals, carried) in snap.outcomes.items()}
    return inputs
