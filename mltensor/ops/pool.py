"""average_pool2d, l2_pool2d, max_pool2d (shaders/pool.wgsl).

One thread per output with the window baked in, or, for global pooling of a large plane, one
workgroup per output with a tree reduction. Both layouts are read in place through strides.
Padding is excluded from the average's count (ONNX count_include_pad=0, TFLite, CoreML).

Dynamic dimensions (mltensor/dynamic/): batch, channels and the plane may be sizes known only at
dispatch. Output sizes are size expressions of the window, padding, strides and dilations; where
the padded input may be smaller than the dilated window for some sizes, every dispatch checks it
(TypeError naming the operator) and the output size is computed from max(span, 0), so no
division ever sees a negative numerator. Windows, padding, strides and dilations stay static,
except the default window (the whole plane), which may be dynamic: a whole-plane pool then takes
the kernel a static build at the same sizes would take ("window" below GLOBAL_MIN_WINDOW
elements, "global" from it), decided per dispatch where the bounds do not decide it (`auto`: a
global-shaped kernel that runs the window kernel's loop, one output per thread, where the plane is
small), so each size gets the static kernel's arithmetic. Dynamic kernels split the output index
with one division per dynamic size (chained quotients, index_lines), through f32 with an integer
correction where the largest output has fewer than FAST_DIV_MAX elements (a u32 division by a
size read at dispatch is a real division; the f32 one is a few vector instructions). The gate
kernel is static only (compiler/fusion/gate.py fuse_gates skips dynamic shapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

import numpy as np

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, is_static, low, smax, wgsl
from ..dynamic.kernels import SizeParams, grid
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, lowering, register
from ..runtime.wgsl import WORKGROUP, Binding, binop, cpu_device, Kernel, ld_st, lit, store_fn
from ._index import FAST_DIV_MAX, index_lines
from ._checks import check_support, int_list
from .reduce import CHUNK, MAX_SPLIT, at_least, chunks
from .reduce import groups as groups_for
from .conv import filter_strides
from .elementwise import activation_lines, group_fn

GLOBAL_MIN_WINDOW = 128  # from this window size a whole-plane pool uses a workgroup per output
GLOBAL_WG = 64  # threads of a global-path workgroup (shaders/pool.wgsl)
# from this plane size a whole-plane pool is cut into chunks of reduce.CHUNK (S per output, at most
# reduce.MAX_SPLIT), pooled by a workgroup each, then combined: 64 threads walking a plane of
# 2048x2048 loop past llvmpipe's cap (runtime/wgsl.py LOOP_BUDGET), and few outputs of a large
# plane leave a GPU (or lavapipe's second core) idle
GLOBAL_SPLIT = 65536
CHUNK_CPU = 65536  # a chunk on CPU adapters (on GPUs reduce.CHUNK): lavapipe pays per workgroup


# Builder methods taking operands with dynamic dimensions (batch, channels, plane)
DYNAMIC_OPS = frozenset({"average_pool2d", "l2_pool2d", "max_pool2d"})

_KINDS = {
    "average_pool2d": dtypes.FLOATS,
    "l2_pool2d": dtypes.FLOATS,
    "max_pool2d": dtypes.ALL,
}
for _name, _types in _KINDS.items():
    register(_name, {"input": _types, "output": _types}, ranks={"input": (4, 4)})


def _pool(b, where, x, window_dimensions, padding, strides, dilations, layout, rounding_type, output_sizes, label):
    b._operand(x, where, "input")
    check_support(where, input=x)
    if layout not in ("nchw", "nhwc"):
        raise TypeError(f"[{where}] layout must be 'nchw' or 'nhwc', got {layout!r}")
    if rounding_type not in ("floor", "ceil"):
        raise TypeError(f"[{where}] rounding_type must be 'floor' or 'ceil', got {rounding_type!r}")
    if layout == "nchw":
        n, c, h, w = x.shape
    else:
        n, h, w, c = x.shape
    if window_dimensions is None and not is_static((h, w)):
        win = [h, w]  # the whole plane, dynamic (whole-plane pools, see the module docstring)
    else:
        win = int_list(where, "window_dimensions", [h, w] if window_dimensions is None else window_dimensions, 2, 1)
    pad = int_list(where, "padding", [0, 0, 0, 0] if padding is None else padding, 4, 0)
    st = int_list(where, "strides", [1, 1] if strides is None else strides, 2, 1)
    dil = int_list(where, "dilations", [1, 1] if dilations is None else dilations, 2, 1)
    calc, deferred = [], []
    for axis, size, k, (p0, p1), s, d in (
        ("height", h, win[0], pad[0:2], st[0], dil[0]),
        ("width", w, win[1], pad[2:4], st[1], dil[1]),
    ):
        span = size + p0 + p1 - ((k - 1) * d + 1)
        if high(span) < 0:
            raise TypeError(
                f"[{where}] the dilated window {axis} ({(k - 1) * d + 1}) exceeds the padded input "
                f"{axis} ({size + p0 + p1})"
            )
        if low(span) < 0:  # for some sizes only: every dispatch checks it
            deferred.append(
                (
                    span + 1,
                    f"[{where}] padded input {axis} {size + p0 + p1} - dilated window {axis} "
                    f"{(k - 1) * d + 1} + 1 (the window must fit in the padded input)",
                )
            )
            span = smax(span, 0)
        calc.append((span // s + 1, cdiv(span, s) + 1))  # (floor, ceil) of span / s + 1
    floor_hw = (calc[0][0], calc[1][0])
    ceil_hw = (calc[0][1], calc[1][1])
    if output_sizes is not None:
        if any(isinstance(v, Sym) for v in output_sizes) or not is_static(floor_hw + ceil_hw):
            sizes = tuple(output_sizes)  # sizes known at dispatch: equal as expressions
            if len(sizes) != 2:
                raise TypeError(f"[{where}] output_sizes must have 2 values, got {len(sizes)}")
        else:
            sizes = tuple(int_list(where, "output_sizes", output_sizes, 2, 1))
        if sizes not in (floor_hw, ceil_hw):
            raise TypeError(
                f"[{where}] output_sizes {list(sizes)} must be the floor {list(floor_hw)} or ceil "
                f"{list(ceil_hw)} rounding of the computed output size"
            )
        oh, ow = sizes
    else:
        oh, ow = floor_hw if rounding_type == "floor" else ceil_hw
    attrs = {"window_dimensions": win, "padding": pad, "strides": st, "dilations": dil, "layout": layout}
    shape = (n, c, oh, ow) if layout == "nchw" else (n, oh, ow, c)
    y = b._emit1(where, [x], attrs, x.data_type, shape, label)
    for size, what in deferred:
        b._require_positive(size, what)
    return y


def _make(where):
    def op(
        self: Any,
        input: MLOperand,
        *,
        window_dimensions: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        strides: Sequence[int] | None = None,
        dilations: Sequence[int] | None = None,
        layout: str = "nchw",
        rounding_type: str = "floor",
        output_sizes: Sequence[int] | None = None,
        label: str | None = None,
    ) -> MLOperand:
        return _pool(
            self,
            where,
            input,
            window_dimensions,
            padding,
            strides,
            dilations,
            layout,
            rounding_type,
            output_sizes,
            label,
        )

    op.__name__ = where
    op.__doc__ = f"IDL: MLOperand {where}(MLOperand input, optional MLPool2dOptions options = {{}});"
    builder_op(op)


for _name in _KINDS:
    _make(_name)


def _lowest(data_type):
    """The lowest value of an integer data type."""
    return int(np.iinfo(dtypes.NUMPY[data_type]).min)


def _lower(kc, node, mode):
    (x,) = node.inputs
    out = kc.out(node)  # the last fused epilogue node's output, when there is one
    a = node.attrs
    nhwc = a["layout"] == "nhwc"
    if nhwc:
        n, ih, iw, c = x.shape
        _, oh, ow, _ = out.shape
        in_s = (ih * iw * c, 1, iw * c, c)
    else:
        n, c, ih, iw = x.shape
        _, _, oh, ow = out.shape
        in_s = (c * ih * iw, ih * iw, iw, 1)
    st = kc.wtype(x)
    t = "f32" if st == "f16" else st  # f16 windows accumulate in f32 (shaders/pool.wgsl LD/ST)
    if mode == "max":
        init = lit(-math.inf, "f32") if t == "f32" else lit(dtypes.INT_RANGE[t][0], t)
        # a window of padding only (dilations, large padding, ceil rounding): the lowest value of
        # the data type, as onnxruntime and TFLite's reference kernels give (float32: -3.4e38,
        # float16: f16_of(-3.4e38) = -inf, int8: -128, uint8: 0); WebNN leaves it open (0 or -inf
        # by backend: webmachinelearning/webnn#935)
        empty = lit(-np.finfo(np.float32).max, "f32") if t == "f32" else lit(_lowest(x.data_type), t)
    else:
        init = empty = lit(0, t)
    (kh, kw), (pt, _, pl, _) = a["window_dimensions"], a["padding"]
    (sh, sw), (dh, dw) = a["strides"], a["dilations"]
    total = math.prod(out.shape)
    whole = (kh, kw) == (ih, iw) and a["padding"] == [0, 0, 0, 0] and (oh, ow) == (1, 1)
    # a whole-plane pool of a dynamic plane: "global" where every allowed plane is large enough,
    # "window" where none is, else both (`auto`, decided per dispatch: 1 for the window loop)
    big = at_least(kh * kw, GLOBAL_MIN_WINDOW) if whole else 0
    path = "window" if big == 0 else "global"
    params = {
        "mode": mode,
        "path": path,
        "T": t,
        "init": init,
        "empty": empty,
        "max_": binop("max", t, "{a}", "{b}"),
        "nhwc": nhwc,
        "C": c,
        "IH": ih,
        "IW": iw,
        "OH": oh,
        "OW": ow,
        "KH": kh,
        "KW": kw,
        "SH": sh,
        "SW": sw,
        "DH": dh,
        "DW": dw,
        "PT": pt,
        "PL": pl,
        "in_s": in_s,
        "total": total,
        **ld_st(st),
    }
    name = f"{node.op}_{a['layout']}_{st}_k{kh}x{kw}s{sh}x{sw}" + ("_global" if path == "global" else "")
    # Static sizes as launch parameters on the global path (a whole-plane pool at every plane
    # size shares a pipeline): it divides by them once per workgroup. The window path divides
    # every thread's index by the output's sizes: it keeps its constants (a division by a value
    # read at dispatch made it 1.5x slower on lavapipe, bench/test_bench_startup.py).
    # (not where the plane is cut into chunks: the chunk kernels below keep constants)
    P = (
        kc.size_params()
        if path == "global" and is_static(out.shape + x.shape) and big == 1 and at_least(kh * kw, GLOBAL_SPLIT + 1) == 0
        else SizeParams(0)
    )
    if P:
        params.update(C=P(c), IH=P(ih), IW=P(iw), in_s=tuple(P(v) for v in in_s), total=P(total), KH=P(kh), KW=P(kw))
    if not is_static(out.shape):  # the output coordinates as chained quotients (one division per dynamic size)
        div = high(total) < FAST_DIV_MAX
        params["coords"] = "\n".join(
            index_lines("i", ("n", "oh", "ow", "c") if nhwc else ("n", "c", "oh", "ow"), list(out.shape), div)
        )
    if isinstance(big, Sym):  # and the window loop's path in a global kernel where the plane may be small
        params["auto"] = wgsl(1 - big)
        name += "_auto"
    # Activations / residual adds after the pool are applied as it stores (compiler/steps.py EPILOGUE_OPS)
    bindings, args = [Binding("x", st), Binding("out", st, True)], [x, out]
    params["act"] = kc.epilogue(bindings, args)
    k = Kernel(name, "pool.wgsl", params, tuple(bindings), sizes=P.values)
    plane = kh * kw
    if path == "window":
        # the window's loops: at most its kh * kw elements (checked: a huge non-global window)
        kc.launch(k, args, groups_for(node.op, cdiv(total, WORKGROUP)), iters=high(kh) * high(kw) + high(kh))
        return
    # a plane larger than GLOBAL_SPLIT (1 for every allowed size, or a Sym: at dispatch): chunks
    split = at_least(plane, GLOBAL_SPLIT + 1)
    if split != 1:  # one workgroup per output: the plane / 64 a thread, a tree of 6
        most = plane if split == 0 else min(high(plane), GLOBAL_SPLIT)
        groups = big * total + (1 - big) * cdiv(total, GLOBAL_WG)
        kc.launch(k, args, groups_for(node.op, groups * (1 - split)), iters=cdiv(most, GLOBAL_WG) + 6)
    if split != 0:
        # S workgroups per output each pool a chunk of CHUNK elements into `part` (in T), then one
        # thread per output combines its S partials in order. One workgroup walking a 2048x2048
        # plane loops past llvmpipe's cap (runtime/wgsl.py LOOP_BUDGET) and leaves a GPU idle.
        c0 = CHUNK_CPU if cpu_device(kc.device) else CHUNK
        S, chunk, most = chunks(plane, c0)
        chunk_most = max(c0, cdiv(high(plane), MAX_SPLIT))  # (bounds of the expressions are loose)
        part = kc.scratch(dtypes.COMPUTE_NUMPY[t].itemsize * high(total) * most)
        p = dict(params, S=S, CHUNK=chunk, auto=0)
        p.pop("coords", None)
        k1 = Kernel(
            name + "_partial",
            "pool.wgsl",
            dict(p, path="global_part", act="", ST=""),
            (Binding("x", st), Binding("part", t, True)),
        )
        kc.launch(k1, [x, part], groups_for(node.op, total * S * split), iters=cdiv(chunk_most, GLOBAL_WG) + 6)
        k2 = Kernel(
            name + "_final",
            "pool.wgsl",
            dict(p, path="global_final", LD=""),
            (Binding("part", t),) + tuple(bindings[1:]),
        )
        kc.launch(k2, [part] + args[1:], groups_for(node.op, cdiv(total, WORKGROUP) * split), iters=MAX_SPLIT)


def global_average_pool(n):
    """The layout ("nchw" | "nhwc") in which node `n` averages whole planes of a 4-D tensor into a
    1x1 plane: an average_pool2d over the plane without padding, or a reduce_mean over both
    spatial axes that keeps them (TFLite's MEAN); else None."""
    x, y = n.inputs[0], n.outputs[0]
    if n.op == "average_pool2d":
        a = n.attrs
        plane = list(x.shape[2:] if a["layout"] == "nchw" else x.shape[1:3])
        out = list(y.shape[2:] if a["layout"] == "nchw" else y.shape[1:3])
        if a["window_dimensions"] == plane and a["padding"] == [0, 0, 0, 0] and out == [1, 1]:
            return a["layout"]
    elif n.op == "reduce_mean" and x.rank == 4 and y.rank == 4:
        return {(1, 2): "nhwc", (2, 3): "nchw"}.get(tuple(n.attrs["axes"]))
    return None


def lower_gate(kc, step):
    """One kernel for a gate step (compiler/fusion/gate.py fuse_gates): the global average pool (or the
    first fully connected conv's input, already one value per channel) and the step's chain of
    fully connected 1x1 convs with their activations, one workgroup per batch item. Values between
    layers stay in workgroup memory as f32; each is rounded to the value type first (f16_of for
    float16), as the unfused kernels would store it."""

    head = step.node
    layout = global_average_pool(head)
    pool = layout is not None
    x = head.inputs[0]
    t = kc.wtype(x)
    st = store_fn(t)
    fcs = [f.node for f in step.chain] if pool else [head] + [f.node for f in step.chain]
    # each layer's activations: its step's epilogue (a pool's own, applied in pooled(), is the head's)
    acts = ([] if pool else [step.epilogue]) + [f.epilogue for f in step.chain]
    bindings, args = [], []
    # The plane's size as a launch parameter (squeeze-and-excitation blocks of one width at
    # several resolutions share a pipeline): a loop bound and a multiplier, nothing divides by it
    P = kc.size_params()
    if step.source is not None:
        src_fn, ext = group_fn(kc, step.source.nodes, "group", "g")
        src_fn += "\n\nfn src(i: u32) -> f32 {\n    return f32(group(i));\n}"
        for k, v in enumerate(ext):
            bindings.append(Binding(f"g{k}", kc.wtype(v)))
            args.append(v)
    else:
        src_fn = "fn src(i: u32) -> f32 {\n    return f32(x[i]);\n}"
        bindings.append(Binding("x", t))
        args.append(x)
    nb = x.shape[0]
    layout = layout or head.attrs["input_layout"]
    nhwc = layout == "nhwc"
    c = x.shape[3] if nhwc else x.shape[1]
    hw = math.prod(x.shape[1:]) // c
    params = {
        "path": "gate",
        "pool": pool,
        "nhwc": nhwc,
        "C": c,
        "HW": hw,
        "src_fn": src_fn,
        "mode": "avg",
        "T": "f32",
        "init": "0.0",
        "max_": "",
        "act": "",
        "LD": "",
        "ST": st,
    }
    if pool:
        # NHWC: up to 64 channels a pass (256-byte rows), the other threads along the plane.
        # NCHW: enough channels a pass to keep 256 threads busy, at least 16 lanes (64 bytes) along
        # each channel's plane, fewer only for planes smaller than that.
        p2 = lambda v: 1 << max(0, v - 1).bit_length()  # noqa: E731 (next power of two)
        lanes = min(64, p2(c)) if nhwc else min(p2(hw), max(16, WORKGROUP // p2(c)))
        params.update(L=lanes, R=WORKGROUP // lanes)
        lines, cur = activation_lines(kc, step.epilogue, "q", t)
        hw = params["HW"] = P(hw)  # (f32 of the value read at dispatch: exact, as the literal, below 2^24)
        count = lit(float(hw), "f32") if isinstance(hw, int) else f"f32({wgsl(hw)})"
        body = "\n".join([f"    let q: {t} = {st}(s / {count});"] + lines)
        params["src_fn"] += f"\n\nfn pooled(s: f32) -> f32 {{\n{body}\n    return f32({cur});\n}}"
    layers, widest = [], c
    for j, (fc, ep) in enumerate(zip(fcs, acts)):
        _, w, bias = fc.inputs
        f_s = filter_strides(fc.attrs["filter_layout"], w.shape)
        o = dict(zip(fc.attrs["filter_layout"], w.shape))["o"]
        bindings.append(Binding(f"w{j}", kc.wtype(w)))
        args.append(w)
        if bias is not None:
            bindings.append(Binding(f"b{j}", kc.wtype(bias)))
            args.append(bias)
        lines, cur = activation_lines(kc, ep, "a", t)
        lines = [f"        let a: {t} = {st}(acc);"] + ["    " + ln for ln in lines]
        layers.append(
            {
                "O": o,
                "I": dict(zip(fc.attrs["filter_layout"], w.shape))["i"],
                "os": f_s[0],
                "is_": f_s[1],
                "w": f"w{j}",
                "b": f"b{j}" if bias is not None else "",
                "vin": "va" if j % 2 == 0 else "vb",
                "vout": "vb" if j % 2 == 0 else "va",
                "acts": "\n".join(lines),
                "cur": cur,
            }
        )
        widest = max(widest, o)
    out = step.outputs[0]
    bindings.append(Binding("out", kc.wtype(out), True))
    args.append(out)
    params.update(layers=layers, CMAX=widest)
    name = (
        f"gate_{layout}_{t}_{'pool' if pool else 'fc'}"
        + "".join(f"_{f['I']}x{f['O']}" for f in layers)
        + ("_src" if step.source is not None else "")
    )
    # loops of a thread: the pool's passes over channel blocks (each a walk of the plane and a
    # tree), then each layer's outputs times its inputs (fuse_gates bounds both: GATE_MAX_*)
    iters = sum(-(-f["O"] // WORKGROUP) * f["I"] for f in layers) + -(-c // WORKGROUP)
    if pool:
        iters += -(-c // (lanes if nhwc else WORKGROUP // lanes)) * (
            -(-hw // (WORKGROUP // lanes if nhwc else lanes)) + 8
        )
    kc.launch(Kernel(name, "pool.wgsl", params, tuple(bindings), sizes=P.values), args, grid(nb), iters=iters)


for _name, _mode in (("average_pool2d", "avg"), ("l2_pool2d", "l2"), ("max_pool2d", "max")):
    lowering(_name)(lambda kc, node, _m=_mode: _lower(kc, node, _m))
