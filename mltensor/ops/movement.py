"""Data movement: concat, expand, gather, pad, reshape, slice, split, transpose, where.

Every kernel works on the compute form, so moving data never looks at the data type, only at its
width (u32 words, or for 64-bit integers u64 natively, u64e = two words emulated): one "strided copy" kernel
(shaders/movement.wgsl) covers transpose, slice, split and concat. Each thread
owns one element of its iteration space and computes both flat indices from its linear id with
sizes and strides baked into the WGSL. Before that the iteration space is coalesced (size-1 dims
dropped, dims contiguous in every operand merged), so e.g. a channel split of NCHW is a 2-D
copy, and a copy that turns out to be the identity becomes a zero-cost alias instead of a launch.

reshape is always an alias (a copy only when it is a graph output). expand and where are
elementwise expressions: the elementwise compiler already broadcasts their inputs with baked
strides, and as expressions they fuse into the chains around them.

Dynamic dimensions (mltensor/dynamic/): every operator here takes operands whose shapes hold Syms
(DYNAMIC_OPS). Sizes, strides and offsets reach the WGSL through `wgsl()` (read at dispatch); a
flat index is split into coordinates by chained quotients (coords_at: one division per dynamic
size); launches are sized per dispatch. What the builder cannot decide (element counts over
different names, a slice's start + size against its dimension, concat's other dimensions) is
checked at every dispatch (Checks). Copy-free placement and views need offsets known at build,
so dynamic concat inputs and slices are copied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, is_static, wgsl
from ..dynamic.kernels import MAX_GROUPS, grid, is_dynamic
from ..ir.graph import MLOperand, as_shape
from ..ir.registry import MAX_RANK, builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, convert, lit
from ._checks import broadcast_shapes, check_support, int_list, same_type, unidirectional
from ._index import chained_coords, merge_dims, radix, row_strides

ALL = dtypes.ALL
INDEX_TYPES = ("int32", "uint32", "int64")
ANY_RANK = (0, MAX_RANK)
RANK1 = (1, MAX_RANK)

DYNAMIC_OPS = frozenset("reshape expand where transpose slice split concat pad gather".split())


# -- argument helpers -------------------------------------------------------------------------


def _uint(where, what, v):
    """An IDL `[EnforceRange] unsigned long`."""
    if isinstance(v, bool) or not hasattr(v, "__index__"):
        raise TypeError(f"[{where}] {what} must be a non-negative integer, got {v!r}")
    v = int(v)
    if not 0 <= v <= 0xFFFFFFFF:
        raise TypeError(f"[{where}] {what} must be a non-negative integer below 2**32, got {v}")
    return v


def int_sequence(where, what, v, length=None, minimum=0):
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"[{where}] {what} must be a sequence of integers, got {v!r}")
    vals = int_list(where, what, list(v), length=length, minimum=minimum)
    if any(x > 0xFFFFFFFF for x in vals):
        raise TypeError(f"[{where}] {what} values must be below 2**32, got {vals}")
    return vals


def _per_dim(where, rank, first, second, builder=None):
    """Two (what, value) sequences with one unsigned value per input dimension (slice's starts
    and sizes, pad's beginning and ending padding); with `builder`, entries may be Syms."""
    (wa, a), (wb, b) = first, second
    if builder is None:
        a, b = int_sequence(where, wa, a), int_sequence(where, wb, b)
    else:
        a, b = _sizes_arg(builder, where, wa, a), _sizes_arg(builder, where, wb, b)
    if len(a) != rank or len(b) != rank:
        raise TypeError(
            f"[{where}] {wa} and {wb} must both have {rank} values (the input's rank), got {len(a)} and {len(b)}"
        )
    return a, b


def output_shape(b, where, data_type, shape):
    """Validate an inferred output shape like a tensor descriptor (valid dims, rank, bytes)."""
    return b._context._tensor_args(where, data_type, shape)[1]


# -- dynamic dimensions (shared with indexing.py and layout.py) ---------------------------------


def check_syms(b, where, what, values):
    """Sizes given as arguments (a new shape, slice starts) may be Syms taken from operand shapes:
    they must read only this graph's dynamic dimensions."""
    for v in values:
        if isinstance(v, Sym) and not v.names() <= set(b._dims):
            raise TypeError(
                f"[{where}] {what} entry {v} reads dynamic dimension(s) "
                f"{sorted(v.names() - set(b._dims))} that no input of this graph has"
            )


class Checks:
    """Size checks of one builder call: decided at build where the sizes allow, else deferred to
    every dispatch (a TypeError naming `what`). Deferred ones reach the builder on commit(), once
    the whole call has validated, so a call that raises leaves none behind."""

    def __init__(self, b):
        self.b, self.deferred = b, []

    def same(self, a, c, what):
        """Sizes a and c must be equal: True when they are (structurally) or may be (checked at
        dispatch), False when they never are."""
        if a == c:
            return True
        d = a - c
        if isinstance(d, int) or d.lo > 0 or d.hi < 0:
            return False
        self.deferred.append((self.b._require_equal, (a, c, what)))
        return True

    def positive(self, x, what):
        """Size x must be >= 1: True when it is or may be (checked at dispatch), False when it
        never is."""
        if isinstance(x, int):
            return x >= 1
        if x.hi < 1:
            return False
        if x.lo < 1:
            self.deferred.append((self.b._require_positive, (x, what)))
        return True

    def commit(self):
        for fn, args in self.deferred:
            fn(*args)
        self.deferred = []


def launch(kc, kernel, args, groups):
    """kc.launch. A kernel that reads sizes known only at dispatch never runs in the build-time
    prologue of a constant step (a slice of a constant at a dynamic offset): it is launched at
    every dispatch instead."""
    if kc._prologue and (is_dynamic(groups) or kernel.reads_dims()):
        kc._prologue = False
        try:
            kc.launch(kernel, args, groups)
        finally:
            kc._prologue = True
    else:
        kc.launch(kernel, args, groups)


def launch_1d(kc, kernel, args, n):
    """launch() over n threads."""
    launch(kc, kernel, args, grid(cdiv(n, WORKGROUP)))


def _sizes_arg(b, where, what, v):
    """int_sequence, but entries may also be Syms (sizes taken from operand shapes)."""
    if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
        raise TypeError(f"[{where}] {what} must be a sequence of integers, got {v!r}")
    v = list(v)
    syms = {k: d for k, d in enumerate(v) if isinstance(d, Sym)}
    if not syms:
        return int_sequence(where, what, v)
    check_syms(b, where, what, syms.values())
    vals = int_sequence(where, what, [0 if isinstance(d, Sym) else d for d in v])
    return [syms.get(k, d) for k, d in enumerate(vals)]


# -- strided index generation ------------------------------------------------------------------


def coords_at(var, sizes):
    """WGSL u32 coordinates (outermost first) of the flat row-major index `var` over `sizes` with
    sizes known only at dispatch: chained quotients inline (ops.chained_coords). Static shapes
    use radix (their kernels stay as they are)."""
    return chained_coords(var, sizes)[1]


def index_terms(var, dims, n_targets=1):
    """radix (ops/_index.py) for dims with sizes known only at dispatch, through coords_at."""
    cs = coords_at(var, [size for size, _ in dims])
    terms = [[] for _ in range(n_targets)]
    for c, (size, strides) in zip(cs, dims):
        if size == 1:
            continue
        for t, st in enumerate(strides):
            if isinstance(st, Sym) or st:
                terms[t].append(c if st == 1 else f"{c} * {wgsl(st)}")
    return [" + ".join(t) if t else "0u" for t in terms]


def _strided_copy(kc, name, src, dst, shape, src_strides, src_base=0, dst_strides=None, dst_base=0):
    """dst[dst_index(c)] = src[src_index(c)] for every coordinate c of `shape` (one launch).
    dst_strides=None means dst is written densely (row-major `shape`)."""
    dense = dst_strides is None
    if dense:
        dst_strides = row_strides(shape)
    n = math.prod(shape)
    # size-1 dims dropped and neighbours contiguous in both merged: fewer divisions per thread
    dims = merge_dims(list(zip(shape, zip(src_strides, dst_strides))))
    if dense and src_base == 0 and all(s == d for _, (s, d) in dims):
        # same element order as the source: no data moves at all
        kc.alias(dst, src)
        return
    if (
        dense
        and len(dims) <= 1
        and all(s == 1 for _, (s, _) in dims)
        and isinstance(src_base, int)
        and is_static(shape)
        and is_static(src.shape)
    ):
        # one contiguous range of the source (a channel split at batch 1, a slice of rows): read
        # in place when its offset is aligned (kc.view)
        if kc.view(dst, src, src_base * kc.nbytes(src) // max(1, math.prod(src.shape))):
            return
    mt = kc.move_type(src)
    if is_static(shape):
        src_index, dst_index = radix("i", dims, 2)
    elif _copy_rows(kc, name, src, dst, dims, src_base, 0 if dense else dst_base, mt):
        return
    else:  # a side that is row-major over the iteration space is read or written at `i` itself
        src_index, dst_index = index_terms("i", dims, 2)
        dense_at = row_strides([size for size, _ in dims])
        src_index = "i" if [st[0] for _, st in dims] == dense_at else src_index
        dst_index = "i" if [st[1] for _, st in dims] == dense_at else dst_index
    src_index += f" + {wgsl(src_base)}" if src_base else ""
    dst_index = "i" if dense else dst_index + (f" + {wgsl(dst_base)}" if dst_base else "")
    cshape = [size for size, _ in dims]
    kernel = Kernel(
        f"{name}_n{n}_" + "x".join(map(str, cshape or [1])) + (f"_{mt}" if mt != "u32" else ""),
        "movement.wgsl",
        {"mode": "copy", "n": n, "src_index": src_index, "dst_index": dst_index},
        (Binding("src", mt), Binding("dst", mt, True)),
    )
    launch_1d(kc, kernel, [src, dst], n)


def _copy_rows(kc, name, src, dst, dims, src_base, dst_base, mt):
    """The strided copy of coalesced `dims` with dynamic sizes as a 2-D launch (movement.wgsl
    "rows"): a row is the innermost dynamic dimension and the static ones inside it, workgroup row
    wid.y one combination of the outer dimensions. Coordinates then come from divisions by static
    sizes only (the outer ones from wid.y, where only the outermost may be dynamic). False, to
    launch 1-D instead, when no dimension but the outermost is dynamic (1-D divides by none
    either) or the counts could pass the 65535 workgroups of one dimension."""
    dyn = [k for k, (size, _) in enumerate(dims) if isinstance(size, Sym)]
    if not dyn or dyn[-1] == 0 or any(0 < k < dyn[-1] for k in dyn[:-1]):
        return False  # (an outer dynamic dimension inside another would be divided by)
    m = dyn[-1]
    outer, row = dims[:m], dims[m:]
    row_len, n_outer = math.prod(s for s, _ in row), math.prod(s for s, _ in outer)
    if high(cdiv(row_len, WORKGROUP)) > MAX_GROUPS or high(n_outer) > MAX_GROUPS:
        return False
    oc, rc = coords_at("o", [s for s, _ in outer]), coords_at("i", [s for s, _ in row])
    index = []
    for t, base in ((0, src_base), (1, dst_base)):
        if [st[t] for _, st in dims] == row_strides([s for s, _ in dims]):
            terms = [f"o * {wgsl(row_len)} + i"]  # row-major: no coordinates needed
        else:
            terms = [
                c if st[t] == 1 else f"{c} * {wgsl(st[t])}"
                for c, (size, st) in zip(oc + rc, dims)
                if size != 1 and (isinstance(st[t], Sym) or st[t])
            ]
        if base:
            terms.append(wgsl(base))
        index.append(" + ".join(terms) or "0u")
    cshape = "x".join(str(s) for s, _ in dims)
    kernel = Kernel(
        f"{name}_rows_{cshape}" + (f"_{mt}" if mt != "u32" else ""),
        "movement.wgsl",
        {"mode": "rows", "row": wgsl(row_len), "src_index": index[0], "dst_index": index[1]},
        (Binding("src", mt), Binding("dst", mt, True)),
    )
    launch(kc, kernel, [src, dst], (cdiv(row_len, WORKGROUP), n_outer, 1))
    return True


# -- reshape ----------------------------------------------------------------------------------


@builder_op(renamed={"x": "input"})
def reshape(self: Any, input: MLOperand, new_shape: Sequence[int], *, label: str | None = None) -> MLOperand:
    """The same elements in `new_shape` (a list of sizes whose product equals the input's; no -1
    placeholder, as in WebNN). Launches nothing: the output aliases the input's memory."""
    # IDL: MLOperand reshape(MLOperand input, sequence<[EnforceRange] unsigned long> newShape, optional MLOperatorOptions options = {});
    self._operand(input, "reshape", "input")
    check_support("reshape", input=input)
    shape = as_shape(new_shape, "reshape")
    check_syms(self, "reshape", "new_shape", shape)
    # no -1 to infer: equal element counts, structurally (768*batch*seq) or checked at dispatch
    checks = Checks(self)
    if not checks.same(math.prod(shape), input.size, f"[reshape] new_shape {list(shape)} element count"):
        raise TypeError(
            f"[reshape] new_shape {list(shape)} has {math.prod(shape)} elements, expected {input.size} "
            f"(the input's shape is {list(input.shape)})"
        )
    shape = output_shape(self, "reshape", input.data_type, shape)
    checks.commit()
    return self._emit1("reshape", [input], {}, input.data_type, shape, label)


def _lower_reshape(kc, node):
    # contiguous row-major compute form: same elements, same order
    kc.alias(kc.out(node), node.inputs[0])


register("reshape", {"input": ALL, "output": ALL}, lower=_lower_reshape)


# -- expand (an elementwise identity: the fused kernel broadcasts its input) ----------------------

register("expand", {"input": ALL, "output": ALL}, expr=lambda kc, n, x: x)


@builder_op(renamed={"x": "input"})
def expand(self: Any, input: MLOperand, new_shape: Sequence[int], *, label: str | None = None) -> MLOperand:
    """Broadcast the input to `new_shape` (each input dimension 1 or equal to the new one, aligned
    from the right; the rank may grow)."""
    # IDL: MLOperand expand(MLOperand input, sequence<[EnforceRange] unsigned long> newShape, optional MLOperatorOptions options = {});
    self._operand(input, "expand", "input")
    check_support("expand", input=input)
    shape = as_shape(new_shape, "expand")
    check_syms(self, "expand", "new_shape", shape)
    unidirectional("expand", input.shape, shape)
    shape = output_shape(self, "expand", input.data_type, shape)
    return self._emit1("expand", [input], {"new_shape": shape}, input.data_type, shape, label)


# -- where (elementwise select with 3-way broadcasting) ------------------------------------------

register(
    "where",
    {"condition": ("uint8",), "true_value": ALL, "false_value": ALL, "output": ALL},
    expr=lambda kc, n, c, t, f: f"select({f}, {t}, {c} != 0u)",
)


@builder_op
def where(
    self: Any, condition: MLOperand, true_value: MLOperand, false_value: MLOperand, *, label: str | None = None
) -> MLOperand:
    """Elementwise select: `true_value` where `condition` (uint8) is non-zero, else `false_value`.
    The three operands broadcast to one shape; the two values share a data type."""
    # IDL: MLOperand where(MLOperand condition, MLOperand trueValue, MLOperand falseValue, optional MLOperatorOptions options = {});
    self._operand(condition, "where", "condition")
    self._operand(true_value, "where", "true_value")
    self._operand(false_value, "where", "false_value")
    check_support("where", condition=condition, true_value=true_value, false_value=false_value)
    same_type("where", ("true_value", true_value), ("false_value", false_value))
    shape = broadcast_shapes("where", true_value.shape, false_value.shape, self)
    shape = broadcast_shapes("where", condition.shape, shape, self)
    shape = output_shape(self, "where", true_value.data_type, shape)
    return self._emit1("where", [condition, true_value, false_value], {}, true_value.data_type, shape, label)


# -- transpose ----------------------------------------------------------------------------------


def _lower_transpose(kc, node):
    x, out = node.inputs[0], kc.out(node)
    perm = node.attrs["permutation"]
    ist = row_strides(x.shape)
    _strided_copy(kc, "transpose", x, out, out.shape, [ist[p] for p in perm])


register("transpose", {"input": ALL, "output": ALL}, lower=_lower_transpose)


@builder_op(renamed={"x": "input"})
def transpose(
    self: Any, input: MLOperand, *, permutation: Sequence[int] | None = None, label: str | None = None
) -> MLOperand:
    """Permute the dimensions: output dimension i is input dimension `permutation[i]` (default:
    the reversed order)."""
    # IDL: MLOperand transpose(MLOperand input, optional MLTransposeOptions options = {});
    self._operand(input, "transpose", "input")
    check_support("transpose", input=input)
    r = input.rank
    if permutation is None:
        perm = list(range(r - 1, -1, -1))  # spec default: reverse the dimensions
    else:
        perm = int_sequence("transpose", "permutation", permutation)
        if sorted(perm) != list(range(r)):
            raise TypeError(
                f"[transpose] permutation must be a permutation of 0..{r - 1} (the input's rank is {r}), got {perm}"
            )
    shape = tuple(input.shape[p] for p in perm)
    return self._emit1("transpose", [input], {"permutation": perm}, input.data_type, shape, label)


# -- slice --------------------------------------------------------------------------------------


def _lower_slice(kc, node):
    x, out = node.inputs[0], kc.out(node)
    starts, steps = node.attrs["starts"], node.attrs["strides"]
    ist = row_strides(x.shape)
    base = sum(s * st for s, st in zip(starts, ist))
    _strided_copy(kc, "slice", x, out, out.shape, [st * k for st, k in zip(ist, steps)], base)


register("slice", {"input": ALL, "output": ALL}, lower=_lower_slice)


@builder_op(renamed={"x": "input"})
def slice(
    self: Any,
    input: MLOperand,
    starts: Sequence[int],
    sizes: Sequence[int],
    *,
    strides: Sequence[int] | None = None,
    label: str | None = None,
) -> MLOperand:  # noqa: A001 (WebNN name)
    """The block starting at `starts` with `sizes` elements per dimension, taking every `strides`-th
    element (default 1). A contiguous slice is read in place (copy-free) where the layout
    allows."""
    # IDL: MLOperand slice(MLOperand input, sequence<[EnforceRange] unsigned long> starts, sequence<[EnforceRange] unsigned long> sizes, optional MLSliceOptions options = {});
    self._operand(input, "slice", "input")
    check_support("slice", input=input)
    r = input.rank
    starts, sizes = _per_dim("slice", r, ("starts", starts), ("sizes", sizes), builder=self)
    steps = [1] * r if strides is None else int_sequence("slice", "strides", strides, length=r)
    checks = Checks(self)
    shape = []
    for d in range(r):
        start, size, dim = starts[d], sizes[d], input.shape[d]
        if not checks.positive(size, f"[slice] sizes[{d}] ({size})"):
            raise TypeError(f"[slice] sizes must be positive, got {sizes}")
        if steps[d] < 1:
            raise TypeError(f"[slice] strides must be >= 1, got {steps}")
        if not checks.positive(start + 1, f"[slice] starts[{d}] + 1 ({start} + 1)"):
            raise TypeError(f"[slice] starts must not be negative, got {starts}")
        # start + size <= dim; sizes known only at dispatch are checked then
        if not checks.positive(
            dim - start - size + 1,
            f"[slice] starts[{d}] + sizes[{d}] against the input's dimension {d}: {dim} + 1 - ({start} + {size})",
        ):
            raise TypeError(
                f"[slice] starts[{d}] + sizes[{d}] ({start} + {size}) exceeds the input's dimension {d} of size {dim}"
            )
        shape.append(cdiv(size, steps[d]))
    attrs = {"starts": starts, "sizes": sizes, "strides": steps}
    checks.commit()
    return self._emit1("slice", [input], attrs, input.data_type, tuple(shape), label)


# -- split (multi-output: one strided copy per output) -------------------------------------------


def _lower_split(kc, node):
    x = node.inputs[0]
    axis = node.attrs["axis"]
    ist = row_strides(x.shape)
    offset = 0
    for k, size in enumerate(node.attrs["sizes"]):
        out = kc.out(node, k)
        _strided_copy(kc, f"split{k}", x, out, out.shape, ist, offset * ist[axis])
        offset += size


register("split", {"input": ALL, "outputs": ALL}, ranks={"input": RANK1}, lower=_lower_split)


@builder_op(renamed={"x": "input"})
def split(
    self: Any, input: MLOperand, splits: int | Sequence[int], *, axis: int = 0, label: str | None = None
) -> list[MLOperand]:
    """Split along `axis` into a list of operands: `splits` is an int (that many equal parts) or a
    list of part sizes summing to the dimension."""
    # IDL: sequence<MLOperand> split(MLOperand input, ([EnforceRange] unsigned long or sequence<[EnforceRange] unsigned long>) splits, optional MLSplitOptions options = {});
    self._operand(input, "split", "input")
    check_support("split", input=input)
    axis = _uint("split", "axis", axis)
    if axis >= input.rank:
        raise TypeError(f"[split] axis must be below the input's rank {input.rank}, got {axis}")
    dim = input.shape[axis]
    if hasattr(splits, "__index__") and not isinstance(splits, bool):
        count = _uint("split", "splits", splits)
        if count == 0:
            raise TypeError("[split] splits (a count) must be positive, got 0")
        if dim % count:
            raise TypeError(f"[split] splits ({count}) must evenly divide the axis {axis} dimension ({dim})")
        sizes = [dim // count] * count
    else:
        sizes = int_sequence("split", "splits", splits)
        if not sizes or any(s == 0 for s in sizes):
            raise TypeError(f"[split] splits (sizes) must be a non-empty list of positive integers, got {sizes}")
        if sum(sizes) != dim:
            raise TypeError(
                f"[split] splits sizes {sizes} sum to {sum(sizes)}, expected the axis {axis} dimension ({dim})"
            )
    outs = []
    for s in sizes:
        shape = list(input.shape)
        shape[axis] = s
        outs.append((input.data_type, tuple(shape)))
    return self._emit("split", [input], {"axis": axis, "sizes": sizes}, outs, label)


# -- concat (one launch per input, each writing its slab of the same output) ---------------------


def _lower_concat(kc, node):
    out = kc.out(node)
    axis = node.attrs["axis"]
    ost = row_strides(out.shape)
    if len(node.inputs) == 1:
        kc.alias(out, node.inputs[0])
        return
    # When every dim before `axis` is 1 (channel concat at batch 1 in NCHW, ...), each input is
    # one contiguous slab of the output: its producer writes there directly (kc.place) and no
    # kernel runs. Inputs that cannot be placed are copied.
    # (not with dynamic sizes: a slab offset known only at dispatch cannot be bound)
    contiguous = all(d == 1 for d in out.shape[:axis]) and is_static(out.shape)
    item = kc.nbytes(out) // max(1, math.prod(out.shape)) if contiguous else 0
    starts, offset = [], 0
    for x in node.inputs:
        starts.append(offset * ost[axis])
        offset += x.shape[axis]
    slabs = [(x, s * item) for x, s in zip(node.inputs, starts)]
    for k, (x, start) in enumerate(zip(node.inputs, starts)):
        if contiguous and kc.place(x, out, start * item, slabs):
            continue
        _strided_copy(kc, f"concat{k}", x, out, x.shape, row_strides(x.shape), 0, ost, start)


register("concat", {"inputs": ALL, "output": ALL}, ranks={"inputs": RANK1}, lower=_lower_concat)


@builder_op
def concat(self: Any, inputs: Sequence[MLOperand], axis: int, *, label: str | None = None) -> MLOperand:
    """Join `inputs` (a list of operands of one data type and rank, equal but for `axis`) along
    `axis`. Launches nothing where it can: each producer writes straight into its slab of the
    output."""
    # IDL: MLOperand concat(sequence<MLOperand> inputs, [EnforceRange] unsigned long axis, optional MLOperatorOptions options = {});
    if isinstance(inputs, (str, bytes)) or not hasattr(inputs, "__iter__"):
        raise TypeError(f"[concat] inputs must be a sequence of MLOperand, got {type(inputs).__name__}")
    inputs = list(inputs)
    for k, x in enumerate(inputs):
        self._operand(x, "concat", f"inputs[{k}]")
    if not inputs:
        raise TypeError("[concat] inputs must not be empty")
    axis = _uint("concat", "axis", axis)
    first = inputs[0]
    check_support("concat", inputs=first)
    if axis >= first.rank:
        raise TypeError(f"[concat] axis must be below the inputs' rank {first.rank}, got {axis}")
    checks = Checks(self)
    total = 0
    for k, x in enumerate(inputs):
        same_type("concat", ("inputs[0]", first), (f"inputs[{k}]", x))
        if x.rank != first.rank or any(
            d != axis and not checks.same(x.shape[d], first.shape[d], f"[concat] inputs[{k}] dimension {d}")
            for d in range(first.rank)
        ):
            raise TypeError(
                f"[concat] inputs[{k}] shape {list(x.shape)} must match inputs[0] shape "
                f"{list(first.shape)} except along axis {axis}"
            )
        total += x.shape[axis]
    shape = list(first.shape)
    shape[axis] = total
    shape = output_shape(self, "concat", first.data_type, shape)
    checks.commit()
    return self._emit1("concat", inputs, {"axis": axis}, first.data_type, shape, label)


# -- pad --------------------------------------------------------------------------------------

PAD_MODES = ("constant", "edge", "reflection")


def _pad_value(data_type, value, t):
    """The spec casts the pad value to the input's data type; integers saturate. `t` is the
    compute type (the literal's type)."""
    import numpy as np

    if t in dtypes.FLOAT_COMPUTE:
        with np.errstate(over="ignore"):
            v = float(np.float16(value)) if data_type == "float16" else float(np.float32(value))
        return lit(v, t)
    info = np.iinfo(dtypes.NUMPY[data_type])
    if hasattr(value, "__index__"):
        v = int(value)  # exact for 64-bit integers beyond 2**53
    else:
        v = float(value)
        if v != v:  # NaN
            v = 0.0
    v = max(info.min, min(info.max, v))
    return lit(int(v), t)


def _i32(x):
    """WGSL i32 of a size (a literal, or the size read at dispatch)."""
    return f"{x}i" if isinstance(x, int) else f"i32({wgsl(x)})"


def _lower_pad(kc, node):
    x, out = node.inputs[0], kc.out(node)
    begin, mode = node.attrs["beginning_padding"], node.attrs["mode"]
    t = kc.wtype(x)
    ist = row_strides(x.shape)
    dyn = None if is_static(out.shape) else coords_at("i", list(out.shape))
    lines, inner = [], 1
    lines.append("    var s = 0i;")
    if mode == "constant":
        lines.append("    var inside = true;")
    for d in range(out.rank - 1, -1, -1):
        n_out, n_in = out.shape[d], x.shape[d]
        if n_in == 1 and n_out == 1:
            inner *= n_out
            continue
        c = f"(i / {inner}u)" if inner != 1 else "i"
        if d > 0:
            c = f"({c} % {n_out}u)"
        if dyn is not None:
            c = dyn[d]
        lines.append(f"    var c{d} = i32({c}) - {begin[d]}i;")
        if mode == "constant":
            lines.append(f"    inside = inside && c{d} >= 0i && c{d} < {_i32(n_in)};")
        elif mode == "edge":
            lines.append(f"    c{d} = clamp(c{d}, 0i, {_i32(n_in - 1)});")
        else:  # reflection without repeating the edge; padding < size is validated
            lines.append(f"    c{d} = {_i32(n_in - 1)} - abs({_i32(n_in - 1)} - abs(c{d}));")
        lines.append(f"    s = s + c{d} * {_i32(ist[d])};")
        inner *= n_out
    if mode == "constant":
        # never read outside the input: the index is only used when inside
        lines.append(f"    var v = {_pad_value(x.data_type, node.attrs['value'], t)};")
        lines.append("    if (inside) { v = src[u32(s)]; }")
        lines.append("    dst[i] = v;")
    else:
        lines.append("    dst[i] = src[u32(s)];")
    n = out.size
    name = f"pad_{mode}_{t}_n{n}"
    kernel = Kernel(
        name,
        "movement.wgsl",
        {"mode": "pad", "n": n, "body": "\n".join(lines)},
        (Binding("src", t), Binding("dst", t, True)),
    )
    launch_1d(kc, kernel, [x, out], n)


register("pad", {"input": ALL, "output": ALL}, ranks={"input": RANK1}, lower=_lower_pad)


@builder_op(renamed={"x": "input"})
def pad(
    self: Any,
    input: MLOperand,
    beginning_padding: Sequence[int],
    ending_padding: Sequence[int],
    *,
    mode: str = "constant",
    value: float = 0,
    label: str | None = None,
) -> MLOperand:
    """Pad with `beginning_padding` / `ending_padding` elements per dimension. mode: "constant"
    (filled with `value`, default 0), "edge" (the edge element repeated) or "reflection" (mirrored
    without repeating the edge; each padding smaller than its dimension)."""
    # IDL: MLOperand pad(MLOperand input, sequence<[EnforceRange] unsigned long> beginningPadding, sequence<[EnforceRange] unsigned long> endingPadding, optional MLPadOptions options = {});
    self._operand(input, "pad", "input")
    check_support("pad", input=input)
    r = input.rank
    begin, end = _per_dim("pad", r, ("beginning_padding", beginning_padding), ("ending_padding", ending_padding))
    if mode not in PAD_MODES:
        raise TypeError(f"[pad] mode must be one of {', '.join(PAD_MODES)}, got {mode!r}")
    if isinstance(value, (bool, str, bytes)) or not hasattr(value, "__float__"):
        raise TypeError(f"[pad] value must be a number, got {value!r}")
    checks = Checks(self)
    if mode == "reflection":
        for d in range(r):
            dim = input.shape[d]
            if isinstance(dim, Sym):  # a dynamic dimension: checked at dispatch where need be
                fits = all(
                    checks.positive(dim - p, f"[pad] dimension {d} ({dim}) minus its reflection padding {p}")
                    for p in (begin[d], end[d])
                )
            else:
                fits = begin[d] < dim and end[d] < dim
            if not fits:
                raise TypeError(
                    f"[pad] reflection padding must be smaller than the dimension: dimension {d} has size "
                    f"{input.shape[d]}, got padding {begin[d]} and {end[d]}"
                )
    shape = output_shape(self, "pad", input.data_type, [bg + d + e for bg, d, e in zip(begin, input.shape, end)])
    attrs = {
        "beginning_padding": begin,
        "ending_padding": end,
        "mode": mode,
        "value": value,
    }
    checks.commit()
    return self._emit1("pad", [input], attrs, input.data_type, shape, label)


# -- gather -----------------------------------------------------------------------------------


def _ilit(x, t):
    """A size as a value of index compute type t (i32, u32, i64): a literal, or read at dispatch."""
    return lit(x, t) if isinstance(x, int) else convert(wgsl(x), "u32", t)


def _lower_gather(kc, node):
    x, idx = node.inputs
    out = kc.out(node)
    axis = node.attrs["axis"]
    dim = x.shape[axis]
    inner = math.prod(x.shape[axis + 1 :])
    count = idx.size
    n = out.size
    it = kc.wtype(idx)
    # Output coordinate (outer, j, k): outer over input dims before axis, j over the indices,
    # k over input dims after axis.
    if all(isinstance(v, int) for v in (dim, inner, count)):
        k_expr = f"(i % {inner}u)" if inner != 1 else "0u"
        j_expr = f"((i / {inner}u) % {count}u)" if inner != 1 else f"(i % {count}u)"
        o_expr = f"(i / {inner * count}u)"
        src = f"{o_expr} * {dim * inner}u + a * {inner}u + {k_expr}"
    else:  # sizes read at dispatch: no division or remainder that a size of 1 makes useless
        outer = math.prod(x.shape[:axis])
        o_off, j_expr, k_expr = index_terms(
            "i", [(outer, (dim * inner, 0, 0)), (count, (0, 1, 0)), (inner, (0, 0, 1))], 3
        )
        src = " + ".join(t for t in (o_off, "a" if inner == 1 else f"a * {wgsl(inner)}", k_expr) if t != "0u")
    if it == "i64e":
        fix = f"    let a = wrap_i64e(idx[{j_expr}], {wgsl(dim)});"  # shaders/int64e.wgsl
    elif it in ("i32", "i64"):
        # negative indices count from the end; anything still out of range is clamped so no
        # thread ever reads outside the input
        fix = (
            f"    var v = idx[{j_expr}];\n"
            f"    v = select(v, v + {_ilit(dim, it)}, v < {lit(0, it)});\n"
            f"    let a = u32(clamp(v, {lit(0, it)}, {_ilit(dim - 1, it)}));"
        )
    else:
        fix = f"    let a = u32(min(idx[{j_expr}], {_ilit(dim - 1, it)}));"
    body = f"{fix}\n    dst[i] = src[{src}];"
    mt = kc.move_type(x)
    kernel = Kernel(
        f"gather_{it}_n{n}_d{dim}_k{inner}" + (f"_{mt}" if mt != "u32" else ""),
        "movement.wgsl",
        {"mode": "gather", "n": n, "body": body},
        (Binding("src", mt), Binding("idx", it), Binding("dst", mt, True)),
    )
    launch_1d(kc, kernel, [x, idx, out], n)


register(
    "gather",
    {"input": ALL, "indices": INDEX_TYPES, "output": ALL},
    ranks={"input": RANK1},
    lower=_lower_gather,
)


@builder_op(renamed={"x": "input"})
def gather(self: Any, input: MLOperand, indices: MLOperand, *, axis: int = 0, label: str | None = None) -> MLOperand:
    """Take entries of the input along `axis` at `indices` (an operand of int32, uint32 or int64;
    negative indices count from the end). Output shape: input.shape[:axis] + indices.shape +
    input.shape[axis + 1:]. Out-of-range indices are clamped, as WebNN allows."""
    # IDL: MLOperand gather(MLOperand input, MLOperand indices, optional MLGatherOptions options = {});
    self._operand(input, "gather", "input")
    self._operand(indices, "gather", "indices")
    check_support("gather", input=input, indices=indices)
    axis = _uint("gather", "axis", axis)
    if axis >= input.rank:
        raise TypeError(f"[gather] axis must be below the input's rank {input.rank}, got {axis}")
    shape = input.shape[:axis] + indices.shape + input.shape[axis + 1 :]
    shape = output_shape(self, "gather", input.data_type, shape)
    return self._emit1("gather", [input, indices], {"axis": axis}, input.data_type, shape, label)
