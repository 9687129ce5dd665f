"""ONNX control flow: If, Loop, Scan."""

import numpy as np
import onnx

from onnx import numpy_helper

from ... import dtypes
from ...stages import loop
from .. import resume
from ..errors import unsupported
from ..model import outer_names
from ._helpers import const, input_leaves, mark_bool, norm_axis, prod, X
from ._registry import op


@op("If", attrs=("then_branch", "else_branch"))
def _if(im, node, ins, attrs):
    """A condition known at load takes its branch. One decided by small integer/bool graph
    inputs (a sample rate, a flag) specializes the session to their values (NeedsValue). Any
    other computed condition runs both branches and selects with `where` when both give the same
    shapes and types; otherwise it is read back at run time (a cut, mltensor/stages/)."""
    cond = ins[0]
    if isinstance(cond, np.ndarray) or _decided_by_small_inputs(im, cond):
        cond = const(im, cond, "cond (the branch must be chosen at load)")
        g = attrs["then_branch"] if bool(cond.reshape(-1)[0]) else attrs["else_branch"]
        return _run_branch(im, g)
    outs_t = _run_branch(im, attrs["then_branch"])
    outs_e = _run_branch(im, attrs["else_branch"])
    b = im.b
    c = X(im, cond)
    if len(c.shape) and prod(c.shape) != 1:
        unsupported(f"cond has shape {list(c.shape)}, not a single value")
    c = b.reshape(c, [])
    # (a branch giving an empty tensor, which WebNN has not, cannot be selected with `where`)
    empty = any(v is not None and 0 in tuple(v.shape) for v in outs_t + outs_e)
    pairs = []
    for t, e in zip(outs_t, outs_e) if not empty else ():
        t_op = X(im, t) if t is not None else None
        e_op = X(im, e, t_op) if e is not None else None
        pairs.append((t_op, e_op))
    if empty or any(
        t is None or e is None or tuple(t.shape) != tuple(e.shape) or t.data_type != e.data_type for t, e in pairs
    ):
        # the branches give different shapes: the condition is read back at run time and the
        # graph after it built for the branch taken (mltensor/stages/)
        taken = resume.read(im, c, "the If condition (its branches give different shapes)")
        return _run_branch(im, attrs["then_branch"] if bool(taken.reshape(-1)[0]) else attrs["else_branch"])
    res = []
    for t_op, e_op in pairs:
        y = b.where(c, t_op, e_op)
        if id(t_op) in im.bools:
            mark_bool(im, y)
        res.append(y)
    return res


def _run_branch(im, g):
    for init in g.initializer:
        im.env[init.name] = im._tensor(init)
    im.run_nodes(g.node, im.cur_opset)
    for o in g.output:
        if o.name not in im.env:
            im.malformed(f"branch output {o.name!r} is not produced by any node of the branch")
    return [im.env[o.name] for o in g.output]


def _decided_by_small_inputs(im, v):
    """Whether an operand is computed only from graph inputs that are small integer or bool
    tensors (at most 16 elements): worth specializing the graph to their values. Not the inputs
    of a resumed stage (values the earlier stage left): the condition was computed the first
    time, and the resumed import must take the same path, meeting its cuts in the same order."""
    leaves = input_leaves(v)
    return bool(leaves) and all(
        not o.data_type.startswith("float") and prod(o.shape) <= 16 and id(o) not in im.stage_inputs for o in leaves
    )


# Unrolling copies the body once per iteration into the graph: a loop whose trip count and
# condition are known at load is unrolled up to this many iterations (one graph, kernels fused
# across iterations, no per-iteration dispatch); longer ones, and loops whose condition is
# computed on the GPU, are executed (mltensor/stages/loop.py).
MAX_UNROLL = 256


