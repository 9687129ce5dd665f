"""Operator families: one file each, holding the builder methods (validation, shape and type
inference, attached to MLGraphBuilder with @builder_op) and the lowering of their nodes to WGSL
kernels from shaders/.

A family registers each operator with `register`: the data types and ranks it supports per operand
(the single source of both validation and `op_support_limits()`), and either
- `expr`: an elementwise operator given as a WGSL expression; the compiler fuses chains of these
  into one kernel (and into conv2d/matmul/gemm epilogues: unary ones when `activation=True`,
  binary ones whose other operand broadcasts to the conv/matmul output, e.g. residual adds), or
- `lower`: a function `lower(kc, node)` that emits launches through the compiler's KernelContext.
"""

import math
from dataclasses import dataclass, field

from .. import dtypes
from ..dynamic.dims import Sym, wgsl

MAX_RANK = 8


@dataclass
class OpDef:
    name: str
    support: dict  # operand name -> tuple of data types ("output" included)
    ranks: dict = field(default_factory=dict)  # operand name -> (min, max)
    lower: object = None
    expr: object = None
    activation: bool = False


OPS = {}


def register(name, support, *, ranks=None, lower=None, expr=None, activation=False):
    OPS[name] = OpDef(name, support, ranks or {}, lower, expr, activation)
    return OPS[name]


def lowering(name):
    """Decorator: set the lowering function of an already registered operator."""

    def deco(fn):
        OPS[name].lower = fn
        return fn

    return deco


# -- validation helpers shared by the families ------------------------------------------------


def check_type(where, what, operand, allowed):
    if operand.data_type not in allowed:
        raise TypeError(
            f"[{where}] {what} data type {operand.data_type} is not supported; expected one of "
            f"{', '.join(allowed)}"
        )


def check_support(name, **operands):
    """Validate operands against the registered support of operator `name`."""
    op = OPS[name]
    for what, x in operands.items():
        if x is None:
            continue
        check_type(name, what, x, op.support[what])
        lo, hi = op.ranks.get(what, (0, MAX_RANK))
        if not lo <= x.rank <= hi:
            want = f"{lo}" if lo == hi else f"between {lo} and {hi}"
            raise TypeError(f"[{name}] {what} rank must be {want}, got {x.rank} (shape {list(x.shape)})")


def same_type(where, *pairs):
    """pairs of (what, operand): all must share the first one's data type."""
    (w0, x0), *rest = pairs
    for w, x in rest:
        if x is not None and x.data_type != x0.data_type:
            raise TypeError(f"[{where}] {w} data type {x.data_type} differs from {w0} data type {x0.data_type}")


