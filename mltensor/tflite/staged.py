"""A TFLite model imported as stages (mltensor/stages/) for an InferenceSession: the control flow
decided at run time (tflite/staging.py ends the import at it) runs as the ONNX importer's does.

  WHILE whose condition is computed at run time: the stage ends with the loop's values and its
        first test; the loop runs on the GPU timeline (stages/loop.py: the body, gated by the
        condition, dispatched in batches, the condition read back once per batch), its body and
        condition subgraphs imported once as one graph (`WhileLoop`); the next stage resumes at
        the WHILE with its final values as inputs.
  IF on a run-time condition whose branches give different shapes: the condition is read back
        (4 bytes) and the next stage, built once per outcome, imports the branch it takes.

`import_stage` imports the model up to its first cut (or whole), `resume_stage` the stage after a
cut from the cut's snapshot with the step's outcome (the session's StageHost.next_stage).
"""

import numpy as np

from ..errors import NotSupportedError
from ..front.builder import MLGraphBuilder
from ..onnxio import ONNX_OF_WEBNN, IOInfo
from ..stages import loop
from ..stages.cut import Carried
from . import staging
from .common import op_error, opt
from .control import Handle, to_operand
from .importer import Importer


class StageCut:
    """Where a stage ends, as stages/plan.py and stages/loop.py read it (the ONNX importer's
    StageCut's fields): resume from `snapshot` after reading back `reads` or running `loop`."""

    __slots__ = ("snapshot", "key", "reads", "carried", "loop", "what", "counted", "dynamic_ok")

    def __init__(self, snapshot, key, reads, carried, loop, what):
        self.snapshot, self.key, self.reads, self.carried = snapshot, key, reads, carried
        self.loop, self.what = loop, what
        self.counted, self.dynamic_ok = None, None


class Imported:
    """One stage: its graph, inputs and outputs (IOInfo) and where it ends (None: the last)."""

    __slots__ = ("graph", "inputs", "outputs", "cut")

    def __init__(self, graph, inputs, outputs, cut):
        self.graph, self.inputs, self.outputs, self.cut = graph, inputs, outputs, cut


class _Out:
    __slots__ = ("name", "data_type", "shape")

    def __init__(self, name, data_type, shape):
        self.name, self.data_type, self.shape = name, data_type, tuple(shape)


class _Body:
    __slots__ = ("graph", "outputs")

    def __init__(self, graph, outputs):
        self.graph, self.outputs = graph, outputs


class WhileLoop(loop.LoopSpec):
    """A TFLite WHILE run by stages/loop.py: its carried values are the loop's variables but the
    constants its body passes through unchanged (`plan`); the body graph computes the body
    subgraph then the condition subgraph on its results (the next iteration's test)."""

    prefix = "[tflite]"

    def __init__(self, model, op, plan, float16):
        n = sum(1 for kind, _ in plan if kind == "carried")
        super().__init__("loop", None, None, None, None, trips=None, n_state=n, n_scan_out=0, outer=(),
                         outer_host={}, dynamic_cond=True)  # fmt: skip
        self.tfl_model, self.op, self.plan, self.float16 = model, op, plan, float16

    def where(self):
        return f"operator {self.op.index} ({self.op.display})"

    def import_body(self, host, tensors, bools):
        op = self.op
        b = MLGraphBuilder(host.context)
        names = ["__loop_iter_in", "__loop_cond_in"] + [f"__loop_in{k}" for k in range(self.n_state)]
        ins = [b.input(n, data_type=t.data_type, shape=list(t.shape)) for n, t in zip(names, tensors)]
        imp = Importer(self.tfl_model, b, float16=self.float16)
        imp.staged = staging.IN_BODY  # (no stage can end inside: a loop there is refused, named)
        states = iter(ins[2:])
        args = [v if kind == "const" else next(states) for kind, v in self.plan]
        new = imp.run_subgraph(op, int(opt(op, "BodySubgraphIndex", -1)), args)
        if len(new) != len(args):
            raise op_error(op, f"the body gives {len(new)} values for {len(args)} loop variables")
        c = imp.run_subgraph(op, int(opt(op, "CondSubgraphIndex", -1)), new)
        if len(c) != 1:
            raise op_error(op, f"the condition subgraph gives {len(c)} outputs, not one")
        going = b.not_equal(ins[1], b.constant(np.zeros((), np.int32)))  # gated: a test already false
        it = ins[0]
        outs = {loop.ITER: b.where(going, b.add(it, b.constant(np.array(1, np.int64))), it)}
        test = b.cast(staging.condition(imp, to_operand(imp, c[0])), "int32")
        outs[loop.COND] = b.where(going, test, b.constant(np.zeros((), np.int32)))
        k = 0
        for j, ((kind, _), v, x) in enumerate(zip(self.plan, new, args)):
            if kind == "carried":
                v = to_operand(imp, v)
                if tuple(v.shape) != tuple(x.shape) or v.data_type != x.data_type:
                    raise op_error(op, f"loop variable {j} changes from {x.data_type} {list(x.shape)} to {v.data_type} "
                                       f"{list(v.shape)} across iterations (not supported)", NotSupportedError)  # fmt: skip
                outs[f"__state{k}"] = b.where(going, v, x)
                k += 1
        graph = b.build_sync(outs)
        return names, _Body(graph, [_Out(n, dt, s) for n, (dt, s) in graph.output_descriptors.items()])


def _info(name, data_type, shape):
    return IOInfo(name, ONNX_OF_WEBNN[data_type], data_type, shape)