@op("Loop", "Scan", attrs=None)
def _control_flow(im, node, ins, attrs):
    """Loops on values all known at load run then (trip counts and carried values included).
    Otherwise a loop known at load to be short is unrolled into the graph, any other executed on
    the GPU: the graph is cut at the loop (mltensor/stages/)."""
    if all(v is None or isinstance(v, np.ndarray) for v in ins):
        try:
            return im.evaluate(node, ins)
        except ValueError:
            pass  # the body reads a value computed in the graph
    if node.op_type == "Loop":
        return _loop(im, node, ins, attrs)
    return _scan(im, node, ins, attrs)


def _outer(im, node):
    """The enclosing graph's values the node's subgraphs read: (operand names, {name: host})."""
    ops, host = [], {}
    for n in dict.fromkeys(outer_names(node)):
        v = im.env.get(n)
        if v is None:
            continue
        if isinstance(v, np.ndarray):
            host[n] = v
        else:
            ops.append(n)
    return ops, host


def _loop(im, node, ins, attrs):
    body = attrs["body"]
    m = ins[0] if ins else None
    trips = None
    if m is not None:
        trips = int(const(im, m, "trip count M").reshape(-1)[0])
        if trips >= loop.UNBOUNDED:
            trips = None
        trips = None if trips is None else max(trips, 0)
    n_state = len(ins) - 2
    n_scan = len(body.output) - 1 - n_state
    cond = ins[1] if len(ins) > 1 else None
    if cond is not None and not isinstance(cond, np.ndarray) and _decided_by_small_inputs(im, cond):
        cond = const(im, cond, "the loop's initial condition")  # the session binds the input's value
    if trips is not None and 0 < trips <= MAX_UNROLL and (cond is None or isinstance(cond, np.ndarray)):
        # (before the executed loop's outcome: a resumed import meets the cuts of an unrolled body
        # again, in the order the first import made them)
        res = _unroll_loop(im, node, ins, attrs, trips)
        if res is not None:
            return res
    got = resume.outcome(im)
    # values the body only grows become scan outputs when executed (an unrolled loop grows them)
    grown = _grown_carries(body, n_state, ins)
    if got is not None:  # executed: the final state and the stacked scan outputs
        if grown:
            body, ins, inits = _without_grown(body, ins, grown)
            n_state, n_scan = n_state - len(grown), n_scan + len(grown)
        res = _executed_results(im, got, n_state, n_scan, [0] * n_scan, [0] * n_scan)
        return _with_grown(im, res, n_state, grown, inits) if grown else res
    b = im.b
    # (the condition crosses iterations as an int32: stages/loop.py)
    if cond is None or isinstance(cond, np.ndarray):
        cond_true = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        cond0 = np.array(int(cond_true), np.int32)
    else:
        cond0 = b.reshape(b.cast(X(im, cond), "int32"), [])
        cond_true = False
    if grown:
        body, ins, _ = _without_grown(body, ins, grown)
        n_state, n_scan = n_state - len(grown), n_scan + len(grown)
    ops, host = _outer(im, node)
    spec = loop.LoopSpec(
        "loop",
        node,
        body,
        im.model,
        im.cur_opset,
        trips=trips,
        n_state=n_state,
        n_scan_out=n_scan,
        outer=ops,
        outer_host=host,
        dynamic_cond=_computes_condition(body),
        cond_true=cond_true,
    )
    carry = [cond0] + list(ins[2:]) + [im.env[n] for n in ops]
    resume.cut(im, carry=carry, loop=spec, what=f"Loop {node.name or '(unnamed)'!r}")


def _grown_carries(body, n_state, ins):
    """Loop-carried values the body only grows: output k is Concat(input k, y) along an axis and
    input k is read nowhere else (torch.cat((acc, step)) in a scripted loop, Mask R-CNN's paste
    masks). Executed, such a value would change shape every iteration; it is the initial value
    followed by the y of every iteration, i.e. a scan output of y (`_without_grown`). Returns
    [(k, axis, y name)]."""
    uses = {}
    for n in body.node:
        for x in list(n.input) + outer_names(n):
            uses[x] = uses.get(x, 0) + 1
    out_names = [o.name for o in body.output]
    found = []
    for k in range(n_state):
        bi, bo = body.input[2 + k].name, out_names[1 + k]
        node = next((n for n in body.node if bo in n.output), None)
        init = ins[2 + k]
        if node is None or node.op_type != "Concat" or len(node.input) != 2 or node.input[0] != bi:
            continue
        if init is None or uses.get(bi, 0) != 1 or uses.get(bo, 0) or out_names.count(bo) != 1:
            continue
        if bi in out_names or node.input[1] == bi:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        rank = len(init.shape)
        if axis is None or not -rank <= axis < rank:
            continue
        found.append((k, axis % rank, node.input[1]))
    return found


