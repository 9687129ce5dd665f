"""ONNX operators whose output size is a count computed from the values: NonZero, Compress,
NonMaxSuppression, Unique.

The selection runs on the GPU (mltensor/ops/select.py: a compaction, a greedy NMS; sorts for
Unique) into outputs of the largest possible size plus a count; the graph is cut there
(mltensor/stages/): only the count (4 bytes) is read back, and the rest of the model is built
for it, once per distinct count. A condition or box set known at load is folded on the host
instead.
"""

import numpy as np
from onnx import helper

from ...dynamic.dims import Sym
from .. import resume
from ..errors import unsupported
from ._helpers import X, const, norm_axis, prod
from ._registry import op


def _selected(im, node, make, drop, axis):
    """(count, padded operand): the outcome of this node's selection cut, cutting the first time
    (`make()` builds (padded, count) then; the count's entries lead along `axis`). count is None
    when the stage is built for every count: the operand then already has the count's size (a
    dynamic dimension, stages/plan.py)."""
    got = resume.outcome(im)
    if got is None:
        padded, count = make()
        counted = (0, axis) if axis is not None else None
        resume.cut(im, read=[count], carry=[padded], what=f"{node.op_type}'s count", drop_inputs=drop, counted=counted)
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
        return im.b._nms(
            boxes, scores, max_per_class=max_pc, iou_threshold=iou, score_threshold=score, center_point_box=cpb
        )

    n, sel = _selected(im, node, make, drop=(0, 1), axis=0)
    if n is None:
        return sel
    if n == 0:
        return np.zeros((0, 3), np.int64)
    return im.b.slice(sel, [0, 0], [n, 3])


# Prefix doubling (_row_keys) multiplies two ranks below n: int32 while n * n fits it.
KEY32_MAX_N = 46340


