"""Loop and Scan executed on the GPU timeline instead of unrolled into the graph.

The body is imported once (per shapes of its inputs) as its own graph, wrapped in a few ONNX
nodes (`_wrap_loop`, `_wrap_scan`), and dispatched once per iteration; the loop-carried values
alternate between two sets of MLTensors and never leave the GPU. Scan outputs are copied, one row
an iteration, into a buffer that grows by doubling.

A Loop's exit condition is computed on the GPU. Waiting for it after every iteration would cost a
host round trip each; instead the wrapper gates the body: an iteration whose incoming condition
is false keeps every carried value as it was (`Where(cond, new, old)`), keeps the condition false
and does not count itself. So iterations may be dispatched past the exit harmlessly: the host
dispatches BATCH at a time and reads back the condition and the count (a few bytes) once per
batch, the read of one batch overlapping the next batch's work. An early exit thus costs at most
2 * BATCH gated iterations, and n iterations at most n / BATCH + 1 waits.
"""

import threading

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .. import dtypes
from ..dynamic.dims import MLDynamicDimension
from ..errors import NotSupportedError, gpu_errors
from ..onnxio import ONNX_OF_WEBNN
from ..runtime.timeline import Task
from .cut import Carried
from .pool import Pool

BATCH = 8
# A Loop with no trip count (absent, or INT64_MAX as exporters write a while loop) fails after
# this many iterations instead of hanging on a condition that never turns false.
MAX_ITERATIONS = 1 << 24
UNBOUNDED = 1 << 31  # trip counts from here up are "no trip count"

# the wrapped body's outputs: the next iteration number and condition (the TFLite WHILE's body,
# tflite/staging.py, is wrapped with the same names)
ITER, COND = "__loop_iter_next", "__loop_cond_next"
# A Loop body that slices at offsets computed on the GPU (onnx/ops/_offsets.py) carries an int32
# flag: the importer binds OFFSET_CHECK to it and raises it where a start the importer could not
# prove in range lands outside the tensor (the slice is clamped there, and ONNX would give a
# shorter one); the flag is read back with the condition and fails the run.
OFFSET_CHECK = "__loop_offset_bad"
_BAD_IN, _BAD = "__loop_bad_in", "__loop_bad_next"


class LoopSpec:
    """A Loop or Scan node to execute (built by onnx/ops/control_flow.py at its cut).

    carry order (cut.carry): Loop: [initial condition (int32 []), initial carried..., outer];
    Scan: [initial states..., scan inputs ([steps, row] each, scan axis first, rows padded to
    4 bytes), outer]. `outer` are the operands of the enclosing graph the body reads (host values
    the body reads are made initializers of the body: `outer_host`). trips: the trip count
    (None: none, Loop only). dynamic_cond: the body computes its exit condition; cond_true: the
    initial condition is true (known at load). scan_in:
    [(row elements, slice shape, reversed)] of a Scan's inputs."""

    def __init__(
        self,
        kind,
        node,
        body,
        model,
        opset,
        *,
        trips,
        n_state,
        n_scan_out,
        outer,
        outer_host,
        dynamic_cond=False,
        cond_true=False,
        scan_in=(),
    ):
        self.kind, self.node, self.body, self.model, self.opset = kind, node, body, model, opset
        self.trips, self.n_state, self.n_scan_out = trips, n_state, n_scan_out
        self.outer, self.outer_host = list(outer), dict(outer_host)
        self.dynamic_cond, self.cond_true, self.scan_in = dynamic_cond, cond_true, list(scan_in)
        self.checked = kind == "loop" and body is not None and _slices_at_run_time(body, trips)
        self.graphs = {}  # signature of the body's inputs -> _Body
        self.pools = {}  # signature of the body's inputs -> pool.Pool of a run's tensors (execute)
        self.pools_lock = threading.Lock()

    def pool(self, sig):
        with self.pools_lock:
            p = self.pools.get(sig)
            if p is None:
                p = self.pools[sig] = Pool()
            return p

    def destroy(self):
        with self.pools_lock:
            pools, self.pools = list(self.pools.values()), {}
        for p in pools:
            p.close()
        for b in self.graphs.values():
            b.graph.destroy()
        self.graphs.clear()

    prefix = "[onnx]"  # the importer whose errors these are

    def import_body(self, host, tensors, bools):
        """(the body's input names, the body imported for input tensors of these shapes: its
        .graph and .outputs), wrapped as loop.py runs it (outputs ITER, COND, __state<k>...,
        __scan<j>...)."""
        model, names, shapes = (_wrap_loop if self.kind == "loop" else _wrap_scan)(self, tensors, bools)
        return names, host.import_body(model, shapes)

    def where(self):
        n = self.node
        return f"node {n.name or '(unnamed)'!r} ({n.op_type})"


