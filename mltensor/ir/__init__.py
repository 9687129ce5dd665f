"""The graph IR at the bottom of the build path: graph.py (MLOperand, Node and the queries the
compiler and the lowerings share) and registry.py (the operator registry, the builder methods).
Pure Python: imports nothing from the layers above (tests/test_layers.py)."""
