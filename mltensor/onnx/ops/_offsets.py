"""Offsets computed on the GPU whose range is known at build: the iteration number of an executed
Loop (stages/loop.py clamps it to [0, trips - 1], a no-op for every iteration that counts) and the
values derived from it by the few operators exporters put between it and a Slice (Unsqueeze,
Reshape, Cast, Add or Sub of a constant).

A Slice whose starts and ends are such values of one root, `ends - starts` a constant, has a size
known at build and a start read on the GPU: it is a gather of `start + arange(size)` along the
axis (`offset_slice`), no host round trip and no cut, so it runs inside a Loop body executed on
the GPU. Only when the start is proved within [0, dim - size] for every value of the root: there
ONNX's clamping of starts and ends never applies, and the slice has the same size every time."""

import numpy as np

from ...ir.graph import scalar_value
from ...stages.loop import OFFSET_CHECK as CHECKS
from ..types import prod

_SAME_VALUE = ("reshape", "identity", "expand", "cast")


def _one_element(v):
    return v is not None and all(isinstance(d, int) for d in v.shape) and prod(v.shape) == 1


def affine(v):
    """(root operand, integer offset) with v == root + offset (v of one element), following
    same-value operators and additions of integer constants; None when v is not of that form."""
    off = 0
    for _ in range(64):
        if not _one_element(v):
            return None
        if v._kind != "op":  # a graph input (a counter the body carries) or a constant
            return (v, off) if v._kind == "input" else None
        n = v._node
        if n.op in _SAME_VALUE:
            if n.op == "cast" and not _exact_cast(n.inputs[0].data_type, v.data_type):
                return (v, off)
            v = n.inputs[0]
            continue
        if n.op in ("add", "sub") and len(n.inputs) == 2:
            a, c = n.inputs
            ca, cc = scalar_value(a), scalar_value(c)
            if cc is not None and ca is None and float(cc).is_integer():
                off += int(cc) if n.op == "add" else -int(cc)
                v = a
                continue
            if n.op == "add" and ca is not None and cc is None and float(ca).is_integer():
                off += int(ca)
                v = c
                continue
        return (v, off)
    return None


def _exact_cast(src, dst):
    """Whether a cast keeps every value of the small integer ranges this module proves (|v| < 2**24)."""
    wide = ("int32", "uint32", "int64", "uint64", "float32")
    return src in wide + ("int8", "uint8", "float16") and dst in wide


def bounds(root):
    """[lo, hi] of a root's value known at build (a clamp to constant bounds), or None."""
    if root._kind != "op" or root._node.op != "clamp":
        return None
    a = root._node.attrs
    lo, hi = a.get("min_value"), a.get("max_value")
    if lo is None or hi is None or not np.isfinite(lo) or not np.isfinite(hi):
        return None
    return int(np.ceil(lo)), int(np.floor(hi))


def entries(v, n):
    """The n entries of a starts/ends input as one-element operands or ints (a host array, a
    one-element operand, a concat of one-element parts); None when not of that form."""
    if isinstance(v, np.ndarray):
        return [int(x) for x in v.reshape(-1)] if v.size == n else None
    if n == 1 and _one_element(v):
        return [v]
    if v._kind == "op" and v._node.op == "concat" and len(v._node.inputs) == n:
        parts = []
        for p in v._node.inputs:
            if not _one_element(p):
                return None
            c = scalar_value(p)
            parts.append(int(c) if c is not None else p)
        return parts
    return None


def offset_slice(im, x, starts, ends, axes, steps):
    """A Slice whose computed starts are offsets proved in range (module docstring), as gathers;
    None when it is not of that form (the caller then reads the values back, or refuses)."""
    n = len(starts.reshape(-1)) if isinstance(starts, np.ndarray) else prod(starts.shape)
    if not isinstance(n, int) or n < 1:
        return None
    st, en = entries(starts, n), entries(ends, n)
    if st is None or en is None:
        return None
    axes = list(range(n)) if axes is None else list(axes)
    steps = [1] * n if steps is None else list(steps)
    r = len(x.shape)
    if len(axes) != n or len(steps) != n:
        return None
    static_st, static_sz = [0] * r, list(x.shape)
    gathers = []
    for s, e, a, k in zip(st, en, axes, steps):
        a = a + r if a < 0 else a
        if not 0 <= a < r or not isinstance(x.shape[a], int):
            return None
        d = x.shape[a]
        if isinstance(s, int) and isinstance(e, int):
            if k != 1:
                return None
            lo, hi, _ = slice(s, e).indices(d)
            if hi <= lo:
                return None
            static_st[a], static_sz[a] = lo, hi - lo
            continue
        if k != 1 or isinstance(s, int) or isinstance(e, int):
            return None
        fs, fe = affine(s), affine(e)
        if fs is None or fe is None or fs[0] is not fe[0]:
            return None
        size = fe[1] - fs[1]
        if size < 1 or size > d:
            return None
        rng = bounds(fs[0])
        proved = rng is not None and rng[0] + fs[1] >= 0 and rng[1] + fs[1] + size <= d
        if not proved and CHECKS not in im.env:
            return None
        gathers.append((a, s, size, proved))
    b = im.b
    y = x
    if static_st != [0] * r or static_sz != list(x.shape):
        y = b.slice(y, static_st, static_sz)
    for a, s, size, proved in gathers:
        idx = b.reshape(s, [1])
        if not proved:
            # the start clamped into [0, d - size], and whether that changed it (ONNX would give a
            # shorter slice there) folded into the body's check, which the Loop reads back
            lo_hi = b.clamp(idx, min_value=0, max_value=x.shape[a] - size)
            bad = b.reshape(b.cast(b.not_equal(idx, lo_hi), "int32"), [])
            im.env[CHECKS] = b.max(im.env[CHECKS], bad)
            idx = lo_hi
        if idx.data_type != "int32":
            idx = b.cast(idx, "int32")
        if size > 1:
            idx = b.add(idx, b.constant(np.arange(size, dtype=np.int32)))
        y = b.gather(y, idx, axis=a)
    return y
