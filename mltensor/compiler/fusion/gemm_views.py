"""Fused GEMMs: a matmul writing through layout operators (views), rotary position embeddings,
gated units (SwiGLU, GeGLU) and merged projections become one `_fused_matmul` node (section
comment below).

Emitter: ops/matmul.py `_lower_fused`; shader hooks: shaders/matmul.wgsl's store and load_b
index functions.
"""

import math

from ...dynamic.dims import Sym, exact_div, wgsl
from ...ir.graph import Node, scalar_value, topological
from ...ir.registry import OPS
from ...ops._index import is_one, row_strides
from ..steps import Uses, broadcasts_to, other_operand


# -- fused GEMMs: views, rotary pairs, gated units, merged projections -------------------------
#
# A matmul whose output only goes through layout operators (reshape, transpose, slice, split,
# identity: the head split of attention projections, a fused QKV split) is written by the GEMM
# straight to the values those operators produce: each written value is a view of the GEMM's
# output, and the store computes the element's index in it (DigitView). Likewise a matmul whose
# A operand is such a view (the head merge before the output projection) reads A through it.
# On top of that, _fused_matmul nodes carry:
# - a rotary position embedding of a view (rotate-half: t * cos + concat(-t2, t1) * sin, as
#   transformers' Llama exports write it): the GEMM's columns are permuted (in load_b's index
#   arithmetic, the weights stay as they are) so that column d and d + D/2 of each head are
#   computed by one thread (the x/z and y/w lanes of one vec4 of accumulators), which stores
#   both rotated values;
# - a gated unit (SwiGLU's silu(x W_gate) * (x W_up), GeGLU): the two matmuls of one A are one
#   GEMM whose columns interleave gate and up (lanes x, y: gate; z, w: up), the elementwise nodes
#   combining them applied as the pair is stored;
# - several projections of one A (Q, K, V) as one GEMM over their B operands side by side, as
#   many as the binding cap allows (each its own storage binding: the weights are not copied).


class _Digit:
    """One mixed-radix digit of a base value's axis (axes are split into digits by reshapes)."""

    __slots__ = ("axis", "size")

    def __init__(self, axis, size):
        self.axis, self.size = axis, size


