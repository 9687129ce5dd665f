"""Prologue fusion: batch_normalization (+ unary activations) feeding a convolution is applied as
the convolution loads its input (compiler/fusion/conv_prologue.py), so BatchNormalization -> Relu -> Conv is one
kernel. Checked against float64 numpy on every convolution path (implicit GEMM with each staging
mode, 1x1, GEMV, depthwise, direct, transposed) with padding, which must stay zero after the
normalization, and in both layouts; and the cases that must not fuse."""

import numpy as np
import pytest
from helpers import FUSION, run_graph
from test_ops_conv import _run_conv

import mltensor
from mltensor.ops import _gemm as gemm_engine


def _bn(rng, C, scale=True, bias=True, act="relu", eps=1e-3):
    mean = rng.standard_normal(C).astype(np.float32)
    var = (rng.random(C) + 0.1).astype(np.float32)
    sc = rng.standard_normal(C).astype(np.float32)
    bi = rng.standard_normal(C).astype(np.float32)

    def build(b, x, axis):
        y = b.batch_normalization(
            x,
            b.constant(mean),
            b.constant(var),
            scale=b.constant(sc) if scale else None,
            bias=b.constant(bi) if bias else None,
            axis=axis,
            epsilon=eps,
        )
        if act == "relu":
            y = b.relu(y)
        elif act == "clamp_sigmoid":
            y = b.sigmoid(b.clamp(y, min_value=-1.0, max_value=1.5))
        return y

    def ref(x):
        s = (slice(None), None, None)
        y = (x - mean[s]) / np.sqrt(var[s].astype(np.float64) + np.float32(eps))
        if scale:
            y = y * sc[s]
        if bias:
            y = y + bi[s]
        if act == "relu":
            y = np.maximum(y, 0)
        elif act == "clamp_sigmoid":
            y = 1 / (1 + np.exp(-np.clip(y, -1.0, 1.5)))
        return y

    return build, ref


CASES = [
    # (xshape NCHW, wshape, options): one per convolution path
    ((1, 8, 9, 9), (16, 8, 3, 3), dict(padding=[1, 1, 1, 1])),  # implicit GEMM, padded
    ((2, 12, 7, 6), (20, 12, 3, 3), dict(strides=[2, 2], padding=[1, 0, 1, 1], dilations=[1, 2])),
    ((1, 16, 6, 6), (24, 16, 1, 1), dict()),  # 1x1 (A is the input itself)
    ((1, 16, 2, 2), (40, 16, 3, 3), dict(padding=[1, 1, 1, 1])),  # M = 4 output pixels: GEMV
    ((1, 8, 8, 8), (8, 1, 3, 3), dict(groups=8, padding=[1, 1, 1, 1])),  # depthwise
    ((1, 8, 8, 8), (2, 8, 3, 3), dict(padding=[2, 2, 2, 2])),  # 2 output channels: direct
    ((1, 16, 6, 6), (32, 8, 3, 3), dict(groups=2, padding=[1, 1, 1, 1])),  # grouped
]


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("xshape,wshape,opts", CASES)
def test_batchnorm_relu_conv_is_one_kernel(ctx, rng, monkeypatch, xshape, wshape, opts, layout, vec):
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)  # vec: the hardware staging (nhwc4, hoisted)
    fl = "oihw" if layout == "nchw" else "ohwi"
    got, ref = _run_conv(
        ctx,
        rng,
        xshape,
        wshape,
        input_layout=layout,
        filter_layout=fl,
        use_bias=True,
        prologue=_bn(rng, xshape[1]),
        expect_kernels=1,
        **opts,
    )
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize(
    "scale,bias,act", [(False, False, "none"), (True, False, "clamp_sigmoid"), (False, True, "relu")]
)
def test_prologue_options(ctx, rng, scale, bias, act):
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 8, 7, 7),
        (12, 8, 3, 3),
        use_bias=False,
        padding=[1, 1, 1, 1],
        prologue=_bn(rng, 8, scale, bias, act),
        expect_kernels=1,
        epilogue=lambda b, y: b.relu(y),
    )
    np.testing.assert_allclose(got, np.maximum(ref, 0), rtol=1e-4, atol=1e-4)


