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
ns = runpy.run_path(os.path.join(ROOT, "examples", "hello.py"), run_name="__main__")

# %%
# The input and what the graph made of it: ``relu(x * w + 1)`` with ``w = [0.5, -1, 2]``.

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

x = np.arange(6, dtype=np.float32).reshape(2, 3)
y = ns["ctx"].read_tensor_sync(ns["ty"])
assert np.allclose(y, np.maximum(x * np.array([0.5, -1.0, 2.0]) + 1, 0)), y
fig, axes = plt.subplots(1, 2, figsize=(6, 2.4))
for ax, a, title in zip(axes, (x, y), ("x", "y = relu(x * w + 1), on the GPU")):
    ax.imshow(a, cmap="viridis")
    for (i, j), v in np.ndenumerate(a):
        ax.text(j, i, f"{v:g}", ha="center", va="center", color="white")
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()
fig.tight_layout()
plt.show()
