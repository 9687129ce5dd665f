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
Softmax is one kernel per row (max, sum of exp(x - max), normalize), thread or workgroup per row;
rows longer than SOFTMAX_SPLIT_K (SOFTMAX_SPLIT_K_CPU on CPU adapters) take two launches: the
partial pass's (max, sum of exp(x - max)) per chunk, then a workgroup per chunk combines its
row's pairs and normalizes the chunk (one workgroup looping over a row of 1.4M elements passed
llvmpipe's 65535 loop iterations an invocation, silently cut, and leaves a GPU idle).

Dynamic dimensions (mltensor/dynamic/): M and K may be sizes known only at dispatch. The kernels
read them there (wgsl(), as constants when static) and take the shape a static build at the same
sizes would take, decided in the kernel from the dispatch's sizes where the bounds do not decide
it: `thread_flag` (1 where a static kernel would be "thread") selects, in a group-shaped kernel, a
path with one output per thread that runs the thread kernel's loop; `split_plan` gives the
two-level scheme's S and CHUNK as expressions (S = 1 where a static build would not split, the
partial pass then stores the result itself). So a dynamic build computes bit for bit what the
static build at the same sizes computes. Scratch is sized for the largest sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import cdiv, high, low, smax, smin, wgsl
from ..dynamic.kernels import MAX_GROUPS, grid
from ..errors import NotSupportedError
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, binop, cpu_device, Kernel, ld_st, lit, unop
from ._checks import check_bool, check_support
from ._index import merge_dims, radix, row_strides

WG = 64  # threads of a reducing workgroup (power of two: tree reduction)
THREAD_MAX_K = 32  # up to this many reduced elements, one thread per output is faster
MANY_OUTPUTS, THREAD_MAX_K_MANY = 16384, 256  # ... and up to 256 when outputs alone fill the GPU
# CPU adapters (lavapipe): a thread per output up to this many reduced elements, whatever the
# outputs. A workgroup's barriers are coroutine switches there: measured on lavapipe (2 cores),
# layer normalization's workgroup per row against a thread per row: [8192, 40] 28.4 vs 1.7 ms,
# [2048, 80] 8.1 vs 1.6, [512, 160] 2.6 vs 0.9, [394, 768] 3.7 vs 2.0, [64, 64] 0.8 vs 0.3; from
# [128, 3072] the workgroup wins (3.5 vs 4.2 ms).
CPU_THREAD_MAX_K = 1024
CHUNK = 4096  # elements per workgroup in the two-level scheme
MAX_SPLIT = 1024  # partials per output in the two-level scheme (the final pass reduces these)
# softmax rows longer than this take two launches over chunks of CHUNK: on GPUs, where one
# workgroup per long row leaves the GPU idle; on CPU adapters (lavapipe: 1.2-1.4x slower split up
# to ~1M, as fast past it) where a workgroup per row would loop 3 * K / WG times a thread, past
# llvmpipe's 65535 iterations an invocation (silently cut) at K ~ 1.4M
SOFTMAX_SPLIT_K = 65536
SOFTMAX_SPLIT_K_CPU = 524288


def chunks(K, c0):
    """(S, chunk, most): a line of K elements cut into S chunks of `chunk` elements, about c0
    each and at most MAX_SPLIT of them (longer chunks past that); K may be a Sym, S and chunk
    then follow it at dispatch. `most`: the most chunks any allowed K takes (scratch sizes)."""
    S = smin(cdiv(K, c0), MAX_SPLIT)
    chunk = cdiv(K, S)
    if not isinstance(chunk, int):
        chunk = smax(chunk, 1)
    return cdiv(K, chunk), chunk, min(cdiv(high(K), c0), MAX_SPLIT)


FLOAT = dtypes.FLOATS
# Builder methods taking operands with dynamic dimensions (mltensor/dynamic/): any axes may be
# dynamic, reduced or kept.
DYNAMIC_OPS = frozenset(
    (
        "reduce_l1 reduce_l2 reduce_log_sum reduce_log_sum_exp reduce_max reduce_mean reduce_min "
        "reduce_product reduce_sum reduce_sum_square softmax"
    ).split()
)
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
    "reduce_mean": (FLOAT, _same, "+", "a / f32({K})", _init(0)),  # K: the reduced count
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