def test_prologue_conv_transpose2d(ctx, rng):
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 8, 5, 6),
        (8, 12, 3, 3),
        transpose=True,
        strides=[2, 2],
        padding=[1, 1, 0, 1],
        prologue=_bn(rng, 8),
        expect_kernels=1,
    )
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


def _kernels(ctx, fn):
    b = mltensor.MLGraphBuilder(ctx)
    outs = fn(b)
    return b.build_sync(outs).kernel_names


def test_prologue_not_fused_when_unsafe(ctx, rng):
    C = 8
    p = [b_.astype(np.float32) for b_ in (rng.standard_normal(C), rng.random(C) + 1)]
    w = rng.standard_normal((4, C, 3, 3)).astype(np.float32)

    def bn(b, x, axis=1):
        return b.relu(b.batch_normalization(x, b.constant(p[0]), b.constant(p[1]), axis=axis))

    def two_users(b):  # the normalized tensor is read twice: it must exist
        y = bn(b, b.input("x", data_type="float32", shape=[1, C, 6, 6]))
        return {"a": b.conv2d(y, b.constant(w)), "b": b.conv2d(y, b.constant(w))}

    def is_output(b):  # a graph output
        y = bn(b, b.input("x", data_type="float32", shape=[1, C, 6, 6]))
        return {"y": y, "z": b.conv2d(y, b.constant(w))}

    def wrong_axis(b):  # normalized over the width, not the conv's channels
        y = bn(b, b.input("x", data_type="float32", shape=[1, C, 6, C]), axis=3)
        return {"z": b.conv2d(y, b.constant(w))}

    for fn in (two_users, is_output, wrong_axis):
        names = _kernels(ctx, fn)
        assert not FUSION or any(n.startswith("batchnorm") for n in names), (fn.__name__, names)
        assert not FUSION or not any("_bn_" in n for n in names), (fn.__name__, names)