def _slices_at_run_time(body, trips):
    """Whether a Loop body has a Slice whose starts are computed from something else than its
    iteration number (which a trip count bounds: onnx/ops/_offsets.py proves those at build): its
    body then carries the offset check (OFFSET_CHECK)."""
    known = {t.name for t in body.initializer}
    known.update(o for n in body.node if n.op_type == "Constant" for o in n.output)
    made = {o: n for n in body.node for o in n.output}
    step = body.input[0].name if body.input else None

    def from_step(name):
        for _ in range(len(body.node) + 1):
            if name == step:
                return bool(trips)
            n = made.get(name)
            if n is None or not n.input:
                return False
            if n.op_type in ("Unsqueeze", "Reshape", "Cast", "Identity", "Squeeze"):
                name = n.input[0]
            elif n.op_type in ("Add", "Sub") and len(n.input) == 2 and n.input[1] in known:
                name = n.input[0]
            elif n.op_type == "Add" and len(n.input) == 2 and n.input[0] in known:
                name = n.input[1]
            else:
                return False
        return False

    def proved(name):  # (starts for several axes: a Concat of constants and step offsets)
        n = made.get(name)
        if n is not None and n.op_type == "Concat":
            return all(x in known or from_step(x) for x in n.input)
        return name in known or from_step(name)

    return any(n.op_type == "Slice" and len(n.input) > 1 and not proved(n.input[1]) for n in body.node)


class _Body:
    __slots__ = ("graph", "ins", "outs", "scan_rows")

    def __init__(self, graph, ins, outs, scan_rows):
        self.graph, self.ins, self.outs, self.scan_rows = graph, ins, outs, scan_rows


def _onnx_type(t, is_bool):
    return TensorProto.BOOL if is_bool else ONNX_OF_WEBNN[t.data_type]


def _padded_row(n, itemsize):
    """Elements of a row of n padded so that it is a whole number of 4-byte words (buffer copies
    move 4-byte multiples)."""
    per = max(1, 4 // itemsize)
    return -(-n // per) * per


def _const(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr), name))


def _build(host, spec, tensors, bools):
    """Import the wrapped body for input tensors of these shapes (cached by their signature)."""
    sig = tuple((t.data_type, tuple(t.shape), b) for t, b in zip(tensors, bools))
    hit = spec.graphs.get(sig)
    if hit is not None:
        return hit
    with host.build_lock:
        hit = spec.graphs.get(sig)
        if hit is not None:
            return hit
        names, imp = spec.import_body(host, tensors, bools)
        # which body outputs are the next iteration's inputs, with their shapes checked
        outs = {o.name: o for o in imp.outputs}
        n = spec.n_state
        first = 2 if spec.kind == "loop" else 0
        state_out = ([ITER, COND] if spec.kind == "loop" else []) + [f"__state{k}" for k in range(n)]
        for k, (i_name, o_name) in enumerate(zip(names[: first + n], state_out)):
            want = tuple(tensors[k].shape)
            if tuple(outs[o_name].shape) != want or outs[o_name].data_type != tensors[k].data_type:
                what = "the iteration count" if k < first else f"loop-carried value {i_name!r}"
                raise NotSupportedError(
                    f"{spec.prefix} {spec.where()}: {what} changes from {tensors[k].data_type} {list(want)} to "
                    f"{outs[o_name].data_type} {list(outs[o_name].shape)} across iterations (not supported)"
                )
        rows = [(outs[f"__scan{j}"].data_type, tuple(outs[f"__scan{j}"].shape)) for j in range(spec.n_scan_out)]
        body = _Body(imp.graph, names, state_out, rows)
        spec.graphs[sig] = body
        return body


