"""Normalizations: batch_normalization, instance_normalization, layer_normalization, and the
internal _rms_normalization (RMSNorm: what the compiler makes of the exported chains, see
compiler/fusion/rms.py `rewrite_rms`).

batch_normalization is elementwise once mean and variance are given: one thread per element, the
channel index computed from the flat index. instance_ and layer_normalization reduce: one kernel per
op computes each group's mean and variance (two passes over the group, for accuracy) and writes the
normalized, scaled and shifted group, with one thread per group (small groups) or one workgroup per
group and a shared-memory tree (shaders/normalization.wgsl). Index arithmetic is shared with the
reductions (ops/reduce.py): the group index `o` and the element index `k` give the input offset
and the scale/bias index through mixed-radix expressions with baked-in strides.

Dynamic dimensions (mltensor/dynamic/): any dimension may be a size known only at dispatch (the
channel dimension too, where the parameters are inputs of that shape). Sizes reach the kernels
through wgsl() (constants when static). Where the bounds do not decide between one thread and one
workgroup per group, the workgroup kernel also has the thread kernel's path, taken at dispatch
where a static build at those sizes would take the thread kernel (reduce.thread_flag): every size
computes bit for bit what its static build computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, low, wgsl
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, register
from ..runtime.wgsl import WORKGROUP, Binding, cpu_device, Kernel, lit, store_fn
from ._checks import check_number, check_support
from ._index import merge_dims, radix, row_strides
from .elementwise import group_fn
from .reduce import (
    CHUNK,
    MAX_SPLIT,
    SOFTMAX_SPLIT_K,
    SOFTMAX_SPLIT_K_CPU,
    WG,
    at_least,
    axes_option,
    chunks,
    groups,
    size_params,
    thread_flag,
)

# groups longer than this are normalized in chunks (split path, _lower_norm): as softmax rows, on
# GPUs from 64K elements (one workgroup per group leaves a GPU idle), on CPU adapters from 512K
# (well before llvmpipe's loop cap, runtime/wgsl.py LOOP_BUDGET, at ~1.28M)
SPLIT_K, SPLIT_K_CPU = SOFTMAX_SPLIT_K, SOFTMAX_SPLIT_K_CPU
# elements of a chunk (at least; more past MAX_SPLIT chunks): reduce.CHUNK on GPUs; on CPU
# adapters 16x that (lavapipe pays per workgroup, and two cores are busy with a few chunks)
CHUNK_CPU = 65536

FLOAT = dtypes.FLOATS
# Builder methods taking operands with dynamic dimensions (mltensor/dynamic/)
DYNAMIC_OPS = frozenset({"batch_normalization", "instance_normalization", "layer_normalization", "_rms_normalization"})


def _param(b, where, what, p, x, shape):
    """An optional 1-D (or N-D) parameter operand: same data type as input, given shape."""
    if p is None:
        return None
    b._operand(p, where, what)
    if p.data_type != x.data_type:
        raise TypeError(f"[{where}] {what} data type {p.data_type} differs from input data type {x.data_type}")
    if tuple(p.shape) != tuple(shape):
        msg = f"[{where}] {what} shape must be {list(shape)}, got {list(p.shape)}"
        if len(p.shape) != len(shape) or not all(_may_equal(a, c) for a, c in zip(p.shape, shape)):
            raise TypeError(msg)
        for a, c in zip(p.shape, shape):  # a dynamic size against another or a static one
            if a != c:
                b._require_equal(a, c, msg)
    return p


def _may_equal(a, c):
    """Sizes a and c are equal for some allowed sizes (equal ints; for dynamic ones, ranges that
    meet: then each dispatch checks them)."""
    if isinstance(a, int) and isinstance(c, int):
        return a == c
    return a == c or not (low(a) > high(c) or low(c) > high(a))


# -- batch_normalization --------------------------------------------------------------------


@builder_op(renamed={"x": "input"})
def batch_normalization(
    self: Any,
    input: MLOperand,
    mean: MLOperand,
    variance: MLOperand,
    *,
    scale: MLOperand | None = None,
    bias: MLOperand | None = None,
    axis: int = 1,
    epsilon: float = 1e-05,
    label: str | None = None,
) -> MLOperand:
    """(x - mean) / sqrt(variance + epsilon) * scale + bias along channel `axis` (default 1);
    `mean`, `variance`, `scale`, `bias` are 1-D of that dimension's size. Feeding a convolution,
    it is applied as the convolution loads its input."""
    # IDL: MLOperand batchNormalization(MLOperand input, MLOperand mean, MLOperand variance, optional MLBatchNormalizationOptions options = {});
    where = "batch_normalization"
    self._operand(input, where, "input")
    check_support(where, input=input)
    if isinstance(axis, bool) or not hasattr(axis, "__index__"):
        raise TypeError(f"[{where}] axis must be an integer, got {axis!r}")
    axis = int(axis)
    if not 0 <= axis < input.rank:
        raise TypeError(f"[{where}] axis must be in [0, {input.rank}) for an input of rank {input.rank}, got {axis}")
    eps = check_number(where, "epsilon", epsilon)
    c = (input.shape[axis],)
    if mean is None or variance is None:
        raise TypeError(f"[{where}] mean and variance are required operands")
    mean = _param(self, where, "mean", mean, input, c)
    variance = _param(self, where, "variance", variance, input, c)
    scale = _param(self, where, "scale", scale, input, c)
    bias = _param(self, where, "bias", bias, input, c)
    attrs = {"axis": axis, "epsilon": eps}
    return self._emit1(where, [input, mean, variance, scale, bias], attrs, input.data_type, input.shape, label)


def _lower_batch(kc, node):
    x, mean, var, scale, bias = node.inputs
    out = kc.out(node)
    axis = node.attrs["axis"]
    n, C, inner = x.size, x.shape[axis], math.prod(x.shape[axis + 1 :])
    c = "i" if inner == 1 else f"(i / {wgsl(inner)})"
    try:
        wrap = n > C * inner
    except TypeError:  # dynamic: more than one item along the outer axes for some sizes
        wrap = True
    if wrap:
        c = f"({c} % {wgsl(C)})"
    params = _params(
        node,
        mode="batch",
        N=wgsl(n),
        cidx=c if isinstance(C, Sym) or C > 1 else "0u",
        scale=scale is not None,
        bias=bias is not None,
    )
    args = [x, mean, var] + [p for p in (scale, bias) if p is not None] + [out]
    names = (
        ["src", "p_mean", "p_var"]
        + (["p_scale"] if scale is not None else [])
        + (["p_bias"] if bias is not None else [])
    )
    bindings = _bindings(kc, x, names)
    params["ST"] = store_fn(kc.wtype(x))
    params["act"] = kc.epilogue(bindings, args)  # e.g. densenet's BatchNormalization -> Relu
    k = Kernel(f"batchnorm_n{n}_c{C}_in{inner}{_sb(scale, bias)}{_tag(kc, x)}", "normalization.wgsl", params, bindings)
    kc.launch(k, args, groups("batch_normalization", cdiv(n, WORKGROUP)))


# -- instance_normalization -----------------------------------------------------------------


@builder_op(renamed={"x": "input"})
def instance_normalization(
    self: Any,
    input: MLOperand,
    *,
    scale: MLOperand | None = None,
    bias: MLOperand | None = None,
    epsilon: float = 1e-05,
    layout: str = "nchw",
    label: str | None = None,
) -> MLOperand:
    """Normalize each (batch, channel) plane over its spatial dimensions, then scale and bias per
    channel (1-D, optional); layout: "nchw" or "nhwc"."""
    # IDL: MLOperand instanceNormalization(MLOperand input, optional MLInstanceNormalizationOptions options = {});
    where = "instance_normalization"
    self._operand(input, where, "input")
    check_support(where, input=input)
    if layout not in ("nchw", "nhwc"):
        raise TypeError(f"[{where}] layout must be 'nchw' or 'nhwc', got {layout!r}")
    eps = check_number(where, "epsilon", epsilon)
    c = (input.shape[1] if layout == "nchw" else input.shape[3],)
    scale = _param(self, where, "scale", scale, input, c)
    bias = _param(self, where, "bias", bias, input, c)
    attrs = {"layout": layout, "epsilon": eps}
    return self._emit1(where, [input, scale, bias], attrs, input.data_type, input.shape, label)


def _lower_instance(kc, node):
    x = node.inputs[0]
    st = row_strides(x.shape)
    ch = 1 if node.attrs["layout"] == "nchw" else 3
    sp = (2, 3) if ch == 1 else (1, 2)
    # groups (n, c): the parameter index is the channel; elements: the spatial positions
    kept = [(x.shape[0], (st[0], 0)), (x.shape[ch], (st[ch], 1))]
    red = [(x.shape[d], (st[d], 0)) for d in sp]
    _lower_norm(kc, node, kept, red)


# -- layer_normalization --------------------------------------------------------------------


@builder_op(renamed={"x": "input"})
def layer_normalization(
    self: Any,
    input: MLOperand,
    *,
    scale: MLOperand | None = None,
    bias: MLOperand | None = None,
    axes: Sequence[int] | None = None,
    epsilon: float = 1e-05,
    label: str | None = None,
) -> MLOperand:
    """Normalize over `axes` (default: every axis but the first), then multiply by `scale` and add
    `bias` (shaped as the normalized dimensions, optional)."""
    # IDL: MLOperand layerNormalization(MLOperand input, optional MLLayerNormalizationOptions options = {});
    where = "layer_normalization"
    self._operand(input, where, "input")
    check_support(where, input=input)
    axes = list(range(1, input.rank)) if axes is None else axes_option(where, axes, input.rank)
    eps = check_number(where, "epsilon", epsilon)
    pshape = tuple(input.shape[a] for a in axes)
    scale = _param(self, where, "scale", scale, input, pshape)
    bias = _param(self, where, "bias", bias, input, pshape)
    attrs = {"axes": tuple(axes), "epsilon": eps}
    return self._emit1(where, [input, scale, bias], attrs, input.data_type, input.shape, label)


def _lower_layer(kc, node):
    x = node.inputs[0]
    axes = node.attrs["axes"]
    st = row_strides(x.shape)
    # scale/bias have shape [x.shape[a] for a in axes] (in the order given): stride of each axis
    pst = dict(zip(axes, row_strides([x.shape[a] for a in axes])))
    kept = [(x.shape[d], (st[d], 0)) for d in range(x.rank) if d not in pst]
    red = [(x.shape[d], (st[d], pst[d])) for d in sorted(axes)]
    _lower_norm(kc, node, kept, red)


# -- _rms_normalization (internal) ----------------------------------------------------------


@builder_op
def _rms_normalization(b, x, *, scale=None, axes=None, epsilon=1e-5, label=None):
    """RMSNorm: x * (1 / sqrt(mean(x^2 over `axes`) + epsilon)) * scale, one kernel (the mean
    of the squares in f32). `scale` (optional) is shaped as the normalized dimensions, as
    layer_normalization's. Internal (not a WebNN operator): the compiler makes it of the chains
    exporters write (Pow / ReduceMean / Add / Sqrt / Reciprocal or Div / Mul)."""
    where = "_rms_normalization"
    b._operand(x, where, "input")
    check_support(where, input=x)
    axes = [x.rank - 1] if axes is None else axes_option(where, axes, x.rank)
    eps = check_number(where, "epsilon", epsilon)
    pshape = tuple(x.shape[a] for a in axes)
    scale = _param(b, where, "scale", scale, x, pshape)
    attrs = {"axes": tuple(axes), "epsilon": eps}
    return b._emit1(where, [x, scale, None], attrs, x.data_type, x.shape, label)


# -- shared lowering ------------------------------------------------------------------------


def _params(node, **kw):
    p = {
        "eps": lit(node.attrs["epsilon"], "f32"),
        "WG": WG,
        "M": "1u",
        "K": "1u",
        "base": "0u",
        "off": "0u",
        "pbase": "0u",
        "poff": "0u",
        "N": "1u",
        "cidx": "0u",
        "THR": "",
        "rms": node.op == "_rms_normalization",
        "xfn": "",
        "xout": False,
    }
    p["normed"] = "f32(x_at(i)) * r" if p["rms"] else "(f32(x_at(i)) - mean) / den"
    p.update(kw)
    return p


def _sb(scale, bias):
    return ("_s" if scale is not None else "") + ("_b" if bias is not None else "")


def _bindings(kc, x, names):
    """Bindings of the value's compute type: f32, or f16 (loaded as f32, sums in f32, stored as
    f16 through the template's ST)."""
    t = kc.wtype(x)
    return [Binding(n, t) for n in names] + [Binding("dst", t, True)]