class DigitView:
    """A value reached from a `base` value through reshape / transpose / slice / split /
    identity, as dimensions over the base's digits: each dimension is a list of slots
    [digit, lo, size] (outermost first; a slot takes digit values lo .. lo + size - 1), its
    coordinate the slots' values (minus lo) in mixed radix. Every element of the view is one
    element of the base; store_index gives where a base element lands in the view (and the
    condition that it lands at all), load_index where a view element is in the base."""

    def __init__(self, shape):
        self.base = tuple(shape)
        self.axes = [[] if is_one(s) else [_Digit(a, s)] for a, s in enumerate(shape)]
        self.dims = [[[d, 0, d.size] for d in ax] for ax in self.axes]

    def copy(self):
        v = DigitView.__new__(DigitView)
        v.base, v.axes = self.base, [list(a) for a in self.axes]
        v.dims = [[list(s) for s in dim] for dim in self.dims]
        return v

    @property
    def shape(self):
        return tuple(math.prod(s[2] for s in dim) for dim in self.dims)

    def _split(self, slot, q):
        """Split slot [digit, lo, size] into an outer part of q values and the inner rest
        (size / q); the digit is split alike. False where the slot's range does not align."""
        dg, lo, size = slot
        if not isinstance(q, int) or q <= 0:
            return None
        if isinstance(dg.size, int) and isinstance(size, int):
            if size % q:
                return None
            r = size // q
            if lo % r or dg.size % r:
                return None
            outer, inner = _Digit(dg.axis, dg.size // r), _Digit(dg.axis, r)
        else:  # a dynamic digit taken whole (17 * batch rows viewed as [17, batch])
            r = exact_div(size, q)
            if lo != 0 or size is not dg.size and size != dg.size or r is None:
                return None
            outer, inner = _Digit(dg.axis, q), _Digit(dg.axis, r)
        ax = self.axes[dg.axis]
        i = ax.index(dg)
        ax[i : i + 1] = [outer, inner]
        return [outer, lo // r, q], [inner, 0, r]

    def reshape(self, shape):
        seq = [s for dim in self.dims for s in dim]
        out, pos = [], 0
        for want in shape:
            group, prod = [], 1
            while not (prod == want):
                if pos >= len(seq):
                    return False
                s = seq[pos]
                nxt = prod * s[2]
                if nxt == want or exact_div(want, nxt) is not None:  # (a multiple: 17 * batch of 17)
                    group.append(s)
                    prod = nxt
                    pos += 1
                    continue
                # the rest of `want` as an integer factor taken from this slot's digit: also where
                # both are dynamic (MultiheadAttention's view(S, B * H, D) of a [S, B, H * D]
                # projection: want 2 * batch, prod batch, the 2 split off the channels)
                q = exact_div(want, prod)
                if not isinstance(q, int) or q < 1:
                    return False
                parts = self._split(s, q)
                if parts is None:
                    return False
                seq[pos : pos + 1] = list(parts)
                group.append(parts[0])
                prod *= parts[0][2]
                pos += 1
            out.append(group)
        if pos != len(seq):
            return False
        self.dims = out
        return True

    def transpose(self, perm):
        self.dims = [self.dims[p] for p in perm]
        return True

    def slice(self, starts, sizes, strides=None):
        shape = self.shape
        for d, (st, sz) in enumerate(zip(starts, sizes)):
            if is_one(sz) and is_one(shape[d]):
                continue
            if st == 0 and sz == shape[d]:
                continue
            if strides is not None and strides[d] != 1:
                return False
            if not (isinstance(st, int) and isinstance(sz, int)) or not self.dims[d]:
                return False
            dim = self.dims[d]
            inner = math.prod(s[2] for s in dim[1:])
            if not isinstance(inner, int) or st % inner or sz % inner:
                return False
            dim[0][1] += st // inner
            dim[0][2] = sz // inner
        return True

    def apply(self, n, k=0):
        """This view after layout node `n` (output k); False where it cannot be expressed."""
        if n.op == "identity":
            return True
        if n.op == "reshape":
            return self.reshape(n.outputs[0].shape)
        if n.op == "transpose":
            return self.transpose(n.attrs["permutation"])
        if n.op == "slice":
            return self.slice(n.attrs["starts"], n.attrs["sizes"], n.attrs["strides"])
        if n.op == "split":
            axis = n.attrs["axis"]
            start = sum(n.attrs["sizes"][:k])
            r = len(self.dims)
            starts = [start if d == axis else 0 for d in range(r)]
            return self.slice(starts, list(n.outputs[k].shape))
        if n.op == "gather":  # one constant index: a slice of 1 along the axis, then a reshape
            return self._select(n)
        return False

    def _select(self, n):
        """gather node n picking one constant index along its axis (nn.MultiheadAttention's
        q, k, v = proj[0], proj[1], proj[2]) as a slice and a reshape."""
        idx = n.inputs[1]
        i = scalar_value(idx)
        axis = n.attrs["axis"]
        shape = self.shape
        if i is None or idx.rank > 1 or not isinstance(shape[axis], int) or i != int(i):
            return False
        i = int(i) + (shape[axis] if i < 0 else 0)
        if not 0 <= i < shape[axis]:
            return False
        starts = [i if d == axis else 0 for d in range(len(shape))]
        sizes = [1 if d == axis else shape[d] for d in range(len(shape))]
        return self.slice(starts, sizes) and self.reshape(n.outputs[0].shape)

    # -- index arithmetic (WGSL) --

    def _digit_expr(self, dg, coords):
        ax = self.axes[dg.axis]
        i = ax.index(dg)
        inner = math.prod(d.size for d in ax[i + 1 :])
        c = coords[dg.axis]
        e = c if is_one(inner) else f"({c} / {wgsl(inner)})"
        return e if i == 0 else f"({e} % {wgsl(dg.size)})"

    def store_index(self, coords, into=None):
        """(flat index expression in the view, [conditions]) of the base element whose
        coordinates (one WGSL expression per base axis) are `coords`. into: (shape, axis,
        offset): the view is a slab of a tensor of that shape starting at `offset` along `axis`
        (a concat's output): the index there."""
        shape = self.shape
        rs = row_strides(shape if into is None else into[0])
        terms, conds, const = [], [], 0
        if into is not None:
            const = into[2] * rs[into[1]]
        for d, dim in enumerate(self.dims):
            inner = 1
            for dg, lo, size in reversed(dim):
                e = self._digit_expr(dg, coords)
                w = inner * rs[d]
                if not (lo == 0 and size == dg.size):
                    conds.append(f"{e} >= {wgsl(lo)}" if lo else None)
                    conds.append(f"{e} < {wgsl(lo + size)}")
                terms.append(e if is_one(w) else f"{e} * {wgsl(w)}")
                const -= lo * w
                inner = inner * size
        expr = " + ".join(terms) or "0u"
        if isinstance(const, Sym) or const > 0:
            expr = f"({expr} + {wgsl(const)})"
        elif const:
            expr = f"({expr} - {wgsl(-const)})"
        return expr, [c for c in conds if c]

    def load_index(self, coords):
        """Flat index expression in the base of the view element whose coordinates (one WGSL
        expression per view dimension) are `coords`."""
        weight = {}
        rs = row_strides(self.base)
        for a, ax in enumerate(self.axes):
            inner = 1
            for dg in reversed(ax):
                weight[id(dg)] = inner * rs[a]
                inner = inner * dg.size
        terms = []
        for d, dim in enumerate(self.dims):
            inner = 1
            for j in range(len(dim) - 1, -1, -1):
                dg, lo, size = dim[j]
                c = coords[d] if is_one(inner) else f"({coords[d]} / {wgsl(inner)})"
                if j > 0:
                    c = f"({c} % {wgsl(size)})"
                if lo:
                    c = f"({c} + {wgsl(lo)})"
                w = weight[id(dg)]
                terms.append(c if is_one(w) else f"{c} * {wgsl(w)}")
                inner = inner * size
        return " + ".join(terms) or "0u"

    def innermost(self):
        """The slot of the view's last dimension when it is exactly the base's innermost digit,
        whole (the axis rotary pairs are taken along), else None."""
        if not self.dims or len(self.dims[-1]) != 1 or not self.axes[-1]:
            return None
        dg, lo, size = self.dims[-1][0]
        if dg is not self.axes[-1][-1] or lo != 0 or size != dg.size:
            return None
        return dg


LAYOUT_OPS = ("reshape", "transpose", "slice", "split", "identity", "gather")


class Leaf:
    """Values a fused GEMM writes at one view of a segment's output: `values` (a value and the
    identity copies of it, same shape), `view` (a DigitView of the segment's output), and for a
    rotary leaf `rope` = (cos, sin): the values are the rotation of the view."""

    __slots__ = ("view", "values", "rope", "cat")

    def __init__(self, view, values, rope=None, cat=None):
        self.view, self.values, self.rope, self.cat = view, values, rope, cat

    def into(self):
        """store_index's `into` for a leaf written into a concat's output (cat: (the input before
        it, axis)): the output's shape, the axis, the offset there."""
        if self.cat is None:
            return None
        p, axis = self.cat
        return tuple(self.values[0].shape), axis, p.shape[axis]


class Segment:
    """One projection of a fused GEMM: kind "plain" (matmuls [mm]), "rope" (one rotary leaf,
    columns paired within heads of `head` channels) or "glu" (matmuls [gate, up], columns
    interleaved). `pre`: elementwise nodes applied per element before the views (a bias; for
    "glu" the nodes combining gate and up), `x` the value they give (the views' base), `n` its
    columns, `width` the GEMM columns it takes, `leaves` what is written, `nodes` every node it
    replaces."""

    def __init__(self, kind, mms, pre, x, leaves, nodes, head=None):
        self.kind, self.mms, self.pre, self.x, self.leaves, self.nodes = kind, mms, pre, x, leaves, nodes
        self.head = head
        self.n = x.shape[-1]
        self.width = 2 * self.n if kind == "glu" else self.n
        self.bs = [m.inputs[1] for m in mms]

    def extras(self):
        """Values read besides A and the B operands (host scalars are inlined: not bound)."""
        out = []
        for n in self.pre:
            for v in n.inputs:
                if v is not None and v not in out and not _produced(v, self) and scalar_value(v) is None:
                    out.append(v)
        for leaf in self.leaves:
            if leaf.rope:
                out += [v for v in leaf.rope if not any(v is o for o in out)]
            if leaf.cat and not any(leaf.cat[0] is o for o in out):
                out.append(leaf.cat[0])
        return out

    def outputs(self):
        return [v for leaf in self.leaves for v in leaf.values]


def _produced(v, seg):
    return any(v is m.outputs[0] for m in seg.mms) or any(v is n.outputs[0] for n in seg.pre)


class FusedPlan:
    """attrs["plan"] of a _fused_matmul node: `segments` side by side along the GEMM's columns,
    `a_view` (a DigitView of inputs[0] that A is, or None: inputs[0] is A), `a` the A operand
    the matmuls read (its shape), `rms`: (scale or None, epsilon) where A is the RMS
    normalization of inputs[0] (rms_prologues; the scale then the node's last input). The
    node's inputs: A's source, the segments' B operands, their extras[, the scale]."""

    def __init__(self, segments, a, a_view, rms=None):
        self.segments, self.a, self.a_view, self.rms = segments, a, a_view, rms


def _epilogue_operand_ok(n, cur):
    """Elementwise node `n` reading `cur` can be applied per element of cur's shape: unary, or
    binary with the other operand broadcasting to cur (same data type, same output shape)."""
    op = OPS[n.op]
    if op.expr is None or len(n.outputs) != 1:
        return False
    y = n.outputs[0]
    if tuple(y.shape) != tuple(cur.shape) or y.data_type != cur.data_type:
        return False
    ins = [v for v in n.inputs if v is not None]
    if op.activation and len(ins) == 1 and ins[0] is cur:
        return True
    if len(n.inputs) != 2 or len(ins) != 2:
        return False
    other = other_operand(n, cur)
    return (
        other is not None and other.data_type == cur.data_type and broadcasts_to(tuple(other.shape), tuple(cur.shape))
    )


def _copies(v, uses):
    """[v if read by anything but identities or an output] + identity copies of v."""
    rs = uses.readers(v)
    vals = [v] if id(v) in uses.out_ids or any(r.op != "identity" for r in rs) else []
    return vals + [r.outputs[0] for r in rs if r.op == "identity"], [r for r in rs if r.op == "identity"]


def _concat_after(v, uses):
    """(concat node, input before v, axis) when v is read only by a concat of two inputs, v the
    second, along an axis other than the last: a KV cache's present = concat(past, new). The
    GEMM writing v then writes the concat's output: v's rows at their place, and (copy_in) the
    past's."""
    rs = uses.readers(v)
    if id(v) in uses.out_ids or len(rs) != 1:
        return None
    n = rs[0]
    if n.op != "concat" or len(n.inputs) != 2 or n.inputs[1] is not v or n.inputs[0] is v:
        return None
    axis = n.attrs["axis"]
    if axis == v.rank - 1 or n.inputs[0].data_type != v.data_type:
        return None
    return n, n.inputs[0], axis


def _leaf(view, v, uses, rope=None):
    """(Leaf writing value v (or the concat of a cache it ends, _concat_after), nodes absorbed)."""
    cat = _concat_after(v, uses)
    if cat is not None:
        vals, ids = _copies(cat[0].outputs[0], uses)
        return Leaf(view, vals, rope, (cat[1], cat[2])), [cat[0]] + ids
    vals, ids = _copies(v, uses)
    return Leaf(view, vals, rope), ids


def _rope_at(t, uses):
    """(cos, sin, nodes, output) when t's readers are exactly a rotate-half rotary embedding:
    add(mul(t, cos), mul(concat(neg(t[.., D/2:]), t[.., :D/2]), sin)) (operands in either order),
    intermediates read only there, D a multiple of 8 (the GEMM pairs channels d and d + D/2 in
    octets of columns); else None."""
    D = t.shape[-1] if t.rank else None
    if not isinstance(D, int) or D % 8 or id(t) in uses.out_ids:
        return None
    rs = uses.readers(t)
    if len(rs) != 3:
        return None
    half, r = D // 2, t.rank
    lo = hi = mc = None
    for n in rs:
        if n.op == "slice" and n.inputs[0] is t and all(s == 1 for s in n.attrs["strides"]):
            st, sz = n.attrs["starts"], n.attrs["sizes"]
            if any(st[d] != 0 or sz[d] != t.shape[d] for d in range(r - 1)) or sz[-1] != half:
                return None
            if st[-1] == 0:
                lo = n
            elif st[-1] == half:
                hi = n
            else:
                return None
        elif n.op == "mul":
            mc = n
        else:
            return None
    if lo is None or hi is None or mc is None:
        return None
    x1, x2 = lo.outputs[0], hi.outputs[0]
    neg = uses.sole(x2)
    if neg is None or neg.op != "neg" or not uses.only(x1):
        return None
    cat = uses.sole(neg.outputs[0])
    if cat is None or cat.op != "concat" or cat.attrs["axis"] != r - 1 or list(cat.inputs) != [neg.outputs[0], x1]:
        return None
    ms = uses.sole(cat.outputs[0])
    if ms is None or ms.op != "mul":
        return None
    cos, sin = other_operand(mc, t), other_operand(ms, cat.outputs[0])
    if cos is None or sin is None:
        return None
    add = uses.sole(mc.outputs[0])
    if (
        add is None
        or add.op != "add"
        or uses.sole(ms.outputs[0]) is not add
        or other_operand(add, mc.outputs[0]) is not ms.outputs[0]
    ):
        return None
    y = add.outputs[0]
    for v in (cos, sin):
        if v.data_type != t.data_type or not broadcasts_to(tuple(v.shape), tuple(t.shape)):
            return None
    if any(tuple(n.outputs[0].shape) != tuple(t.shape) for n in (mc, ms, add)) or y.data_type != t.data_type:
        return None
    return cos, sin, [lo, hi, neg, cat, mc, ms, add], y


def _view_tree(x, uses, max_leaves):
    """(leaves, nodes) of the layout operators after value x (module comment): a value every
    reader of which is a layout operator that a DigitView expresses (not a graph output) is not
    written; the others are (their identity copies with them); a value whose readers are a
    rotary embedding gives a rotary leaf. None when nothing is gained (x itself the only leaf)."""
    leaves, nodes = [], []
    stack = [(x, DigitView(x.shape))]
    while stack:
        v, view = stack.pop()
        rs = uses.readers(v)
        rope = _rope_at(v, uses)
        if rope is not None and view.innermost() is not None:
            cos, sin, rnodes, y = rope
            leaf, ids = _leaf(view, y, uses, (cos, sin))
            if not leaf.values:
                return None
            leaves.append(leaf)
            nodes += rnodes + ids
            continue
        branches = []
        ok = id(v) not in uses.out_ids and bool(rs)
        for r in rs if ok else ():
            if r.op not in LAYOUT_OPS or r.inputs[0] is not v:
                ok = False
                break
            if r.op == "transpose" and _kt_transpose(r, uses):
                ok = False  # (attention reads K through its own Kᵀ transpose)
                break
            if r.op == "reshape" and all(e.op == "expand" for e in uses.readers(r.outputs[0])):
                ok = False  # (grouped-query heads: the attention reads them unrepeated, grouped.py)
                break
            for k in range(len(r.outputs)):
                w = view.copy()
                if not w.apply(r, k):
                    ok = False
                    break
                branches.append((r.outputs[k], w))
            if not ok:
                break
        if ok:
            nodes += [r for r in rs if r not in nodes]
            stack.extend(branches)
            continue
        leaf, ids = _leaf(view, v, uses)
        leaves.append(leaf)
        nodes += ids
        if len(leaves) > max_leaves:
            return None
    if len(leaves) == 1 and leaves[0].values == [x] and not leaves[0].rope:
        return None
    # a concat's first input copied in (a cache's past) must not itself come from this GEMM: a
    # roll (torch.roll as Swin's exporters write it: concat(y[:, s:], y[:, :s])) would read a
    # value the same kernel writes
    inside = {id(x)} | {id(v) for n in nodes for v in n.outputs}
    if any(lf.cat is not None and id(lf.cat[0]) in inside for lf in leaves):
        return None
    return leaves, nodes


def _kt_transpose(n, uses):
    """Transpose node n swaps the last two axes and feeds a matmul's second operand (attention's
    K^T, which the attention kernel reads in place)."""
    p = list(n.attrs["permutation"])
    r = len(p)
    if r < 2 or p != list(range(r - 2)) + [r - 1, r - 2]:
        return False
    return any(m.op == "matmul" and m.inputs[1] is n.outputs[0] for m in uses.readers(n.outputs[0]))


def plain_b(mm):
    """The matmul's B is one constant [K, N] matrix for every batch entry (a projection's
    weights: never the attention's K or V, which the attention pass needs as matmuls), N a
    static multiple of 4."""
    b = mm.inputs[1]
    n = b.shape[-1]
    return (
        b._kind == "constant"
        and all(is_one(d) for d in b.shape[:-2])
        and isinstance(n, int)
        and n % 4 == 0
        and mm.inputs[0].data_type in ("float32", "float16")
    )


def _segment(mm, uses, max_leaves):
    """The plain or rotary Segment of matmul node `mm` (pre nodes, then the view tree), or None."""
    if not plain_b(mm):
        return None
    x = mm.outputs[0]
    pre, cur = [], x
    while uses.only(cur):
        n = uses.sole(cur)
        if not _epilogue_operand_ok(n, cur):
            break
        pre.append(n)
        cur = n.outputs[0]
    tree = _view_tree(cur, uses, max_leaves)
    if tree is None and pre:  # the pre nodes without views are an ordinary epilogue
        pre, cur = [], x
        tree = _view_tree(cur, uses, max_leaves)
    if tree is None:
        return None
    leaves, vnodes = tree
    ropes = [lf for lf in leaves if lf.rope]
    if ropes:
        if len(leaves) != 1:
            return None
        head = leaves[0].view.innermost().size
        if x.shape[-1] % head:
            return None
        return Segment("rope", [mm], pre, cur, leaves, [mm] + pre + vnodes, head=head)
    return Segment("plain", [mm], pre, cur, leaves, [mm] + pre + vnodes)


def _glu(g_mm, u_mm, uses, order):
    """The "glu" Segment of matmuls g_mm (gate) and u_mm (up) of one A: the elementwise nodes
    reading only their outputs, scalar host constants and values made before both, with exactly
    one value y leaving them, depending on both; or None."""
    g, u = g_mm.outputs[0], u_mm.outputs[0]
    if (
        tuple(g.shape) != tuple(u.shape)
        or g.data_type != u.data_type
        or id(g) in uses.out_ids
        or id(u) in uses.out_ids
        or not (plain_b(g_mm) and plain_b(u_mm))
    ):
        return None
    first = min(order[id(g_mm)], order[id(u_mm)])
    inside = {id(g), id(u)}
    region = []
    grew = True
    while grew:
        grew = False
        for v in [g, u] + [n.outputs[0] for n in region]:
            for n in uses.readers(v):
                if n in region or OPS[n.op].expr is None or len(n.outputs) != 1:
                    continue
                y = n.outputs[0]
                if tuple(y.shape) != tuple(g.shape) or y.data_type != g.data_type:
                    continue
                if all(
                    x is None
                    or id(x) in inside
                    or scalar_value(x) is not None
                    or (id(x) not in uses.prod or order[id(uses.prod[id(x)])] < first)
                    and broadcasts_to(tuple(x.shape), tuple(g.shape))
                    and x.data_type == g.data_type
                    for x in n.inputs
                ):
                    region.append(n)
                    inside.add(id(y))
                    grew = True
    if not region:
        return None
    leaving = [
        n.outputs[0]
        for n in region
        if id(n.outputs[0]) in uses.out_ids or any(r not in region for r in uses.readers(n.outputs[0]))
    ]
    if any(r not in region for v in (g, u) for r in uses.readers(v)) or len(leaving) != 1:
        return None
    y = leaving[0]
    # (both read: y depends on g and u)
    dep, stack = set(), [y]
    while stack:
        v = stack.pop()
        if id(v) in dep:
            continue
        dep.add(id(v))
        p = uses.prod.get(id(v))
        if v is not g and v is not u and p in region:
            stack.extend(x for x in p.inputs if x is not None and id(x) in inside)
    if id(g) not in dep or id(u) not in dep:
        return None
    region = [n for n in region if id(n.outputs[0]) in dep]
    # topological order (the node list's)
    region.sort(key=lambda n: order[id(n)])
    vals, ids = _copies(y, uses)
    leaves = [Leaf(DigitView(y.shape), vals)]
    return Segment("glu", [g_mm, u_mm], region, y, leaves, [g_mm, u_mm] + region + ids)


def _a_view(mm, uses):
    """(base value, DigitView) when matmul mm's A is a layout view (reshape / transpose of a value,
    read by nothing else) of another value: the head merge transpose; else None."""
    a = mm.inputs[0]
    chain = []
    v = a
    while id(v) in uses.prod and uses.prod[id(v)].op in ("reshape", "transpose") and uses.only(v):
        chain.append(uses.prod[id(v)])
        v = chain[-1].inputs[0]
    if not any(n.op == "transpose" for n in chain):
        return None
    view = DigitView(v.shape)
    for n in reversed(chain):
        if not view.apply(n):
            return None
    if tuple(view.shape) != tuple(a.shape):
        return None
    return v, view, chain


def _bindings_of(segs, a_extra=0):
    """Storage buffers of one fused GEMM of these segments: A, the B operands, the extras (each
    distinct value once) and the written values."""
    extras = []
    for s in segs:
        extras += [v for v in s.extras() if not any(v is e for e in extras)]
    return 1 + a_extra + sum(len(s.bs) for s in segs) + len(extras) + sum(len(s.outputs()) for s in segs)


def rewrite_gemms(nodes, outputs, cap):
    """Matmuls -> _fused_matmul nodes (module comment above); the node list re-sorted."""
    uses = Uses(nodes, outputs)
    order = {id(n): i for i, n in enumerate(nodes)}
    mms = [n for n in nodes if n.op == "matmul" and n.inputs[0].data_type in ("float32", "float16")]
    taken = set()
    fused = []  # (segments, a_view info)
    accepted = []  # the segments of `fused` (_clashes)
    # gated units first: two matmuls of one A whose outputs meet in elementwise nodes
    by_a = {}
    for m in mms:
        by_a.setdefault(id(m.inputs[0]), []).append(m)
    for group in by_a.values():
        for i, g in enumerate(group):
            for u in group[i + 1 :]:
                if id(g) in taken or id(u) in taken:
                    continue
                if tuple(g.inputs[1].shape) != tuple(u.inputs[1].shape):
                    continue
                seg = None
                for gate, up in ((g, u), (u, g)):
                    seg = _glu(gate, up, uses, order)
                    if seg is not None:
                        break
                if seg is not None and _bindings_of([seg]) <= cap and not _clashes(seg, accepted):
                    fused.append(([seg], None))
                    accepted.append(seg)
                    taken.update((id(g), id(u)))
    # projections: views after the output (merged when they share A), or a view before A
    for group in by_a.values():
        segs = []
        for m in group:
            if id(m) in taken:
                continue
            s = _segment(m, uses, cap - 2)
            if s is not None and _bindings_of([s]) <= cap and not _clashes(s, accepted):
                segs.append(s)
                accepted.append(s)
        run = []
        for s in segs:
            octets = any(x.kind != "plain" for x in run + [s])  # pair segments: 8-column stores
            if run and (
                _bindings_of(run + [s]) > cap
                or s.mms[0].inputs[1].shape[-2] != run[0].mms[0].inputs[1].shape[-2]
                or octets
                and any(x.width % 8 for x in run + [s])
            ):
                fused.append((run, None))
                run = []
            run.append(s)
            taken.add(id(s.mms[0]))
        if run:
            fused.append((run, None))
    absorbed = {id(n) for segs, _ in fused for s in segs for n in s.nodes}
    for i, (segs, _) in enumerate(fused):  # a GEMM writing views may read its A through one too
        m = segs[0].mms[0]
        av = _a_view(m, uses) if len(segs) == 1 and segs[0].mms == [m] else None
        if av is not None and not any(id(n) in absorbed for n in av[2]):
            fused[i] = (segs, av)
            absorbed.update(id(n) for n in av[2])
    for m in mms:
        if id(m) in taken or not plain_b(m):
            continue
        av = _a_view(m, uses)
        if av is None or any(id(n) in absorbed for n in av[2]):
            continue  # (a layout chain another GEMM writes the end of: A is that written value)
        seg = Segment("plain", [m], [], m.outputs[0], [Leaf(DigitView(m.outputs[0].shape), [m.outputs[0]])], [m])
        fused.append(([seg], av))
        taken.add(id(m))
    if not fused:
        return nodes
    return _place_fused(nodes, fused, order)


def _internal(seg):
    """ids of the values a segment computes but does not write (its matmuls' raw outputs and pre
    nodes' results before the last, when an epilogue or a view follows)."""
    written = {id(v) for v in seg.outputs()}
    return {id(o) for n in seg.nodes for o in n.outputs if id(o) not in written}


def _clashes(seg, accepted):
    """Whether segment `seg` cannot join the fused GEMMs of `accepted` segments: it would absorb a
    node one of them absorbs (two matmuls whose outputs meet in one elementwise node: each would
    take that node into its epilogue), or one of them reads a value it keeps internal, or the
    reverse (that value would then be computed nowhere: a DFT's x_r C - x_i S with x_r's and
    x_i's products fused per A read garbage)."""
    nodes = {id(n) for n in seg.nodes}
    extras, inner = {id(v) for v in seg.extras()}, _internal(seg)
    for t in accepted:
        if nodes & {id(n) for n in t.nodes} or extras & _internal(t) or inner & {id(v) for v in t.extras()}:
            return True
    return False


def _fused_node(segs, av):
    first = segs[0].mms[0]
    a = first.inputs[0]
    src, view, chain = (a, None, []) if av is None else av
    extras = []
    for s in segs:
        extras += [v for v in s.extras() if not any(v is e for e in extras)]
    inputs = [src] + [b for s in segs for b in s.bs] + extras
    node = Node("_fused_matmul", inputs, {"plan": FusedPlan(segs, a, view)}, first.label)
    node.outputs = [v for s in segs for v in s.outputs()]
    return node, [n for s in segs for n in s.nodes] + chain


def _place_fused(nodes, fused, order):
    """The node list with each fused group's nodes replaced by its _fused_matmul node, sorted
    topologically (stable: original order where free). A group that would make a cycle (one of
    its inputs computed from one of its outputs) is left unfused."""
    made = [_fused_node(segs, av) for segs, av in fused]
    while True:
        drop = {}
        for i, (node, gone) in enumerate(made):
            for n in gone:
                drop[id(n)] = i
        rest = [n for n in nodes if id(n) not in drop] + [node for node, _ in made]
        key = {id(n): order[id(n)] for n in nodes if id(n) not in drop}
        for node, gone in made:
            key[id(node)] = min(order[id(n)] for n in gone)
        out = topological(rest, key)
        if out is not None:
            return out
        # a cycle: drop the group with the latest first node and try again
        made.pop(max(range(len(made)), key=lambda i: key[id(made[i][0])]))
        if not made:
            return nodes