def _model(spec, nodes, inputs, outputs, inits):
    parent = spec.model
    g = helper.make_graph(
        nodes, "body", inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in outputs], initializer=inits
    )
    m = helper.make_model(g, opset_imports=list(parent.opset_import), functions=list(parent.functions))
    m.ir_version = parent.ir_version
    return m


def _body_inits(spec):
    inits = list(spec.body.initializer)
    for name, v in spec.outer_host.items():
        a = np.asarray(v)
        inits.append(numpy_helper.from_array(a, name))
    return inits


def _wrap_loop(spec, tensors, bools):
    """The Loop body with the gating: inputs (iteration, condition, carried..., outer...),
    outputs (ITER, COND, __state<k>..., __scan<j>...) where a gated iteration changes nothing."""
    body = spec.body
    bnames = [i.name for i in body.input]
    it, cond = bnames[0], bnames[1]
    # the condition crosses iterations as an int32 (bool is uint8 in memory, which kernels
    # unpack and pack at a graph's edges: two launches an iteration saved)
    names = ["__loop_iter_in", "__loop_cond_in"] + bnames[2:] + spec.outer + ([_BAD_IN] if spec.checked else [])
    inputs = [
        helper.make_tensor_value_info(n, _onnx_type(t, b), list(t.shape)) for n, t, b in zip(names, tensors, bools)
    ]
    nodes = [helper.make_node("Cast", ["__loop_cond_in"], [cond], to=TensorProto.BOOL)]
    if spec.trips:
        # the body's iteration number clamped to [0, trips - 1]: a no-op on every iteration that
        # counts (a gated one keeps the count it stopped at, below trips), and a range the importer
        # proves offsets with (a Slice by the step gathers at it: onnx/ops/_offsets.py)
        nodes += [
            _const("__loop_iter_lo", np.array(0, np.int64)),
            _const("__loop_iter_hi", np.array(spec.trips - 1, np.int64)),
            helper.make_node("Clip", ["__loop_iter_in", "__loop_iter_lo", "__loop_iter_hi"], [it]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["__loop_iter_in"], [it]))
    if spec.checked:
        nodes.append(helper.make_node("Identity", [_BAD_IN], [OFFSET_CHECK]))
    nodes += list(body.node)
    it = "__loop_iter_in"
    bo = [o.name for o in body.output]
    nodes += [
        _const("__loop_one", np.array(1, np.int64)),
        helper.make_node("Add", [it, "__loop_one"], ["__loop_iter_inc"]),
        helper.make_node("Where", [cond, "__loop_iter_inc", it], [ITER]),
        helper.make_node("Cast", [bo[0]], ["__loop_cond_b"], to=TensorProto.BOOL),
        helper.make_node("And", [cond, "__loop_cond_b"], ["__loop_cond_and"]),
        helper.make_node("Cast", ["__loop_cond_and"], ["__loop_cond_i"], to=TensorProto.INT32),
        _const("__loop_scalar", np.zeros(0, np.int64)),
        helper.make_node("Reshape", ["__loop_cond_i", "__loop_scalar"], [COND]),
    ]
    outs = [ITER, COND]
    for k in range(spec.n_state):
        nodes.append(helper.make_node("Where", [cond, bo[1 + k], bnames[2 + k]], [f"__state{k}"]))
        outs.append(f"__state{k}")
    scan = bo[1 + spec.n_state :]
    for j, name in enumerate(scan):
        nodes.append(helper.make_node("Identity", [name], [f"__scan{j}"]))
        outs.append(f"__scan{j}")
    if spec.checked:  # (only a counted iteration's offsets count: a gated one may be past the end)
        nodes.append(helper.make_node("Where", [cond, OFFSET_CHECK, _BAD_IN], [_BAD]))
        outs.append(_BAD)
    m = _model(spec, nodes, inputs, outs, _body_inits(spec))
    return m, names, {n: tuple(t.shape) for n, t in zip(names, tensors)}


