"""
A first graph: tensors, a graph, dispatch, readback
===================================================

``examples/hello.py``, run as it is: a context on the default adapter, a three-operator graph
(``relu(x * w + 1)``, fused into one kernel), a dispatch and a read. ``graph.kernel_names`` shows
the kernels one dispatch launches after fusion; ``ctx.counters`` the bytes moved and launches made.
"""

import os
import runpy

import mltensor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(mltensor.__file__)))  # the repository
runpy.run_path(os.path.join(ROOT, "examples", "hello.py"), run_name="__main__")
