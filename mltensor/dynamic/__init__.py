"""Dynamic dimensions (webnn issue #883): sizes chosen at dispatch, one build for every size.

dims.py      MLDynamicDimension, and Sym: the size expressions derived from it (past + 1, 12*seq)
kernels.py   how kernels read sizes at dispatch (immediate data) and how launches are sized
plan.py      what a dispatch of such a graph checks and computes (DynamicPlan, compute_shapes)

Which operators accept dynamic dimensions: each operator family (mltensor/ops/<family>.py) lists
its MLGraphBuilder methods whose shape inference and kernels handle them in a module-level
`DYNAMIC_OPS`; the ops/ loader gathers them into `ir.registry.DYNAMIC`. Any other operator given an
operand with a dynamic dimension raises NotSupportedError naming itself (ir/registry.py builder_op).
"""
