"""Sizes at dispatch: how kernels read dynamic dimensions and the host sizes their launches.

A graph with dynamic dimensions passes their values to its kernels as WebGPU immediate data (the
native `immediates` feature: push constants, set in the command stream right before the
dispatches, so two dispatches of one graph with different sizes in one command buffer each see
their own, and nothing is allocated or written through the queue per dispatch). Every kernel of
the graph that reads a size declares the same struct, one u32 per named dimension in name order:

    struct Dims { d_past: u32, d_seq: u32 }
    var<immediate> dims: Dims;

Lowerings never write this: they render sizes with `dims.wgsl(x)` (a literal for a static size,
an expression over `dims.*` for a Sym), and `KernelContext.launch` marks the kernels whose
parameters mention `dims.d_` (runtime/wgsl.Kernel.dims), which adds the declaration and the
pipeline layout's immediate range. Workgroup counts that depend on sizes are `Fold` (a 1-D count
folded past 65535 like `grid`) or tuples holding Syms, evaluated per dispatch by
`concrete_groups`.

The same immediates carry launch parameters (SizeParams, issue 29): static sizes of kernels that
opt in, fields `p0, p1, ...` after the dimensions, each launch its own values (Kernel.sizes), so
kernels differing only in sizes share one pipeline. `immediates_layout` says where each launch
takes its immediates from; other static sizes stay WGSL constants.
"""

import numpy as np

from ..errors import NotSupportedError
from ..switches import switch
from .dims import Sym, derived_field, evaluate, field_name, low, param_field

FEATURE = "immediates"
MAX_GROUPS = 65535  # workgroups along one dimension of a launch (WebGPU's default limit)
MAX_DIMS = 32  # 128 bytes of immediates (the smallest max-immediate-size seen: lavapipe)


def declaration(names, n_params=0, n_derived=0, n_consts=0):
    """WGSL declaring the immediate struct for dimension names (sorted), then n_derived derived
    sizes (dims.py hoisting), then n_params launch parameters (SizeParams), then n_consts
    constants of a fused epilogue (f32 bits, `const_field`)."""
    fields = ", ".join(
        [f"{field_name(n)}: u32" for n in names]
        + [f"{derived_field(k)}: u32" for k in range(n_derived)]
        + [f"{param_field(k)}: u32" for k in range(n_params)]
        + [f"{const_field(k)}: u32" for k in range(n_consts)]
    )
    return f"struct Dims {{ {fields} }}\nvar<immediate> dims: Dims;\n"


