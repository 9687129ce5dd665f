"""ONNX control flow: If, Loop, Scan."""

import numpy as np

from . import const, input_leaves, mark_bool, norm_axis, op, prod, unsupported, X


@op("If", attrs=("then_branch", "else_branch"))
def _if(im, node, ins, attrs):
    """A condition known at load takes its branch. One decided by small integer/bool graph
    inputs (a sample rate, a flag) specializes the session to their values (NeedsValue). Any
    other computed condition runs both branches and selects with `where`, which needs both to give
    the same shapes and types."""
    cond = ins[0]
    if isinstance(cond, np.ndarray) or _decided_by_small_inputs(cond):
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
    res = []
    for o, t, e in zip(node.output, outs_t, outs_e):
        t_op = X(im, t) if t is not None else None
        e_op = X(im, e, t_op) if e is not None else None
        if t_op is None or e_op is None or tuple(t_op.shape) != tuple(e_op.shape) \
                or t_op.data_type != e_op.data_type:
            def desc(v):
                return "nothing" if v is None else f"{v.data_type} {list(v.shape)}"
            unsupported(f"the condition is only known at run time and output {o!r} differs between the "
                        f"branches ({desc(t_op)} vs {desc(e_op)}), so they cannot be selected with where")
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


def _decided_by_small_inputs(v):
    """Whether an operand is computed only from graph inputs that are small integer or bool
    tensors (at most 16 elements): worth specializing the graph to their values."""
    leaves = input_leaves(v)
    return bool(leaves) and all(not o.data_type.startswith("float") and prod(o.shape) <= 16 for o in leaves)


# Unrolling copies the body once per iteration into the graph: beyond this many, refuse.
MAX_UNROLL = 256


@op("Loop", "Scan", attrs=None)
def _control_flow(im, node, ins, attrs):
    """Loops on values all known at load run then (trip counts and carried values included).
    Otherwise a loop whose trip count is known at load is unrolled into the graph."""
    if all(v is None or isinstance(v, np.ndarray) for v in ins):
        try:
            return im.evaluate(node, ins)
        except ValueError as e:
            unsupported(f"the loop body reads a value computed in the graph ({e})")
    if node.op_type == "Loop":
        return _unroll_loop(im, node, ins, attrs)
    return _unroll_scan(im, node, ins, attrs)


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


def _unroll_loop(im, node, ins, attrs):
    body = attrs["body"]
    m = ins[0] if ins else None
    cond = ins[1] if len(ins) > 1 else None
    carried = list(ins[2:])
    if m is None:
        unsupported("a Loop without a trip count known at load cannot be unrolled")
    trips = int(const(im, m, "trip count M").reshape(-1)[0])
    if cond is not None:
        cond = const(im, cond, "the loop's initial condition")
    if trips > MAX_UNROLL:
        unsupported(f"trip count {trips} is above {MAX_UNROLL}, the most iterations unrolled")
    go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    scans = []
    i = 0
    while go and i < trips:
        outs = _bind_body(im, body, [np.array(i, np.int64), np.array(go)] + carried)
        c = outs[0]
        if not isinstance(c, np.ndarray):
            unsupported("the loop's exit condition is computed at run time (only trip counts known at "
                        "load are unrolled)")
        go = bool(c.reshape(-1)[0])
        carried = outs[1:1 + len(carried)]
        scans.append(outs[1 + len(carried):])
        i += 1
    n_scan = len(body.output) - 1 - len(carried)
    stacked = [_stack(im, [s[k] for s in scans]) for k in range(n_scan)]
    return carried + stacked


def _unroll_scan(im, node, ins, attrs):
    if im.cur_opset < 9:
        unsupported("Scan before opset 9 (batch axis and sequence_lens) is not supported")
    body = attrs["body"]
    n_in = attrs["num_scan_inputs"]
    states = list(ins[:len(ins) - n_in])
    xs = [X(im, v) for v in ins[len(ins) - n_in:]]
    in_axes = attrs.get("scan_input_axes") or [0] * n_in
    in_dirs = attrs.get("scan_input_directions") or [0] * n_in
    n_out = len(body.output) - len(states)
    out_axes = attrs.get("scan_output_axes") or [0] * n_out
    out_dirs = attrs.get("scan_output_directions") or [0] * n_out
    b = im.b
    axes = [norm_axis(a, len(x.shape)) for a, x in zip(in_axes, xs)]
    lengths = {x.shape[a] for x, a in zip(xs, axes)}
    if len(lengths) != 1:
        im.malformed(f"scan inputs have different lengths {sorted(lengths)}")
    (steps,) = lengths
    if steps > MAX_UNROLL:
        unsupported(f"{steps} scan steps is above {MAX_UNROLL}, the most iterations unrolled")
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
        states = outs[:len(states)]
        scans.append(outs[len(states):])
    res = list(states)
    for k in range(n_out):
        items = [s[k] for s in scans]
        if out_dirs[k]:
            items = items[::-1]
        res.append(_stack(im, items, out_axes[k]))
    return res
