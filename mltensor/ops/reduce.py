"""Reductions (reduce_l1 ... reduce_sum_square) and softmax.

Every reduction is viewed as M outputs times K reduced elements: the kept axes of the input (in
order) give the output index `o`, the reduced axes give `k`, and the input element is at
`base(o) + off(k)`, two mixed-radix expressions with the strides baked in (so reduced axes need not
be contiguous). Three kernel shapes, chosen from M and K (shaders/reduce.wgsl):
- "thread": one thread per output loops over its K elements (K small, or so many outputs that
  the threads alone fill the GPU);
- "group": one workgroup per output, threads stride over K, then a shared-memory tree;
- "partial" + "final": K huge and few outputs: S workgroups per output each reduce a chunk into a
  scratch buffer, then one workgroup per output combines the S partials (keeps the GPU busy when
  M alone would launch a handful of workgroups).
Softmax is one kernel per row (max, sum of exp(x - max), normalize), thread or workgroup per row.
"""

import math

from .. import dtypes
from ..front.builder import builder_op
from ..runtime.wgsl import WORKGROUP, Binding, Kernel, binop, grid, ld_st, lit, unop
from . import check_bool, check_support, merge_dims, radix, register, row_strides

WG = 64  # threads of a reducing workgroup (power of two: tree reduction)
THREAD_MAX_K = 32  # up to this many reduced elements, one thread per output is faster
MANY_OUTPUTS, THREAD_MAX_K_MANY = 16384, 256  # ... and up to 256 when outputs alone fill the GPU
CHUNK = 4096  # elements per workgroup in the two-level scheme
MAX_SPLIT = 1024  # partials per output in the two-level scheme (the final pass reduces these)

FLOAT = dtypes.FLOATS
# WebNN reduction data types (current spec): float-only, float + 32/64-bit ints, everything.
SUMLIKE = ("float32", "float16", "int32", "uint32", "int64", "uint64")


def _init(value):
    return lambda t: lit(value, t)


def _extreme(lowest):
    def init(t):
        if t in dtypes.FLOAT_COMPUTE:
            return lit(float("-inf") if lowest else float("inf"), t)
        return lit(dtypes.INT_RANGE[t][0 if lowest else 1], t)

    return init


def _same(t, x):
    return x


def _square(t, x):
    return binop("*", t, x, x)


# name: (data types, pre(type, x), combining operator (wgsl.binop), post(a), init(type))
REDUCE = {
    "reduce_l1": (SUMLIKE, lambda t, x: unop("abs", t, x), "+", "a", _init(0)),
    "reduce_l2": (FLOAT, _square, "+", "sqrt(a)", _init(0)),
    "reduce_log_sum": (FLOAT, _same, "+", "log(a)", _init(0)),
    "reduce_log_sum_exp": (FLOAT, None, None, None, None),  # own two-pass code in the template
    "reduce_max": (dtypes.ALL, _same, "max", "a", _extreme(True)),
    "reduce_mean": (FLOAT, _same, "+", "a / f32(K)", _init(0)),
    "reduce_min": (dtypes.ALL, _same, "min", "a", _extreme(False)),
    "reduce_product": (SUMLIKE, _same, "*", "a", _init(1)),
    "reduce_sum": (SUMLIKE, _same, "+", "a", _init(0)),
    "reduce_sum_square": (SUMLIKE, _square, "+", "a", _init(0)),
}


# -- kernel shape (reduce_shape is shared with normalization.py) --------------------------------


def split_axes(shape, axes):
    """(kept dims, reduced dims) as radix dims over the input's row-major strides."""
    st = row_strides(shape)
    kept = [(shape[d], (st[d],)) for d in range(len(shape)) if d not in axes]
    red = [(shape[d], (st[d],)) for d in sorted(axes)]
    return kept, red


