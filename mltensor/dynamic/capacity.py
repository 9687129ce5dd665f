"""How an InferenceSession sizes the dynamic dimensions of an ONNX model.

Every input dimension the model leaves unknown (a dim_param such as "sequence", or none) and
`free_dimensions` does not pin becomes a dynamic dimension named by its dim_param (or
"<input>_<axis>"), so one build serves every size. Its maximum, which sizes the buffers, is
`max_dimensions[name]` when given (a larger feed is a TypeError); otherwise it starts at the first
feed's size rounded up to a power of two (at least MIN_CAPACITY) and doubles when a feed outgrows
it: a growing decode loop rebuilds O(log n) times, and rebuilds compile nothing new (kernels read
sizes at dispatch; the pipeline cache holds them).

Sizes 0 and 1 are not like the others, so a build is made per pattern of them (`pattern`): a
dimension fed empty (the KV cache of a decode loop's first step) makes its input an empty
constant, and a dimension of size 1 (the one new token of every later step, a batch of one) is
fixed to 1 in that build, where transposes around it are reshapes, splits are views and matrix
products take their vector path, as in a build for that exact shape. A decode loop is then two
builds: the prompt (cache empty, sequence dynamic) and every step after it (cache dynamic,
sequence 1).
"""

from ..onnxio import dim_name

MIN_CAPACITY = 64


class Capacities:
    def __init__(self, inputs, free, max_dimensions):
        """inputs: {input name: (dims, params)} from onnx symbolic_inputs (None entries unknown)."""
        self.axes = {}  # input name -> [(axis, dimension name)] of its dynamic dimensions
        for name, (dims, params) in inputs.items():
            if dims is None:
                continue
            # a dim_param repeated within one input ("?" for every unknown size, as some exporters
            # write) names no one dimension: each of those gets its own name
            seen = [p for p in params if p is not None]
            ax = [
                (i, dim_name(name, i, p if seen.count(p) == 1 else None))
                for i, (d, p) in enumerate(zip(dims, params))
                if d is None and (p is None or p not in free)
            ]
            if ax:
                self.axes[name] = ax
        self.names = sorted({n for ax in self.axes.values() for _, n in ax})
        for n, m in (max_dimensions or {}).items():
            if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= 0xFFFFFFFF:
                raise TypeError(
                    f"[InferenceSession] max_dimensions[{n!r}] must be an integer in [1, 2**32-1], got {m!r}"
                )
        self.user = dict(max_dimensions or {})
        self.cap = dict(self.user)

    def __bool__(self):
        return bool(self.names)

    def sizes(self, shapes):
        """{dimension name: size} of feeds {input name: shape}; TypeError when one name gets two
        sizes, or a size exceeds its max_dimensions entry."""
        out = {}
        for name, ax in self.axes.items():
            shape = shapes.get(name)
            if shape is None:
                continue
            for i, n in ax:
                s = int(shape[i])
                if out.setdefault(n, s) != s:
                    raise TypeError(
                        f"[InferenceSession.run] dimension {n!r} is {out[n]} in one input and {s} in input {name!r}"
                    )
                if n in self.user and s > self.user[n]:
                    raise TypeError(
                        f"[InferenceSession.run] input {name!r}: dimension {n!r} is {s}, above "
                        f"max_dimensions[{n!r}] = {self.user[n]}"
                    )
        return out

    def pattern(self, sizes):
        """The dimensions fed with size 0 or 1, and which: the part of a build's key that sizes
        decide (every other size shares the build)."""
        return tuple(sorted((n, s) for n, s in sizes.items() if s <= 1))

    def grow(self, sizes):
        """Raise capacities to fit `sizes`; True when one changed (the build is redone)."""
        changed = False
        for n, s in sizes.items():
            if s == 0 or s <= self.cap.get(n, 0):
                continue
            c = max(MIN_CAPACITY, 1 << (s - 1).bit_length(), 2 * self.cap.get(n, 0))
            self.cap[n] = c
            changed = True
        return changed

    def for_build(self, sizes):
        """({name: maximum} of the dynamic dimensions, {name: 1} of those fixed to 1) of a build
        for these feeds (dimensions fed empty are neither: their inputs are given as they are)."""
        dynamic = {n: self.cap[n] for n in self.names if sizes.get(n, 2) >= 2 and n in self.cap}
        ones = {n: 1 for n in self.names if sizes.get(n) == 1}
        return dynamic, ones
