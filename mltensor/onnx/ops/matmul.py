"""ONNX MatMul, Gemm, Einsum."""

import numpy as np

from ..errors import unsupported
from ._blocks import blocks, byte_length, oversize
from ._helpers import prod, scalar, X
from ._registry import op

# -- matmul ---------------------------------------------------------------------------------------


@op("MatMul")
def matmul(im, node, ins, attrs):
    a, w = ins[0], ins[1]
    b = im.b
    if isinstance(w, np.ndarray) and w.ndim == 2 and not isinstance(a, np.ndarray):
        x = X(im, a)
        if oversize(im, w, x):
            # a weight above the largest tensor (_blocks.py): one product per column block
            unit = byte_length(w, x) // w.shape[1]
            cols = blocks(w.shape[1], unit, im.ctx._max_bytes, "MatMul's constant B")
            outs = [_product(im, x, X(im, np.ascontiguousarray(w[:, lo:hi]), x)) for lo, hi in cols]
            return b.concat(outs, len(outs[0].shape) - 1)
    if isinstance(a, np.ndarray) and a.ndim == 2 and not isinstance(w, np.ndarray):
        y = X(im, w)
        if oversize(im, a, y):
            # a constant A above the largest tensor: one product per row block
            rows = blocks(a.shape[0], byte_length(a, y) // a.shape[0], im.ctx._max_bytes, "MatMul's constant A")
            outs = [_product(im, X(im, np.ascontiguousarray(a[lo:hi]), y), y) for lo, hi in rows]
            r = len(outs[0].shape)
            return b.concat(outs, r - 1 if len(y.shape) == 1 else r - 2)
    a = X(im, a)
    return _product(im, a, X(im, w, a))


def _product(im, a, c):
    """ONNX MatMul of operands a and c (numpy's matmul: a rank-1 side is a row or column vector,
    its axis dropped from the result)."""
    b = im.b
    ra, rc = len(a.shape), len(c.shape)
    a2 = b.reshape(a, [1, a.shape[0]]) if ra == 1 else a
    c2 = b.reshape(c, [c.shape[0], 1]) if rc == 1 else c
    y = b.matmul(a2, c2)
    if ra == 1 or rc == 1:
        shape = list(y.shape)
        if rc == 1:
            shape.pop(-1)
        if ra == 1:
            shape.pop(-2 if rc != 1 else -1)
        y = b.reshape(y, shape)
    return y


@op("Gemm", attrs=("alpha", "beta", "transA", "transB", "broadcast"))
def _gemm(im, node, ins, attrs):
    a = X(im, ins[0])
    if len(a.shape) == 1:
        # onnxruntime takes a vector A as one row (one column with transA); WebNN gemm is 2-D
        a = im.b.reshape(a, [a.shape[0], 1] if attrs.get("transA", 0) else [1, a.shape[0]])
    kw = {}
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        kw["alpha"] = alpha
    if attrs.get("transA", 0):
        kw["a_transpose"] = True
    tb = bool(attrs.get("transB", 0))
    if tb:
        kw["b_transpose"] = True
    if beta != 1.0 and len(ins) > 2 and ins[2] is not None:
        kw["beta"] = beta
    w = ins[1]
    c = ins[2] if len(ins) > 2 else None
    if isinstance(w, np.ndarray) and w.ndim == 2 and oversize(im, w, a):
        # a weight above the largest tensor (_blocks.py): one gemm per column block of the
        # output, concatenated
        n = w.shape[0] if tb else w.shape[1]
        # C by blocks where it is a host array (a bias); a computed one is added after the concat
        c_blocks = c is None or (isinstance(c, np.ndarray) and (c.ndim == 0 or c.shape[-1] in (1, n)))
        outs = []
        for lo, hi in blocks(n, byte_length(w, a) // n, im.ctx._max_bytes, "Gemm's constant B"):
            kwi = {k: v for k, v in kw.items() if k != "beta" or c_blocks}
            if c is not None and c_blocks:
                kwi["c"] = X(im, np.ascontiguousarray(c[..., lo:hi]) if c.ndim and c.shape[-1] == n else c, a)
            wi = np.ascontiguousarray(w[lo:hi] if tb else w[:, lo:hi])
            outs.append(im.b.gemm(a, X(im, wi, a), **kwi))
        y = im.b.concat(outs, 1)
        if not c_blocks:
            cc = X(im, c, a)
            y = im.b.add(y, cc if beta == 1.0 else im.b.mul(cc, scalar(im, beta, cc)))
        return y
    bb = X(im, w, a)
    if c is not None:
        kw["c"] = X(im, c, a)
    return im.b.gemm(a, bb, **kw)


@op("Einsum", attrs=("equation",))
def _einsum(im, node, ins, attrs):
    """The contractions that are a transpose/matmul: 'bij,bjk->bik', 'ij,jk', 'ij->ji', 'ii->i' no."""
    eq = attrs["equation"].replace(" ", "")
    if "->" not in eq:
        letters = eq.replace(",", "")
        eq = eq + "->" + "".join(sorted(ch for ch in set(letters) if letters.count(ch) == 1))
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    xs = [X(im, v) for v in ins]
    b = im.b
    if "..." in eq:
        # ellipsis: name the broadcast dims with letters the equation does not use
        free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in eq]
        n_ell = max(len(x.shape) - (len(t) - 3) for t, x in zip(terms, xs) if "..." in t)
        ell = "".join(free[:n_ell])
        terms = [
            t.replace("...", ell[n_ell - (len(x.shape) - (len(t) - 3)) :]) if "..." in t else t
            for t, x in zip(terms, xs)
        ]
        out = out.replace("...", ell)
    if "." in "".join(terms) + out:
        unsupported(f"equation {eq!r}")
    if len(terms) == 1:
        (t,) = terms
        x = xs[0]
        while len(set(t)) != len(t):  # repeated letter: take the diagonal
            ch = next(c for c in t if t.count(c) > 1)
            p = t.index(ch)
            q = t.index(ch, p + 1)
            shp = [1] * len(t)
            shp[p] = shp[q] = x.shape[p]
            eye = np.eye(x.shape[p]).reshape(shp).astype(np.dtype(x.data_type))
            x = b.reduce_sum(b.mul(x, X(im, eye)), axes=[q], keep_dimensions=False)
            t = t[:q] + t[q + 1 :]
        red = [i for i, c in enumerate(t) if c not in out]
        if red:
            x = b.reduce_sum(x, axes=red, keep_dimensions=False)
            t = "".join(c for c in t if c in out)
        perm = [t.index(c) for c in out]
        return b.transpose(x, permutation=perm) if perm != list(range(len(perm))) else b.identity(x)
    if len(terms) != 2:
        unsupported(f"equation {eq!r}")
    ta, tb = terms
    if len(set(ta)) != len(ta) or len(set(tb)) != len(tb):
        unsupported(f"equation {eq!r}")
    a, c = xs
    contract = [ch for ch in ta if ch in tb and ch not in out]
    batch = [ch for ch in ta if ch in tb and ch in out]
    only_a = [ch for ch in ta if ch not in tb]
    only_b = [ch for ch in tb if ch not in ta]
    if any(ch not in out for ch in only_a + only_b):
        # summed over a single operand first
        ra = [ta.index(ch) for ch in only_a if ch not in out]
        if ra:
            a = b.reduce_sum(a, axes=ra, keep_dimensions=False)
            ta = "".join(ch for ch in ta if ch in out or ch in tb)
        rb = [tb.index(ch) for ch in only_b if ch not in out]
        if rb:
            c = b.reduce_sum(c, axes=rb, keep_dimensions=False)
            tb = "".join(ch for ch in tb if ch in out or ch in ta)
        only_a = [ch for ch in ta if ch not in tb]
        only_b = [ch for ch in tb if ch not in ta]
    dims = {}
    for t, v in ((ta, a), (tb, c)):
        for ch, d in zip(t, v.shape):
            dims[ch] = d
    pa = b.transpose(a, permutation=[ta.index(ch) for ch in batch + only_a + contract])
    pb = b.transpose(c, permutation=[tb.index(ch) for ch in batch + contract + only_b])
    nb = [dims[ch] for ch in batch]
    ma, kk, nn = prod(dims[ch] for ch in only_a), prod(dims[ch] for ch in contract), prod(dims[ch] for ch in only_b)
    y = b.matmul(b.reshape(pa, nb + [ma, kk]), b.reshape(pb, nb + [kk, nn]))
    order = batch + only_a + only_b
    y = b.reshape(y, [dims[ch] for ch in order])
    perm = [order.index(ch) for ch in out]
    return b.transpose(y, permutation=perm) if perm != list(range(len(perm))) else y
