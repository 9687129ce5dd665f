"""conv2d and conv_transpose2d (shaders/conv2d.wgsl).

Both lower to the GEMM of matmul.wgsl as an implicit GEMM per group (the im2col matrix is never
built: the kernel computes each input coordinate as it stages a tile), with a dedicated 1x1 path
(A is the input itself), a depthwise path (one thread per output, no GEMM) and a direct path for
fewer than 4 output channels per group (one thread per output pixel, no GEMM tile padding). Every input and
filter layout is read in place through baked strides, so NHWC models (TFLite) get no transposes,
and filters may be graph inputs as well as constants. Bias and the fused epilogue (activations,
residual adds) are applied as each output is stored.

Dynamic dimensions (mltensor/dynamic/): batch and spatial sizes may be known only at dispatch
(channels and filter sizes stay static, so the GEMM's N and K are). Output sizes are size
expressions ((H + pads - dilation*(k-1) - 1) // stride + 1); where the bounds do not decide that
one is positive, each dispatch checks it. Kernels read sizes through `u()`, the implicit GEMM
takes gemm_launch's size buckets (a tile per range of output pixels), workgroup counts are
evaluated per dispatch, and a division by a size known at dispatch goes through f32 (udiv_ in
conv2d.wgsl: on CPU adapters a u32 division by a value unknown to the compiler runs lane by
lane). On CPU adapters the implicit GEMM stages its A tile with the hoisted addresses (divisions
once per staged row, not per element) where a static build divides by constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import math

from .. import dtypes
from ..dynamic.dims import Sym, cdiv, high, is_static, low, smax, wgsl
from ..errors import NotSupportedError
from ..ir.graph import MLOperand
from ..ir.registry import builder_op, lowering, register
from ..runtime.wgsl import LOOP_BUDGET, WORKGROUP, Binding, cpu_device, Kernel, lit, store_fn
from ._checks import check_support, int_list, same_type
from ._gemm import batch_offset_expr, gemm_launch, grid_checked, has_direct, vec_loads
from .elementwise import activation_lines
from .resample import resample_params

FLOAT = dtypes.FLOATS
INPUT_LAYOUTS = ("nchw", "nhwc")
CONV_FILTER_LAYOUTS = ("oihw", "hwio", "ohwi", "ihwo")
TRANSPOSE_FILTER_LAYOUTS = ("iohw", "hwoi", "ohwi")

_SUPPORT = {"input": FLOAT, "filter": FLOAT, "bias": FLOAT, "output": FLOAT}
_RANKS = {"input": (4, 4), "filter": (4, 4), "bias": (1, 1)}
register("conv2d", _SUPPORT, ranks=_RANKS)
register("conv_transpose2d", _SUPPORT, ranks=_RANKS)

# Builder methods taking operands with dynamic dimensions (batch, height, width; mltensor/dynamic/)
DYNAMIC_OPS = frozenset({"conv2d", "conv_transpose2d"})


def _enum(where, what, value, allowed):
    if value not in allowed:
        raise TypeError(f"[{where}] {what} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _int(where, what, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TypeError(f"[{where}] {what} must be an integer >= {minimum}, got {value!r}")
    return value


def _common(b, where, x, w, bias, padding, strides, dilations, groups, input_layout, filter_layouts, filter_layout):
    b._operand(x, where, "input")
    b._operand(w, where, "filter")
    if bias is not None:
        b._operand(bias, where, "bias")
    check_support(where, input=x, filter=w, bias=bias)
    same_type(where, ("input", x), ("filter", w), ("bias", bias))
    _enum(where, "input_layout", input_layout, INPUT_LAYOUTS)
    _enum(where, "filter_layout", filter_layout, filter_layouts)
    pad = int_list(where, "padding", [0, 0, 0, 0] if padding is None else padding, 4, 0)
    st = int_list(where, "strides", [1, 1] if strides is None else strides, 2, 1)
    dil = int_list(where, "dilations", [1, 1] if dilations is None else dilations, 2, 1)
    groups = _int(where, "groups", groups, 1)
    if input_layout == "nchw":
        n, c, h, wd = x.shape
    else:
        n, h, wd, c = x.shape
    # dynamic dimensions: batch and spatial sizes only (channels and filters size the GEMM's N
    # and K, its tiles and the filter reads, all fixed at build)
    for what, v in (
        ("input channels", c),
        *((f"filter dimension {i}", d) for i, d in enumerate(w.shape)),
        *(() if bias is None else (("bias", bias.shape[0]),)),
    ):
        if isinstance(v, Sym):
            raise NotSupportedError(
                f"[{where}] {what} ({v}) is a dynamic dimension; {where} takes dynamic "
                "batch, height and width only (channels and filter sizes fixed at build)"
            )
    return pad, st, dil, groups, (n, c, h, wd)


def _deferred_order(defer, lo, x, what, quantity):
    """Size x >= lo: decided at build where the bounds allow (TypeError(what) if it never holds),
    else appended to `defer` for each dispatch to check (the builder's _require_positive of
    x - lo + 1, named `quantity`), once the whole call has validated."""
    if isinstance(x, int) or low(x) >= lo:
        if isinstance(x, int) and x < lo:
            raise TypeError(what)
        return
    if high(x) < lo:
        raise TypeError(what)
    defer.append((x - (lo - 1), quantity))


def _check_bias(where, bias, oc):
    if bias is not None and tuple(bias.shape) != (oc,):
        raise TypeError(f"[{where}] bias shape must be [{oc}] (output channels), got {list(bias.shape)}")


def _out_shape(layout, n, c, h, w):
    return (n, c, h, w) if layout == "nchw" else (n, h, w, c)


@builder_op
def conv2d(
    self: Any,
    input: MLOperand,
    filter: MLOperand,
    *,
    padding: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    groups: int = 1,
    input_layout: str = "nchw",
    filter_layout: str = "oihw",
    bias: MLOperand | None = None,
    label: str | None = None,
) -> MLOperand:
    """2-D convolution of a 4-D `input` with a 4-D `filter`, plus an optional 1-D `bias`.

    padding: [top, bottom, left, right] (default zeros); strides, dilations: [h, w] (default
    ones); groups: input channels split into groups (depthwise when it equals the channels).
    input_layout: "nchw" or "nhwc"; filter_layout: "oihw", "hwio", "ohwi" or "ihwo". The output
    keeps the input layout. Runs as an implicit GEMM (depthwise and 1x1 paths too); a
    normalization, resample or zero pad producing its input and activations after it fuse."""
    # IDL: MLOperand conv2d(MLOperand input, MLOperand filter, optional MLConv2dOptions options = {});
    where = "conv2d"
    pad, st, dil, groups, (n, ic, ih, iw) = _common(
        self,
        where,
        input,
        filter,
        bias,
        padding,
        strides,
        dilations,
        groups,
        input_layout,
        CONV_FILTER_LAYOUTS,
        filter_layout,
    )
    fshape = dict(zip(filter_layout, filter.shape))
    oc, fic, kh, kw = fshape["o"], fshape["i"], fshape["h"], fshape["w"]
    if ic % groups:
        raise TypeError(f"[{where}] input channels ({ic}) must be divisible by groups ({groups})")
    if ic // groups != fic:
        raise TypeError(f"[{where}] input channels ({ic}) / groups ({groups}) must equal filter input channels ({fic})")
    if oc % groups:
        raise TypeError(f"[{where}] output channels ({oc}) must be divisible by groups ({groups})")
    _check_bias(where, bias, oc)
    out_hw, defer = [], []
    for axis, size, k, (p0, p1), s, d in (
        ("height", ih, kh, pad[0:2], st[0], dil[0]),
        ("width", iw, kw, pad[2:4], st[1], dil[1]),
    ):
        span = size + p0 + p1 - ((k - 1) * d + 1)
        _deferred_order(
            defer,
            0,
            span,
            f"[{where}] the dilated filter {axis} ({(k - 1) * d + 1}) exceeds the padded input "
            f"{axis} ({size + p0 + p1})",
            f"[{where}] output {axis} (padded input {axis} {size + p0 + p1} - dilated filter "
            f"{axis} {(k - 1) * d + 1} + 1)",
        )
        if isinstance(span, Sym) and low(span) < 0:
            # checked >= 0 at dispatch: the output size is max(span, 0) // s + 1, so that its
            # bounds say positive (kernels divide it, and products of it, as unsigned sizes)
            span = smax(span, 0)
        out_hw.append(span // s + 1)
    attrs = {
        "padding": pad,
        "strides": st,
        "dilations": dil,
        "groups": groups,
        "input_layout": input_layout,
        "filter_layout": filter_layout,
    }
    shape = _out_shape(input_layout, n, oc, *out_hw)
    for x, quantity in defer:  # (before _emit's own check of the output sizes: this names them)
        self._require_positive(x, quantity)
    return self._emit1(where, [input, filter, bias], attrs, input.data_type, shape, label)


@builder_op
def conv_transpose2d(
    self: Any,
    input: MLOperand,
    filter: MLOperand,
    *,
    padding: Sequence[int] | None = None,
    strides: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    output_padding: Sequence[int] | None = None,
    output_sizes: Sequence[int] | None = None,
    groups: int = 1,
    input_layout: str = "nchw",
    filter_layout: str = "iohw",
    bias: MLOperand | None = None,
    label: str | None = None,
) -> MLOperand:
    """2-D transposed convolution (the gradient of conv2d with respect to its input), plus an
    optional 1-D `bias`.

    padding, strides, dilations, groups as conv2d; output_padding: [h, w] added to the output's
    bottom/right; output_sizes: [h, w] of the output (instead of output_padding).
    input_layout: "nchw" or "nhwc"; filter_layout: "iohw", "hwoi" or "ohwi"."""
    # IDL: MLOperand convTranspose2d(MLOperand input, MLOperand filter, optional MLConvTranspose2dOptions options = {});
    where = "conv_transpose2d"
    pad, st, dil, groups, (n, ic, ih, iw) = _common(
        self,
        where,
        input,
        filter,
        bias,
        padding,
        strides,
        dilations,
        groups,
        input_layout,
        TRANSPOSE_FILTER_LAYOUTS,
        filter_layout,
    )
    opad = int_list(where, "output_padding", [0, 0] if output_padding is None else output_padding, 2, 0)
    sizes = None
    if output_sizes is not None:
        sizes = int_list(where, "output_sizes", output_sizes, 2, 1)
    elif opad[0] >= st[0] or opad[1] >= st[1]:
        raise TypeError(f"[{where}] output_padding {opad} must be smaller than strides {st}")
    fshape = dict(zip(filter_layout, filter.shape))
    ocg, fic, kh, kw = fshape["o"], fshape["i"], fshape["h"], fshape["w"]
    if ic != fic:
        raise TypeError(f"[{where}] input channels ({ic}) must equal filter input channels ({fic})")
    if ic % groups:
        raise TypeError(f"[{where}] input channels ({ic}) must be divisible by groups ({groups})")
    oc = ocg * groups
    _check_bias(where, bias, oc)
    out_hw, defer = [], []
    for i, (axis, size, k, (p0, p1), s, d) in enumerate(
        (
            ("height", ih, kh, pad[0:2], st[0], dil[0]),
            ("width", iw, kw, pad[2:4], st[1], dil[1]),
        )
    ):
        calc = (size - 1) * s + (k - 1) * d + 1 - p0 - p1
        if sizes is not None:
            what = (
                f"[{where}] output_sizes {axis} ({sizes[i]}) must be in [{calc}, {calc + s}) for "
                f"these input size, filter size, padding and strides"
            )
            # (for a dynamic input size, checked by each dispatch)
            _deferred_order(
                defer, 0, sizes[i] - calc, what, f"[{where}] output_sizes {axis} ({sizes[i]}) - ({calc}) + 1"
            )
            _deferred_order(
                defer, 1, calc + s - sizes[i], what, f"[{where}] ({calc + s}) - output_sizes {axis} ({sizes[i]})"
            )
            o = sizes[i]
        else:
            o = calc + opad[i]
        _deferred_order(
            defer,
            1,
            o,
            f"[{where}] output {axis} would be {o}; padding {pad} is too large",
            f"[{where}] output {axis} ({o}; padding {pad})",
        )
        if isinstance(o, Sym) and low(o) < 1:
            o = smax(o, 1)  # checked >= 1 at dispatch (as conv2d's)
        out_hw.append(o)
    attrs = {
        "padding": pad,
        "strides": st,
        "dilations": dil,
        "groups": groups,
        "input_layout": input_layout,
        "filter_layout": filter_layout,
    }
    shape = _out_shape(input_layout, n, oc, *out_hw)
    for x, quantity in defer:  # (before _emit's own check of the output sizes: this names them)
        self._require_positive(x, quantity)
    return self._emit1(where, [input, filter, bias], attrs, input.data_type, shape, label)


# -- lowering -------------------------------------------------------------------------------


def _strides_nchw(layout, shape):
    """Element strides of (n, c, h, w) for a 4-D tensor of the given layout."""
    n, a, bb, c = shape
    if layout == "nchw":
        return (a * bb * c, bb * c, c, 1)
    return (a * bb * c, 1, bb * c, c)  # nhwc: shape is (n, h, w, c)


def filter_strides(layout, shape):
    """Element strides of (o, i, h, w) for a filter of the given layout string."""
    dims = dict(zip(layout, shape))
    strides, s = {}, 1
    for ch in reversed(layout):
        strides[ch] = s
        s *= dims[ch]
    return tuple(strides[ch] for ch in "oihw")


def _prologue(kc, node, pro, bindings, args):
    """WGSL text of a convolution prologue (compiler/steps.py ConvPrologue `pro`, applied as the
    conv reads its input, which is then `pro.input`); parameter bindings are appended to
    `bindings` and `args`. By kind:
    - "bn": `fn pro(v: f32, c: u32, i: u32) -> f32`, the batch normalization of element i of
      channel c, either folded into a [scale; shift] constant (p_ab) or computed as
      normalization.wgsl does from its parameters (p_mean, p_var, p_scale, p_bias), then the
      fused activations;
    - "scaled": `pro` as well, the product with a per-(batch, channel) factor (p_q), plus a tensor
      shaped like the input (p_r);
    - "dw": `fn dw_at(m, c)`, the depthwise conv's output (_depthwise_prologue);
    - "resample": `fn rs_at(i)`, the resampled element (resample_at.wgsl's sampling);
    - "pad": nothing (the amounts join the conv's padding in _lower)."""

    x = pro.input
    # f16: parameters are f16 (read widened), the affine part is f32 and rounded to f16 (the
    # normalization's own output type), where the activations then apply as they would unfused
    t = kc.wtype(x)
    if pro.kind == "dw":
        return _depthwise_prologue(kc, pro.step.node, pro.acts, bindings, args)
    if pro.kind == "pad":
        return ""
    if pro.kind == "resample":
        # the resampled element (resample_at.wgsl, x being the resample's input), rounded to the
        # value type as the resample kernel would store it, then the activations
        rs = pro.step.node
        if rs.attrs["mode"] == "nearest-neighbor":
            y = "x[rs_index(i)]"
        else:
            y = f"{store_fn(t)}(rs_linear(i))"
        lines, cur = activation_lines(kc, pro.acts, "a", t)
        body = "\n".join([f"    let a: {t} = {y};"] + lines)
        return f"fn rs_at(i: u32) -> f32 {{\n{body}\n    return f32({cur});\n}}"
    if pro.kind == "scaled":
        q = pro.scale
        bindings.append(Binding("p_q", t))
        args.append(q)
        qs = (1,) * (4 - len(q.shape)) + tuple(q.shape)
        lay = node.attrs["input_layout"]
        C = qs[1] if lay == "nchw" else qs[3]
        n = f"(i / {wgsl(math.prod(x.shape[1:]))}) * {C}u + " if qs[0] != 1 else ""
        y = f"{store_fn(t)}(v * f32(p_q[{n}{'c' if C != 1 else '0u'}]))"
        if pro.add is not None:
            bindings.append(Binding("p_r", t))
            args.append(pro.add)
            y = f"{store_fn(t)}(f32({y}) + f32(p_r[i]))" if t == "f16" else f"{y} + p_r[i]"
        return f"fn pro(v: f32, c: u32, i: u32) -> f32 {{\n    return f32({y});\n}}"
    bn = pro.step.node
    _, mean, var, scale, bias = bn.inputs
    if pro.const is not None:
        bindings.append(Binding("p_ab", t))
        args.append(pro.const)
        y = f"fma(v, f32(p_ab[c]), f32(p_ab[{pro.const.shape[1]}u + c]))"
    else:
        for name, v in (("p_mean", mean), ("p_var", var), ("p_scale", scale), ("p_bias", bias)):
            if v is not None:
                bindings.append(Binding(name, t))
                args.append(v)
        y = "(v - f32(p_mean[c])) / sqrt(f32(p_var[c]) + " + lit(bn.attrs["epsilon"], "f32") + ")"
        if scale is not None:
            y = f"{y} * f32(p_scale[c])"
        if bias is not None:
            y = f"{y} + f32(p_bias[c])"
    lines, cur = activation_lines(kc, pro.acts, "a", t)
    body = "\n".join([f"    let a: {t} = {store_fn(t)}({y});"] + lines)
    return f"fn pro(v: f32, c: u32, i: u32) -> f32 {{\n{body}\n    return f32({cur});\n}}"


def _depthwise_prologue(kc, dw, acts, bindings, args):
    """WGSL `fn dw_at(m: u32, c: u32) -> f32`: output pixel m, channel c of depthwise conv node
    `dw` and its activations, computed from its input (bound as x, the 1x1 conv's A operand) and
    filter / bias (bound as dw_w, dw_b), for a 1x1 conv whose prologue it is."""

    x, w, bias = dw.inputs
    a = dw.attrs
    lay = a["input_layout"]
    in_s = _strides_nchw(lay, x.shape)
    f_s = filter_strides(a["filter_layout"], w.shape)
    dims = dict(zip(a["filter_layout"], w.shape))
    ih, iw = x.shape[2:] if lay == "nchw" else x.shape[1:3]
    t = kc.wtype(x)  # f16: loads widened, the f32 sum rounded to f16 (the depthwise output type)
    bindings.append(Binding("dw_w", t))
    args.append(w)
    if bias is not None:
        bindings.append(Binding("dw_b", t))
        args.append(bias)
    (pt, _, pl, _), (sh, sw), (dh, dwd) = a["padding"], a["strides"], a["dilations"]
    oh, ow = dw.outputs[0].shape[2:] if lay == "nchw" else dw.outputs[0].shape[1:3]
    ohw = "OHW" if isinstance(oh * ow, int) else wgsl(oh * ow)  # the 1x1 conv's plane, its const
    ih_i, iw_i = (str(v) if isinstance(v, int) else f"i32({wgsl(v)})" for v in (ih, iw))
    lines = [
        "fn dw_at(m: u32, c: u32) -> f32 {",
        f"    let p = m % {ohw};",
        f"    let ih0 = i32((p / {wgsl(ow)}) * {sh}u) - {pt};",
        f"    let iw0 = i32((p % {wgsl(ow)}) * {sw}u) - {pl};",
        f"    let xb = (m / {ohw}) * {wgsl(in_s[0])} + c * {wgsl(in_s[1])};",
        f"    let wb = c * {f_s[0]}u;",
        "    var acc = 0.0;",
    ]
    for kh in range(dims["h"]):
        lines.append(f"    if (ih0 + {kh * dh} >= 0 && ih0 + {kh * dh} < {ih_i}) {{")
        lines.append(f"        let row = xb + u32(ih0 + {kh * dh}) * {wgsl(in_s[2])};")
        for kw in range(dims["w"]):
            lines.append(
                f"        if (iw0 + {kw * dwd} >= 0 && iw0 + {kw * dwd} < {iw_i}) {{ acc = fma(f32(x[row + u32(iw0 + {kw * dwd}) * {wgsl(in_s[3])}]), "
                f"f32(dw_w[wb + {kh * f_s[2] + kw * f_s[3]}u]), acc); }}"
            )
        lines.append("    }")
    if bias is not None:
        lines.append("    acc = acc + f32(dw_b[c]);")
    lines.append(f"    let a: {t} = {store_fn(t)}(acc);")
    act_lines, cur = activation_lines(kc, acts, "a", t)
    lines += act_lines
    lines.append(f"    return f32({cur});")
    lines.append("}")
    return "\n".join(lines)


def _lower(kc, node, transposed):
    x, w, bias = node.inputs
    out = kc.out(node)
    a = node.attrs
    step = kc.step
    pro = step.prologue if step is not None and node is step.node else None
    kind = "" if pro is None else pro.kind  # "", "bn", "scaled", "dw", "resample", "pad"
    if kind == "pad":
        # a zero pad of the spatial dims before this conv (compiler/fusion/conv_prologue.py): read its input and
        # pad by both amounts; padding never goes through x_at, so it reads as zero
        x = pro.input
        a = dict(a, padding=[p + q for p, q in zip(a["padding"], pro.pads)])
    lay = a["input_layout"]
    groups = a["groups"]
    in_s = _strides_nchw(lay, x.shape)
    out_s = _strides_nchw(lay, out.shape)
    f_s = filter_strides(a["filter_layout"], w.shape)
    fdims = dict(zip(a["filter_layout"], w.shape))
    kh, kw = fdims["h"], fdims["w"]
    if lay == "nchw":
        nb, ic, ih, iw = x.shape
        _, oc, oh, ow = out.shape
    else:
        nb, ih, iw, ic = x.shape
        _, oh, ow, oc = out.shape
    icg, ocg = ic // groups, oc // groups
    (pt, _, pl, _), (sh, sw), (dh, dw) = a["padding"], a["strides"], a["dilations"]
    params = {
        "IC": ic,
        "IH": ih,
        "IW": iw,
        "OC": oc,
        "OH": oh,
        "OW": ow,
        "ICg": icg,
        "OCg": ocg,
        "KH": kh,
        "KW": kw,
        "SH": sh,
        "SW": sw,
        "DH": dh,
        "DW": dw,
        "PT": pt,
        "PL": pl,
        "in_s": in_s,
        "out_s": out_s,
        "f_s": f_s,
        "groups": groups,
        "has_bias": bias is not None,
        "transposed": transposed,
        # conv2d: group g owns filter outputs [g*OCg, ...); transpose: filter inputs [g*ICg, ...)
        "f_g": icg * f_s[1] if transposed else ocg * f_s[0],
        # GEMM staging (conv2d.wgsl): set below for the implicit GEMM
        "a_mode": "default",
        "x_vec": False,
        "w_kcontig": False,
        "a_kmajor": False,
        "b_kmajor": False,
    }
    t = kc.wtype(x)  # f32, or f16 (loaded into f32 accumulators, stored through ST)
    if (
        not transposed
        and kind in ("", "bn", "scaled", "pad")
        and _direct_gemm(kc, node, pro, w, bias, out, a, f_s, in_s, t)
    ):
        return
    params["ST"] = store_fn(t)
    bindings = [Binding("x", t), Binding("w", t)]
    args = [x, w]
    params["pro_kind"] = kind
    params["pro"] = "" if pro is None else _prologue(kc, node, pro, bindings, args)
    if kind == "resample":
        params["rs"] = resample_params(kc, pro.step.node, x, "x")
    if pro is not None:
        args[0] = pro.input  # the conv reads the prologue's input and applies it as it loads
    params["act"] = _bind_out(kc, bindings, args, bias, out, t, "bias")
    dynamic = not (is_static(x.shape) and is_static(out.shape))
    if dynamic:
        # Divisions by sizes known at dispatch in f32 (conv2d.wgsl's udiv_: exact for numerators
        # below 2^22: a flat output index, or a row of the last GEMM tile), where a u32 division
        # runs lane by lane on CPU adapters; conv2d.wgsl's loaders have no unchecked interior
        # copies (matmul.wgsl's edge_a)
        params.update(fdiv=high(nb * oh * ow) * max(oc, groups) + 1024 < 1 << 22, edge_a=False, edge_b=False)
    op = "conv_transpose2d" if transposed else "conv2d"
    name = f"{op}_{lay}_{t}_k{kh}x{kw}s{sh}x{sw}" + (f"d{dh}x{dw}" if (dh, dw) != (1, 1) else "")
    if kind:
        name = name.replace(op, f"{op}_{kind}", 1)  # conv2d_bn_..., conv2d_resample_...
    dwp = kind == "dw"

    if not transposed and icg == 1 and groups > 1:
        # OWB adjacent outputs per thread share their input columns (SPAN of them per row); a
        # dynamic width: 4 unless its maximum is smaller (outputs past OW are not stored)
        owb = min(4, high(ow))
        total = nb * oc * oh * cdiv(ow, owb)
        params.update(
            path="dw",
            MULT=ocg,
            total=total,
            OWB=owb,
            SPAN=(owb - 1) * sw + (kw - 1) * dw + 1,
            M=1,
            N=1,
            K=1,
            batch=1,
            pointwise=False,
            ic_inner=False,
            check_a=False,
            check_b=False,
            check_out=False,
        )
        kc.launch(Kernel(f"{name}_dw", "conv2d.wgsl", params, bindings), args, grid_checked(cdiv(total, WORKGROUP), op))
        return
    # (the direct kernel loops over the window's rows, taps and the group's input channels: where
    # that passes llvmpipe's loop cap, runtime/wgsl.py LOOP_BUDGET, the GEMM path splits K instead)
    if ocg < 4 and not dwp and kh * kw * (high(icg) + 1) + kh + 16 <= LOOP_BUDGET:
        # Few output channels (a segmentation head, the last upsampling): GEMM tiles would be
        # mostly padding, so one thread per output pixel computes its ocg channels directly
        # (selfie segmentation's 2x2 stride-2 transposed conv to 1 channel: 74 -> ~8 ms).
        total = groups * nb * oh * ow
        params.update(
            path="direct",
            OCB=ocg,
            ocb_n=1,
            check_oc=False,
            total=total,
            stride_taps=transposed and (dh, dw) == (1, 1) and pt >= 0 and pl >= 0,
            M=nb * oh * ow,
            N=ocg,
            K=icg * kh * kw,
            batch=1,
            pointwise=False,
            ic_inner=False,
            check_a=False,
            check_b=False,
            check_out=False,
        )
        kc.launch(
            Kernel(f"{name}_direct", "conv2d.wgsl", params, bindings), args, grid_checked(cdiv(total, WORKGROUP), op)
        )
        return
    pointwise = not transposed and kh == kw == 1 and (sh, sw) == (1, 1) and a["padding"] == [0, 0, 0, 0]
    ic_inner = lay == "nhwc"
    params.update(pointwise=pointwise, ic_inner=ic_inner)
    # A (im2col), on hardware adapters: "nhwc4" stages 16-byte loads of 4 input channels (threads
    # along k: coalesced for NHWC); else "hoist" (threads along m, addresses precomputed per
    # thread: coalesced for NCHW). The transpose keeps the generic per-element loader.
    vec = vec_loads(kc)
    if not transposed and not dwp:
        nhwc4 = vec and ic_inner and icg % 4 == 0 and ic % 4 == 0 and kind != "resample"
        # On CPU adapters the per-element loader stays: lavapipe measured the hoisted staging at
        # parity to 5% slower (LLVM already strength-reduces the constant divisions). Not so for
        # sizes known at dispatch, where it divides by the plane and the width once per staged
        # row instead of once per element (an NHWC 1x1 convolution reads row m at m * IC: no
        # division either way).
        hoist = vec or dynamic and not (pointwise and in_s[1] == 1 and groups == 1)
        params.update(a_mode="nhwc4" if nhwc4 else "hoist" if hoist else "default", x_vec=nhwc4)
        if nhwc4:
            bindings[0] = Binding("x", f"vec4<{t}>")
    # B (filter): where its k order is its memory order (OIHW, OHWI filters), threads along k
    # read consecutive words of one output channel's filter.
    order = (1, 3, 2) if ic_inner else (3, 2, 1)  # f_s indices of k's digits, fastest first
    dims = {1: icg, 2: kh, 3: kw}
    kcontig, st = True, 1
    for d in order:
        kcontig &= dims[d] == 1 or f_s[d] == st
        st *= dims[d]
    params.update(w_kcontig=kcontig, b_kmajor=vec and kcontig)
    if pointwise:
        name = f"{op}{'_' + kind if kind else ''}_{lay}_{t}_1x1"
    if groups > 1:
        name += f"_g{groups}"
    gemm_launch(kc, name, "conv2d.wgsl", params, bindings, args, M=nb * oh * ow, N=ocg, K=icg * kh * kw, batch=groups)


def _direct_gemm(kc, node, pro, w, bias, out, a, f_s, in_s, t):
    """A conv2d on a CPU adapter as matmul.wgsl's GEMM, whose DIRECT tile (ops/_gemm.py) reads its
    operands without workgroup tiles. NCHW with the roles turned, per image and group:
    out[n, g] ([OCg, OH*OW]) = filter[g] ([OCg, ICg*KH*KW], its k order the OIHW filter's memory
    order) @ im2col(x[n, g]) ([K, OH*OW]), the bias per row; the output's flat index is then the
    GEMM's (batch n * G + g). A 1x1 stride-1 unpadded one reads x as it lies, 4 pixels a load;
    others gather im2col's elements (load_b through b_fused: k and the pixel decomposed, the
    padding tested). NHWC 1x1 stride-1 unpadded ones as they lie: out [N*H*W, OC] = x @ filter^T.
    On lavapipe (2 cores): MobileNet-sized NCHW pointwise convolutions 2.6-3.3x faster than the
    implicit GEMM (whose rows are pixels, reading x a channel plane apart), NHWC ones 1.2-1.8x;
    3x3 ones 1.05-1.23x, grouped 3x3 ones of 8 channels a group (RegNet's) 5.2-7.6x (the implicit
    GEMM's tiles were 8 columns wide there). An NCHW one applies its "bn" or "scaled" prologue
    (`pro`: a batch normalization, a squeeze-and-excitation scale) to x as B is loaded; a merged
    "pad" prologue is padding. Sizes may be dynamic (a static and a dynamic build take the same
    path: the same sums). False where it does not apply (depthwise, fewer than 4 output channels
    a group, transposed: their own kernels); True when launched."""
    if not cpu_device(kc.device) or not has_direct("matmul.wgsl"):
        return False
    lay, groups = a["input_layout"], a["groups"]
    (pt, pb, pl, pr), (sh, sw), (dh, dw) = a["padding"], a["strides"], a["dilations"]
    fdims = dict(zip(a["filter_layout"], w.shape))
    kh, kw = fdims["h"], fdims["w"]
    plain = kh == kw == 1 and (sh, sw) == (1, 1) and not any((pt, pb, pl, pr)) and groups == 1
    x = node.inputs[0] if pro is None else pro.input
    vec = vec_loads(kc, direct=True)
    if lay == "nhwc":
        if not plain or (pro is not None and pro.kind != "pad"):
            return False
        nb, ih, iw, ic = x.shape
        oc = out.shape[3]
        M, N, K, batch, opa, opb = nb * ih * iw, oc, ic, 1, x, w
        params = {
            "a_base": "0u",
            "b_base": "0u",
            "a_sm": ic,
            "a_sk": 1,
            "b_sk": f_s[1],
            "b_sn": f_s[0],
            "c_sm": 0,
            "c_sn": 1,
            "vec_a": vec and ic % 4 == 0,
            "vec_b": vec and f_s[0] == 1 and oc % 4 == 0 and f_s[1] % 4 == 0,
        }
    else:
        nb, ic, ih, iw = x.shape
        oc, oh, ow = out.shape[1], out.shape[2], out.shape[3]
        icg, ocg = ic // groups, oc // groups
        if (icg == 1 and groups > 1) or ocg < 4:
            return False
        kf = icg * kh * kw
        if not plain and list(f_s[1:]) != [kh * kw, kw, 1]:
            return False  # (the filter's k order must be OIHW's memory order)
        M, N, K, batch, opa, opb = ocg, oh * ow, kf, nb * groups, w, x
        params = {
            "a_base": f"(bt % {groups}u) * {ocg * f_s[0]}u" if groups > 1 else "0u",
            "b_base": batch_offset_expr((nb,), (nb,), ic * N) if plain else "0u",
            "a_sm": f_s[0],
            "a_sk": f_s[1] if plain else 1,
            "b_sk": in_s[1],
            "b_sn": 1,
            "c_sm": 1,
            "c_sn": 0,
            "vec_a": vec and (plain and f_s[1] == 1 or not plain) and f_s[0] % 4 == 0 and kf % 4 == 0,
            "vec_b": vec and plain and N % 4 == 0,
        }
        if groups > 1 and bias is not None:
            params["c_base"] = f"(bt % {groups}u) * {ocg}u"
    params.update(alpha=1.0, beta=1.0, has_c=bias is not None, ST=store_fn(t))
    bindings = [
        Binding("a", f"vec4<{t}>" if params["vec_a"] else t),
        Binding("b", f"vec4<{t}>" if params["vec_b"] else t),
    ]
    args = [opa, opb]
    pro_fn = pro is not None and pro.kind in ("bn", "scaled")
    if pro is not None and not pro_fn and pro.kind != "pad":
        return False
    if pro_fn:
        params["b_quad"] = _prologue(kc, node, pro, bindings, args)
    if lay == "nchw" and plain:
        at = f"b_base(bt) + k * {wgsl(in_s[1])} + n"
        elem = "b[i / 4u][i % 4u]" if params["vec_b"] else "b[i]"
        if pro_fn:  # (without a prologue the template's loaders read x as it lies)
            params["b_fused"] = f"    let i = {at};\n    return pro(f32({elem}), k, i);"
        if pro_fn and params["vec_b"]:
            params["b4_fused"] = (
                f"    let i = {at};\n    let v = vec4<f32>(b[i / 4u]);\n"
                "    return vec4<f32>(pro(v.x, k, i), pro(v.y, k, i + 1u), pro(v.z, k, i + 2u), pro(v.w, k, i + 3u));"
            )
    elif lay == "nchw":
        params["b_fused"] = _im2col_load(nb, groups, icg, kh, kw, sh, sw, dh, dw, pt, pl, ih, iw, ow, in_s, pro_fn)
        params["gather_b"] = True  # (each element's index computed: 16 rows a thread, direct_config)
    params["act"] = _bind_out(kc, bindings, args, bias, out, t, "c")
    kind = "_" + pro.kind if pro is not None else ""
    geo = "1x1" if plain else f"k{kh}x{kw}s{sh}x{sw}" + (f"_g{groups}" if groups > 1 else "")
    bt = f"b{batch}_" if isinstance(batch, Sym) or batch > 1 else ""
    name = f"conv2d{kind}_{lay}_{t}_{geo}_gemm_{bt}{M}x{K}x{N}"
    gemm_launch(kc, name, "matmul.wgsl", params, bindings, args, M, N, K, batch)
    return True


def _bind_out(kc, bindings, args, bias, out, t, bias_name):
    """Bind the bias (as `bias_name`, where there is one), then the output last; returns the
    step's epilogue act() (whose operands go before the output)."""
    if bias is not None:
        bindings.append(Binding(bias_name, t))
        args.append(bias)
    bindings.append(Binding("out", t, True))
    args.append(out)
    return kc.epilogue(bindings, args)


def _im2col_load(nb, groups, icg, kh, kw, sh, sw, dh, dw, pt, pl, ih, iw, ow, in_s, pro_fn):
    """WGSL body of load_b(bt, k, n) for _direct_gemm's NCHW im2col: element (k, pixel n) of image
    bt / G's group bt % G, 0 in the padding."""
    u = wgsl
    return "\n".join(
        [
            f"    let img = bt / {groups}u;",
            f"    let ic = (bt % {groups}u) * {icg}u + k / {kh * kw}u;",
            f"    let r = k % {kh * kw}u;",
            f"    let hh = i32((n / {u(ow)}) * {sh}u + (r / {kw}u) * {dh}u) - {pt};",
            f"    let ww = i32((n % {u(ow)}) * {sw}u + (r % {kw}u) * {dw}u) - {pl};",
            f"    if (hh < 0 || hh >= i32({u(ih)}) || ww < 0 || ww >= i32({u(iw)})) {{ return 0.0; }}",
            f"    let i = img * {u(in_s[0])} + ic * {u(in_s[1])} + u32(hh) * {u(in_s[2])} + u32(ww) * {u(in_s[3])};",
            "    return pro(f32(b[i]), ic, i);" if pro_fn else "    return f32(b[i]);",
        ]
    )


@lowering("conv2d")
def _lower_conv2d(kc, node):
    _lower(kc, node, transposed=False)


@lowering("conv_transpose2d")
def _lower_conv_transpose2d(kc, node):
    _lower(kc, node, transposed=True)
