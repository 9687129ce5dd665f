"""Graph compiler: runs in build and returns a Program (runtime/program.py), never an MLGraph.

build.py (compile_graph: the whole build, in order) -> plan.py (live nodes -> Steps: the node
rewrites, then every fusion, in the one order set there; each fusion is a file in fusion/, the
step model is steps.py) -> lower.py (KernelContext: each step's operator family emits its launches,
edge conversions) -> memory.py (intermediates pooled by liveness). front/graph.py's MLGraph
dispatches the result; the graph cache stores it (graphcache/recipe.py).
"""