def model_io(model, free=None):
    """The model's inputs and outputs as a staged session declares them (IOInfo lists)."""
    imp = Importer(model, None, free) if free else None
    ins = []
    for i in model.inputs:
        t = model.tensors[i]
        shape = imp.input_shape(t) if imp is not None else list(t.shape)
        ins.append(_info(t.name or f"input_{i}", t.data_type, shape))
    outs = [_info(model.tensors[i].name or f"output_{i}", model.tensors[i].data_type, model.tensors[i].shape)
            for i in model.outputs]  # fmt: skip
    return ins, outs


def _build(b, outputs, snapshot):
    return b.build_sync(outputs)


def import_stage(model, context, free_dimensions=None, float16=False, snapshot=None, initial_state=None, build=None):
    """The first stage of `model` (snapshot None) or the stage after a cut: Imported.
    initial_state: as importer.convert's (a dict receiving a stateful model's initial state).
    build(builder, outputs, snapshot): the stage's graph (the session's: from its graph cache,
    keyed on the snapshot resumed from), by default built."""
    b = MLGraphBuilder(context)
    imp = Importer(model, b, free_dimensions, float16)
    imp.carry_variable_tensors = initial_state is not None
    if snapshot is None:
        snapshot = staging.Snapshot()
        snapshot.model, snapshot.free, snapshot.float16 = model, free_dimensions, float16
        snapshot.depth, snapshot.index, snapshot.consts, snapshot.live = 0, None, {}, {}
        snapshot.outcomes, snapshot.plans, snapshot.inner = {}, {}, None
    imp.staged = snapshot
    build = build or _build
    try:
        outs, ins, out_desc = imp.run()
    except staging.Cut as c:
        return _end(imp, b, c, build)
    if initial_state is not None:
        initial_state.update(imp.initial_state)
    # a whole model, one graph: built here (the session caches it as such, not as a stage)
    graph = (build if snapshot.index is not None else _build)(b, outs, snapshot)
    return Imported(graph, [_info(*d) for d in ins], [_info(*d) for d in out_desc], None)


def resume_stage(snapshot, context, build=None):
    """The stage after a cut: `snapshot` holds the step's outcome (Snapshot.with_outcome)."""
    return import_stage(snapshot.model, context, snapshot.free, snapshot.float16, snapshot, build=build)


def _end(imp, b, c, build):
    """End the stage at cut `c`: its graph's outputs are the values the rest reads and the cut's
    step reads; the snapshot resumes at the cut operator."""
    st, op, m, inner = imp.staged, c.op, imp.model, c.imp
    depth = st.depth + 1
    outputs = {}

    def out(name, v):
        if v._kind in ("input", "constant"):
            v = imp.b.identity(v)
        outputs[name] = v
        return Carried(name, v.data_type, tuple(int(d) for d in v.shape))

    def keep(im, at, drop, tag, skip=()):
        """The values of import `im` its operators from `at` on read (but `drop` of the first),
        and its outputs: the stage's outputs, the next stage's inputs."""
        live = set(im.model.outputs)
        for j, o in enumerate(im.model.operators[at:]):
            live.update(i for p, i in enumerate(o.inputs) if i >= 0 and (j or p not in drop))
        kept = {}
        for i in sorted(live):
            if i in im.values and i not in im.consts and i not in skip:
                d = out(f"~{depth}.{tag}{i}", im.values[i])
                kept[i] = (d.avail, d.data_type, d.shape)
        return kept

    snap = st.copy()
    if inner is imp:
        snap.index, snap.inner = op.index, None
        snap.live = keep(imp, op.index, c.drop, "t", m.inputs)
    else:  # inside a branch of the main subgraph's IF: resume at the IF, then in its branch at op
        snap.index = inner.branch_of.index
        snap.live = keep(imp, snap.index, (0,), "t", m.inputs)
        snap.inner = (op.index, dict(inner.consts), keep(inner, op.index, c.drop, "b"))
    cond = out(f"~{depth}.cond", imp.b.cast(staging.condition(inner, to_operand(inner, c.cond)), "int32"))
    snap.depth, snap.consts = depth, dict(imp.consts)
    key = staging.key_of(inner, op)
    if c.kind == "loop":
        body_i = int(opt(op, "BodySubgraphIndex", -1))
        if not 0 < body_i < len(m.subgraphs):
            raise op_error(op, f"names subgraph {body_i}; the model has {len(m.subgraphs)} (0 is the main one)")
        sg = m.subgraphs[body_i]
        plan, carried = [], [cond]
        for k, v in enumerate(c.values):
            if isinstance(v, Handle):
                raise op_error(op, "a loop variable is a resource variable's handle (not supported as a stage)",
                               NotSupportedError)  # fmt: skip
            if isinstance(v, np.ndarray) and k < min(len(sg.inputs), len(sg.outputs)) and sg.outputs[k] == sg.inputs[k]:
                plan.append(("const", v))  # passed through unchanged: a constant of the body
                continue
            plan.append(("carried", None))  # (a constant: an output of the stage, in its storage form)
            carried.append(out(f"~{depth}.w{k}", to_operand(inner, v)))
        snap.plans[key] = plan
        spec = WhileLoop(imp.model, op, plan, imp.float16)
        cut = StageCut(snap, (key, 0), [], carried, spec, f"{op.display}'s loop")
    else:
        cut = StageCut(snap, (key, 0), [cond.avail], [], None, f"{op.display}'s condition")
    graph = build(b, outputs, st)
    ins = [_info(n, dt, s) for n, (dt, s) in graph.input_descriptors.items()]
    outs = [_info(n, dt, s) for n, (dt, s) in graph.output_descriptors.items()]
    return Imported(graph, ins, outs, cut)
