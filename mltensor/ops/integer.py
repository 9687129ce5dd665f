"""Exact integer GEMMs behind ONNX's integer operators (shaders/integer.wgsl): MatMulInteger,
ConvInteger and the requantizing QLinearMatMul / QLinearConv (mltensor/onnx/ops/integer.py).

Internal builder operators (not WebNN's, hence the leading underscore, absent from
op_support_limits):
- `_int_matmul(a, b, ...)`: int8/uint8 A [..., M, K] and B [..., K, N] (batch dimensions broadcast)
- `_int_conv2d(x, w, ...)`: NCHW int8/uint8 input, OIHW filter, explicit padding, strides,
  dilations, groups
Both subtract optional zero points (`*_zero_point`, the operand's data type) and sum the products
in i32, so the int32 result is exact (and wraps past 2**31 as onnxruntime's does). With `scale`
(float32) and `output_zero_point` (int8/uint8) the result is requantized instead: acc (+ int32
`bias`) times scale, rounded half to even, plus the zero point, saturated to the zero point's type.

Packed constants: `b_packed` (_int_matmul) / `filter_packed` (_int_conv2d) = (data type, shape)
say that B / the filter is a uint32 operand holding the little-endian bytes of an int8/uint8
tensor of that shape, four to a word (as the model file stores them): weights then take one byte
an element on the GPU instead of a 32-bit word, and the kernel extracts each byte as it stages
the tile.

Broadcasting of the parameters: for _int_matmul each of a_zero_point ([..., M or 1, 1]),
b_zero_point ([..., 1, N or 1]), scale and output_zero_point ([..., M or 1, N or 1]) broadcasts to
the output [batch..., M, N] (per tensor, per row, per column, per batch); for _int_conv2d
input_zero_point and output_zero_point are scalars (one element) and filter_zero_point, scale and
bias hold one element or one per output channel.

Dynamic dimensions (mltensor/dynamic/): _int_matmul takes sizes known only at dispatch (a
transformer's token count in M or the batch dimensions; K and N too): the kernel reads them
through `sz` / the batch offsets as expressions over the immediate `dims`, the workgroup counts
are evaluated per dispatch, and the tile is chosen at the maxima. _int_conv2d is static
(builder_op refuses dynamic operands; InferenceSession then builds one specialization per size).
"""

import math

from ..dynamic.dims import Sym, cdiv, high, wgsl
from ..dynamic.kernels import MAX_GROUPS, grid
from ..errors import NotSupportedError
from ..ir.registry import MAX_RANK, builder_op, lowering, register
from ..runtime.wgsl import LOOP_BUDGET, WORKGROUP, Binding, Kernel, lit
from ._checks import broadcast_shapes, check_support, int_list
from ._gemm import batch_offset_expr, check_k, folds_batch
from ._index import is_one

# Builder methods taking operands with dynamic dimensions (mltensor/dynamic/)
DYNAMIC_OPS = frozenset({"_int_matmul"})

INT8 = ("int8", "uint8")
WG_STORAGE = 16384  # WebGPU's default maxComputeWorkgroupStorageSize: the staged tiles fit it

register(
    "_int_matmul",
    {
        "a": INT8,
        "b": INT8,
        "a_zero_point": INT8,
        "b_zero_point": INT8,
        "scale": ("float32",),
        "output_zero_point": INT8,
        "output": ("int32", "int8", "uint8"),
    },
    ranks={"a": (2, MAX_RANK), "b": (2, MAX_RANK)},
)
register(
    "_int_conv2d",
    {
        "input": INT8,
        "filter": INT8,
        "input_zero_point": INT8,
        "filter_zero_point": INT8,
        "scale": ("float32",),
        "output_zero_point": INT8,
        "bias": ("int32",),
        "output": ("int32", "int8", "uint8"),
    },
    ranks={"input": (4, 4), "filter": (4, 4)},
)


class _Logical:
    """An operand's logical data type and shape (a packed operand's, for validation)."""

    __slots__ = ("data_type", "shape", "rank")

    def __init__(self, data_type, shape):
        self.data_type, self.shape, self.rank = data_type, tuple(shape), len(shape)