@op("Unique", attrs=("axis", "sorted"))
def _unique(im, node, ins, attrs):
    """Unique on the GPU, its count U read back (a cut); as the ONNX reference (numpy's unique).

    Every element (flattened form) or slice along `axis` gets a sort key whose ascending order
    is the output order: the element itself, or for slices the rank of the slice among all
    slices in lexicographic order (`_row_keys`). The keys are sorted (mltensor/ops/sort.py's
    `_topk` over all n keys, ties to the lower index, so each run of equal keys starts at its
    first occurrence), the first of each run marked, the marks compacted (`_nonzero`); their
    count U is read back and the outputs built for it: indices gathered at the run starts, Y
    gathered from the input at those indices, counts from the gaps between starts,
    inverse_indices scattered from the running count of starts. sorted=0 reorders the U uniques
    by first occurrence with a second sort.

    NaN, as numpy: the flattened form counts every NaN as one value (np.unique's equal_nan,
    sorted last); a slice holding a NaN equals no slice, itself neither (NaN sorts as equal to
    NaN and after every number, so such slices still take their lexicographic place).
    onnxruntime compares NaN with `<` in a std::map, whose answer depends on the input order."""
    b = im.b
    axis = attrs.get("axis")
    got = resume.outcome(im)
    if got is None:
        x = X(im, ins[0])
        if axis is not None:
            axis = norm_axis(axis, len(x.shape))
        n = x.shape[axis] if axis is not None else prod(x.shape)
        if n == 1:  # a single element or slice: no sort, no cut
            y = x if axis is not None else b.reshape(x, [1])
            one = np.ones(1, np.int64)
            return [y, one - 1, one - 1, one]
        if axis is None:
            src = b.reshape(x, [n])
            key, has_nan = src, None
        else:
            src = x
            perm = [axis] + [d for d in range(len(x.shape)) if d != axis]
            rows = b.reshape(b.transpose(x, permutation=perm) if axis else x, [n, prod(x.shape) // n])
            key = _row_keys(b, rows)
            # a slice holding a NaN is unique (NaN equals nothing): its run starts at it
            has_nan = b.reduce_max(b.is_nan(rows), axes=[1], keep_dimensions=False) if _floats(rows) else None
        v, idx = b._topk(key, k=n, axis=0, largest=False)
        ne = _changes(b, v, nan_equal=axis is None)
        flags = b.concat([b.constant(np.ones(1, np.uint8)), ne], 0)
        if has_nan is not None:
            flags = b.logical_or(flags, b.gather(has_nan, idx, axis=0))
        pos, count = b._nonzero(flags)
        resume.cut(im, read=[count], carry=[pos, idx, flags, src], what="Unique's count", drop_inputs=(0,))
    (count,), (pos, idx, flags, src) = got
    if axis is not None:
        axis = norm_axis(axis, len(src.shape))
    u, n = int(np.asarray(count).reshape(-1)[0]), idx.shape[0]
    p = b.reshape(b.slice(pos, [0, 0], [1, u]), [u])
    first = b.gather(idx, p, axis=0)
    last = b.constant(np.array([n], np.int64))
    ends = b.concat([b.slice(p, [1], [u - 1]), last], 0) if u > 1 else last
    counts = b.sub(ends, p)
    uid = b.sub(b.cumulative_sum(b.cast(flags, "int32"), 0), b.constant(np.array(1, np.int32)))
    inverse = b.scatter_elements(b.constant(np.zeros(n, np.int32)), idx, uid, axis=0)
    if not attrs.get("sorted", 1) and u > 1:  # in order of first occurrence
        first, perm = b._topk(first, k=u, axis=0, largest=False)
        counts = b.gather(counts, perm, axis=0)
        rank = b.scatter_elements(
            b.constant(np.zeros(u, np.int32)), perm, b.constant(np.arange(u, dtype=np.int32)), axis=0
        )
        inverse = b.gather(rank, inverse, axis=0)
    y = b.gather(src, first, axis=axis or 0)
    return [y, first, b.cast(inverse, "int64"), counts]


def _floats(x):
    return x.data_type.startswith("float")


def _changes(b, v, nan_equal):
    """uint8 [n - 1]-like along axis 0: 1 where v differs from the entry before it (NaN equals
    NaN when nan_equal: sorted, they are adjacent)."""
    n = v.shape[0]
    rest = list(v.shape[1:])
    cur = b.slice(v, [1] + [0] * len(rest), [n - 1] + rest)
    prev = b.slice(v, [0] * (1 + len(rest)), [n - 1] + rest)
    ne = b.not_equal(cur, prev)
    if nan_equal and _floats(v):
        ne = b.logical_and(ne, b.logical_not(b.logical_and(b.is_nan(cur), b.is_nan(prev))))
    return ne


def _dense_ranks(b, r, nan_equal):
    """Each entry of r [n, m] replaced by its dense rank in its column (int32 in [0, n): equal
    entries share a rank, the ranks keep the order): a sort of every column, the changes
    counted along it, scattered back to the entries' rows."""
    n, m = r.shape
    s, si = b._topk(r, k=n, axis=0, largest=False)
    ne = _changes(b, s, nan_equal)
    d = b.cumulative_sum(b.cast(b.concat([b.constant(np.zeros((1, m), np.uint8)), ne], 0), "int32"), 0)
    return b.scatter_elements(b.constant(np.zeros((n, m), np.int32)), si, d, axis=0)


def _row_keys(b, rows):
    """[n] keys whose ascending order is the lexicographic order of the rows of rows [n, m]
    (equal rows, equal keys), by prefix doubling: each column becomes the dense rank of its
    entries (< n), then adjacent columns pair up as hi * n + lo (ordered as the pair, below n^2)
    and are ranked again, halving the columns until one is left. ceil(log2 m) + 1 sorts of
    shrinking matrices, about two sorts of n * m elements in all, each a GPU sort of whole
    columns: no hashing (no collisions to rule out) and no per-column pass over the rows (m
    dispatches for m columns). Floats: -0 equals +0, NaN sorts after every number as one value
    (the caller makes a slice with a NaN unique)."""
    n, m = rows.shape
    if m == 1:
        return b.reshape(rows, [n])
    kt = "int32" if n <= KEY32_MAX_N else "int64"
    r = _dense_ranks(b, rows, nan_equal=True)
    while True:
        if m % 2:  # an odd column pairs with a column of zeros (a constant rank: no change in order)
            r = b.concat([r, b.constant(np.zeros((n, 1), np.int32))], 1)
            m += 1
        m //= 2
        # (a strided slice's sizes span the input: 2m - 1 entries give m)
        hi = b.cast(b.slice(r, [0, 0], [n, 2 * m - 1], strides=[1, 2]), kt)
        lo = b.cast(b.slice(r, [0, 1], [n, 2 * m - 1], strides=[1, 2]), kt)
        k = b.add(b.mul(hi, b.constant(np.array(n, kt))), lo)
        if m == 1:
            return b.reshape(k, [n])
        r = _dense_ranks(b, k, nan_equal=False)