def test_prologue_switched_off(ctx, rng, monkeypatch):
    monkeypatch.setenv("MLTENSOR_NO_FUSION", "1")
    build, ref = _bn(rng, 8)
    w = rng.standard_normal((12, 8, 3, 3)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    z = b.conv2d(build(b, b.input("x", data_type="float32", shape=[1, 8, 5, 5]), 1), b.constant(w))
    X = rng.standard_normal((1, 8, 5, 5)).astype(np.float32)
    got = run_graph(ctx, {"z": z}, {"x": X}, b)["z"]
    from test_ops_conv import conv2d_ref

    np.testing.assert_allclose(got, conv2d_ref(ref(X.astype(np.float64)), w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tail", ["mul_add", "sub_from", "div_sub", "none"])
def test_prologue_folds_per_channel_tail(ctx, rng, tail):
    # densenet (ONNX zoo): BatchNormalization -> Mul -> Add -> Relu -> Conv; the affine part is
    # folded into one [scale; shift] constant at build
    C = 8
    build_bn, ref_bn = _bn(rng, C, act="none")
    m = rng.standard_normal((C, 1, 1)).astype(np.float32)
    a = rng.standard_normal((1, C, 1, 1)).astype(np.float32)
    d = (rng.random((C, 1, 1)) + 0.5).astype(np.float32)

    def build(b, x, axis):
        y = build_bn(b, x, axis)
        if tail == "mul_add":
            y = b.add(b.mul(y, b.constant(m)), b.constant(a))
        elif tail == "sub_from":
            y = b.sub(b.constant(a), y)
        elif tail == "div_sub":
            y = b.sub(b.div(y, b.constant(d)), b.constant(np.float32(0.25).reshape(())))
        return b.relu(y)

    def ref(x):
        y = ref_bn(x)
        if tail == "mul_add":
            y = y * m + a
        elif tail == "sub_from":
            y = a - y
        elif tail == "div_sub":
            y = y / d - 0.25
        return np.maximum(y, 0)

    got, want = _run_conv(
        ctx, rng, (1, C, 7, 7), (12, C, 3, 3), padding=[1, 1, 1, 1], prologue=(build, ref), expect_kernels=1
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_prologue_with_runtime_parameters(ctx, rng):
    # parameters that are graph inputs cannot be folded: the conv reads them and normalizes as
    # normalization.wgsl does
    C = 8
    P = {
        "mean": rng.standard_normal(C),
        "var": rng.random(C) + 0.1,
        "scale": rng.standard_normal(C),
        "bias": rng.standard_normal(C),
    }
    P = {k: v.astype(np.float32) for k, v in P.items()}
    X = rng.standard_normal((1, C, 6, 6)).astype(np.float32)
    W = rng.standard_normal((10, C, 3, 3)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    ins = {k: b.input(k, data_type="float32", shape=[C]) for k in P}
    y = b.relu(
        b.batch_normalization(
            b.input("x", data_type="float32", shape=[1, C, 6, 6]),
            ins["mean"],
            ins["var"],
            scale=ins["scale"],
            bias=ins["bias"],
        )
    )
    z = b.conv2d(y, b.constant(W), padding=[1, 1, 1, 1])
    names = _kernels(
        ctx,
        lambda bb: {
            "z": bb.conv2d(
                bb.relu(
                    bb.batch_normalization(
                        bb.input("x", data_type="float32", shape=[1, C, 6, 6]),
                        *(bb.input(k, data_type="float32", shape=[C]) for k in ("mean", "var")),
                        scale=bb.input("scale", data_type="float32", shape=[C]),
                        bias=bb.input("bias", data_type="float32", shape=[C]),
                    )
                ),
                bb.constant(W),
                padding=[1, 1, 1, 1],
            )
        },
    )
    assert not FUSION or (len(names) == 1 and "_bn_" in names[0]), names
    got = run_graph(ctx, {"z": z}, dict(P, x=X), b)["z"]
    s = (slice(None), None, None)
    xn = np.maximum((X - P["mean"][s]) / np.sqrt(P["var"][s] + np.float32(1e-5)) * P["scale"][s] + P["bias"][s], 0)
    from test_ops_conv import conv2d_ref

    np.testing.assert_allclose(got, conv2d_ref(xn.astype(np.float64), W, pad=(1, 1, 1, 1)), rtol=1e-4, atol=1e-4)


def _scale(rng, N, C, per_batch, add=None):
    """x * q[n, c] (+ r, a constant shaped like x when `add` gives its NCHW shape)."""
    q = rng.standard_normal((N if per_batch else 1, C, 1, 1)).astype(np.float32)
    r = None if add is None else rng.standard_normal(add).astype(np.float32)

    def build(b, x, axis):
        t = (lambda a: a) if axis == 1 else (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)))
        y = b.mul(x, b.constant(t(q)))
        return y if r is None else b.add(b.constant(t(r)), y)

    return build, lambda x: x * q + (0 if r is None else r)


@pytest.mark.parametrize(
    "per_batch,add", [(False, False), (True, False), (True, True)], ids=["scale", "per_batch", "per_batch_add"]
)
@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("xshape,wshape,opts", [CASES[0], CASES[2], CASES[3], CASES[4], CASES[5]])
def test_channel_scale_conv_is_one_kernel(ctx, rng, monkeypatch, xshape, wshape, opts, layout, vec, per_batch, add):
    # x * s[n, c] (+ r) -> conv (squeeze-and-excitation, a decoder's residual): applied as the
    # conv loads x
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    xshape = (2,) + tuple(xshape[1:])
    fl = "oihw" if layout == "nchw" else "ohwi"
    pro = _scale(rng, 2, xshape[1], per_batch, xshape if add else None)
    got, ref = _run_conv(
        ctx,
        rng,
        xshape,
        wshape,
        input_layout=layout,
        filter_layout=fl,
        use_bias=True,
        prologue=pro,
        expect_kernels=1,
        **opts,
    )
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


def test_squeeze_excitation_block(ctx, rng):
    # MobileNetV3's block: the SE branch reads x too, so x must exist; its product with the
    # branch's sigmoid is the 1x1 conv's prologue (no elementwise kernel left)
    N, C, H, W = 2, 16, 6, 6
    X = rng.standard_normal((N, H, W, C)).astype(np.float32)
    W1 = rng.standard_normal((4, 1, 1, C)).astype(np.float32)
    W2 = rng.standard_normal((C, 1, 1, 4)).astype(np.float32)
    W3 = rng.standard_normal((24, 1, 1, C)).astype(np.float32)

    def graph(b):
        x = b.input("x", data_type="float32", shape=[N, H, W, C])
        kw = dict(input_layout="nhwc", filter_layout="ohwi")
        s = b.average_pool2d(x, layout="nhwc")
        s = b.sigmoid(b.conv2d(b.relu(b.conv2d(s, b.constant(W1), **kw)), b.constant(W2), **kw))
        return {"y": b.conv2d(b.mul(x, s), b.constant(W3), **kw)}

    names = _kernels(ctx, graph)
    assert not FUSION or (not any(n.startswith("ew") for n in names) and sum("_scaled_" in n for n in names) == 1), (
        names
    )
    b = mltensor.MLGraphBuilder(ctx)
    got = run_graph(ctx, graph(b), {"x": X}, b)["y"]
    s = X.astype(np.float64).mean(axis=(1, 2))
    s = 1 / (1 + np.exp(-(np.maximum(s @ W1[:, 0, 0].T, 0) @ W2[:, 0, 0].T)))
    ref = (X * s[:, None, None, :]) @ W3[:, 0, 0].T
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


DW_PW = [
    # (x NCHW, depthwise options, pointwise output channels)
    ((1, 16, 9, 9), dict(padding=[1, 1, 1, 1]), 24),
    ((2, 8, 11, 10), dict(strides=[2, 2], padding=[2, 1, 2, 2], dilations=[1, 2]), 70),  # two n tiles
    ((1, 12, 2, 2), dict(padding=[1, 1, 1, 1]), 16),  # 4 output pixels: GEMV
    ((1, 8, 7, 7), dict(padding=[2, 2, 2, 2]), 2),  # 2 output channels: no direct path with a prologue
]


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("xshape,dwopts,oc", DW_PW)
def test_depthwise_pointwise_is_one_kernel(ctx, rng, monkeypatch, xshape, dwopts, oc, layout, vec):
    # MobileNet's depthwise-separable block: depthwise -> activation -> 1x1 conv; with the opt-in
    # depthwise prologue the 1x1 conv computes the depthwise output as it stages it
    monkeypatch.setenv("MLTENSOR_FUSE_DEPTHWISE", "1")
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    C = xshape[1]
    k = 5 if dwopts.get("padding", [0])[0] == 2 and "dilations" not in dwopts else 3
    wd = rng.standard_normal((C, 1, k, k)).astype(np.float32)
    bd = rng.standard_normal(C).astype(np.float32)
    from test_ops_conv import conv2d_ref

    def build(b, x, axis):
        w = wd if axis == 1 else np.ascontiguousarray(wd.transpose(0, 2, 3, 1))
        y = b.conv2d(
            x,
            b.constant(w),
            groups=C,
            bias=b.constant(bd),
            input_layout=layout,
            filter_layout="oihw" if axis == 1 else "ohwi",
            **dwopts,
        )
        return b.clamp(y, min_value=0.0, max_value=6.0)

    def ref(x):
        st = dwopts.get("strides", (1, 1))
        return np.clip(
            conv2d_ref(
                x,
                wd,
                pad=dwopts.get("padding", (0, 0, 0, 0)),
                st=st,
                dil=dwopts.get("dilations", (1, 1)),
                groups=C,
                bias=bd,
            ),
            0,
            6,
        )

    fl = "oihw" if layout == "nchw" else "ohwi"
    got, want = _run_conv(
        ctx,
        rng,
        xshape,
        (oc, C, 1, 1),
        input_layout=layout,
        filter_layout=fl,
        use_bias=True,
        prologue=(build, ref),
        expect_kernels=1,
    )
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_depthwise_pointwise_not_fused_when_unsafe(ctx, rng, monkeypatch):
    monkeypatch.setenv("MLTENSOR_FUSE_DEPTHWISE", "1")
    C = 8
    wd = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
    wm = rng.standard_normal((2 * C, 1, 3, 3)).astype(np.float32)
    wp = rng.standard_normal((12, C, 1, 1)).astype(np.float32)

    def shared(b):  # the depthwise output is read twice
        y = b.conv2d(b.input("x", data_type="float32", shape=[1, C, 6, 6]), b.constant(wd), groups=C, padding=[1] * 4)
        return {"a": b.conv2d(y, b.constant(wp)), "b": b.relu(y)}

    def multiplier(b):  # two outputs per input channel
        y = b.conv2d(b.input("x", data_type="float32", shape=[1, C, 6, 6]), b.constant(wm), groups=C, padding=[1] * 4)
        return {"a": b.conv2d(y, b.constant(np.concatenate([wp, wp], 1)))}

    def strided_pointwise(b):  # the 1x1 conv is not a plain GEMM over the depthwise output
        y = b.conv2d(b.input("x", data_type="float32", shape=[1, C, 6, 6]), b.constant(wd), groups=C, padding=[1] * 4)
        return {"a": b.conv2d(y, b.constant(wp), strides=[2, 2])}

    for fn in (shared, multiplier, strided_pointwise):
        names = _kernels(ctx, fn)
        assert not FUSION or (any(n.endswith("_dw") for n in names) and not any("conv2d_dw_" in n for n in names)), (
            fn.__name__,
            names,
        )


def test_depthwise_prologue_is_opt_in(ctx, rng, monkeypatch):
    monkeypatch.delenv("MLTENSOR_FUSE_DEPTHWISE", raising=False)
    C = 8
    wd = rng.standard_normal((C, 1, 3, 3)).astype(np.float32)
    wp = rng.standard_normal((12, C, 1, 1)).astype(np.float32)

    def block(b):
        y = b.conv2d(b.input("x", data_type="float32", shape=[1, C, 6, 6]), b.constant(wd), groups=C, padding=[1] * 4)
        return {"a": b.conv2d(b.relu(y), b.constant(wp))}

    assert not FUSION or ([n.endswith("_dw") for n in _kernels(ctx, block)] == [True, False])


def _resample(mode, scales=None, sizes=None, transform="half_pixel", rounding="round_prefer_floor"):
    """resample2d of the conv's input (the decoders' upsampling before a 1x1 conv)."""
    from test_ops_resample import reference

    def build(b, x, axis):
        axes = [2, 3] if axis == 1 else [1, 2]
        return b.resample2d(
            x,
            mode=mode,
            scales=scales,
            sizes=sizes,
            axes=axes,
            coordinate_transformation=transform,
            nearest_rounding=rounding,
        )

    def ref(x):
        hw = sizes or [int(np.floor(x.shape[2 + k] * np.float32(scales[k]))) for k in range(2)]
        return reference(x, (*x.shape[:2], *hw), (2, 3), mode, transform, rounding)

    return build, ref


RESAMPLES = [
    ("linear", dict(scales=[2.0, 2.0])),
    ("linear", dict(sizes=[7, 5], transform="align_corners")),  # 4x3 -> 7x5 (x 4x4 below: 7x7)
    ("nearest-neighbor", dict(scales=[2.0, 3.0])),
    ("nearest-neighbor", dict(sizes=[3, 2], transform="asymmetric", rounding="floor")),  # downsampling
]


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("mode,ropts", RESAMPLES)
@pytest.mark.parametrize(
    "xshape,wshape,opts", [((1, 16, 4, 4), (24, 16, 1, 1), {}), CASES[0], CASES[3], CASES[4], CASES[5]]
)
def test_resample_conv_is_one_kernel(ctx, rng, monkeypatch, xshape, wshape, opts, layout, vec, mode, ropts):
    # resample2d -> conv: each input element is interpolated (or picked) from the resample's
    # input as the conv loads it, so the resampled tensor is never written
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    fl = "oihw" if layout == "nchw" else "ohwi"
    got, ref = _run_conv(
        ctx,
        rng,
        xshape,
        wshape,
        input_layout=layout,
        filter_layout=fl,
        use_bias=True,
        prologue=_resample(mode, **ropts),
        expect_kernels=1,
        **opts,
    )
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


def test_resample_conv_transpose2d_and_f16(ctx, rng):
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 4, 3, 3),
        (4, 2, 2, 2),
        transpose=True,
        use_bias=True,
        prologue=_resample("linear", scales=[2.0, 2.0]),
        expect_kernels=1,
        strides=[2, 2],
    )
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # float16: the interpolated value is rounded to f16 as the resample's own output would be
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 8, 4, 4),
        (8, 8, 1, 1),
        dtype="float16",
        input_layout="nhwc",
        filter_layout="ohwi",
        prologue=_resample("linear", scales=[2.0, 2.0]),
        expect_kernels=1 if ctx._f16 else 3,
    )  # without shader-f16: + unpack, pack
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