def _wrap_scan(spec, tensors, bools):
    """The Scan body: inputs (states..., padded scan rows..., outer...), each row reshaped to the
    body's slice; outputs (__state<k>..., __scan<j>...)."""
    body = spec.body
    n = spec.n_state
    bnames = [i.name for i in body.input]
    names = bnames[:n] + [f"__row{k}" for k in range(len(spec.scan_in))] + spec.outer
    inputs = [
        helper.make_tensor_value_info(nm, _onnx_type(t, b), list(t.shape)) for nm, t, b in zip(names, tensors, bools)
    ]
    nodes = []
    for k, (elems, shape, _) in enumerate(spec.scan_in):
        src = f"__row{k}"
        if tensors[n + k].shape[0] != elems:
            nodes += [
                _const(f"__row{k}/st", np.array([0], np.int64)),
                _const(f"__row{k}/en", np.array([elems], np.int64)),
                helper.make_node("Slice", [src, f"__row{k}/st", f"__row{k}/en"], [f"__row{k}/cut"]),
            ]
            src = f"__row{k}/cut"
        nodes += [
            _const(f"__row{k}/shape", np.array(shape, np.int64)),
            helper.make_node("Reshape", [src, f"__row{k}/shape"], [bnames[n + k]]),
        ]
    nodes += list(body.node)
    bo = [o.name for o in body.output]
    outs = []
    for k in range(n):
        nodes.append(helper.make_node("Identity", [bo[k]], [f"__state{k}"]))
        outs.append(f"__state{k}")
    for j, name in enumerate(bo[n:]):
        nodes.append(helper.make_node("Identity", [name], [f"__scan{j}"]))
        outs.append(f"__scan{j}")
    m = _model(spec, nodes, inputs, outs, _body_inits(spec))
    return m, names, {nm: tuple(t.shape) for nm, t in zip(names, tensors)}


# -- running ------------------------------------------------------------------------------------


def _copy(ctx, src, src_off, dst, dst_off, size):
    """Copy `size` bytes (a multiple of 4) between two tensors' buffers, in call order on the
    context's timeline (after the work already enqueued on them)."""
    with ctx._lock:
        tl = ctx._timeline

        def body():
            tl.encoder().copy_buffer_to_buffer(src._buffer, src_off, dst._buffer, dst_off, size)
            tl.touch((src._buffer, dst._buffer))

        with gpu_errors("InferenceSession.run"):
            tl.enqueue(Task((src,), (dst,), body))


def _row(data_type, shape):
    """(elements of one row, elements with the padding to 4 bytes, bytes with it)."""
    n = int(np.prod(shape)) if shape else 1
    size = dtypes.itemsize(data_type)
    p = _padded_row(n, size)
    return n, p, p * size