def _without_grown(body, ins, grown):
    """The body and the Loop's inputs with each grown value turned into a scan output of the
    piece it appends (after the body's scan outputs, in `grown`'s order), and the grown values'
    initial values."""
    g = onnx.GraphProto()
    g.CopyFrom(body)
    drop_in = {body.input[2 + k].name for k, _, _ in grown}
    drop_out = {body.output[1 + k].name for k, _, _ in grown}
    del g.node[:]
    g.node.extend(n for n in body.node if not set(n.output) & drop_out)
    del g.input[:]
    g.input.extend(i for i in body.input if i.name not in drop_in)
    del g.output[:]
    g.output.extend(o for o in body.output if o.name not in drop_out)
    for _, _, y in grown:
        g.output.append(onnx.helper.make_value_info(y, onnx.TypeProto()))
    gone = {k for k, _, _ in grown}
    return g, [v for j, v in enumerate(ins) if j < 2 or (j - 2) not in gone], [ins[2 + k] for k, _, _ in grown]


def _with_grown(im, res, n_state, grown, inits):
    """The Loop's outputs in the node's order from those of the rewritten body (`_without_grown`):
    each grown value its initial value followed by the pieces, joined along its axis."""
    b = im.b
    n_scan = len(res) - n_state - len(grown)
    states, scans, pieces = res[:n_state], res[n_state : n_state + n_scan], res[n_state + n_scan :]
    out = list(states)
    for (k, axis, _), stack, init in zip(grown, pieces, inits):
        if isinstance(stack, np.ndarray):  # no iteration ran
            v = init
        else:
            shape = list(stack.shape)  # [count, *piece]
            if axis:
                perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(shape)))
                stack = b.transpose(stack, permutation=perm)
                shape = [shape[p] for p in perm]
            v = b.reshape(stack, shape[:axis] + [shape[axis] * shape[axis + 1]] + shape[axis + 2 :])
            if not (isinstance(init, np.ndarray) and init.shape[axis] == 0):
                v = b.concat([X(im, init, v), v], axis)
        out.insert(k, v)
    return out + scans


def _computes_condition(body):
    """Whether a Loop body computes its exit condition (not just passing the one it gets, or a
    constant true)."""
    out = body.output[0].name
    cond_in = body.input[1].name if len(body.input) > 1 else None
    for _ in range(len(body.node) + 1):
        if out == cond_in:
            return False
        prod_node = next((n for n in body.node if out in n.output), None)
        if prod_node is None:
            init = next((t for t in body.initializer if t.name == out), None)
            return init is None or not bool(np.all(numpy_helper.to_array(init)))
        if prod_node.op_type == "Identity":
            out = prod_node.input[0]
            continue
        if prod_node.op_type == "Constant" and prod_node.attribute:
            a = prod_node.attribute[0]
            return not (a.name == "value" and bool(np.all(numpy_helper.to_array(a.t))))
        return True
    return True


def _executed_results(im, got, n_state, n_scan, out_axes, out_dirs):
    """The outputs of an executed Loop/Scan from its step's outcome: the final state, and each
    scan output ([count, padded row] on the GPU) cut to its rows, shaped, reversed and moved to
    its axis as the node asks."""
    values, operands = got
    b = im.b
    res = list(operands[:n_state])
    for j in range(n_scan):
        shape = [int(d) for d in np.asarray(values[1 + j]).reshape(-1)]
        v = operands[n_state + j]
        if isinstance(v, np.ndarray):  # no iteration ran: empty
            res.append(v)
            continue
        elems = prod(shape)
        rows = v.shape[0]  # the count, or a dynamic dimension standing for every count
        if v.shape[1] != elems:
            v = b.slice(v, [0, 0], [rows, elems])
        v = b.reshape(v, [rows] + shape)
        if out_dirs[j]:
            v = b.reverse(v, axes=[0])
        axis = norm_axis(out_axes[j], len(shape) + 1)
        if axis:
            perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(shape) + 1))
            v = b.transpose(v, permutation=perm)
        res.append(v)
    return res


