"""conv2d and conv_transpose2d with dynamic batch, height and width (mltensor/dynamic/): one build
serves every size up to the maxima. Each case builds once and runs at several sizes (1, the
maxima, odd ones) against float64 numpy and bit for bit against a static build of the same graph
at that size (every path sums each output in the same order whatever its tile; the size buckets
of the implicit GEMM pick the path and tile a static build of that size picks). Also: layouts,
strides, dilations, groups, depthwise, 1x1, the few-channel direct path, fused prologues and
epilogues, every tuning candidate, the checks deferred to dispatch, refusals, and an ONNX CNN
with a symbolic batch and width built once."""

import numpy as np
import pytest
from helpers import FUSION
from test_ops_conv import CONV_FILTER, TRANSPOSE_FILTER, conv2d_ref, conv_transpose2d_ref, from_nhwc, to_nhwc

import mltensor
from mltensor.dynamic.dims import MLDynamicDimension as D
from mltensor.errors import NotSupportedError
from mltensor.ops import _gemm as gemm_engine
from mltensor.runtime import autotune
from mltensor.runtime.wgsl import cpu_device

N, H, W = D("N", 3), D("H", 20), D("W", 21)
# (batch, height, width): 1, the maxima, odd sizes
SIZES = [dict(N=1, H=1, W=1), dict(N=3, H=20, W=21), dict(N=2, H=7, W=9), dict(N=1, H=13, W=4)]


@pytest.fixture(autouse=True)
def _heuristic(monkeypatch):
    monkeypatch.setenv("MLTENSOR_AUTOTUNE", "0")  # the heuristic's configurations (no timing)


def _concrete(shape, sizes):
    return tuple(sizes[d.name] if isinstance(d, D) else d for d in shape)


def _run(ctx, g, x):
    t = ctx.create_tensor_sync(data_type="float32", shape=x.shape, writable=True)
    ctx.write_tensor(t, x)
    out = ctx.create_tensor_sync(data_type="float32", shape=g.compute_shapes({"x": x.shape})["y"], readable=True)
    ctx.dispatch(g, {"x": t}, {"y": out})
    r = ctx.read_tensor_sync(out)
    t.destroy()
    out.destroy()
    return r


def _same_order(*graphs):
    """Bit for bit unless a kernel sums in another order: split-K (a GPU heuristic) or the subgroup
    GEMV (chosen by tuning)."""
    return not any("_reduce" in n or n.endswith("_sg") for g in graphs for n in g.kernel_names)