class _Stack:
    """Rows of one scan output, one an iteration, in a [capacity, row] tensor grown by doubling;
    or, with `dim` (an MLDynamicDimension of the whole trip count), one resizable tensor of every
    row the loop can make, cut to the count in place afterwards (`fit`)."""

    def __init__(self, ctx, data_type, shape, cap, made, dim=None):
        self.ctx, self.data_type, self.made, self.dim = ctx, data_type, made, dim
        self.n, self.pad, self.bytes = _row(data_type, shape)
        self.t = None
        self._alloc(cap if dim is None else dim.max_size)

    def _alloc(self, cap):
        rows = cap if self.dim is None else self.dim
        t = self.ctx.create_tensor_sync(data_type=self.data_type, shape=(rows, self.pad), readable=True, writable=True)
        self.made.append(t)
        if self.t is not None:  # the rows so far move to the bigger tensor
            _copy(self.ctx, self.t, 0, t, 0, self.cap * self.bytes)
            self.made.remove(self.t)
            self.t.destroy()
        self.t, self.cap = t, cap

    def put(self, src, slot):
        if slot >= self.cap:
            self._alloc(self.cap * 2)
        _copy(self.ctx, src, 0, self.t, slot * self.bytes, self.bytes)

    def fit(self, count):
        """The resizable tensor itself, its shape [count, padded row] (no copy)."""
        self.t._fit((count, self.pad), "InferenceSession.run")
        return self.t

    def take(self, count):
        """[count, padded row] tensor of the first `count` rows."""
        if self.dim is not None:
            self.t._fit((self.cap, self.pad), "InferenceSession.run")
        if count == self.cap:
            return self.t
        t = self.ctx.create_tensor_sync(data_type=self.data_type, shape=(count, self.pad), readable=True, writable=True)
        self.made.append(t)
        _copy(self.ctx, self.t, 0, t, 0, count * self.bytes)
        return t