def test_resample_not_fused_when_read_twice(ctx, rng):
    X = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    W = rng.standard_normal((6, 4, 1, 1)).astype(np.float32)

    def graph(b):
        x = b.input("x", data_type="float32", shape=X.shape)
        r = b.resample2d(x, mode="linear", scales=[2.0, 2.0])
        return {"y": b.conv2d(r, b.constant(W)), "r": r}

    names = _kernels(ctx, graph)
    assert not FUSION or (
        sum(n.startswith("resample2d") for n in names) == 1 and not any("_resample_" in n for n in names)
    )


def _zero_pad(hw_pads, value=0.0, mode="constant", channels=0):
    """pad of the conv's input: [top, bottom, left, right] on the spatial dims (+ `channels` at the
    end of the channel dim)."""
    t, bt, l, r = hw_pads

    def build(b, x, axis):
        begin, end = [0] * 4, [0] * 4
        h, w = (2, 3) if axis == 1 else (1, 2)
        begin[h], end[h], begin[w], end[w] = t, bt, l, r
        end[axis] = channels
        return b.pad(x, begin, end, mode=mode, value=value)

    def ref(x):
        m = {"constant": "constant", "edge": "edge", "reflection": "reflect"}[mode]
        kw = {"constant_values": value} if mode == "constant" else {}
        return np.pad(x, ((0, 0), (0, channels), (t, bt), (l, r)), mode=m, **kw)

    return build, ref


@pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vec4"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("pads", [(0, 1, 0, 1), (2, 1, 1, 3)])
@pytest.mark.parametrize(
    "xshape,wshape,opts",
    [
        ((1, 8, 9, 9), (16, 8, 3, 3), dict(strides=[2, 2])),  # TensorFlow's explicit pad before a strided conv
        ((1, 16, 6, 6), (24, 16, 1, 1), dict()),  # a padded 1x1 is no longer pointwise
        CASES[1],
        CASES[3],
        CASES[4],
        CASES[5],
        CASES[6],
    ],
)
def test_zero_pad_conv_is_one_kernel(ctx, rng, monkeypatch, xshape, wshape, opts, layout, vec, pads):
    # the pad's amounts join the convolution's own padding: no pad kernel
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    fl = "oihw" if layout == "nchw" else "ohwi"
    got, ref = _run_conv(
        ctx,
        rng,
        xshape,
        wshape,
        input_layout=layout,
        filter_layout=fl,
        use_bias=True,
        prologue=_zero_pad(pads),
        expect_kernels=1,
        **opts,
    )
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize(
    "pad",
    [dict(value=1.5), dict(mode="edge"), dict(mode="reflection"), dict(channels=4)],
    ids=["nonzero", "edge", "reflection", "channels"],
)
def test_pad_not_merged_unless_zero_and_spatial(ctx, rng, pad):
    # anything but zeros on the spatial dims stays a pad kernel (and is still right)
    got, ref = _run_conv(
        ctx,
        rng,
        (1, 4, 5, 5),
        (6, 8 if pad.get("channels") else 4, 3, 3),
        use_bias=True,
        prologue=_zero_pad((1, 1, 2, 0), **pad),
        expect_kernels=2,
    )
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(ref).max()))
