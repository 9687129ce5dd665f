"""What a built graph with dynamic dimensions checks and computes at each dispatch.

`DynamicPlan` holds the graph's input and output shapes (ints and Syms), the checks its
operators deferred to dispatch (a size that must be positive, two sizes that must be equal),
and the compiled function giving every launch's workgroup counts for a set of sizes. A dispatch
binds the named dimensions from its input tensors' shapes (TypeError for a rank, a static size or
a maximum that does not fit, or one name given two sizes), runs the checks, sizes the outputs
(`compute_shapes`), and records the launches with those sizes as immediate data.
"""

import numpy as np

from .dims import bind, check_derived, evaluate
from .kernels import compile_groups, pack


class DynamicPlan:
    def __init__(self, names, maxes, inputs, outputs, constraints, groups, reads_dims):
        self.names = tuple(names)  # sorted: the immediate struct's field order
        self.maxes = dict(maxes)
        self.inputs = dict(inputs)  # name -> shape pattern
        self.outputs = dict(outputs)
        self.constraints = list(constraints)
        self.groups_for = compile_groups(groups, self.names)
        self.reads_dims = list(reads_dims)  # per launch: its kernel reads the immediates
        self._cache = {}  # sizes -> (immediates, flat workgroup counts as uint32)
        self._flags = None

    def native_flags(self, ffi):
        """reads_dims as a C array for the compiled replay loop (made once)."""
        if self._flags is None:
            self._flags = ffi.new("uint8_t[]", [1 if r else 0 for r in self.reads_dims] or [0])
        return self._flags

    def bind(self, shapes, where="dispatch"):
        """{dimension name: size} for {input name: concrete shape}; TypeError when they do not
        fit the graph, or break a check an operator deferred to dispatch."""
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
                raise TypeError(f"{what}: {a} = {va} and {b} = {evaluate(b, values)} must be equal "
                                f"({_sizes(values)})")
        return values

    def output_shapes(self, values):
        return {n: evaluate(s, values) for n, s in self.outputs.items()}

    def launch_data(self, values):
        """(immediate bytes, workgroup counts [x0, y0, z0, ...] as uint32) for these sizes, cached
        for the last few size sets (a batch loop repeats them; a decode loop does not)."""
        key = tuple(values[n] for n in self.names)
        hit = self._cache.get(key)
        if hit is None:
            hit = (pack(self.names, values), np.asarray(self.groups_for(values), dtype=np.uint32))
            if len(self._cache) >= 16:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = hit
        return hit


def _sizes(values):
    return ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