def _tag(kc, x):
    return "_f16" if kc.wtype(x) == "f16" else ""


def _lower_norm(kc, node, kept, red):
    """kept/red: radix dims with two strides each (input offset, scale/bias index)."""
    x, scale, bias = node.inputs
    out = kc.out(node)
    M, K = math.prod(s for s, _ in kept), math.prod(s for s, _ in red)
    base, pbase = radix("o", merge_dims(kept), 2)
    off, poff = radix("k", merge_dims(red), 2)
    cpu = cpu_device(kc.device)
    thr = thread_flag(M, K, cpu)  # 1: one thread per group, 0: one workgroup, else decided at dispatch
    mode = "norm_thread" if thr == 1 else "norm_group"
    params = _params(
        node,
        mode=mode,
        **size_params(M=M, K=K),
        base=base,
        off=off,
        pbase=pbase,
        poff=poff,
        scale=scale is not None,
        bias=bias is not None,
    )
    t = kc.wtype(x)
    step = kc.step
    src = step.source if step is not None and step.node is node else None
    pnames = (["p_scale"] if scale is not None else []) + (["p_bias"] if bias is not None else [])
    if src is None:
        args = [x] + [p for p in (scale, bias) if p is not None] + [out]
        bindings = _bindings(kc, x, ["src"] + pnames)
        params["xfn"] = f"fn x_at(i: u32) -> {t} {{ return src[i]; }}"
    else:
        # reading through the elementwise step producing x (a residual or embedding sum,
        # compiler/fusion/norm.py fuse_norm_sources): its expression at i, its inputs bound as s0, ...

        params["xfn"], ext = group_fn(kc, src.nodes, "x_at", "s")
        args = ext + [p for p in (scale, bias) if p is not None] + [out]
        bindings = [Binding(f"s{k}", kc.wtype(v)) for k, v in enumerate(ext)] + _bindings(kc, x, pnames)
    params["ST"] = store_fn(t)
    params["act"] = kc.epilogue(bindings, args)
    if src is not None and len(step.outputs) > 1:  # the sum is read elsewhere too: written once
        params["xout"] = True
        bindings.append(Binding("xs", t, True))
        args.append(step.outputs[1])
    short = node.op.lstrip("_").split("_")[0]
    tail = f"{_sb(scale, bias)}{'_src' if src is not None else ''}{_tag(kc, x)}"
    # groups longer than this take the split path (1: every allowed size, else a Sym: at dispatch)
    most = SPLIT_K_CPU if cpu_device(kc.device) else SPLIT_K
    split = at_least(K, most + 1)
    auto = ""
    if thr not in (0, 1):  # dynamic: the thread kernel's path too, where a static build takes it
        params["THR"] = wgsl(thr)
        auto = "_auto"
    if split != 1:
        name = f"{short}norm_m{M}_k{K}{auto}_{mode[5:]}{tail}"
        n = cdiv(M, WORKGROUP) if mode == "norm_thread" else thr * cdiv(M, WG) + (1 - thr) * M
        # thread: 3 loops over K; group: 3 over K / WG, and 3 trees of log2(WG) (K: the longest
        # group this kernel gets, at most `most` where some sizes split)
        k = K if split == 0 else min(high(K), most)
        iters = 3 * k if mode == "norm_thread" else 3 * cdiv(k, WG) + 18
        kc.launch(
            Kernel(name, "normalization.wgsl", params, bindings), args, groups(node.op, n * (1 - split)), iters=iters
        )
    if split != 0:
        # S chunks of CHUNK elements per group: each chunk's (mean, sum of squared deviations)
        # (two passes over the chunk), then a workgroup per chunk combines its group's S pairs
        # (Chan et al.'s parallel variance, in a fixed order: every chunk of a group gets the same
        # mean and variance) and normalizes the chunk. One workgroup looping over a group of
        # ~1.4M elements passes llvmpipe's loop cap (runtime/wgsl.py LOOP_BUDGET) and leaves a
        # GPU idle; a chunk loops 2 CHUNK / WG times, the combine 2 S / WG.
        c0 = CHUNK_CPU if cpu_device(kc.device) else CHUNK
        S, chunk, most = chunks(K, c0)
        part = kc.scratch(4 * 2 * high(M) * most)
        p = dict(params, THR="", **size_params(S=S, CHUNK=chunk))
        # the stats pass binds only the group's source (src, or the fused step's inputs s0, ...)
        n_src = 1 if src is None else len(ext)
        kst = Kernel(
            f"{short}norm_m{M}_k{K}_stats{tail}",
            "normalization.wgsl",
            dict(p, mode="norm_stats", act="", scale=False, bias=False, xout=False),
            bindings[:n_src] + [Binding("part", "f32", True)],
        )
        # (the bounds of the size expressions are loose: the largest chunk and S, from the plan)
        chunk_most, s_most = max(c0, cdiv(high(K), MAX_SPLIT)), MAX_SPLIT
        iters = 2 * cdiv(chunk_most, WG) + 12
        kc.launch(kst, args[:n_src] + [part], groups(node.op, M * S * split), iters=iters)
        kap = Kernel(
            f"{short}norm_m{M}_k{K}_apply{tail}",
            "normalization.wgsl",
            dict(p, mode="norm_apply"),
            bindings + [Binding("part", "f32")],
        )
        kc.launch(
            kap, args + [part], groups(node.op, M * S * split), iters=2 * cdiv(s_most, WG) + cdiv(chunk_most, WG) + 12
        )


register(
    "batch_normalization",
    {"input": FLOAT, "mean": FLOAT, "variance": FLOAT, "scale": FLOAT, "bias": FLOAT, "output": FLOAT},
    ranks={"mean": (1, 1), "variance": (1, 1), "scale": (1, 1), "bias": (1, 1)},
    lower=_lower_batch,
)
register(
    "instance_normalization",
    {"input": FLOAT, "scale": FLOAT, "bias": FLOAT, "output": FLOAT},
    ranks={"input": (4, 4), "scale": (1, 1), "bias": (1, 1)},
    lower=_lower_instance,
)
register("layer_normalization", {"input": FLOAT, "scale": FLOAT, "bias": FLOAT, "output": FLOAT}, lower=_lower_layer)
register("_rms_normalization", {"input": FLOAT, "scale": FLOAT, "bias": FLOAT, "output": FLOAT}, lower=_lower_layer)
