"""Shape and index helpers shared by the lowerings: WGSL index arithmetic over row-major
shapes (element counts: math.prod(shape))."""

from ..dynamic.dims import Sym, wgsl


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


def is_one(x):
    """x is the static size 1 (a Sym never is, whatever its range)."""
    return isinstance(x, int) and x == 1


def coords_of_batch(shape, var="bt"):
    """WGSL coordinates of the batch axes `shape` of flat batch index `var` (row-major)."""
    out, inner = [], 1
    for d in range(len(shape) - 1, -1, -1):
        s = shape[d]
        if is_one(s):
            out.append("0u")
            continue
        c = var if is_one(inner) else f"({var} / {wgsl(inner)})"
        if any(not is_one(x) for x in shape[:d]):
            c = f"({c} % {wgsl(s)})"
        out.append(c)
        inner = inner * s
    return out[::-1]
