"""ONNX TopK (mltensor/ops/sort.py's `_topk`: GPU kernels, onnxruntime's order)."""

import numpy as np
from onnx import helper

from ._helpers import X, ints, norm_axis
from ._registry import op


@op("TopK", attrs=("axis", "k", "largest", "sorted"))
def _topk(im, node, ins, attrs):
    """Opset 1: k is an attribute; 10: an input; 11: `largest` and `sorted`. Indices are int64.
    The result is always sorted (sorted=0 allows any order). k computed at run time is read back
    by `ints` (the graph is cut there); k == 0 gives empty outputs (host arrays: WebNN has no
    empty tensors)."""
    x = X(im, ins[0])
    axis = norm_axis(attrs.get("axis", -1), len(x.shape))
    if im.cur_opset < 10:
        if "k" not in attrs:
            im.malformed("TopK-1 needs the attribute k")
        k = int(attrs["k"])
    else:
        if len(ins) < 2 or ins[1] is None:
            im.malformed("TopK needs the input K")
        ks = ints(im, ins[1], "k")
        if len(ks) != 1:
            im.malformed(f"K must hold one value, got {len(ks)}")
        k = ks[0]
    n = x.shape[axis]
    if not 0 <= k <= n:
        im.malformed(f"k {k} must be in [0, {n}] (the size of axis {axis})")
    largest = bool(attrs.get("largest", 1))
    shape = list(x.shape)
    shape[axis] = k
    if k == 0:
        dt = helper.tensor_dtype_to_np_dtype(im.onnx_type(x))
        return [np.zeros(shape, dtype=dt), np.zeros(shape, dtype=np.int64)]
    values, indices = im.b._topk(x, k=k, axis=axis, largest=largest, sorted=bool(attrs.get("sorted", 1)))
    return [values, indices]
