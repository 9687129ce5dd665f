"""ONNX operators whose output size is a count computed from the values: NonZero, Compress,
NonMaxSuppression.

The selection runs on the GPU (mltensor/ops/select.py: a compaction, a greedy NMS) into outputs
of the largest possible size plus a count; the graph is cut there (mltensor/stages/): only the
count (4 bytes) is read back, and the rest of the model is built for it, once per distinct
count. A condition or box set known at load is folded on the host instead.
"""

import numpy as np
from onnx import helper

from ...dynamic.dims import Sym
from ...stages import cut as stages_cut
from . import X, const, norm_axis, op, prod, unsupported


def _selected(im, node, make, drop, axis):
    """(count, padded operand): the outcome of this node's selection cut, cutting the first time
    (`make()` builds (padded, count) then; the count's entries lead along `axis`). count is None
    when the stage is built for every count: the operand then already has the count's size (a
    dynamic dimension, stages/plan.py)."""
    got = stages_cut.outcome(im)
    if got is None:
        padded, count = make()
        counted = (0, axis) if axis is not None else None
        stages_cut.cut(im, read=[count], carry=[padded], what=f"{node.op_type}'s count", drop_inputs=drop,
                       counted=counted)
    (count,), (padded,) = got
    if any(isinstance(d, Sym) for d in padded.shape):
        return None, padded
    return int(np.asarray(count).reshape(-1)[0]), padded


@op("NonZero")
def _nonzero(im, node, ins, attrs):
    # (a value known at load was folded by the importer already)
    # (a count over one axis leads the padded indices: a dynamic dimension is possible there)
    one_axis = ins[0] is not None and len(ins[0].shape) <= 1
    n, idx = _selected(im, node, lambda: im.b._nonzero(X(im, ins[0])), drop=(0,), axis=1 if one_axis else None)
    rows = idx.shape[0]
    if n is None:
        return idx
    if n == 0:
        return np.zeros((rows, 0), np.int64)
    return im.b.slice(idx, [0, 0], [rows, n])


@op("Compress", attrs=("axis",))
def _compress(im, node, ins, attrs):
    x = X(im, ins[0])
    if "axis" not in attrs:
        x = im.b.reshape(x, [prod(x.shape)])
        axis = 0
    else:
        axis = norm_axis(attrs["axis"], len(x.shape))
    cond = ins[1]
    if isinstance(cond, np.ndarray):
        idx = np.nonzero(cond.astype(bool).reshape(-1))[0].astype(np.int32)
        idx = idx[idx < x.shape[axis]]
        if idx.size == 0:
            return _empty(im, x, axis)
        return im.b.gather(x, X(im, idx), axis=axis)
    if cond is not None:  # (None once resumed after the cut: the condition is not kept for it)
        if len(cond.shape) != 1:
            im.malformed(f"condition must be 1-D, got shape {list(cond.shape)}")
        if cond.shape[0] > x.shape[axis]:
            im.malformed(f"condition has {cond.shape[0]} entries, more than the {x.shape[axis]} of the axis")
    n, idx = _selected(im, node, lambda: im.b._nonzero(X(im, cond)), drop=(1,), axis=1)
    if n == 0:
        return _empty(im, x, axis)
    if n is None:
        idx = im.b.reshape(idx, [idx.shape[1]])
    else:
        idx = im.b.reshape(im.b.slice(idx, [0, 0], [1, n]), [n])
    return im.b.gather(x, idx, axis=axis)


def _empty(im, x, axis):
    """An empty result: a host array (WebNN has no empty tensors)."""
    shape = list(x.shape)
    shape[axis] = 0
    return np.zeros(shape, helper.tensor_dtype_to_np_dtype(im.onnx_type(x)))


