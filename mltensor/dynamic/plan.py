"""What a built graph with dynamic dimensions checks and computes at each dispatch.

`DynamicPlan` holds the graph's input and output shapes (ints and Syms), the checks its
operators deferred to dispatch (a size that must be positive, two sizes that must be equal),
and the compiled function giving every launch's workgroup counts for a set of sizes. A dispatch
binds the named dimensions from its input tensors' shapes (TypeError for a rank, a static size or
a maximum that does not fit, or one name given two sizes), runs the checks, sizes the outputs
(`compute_shapes`), and records the launches with those sizes as immediate data.
"""

import numpy as np

from .dims import Sym, bind, check_derived, evaluate
from .kernels import PyCSE, compile_groups, may_be_zero, pack, py_expr, py_var


class DynamicPlan:
    def __init__(self, names, maxes, inputs, outputs, constraints, groups, reads_dims):
        self.names = tuple(names)  # sorted: the immediate struct's field order
        self.maxes = dict(maxes)
        self.inputs = dict(inputs)  # name -> shape pattern
        self.outputs = dict(outputs)
        self.constraints = list(constraints)
        self.groups_for = compile_groups(groups, self.names)
        self.reads_dims = list(reads_dims)  # per launch: its kernel reads the immediates
        # launches whose workgroup count is 0 at some sizes (a size bucket's variant, gated off
        # outside it: ops/_gemm.py): skipped by the replay where it is, their pipelines made at
        # the first dispatch that runs them (front/graph.py MLGraph._create)
        self.maybe_off = [i for i, g in enumerate(groups) if may_be_zero(g)]
        self._cache = {}  # sizes -> (immediates, flat workgroup counts as uint32)
        self._fast = None  # compiled bind() for the common case
        self._out_fn = None
        self._imm_fn = lambda values: pack(self.names, values)

    def set_blocks(self, lists):
        """The derived sizes and epilogue constants of the graph's kernels, (derived, consts) per
        block of the immediate data after the first (dynamic/kernels.py dims_blocks): each block
        the dimensions' sizes, then those expressions' values, then the constants, computed by
        one compiled function per dispatch's sizes."""
        self._cache.clear()
        if not lists:
            self._imm_fn = lambda values: pack(self.names, values)
            return
        dims, cse = ", ".join(py_var(n) for n in self.names), PyCSE()
        parts = [dims] + [
            dims + "".join(f", {cse.sym(x)}" for x in d) + "".join(f", {c}" for c in consts) for d, consts in lists
        ]
        src = f"def f({dims}):\n" + cse.text() + "    return [" + ", ".join(parts) + "]\n"
        env = {"min": min, "max": max}
        exec(compile(src, "<dynamic derived sizes>", "exec"), env)
        fn = env["f"]
        self._imm_fn = lambda values: np.array(fn(*(values[n] for n in self.names)), dtype=np.uint32)

    def bind(self, shapes, where="dispatch"):
        """{dimension name: size} for {input name: concrete shape}; TypeError when they do not
        fit the graph, or break a check an operator deferred to dispatch. The common case runs
        the compiled checker (a decode loop binds new sizes every step); any failure is
        diagnosed by the general path below, which raises the precise error."""
        if self._fast is None:
            self._fast = _compile_binder(self)
        try:
            values = self._fast(shapes)
        except Exception:
            values = None
        if values is not None:
            return values
        return self._bind_slow(shapes, where)

    def _bind_slow(self, shapes, where):
        values = {}
        for name, pattern in self.inputs.items():
            bind(pattern, shapes[name], values, f"[{where}] input {name!r}")
        for name, pattern in self.inputs.items():
            check_derived(pattern, shapes[name], values, f"[{where}] input {name!r}")
        missing = [n for n in self.names if n not in values]
        if missing:  # a dimension no input names directly (only through expressions)
            raise TypeError(f"[{where}] the inputs do not fix dynamic dimension(s) {missing}")
        for kind, a, b, what in self.constraints:
            va = evaluate(a, values)
            if kind == "positive" and va < 1:
                raise TypeError(f"{what} is {va} for these sizes ({_sizes(values)}); it must be >= 1")
            if kind == "equal" and va != evaluate(b, values):
                raise TypeError(f"{what}: {a} = {va} and {b} = {evaluate(b, values)} must be equal ({_sizes(values)})")
        return values

    def output_shapes(self, values):
        if self._out_fn is None:
            names = sorted(self.outputs)
            src = (
                "def f("
                + ", ".join(py_var(n) for n in self.names)
                + "):\n    return {"
                + ", ".join(f"{n!r}: (" + "".join(f"{py_expr(d)}, " for d in self.outputs[n]) + ")" for n in names)
                + "}\n"
            )
            env = {}
            exec(compile(src, "<dynamic output shapes>", "exec"), env)
            fn = env["f"]
            self._out_fn = lambda v: fn(*(v[n] for n in self.names))
        return self._out_fn(values)

    def launch_data(self, values):
        """LaunchData for these sizes, cached for the last few size sets (a batch loop repeats
        them; a decode loop does not)."""
        key = tuple(values[n] for n in self.names)
        hit = self._cache.get(key)
        if hit is None:
            groups = self.groups_for(values)
            off = None
            if self.maybe_off:
                off = (
                    tuple(i for i in self.maybe_off if not (groups[3 * i] and groups[3 * i + 1] and groups[3 * i + 2]))
                    or None
                )
            hit = LaunchData(self._imm_fn(values), groups, off)
            if len(self._cache) >= 16:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = hit
        return hit