def execute(host, c, avail, made, taken):
    """Run the Loop/Scan of cut `c` (importer.StageCut) on the run's tensors. Returns (values,
    carried, key, exact): values [count, scan row shapes...] (numpy), carried the final state and
    the stacked scan outputs ([count, padded row] tensors, named in `avail`, or host arrays when
    empty), key the outcome's cache key. When the count lands as a dynamic dimension (key
    ("counted",), the stacks resized in place), `exact()` gives (values, carried, key) for a
    build per count instead, should the next stage refuse it; else exact is None.

    The tensors a run of the loop needs whatever its count (host values uploaded, the iteration
    counter, the scan inputs' row tensors, the two sets of body outputs) come from a pool of the
    spec per shapes (`taken`: plan.run gives the set back when the run ends); the scan outputs'
    stacks, sized by the count, are the run's own (`made`)."""
    spec = c.loop
    ctx = host.context
    hosts = {}
    sig = []  # the signature of the tensors the pooled set holds
    for k, d in enumerate(c.carried):
        if d.host is not None:
            a = np.array(host.storage_array(d.host), order="C")  # bool -> uint8, double -> float32 (0-d kept)
            hosts[k] = (a, np.asarray(d.host).dtype == np.bool_)
            sig.append((a.dtype.name, a.shape))
        else:
            t = avail[d.avail]
            sig.append((t.data_type, tuple(t.shape)))
    pool = spec.pool(tuple(sig))
    kept = pool.take()
    taken.append((pool, kept))

    def pooled(name, data_type, shape, **kw):
        t = kept.get(name)
        if t is None:
            t = kept[name] = ctx.create_tensor_sync(data_type=data_type, shape=shape, **kw)
        return t

    tensors, bools = [], []
    for k, d in enumerate(c.carried):
        if k in hosts:
            a, is_bool = hosts[k]
            t = pooled(f"host{k}", a.dtype.name, a.shape, readable=True, writable=True)
            ctx.write_tensor(t, a)
            tensors.append(t)
            bools.append(is_bool)
        else:
            tensors.append(avail[d.avail])
            bools.append(d.is_bool)
    if spec.kind == "loop":
        it = pooled("iteration", "int64", (), readable=True, writable=True)
        ctx.write_tensor(it, np.array(0, np.int64))
        tensors.insert(0, it)
        bools.insert(0, False)
        if spec.checked:
            bad = pooled("bad", "int32", (), readable=True, writable=True)
            ctx.write_tensor(bad, np.array(0, np.int32))
            tensors.append(bad)
            bools.append(False)
    rows = []
    if spec.kind == "scan":  # the body reads one row of each scan input, copied in per iteration
        n = spec.n_state
        for k in range(len(spec.scan_in)):
            src = tensors[n + k]
            dst = pooled(f"row{k}", src.data_type, src.shape[1:], writable=True)
            tensors[n + k] = dst
            rows.append((src, dst, spec.scan_in[k][2]))
    body = _build(host, spec, tensors, bools)
    ins = dict(zip(body.ins, tensors))
    dim = _count_dim(c, body)
    sets = [
        {n: pooled(f"set{i}/{n}", dt, shape, readable=True) for n, (dt, shape) in body.graph.output_descriptors.items()}
        for i in range(2)
    ]
    if spec.kind == "loop":
        count, final = _run_loop(host, spec, body, ins, made, sets, dim)
    else:
        count, final = _run_scan(host, spec, body, ins, rows, made, sets, dim)
    n_first = 2 if spec.kind == "loop" else 0
    depth = c.snapshot.depth
    carried = []
    for k, t in enumerate(final[n_first : n_first + spec.n_state]):
        name = f"~loop{depth}.{c.key[1]}.{k}"
        avail[name] = t
        carried.append(Carried(name, t.data_type, t.shape, bools[n_first + k]))
    values = [np.array(count, np.int64)] + [np.array(shape, np.int64) for _, shape in body.scan_rows]
    stacks = final[n_first + spec.n_state :]

    def exact():
        """(carried, key) with the scan outputs cut to the count by a copy each: the next stage
        built for this count."""
        out = list(carried)
        for j, ((dt, shape), stack) in enumerate(zip(body.scan_rows, stacks)):
            if count == 0:
                out.append(Carried(host=np.zeros((0,) + shape, dtypes.NUMPY[dt])))
                continue
            t = stack.take(count)
            name = f"~loop{depth}.{c.key[1]}.s{j}"
            avail[name] = t
            out.append(Carried(name, t.data_type, t.shape, False))
        # the next stage depends on the count only through the scan outputs' shapes
        return out, (tuple((v.tobytes(), v.shape) for v in values) if body.scan_rows else ())

    if dim is None or count == 0:
        return values, *exact(), None
    out = list(carried)
    for j, stack in enumerate(stacks):  # the count as a dynamic dimension: the tensors cut in place
        t = stack.fit(count)
        name = f"~loop{depth}.{c.key[1]}.s{j}"
        avail[name] = t
        out.append(Carried(name, t.data_type, (dim, stack.pad), False))
    return values, out, ("counted",), lambda: (values, *exact())


# A scan output kept whole for every possible row (the count as a dynamic dimension) holds at most
# this many bytes; a bigger one grows by doubling and the next stage is built per count instead.
MAX_DYNAMIC_STACK = 64 << 20


def _count_dim(c, body):
    """The dynamic dimension the scan outputs' count takes, or None: when the trip count is known
    and the rows of every iteration fit MAX_DYNAMIC_STACK (and no earlier build refused it)."""
    spec = c.loop
    if c.dynamic_ok is False or not body.scan_rows or not spec.trips or spec.trips >= UNBOUNDED:
        return None
    if any(spec.trips * _row(dt, shape)[2] > MAX_DYNAMIC_STACK for dt, shape in body.scan_rows):
        return None
    return MLDynamicDimension(f"count{c.key[0]}_{c.key[1]}", spec.trips)


def _following(ins, sets, nxt):
    """The body's inputs after an iteration that wrote set 0, and after one that wrote set 1
    (nxt: input name -> the output it takes): made once, not per iteration."""
    return [{**ins, **{i: s[o] for i, o in nxt.items()}} for s in sets]


def _stacks(ctx, body, cap, made, dim=None):
    return [_Stack(ctx, dt, shape, cap, made, dim) for dt, shape in body.scan_rows]