@op("NonMaxSuppression", attrs=("center_point_box",))
def _nms(im, node, ins, attrs):
    def number(i, what, default):
        v = ins[i] if len(ins) > i else None
        v = const(im, v, what)
        return default if v is None or v.size == 0 else np.asarray(v).reshape(-1)[0]

    # the parameters first (a computed one is read back: its cut comes before the selection's)
    max_pc = int(number(2, "max_output_boxes_per_class", 0))
    iou = float(np.float32(number(3, "iou_threshold", 0.0)))
    score = number(4, "score_threshold", None)
    score = None if score is None else float(np.float32(score))
    cpb = int(attrs.get("center_point_box", 0))
    if cpb not in (0, 1):
        unsupported(f"center_point_box must be 0 or 1, got {cpb}")

    def make():
        boxes, scores = X(im, ins[0]), X(im, ins[1])
        if len(boxes.shape) != 3 or len(scores.shape) != 3:
            im.malformed(f"boxes {list(boxes.shape)} and scores {list(scores.shape)} must be 3-D")
        if boxes.data_type != "float32":
            boxes = im.b.cast(boxes, "float32")
        if scores.data_type != "float32":
            scores = im.b.cast(scores, "float32")
        return im.b._nms(boxes, scores, max_per_class=max_pc, iou_threshold=iou, score_threshold=score,
                         center_point_box=cpb)

    n, sel = _selected(im, node, make, drop=(0, 1), axis=0)
    if n is None:
        return sel
    if n == 0:
        return np.zeros((0, 3), np.int64)
    return im.b.slice(sel, [0, 0], [n, 3])


@op("Unique", attrs=("axis", "sorted"))
def _unique(im, node, ins, attrs):
    """The flattened form: sort (mltensor/ops/sort.py's `_topk` over all N values, ties to the
    lower index, so each run of equal values starts at its first occurrence), mark the first of
    each run, compact those marks (`_nonzero`); their count U is read back and the outputs built
    for it: Y and indices gathered at the run starts, counts from the gaps between starts,
    inverse_indices scattered from the running count of starts. sorted=0 reorders the U values
    by first occurrence with a second sort."""
    if attrs.get("axis") is not None:
        unsupported("Unique along an axis is not supported (only the flattened form, no axis)")
    b = im.b
    got = stages_cut.outcome(im)
    if got is None:
        x = X(im, ins[0])
        n = prod(x.shape)
        v, idx = b._topk(b.reshape(x, [n]), k=n, axis=0, largest=False)
        if n == 1:
            flags = b.constant(np.ones(1, np.uint8))
        else:
            ne = b.not_equal(b.slice(v, [1], [n - 1]), b.slice(v, [0], [n - 1]))
            flags = b.concat([b.constant(np.ones(1, np.uint8)), ne], 0)
        pos, count = b._nonzero(flags)
        stages_cut.cut(im, read=[count], carry=[pos, v, idx, flags], what="Unique's count", drop_inputs=(0,))
    (count,), (pos, v, idx, flags) = got
    u, n = int(np.asarray(count).reshape(-1)[0]), v.shape[0]
    p = b.reshape(b.slice(pos, [0, 0], [1, u]), [u])
    y = b.gather(v, p, axis=0)
    first = b.gather(idx, p, axis=0)
    last = b.constant(np.array([n], np.int64))
    ends = b.concat([b.slice(p, [1], [u - 1]), last], 0) if u > 1 else last
    counts = b.sub(ends, p)
    uid = b.sub(b.cumulative_sum(b.cast(flags, "int32"), 0), b.constant(np.array(1, np.int32)))
    inverse = b.scatter_elements(b.constant(np.zeros(n, np.int32)), idx, uid, axis=0)
    if not attrs.get("sorted", 1):  # in order of first occurrence
        first, perm = b._topk(first, k=u, axis=0, largest=False)
        y, counts = b.gather(y, perm, axis=0), b.gather(counts, perm, axis=0)
        rank = b.scatter_elements(b.constant(np.zeros(u, np.int32)), perm,
                                  b.constant(np.arange(u, dtype=np.int32)), axis=0)
        inverse = b.gather(rank, inverse, axis=0)
    return [y, first, b.cast(inverse, "int64"), counts]
