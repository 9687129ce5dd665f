"""What fusion left undone, for MLGraph.fusion_report(): each softmax the attention pass did not
fuse (with the check that failed, fusion/attention.py), each transpose that still launches a copy,
and each elementwise kernel that reads a GEMM's or convolution's output instead of being applied
as that kernel stores it."""

from ...ir.registry import OPS

GEMMS = ("matmul", "gemm", "conv2d", "conv_transpose2d", "_fused_matmul", "_attention")


def unfused(steps, attention_notes, consumers, out_values):
    """[(kind, node, reason)] for the planned `steps` (module doc); `attention_notes`: the
    attention pass's (softmax node, why)."""
    notes = [("attention", n, why) for n, why in attention_notes]
    producer = {id(v): s for s in steps for v in s.outputs}
    for st in steps:
        n = st.nodes[0]
        if st.const or st.epilogue or st.prologue is not None or st.chain:
            continue
        if len(st.nodes) == 1 and n.op == "transpose":
            notes.append(("transpose", n, "a layout copy: not a view a GEMM writes or reads (fusion/gemm_views.py)"))
            continue
        if OPS[n.op].expr is None:
            continue
        for x in n.inputs:
            src = producer.get(id(x)) if x is not None else None
            if src is None or src is st or src.const or src.nodes[0].op not in GEMMS:
                continue
            if id(x) in out_values:
                why = "its input is also a graph output"
            elif len(consumers.get(id(x), ())) > 1:
                why = "its input is read by other nodes too"
            else:
                why = "an operand or a shape the GEMM's stores cannot take"
            chain = "+".join(m.op for m in st.nodes)
            notes.append(("epilogue", n, f"{chain} after {src.nodes[0].op} runs as its own kernel: {why}"))
            break
    return notes