class Case:
    """A convolution graph over input x (NCHW shape `xshape` with dynamic entries), built from
    float64 references: the filter in OIHW (IOHW transposed), converted to `filter_layout`."""

    def __init__(
        self,
        rng,
        xshape,
        wshape,
        *,
        layout="nchw",
        filter_layout=None,
        transpose=False,
        bias=True,
        act=True,
        prologue=None,
        epilogue=None,
        **opts,
    ):
        self.xshape, self.layout, self.transpose, self.opts = xshape, layout, transpose, opts
        self.filter_layout = filter_layout or ("iohw" if transpose else "oihw")
        self.W = rng.standard_normal(wshape).astype(np.float32)
        oc = wshape[1] * opts.get("groups", 1) if transpose else wshape[0]
        self.B = rng.standard_normal(oc).astype(np.float32) if bias else None
        self.act, self.prologue, self.epilogue = act, prologue, epilogue

    def spec(self):
        n, c, h, w = self.xshape
        return (n, c, h, w) if self.layout == "nchw" else (n, h, w, c)

    def build(self, ctx, shape):
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=list(shape))
        if self.prologue:
            x = self.prologue[0](b, x, 1 if self.layout == "nchw" else 3)
        perm = (TRANSPOSE_FILTER if self.transpose else CONV_FILTER)[self.filter_layout]
        kw = dict(self.opts, input_layout=self.layout, filter_layout=self.filter_layout)
        if self.B is not None:
            kw["bias"] = b.constant(self.B)
        y = (b.conv_transpose2d if self.transpose else b.conv2d)(
            x, b.constant(np.ascontiguousarray(self.W.transpose(perm))), **kw
        )
        if self.act:
            y = b.relu(y)
        if self.epilogue:
            y = self.epilogue[0](b, y)
        return b.build_sync({"y": y})

    def ref(self, x):
        """float64 reference for an input in this case's layout."""
        xr = (from_nhwc(x) if self.layout == "nhwc" else x).astype(np.float64)
        if self.prologue:
            xr = self.prologue[1](xr)
        o = {
            "pad": self.opts.get("padding", (0, 0, 0, 0)),
            "st": self.opts.get("strides", (1, 1)),
            "dil": self.opts.get("dilations", (1, 1)),
            "groups": self.opts.get("groups", 1),
            "bias": self.B,
        }
        if self.transpose:
            n, c, h, w = xr.shape
            (st, dil, pad), k = (o["st"], o["dil"], o["pad"]), self.W.shape[2:]
            op = self.opts.get("output_padding", (0, 0))
            hw = [
                (s - 1) * st[i] + (k[i] - 1) * dil[i] + 1 - pad[2 * i] - pad[2 * i + 1] + op[i]
                for i, s in enumerate((h, w))
            ]
            r = conv_transpose2d_ref(xr, self.W, hw, **o)
        else:
            r = conv2d_ref(xr, self.W, **o)
        if self.act:
            r = np.maximum(r, 0)
        if self.epilogue:
            r = self.epilogue[1](r)
        return to_nhwc(r) if self.layout == "nhwc" else r


def _check(ctx, rng, case, sizes=SIZES, static=True, tol=1e-4):
    """Build once with dynamic dimensions; at each size compare with float64 numpy and, if static,
    with a static build at that size (bit for bit where both sum in the same order)."""
    g = case.build(ctx, case.spec())
    assert g.dynamic_dimensions
    for s in sizes:
        x = rng.standard_normal(_concrete(case.spec(), s)).astype(np.float32)
        got = _run(ctx, g, x)
        want = case.ref(x)
        assert got.shape == want.shape, (s, got.shape, want.shape)
        scale = max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol * scale, err_msg=str(s))
        if static:
            gs = case.build(ctx, _concrete(case.spec(), s))
            ws = _run(ctx, gs, x)
            if _same_order(g, gs):
                np.testing.assert_array_equal(got, ws, err_msg=f"static build, {s}")
            else:
                np.testing.assert_allclose(got, ws, rtol=1e-5, atol=1e-5 * scale, err_msg=f"static build, {s}")
            gs.destroy()
    return g


def _cpu(ctx):
    return str(ctx.device.adapter.info.get("adapter_type", "")).upper() == "CPU"


def _paths(g):
    return sorted({n.rsplit("_", 1)[1] for n in g.kernel_names})


