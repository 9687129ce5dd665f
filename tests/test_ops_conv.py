"""conv2d and conv_transpose2d against float64 numpy references, in every layout."""

import numpy as np
import pytest
from helpers import FUSION, run_graph

import mltensor

# -- float64 references (NCHW input, OIHW / IOHW filters) ----------------------------------------


def conv2d_ref(x, w, pad=(0, 0, 0, 0), st=(1, 1), dil=(1, 1), groups=1, bias=None):
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[1]), (pad[2], pad[3])))
    oh = (h + pad[0] + pad[1] - ((kh - 1) * dil[0] + 1)) // st[0] + 1
    ow = (wd + pad[2] + pad[3] - ((kw - 1) * dil[1] + 1)) // st[1] + 1
    out = np.zeros((n, oc, oh, ow))
    ocg = oc // groups
    for g in range(groups):
        xs = xp[:, g * icg : (g + 1) * icg]
        for i in range(kh):
            for j in range(kw):
                h0, w0 = i * dil[0], j * dil[1]
                patch = xs[:, :, h0 : h0 + (oh - 1) * st[0] + 1 : st[0], w0 : w0 + (ow - 1) * st[1] + 1 : st[1]]
                out[:, g * ocg : (g + 1) * ocg] += np.einsum(
                    "nchw,oc->nohw", patch, w[g * ocg : (g + 1) * ocg, :, i, j]
                )
    if bias is not None:
        out += bias.astype(np.float64)[None, :, None, None]
    return out


