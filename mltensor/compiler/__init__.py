"""Graph compiler: runs in build. passes.py (dead nodes, constants, fusion) -> lower.py (kernels
per step, edge conversions, memory plan) -> program.py (MLGraph: launches bound up front)."""