def room(device):
    """How many u32 immediates a kernel may declare on `device` (0 without the feature)."""
    if FEATURE not in device.features:
        return 0
    return min(MAX_DIMS, device.limits.get("max-immediate-size", 0) // 4)


class SizeParams:
    """Static sizes of one kernel passed as launch parameters (issue 29: fewer distinct
    pipelines). A lowering calls `P(size)` for each size it renders: a value >= 2 becomes the
    next parameter slot, a Sym rendered as `dims.p<slot>` and read from the launch's immediate
    data, the value kept in `values`; 0, 1 (structural: broadcasting, skipped dimensions) and
    anything once the slots run out stay the ints they are. The lowering builds the kernel with
    `sizes=P.values`: kernels whose WGSL differs only in these values then share one pipeline,
    each launch setting its own values (front/graph.py). Bounds of a parameter are its
    value, so every decision a lowering takes from them is the static build's; what depends on
    the value shows in the WGSL (a different kernel), what does not reads the parameter.
    Disabled (every size its int) in graphs with dynamic dimensions, in build-time prologues,
    on devices without immediates, and with MLTENSOR_NO_SIZE_PARAMS=1."""

    __slots__ = ("values", "cap")

    def __init__(self, cap):
        self.values = []
        self.cap = cap

    def __call__(self, v):
        if isinstance(v, bool) or not isinstance(v, int) or v < 2 or len(self.values) >= self.cap or v > 0xFFFFFFFF:
            return v
        self.values.append(v)
        return Sym.param(len(self.values) - 1, v)

    def __bool__(self):  # (a disabled set is still callable)
        return self.cap > 0


def params_enabled():
    return not switch("MLTENSOR_NO_SIZE_PARAMS")


def derived_enabled():
    """Derived sizes (dims.py hoisting) unless MLTENSOR_NO_DERIVED_SIZES=1: then kernels render
    every size over the dynamic dimensions inline, as before (for comparison)."""
    return not switch("MLTENSOR_NO_DERIVED_SIZES")


def pack(names, values):
    """The immediate bytes for {name: size}, in the struct's field order."""
    return np.array([values[n] for n in names], dtype=np.uint32)


def const_field(slot):
    """The WGSL struct field holding a fused epilogue's scalar constant `slot` (its f32 bits:
    lower.KernelContext.epilogue_const)."""
    return f"c{slot}"


def words(kernel, values):
    """The immediate words of one kernel reading dynamic dimensions, for {name: size}: the
    dimensions' sizes, then its derived sizes' values."""
    return np.array(
        [values[n] for n in kernel.dims] + [evaluate(x, values) for x in kernel.derived] + list(kernel.consts),
        dtype=np.uint32,
    )


def check_device(device, names, where="build"):
    """NotSupportedError unless `device` can pass len(names) sizes as immediate data."""
    if FEATURE not in device.features:
        raise NotSupportedError(
            f"[{where}] dynamic dimensions need the adapter feature '{FEATURE}' (push constants), "
            "which this device lacks: give every dimension a fixed size"
        )
    room = device.limits.get("max-immediate-size", 0) // 4
    if len(names) > min(MAX_DIMS, room):
        raise NotSupportedError(
            f"[{where}] {len(names)} dynamic dimensions ({', '.join(names)}); at most "
            f"{min(MAX_DIMS, room)} fit in this device's immediate data"
        )


def dims_blocks(kernels):
    """The blocks of a dispatch's immediate data in a graph with dynamic dimensions: block 0 the
    dimensions' sizes (kernels without derived sizes), then one per distinct list of derived
    sizes (Kernel.derived) and epilogue constants (Kernel.consts): the dimensions' sizes followed
    by those. ({block_key: byte offset}, (derived, consts) in block order: DynamicPlan.set_blocks.)"""
    n = next((len(k.dims) for k in kernels if k.dims), 0)
    offsets, lists, at = {((), ()): 0}, [], 4 * n
    for k in kernels:
        key = block_key(k)
        if k.dims and key not in offsets:
            offsets[key] = at
            lists.append((k.derived, k.consts))
            at += 4 * (n + len(k.derived) + len(k.consts))
    return offsets, lists


def block_key(kernel):
    """What a kernel's block of a dispatch's immediate data holds after the dimensions: its
    derived sizes and its epilogue's constants."""
    return tuple(x.key for x in kernel.derived), kernel.consts


def immediates_layout(kernels, blocks=None):
    """Where each launch of a graph takes its immediate data: a list of (byte offset, byte size)
    per launch, (0, 0) where nothing needs setting, and the launch parameters' words (a uint32
    array, their offsets count from its start). The dimensions of a graph with dynamic ones are
    a struct in each dispatch's own data (DynamicPlan.launch_data), at offset 0, or in the block
    of the kernel's derived sizes (`blocks`, dims_blocks: the graph's, for a subset of its
    launches), set after each pipeline change (the same pipeline keeps them); launch parameters are each launch's own
    (Kernel.sizes), set after a pipeline change and wherever they differ from the previous
    launch's (consecutive launches of one shared pipeline at different sizes). A kernel declares
    one or the other (SizeParams are off in graphs with dynamic dimensions). Also `rows`: each
    launch's (offset, size) whether or not it needs setting (a replay that sets every pipeline
    sets them all)."""
    if blocks is None:
        blocks = dims_blocks(kernels)[0]
    rows, at, words, prev = [], [], [], None
    for k in kernels:
        size = k.immediates()
        # (consecutive launches of one kernel keep its immediates unless their values differ:
        # launch parameters, or an epilogue's constants)
        row = (k.key, ("dims", k.consts) if k.dims else k.sizes + k.consts)
        if not size:
            rows.append((0, 0))
        elif k.dims:
            if k.sizes:
                raise NotSupportedError(f"[build] kernel {k.name} reads dynamic dimensions and launch parameters")
            rows.append((blocks[block_key(k)], size))
        elif row == prev:
            rows.append(rows[-1])
        else:
            rows.append((4 * len(words), size))
            words.extend(k.sizes + k.consts)
        at.append((0, 0) if row == prev else rows[-1])
        prev = row
    return rows, at, np.array(words or [0], dtype=np.uint32)


def grid(n_groups):
    """Workgroup counts for n_groups 1-D groups, folded into 2-D past the per-dimension limit.
    Kernels rebuild the linear group index with `wid.y * nwg.x + wid.x`. A count that is a Sym
    (known at dispatch) gives a Fold, folded the same way per dispatch."""
    if isinstance(n_groups, Sym):
        return Fold(n_groups)
    n_groups = max(1, int(n_groups))
    if n_groups <= MAX_GROUPS:
        return (n_groups, 1, 1)
    y = -(-n_groups // MAX_GROUPS)
    x = -(-n_groups // y)
    return (x, y, 1)


class Fold:
    """A 1-D workgroup count known at dispatch, folded into 2-D past 65535 as grid does."""

    __slots__ = ("n",)

    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return f"Fold({self.n})"


def is_dynamic(groups):
    return isinstance(groups, Fold) or any(isinstance(g, Sym) for g in groups)


def may_be_zero(groups):
    """Whether a launch's workgroup count may be 0 at some sizes (bounds: an undecided count
    counts as possibly 0)."""
    if isinstance(groups, Fold):
        return low(groups.n) < 1
    return any(low(g) < 1 for g in groups)


def concrete_groups(groups, values):
    """(x, y, z) workgroup counts of a launch for {name: size}."""
    if isinstance(groups, Fold):
        n = evaluate(groups.n, values)
        return grid(n) if n > 0 else (0, 1, 1)
    out = tuple(max(0, evaluate(g, values)) for g in groups)
    if any(g > MAX_GROUPS for g in out):
        raise NotSupportedError(
            f"[dispatch] these sizes need {out} workgroups, more than {MAX_GROUPS} along one dimension"
        )
    return out


def compile_groups(all_groups, names):
    """A function {name: size} -> flat [x0, y0, z0, x1, ...] for a list of launches' groups:
    the Sym expressions are compiled once into one Python function (a decode loop sizes every
    launch at every step)."""
    lines, env, cse = [], {"_fold": _fold, "MAXG": MAX_GROUPS}, PyCSE()
    for i, g in enumerate(all_groups):
        if isinstance(g, Fold):
            lines.append(f"_fold({cse.sym(g.n)})")
        else:  # (a count of 0 is a gated-off variant, ops/_gemm.py: wgpu makes it a no-op)
            lines.append("(" + ", ".join(f"max(0, {cse.sym(x)})" for x in g) + ")")
    args = ", ".join(f"{py_var(n)}" for n in names)
    body = "".join(f"    o.extend({x})\n" for x in lines)
    src = "def f(" + args + "):\n" + cse.text() + "    o = []\n" + body + "    return o\n"
    exec(compile(src, "<dynamic launch sizes>", "exec"), env)
    fn = env["f"]

    def groups_for(values):
        out = fn(*(values[n] for n in names))
        if max(out, default=0) > MAX_GROUPS:
            raise NotSupportedError(
                f"[dispatch] these sizes need more than {MAX_GROUPS} workgroups along one dimension"
            )
        return out

    return groups_for


class PyCSE:
    """Size expressions as Python statements, each distinct expression and division computed
    once into a local (`t<k>`): the functions evaluated per dispatch (workgroup counts, derived
    sizes) share most of their subexpressions, a convolution's ((h - 1) // 2) // 2 across every
    later layer."""

    def __init__(self):
        self.lines, self.names = [], {}

    def _local(self, key, expr):
        v = self.names.get(key)
        if v is None:
            v = self.names[key] = f"t{len(self.names)}"
            self.lines.append(f"    {v} = {expr}\n")
        return v

    def sym(self, x):
        if isinstance(x, int):
            return str(x)
        if x.key in self.names:
            return self.names[x.key]
        parts = ["*".join([str(c)] + [self.atom(a) for a in m]) for m, c in x.terms.items()]
        return self._local(x.key, " + ".join(parts))

    def atom(self, a):
        if a.kind == "dim":
            return py_var(a.args[0])
        if a.kind == "param":
            return str(a.args[1])
        x, y = (self.sym(v) for v in a.args)
        return self._local(
            a.key, {"div": f"{x} // {y}", "mod": f"{x} % {y}", "max": f"max({x}, {y})", "min": f"min({x}, {y})"}[a.kind]
        )

    def text(self):
        return "".join(self.lines)


def _fold(n):
    return grid(n) if n > 0 else (0, 1, 1)


def py_var(name):
    """The Python variable holding dimension `name` in the generated size functions."""
    return "v_" + field_name(name)


def py_expr(x):
    """A Python expression of a size over the variables py_var(name)."""
    if isinstance(x, int):
        return str(x)
    parts = []
    for m, c in x.terms.items():
        factors = [str(c)] + [_py_atom(a) for a in m]
        parts.append("*".join(factors))
    return "(" + " + ".join(parts) + ")"


def _py_atom(a):
    if a.kind == "dim":
        return py_var(a.args[0])
    if a.kind == "param":
        return str(a.args[1])
    x, y = (py_expr(v) for v in a.args)
    return {"div": f"({x} // {y})", "mod": f"({x} % {y})", "max": f"max({x}, {y})", "min": f"min({x}, {y})"}[a.kind]