def _run_loop(host, spec, body, ins, made, sets, dim=None):
    """Iterations in batches; returns (count, [final iteration, condition, state..., stacks...])."""
    ctx = host.context
    g = body.graph
    trips = spec.trips
    known_start = not spec.dynamic_cond and spec.cond_true
    if trips is None and not spec.dynamic_cond:
        raise NotSupportedError(
            f"{spec.prefix} {spec.where()}: a Loop with neither a trip count nor an exit "
            "condition computed in its body never ends"
        )
    limit = MAX_ITERATIONS if trips is None else trips
    stacks = _stacks(ctx, body, max(1, min(limit, 64)), made, dim)
    nxt = {body.ins[k]: body.outs[k] for k in range(len(body.outs))}
    if spec.checked:
        nxt[_BAD_IN] = _BAD
    follow = _following(ins, sets, nxt)
    t = 0
    count = None
    pending = None  # the reads of the previous batch's condition and count
    while t < limit:
        for _ in range(min(BATCH, limit - t)):
            outs = sets[t % 2]
            ctx.dispatch(g, ins, outs)
            for j, st in enumerate(stacks):
                st.put(outs[f"__scan{j}"], t)
            ins = follow[t % 2]
            t += 1
        if known_start:
            continue  # the condition stays true: exactly `trips` iterations, nothing to read
        started = [ctx._start_read(outs[COND]), ctx._start_read(outs[ITER])]
        if spec.checked:
            started.append(ctx._start_read(outs[_BAD]))
        if pending is not None:
            go, n = _finish(host, spec, pending)
            if not go:
                count = n
                break
        pending = started
    else:
        if trips is None:
            raise NotSupportedError(
                f"{spec.prefix} {spec.where()}: the Loop ran {MAX_ITERATIONS} iterations "
                "without its condition turning false (stopped)"
            )
    if count is None:
        if known_start:
            count = t
            if spec.checked and t:  # the one read of a loop that never waits for its condition
                _finish(host, spec, [None, None, ctx._start_read(outs[_BAD])])
        else:
            count = _finish(host, spec, pending)[1]
    final = [ins[n] for n in body.ins[: 2 + spec.n_state]] + stacks
    return count, final


def _finish(host, spec, reads):
    """Wait for a batch's condition, count and offset check: (condition, iterations that ran)."""
    where = "InferenceSession.run"
    got = [r.wait_sync(where) if r is not None else None for r in reads]
    host.count_read(sum(v.nbytes for v in got if v is not None))
    if len(got) > 2 and int(got[2].reshape(-1)[0]):
        raise NotSupportedError(
            f"{spec.prefix} {spec.where()}: a Slice in the Loop body started at an offset computed at run "
            "time that left the sliced tensor (ONNX clamps it into a shorter slice, whose shape would "
            "change across iterations: not supported)"
        )
    if got[0] is None:
        return None, None
    return bool(got[0].reshape(-1)[0]), int(got[1].reshape(-1)[0])


def _run_scan(host, spec, body, ins, rows, made, sets, dim=None):
    """A Scan: each iteration's rows copied from the scan inputs into the body's row inputs."""
    ctx = host.context
    g = body.graph
    n = spec.n_state
    steps = spec.trips
    stacks = _stacks(ctx, body, max(1, steps), made, dim)
    follow = _following(ins, sets, {body.ins[k]: f"__state{k}" for k in range(n)})
    for t in range(steps):
        for src, dst, rev in rows:
            nbytes = dst._nbytes
            _copy(ctx, src, (steps - 1 - t if rev else t) * nbytes, dst, 0, nbytes)
        outs = sets[t % 2]
        ctx.dispatch(g, ins, outs)
        for j, st in enumerate(stacks):
            st.put(outs[f"__scan{j}"], t)
        ins = follow[t % 2]
    final = [ins[nm] for nm in body.ins[:n]] + stacks
    return steps, final