# -- conv2d ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout,filter_layout", [("nchw", "oihw"), ("nchw", "hwio"), ("nhwc", "ohwi"), ("nhwc", "hwio")]
)
@pytest.mark.parametrize("direct", ["1", "0"])
def test_conv2d_3x3_same(ctx, rng, monkeypatch, layout, filter_layout, direct):
    # stride 1, padding 1: the output is H x W; bias and relu fused, the implicit GEMM in size
    # buckets (the GEMV for up to 4 output pixels, then the tiles lavapipe picks by size); on a
    # CPU adapter an NCHW one with an OIHW filter is the DIRECT GEMM with the roles turned
    # (ops/conv.py _direct_gemm: buckets along the pixels, its rows the 16 output channels)
    monkeypatch.setenv("MLTENSOR_NO_DIRECT_GEMM", "0" if direct == "1" else "1")
    g = _check(
        ctx,
        rng,
        Case(rng, (N, 8, H, W), (16, 8, 3, 3), layout=layout, filter_layout=filter_layout, padding=[1, 1, 1, 1]),
    )
    turned = direct == "1" and layout == "nchw" and filter_layout == "oihw" and _cpu(ctx)
    assert ("gemv" in _paths(g)) != turned and 1 <= len(g.kernel_names) <= gemm_engine.MAX_VARIANTS, g.kernel_names
    assert all(("_gemm_" in n) == turned for n in g.kernel_names), g.kernel_names
    if FUSION:
        assert all(n.startswith("conv2d") for n in g.kernel_names), g.kernel_names
    g.destroy()


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_strided_unpadded(ctx, rng, layout):
    # stride 2, no padding: output (H - 3) // 2 + 1, positive from H = 3 (checked at dispatch)
    sizes = [dict(N=1, H=3, W=3), dict(N=3, H=20, W=21), dict(N=2, H=8, W=11), dict(N=1, H=4, W=20)]
    _check(ctx, rng, Case(rng, (N, 6, H, W), (12, 6, 3, 3), layout=layout, strides=[2, 2]), sizes).destroy()


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_dilated_groups(ctx, rng, layout):
    # output H - 1 by (W - 3) // 2 + 1
    sizes = [dict(N=1, H=2, W=3), dict(N=3, H=20, W=21), dict(N=2, H=7, W=9), dict(N=1, H=13, W=4)]
    _check(
        ctx,
        rng,
        Case(
            rng,
            (N, 8, H, W),
            (16, 4, 3, 3),
            layout=layout,
            padding=[2, 1, 2, 0],
            dilations=[2, 2],
            groups=2,
            strides=[1, 2],
        ),
        sizes,
    ).destroy()


@pytest.mark.parametrize("layout,filter_layout", [("nchw", "oihw"), ("nhwc", "ihwo")])
@pytest.mark.parametrize("mult", [1, 2])
def test_conv2d_depthwise(ctx, rng, layout, filter_layout, mult):
    g = _check(
        ctx,
        rng,
        Case(
            rng,
            (N, 8, H, W),
            (8 * mult, 1, 3, 3),
            layout=layout,
            filter_layout=filter_layout,
            padding=[1, 1, 1, 1],
            groups=8,
        ),
    )
    assert _paths(g) == ["dw"], g.kernel_names
    g.destroy()


def test_conv2d_depthwise_strided(ctx, rng):
    sizes = [dict(N=1, H=1, W=1), dict(N=3, H=20, W=21), dict(N=2, H=9, W=6), dict(N=1, H=2, W=3)]
    _check(
        ctx, rng, Case(rng, (N, 6, H, W), (6, 1, 5, 5), padding=[2, 2, 2, 2], strides=[2, 2], groups=6), sizes
    ).destroy()


@pytest.mark.parametrize("layout,filter_layout", [("nchw", "oihw"), ("nhwc", "ohwi"), ("nhwc", "hwio")])
def test_conv2d_1x1(ctx, rng, layout, filter_layout):
    _check(ctx, rng, Case(rng, (N, 12, H, W), (20, 12, 1, 1), layout=layout, filter_layout=filter_layout)).destroy()


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv2d_few_output_channels_direct(ctx, rng, layout):
    g = _check(ctx, rng, Case(rng, (N, 5, H, W), (2, 5, 3, 3), layout=layout, padding=[1, 1, 1, 1]))
    assert _paths(g) == ["direct"], g.kernel_names
    g.destroy()


def test_conv2d_batch_only(ctx, rng):
    # a static plane: its divisions stay constant; only the batch (the GEMM's M) is dynamic
    sizes = [dict(N=1), dict(N=3), dict(N=2)]
    _check(ctx, rng, Case(rng, (N, 8, 10, 9), (16, 8, 3, 3), padding=[1, 1, 1, 1]), sizes).destroy()


