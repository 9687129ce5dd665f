"""Graph compiler: runs in build. passes.py (dead nodes, constants, fusion) -> lower.py (kernels
per step, edge conversions, memory plan) -> build.py (compile_graph: a Program, launches bound up
front, runtime/program.py; front/graph.py MLGraph dispatches it)."""