def _unpacked(where, what, x, packed):
    """x itself, or for a packed operand (packed = (data type, shape)) its logical view."""
    if packed is None:
        return x
    try:
        dt, shape = packed
        shape = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise TypeError(f"[{where}] {what}_packed must be a (data type, shape) pair, got {packed!r}") from None
    if dt not in INT8 or any(d < 1 for d in shape):
        raise TypeError(f"[{where}] {what}_packed must describe an int8 or uint8 tensor, got {packed!r}")
    words = -(-math.prod(shape) // 4)
    if x.data_type != "uint32" or tuple(x.shape) != (words,):
        raise TypeError(
            f"[{where}] a packed {what} must be uint32 of shape [{words}] (the bytes of {dt} "
            f"{list(shape)}), got {x.data_type} {list(x.shape)}"
        )
    return _Logical(dt, shape)


def _zero_point(b, where, what, z, x):
    if z is None:
        return
    b._operand(z, where, what)
    if z.data_type != x.data_type:
        raise TypeError(f"[{where}] {what} data type {z.data_type} differs from its operand's {x.data_type}")


def _fits(where, what, v, target):
    """v broadcasts to `target` (unidirectionally; a dynamic dimension only as the same size
    expression), else TypeError."""
    if v is None:
        return
    s = tuple(v.shape)
    if len(s) > len(target) or any(
        not (d == t or (isinstance(d, int) and d == 1)) for d, t in zip(s[::-1], target[::-1])
    ):
        raise TypeError(f"[{where}] {what} shape {list(s)} does not broadcast to {list(target)}")


def _binding_fits(b, where, *shapes):
    """int8/uint8 operands are bound as one 32-bit word an element (dtypes.py), as is the output
    (packed operands: their uint32 words): refuse, by name, one whose words exceed the largest
    binding instead of failing inside wgpu. shapes: (what, shape) pairs."""
    limit = b._context._max_bytes
    for what, shape in shapes:
        n = 4 * high(math.prod(shape))
        if n > limit:
            raise NotSupportedError(
                f"[{where}] {what} of shape {list(shape)} needs {n} bytes as 32-bit words, "
                f"more than the largest binding ({limit} bytes)"
            )


def _requant_args(b, where, scale, output_zero_point):
    if (scale is None) != (output_zero_point is None):
        raise TypeError(f"[{where}] scale and output_zero_point go together")
    if scale is not None:
        b._operand(scale, where, "scale")
        b._operand(output_zero_point, where, "output_zero_point")
        return output_zero_point.data_type
    return "int32"


@builder_op
def _int_matmul(
    b, a, c, *, a_zero_point=None, b_zero_point=None, scale=None, output_zero_point=None, b_packed=None, label=None
):
    where = "_int_matmul"
    b._operand(a, where, "a")
    b._operand(c, where, "b")
    words = c
    c = _unpacked(where, "b", c, b_packed)
    _zero_point(b, where, "a_zero_point", a_zero_point, a)
    _zero_point(b, where, "b_zero_point", b_zero_point, c)
    out_type = _requant_args(b, where, scale, output_zero_point)
    check_support(
        where,
        a=a,
        b=c,
        a_zero_point=a_zero_point,
        b_zero_point=b_zero_point,
        scale=scale,
        output_zero_point=output_zero_point,
    )
    check_k(
        b,
        a.shape[-1],
        c.shape[-2],
        f"[{where}] columns of a ({a.shape[-1]}) must equal rows of b ({c.shape[-2]}); "
        f"shapes {list(a.shape)} and {list(c.shape)}",
    )
    batch = broadcast_shapes(where, a.shape[:-2], c.shape[:-2], b)
    M, N = a.shape[-2], c.shape[-1]
    shape = tuple(batch) + (M, N)
    _fits(where, "a_zero_point", a_zero_point, tuple(batch) + (M, 1))
    _fits(where, "b_zero_point", b_zero_point, tuple(batch) + (1, N))
    _fits(where, "scale", scale, shape)
    _fits(where, "output_zero_point", output_zero_point, shape)
    _binding_fits(b, where, ("a", a.shape), ("b", words.shape), ("the output", shape))
    attrs = {"b_packed": None if b_packed is None else (c.data_type, c.shape)}
    return b._emit1(
        where, [a, words, a_zero_point, b_zero_point, scale, output_zero_point], attrs, out_type, shape, label
    )


@builder_op
def _int_conv2d(
    b,
    x,
    w,
    *,
    input_zero_point=None,
    filter_zero_point=None,
    scale=None,
    output_zero_point=None,
    bias=None,
    padding=(0, 0, 0, 0),
    strides=(1, 1),
    dilations=(1, 1),
    groups=1,
    filter_packed=None,
    label=None,
):
    where = "_int_conv2d"
    b._operand(x, where, "input")
    b._operand(w, where, "filter")
    words = w
    w = _unpacked(where, "filter", w, filter_packed)
    _zero_point(b, where, "input_zero_point", input_zero_point, x)
    _zero_point(b, where, "filter_zero_point", filter_zero_point, w)
    if bias is not None:
        b._operand(bias, where, "bias")
        if scale is None:
            raise TypeError(f"[{where}] bias needs a requantized output (scale)")
    out_type = _requant_args(b, where, scale, output_zero_point)
    check_support(
        where,
        input=x,
        filter=w,
        input_zero_point=input_zero_point,
        filter_zero_point=filter_zero_point,
        scale=scale,
        output_zero_point=output_zero_point,
        bias=bias,
    )
    pad = int_list(where, "padding", padding, 4, 0)
    st = int_list(where, "strides", strides, 2, 1)
    dl = int_list(where, "dilations", dilations, 2, 1)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise TypeError(f"[{where}] groups must be an integer >= 1, got {groups!r}")
    n, cin, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    if cin != cg * groups or oc % groups:
        raise TypeError(f"[{where}] input channels {cin} and filter shape {list(w.shape)} do not match groups={groups}")
    oh = (h + pad[0] + pad[1] - dl[0] * (kh - 1) - 1) // st[0] + 1
    ow = (wd + pad[2] + pad[3] - dl[1] * (kw - 1) - 1) // st[1] + 1
    if oh < 1 or ow < 1:
        raise TypeError(
            f"[{where}] the output size [{oh}, {ow}] is not positive (input {list(x.shape)}, "
            f"filter {list(w.shape)}, padding {pad}, strides {st}, dilations {dl})"
        )
    for what, v in (("input_zero_point", input_zero_point), ("output_zero_point", output_zero_point)):
        if v is not None and math.prod(v.shape) != 1:
            raise TypeError(f"[{where}] {what} must hold one element, got shape {list(v.shape)}")
    for what, v in (("filter_zero_point", filter_zero_point), ("scale", scale), ("bias", bias)):
        if v is not None and math.prod(v.shape) not in (1, oc):
            raise TypeError(
                f"[{where}] {what} must hold one element or one per output channel ({oc}), got shape {list(v.shape)}"
            )
    _binding_fits(b, where, ("input", x.shape), ("filter", words.shape), ("the output", (n, oc, oh, ow)))
    attrs = {
        "padding": pad,
        "strides": st,
        "dilations": dl,
        "groups": groups,
        "filter_packed": None if filter_packed is None else (w.data_type, w.shape),
    }
    return b._emit1(
        where,
        [x, words, input_zero_point, filter_zero_point, scale, output_zero_point, bias],
        attrs,
        out_type,
        (n, oc, oh, ow),
        label,
    )


# -- lowering --------------------------------------------------------------------------------


def _param_index(shape, out_shape):
    """WGSL index (in bt, the flat output batch, and m, n) of an operand broadcast to the output
    [batch..., M, N]."""
    r = len(out_shape)
    s = (1,) * (r - len(shape)) + tuple(shape)

    def one(d):
        return isinstance(d, int) and d == 1

    if all(one(d) for d in s):
        return "0u"
    base = batch_offset_expr(s[:-2], out_shape[:-2], s[-2] * s[-1])
    terms = [] if base == "0u" else [base]
    if not one(s[-2]):
        terms.append(f"m * {wgsl(s[-1])}" if not one(s[-1]) else "m")
    if not one(s[-1]):
        terms.append("n")
    return " + ".join(terms) or "0u"


def _config(M, N, K):
    """(TX, TY, RM, RN, BK): 64 threads, each RM x RN outputs, as lavapipe_config in ops/_gemm.py
    measured best on lavapipe for the float GEMM: 8 x 8 outputs a thread (64 x 64 tiles) where
    the matrix is large enough, 4 along a short dimension, and narrower thread rows for narrow N,
    so that small problems (a transformer's few tokens in M) do not compute mostly padding. BK:
    32, or K rounded up to 8 when shorter, halved until the tiles fit the workgroup memory.
    Dynamic sizes: chosen at their maxima."""
    M, N, K = high(M), high(N), high(K)
    rn = 8 if N >= 64 else 4
    tx = 8 if N > 16 else 4 if N > 8 else 2
    ty = 64 // tx
    rm = 8 if M >= 8 * ty else 4
    bk = min(32, -(-K // 8) * 8)
    while 16 * bk * (ty * rm + tx * rn) // 4 > WG_STORAGE and bk > 4:
        bk //= 2
    return tx, ty, rm, rn, bk


def _launch(kc, node, name, params, bindings, args, M, N, batch):
    K = params["K"]
    tx, ty, rm, rn, bk = _config(M, N, K)
    groups = (cdiv(N, tx * rn), cdiv(M, ty * rm), batch)
    if max(high(g) for g in groups) > MAX_GROUPS:
        raise NotSupportedError(
            f"[{node.op}] {[high(g) for g in groups]} workgroups exceed the per-dimension "
            f"limit {MAX_GROUPS} (M={M}, N={N}, batch={batch})"
        )

    # the template's `sz`: the name of each static size's constant, else its dispatch-time expression
    def whole(size, tile):  # every tile inside the matrix along this size, for every size
        return isinstance(size, int) and size % tile == 0

    # loops of an invocation (runtime/wgsl.py LOOP_BUDGET; a loop of n counts n + 1 on llvmpipe):
    # per BK step, the step, A's and B's staging and the BK-deep products. Past the budget (K
    # ~20000-40000 by tile) K is cut into SPLIT chunks of KCHUNK (a multiple of BK), each summed by
    # its own workgroups into scratch, then added by a reduce kernel that stores (and requantizes)
    per = 1 + cdiv(ty * rm * bk, 64) + 1 + cdiv(bk * tx * rn // 4, 64) + 1 + bk + 1
    split = 1
    while cdiv(high(K), split * bk) * per + 16 > LOOP_BUDGET:
        split += 1
    kchunk = cdiv(high(K), split * bk) * bk
    split = cdiv(high(K), kchunk)
    sizes = (("M", M), ("N", N), ("K", K), ("BATCH", batch), ("TOTAL", batch * M * N))
    params.update(
        TX=tx,
        TY=ty,
        RM=rm,
        RN=rn,
        BK=bk,
        M=M,
        N=N,
        SPLIT=split,
        KCHUNK=kchunk,
        REDUCE=False,
        check_a=not (whole(M, ty * rm) and whole(K, bk)),
        check_b=not (whole(K, bk) and whole(N, tx * rn)),
        sz={n: v if isinstance(v, Sym) else wgsl(v) if n in ("BATCH", "TOTAL") else n for n, v in sizes},
    )
    kname = f"{name}_t{ty * rm}x{tx * rn}"
    if split == 1:
        kc.launch(Kernel(kname, "integer.wgsl", params, bindings), args, groups, iters=cdiv(high(K), bk) * per + 16)
        return
    if high(batch) * split > MAX_GROUPS:
        raise NotSupportedError(
            f"[{node.op}] {high(batch)} x {split} K chunks exceed the per-dimension workgroup limit {MAX_GROUPS}"
        )
    part = kc.scratch(4 * split * high(batch * M * N))
    kc.launch(
        Kernel(f"{kname}_s{split}", "integer.wgsl", params, bindings + [Binding("part", "i32", True)]),
        args + [part],
        groups[:2] + (batch * split,),
        iters=cdiv(kchunk, bk) * per + 16,
    )
    kc.launch(
        Kernel(
            f"{kname}_s{split}_reduce", "integer.wgsl", dict(params, REDUCE=True), bindings + [Binding("part", "i32")]
        ),
        args + [part],
        grid(cdiv(batch * M * N, WORKGROUP)),
        iters=split + 1,
    )


def _requant(kc, params, bindings, args, scale, zy, out, scale_idx, zy_idx):
    ot = out.data_type
    lo, hi = {"int8": (-128, 127), "uint8": (0, 255)}[ot]
    params.update(
        requant=True, qmin=lit(lo, "i32"), qmax=lit(hi, "i32"), otype=kc.wtype(out), scale=scale_idx, zy=zy_idx
    )
    bindings += [Binding("scale", kc.wtype(scale)), Binding("zy", kc.wtype(zy))]
    args += [scale, zy]


@lowering("_int_matmul")
def _lower_int_matmul(kc, node):
    a, b, za, zb, scale, zy = node.inputs
    out = kc.out(node)
    packed = node.attrs["b_packed"]
    b_type, b_shape = packed if packed else (b.data_type, b.shape)
    M, K, N = a.shape[-2], a.shape[-1], b_shape[-1]
    if K != b_shape[-2] and isinstance(K, Sym):  # equal at dispatch (_check_k): take a static one
        K = b_shape[-2]
    ob = tuple(out.shape[:-2])
    batch = math.prod(ob)
    # one GEMM of batch * M rows (ops/_gemm.py folds_batch) where the zero points and scales are
    # per tensor or per column, so that no index depends on the row's matrix
    fold = folds_batch(a.shape[:-2], b_shape[:-2], ob) and all(
        v is None or all(is_one(d) for d in v.shape[:-1]) for v in (za, zb, scale, zy)
    )
    if fold:
        M, batch = batch * M, 1
    params = {
        "mode": "matmul",
        "K": K,
        "requant": False,
        "bias": None,
        "a_packed": None,
        "b_packed": packed and b_type,
        "a_base": "0u" if fold else batch_offset_expr(a.shape[:-2], ob, M * K),
        "b_base": "0u" if fold else batch_offset_expr(b_shape[:-2], ob, K * N),
        "za": None if za is None else _param_index(za.shape, out.shape),
        "zb": None if zb is None else _param_index(zb.shape, out.shape),
    }
    bindings = [Binding("a", kc.wtype(a)), Binding("b", kc.wtype(b))]
    args = [a, b]
    for v, nm in ((za, "za"), (zb, "zb")):
        if v is not None:
            bindings.append(Binding(nm, kc.wtype(v)))
            args.append(v)
    if scale is not None:
        _requant(
            kc,
            params,
            bindings,
            args,
            scale,
            zy,
            out,
            _param_index(scale.shape, out.shape),
            _param_index(zy.shape, out.shape),
        )
    bindings.append(Binding("out", kc.wtype(out), True))
    args.append(out)
    name = (
        f"int_matmul_{a.data_type}_{b_type}{'p' if packed else ''}_{f'b{batch}_' if not (batch == 1) else ''}{M}x{K}x{N}"
        f"{'_q' + out.data_type if scale is not None else ''}"
    )
    _launch(kc, node, name, params, bindings, args, M, N, batch)


@lowering("_int_conv2d")
def _lower_int_conv2d(kc, node):
    x, w, zx, zw, scale, zy, bias = node.inputs
    out = kc.out(node)
    at = node.attrs
    packed = at["filter_packed"]
    w_type, w_shape = packed if packed else (w.data_type, w.shape)
    g = at["groups"]
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w_shape
    _, _, oh, ow = out.shape
    M, N, K = oc // g, oh * ow, cg * kh * kw

    def per_channel(v):
        return "channel(bt, m)" if math.prod(v.shape) > 1 else "0u"

    params = {
        "mode": "conv",
        "K": K,
        "G": g,
        "C": c,
        "OC": oc,
        "H": h,
        "W": wd,
        "OW": ow,
        "KH": kh,
        "KW": kw,
        "sh": at["strides"][0],
        "sw": at["strides"][1],
        "dh": at["dilations"][0],
        "dw": at["dilations"][1],
        "ph": at["padding"][0],
        "pw": at["padding"][2],
        "requant": False,
        "a_packed": packed and w_type,
        "b_packed": None,
        "za": None if zw is None else per_channel(zw),
        "zb": zx is not None,
        "bias": None if bias is None else per_channel(bias),
    }
    bindings = [Binding("a", kc.wtype(w)), Binding("b", kc.wtype(x))]
    args = [w, x]
    for v, nm in ((zw, "za"), (zx, "zb")):
        if v is not None:
            bindings.append(Binding(nm, kc.wtype(v)))
            args.append(v)
    if scale is not None:
        _requant(kc, params, bindings, args, scale, zy, out, per_channel(scale), "0u")
        if bias is not None:
            bindings.append(Binding("bias", kc.wtype(bias)))
            args.append(bias)
    bindings.append(Binding("out", kc.wtype(out), True))
    args.append(out)
    name = (
        f"int_conv2d_{x.data_type}_{w_type}{'p' if packed else ''}_{n}x{c}x{h}x{wd}_k{oc}x{kh}x{kw}"
        f"_s{at['strides'][0]}{at['strides'][1]}{'_g' + str(g) if g > 1 else ''}"
        f"{'_q' + out.data_type if scale is not None else ''}"
    )
    _launch(kc, node, name, params, bindings, args, M, N, n * g)