def test_conv2d_larger_plane_buckets(ctx, rng):
    # up to 2 x 32 x 32 output pixels: buckets where the tile changes along the pixels (on CPU
    # adapters the DIRECT tile of a gathered im2col, ops/_gemm.py direct_config: 64 pixels wide
    # below 128 pixels, 128 above)
    n, h, w = D("N", 2), D("H", 32), D("W", 32)
    case = Case(rng, (n, 16, h, w), (64, 16, 3, 3), padding=[1, 1, 1, 1])
    g = _check(
        ctx,
        rng,
        case,
        [dict(N=1, H=1, W=1), dict(N=1, H=5, W=7), dict(N=2, H=32, W=32), dict(N=1, H=8, W=8), dict(N=2, H=9, W=31)],
    )
    assert len(g.kernel_names) == (2 if cpu_device(ctx.device) and gemm_engine.has_direct("matmul.wgsl") else 3), (
        g.kernel_names
    )
    g.destroy()


# -- conv_transpose2d -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout,filter_layout", [("nchw", "iohw"), ("nhwc", "ohwi"), ("nhwc", "hwoi")])
def test_conv_transpose2d_stride2(ctx, rng, layout, filter_layout):
    _check(
        ctx,
        rng,
        Case(
            rng,
            (N, 6, H, W),
            (6, 8, 3, 3),
            transpose=True,
            layout=layout,
            filter_layout=filter_layout,
            strides=[2, 2],
            padding=[1, 1, 1, 1],
            output_padding=[1, 1],
        ),
    ).destroy()


def test_conv_transpose2d_groups_dilation(ctx, rng):
    _check(
        ctx,
        rng,
        Case(
            rng,
            (N, 8, H, W),
            (8, 4, 2, 3),
            transpose=True,
            strides=[2, 3],
            dilations=[2, 1],
            groups=2,
            padding=[0, 1, 1, 0],
        ),
    ).destroy()


def test_conv_transpose2d_direct(ctx, rng):
    # a segmentation head: 2x2 stride-2 to one channel
    g = _check(ctx, rng, Case(rng, (N, 16, H, W), (16, 1, 2, 2), transpose=True, strides=[2, 2]))
    assert _paths(g) == ["direct"], g.kernel_names
    g.destroy()


# -- fused prologues and epilogues ----------------------------------------------------------------------


def _bn(rng, c):
    mean, var = rng.standard_normal(c).astype(np.float32), rng.uniform(0.5, 2, c).astype(np.float32)
    scale, bias = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)

    def fn(b, x, axis):
        y = b.batch_normalization(
            x,
            b.constant(mean),
            b.constant(var),
            scale=b.constant(scale),
            bias=b.constant(bias),
            axis=axis,
            epsilon=1e-5,
        )
        return b.relu(y)

    def ref(x):
        sh = (1, c, 1, 1)
        y = (x - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + 1e-5) * scale.reshape(sh) + bias.reshape(sh)
        return np.maximum(y, 0)

    return fn, ref


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_prologue_batch_normalization(ctx, rng, layout):
    g = _check(
        ctx, rng, Case(rng, (N, 8, H, W), (12, 8, 3, 3), layout=layout, padding=[1, 1, 1, 1], prologue=_bn(rng, 8))
    )
    if FUSION:  # the normalization is applied as the conv loads its input
        assert all(n.startswith("conv2d_bn") for n in g.kernel_names), g.kernel_names
    g.destroy()


def test_prologue_zero_pad(ctx, rng):
    # TensorFlow's explicit padding before a strided conv: merged into the conv's padding
    def fn(b, x, axis):
        return b.pad(x, [0, 0, 1, 2], [0, 0, 2, 1])

    def ref(x):
        return np.pad(x, ((0, 0), (0, 0), (1, 2), (2, 1)))

    g = _check(ctx, rng, Case(rng, (N, 6, H, W), (8, 6, 3, 3), strides=[2, 2], prologue=(fn, ref)))
    if FUSION:
        assert all(n.startswith("conv2d_pad") for n in g.kernel_names), g.kernel_names
    g.destroy()