def _bind_body(im, body, values):
    for init in body.initializer:
        im.env[init.name] = im._tensor(init)
    for vi, v in zip(body.input, values):
        im.env[vi.name] = v
    im.run_nodes(body.node, im.cur_opset)
    for o in body.output:
        if o.name not in im.env:
            im.malformed(f"loop body output {o.name!r} is not produced by any node of the body")
    return [im.env[o.name] for o in body.output]


def _stack(im, items, axis=0):
    """Scan outputs of every iteration stacked along a new axis."""
    b = im.b
    ops = [X(im, v) for v in items]
    if not ops:
        unsupported("a loop with zero iterations has empty scan outputs (WebNN has no empty tensors)")
    r = len(ops[0].shape)
    axis = norm_axis(axis, r + 1)
    parts = [b.reshape(o, list(o.shape[:axis]) + [1] + list(o.shape[axis:])) for o in ops]
    return b.concat(parts, axis) if len(parts) > 1 else parts[0]


def _unroll_loop(im, node, ins, attrs, trips):
    """The loop unrolled, or None once an iteration's condition is only known at run time."""
    body = attrs["body"]
    cond = ins[1] if len(ins) > 1 else None
    carried = list(ins[2:])
    go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    scans = []
    i = 0
    base = resume.loop_base(im)
    while go and i < trips:
        try:
            with resume.iteration(im, base, i):
                outs = _bind_body(im, body, [np.array(i, np.int64), np.array(go)] + carried)
        except resume.Cut as c:
            _batch_reads(im, body, c, base, i, trips, carried)
            raise
        c = outs[0]
        if not isinstance(c, np.ndarray):
            return None  # the exit condition is computed on the GPU: executed instead
        go = bool(c.reshape(-1)[0])
        carried = outs[1 : 1 + len(carried)]
        scans.append(outs[1 + len(carried) :])
        i += 1
    n_scan = len(body.output) - 1 - len(carried)
    stacked = [_stack(im, [s[k] for s in scans]) for k in range(n_scan)]
    return carried + stacked


def _batch_reads(im, body, c, base, i, trips, carried):
    """A read cut in iteration i of an unrolled loop, made by a node of the body that reads no
    loop-carried value (nor the condition): the same node cuts in every later iteration on a value
    computed the same way (torchvision's paste-masks loop: a Resize to each detection's box, then
    Slices and zeros of computed sizes). The stage then reads them all at once (c.read grows,
    c.batch says whose each value is): one stage for all the iterations, where one stage per
    iteration re-imported every iteration before it (quadratic in the trip count: Mask R-CNN's
    100 detections). The later iterations are imported up to that node (probes, dead in this
    stage's graph); batching stops at the first iteration that cuts elsewhere."""
    node = im.node
    if c.loop is not None or c.counted is not None or c.carry or not c.read or c.batch is not None:
        return
    if not any(n is node for n in body.node) or _reads_state(body, node):
        return
    saved = im.node, im.cur_opset
    reads, batch = list(c.read), [(c.key, len(c.read))]
    for j in range(i + 1, trips):
        try:
            with resume.iteration(im, base, j):
                _bind_body(im, body, [np.array(j, np.int64), np.array(True)] + carried)
        except resume.Cut as cj:
            same = len(cj.key) == len(c.key) and cj.key[-1] == c.key[-1] and len(cj.read) == len(c.read)
            if same and im.node is node and cj.loop is None and cj.counted is None and not cj.carry:
                reads += cj.read
                batch.append((cj.key, len(cj.read)))
                continue
        except Exception:  # (the iteration's own import meets it again, if it is real)
            pass
        break
    im.node, im.cur_opset = saved
    c.read, c.batch = reads, batch