def conv_transpose2d_ref(x, w, out_hw, pad=(0, 0, 0, 0), st=(1, 1), dil=(1, 1), groups=1, bias=None):
    """x NCHW, w IOHW ([IC, OC/groups, KH, KW]); out_hw the (already validated) output size."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, ic, ih, iw = x.shape
    _, ocg, kh, kw = w.shape
    icg = ic // groups
    fh = max((ih - 1) * st[0] + (kh - 1) * dil[0] + 1, pad[0] + out_hw[0])
    fw = max((iw - 1) * st[1] + (kw - 1) * dil[1] + 1, pad[2] + out_hw[1])
    full = np.zeros((n, ocg * groups, fh, fw))
    for g in range(groups):
        xs = x[:, g * icg : (g + 1) * icg]
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("nchw,co->nohw", xs, w[g * icg : (g + 1) * icg, :, i, j])
                h0, w0 = i * dil[0], j * dil[1]
                full[
                    :,
                    g * ocg : (g + 1) * ocg,
                    h0 : h0 + (ih - 1) * st[0] + 1 : st[0],
                    w0 : w0 + (iw - 1) * st[1] + 1 : st[1],
                ] += contrib
    out = full[:, :, pad[0] : pad[0] + out_hw[0], pad[2] : pad[2] + out_hw[1]]
    if bias is not None:
        out = out + bias.astype(np.float64)[None, :, None, None]
    return out


def to_nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def from_nhwc(a):
    return a.transpose(0, 3, 1, 2)


# OIHW -> layout
CONV_FILTER = {"oihw": (0, 1, 2, 3), "hwio": (2, 3, 1, 0), "ohwi": (0, 2, 3, 1), "ihwo": (1, 2, 3, 0)}
# IOHW -> layout
TRANSPOSE_FILTER = {"iohw": (0, 1, 2, 3), "hwoi": (2, 3, 1, 0), "ohwi": (1, 2, 3, 0)}


def _check(got, ref, dtype, tol=1e-4):
    assert got.shape == ref.shape
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


def _run_conv(
    ctx,
    rng,
    xshape,
    wshape,
    *,
    input_layout="nchw",
    filter_layout=None,
    use_bias=False,
    filter_input=False,
    dtype="float32",
    epilogue=None,
    transpose=False,
    expect_kernels=None,
    prologue=None,
    **opts,
):
    """xshape NCHW, wshape OIHW (or IOHW for transpose); returns (got in NCHW, reference NCHW).
    prologue: (fn(builder, x, channel_axis) -> operand, numpy fn of the NCHW input) applied to
    the input before the convolution."""
    filter_layout = filter_layout or ("iohw" if transpose else "oihw")
    X = rng.standard_normal(xshape).astype(dtype)
    W = rng.standard_normal(wshape).astype(dtype)
    B = rng.standard_normal((wshape[1] * opts.get("groups", 1) if transpose else wshape[0],)).astype(dtype)
    perm = (TRANSPOSE_FILTER if transpose else CONV_FILTER)[filter_layout]
    Wl = np.ascontiguousarray(W.transpose(perm))
    Xl = to_nhwc(X) if input_layout == "nhwc" else X

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type=dtype, shape=Xl.shape)
        if prologue:
            x = prologue[0](b, x, 1 if input_layout == "nchw" else 3)
        w = b.input("w", data_type=dtype, shape=Wl.shape) if filter_input else b.constant(Wl)
        kw = dict(opts, input_layout=input_layout, filter_layout=filter_layout)
        if use_bias:
            kw["bias"] = b.constant(B)
        y = (b.conv_transpose2d if transpose else b.conv2d)(x, w, **kw)
        if epilogue:
            y = epilogue(b, y)
        return b, y

    feeds = {"x": Xl}
    if filter_input:
        feeds["w"] = Wl
    if expect_kernels is not None and FUSION:
        b, y = build()
        names = b.build_sync({"y": y}).kernel_names
        assert len(names) == expect_kernels, names
    b, y = build()
    got = run_graph(ctx, {"y": y}, feeds, b)["y"]
    if input_layout == "nhwc":
        assert got.ndim == 4
        got = from_nhwc(got)
    ref_opts = {
        "pad": opts.get("padding", (0, 0, 0, 0)),
        "st": opts.get("strides", (1, 1)),
        "dil": opts.get("dilations", (1, 1)),
        "groups": opts.get("groups", 1),
        "bias": B if use_bias else None,
    }
    Xr = prologue[1](X.astype(np.float64)) if prologue else X
    if transpose:
        ref = conv_transpose2d_ref(Xr, W, got.shape[2:], **ref_opts)
    else:
        ref = conv2d_ref(Xr, W, **ref_opts)
    return got, ref


# -- conv2d ---------------------------------------------------------------------------------


@pytest.mark.parametrize("input_layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("filter_layout", ["oihw", "hwio", "ohwi", "ihwo"])
def test_conv2d_layouts(ctx, rng, input_layout, filter_layout):
    got, ref = _run_conv(
        ctx,
        rng,
        (2, 3, 9, 7),
        (5, 3, 3, 2),
        input_layout=input_layout,
        filter_layout=filter_layout,
        use_bias=True,
        padding=[1, 0, 2, 1],
        strides=[2, 1],
        dilations=[1, 2],
    )
    _check(got, ref, np.float32)


@pytest.mark.parametrize("input_layout", ["nchw", "nhwc"])
@pytest.mark.parametrize(
    "xshape,wshape,opts",
    [
        ((1, 8, 6, 6), (8, 2, 3, 3), {"groups": 4}),  # grouped
        ((1, 8, 6, 6), (8, 1, 3, 3), {"groups": 8, "padding": [1, 1, 1, 1]}),  # depthwise
        ((2, 4, 7, 6), (8, 1, 3, 3), {"groups": 4, "strides": [2, 2], "padding": [0, 1, 1, 0]}),  # dw x2
        ((1, 6, 9, 9), (6, 1, 3, 3), {"groups": 6, "dilations": [2, 2], "padding": [2, 2, 2, 2]}),
        ((1, 8, 5, 5), (16, 8, 1, 1), {}),  # pointwise
        ((1, 8, 5, 5), (6, 4, 1, 1), {"groups": 2}),  # grouped pointwise
        ((1, 8, 5, 5), (6, 8, 1, 1), {"strides": [2, 2]}),  # 1x1 strided: general path
        ((1, 16, 1, 1), (24, 16, 1, 1), {}),  # M = 1: GEMV path
        ((1, 16, 20, 20), (40, 16, 3, 3), {"padding": [1, 1, 1, 1]}),  # several tiles
        # (CPU adapters: the DIRECT tile of an im2col, 16 rows a thread, ragged rows and pixels)
        ((2, 12, 9, 7), (20, 12, 3, 3), {"padding": [1, 0, 1, 2]}),
        ((1, 64, 6, 6), (64, 16, 3, 3), {"groups": 4, "padding": [1, 1, 1, 1]}),
    ],
)
def test_conv2d_shapes(ctx, rng, input_layout, xshape, wshape, opts):
    fl = "ohwi" if input_layout == "nhwc" else "oihw"
    got, ref = _run_conv(ctx, rng, xshape, wshape, input_layout=input_layout, filter_layout=fl, use_bias=True, **opts)
    _check(got, ref, np.float32)


def test_conv2d_tflite_layouts_are_direct(ctx, rng):
    # NHWC input with OHWI filters, and depthwise with IHWO filters: one kernel each, no transposes
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 4, 6, 6),
        (4, 1, 3, 3),
        input_layout="nhwc",
        filter_layout="ihwo",
        groups=4,
        padding=[1, 1, 1, 1],
        expect_kernels=1,
    )
    _check(got, ref, np.float32)
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 3, 6, 6),
        (5, 3, 3, 3),
        input_layout="nhwc",
        filter_layout="ohwi",
        strides=[2, 2],
        padding=[0, 1, 0, 1],
        expect_kernels=1,
    )
    _check(got, ref, np.float32)


def test_conv2d_filter_is_graph_input(ctx, rng):
    got, ref = _run_conv(ctx, rng, (1, 4, 7, 7), (6, 2, 3, 3), groups=2, filter_input=True, filter_layout="hwio")
    _check(got, ref, np.float32)
    got, ref = _run_conv(
        ctx, rng, (1, 4, 7, 7), (4, 1, 3, 3), groups=4, filter_input=True, input_layout="nhwc", filter_layout="ihwo"
    )
    _check(got, ref, np.float32)


@pytest.mark.parametrize(
    "act,ref_fn",
    [
        (lambda b, y: b.relu(y), lambda r: np.maximum(r, 0)),
        (lambda b, y: b.clamp(y, min_value=0.0, max_value=6.0), lambda r: np.clip(r, 0, 6)),
        (lambda b, y: b.sigmoid(b.relu(y)), lambda r: 1 / (1 + np.exp(-np.maximum(r, 0)))),
    ],
)
@pytest.mark.parametrize("groups", [1, 4])
def test_conv2d_fused_activation(ctx, rng, act, ref_fn, groups):
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 4, 6, 6),
        (8, 4 // groups, 3, 3),
        groups=groups,
        use_bias=True,
        padding=[1, 1, 1, 1],
        epilogue=act,
        expect_kernels=1,
    )
    _check(got, ref_fn(ref), np.float32)


def test_conv2d_float16(ctx, rng):
    got, ref = _run_conv(
        ctx, rng, (1, 3, 6, 6), (4, 3, 3, 3), dtype="float16", use_bias=True, input_layout="nhwc", filter_layout="ohwi"
    )
    _check(got, ref, np.float16, tol=1e-2)
    got, ref = _run_conv(ctx, rng, (1, 4, 6, 6), (4, 1, 3, 3), dtype="float16", groups=4)
    _check(got, ref, np.float16, tol=1e-2)


def test_conv2d_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 3, 8, 8])
    w = b.input("w", data_type="float32", shape=[2, 4, 3, 3])
    with pytest.raises(
        TypeError, match=r"\[conv2d\] input channels \(3\) / groups \(1\) must equal filter input channels \(4\)"
    ):
        b.conv2d(x, w)
    w3 = b.input("w3", data_type="float32", shape=[2, 3, 3, 3])
    with pytest.raises(TypeError, match="rank"):
        b.conv2d(b.input("x3", data_type="float32", shape=[3, 8, 8]), w3)
    with pytest.raises(TypeError, match="divisible by groups"):
        b.conv2d(x, w3, groups=2)
    with pytest.raises(TypeError, match="padding"):
        b.conv2d(x, w3, padding=[1, 1])
    with pytest.raises(TypeError, match="strides"):
        b.conv2d(x, w3, strides=[0, 1])
    with pytest.raises(TypeError, match="dilations"):
        b.conv2d(x, w3, dilations=[1])
    with pytest.raises(TypeError, match="groups"):
        b.conv2d(x, w3, groups=0)
    with pytest.raises(TypeError, match="input_layout"):
        b.conv2d(x, w3, input_layout="chwn")
    with pytest.raises(TypeError, match="filter_layout"):
        b.conv2d(x, w3, filter_layout="iohw")
    with pytest.raises(TypeError, match=r"bias shape must be \[2\]"):
        b.conv2d(x, w3, bias=b.input("b", data_type="float32", shape=[3]))
    with pytest.raises(TypeError, match="data type"):
        b.conv2d(x, b.input("h", data_type="float16", shape=[2, 3, 3, 3]))
    with pytest.raises(TypeError, match="int32"):
        b.conv2d(
            b.input("i", data_type="int32", shape=[1, 3, 8, 8]), b.input("j", data_type="int32", shape=[2, 3, 3, 3])
        )
    with pytest.raises(TypeError, match="exceeds the padded input"):
        b.conv2d(x, w3, dilations=[4, 1])
    with pytest.raises(TypeError, match="another MLGraphBuilder"):
        mltensor.MLGraphBuilder(ctx).conv2d(x, w3)
    y = b.conv2d(x, w3, padding=[1, 1, 1, 1], strides=[2, 2])
    assert y.shape == (1, 2, 4, 4)
    assert y.data_type == "float32"


# -- conv_transpose2d -----------------------------------------------------------------------


@pytest.mark.parametrize("input_layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("filter_layout", ["iohw", "hwoi", "ohwi"])
def test_conv_transpose2d_layouts(ctx, rng, input_layout, filter_layout):
    got, ref = _run_conv(
        ctx,
        rng,
        (2, 3, 4, 5),
        (3, 2, 3, 2),
        transpose=True,
        use_bias=True,
        input_layout=input_layout,
        filter_layout=filter_layout,
        strides=[2, 3],
        padding=[1, 0, 0, 1],
        output_padding=[1, 2],
    )
    assert got.shape == (2, 2, 4 * 2 - 2 + 3 - 1 + 1, 4 * 3 + 2 - 1 + 2)
    _check(got, ref, np.float32)


@pytest.mark.parametrize(
    "xshape,wshape,opts",
    [
        ((1, 2, 3, 3), (2, 3, 3, 3), {}),
        ((1, 4, 3, 3), (4, 3, 2, 2), {"groups": 2, "strides": [2, 2]}),
        ((1, 3, 4, 4), (3, 2, 3, 3), {"dilations": [2, 1], "padding": [1, 1, 2, 0]}),
        ((1, 3, 3, 3), (3, 2, 3, 3), {"strides": [3, 2], "output_sizes": [10, 8]}),
        ((1, 6, 4, 4), (6, 1, 3, 3), {"groups": 6, "strides": [2, 2], "padding": [1, 1, 1, 1]}),
        ((1, 16, 12, 12), (16, 40, 2, 2), {"strides": [2, 2]}),  # several tiles
    ],
)
def test_conv_transpose2d_options(ctx, rng, xshape, wshape, opts):
    got, ref = _run_conv(ctx, rng, xshape, wshape, transpose=True, use_bias=True, **opts)
    _check(got, ref, np.float32)


def test_conv_transpose2d_output_sizes_shape(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 1, 3, 3])
    w = b.input("w", data_type="float32", shape=[1, 2, 3, 3])
    assert b.conv_transpose2d(x, w, strides=[3, 2], output_sizes=[10, 8]).shape == (1, 2, 10, 8)
    # output_padding is ignored when output_sizes is given
    assert b.conv_transpose2d(x, w, strides=[3, 2], output_sizes=[9, 7], output_padding=[5, 5]).shape == (1, 2, 9, 7)
    assert b.conv_transpose2d(x, w, strides=[3, 2], output_padding=[1, 1]).shape == (1, 2, 10, 8)


def test_conv_transpose2d_fused_relu(ctx, rng):
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 3, 4, 4),
        (3, 4, 3, 3),
        transpose=True,
        use_bias=True,
        strides=[2, 2],
        epilogue=lambda b, y: b.relu(y),
        expect_kernels=1,
    )
    _check(got, np.maximum(ref, 0), np.float32)


def test_conv_transpose2d_float16(ctx, rng):
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 3, 4, 4),
        (3, 2, 3, 3),
        transpose=True,
        dtype="float16",
        input_layout="nhwc",
        filter_layout="ohwi",
        strides=[2, 2],
    )
    _check(got, ref, np.float16, tol=1e-2)


def test_conv_transpose2d_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 3, 4, 4])
    w = b.input("w", data_type="float32", shape=[3, 2, 3, 3])
    with pytest.raises(TypeError, match=r"input channels \(3\) must equal filter input channels \(2\)"):
        b.conv_transpose2d(x, b.input("w2", data_type="float32", shape=[2, 2, 3, 3]))
    with pytest.raises(TypeError, match="output_padding"):
        b.conv_transpose2d(x, w, strides=[2, 2], output_padding=[2, 0])
    with pytest.raises(TypeError, match="output_sizes"):
        b.conv_transpose2d(x, w, strides=[2, 2], output_sizes=[11, 9])
    with pytest.raises(TypeError, match="output_sizes"):
        b.conv_transpose2d(x, w, output_sizes=[6])
    with pytest.raises(TypeError, match="filter_layout"):
        b.conv_transpose2d(x, w, filter_layout="oihw")
    with pytest.raises(TypeError, match=r"bias shape must be \[6\]"):
        b.conv_transpose2d(
            x,
            b.input("wg", data_type="float32", shape=[3, 2, 3, 3]),
            groups=3,
            bias=b.input("b", data_type="float32", shape=[2]),
        )
    with pytest.raises(TypeError, match="padding"):
        b.conv_transpose2d(x, w, padding=[4, 4, 0, 0])
    y = b.conv_transpose2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], output_padding=[1, 1])
    assert y.shape == (1, 2, 8, 8)


# -- paths chosen by shape: direct (few output channels), narrow GEMM tiles ----------------------


@pytest.mark.parametrize("input_layout,filter_layout", [("nhwc", "ohwi"), ("nchw", "iohw")])
def test_conv_transpose2d_few_channels_direct(ctx, rng, input_layout, filter_layout):
    """A segmentation head: 2x2 stride-2 transposed conv to 1 channel, sigmoid fused."""
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 16, 9, 7),
        (16, 1, 2, 2),
        transpose=True,
        strides=[2, 2],
        input_layout=input_layout,
        filter_layout=filter_layout,
        use_bias=True,
        epilogue=lambda b, y: b.sigmoid(y),
        expect_kernels=1,
    )
    _check(got, 1.0 / (1.0 + np.exp(-ref)), np.float32)


@pytest.mark.parametrize("input_layout", ["nchw", "nhwc"])
@pytest.mark.parametrize(
    "kernel,strides,padding,output_padding,groups,dilations",
    [
        ((2, 2), [2, 2], [0, 0, 0, 0], [0, 0], 1, [1, 1]),  # one tap per output pixel
        ((4, 4), [2, 2], [1, 1, 1, 1], [0, 0], 1, [1, 1]),  # two taps per row and column, padded
        ((3, 2), [2, 3], [2, 0, 1, 1], [1, 2], 2, [1, 1]),  # odd sizes, output padding, groups
        ((3, 3), [1, 1], [1, 1, 1, 1], [0, 0], 1, [1, 1]),  # stride 1: every tap
        ((1, 3), [3, 1], [0, 0, 2, 1], [2, 0], 1, [1, 1]),  # stride larger than the kernel: gaps
        ((3, 2), [2, 2], [1, 0, 0, 1], [1, 0], 1, [2, 1]),  # dilated: every tap tested
    ],
)
def test_conv_transpose2d_direct_taps(
    ctx, rng, input_layout, kernel, strides, padding, output_padding, groups, dilations
):
    """The direct path's transposed tap loops (conv2d.wgsl: `stride_taps`, only the kernel rows
    and columns that land on an input pixel, where undilated) against numpy, over strides,
    paddings, dilations and groups."""
    fl = "ohwi" if input_layout == "nhwc" else "iohw"
    ic = 6
    got, ref = _run_conv(
        ctx,
        rng,
        (2, ic, 7, 5),
        (ic, 2 // groups if groups > 1 else 1, *kernel),
        transpose=True,
        input_layout=input_layout,
        filter_layout=fl,
        use_bias=True,
        strides=strides,
        padding=padding,
        output_padding=output_padding,
        groups=groups,
        dilations=dilations,
        expect_kernels=1,
    )
    _check(got, ref, np.float32)


@pytest.mark.parametrize("input_layout", ["nchw", "nhwc"])
@pytest.mark.parametrize(
    "kernel,strides,padding,dilations",
    [
        ((3, 3), [3, 3], [0, 0, 0, 0], [1, 1]),  # a landmark head: windows side by side
        ((5, 5), [1, 1], [2, 2, 2, 2], [1, 1]),  # padded: edge taps tested away
        ((3, 3), [2, 1], [1, 2, 0, 3], [2, 3]),  # dilated, uneven padding
    ],
)
def test_conv2d_direct_taps(ctx, rng, input_layout, kernel, strides, padding, dilations):
    """The direct path's loops over the window's taps (conv2d.wgsl) against numpy."""
    fl = "ohwi" if input_layout == "nhwc" else "oihw"
    got, ref = _run_conv(
        ctx,
        rng,
        (2, 32, 11, 10),
        (1, 32, *kernel),
        input_layout=input_layout,
        filter_layout=fl,
        use_bias=True,
        strides=strides,
        padding=padding,
        dilations=dilations,
        expect_kernels=1,
    )
    _check(got, ref, np.float32)


@pytest.mark.parametrize("input_layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("oc,groups", [(1, 1), (3, 1), (4, 2), (6, 3)])
def test_conv2d_few_output_channels_direct(ctx, rng, input_layout, oc, groups):
    fl = "ohwi" if input_layout == "nhwc" else "oihw"
    got, ref = _run_conv(
        ctx,
        rng,
        (2, 6, 9, 7),
        (oc, 6 // groups, 3, 2),
        input_layout=input_layout,
        filter_layout=fl,
        groups=groups,
        use_bias=True,
        padding=[1, 0, 2, 1],
        strides=[2, 1],
        dilations=[1, 2],
    )
    _check(got, ref, np.float32)


@pytest.mark.parametrize("oc", [5, 8, 12, 16, 24])
def test_conv2d_1x1_nhwc_narrow_tiles(ctx, rng, oc):
    """1x1 NHWC convolutions to few channels (16x4 / 32x2-thread tiles), K not a multiple of 8."""
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 20, 17, 19),
        (oc, 20, 1, 1),
        input_layout="nhwc",
        filter_layout="ohwi",
        use_bias=True,
        epilogue=lambda b, y: b.relu(y),
        expect_kernels=1,
    )
    _check(got, np.maximum(ref, 0), np.float32)