def test_prologue_scaled(ctx, rng):
    # squeeze-and-excitation: x * s, s per (batch, channel) (here a second view of x: its mean)
    def fn(b, x, axis):
        s = b.sigmoid(b.reduce_mean(x, axes=[2, 3], keep_dimensions=True))
        return b.mul(x, s)

    def ref(x):
        return x * (1 / (1 + np.exp(-x.mean(axis=(2, 3), keepdims=True))))

    g = _check(ctx, rng, Case(rng, (N, 8, H, W), (12, 8, 3, 3), padding=[1, 1, 1, 1], prologue=(fn, ref)), tol=1e-3)
    if FUSION:  # the product is applied as the conv loads its input
        assert sum(n.startswith("conv2d_scaled") for n in g.kernel_names) == 3, g.kernel_names
    g.destroy()


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_prologue_resample(ctx, rng, layout):
    # an upsampling read through: the conv samples the resample's (dynamic) input as it loads
    def fn(b, x, axis):
        return b.resample2d(x, scales=[2.0, 2.0], axes=[2, 3] if axis == 1 else [1, 2])

    def ref(x):
        return x.repeat(2, axis=2).repeat(2, axis=3)

    g = _check(
        ctx,
        rng,
        Case(rng, (N, 8, H, W), (12, 8, 3, 3), layout=layout, padding=[1, 1, 1, 1], strides=[2, 2], prologue=(fn, ref)),
    )
    if FUSION:
        assert all(n.startswith("conv2d_resample") for n in g.kernel_names), g.kernel_names
    g.destroy()


def test_prologue_depthwise_opt_in(ctx, rng, monkeypatch):
    # MLTENSOR_FUSE_DEPTHWISE=1: a 1x1 conv computes the depthwise conv before it as it stages A
    monkeypatch.setenv("MLTENSOR_FUSE_DEPTHWISE", "1")
    dw = rng.standard_normal((8, 1, 3, 3)).astype(np.float32)

    def fn(b, x, axis):
        return b.relu(b.conv2d(x, b.constant(dw), padding=[1, 1, 1, 1], groups=8))

    def ref(x):
        return np.maximum(conv2d_ref(x, dw, pad=(1, 1, 1, 1), groups=8), 0)

    g = _check(ctx, rng, Case(rng, (N, 8, H, W), (12, 8, 1, 1), prologue=(fn, ref)))
    if FUSION:
        assert all(n.startswith("conv2d_dw") for n in g.kernel_names), g.kernel_names
    g.destroy()


def test_epilogue_residual(ctx, rng):
    # conv + bias + relu + x (a residual of the input's shape)
    case = Case(rng, (N, 8, H, W), (8, 8, 3, 3), padding=[1, 1, 1, 1])

    def build(ctx, shape):
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=list(shape))
        y = b.relu(b.conv2d(x, b.constant(case.W), bias=b.constant(case.B), padding=[1, 1, 1, 1]))
        return b.build_sync({"y": b.add(y, x)})

    ref = case.ref
    case.build, case.ref = build, (lambda x: ref(x) + x)
    g = _check(ctx, rng, case)
    if FUSION:
        assert all(n.startswith("conv2d") for n in g.kernel_names), g.kernel_names
    g.destroy()


def test_float16(ctx, rng):
    if not ctx._f16:
        pytest.skip("the adapter has no shader-f16")
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float16)

    def build(shape):
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float16", shape=list(shape))
        return b.build_sync({"y": b.relu(b.conv2d(x, b.constant(w), padding=[1, 1, 1, 1], strides=[1, 2]))})

    def run(g, x):
        t = ctx.create_tensor_sync(data_type="float16", shape=x.shape, writable=True)
        ctx.write_tensor(t, x)
        o = ctx.create_tensor_sync(data_type="float16", shape=g.compute_shapes({"x": x.shape})["y"], readable=True)
        ctx.dispatch(g, {"x": t}, {"y": o})
        r = ctx.read_tensor_sync(o)
        t.destroy()
        o.destroy()
        return r

    g = build((N, 8, H, W))
    for s in SIZES:
        x = rng.standard_normal(_concrete((N, 8, H, W), s)).astype(np.float16)
        got = run(g, x)
        want = np.maximum(conv2d_ref(x, w, pad=(1, 1, 1, 1), st=(1, 2)), 0)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=2e-2, err_msg=str(s))
        gs = build(_concrete((N, 8, H, W), s))
        np.testing.assert_array_equal(got, run(gs, x), err_msg=str(s))
        gs.destroy()
    g.destroy()


