"""ONNX control flow: If, Loop, Scan."""

import numpy as np

from . import const, mark_bool, op, prod, unsupported, X


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
    seen, stack, leaves = set(), [v], 0
    while stack:
        o = stack.pop()
        if o is None or id(o) in seen:
            continue
        seen.add(id(o))
        kind = getattr(o, "_kind", None)
        if kind == "input":
            if o.data_type.startswith("float") or prod(o.shape) > 16:
                return False
            leaves += 1
        elif kind == "op":
            stack.extend(o._node.inputs)
    return leaves > 0


@op("Loop", "Scan", attrs=None)
def _control_flow(im, node, ins, attrs):
    """Loops run at load, on values known then (trip counts and carried values included)."""
    vals = [const(im, v, f"{node.op_type} input") for v in ins]
    try:
        return im.evaluate(node, vals)
    except ValueError as e:
        unsupported(f"the loop body reads a value computed in the graph ({e})")
