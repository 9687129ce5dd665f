"""ONNX control flow: If, Loop, Scan."""

from . import const, op, unsupported

@op("If", attrs=("then_branch", "else_branch"))
def _if(im, node, ins, attrs):
    cond = const(im, ins[0], "cond (the branch must be chosen at load)")
    g = attrs["then_branch"] if bool(cond.reshape(-1)[0]) else attrs["else_branch"]
    for init in g.initializer:
        im.env[init.name] = im._tensor(init)
    im.run_nodes(g.node, im.cur_opset)
    return [im.env[o.name] for o in g.output]


@op("Loop", "Scan", attrs=None)
def _control_flow(im, node, ins, attrs):
    """Loops run at load, on values known then (trip counts and carried values included)."""
    vals = [const(im, v, f"{node.op_type} input") for v in ins]
    try:
        return im.evaluate(node, vals)
    except ValueError as e:
        unsupported(f"the loop body reads a value computed in the graph ({e})")