def _sizes(values):
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))


class LaunchData:
    """What recording a dispatch at some sizes needs: the immediate bytes and the workgroup
    counts, as arrays the compiled replay loop reads by address and as Python values. `groups`:
    every launch's counts; `off`: the launches with no workgroups at these sizes that the replay
    skips (a sorted tuple, None when none is), `run` and `xyz` the counts of the others; `made`:
    the graph has created the pipelines of the others (front/graph.py MLGraph._create)."""

    __slots__ = ("imm", "xyz", "groups", "run", "off", "made", "imm_addr", "xyz_addr", "imm_ptr", "ptrs")

    def __init__(self, imm, groups, off=None):
        from wgpu.backends.wgpu_native._ffi import ffi

        self.imm = imm
        self.groups = list(groups)
        self.off = off
        self.made = False
        if off:
            skip = set(off)
            self.run = [v for i in range(len(groups) // 3) if i not in skip for v in groups[3 * i : 3 * i + 3]]
        else:
            self.run = self.groups
        self.xyz = np.asarray(self.run, dtype=np.uint32)
        self.imm_addr = int(imm.ctypes.data)
        self.xyz_addr = int(self.xyz.ctypes.data)
        self.imm_ptr = ffi.cast("void *", self.imm_addr)  # for wgpu-native's own SetImmediates
        self.ptrs = {0: self.imm_ptr}  # byte offset -> pointer (a block's: ptr())

    def ptr(self, off):
        """A pointer to the immediate bytes at `off` (made once per offset: dispatches reuse it)."""
        p = self.ptrs.get(off)
        if p is None:
            from wgpu.backends.wgpu_native._ffi import ffi

            p = self.ptrs[off] = ffi.cast("void *", self.imm_addr + off)
        return p


def _compile_binder(plan):
    """A function {input: shape} -> {name: size}, or None when anything is off (the caller then
    runs the general path for the error): one Python function with every check unrolled."""
    lines, derived, seen = [], [], set()
    for name, pattern in plan.inputs.items():
        lines.append(f"    s = shapes[{name!r}]")
        lines.append(f"    if len(s) != {len(pattern)}: return None")
        for i, p in enumerate(pattern):
            if isinstance(p, int):
                lines.append(f"    if s[{i}] != {p}: return None")
            elif len(p.terms) == 1 and p == Sym.dim(p.name, p.max_size):
                v = py_var(p.name)
                if p.name in seen:
                    lines.append(f"    if s[{i}] != {v}: return None")
                else:
                    seen.add(p.name)
                    lines.append(f"    {v} = s[{i}]")
                    lines.append(f"    if not 1 <= {v} <= {p.max_size}: return None")
            else:
                derived.append((name, i, p))
    if set(plan.names) - seen:
        return lambda shapes: None
    for name, i, p in derived:
        lines.append(f"    if shapes[{name!r}][{i}] != {py_expr(p)}: return None")
    for kind, a, b, _ in plan.constraints:
        if kind == "positive":
            lines.append(f"    if {py_expr(a)} < 1: return None")
        else:
            lines.append(f"    if {py_expr(a)} != {py_expr(b)}: return None")
    ret = ", ".join(f"{n!r}: {py_var(n)}" for n in plan.names)
    src = "def f(shapes):\n" + "\n".join(lines) + "\n    return {" + ret + "}\n"
    env = {"min": min, "max": max}
    exec(compile(src, "<dynamic bind>", "exec"), env)
    return env["f"]