def broadcast_shapes(where, a, b, builder=None):
    """Numpy-style bidirectional broadcasting of two shapes. With a `builder`, dynamic dimensions
    unify: two different sizes of which one is dynamic (`total` against `past + seq`, `seq`
    against 5) broadcast as equal, and every dispatch checks that they are (TypeError naming
    `where` otherwise); a dynamic size that is 1 at dispatch is not broadcast then, it must equal
    the other."""
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + a
    b = (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x == y or (isinstance(y, int) and y == 1):
            out.append(x)
        elif isinstance(x, int) and x == 1:
            out.append(y)
        elif builder is not None and (isinstance(x, Sym) or isinstance(y, Sym)) and _may_equal(x, y):
            builder._require_equal(x, y, f"[{where}] broadcast dimensions of shapes {list(a)} and {list(b)}")
            out.append(y if isinstance(y, int) else x)
        else:
            raise TypeError(f"[{where}] shapes {list(a)} and {list(b)} are not broadcastable")
    return tuple(out)


def _may_equal(x, y):
    d = x - y
    return isinstance(d, Sym) and d.lo <= 0 <= d.hi


def unidirectional(where, shape, target):
    """True if `shape` broadcasts to `target` (unidirectionally), else TypeError."""
    shape, target = tuple(shape), tuple(target)
    if len(shape) > len(target):
        raise TypeError(f"[{where}] shape {list(shape)} cannot broadcast to {list(target)}")
    s = (1,) * (len(target) - len(shape)) + shape
    for x, y in zip(s, target):
        if x != y and x != 1:
            raise TypeError(f"[{where}] shape {list(shape)} cannot broadcast to {list(target)}")
    return True


def check_bool(where, what, v):
    """A boolean option (a bool, not merely truthy)."""
    if not isinstance(v, bool):
        raise TypeError(f"[{where}] {what} must be a bool, got {v!r}")
    return v


def check_number(where, what, v):
    """A numeric option (int or float, not bool) as a float."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"[{where}] {what} must be a number, got {v!r}")
    return float(v)


def check_axis(where, axis, rank):
    """A single integer axis in [0, rank) (gather/scatter_elements, cumulative_sum, arg_min/max)."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"[{where}] axis must be an integer, got {axis!r}")
    if not 0 <= axis < rank:
        raise TypeError(f"[{where}] axis {axis} is out of range for input rank {rank}")
    return axis


def check_axes(where, axes, rank, what="axes", unique=True):
    if axes is None:
        return list(range(rank))
    try:
        axes = [int(a) for a in axes]
    except (TypeError, ValueError):
        raise TypeError(f"[{where}] {what} must be a sequence of integers, got {axes!r}") from None
    for a in axes:
        if not 0 <= a < rank:
            raise TypeError(f"[{where}] {what} value {a} is out of range for rank {rank}")
    if unique and len(set(axes)) != len(axes):
        raise TypeError(f"[{where}] {what} must not repeat, got {axes}")
    return axes


def int_list(where, what, value, length=None, minimum=None):
    try:
        vals = [int(v) for v in value]
        if any(isinstance(v, bool) for v in value):
            raise TypeError
    except (TypeError, ValueError):
        raise TypeError(f"[{where}] {what} must be a sequence of integers, got {value!r}") from None
    if length is not None and len(vals) != length:
        raise TypeError(f"[{where}] {what} must have {length} values, got {len(vals)}")
    if minimum is not None and any(v < minimum for v in vals):
        raise TypeError(f"[{where}] {what} values must be >= {minimum}, got {vals}")
    return vals


# -- shape helpers shared by the lowerings (element counts: math.prod(shape)) -----------------


def row_strides(shape):
    """Element strides of a dense row-major tensor of `shape` (the last dimension has stride 1)."""
    s, out = 1, [0] * len(shape)
    for d in range(len(shape) - 1, -1, -1):
        out[d] = s
        s *= shape[d]
    return out


# Index arithmetic baked into WGSL: a flat index (one thread, one output) is split row-major into
# coordinates, each multiplied by a stride per target (input, output, ...). Every lowering that maps
# a linear index to strided offsets uses these two (elementwise broadcasting, strided copies,
# reductions, normalizations).

def merge_dims(dims):
    """Drop size-1 dims and merge neighbours that are contiguous for every target, so the WGSL
    does fewer divisions. dims: [(size, (stride per target, ...)), ...] outermost first."""
    out = []
    for size, strides in dims:
        if size == 1:
            continue
        if out:
            psize, pstrides = out[-1]
            if all(ps == size * s for ps, s in zip(pstrides, strides)):
                out[-1] = (psize * size, tuple(strides))
                continue
        out.append((size, tuple(strides)))
    return out


def radix(var, dims, n_targets=1):
    """WGSL u32 expressions (one per target) for the offsets of flat index `var`, decomposed
    row-major over dims [(size, strides per target)] (outermost first). Sizes and strides may be
    dynamic (Syms): they are then read at dispatch (dynamic/kernels.py)."""
    live = [(size, strides) for size, strides in dims if size != 1]
    terms = [[] for _ in range(n_targets)]
    inner = 1
    for k, (size, strides) in enumerate(reversed(live)):
        c = var if inner == 1 else f"({var} / {wgsl(inner)})"
        if k < len(live) - 1:  # every dimension but the outermost wraps
            c = f"({c} % {wgsl(size)})"
        for t, s in enumerate(strides):
            if isinstance(s, Sym) or s:
                terms[t].append(c if s == 1 else f"{c} * {wgsl(s)}")
        inner *= size
    return [" + ".join(t) if t else "0u" for t in terms]


FAST_DIV_MAX = 1 << 23  # flat indices below this divide by dispatch-time sizes through f32 (div_fast)


def chained_coords(var, sizes, fast=False, let=False):
    """(`let` lines, coordinate expressions outermost first) of the flat row-major index `var`
    over `sizes`, a shape with sizes known only at dispatch: chained quotients, one division per
    dynamic size (radix would divide by a product of sizes once per coordinate, and a division by
    a dispatch-time value is a real division; a remainder reuses the quotient). let: bind each
    quotient by a dynamic size to a `let` (else they stay inline, repeated subexpressions the
    shader compiler shares); fast: divide through common.wgsl's div_fast (an f32 quotient
    corrected exactly, for indices below FAST_DIV_MAX), else u32 division."""
    lines, out, q = [], [], var
    for k in range(len(sizes) - 1, -1, -1):
        size = sizes[k]
        if size == 1:
            out.append("0u")
            continue
        if k == 0 or all(d == 1 for d in sizes[:k]):  # the outermost dimension left: no wrap
            out.append(q)
            break
        d = wgsl(size)
        if isinstance(size, int):
            out.append(f"({q} % {d})")
            q = f"({q} / {d})"
            continue
        nq = f"div_fast({q}, {d})" if fast else f"({q} / {d})"
        if let:
            lines.append(f"    let q{k} = {nq};")
            nq = f"q{k}"
        out.append(f"({q} - {nq} * {d})")
        q = nq
    out += ["0u"] * (len(sizes) - len(out))
    return lines, out[::-1]


def index_lines(var, names, sizes, fast=False):
    """WGSL `let` lines binding the coordinates `names` of `var` over `sizes` (chained_coords)."""
    lines, coords = chained_coords(var, sizes, fast, let=True)
    return lines + [f"    let {n} = {e};" for n, e in zip(names, coords)]


def support_limits(ctx):
    """The WebNN MLOpSupportLimits dictionary, in snake_case."""

    def entry(types, rank=(0, MAX_RANK)):
        return {"data_types": list(types), "rank_range": {"min": rank[0], "max": rank[1]}}

    limits = {
        "preferred_input_layout": "nchw",
        "max_tensor_byte_length": ctx._max_bytes,
        "input": entry(dtypes.ALL),
        "constant": entry(dtypes.ALL),
        "output": entry(dtypes.ALL),
    }
    for name, op in sorted(OPS.items()):
        if name.startswith("_"):
            continue
        limits[name] = {w: entry(t, op.ranks.get(w, (0, MAX_RANK))) for w, t in op.support.items()}
    return limits


# Import every family module in this package so that each registers itself and attaches its
# builder methods (adding a family is adding a file).
DYNAMIC = set()  # builder methods that accept dynamic dimensions (each family's DYNAMIC_OPS)


def _load_families():
    import importlib
    import pkgutil

    for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            mod = importlib.import_module(f"{__name__}.{m.name}")
            DYNAMIC.update(getattr(mod, "DYNAMIC_OPS", ()))


_load_families()