# -- every candidate, the hardware staging ------------------------------------------------------------


@pytest.mark.parametrize("vec", [False, True], ids=["cpu_staging", "hw_staging"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_every_candidate(ctx, rng, monkeypatch, vec, layout):
    # the tuner may pick any candidate for a bucket's maximum; each must be right at every size.
    # hw_staging: the hoisted (NCHW) and 16-byte (NHWC, channels % 4) staging of hardware adapters
    monkeypatch.setattr(gemm_engine, "VEC_LOADS", vec)
    n, h, w = D("N", 2), D("H", 24), D("W", 20)
    case = Case(rng, (n, 8, h, w), (24, 8, 3, 3), layout=layout, padding=[1, 0, 1, 2], strides=[1, 2])
    sizes = [dict(N=2, H=24, W=20), dict(N=1, H=2, W=1), dict(N=1, H=7, W=9), dict(N=2, H=13, W=3)]
    cands, _ = gemm_engine.gemm_candidates(2 * 24 * 11, 24, 72, 1)
    for i in range(len(cands)):
        with autotune.force(i):
            _check(ctx, rng, case, sizes, static=False).destroy()


# -- checks, refusals -------------------------------------------------------------------------------------


def test_output_size_checked_at_dispatch(ctx, rng):
    case = Case(rng, (N, 4, H, W), (4, 4, 5, 5), strides=[2, 1])
    g = case.build(ctx, case.spec())
    _run(ctx, g, np.ones((1, 4, 5, 5), np.float32))
    with pytest.raises(TypeError, match=r"\[conv2d\] output height"):
        _run(ctx, g, np.ones((1, 4, 4, 9), np.float32))
    with pytest.raises(TypeError, match=r"\[conv2d\] output width"):
        _run(ctx, g, np.ones((1, 4, 9, 3), np.float32))
    g.destroy()
    # a transposed conv whose padding exceeds the output for small inputs
    case = Case(rng, (N, 4, H, W), (4, 4, 3, 3), transpose=True, padding=[2, 2, 0, 0])
    g = case.build(ctx, case.spec())
    assert _run(ctx, g, np.ones((1, 4, 3, 2), np.float32)).shape == (1, 4, 1, 4)
    with pytest.raises(TypeError, match=r"\[conv_transpose2d\] output height"):
        _run(ctx, g, np.ones((1, 4, 2, 2), np.float32))
    g.destroy()


def test_never_valid_and_refused(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[N, 3, D("h", 4), W])
    w = b.constant(np.ones((2, 3, 7, 1), np.float32))
    with pytest.raises(TypeError, match=r"\[conv2d\] the dilated filter height \(7\) exceeds"):
        b.conv2d(x, w)
    # channels and filter sizes stay static
    xc = b.input("xc", data_type="float32", shape=[1, D("C", 8), H, W])
    with pytest.raises(NotSupportedError, match=r"\[conv2d\] input channels"):
        b.conv2d(xc, b.constant(np.ones((2, 8, 1, 1), np.float32)))
    wf = b.input("wf", data_type="float32", shape=[D("O", 4), 3, 3, 3])
    with pytest.raises(NotSupportedError, match=r"\[conv2d\] filter dimension 0"):
        b.conv2d(x, wf)
    xt = b.input("xt", data_type="float32", shape=[1, 3, H, W])
    wt = b.input("wt", data_type="float32", shape=[3, 2, D("K", 3), 3])
    with pytest.raises(NotSupportedError, match=r"\[conv_transpose2d\] filter dimension 2"):
        b.conv_transpose2d(xt, wt)
    # output_sizes with a dynamic input: checked at dispatch
    b = mltensor.MLGraphBuilder(ctx)
    xt = b.input("xt", data_type="float32", shape=[1, 3, H, W])
    y = b.conv_transpose2d(xt, b.constant(np.ones((3, 2, 3, 3), np.float32)), strides=[2, 2], output_sizes=[9, 9])
    g = b.build_sync({"y": y})
    t = ctx.create_tensor_sync(data_type="float32", shape=(1, 3, 4, 4), writable=True)
    ctx.write_tensor(t, np.ones((1, 3, 4, 4), np.float32))
    o = ctx.create_tensor_sync(data_type="float32", shape=(1, 2, 9, 9), readable=True)
    ctx.dispatch(g, {"xt": t}, {"y": o})
    t2 = ctx.create_tensor_sync(data_type="float32", shape=(1, 3, 6, 4), writable=True)
    with pytest.raises(TypeError, match=r"output_sizes height"):
        ctx.dispatch(g, {"xt": t2}, {"y": o})
    for v in (t, t2, o, g):
        v.destroy()


# -- an ONNX CNN with a symbolic batch and width: one build -------------------------------------------


def test_session_builds_once(ctx):
    ort = pytest.importorskip("onnxruntime")
    from test_session_shapes import _convnet

    model = _convnet()  # conv -> relu -> reshape, and global pool -> matmul
    sess = mltensor.InferenceSession(model, ctx, max_dimensions={"N": 4, "W": 32})
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for n, w in [(2, 16), (3, 9), (4, 32), (2, 5)]:  # (a size of 1 gets a build of its own)
        x = rng.standard_normal((n, 3, 8, w)).astype(np.float32)
        for got, want in zip(sess.run(None, {"x": x}), ref.run(None, {"x": x})):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    st = sess.stats
    assert st["dynamic"] is True and st["builds"] == 1, st


# -- derived sizes (dynamic/dims.py hoisting) -----------------------------------------------------


def _deep_chain(ctx, rng, shape):
    """A 1x1 convolution after three stride-2 3x3 ones: its plane is ((((H - 1) / 2) / 2) / 2) + 1
    squared, the kind of size a kernel rendered inline at every use."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=list(shape))
    ws = [rng.standard_normal((8, 4 if i == 0 else 8, 3, 3)).astype(np.float32) / 4 for i in range(3)]
    w1 = rng.standard_normal((12, 8, 1, 1)).astype(np.float32) / 3
    y = x
    for w in ws:
        y = b.relu(b.conv2d(y, b.constant(w), padding=[1, 1, 1, 1], strides=[2, 2]))
    y = b.conv2d(y, b.constant(w1))
    ref = lambda a: conv2d_ref(_relu_chain(a.astype(np.float64), ws), w1)  # noqa: E731
    return b.build_sync({"y": y}), ref


def _relu_chain(a, ws):
    for w in ws:
        a = np.maximum(conv2d_ref(a, w, pad=(1, 1, 1, 1), st=(2, 2)), 0)
    return a


def test_derived_sizes_fields(ctx, rng):
    """Sizes over the dynamic dimensions beyond a bare dimension are fields of the kernel's
    immediate data, computed by the host per dispatch: the kernels render them once, not as
    nested divisions at every use; results at every size match float64 numpy and a static build
    bit for bit (the same sums)."""
    from dataclasses import replace

    dyn = (N, 4, D("H", 40), D("W", 40))
    g, ref = _deep_chain(ctx, rng, dyn)
    hoisted = [k for k in g._kernels if k.dims]
    assert hoisted and all(k.derived for k in hoisted)
    for k in hoisted:
        src = k.source()
        assert "/ 2u)) / 2u" not in src, k.name  # (the third layer's plane, inline)
        assert "\x01" not in src and "\x02" not in src  # (every mark of a lowering's text resolved)
        assert f"dims.s{len(k.derived) - 1}" in src and f"dims.s{len(k.derived)}" not in src
        inline = replace(k, hoist=0, derived=()).source()  # the same kernel without derived fields
        assert len(src) < len(inline)
    deep = [k for k in hoisted if "1x1" in k.name]
    assert deep and "/ 2u)) / 2u" in replace(deep[0], hoist=0, derived=()).source()
    for n, h, w in [(1, 1, 1), (3, 40, 40), (2, 17, 9), (1, 8, 33)]:
        x = rng.standard_normal((n, 4, h, w)).astype(np.float32)
        got = _run(ctx, g, x)
        want = ref(x)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))
        gs, _ = _deep_chain(ctx, np.random.default_rng(0), (n, 4, h, w))  # (other weights: shapes only)
        assert [k.name for k in gs._kernels] != [] and gs.output_descriptors["y"][1] == tuple(want.shape)
        gs.destroy()
    g.destroy()


def test_derived_sizes_same_source_one_pipeline(ctx, rng):
    """Global average pools at two resolutions of one dynamic input (its 2x2 and 4x4 max pools)
    render the same WGSL once their planes are derived fields: one pipeline, each launch setting
    its own sizes; right at every size."""
    H, W = D("H", 64), D("W", 64)
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 16, H, W])
    p = b.max_pool2d(x, window_dimensions=[2, 2], strides=[2, 2])
    q = b.max_pool2d(p, window_dimensions=[2, 2], strides=[2, 2])
    g = b.build_sync({"a": b.average_pool2d(p), "b": b.average_pool2d(q)})

    def pool(a):
        h, w = a.shape[2] // 2 * 2, a.shape[3] // 2 * 2
        return a[:, :, :h, :w].reshape(1, 16, h // 2, 2, w // 2, 2).max(axis=(3, 5))

    for h, w in [(64, 64), (4, 4), (37, 12), (9, 64)]:
        xv = rng.standard_normal((1, 16, h, w)).astype(np.float32)
        t = ctx.create_tensor_sync(data_type="float32", shape=xv.shape, writable=True)
        ctx.write_tensor(t, xv)
        shapes = g.compute_shapes({"x": xv.shape})
        outs = {n: ctx.create_tensor_sync(data_type="float32", shape=s, readable=True) for n, s in shapes.items()}
        ctx.dispatch(g, {"x": t}, outs)
        for name, want in (("a", pool(xv)), ("b", pool(pool(xv)))):
            np.testing.assert_allclose(
                ctx.read_tensor_sync(outs[name]),
                want.mean(axis=(2, 3), keepdims=True),
                rtol=1e-5,
                atol=1e-6,
                err_msg=f"{name} at {h}x{w}",
            )
        for o in (t, *outs.values()):
            o.destroy()
    keys = {}  # (a pool's variants for small and large planes are made at their first use)
    for k, e in zip(g._kernels, g._launches):
        if e[0] is not None:
            keys.setdefault(id(e[0]), set()).add(k.key)
    assert any(len(v) > 1 for v in keys.values()), [k.name for k in g._kernels]
    assert g.pipelines_created < g.pipelines
    g.destroy()


def test_derived_sizes_switched_off(ctx, rng, monkeypatch):
    """MLTENSOR_NO_DERIVED_SIZES=1: every size inline, as before; the same results bit for bit."""
    dyn = (N, 4, D("H", 40), D("W", 40))
    x = rng.standard_normal((2, 4, 29, 17)).astype(np.float32)
    g, _ = _deep_chain(ctx, np.random.default_rng(1), dyn)
    monkeypatch.setenv("MLTENSOR_NO_DERIVED_SIZES", "1")
    g0, _ = _deep_chain(ctx, np.random.default_rng(1), dyn)
    assert all(not k.derived and "dims.s0" not in k.source() for k in g0._kernels)
    assert any(k.derived for k in g._kernels)
    np.testing.assert_array_equal(_run(ctx, g, x), _run(ctx, g0, x))
    g.destroy()
    g0.destroy()
