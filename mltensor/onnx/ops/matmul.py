"""ONNX MatMul, Gemm, Einsum."""

import numpy as np

from ..errors import unsupported
from ._helpers import prod, X
from ._registry import op

# -- matmul ---------------------------------------------------------------------------------------


@op("MatMul")
def matmul(im, node, ins, attrs):
    a = X(im, ins[0])
    w = ins[1]
    b = im.b
    if isinstance(w, np.ndarray) and w.ndim == 2 and w.size * 4 > im.ctx._max_bytes and len(a.shape) >= 2:
        # a weight above the largest binding: split along N, concat the partial products
        n = w.shape[1]
        step = -(-n // -(-w.size * 4 // im.ctx._max_bytes))
        outs = [b.matmul(a, X(im, np.ascontiguousarray(w[:, lo : lo + step]), a)) for lo in range(0, n, step)]
        return b.concat(outs, len(a.shape) - 1)
    c = X(im, w, a)
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
    limit = im.ctx._max_bytes
    if isinstance(w, np.ndarray) and w.ndim == 2 and w.size * 4 > limit:
        # a weight above the largest binding: split it along N, one gemm per slice, concat
        n = w.shape[0] if tb else w.shape[1]
        pieces = -(-w.size * 4 // limit)
        step = -(-n // pieces)
        outs = []
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            wi = np.ascontiguousarray(w[lo:hi] if tb else w[:, lo:hi])
            kwi = dict(kw)
            if c is not None:
                ci = c
                if isinstance(c, np.ndarray) and c.ndim and c.shape[-1] == n:
                    ci = np.ascontiguousarray(c[..., lo:hi])
                elif not isinstance(c, np.ndarray) or (c.ndim and c.shape[-1] != 1):
                    unsupported("a split weight with a computed or full-size C")
                kwi["c"] = X(im, ci, a)
            outs.append(im.b.gemm(a, X(im, wi, a), **kwi))
        return im.b.concat(outs, 1)
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