def reduce_shape(n_out, n_red):
    """Kernel shape for n_out outputs of n_red elements each: ("thread"|"group"|"split", S).
    A thread per output when its loop is short, or when there are so many outputs that the
    threads alone fill the GPU (a barrier-heavy workgroup per output then only adds cost);
    otherwise a workgroup per output, split further when K is huge and outputs are few."""
    if n_red <= THREAD_MAX_K or (n_out >= MANY_OUTPUTS and n_red <= THREAD_MAX_K_MANY):
        return "thread", 1
    splits = min(-(-n_red // CHUNK), MAX_SPLIT)
    if splits > 1 and n_out < 256:
        return "split", splits
    return "group", 1


# -- validation -----------------------------------------------------------------------------


def axes_option(where, axes, rank):
    """The spec's `axes` option: None -> all axes; a sequence of distinct ints in [0, rank)."""
    if axes is None:
        return list(range(rank))
    if isinstance(axes, (str, bytes)) or not hasattr(axes, "__iter__"):
        raise TypeError(f"[{where}] axes must be a sequence of integers, got {axes!r}")
    axes = list(axes)
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, int) and not hasattr(a, "__index__"):
            raise TypeError(f"[{where}] axes must be a sequence of integers, got {axes!r}")
    axes = [int(a) for a in axes]
    for a in axes:
        if not 0 <= a < rank:
            raise TypeError(f"[{where}] axes value {a} is out of range for an input of rank {rank}")
    if len(set(axes)) != len(axes):
        raise TypeError(f"[{where}] axes must not contain duplicates, got {axes}")
    return axes


def _reduce_op(name, types):
    register(name, {"input": types, "output": types}, lower=_lower_reduce)

    def op(b, x, *, axes=None, keep_dimensions=False, label=None):
        b._operand(x, name, "input")
        check_support(name, input=x)
        axes = axes_option(name, axes, x.rank)
        keep = check_bool(name, "keep_dimensions", keep_dimensions)
        if keep:
            shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
        else:
            shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
        return b._emit1(name, [x], {"axes": tuple(sorted(axes))}, x.data_type, shape, label)

    op.__name__ = name
    op.__doc__ = f"IDL: MLOperand {name}(MLOperand input, optional MLReduceOptions options = {{}});"
    builder_op(op)


# -- lowering -------------------------------------------------------------------------------


def _lower_reduce(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    st = kc.wtype(x)  # storage of src/dst
    t = "f32" if st == "f16" else st  # accumulation: f16 values load, sum and store through f32
    axes = node.attrs["axes"]
    kept, red = split_axes(x.shape, axes)
    M, K = math.prod(s for s, _ in kept), math.prod(s for s, _ in red)
    (base,) = radix("o", merge_dims(kept))
    (off,) = radix("k", merge_dims(red))
    _, pre, comb, post, init = REDUCE[node.op]
    lse = node.op == "reduce_log_sum_exp"
    params = {
        "T": t, "M": M, "K": K, "WG": WG, "base": base, "off": off, "lse": lse,
        "pre": "x" if lse else pre(t, "x"), "comb": binop(comb or "+", t, "a", "b"), "post": post or "a",
        "init": lit(0, t) if lse else init(t), "NEG_INF": lit(float("-inf"), "f32"),
    }
    params.update(ld_st(st))
    short = node.op[len("reduce_"):]
    kind, S = reduce_shape(M, K)
    tag = f"{short}_{st}_m{M}_k{K}"
    if kind == "thread":
        k = Kernel(f"reduce_{tag}_thread", "reduce.wgsl", dict(params, mode="thread", S=1, CHUNK=K),
                   (Binding("src", st), Binding("dst", st, True)))
        kc.launch(k, [x, out], grid(-(-M // WORKGROUP)))
    elif kind == "group":
        k = Kernel(f"reduce_{tag}_group", "reduce.wgsl", dict(params, mode="group", S=1, CHUNK=K),
                   (Binding("src", st), Binding("dst", st, True)))
        kc.launch(k, [x, out], grid(M))
    else:
        chunk = -(-K // S)
        S = -(-K // chunk)
        width = 2 if lse else 1  # log-sum-exp partials are (max, sum of exp(x - max)) pairs
        part = kc.scratch(dtypes.COMPUTE_NUMPY[t].itemsize * M * S * width)  # partials: type t
        p = dict(params, S=S, CHUNK=chunk)
        k1 = Kernel(f"reduce_{tag}_partial{S}", "reduce.wgsl", dict(p, mode="partial", ST=""),
                    (Binding("src", st), Binding("part", t, True)))
        k2 = Kernel(f"reduce_{tag}_final{S}", "reduce.wgsl", dict(p, mode="final", LD=""),
                    (Binding("part", t), Binding("dst", st, True)))
        kc.launch(k1, [x, part], grid(M * S))
        kc.launch(k2, [part, out], grid(M))


for _name, (_types, *_rest) in REDUCE.items():
    _reduce_op(_name, _types)


# -- softmax --------------------------------------------------------------------------------



@builder_op
def softmax(b, x, axis, *, label=None):
    # IDL: MLOperand softmax(MLOperand input, [EnforceRange] unsigned long axis, optional MLOperatorOptions options = {});
    b._operand(x, "softmax", "input")
    check_support("softmax", input=x)
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"[softmax] axis must be an integer, got {axis!r}")
    axis = int(axis)
    if not 0 <= axis < x.rank:
        raise TypeError(f"[softmax] axis must be in [0, {x.rank}) for an input of rank {x.rank}, got {axis}")
    return b._emit1("softmax", [x], {"axis": axis}, x.data_type, x.shape, label)


def _lower_softmax(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    axis = node.attrs["axis"]
    kept, red = split_axes(x.shape, [axis])
    rows, K = math.prod(s for s, _ in kept), x.shape[axis]
    (base,) = radix("o", merge_dims(kept))
    (off,) = radix("k", merge_dims(red))
    params = {"T": "f32", "M": rows, "K": K, "WG": WG, "base": base, "off": off,
              "NEG_INF": lit(float("-inf"), "f32"), "S": 1, "CHUNK": K, "lse": False,
              "pre": "x", "comb": "a + b", "post": "a", "init": "0.0", **ld_st(kc.wtype(x))}
    t = kc.wtype(x)  # f32, or f16 loaded and stored around f32 max, exp and sum
    tag = f"r{rows}_k{K}" + ("_f16" if t == "f16" else "")
    bindings = (Binding("src", t), Binding("dst", t, True))
    if reduce_shape(rows, K)[0] == "thread":
        k = Kernel(f"softmax_{tag}_thread", "reduce.wgsl", dict(params, mode="softmax_thread"), bindings)
        kc.launch(k, [x, out], grid(-(-rows // WORKGROUP)))
    else:
        k = Kernel(f"softmax_{tag}_group", "reduce.wgsl", dict(params, mode="softmax_group"), bindings)
        kc.launch(k, [x, out], grid(rows))


register("softmax", {"input": FLOAT, "output": FLOAT}, ranks={"input": (1, 8)}, lower=_lower_softmax)