def _reads_state(body, node):
    """Whether body node `node` depends on the loop-carried values or the condition."""
    dep = {vi.name for vi in body.input[1:]}
    for n in body.node:
        if dep.intersection(n.input) or dep.intersection(outer_names(n)):
            if n is node:
                return True
            dep.update(o for o in n.output if o)
        if n is node:
            return False
    return False


def _scan(im, node, ins, attrs):
    if im.cur_opset < 9:
        return _scan8(im, node, ins, attrs)
    body = attrs["body"]
    n_in = attrs["num_scan_inputs"]
    states = list(ins[: len(ins) - n_in])
    xs = [X(im, v) for v in ins[len(ins) - n_in :]]
    in_axes = attrs.get("scan_input_axes") or [0] * n_in
    in_dirs = attrs.get("scan_input_directions") or [0] * n_in
    n_out = len(body.output) - len(states)
    out_axes = attrs.get("scan_output_axes") or [0] * n_out
    out_dirs = attrs.get("scan_output_directions") or [0] * n_out
    axes = [norm_axis(a, len(x.shape)) for a, x in zip(in_axes, xs)]
    lengths = {x.shape[a] for x, a in zip(xs, axes)}
    if len(lengths) != 1:
        im.malformed(f"scan inputs have different lengths {sorted(lengths)}")
    (steps,) = lengths
    return _scan_run(im, node, body, states, xs, axes, in_dirs, out_axes, out_dirs, steps, steps > MAX_UNROLL)


def _scan_run(im, node, body, states, xs, axes, in_dirs, out_axes, out_dirs, steps, execute):
    """One Scan (opset 9's form) of `steps` iterations: unrolled into the graph, or executed on
    the GPU (a cut; `execute`). Returns the final states and the scan outputs."""
    b = im.b
    n_out = len(body.output) - len(states)
    got = resume.outcome(im)
    if got is not None:  # executed
        return _executed_results(im, got, len(states), n_out, out_axes, out_dirs)
    if execute:
        return _execute_scan(im, node, body, states, xs, axes, in_dirs, steps, n_out)
    scans = []
    for t in range(steps):
        slices = []
        for x, a, d in zip(xs, axes, in_dirs):
            k = steps - 1 - t if d else t
            start = [0] * len(x.shape)
            start[a] = k
            size = list(x.shape)
            size[a] = 1
            sl = b.slice(x, start, size)
            slices.append(b.reshape(sl, [s for j, s in enumerate(x.shape) if j != a]))
        outs = _bind_body(im, body, states + slices)
        states = outs[: len(states)]
        scans.append(outs[len(states) :])
    res = list(states)
    for k in range(n_out):
        items = [s[k] for s in scans]
        if out_dirs[k]:
            items = items[::-1]
        res.append(_stack(im, items, out_axes[k]))
    return res