def reduce_shape(n_out, n_red, cpu=False):
    """Kernel shape for n_out outputs of n_red elements each: ("thread"|"group"|"split", S).
    A thread per output when its loop is short, or when there are so many outputs that the
    threads alone fill the GPU (a barrier-heavy workgroup per output then only adds cost), or on
    a CPU adapter (`cpu`) up to CPU_THREAD_MAX_K; otherwise a workgroup per output, split
    further when K is huge and outputs are few."""
    if n_red <= (CPU_THREAD_MAX_K if cpu else THREAD_MAX_K) or (n_out >= MANY_OUTPUTS and n_red <= THREAD_MAX_K_MANY):
        return "thread", 1
    splits = min(-(-n_red // CHUNK), MAX_SPLIT)
    if splits > 1 and n_out < 256:
        return "split", splits
    return "group", 1


# -- sizes known at dispatch: the same decisions, as expressions -----------------------------


def at_least(x, c):
    """[x >= c] for a size x and an int c >= 1: 1 or 0 where every allowed size decides it, else
    a Sym that is 1 or 0 at dispatch."""
    if low(x) >= c:
        return 1
    if high(x) < c:
        return 0
    return smin(x // c, 1)


def at_most(x, c):
    """[x <= c] for a size x >= 1 and an int c >= 0, likewise (no subtraction: the expression
    keeps bounds >= 0, so sizes derived from it stay divisible)."""
    if high(x) <= c:
        return 1
    if low(x) > c:
        return 0
    return smin(c // x, 1)


def _or(a, b):
    if a == 1 or b == 1:
        return 1
    return b if a == 0 else a if b == 0 else smax(a, b)


def thread_flag(n_out, n_red, cpu=False):
    """1 where reduce_shape(n_out, n_red, cpu) is "thread", else 0; a Sym (1 or 0 at dispatch)
    where that depends on sizes given at dispatch."""
    k = CPU_THREAD_MAX_K if cpu else THREAD_MAX_K
    return _or(at_most(n_red, k), at_least(n_out, MANY_OUTPUTS) * at_most(n_red, THREAD_MAX_K_MANY))


def may_split(n_out, n_red):
    """Some allowed sizes take the two-level scheme (reduce_shape "split")."""
    return high(n_red) > CHUNK and low(n_out) < 256


def split_plan(n_out, n_red):
    """(S, CHUNK) of the two-level scheme, as reduce_shape and _lower_reduce choose them for a
    static size: S partials per output of CHUNK reduced elements each; S is 1 (one workgroup per
    output, CHUNK = n_red) where reduce_shape is not "split"."""
    s0 = smin(cdiv(n_red, CHUNK), MAX_SPLIT)
    small = at_most(n_out, 255)
    s0 = s0 if small == 1 else 1 if small == 0 else smax(s0 * small, 1)
    chunk = cdiv(n_red, s0)
    if not isinstance(chunk, int):  # >= 1; the bounds say so (dims' bounds of a quotient need it)
        chunk = smax(chunk, 1)
    return cdiv(n_red, chunk), chunk


def groups(where, n):
    """Workgroup counts of a 1-D launch of n workgroups (folded past 65535, also per dispatch);
    NotSupportedError naming the operator when some allowed size needs more than fold into 2-D."""
    if high(n) > MAX_GROUPS * MAX_GROUPS:
        raise NotSupportedError(
            f"[{where}] up to {high(n)} workgroups ({n}): more than {MAX_GROUPS}x{MAX_GROUPS} for the largest sizes"
        )
    return grid(n)


def size_params(**sizes):
    """Template parameters for sizes: WGSL u32 expressions ("12u" static, `dims.*` dynamic)."""
    return {k: wgsl(v) for k, v in sizes.items()}


def use(name, expr):
    """How WGSL refers to a size rendered as `expr`: the module constant `name` where it is static
    (the templates declare it), else the expression itself."""
    return expr if "dims." in expr else name


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

    def op(
        self: Any,
        input: MLOperand,
        *,
        axes: Sequence[int] | None = None,
        keep_dimensions: bool = False,
        label: str | None = None,
    ) -> MLOperand:
        self._operand(input, name, "input")
        check_support(name, input=input)
        axes = axes_option(name, axes, input.rank)
        keep = check_bool(name, "keep_dimensions", keep_dimensions)
        if keep:
            shape = tuple(1 if d in axes else s for d, s in enumerate(input.shape))
        else:
            shape = tuple(s for d, s in enumerate(input.shape) if d not in axes)
        return self._emit1(name, [input], {"axes": tuple(sorted(axes))}, input.data_type, shape, label)

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
    sizes = size_params(M=M, K=K)
    params = {
        "T": t,
        **sizes,
        "WG": WG,
        "base": base,
        "off": off,
        "lse": lse,
        "pre": "x" if lse else pre(t, "x"),
        "comb": binop(comb or "+", t, "a", "b"),
        "post": (post or "a").format(K=use("K", sizes["K"])),
        "init": lit(0, t) if lse else init(t),
        "NEG_INF": lit(float("-inf"), "f32"),
        "THR": "",
        "direct": False,
    }
    params.update(ld_st(st))
    short = node.op[len("reduce_") :]
    tag = f"{short}_{st}_m{M}_k{K}"
    where = node.op
    if isinstance(M, int) and isinstance(K, int):
        kind, S = reduce_shape(M, K, cpu_device(kc.device))
        thr = 1 if kind == "thread" else 0
    else:
        thr = thread_flag(M, K, cpu_device(kc.device))
        kind = "thread" if thr == 1 else "split" if may_split(M, K) else "group"
    if kind != "thread" and thr != 0:
        params["THR"] = wgsl(thr)  # and the thread kernel's path where it is 1 (dynamic only)
        tag += "_auto"
    if kind == "thread":
        k = Kernel(
            f"reduce_{tag}_thread",
            "reduce.wgsl",
            dict(params, mode="thread", **size_params(S=1, CHUNK=K)),
            (Binding("src", st), Binding("dst", st, True)),
        )
        kc.launch(k, [x, out], groups(where, cdiv(M, WORKGROUP)), iters=high(K) + 2)
    elif kind == "group":
        k = Kernel(
            f"reduce_{tag}_group",
            "reduce.wgsl",
            dict(params, mode="group", **size_params(S=1, CHUNK=K)),
            (Binding("src", st), Binding("dst", st, True)),
        )
        # (llvmpipe's loop cap, runtime/wgsl.py LOOP_BUDGET: K / WG a thread, reached only by
        # 256+ outputs of 3.8M+ elements, more than a buffer holds; the guard says so if ever)
        kc.launch(
            k,
            [x, out],
            groups(where, thr * cdiv(M, WG) + (1 - thr) * M),
            iters=cdiv(high(K), WG) + 8 + (thr != 0) * THREAD_MAX_K_MANY,
        )
    elif isinstance(M, int) and isinstance(K, int):
        chunk = -(-K // S)
        S = -(-K // chunk)
        width = 2 if lse else 1  # log-sum-exp partials are (max, sum of exp(x - max)) pairs
        part = kc.scratch(dtypes.COMPUTE_NUMPY[t].itemsize * M * S * width)  # partials: type t
        p = dict(params, **size_params(S=S, CHUNK=chunk))
        k1 = Kernel(
            f"reduce_{tag}_partial{S}",
            "reduce.wgsl",
            dict(p, mode="partial", ST=""),
            (Binding("src", st), Binding("part", t, True)),
        )
        k2 = Kernel(
            f"reduce_{tag}_final{S}",
            "reduce.wgsl",
            dict(p, mode="final", LD=""),
            (Binding("part", t), Binding("dst", st, True)),
        )
        kc.launch(k1, [x, part], grid(M * S))
        kc.launch(k2, [part, out], grid(M))
    else:
        # S and CHUNK known at dispatch (split_plan); S = 1: the partial pass stores the result
        # (the group kernel's arithmetic) and the final pass has no outputs to combine
        S, chunk = split_plan(M, K)
        width = 2 if lse else 1
        most = min(high(M), 255) * min(cdiv(high(K), CHUNK), MAX_SPLIT)  # partials, when S > 1
        part = kc.scratch(dtypes.COMPUTE_NUMPY[t].itemsize * most * width)
        p = dict(params, **size_params(S=S, CHUNK=chunk))
        k1 = Kernel(
            f"reduce_{tag}_partialN",
            "reduce.wgsl",
            dict(p, mode="partial", direct=True),
            (Binding("src", st), Binding("part", t, True), Binding("dst", st, True)),
        )
        m_final = M * at_least(S, 2)  # outputs the final pass combines (S > 1: not thread)
        k2 = Kernel(
            f"reduce_{tag}_finalN",
            "reduce.wgsl",
            dict(p, mode="final", LD="", THR="", **size_params(M=m_final)),
            (Binding("part", t), Binding("dst", st, True)),
        )
        kc.launch(k1, [x, part, out], groups(where, thr * cdiv(M, WG) + (1 - thr) * M * S))
        kc.launch(k2, [part, out], groups(where, m_final))


for _name, (_types, *_rest) in REDUCE.items():
    _reduce_op(_name, _types)


# -- softmax --------------------------------------------------------------------------------


@builder_op(renamed={"x": "input"})
def softmax(self: Any, input: MLOperand, axis: int, *, label: str | None = None) -> MLOperand:
    """Softmax along `axis` (an int in [0, rank)): exp(x - max) / sum(exp(x - max)), computed in
    one kernel per row. The output has the input's shape and data type (float32, float16)."""
    # IDL: MLOperand softmax(MLOperand input, [EnforceRange] unsigned long axis, optional MLOperatorOptions options = {});
    self._operand(input, "softmax", "input")
    check_support("softmax", input=input)
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"[softmax] axis must be an integer, got {axis!r}")
    axis = int(axis)
    if not 0 <= axis < input.rank:
        raise TypeError(f"[softmax] axis must be in [0, {input.rank}) for an input of rank {input.rank}, got {axis}")
    return self._emit1("softmax", [input], {"axis": axis}, input.data_type, input.shape, label)


def _lower_softmax(kc, node):
    x = node.inputs[0]
    out = kc.out(node)
    axis = node.attrs["axis"]
    kept, red = split_axes(x.shape, [axis])
    rows, K = math.prod(s for s, _ in kept), x.shape[axis]
    (base,) = radix("o", merge_dims(kept))
    (off,) = radix("k", merge_dims(red))
    params = {
        "T": "f32",
        **size_params(M=rows, K=K),
        "WG": WG,
        "base": base,
        "off": off,
        "NEG_INF": lit(float("-inf"), "f32"),
        **size_params(S=1, CHUNK=K),
        "lse": False,
        "pre": "x",
        "comb": "a + b",
        "post": "a",
        "init": "0.0",
        "THR": "",
        "direct": False,
        **ld_st(kc.wtype(x)),
    }
    t = kc.wtype(x)  # f32, or f16 loaded and stored around f32 max, exp and sum
    tag = f"r{rows}_k{K}" + ("_f16" if t == "f16" else "")
    bindings = (Binding("src", t), Binding("dst", t, True))
    cpu = cpu_device(kc.device)
    split = at_least(K, (SOFTMAX_SPLIT_K_CPU if cpu else SOFTMAX_SPLIT_K) + 1)  # long rows: two launches
    thr = thread_flag(rows, K, cpu)
    if thr == 1:
        k = Kernel(f"softmax_{tag}_thread", "reduce.wgsl", dict(params, mode="softmax_thread"), bindings)
        kc.launch(k, [x, out], groups("softmax", cdiv(rows, WORKGROUP)))
    elif split != 1:
        if thr != 0:  # dynamic: the thread kernel's path where a static build would take it
            params["THR"] = wgsl(thr)
            tag += "_auto"
        k = Kernel(f"softmax_{tag}_group", "reduce.wgsl", dict(params, mode="softmax_group"), bindings)
        kc.launch(k, [x, out], groups("softmax", (thr * cdiv(rows, WG) + (1 - thr) * rows) * (1 - split)))
    if split != 0:
        # S chunks of CHUNK elements per row: each chunk's (max, sum of exp(x - max)), then one
        # workgroup per chunk combines its row's S pairs and normalizes the chunk
        S, chunk, most = chunks(K, CHUNK)
        part = kc.scratch(4 * 2 * high(rows) * most)
        p = dict(params, lse=True, THR="", **size_params(S=S, CHUNK=chunk))
        k1 = Kernel(
            f"softmax_{tag}_partial",
            "reduce.wgsl",
            dict(p, mode="partial", ST=""),
            (Binding("src", t), Binding("part", "f32", True)),
        )
        k2 = Kernel(
            f"softmax_{tag}_normalize",
            "reduce.wgsl",
            dict(p, mode="softmax_norm"),
            (Binding("src", t), Binding("part", "f32"), Binding("dst", t, True)),
        )
        kc.launch(k1, [x, part], groups("softmax", rows * S * split))
        kc.launch(k2, [x, part, out], groups("softmax", rows * S * split))


register("softmax", {"input": FLOAT, "output": FLOAT}, ranks={"input": (1, 8)}, lower=_lower_softmax)