def _scan8(im, node, ins, attrs):
    """Scan of opset 8: every state, scan input and scan output has a leading batch axis (scan
    inputs [batch, sequence, ...]), and the optional first input sequence_lens gives each batch
    entry's length (1 to the sequence axis' size, as onnxruntime checks). Each batch entry is a
    Scan of opset 9's form over its first length elements (a reversed input read from its
    length back: `directions`); its scan outputs, in iteration order, are zero past its length
    (as onnxruntime), and the entries are stacked back on the batch axis. All entries are
    unrolled when their lengths add up to at most MAX_UNROLL, else each is executed (a cut
    each, one after the other; the lengths must then be known when the graph is built: a
    computed sequence_lens is read back first)."""
    body = attrs["body"]
    n_in = attrs["num_scan_inputs"]
    b = im.b
    rest = ins[1:]
    states = list(rest[: len(rest) - n_in])
    xs = [X(im, v) for v in rest[len(rest) - n_in :]]
    dirs = list(attrs.get("directions") or [0] * n_in)
    if len(dirs) != n_in:
        im.malformed(f"directions has {len(dirs)} entries for {n_in} scan inputs")
    if any(len(x.shape) < 2 for x in xs):
        im.malformed("a scan input must have a batch axis and a sequence axis")
    batch = {x.shape[0] for x in xs} | {v.shape[0] for v in states if v is not None and len(v.shape)}
    seq = {x.shape[1] for x in xs}
    if len(batch) != 1 or len(seq) != 1 or any(v is None or not len(v.shape) for v in states):
        im.malformed(
            f"states and scan inputs must share the batch axis, scan inputs the sequence axis "
            f"(batch sizes {sorted(batch)}, sequence lengths {sorted(seq)})"
        )
    (nb,), (steps,) = batch, seq
    lens = const(im, ins[0], "sequence_lens") if ins and ins[0] is not None else None
    if lens is None:
        lens = [steps] * nb
    else:
        lens = [int(v) for v in np.asarray(lens).reshape(-1)]
        if len(lens) != nb or any(not 1 <= v <= steps for v in lens):
            im.malformed(f"sequence_lens {lens} must hold {nb} lengths in [1, {steps}] (the sequence axis)")
    n_out = len(body.output) - len(states)
    execute = sum(lens) > MAX_UNROLL

    def entry(v, k):  # batch entry k of a state or scan input, without the batch axis
        if isinstance(v, np.ndarray):
            return v[k]
        return b.reshape(b.slice(v, [k] + [0] * (len(v.shape) - 1), [1] + list(v.shape[1:])), list(v.shape[1:]))

    finals, scans = [], []
    for k, n in enumerate(lens):
        st = [entry(v, k) for v in states]
        xk = []
        for x in xs:
            x = entry(x, k)
            if n < steps:
                x = b.slice(x, [0] * len(x.shape), [n] + list(x.shape[1:]))
            xk.append(x)
        res = _scan_run(im, node, body, st, xk, [0] * n_in, dirs, [0] * n_out, [0] * n_out, n, execute)
        finals.append(res[: len(states)])
        outs = []
        for y in res[len(states) :]:
            y = X(im, y)
            if n < steps:  # zeros past the entry's length
                y = b.pad(y, [0] * len(y.shape), [steps - n] + [0] * (len(y.shape) - 1))
            outs.append(y)
        scans.append(outs)
    res = [_stack(im, [f[j] for f in finals]) for j in range(len(states))]
    res += [_stack(im, [s[j] for s in scans]) for j in range(n_out)]
    return res


def _execute_scan(im, node, body, states, xs, axes, in_dirs, steps, n_out):
    """Cut at the Scan: each scan input laid out [steps, row] (its axis first, rows padded to whole
    4-byte words for the per-iteration copies, stages/loop.py), executed on the GPU."""
    b = im.b
    rows, scan_in = [], []
    for x, a, d in zip(xs, axes, in_dirs):
        if a:
            perm = [a] + [i for i in range(len(x.shape)) if i != a]
            x = b.transpose(x, permutation=perm)
        shape = [int(s) for s in x.shape[1:]]
        elems = prod(shape)
        pad = loop._padded_row(elems, dtypes.itemsize(x.data_type))
        x = b.reshape(x, [steps, elems])
        if pad != elems:
            x = b.pad(x, [0, 0], [0, pad - elems])
        elif x._kind != "op":
            x = b.identity(x)
        rows.append(x)
        scan_in.append((elems, shape, bool(d)))
    ops, host = _outer(im, node)
    spec = loop.LoopSpec(
        "scan",
        node,
        body,
        im.model,
        im.cur_opset,
        trips=steps,
        n_state=len(states),
        n_scan_out=n_out,
        outer=ops,
        outer_host=host,
        scan_in=scan_in,
    )
    carry = list(states) + rows + [im.env[n] for n in ops]
    resume.cut(im, carry=carry, loop=spec, what=f"Scan {node.name or '(unnamed)'!r}")
