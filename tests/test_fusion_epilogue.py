"""Binary elementwise nodes fused into conv2d/matmul/gemm epilogues (residual adds, scales),
interleaved with activations: fewer kernels, same values as numpy."""

import numpy as np
import pytest
from helpers import FUSION, run_graph
from test_ops_conv import conv2d_ref

import mltensor


def _check(got, ref, tol=1e-4):
    assert got.shape == ref.shape
    assert got.dtype == np.float32
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol)


def _kernels(ctx, build):
    b, outputs, _ = build()
    return b.build_sync(outputs).kernel_names


def _run(ctx, build):
    b, outputs, feeds = build()
    return run_graph(ctx, outputs, feeds, b)


def _nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


def _conv_case(ctx, rng, layout, groups=1, c=8, residual="input", tail=None):
    """x -> conv2d(3x3, pad 1, bias) -> tail(b, y, r) where r is the residual (same shape)."""
    X = rng.standard_normal((2, c, 9, 7)).astype(np.float32)
    W = (rng.standard_normal((c, c // groups, 3, 3)) * 0.3).astype(np.float32)
    B = rng.standard_normal(c).astype(np.float32)
    R = rng.standard_normal((2, c, 9, 7)).astype(np.float32)
    nhwc = layout == "nhwc"
    if nhwc:
        Wl = W.transpose((1, 2, 3, 0) if groups > 1 else (0, 2, 3, 1))  # ihwo / ohwi
        flay = "ihwo" if groups > 1 else "ohwi"
    else:
        Wl, flay = W, "oihw"

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=list(_nhwc(X).shape if nhwc else X.shape))
        feeds = {"x": _nhwc(X) if nhwc else X}
        r = b.input("r", data_type="float32", shape=list(_nhwc(R).shape if nhwc else R.shape))
        feeds["r"] = _nhwc(R) if nhwc else R
        y = b.conv2d(
            x,
            b.constant(np.ascontiguousarray(Wl)),
            padding=[1, 1, 1, 1],
            groups=groups,
            bias=b.constant(B),
            input_layout=layout,
            filter_layout=flay,
        )
        if residual == "intermediate":  # produced by a kernel recorded after the conv
            r = b.sigmoid(r)
        return b, {"y": tail(b, y, r)}, feeds

    ref_conv = conv2d_ref(X, W, pad=(1, 1, 1, 1), groups=groups, bias=B)
    Rr = R.astype(np.float64)
    if residual == "intermediate":
        Rr = 1.0 / (1.0 + np.exp(-Rr))
    got = _run(ctx, build)["y"]
    if nhwc:
        got = np.ascontiguousarray(got.transpose(0, 3, 1, 2))
    return got, ref_conv, Rr, _kernels(ctx, build)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv_add_residual_relu_is_one_kernel(ctx, rng, layout):
    got, conv, r, names = _conv_case(ctx, rng, layout, tail=lambda b, y, r: b.relu(b.add(y, r)))
    assert not FUSION or (len(names) == 1 and names[0].startswith("conv2d")), names
    _check(got, np.maximum(conv + r, 0))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_conv_activation_residual_interleaved(ctx, rng, layout):
    # conv -> clamp -> add(residual) -> relu -> mul(residual): one kernel, order kept
    def tail(b, y, r):
        return b.mul(b.relu(b.add(r, b.clamp(y, min_value=-1.0, max_value=1.0))), r)

    got, conv, r, names = _conv_case(ctx, rng, layout, tail=tail)
    assert not FUSION or (len(names) == 1), names
    _check(got, np.maximum(r + np.clip(conv, -1, 1), 0) * r)


@pytest.mark.parametrize("residual_first", [False, True])
def test_conv_sub_keeps_operand_order(ctx, rng, residual_first):
    def tail(b, y, r):
        return b.sub(r, y) if residual_first else b.sub(y, r)

    got, conv, r, names = _conv_case(ctx, rng, "nhwc", tail=tail)
    assert not FUSION or (len(names) == 1), names
    _check(got, r - conv if residual_first else conv - r)


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_depthwise_add_residual(ctx, rng, layout):
    got, conv, r, names = _conv_case(ctx, rng, layout, groups=8, tail=lambda b, y, r: b.add(y, r))
    assert not FUSION or (len(names) == 1 and names[0].endswith("_dw")), names
    _check(got, conv + r)


def test_residual_from_a_later_kernel(ctx, rng):
    """The residual is computed by a kernel recorded after the conv: the fused conv runs after it."""
    got, conv, r, names = _conv_case(
        ctx, rng, "nhwc", residual="intermediate", tail=lambda b, y, r: b.relu(b.add(y, r))
    )
    assert not FUSION or (len(names) == 2 and names[-1].startswith("conv2d")), names
    _check(got, np.maximum(conv + r, 0))


def test_resnet_block_with_projection_shortcut(ctx, rng):
    """relu(conv_b(relu(conv_a(x))) + conv_s(x)): the add and relu join conv_b (3 kernels)."""
    X = rng.standard_normal((1, 6, 8, 8)).astype(np.float32)
    Wa, Wb, Ws = ((rng.standard_normal(s) * 0.3).astype(np.float32) for s in ((8, 6, 3, 3), (8, 8, 3, 3), (8, 6, 1, 1)))

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[1, 6, 8, 8])
        h = b.relu(b.conv2d(x, b.constant(Wa), padding=[1, 1, 1, 1]))
        main = b.conv2d(h, b.constant(Wb), padding=[1, 1, 1, 1])
        short = b.conv2d(x, b.constant(Ws))  # built after main: main's kernel must wait for it
        return b, {"y": b.relu(b.add(main, short))}, {"x": X}

    names = _kernels(ctx, build)
    assert not FUSION or (len(names) == 3 and all(n.startswith("conv2d") for n in names)), names
    h = np.maximum(conv2d_ref(X, Wa, pad=(1, 1, 1, 1)), 0)
    ref = np.maximum(conv2d_ref(h, Wb, pad=(1, 1, 1, 1)) + conv2d_ref(X, Ws), 0)
    _check(_run(ctx, build)["y"], ref)


@pytest.mark.parametrize("shape", [(8,), (1, 1, 8), (1, 1, 1, 1)])
def test_conv_nhwc_broadcast_operand(ctx, rng, shape):
    """A per-channel (NHWC) or scalar operand is read through baked broadcast strides."""
    S = rng.standard_normal(shape).astype(np.float32)

    def tail(b, y, r):
        return b.mul(y, b.constant(S))

    got, conv, _, names = _conv_case(ctx, rng, "nhwc", tail=tail)
    assert not FUSION or (len(names) == 1), names
    s = S.reshape(-1) if S.size > 1 else S.reshape(())
    _check(got, conv * (s[None, :, None, None] if S.size > 1 else s))


def test_conv_result_used_twice_is_not_fused(ctx, rng):
    # y feeds both the add and the output: the add is a kernel of its own
    X = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    W = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    R = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[1, 4, 5, 5])
        r = b.input("r", data_type="float32", shape=[1, 4, 5, 5])
        y = b.conv2d(x, b.constant(W))
        return b, {"y": y, "z": b.add(y, r)}, {"x": X, "r": R}

    assert not FUSION or (len(_kernels(ctx, build)) == 2)
    out = _run(ctx, build)
    conv = conv2d_ref(X, W)
    _check(out["y"], conv)
    _check(out["z"], conv + R)


def test_constant_conv_with_input_residual_is_not_fused(ctx, rng):
    # the conv of constants is folded at build time; the add with an input runs per dispatch
    X = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    W = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    R = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        r = b.input("r", data_type="float32", shape=[1, 4, 5, 5])
        y = b.conv2d(b.constant(X), b.constant(W), padding=[1, 1, 1, 1])
        return b, {"z": b.sub(r, y)}, {"r": R}

    names = _kernels(ctx, build)
    assert not FUSION or (len(names) == 1 and names[0].startswith("ew_sub")), names
    _check(_run(ctx, build)["z"], R - conv2d_ref(X, W, pad=(1, 1, 1, 1)))


def test_epilogue_respects_the_binding_limit(ctx, rng):
    """More residual operands than a kernel may bind: the epilogue stops at the limit, the rest
    is an elementwise kernel, and every kernel binds at most the limit."""
    from mltensor.compiler.steps import binding_cap

    limit = binding_cap(ctx.device)  # small and fixed, whatever the adapter reports
    n_add = limit + 4
    X = rng.standard_normal((1, 4, 3, 3)).astype(np.float32)
    W = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    Rs = [rng.standard_normal((1, 4, 3, 3)).astype(np.float32) for _ in range(n_add)]

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[1, 4, 3, 3])
        y = b.conv2d(x, b.constant(W))
        feeds = {"x": X}
        for k, R in enumerate(Rs):
            y = b.add(y, b.input(f"r{k}", data_type="float32", shape=[1, 4, 3, 3]))
            feeds[f"r{k}"] = R
        return b, {"y": y}, feeds

    b, outputs, _ = build()
    g = b.build_sync(outputs)
    assert not FUSION or (2 <= len(g.kernel_names) <= 3), g.kernel_names
    assert not FUSION or (g.kernel_names[0].startswith("conv2d"))
    assert all(len(entry[2]) <= limit for entry in g._launches)
    _check(_run(ctx, build)["y"], conv2d_ref(X, W) + sum(R.astype(np.float64) for R in Rs))


# -- matmul / gemm ------------------------------------------------------------------------------


@pytest.mark.parametrize("sa,sb", [((70, 33), (33, 130)), ((3, 40), (40, 9)), ((2, 20, 8), (8, 12))])
def test_matmul_add_residual(ctx, rng, sa, sb):
    A = rng.standard_normal(sa).astype(np.float32)
    B = rng.standard_normal(sb).astype(np.float32)
    ref = np.matmul(A.astype(np.float64), B.astype(np.float64))
    R = rng.standard_normal(ref.shape).astype(np.float32)

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        a = b.input("a", data_type="float32", shape=list(sa))
        r = b.input("r", data_type="float32", shape=list(R.shape))
        z = b.relu(b.add(b.matmul(a, b.constant(B)), r))
        return b, {"z": z}, {"a": A, "r": R}

    names = _kernels(ctx, build)
    assert not FUSION or (len(names) == 1 and names[0].startswith("matmul")), names
    _check(_run(ctx, build)["z"], np.maximum(ref + R, 0))


@pytest.mark.parametrize("m", [2, 37])  # GEMV and tiled paths
def test_gemm_mul(ctx, rng, m):
    A = rng.standard_normal((m, 24)).astype(np.float32)
    B = rng.standard_normal((20, 24)).astype(np.float32)
    C = rng.standard_normal((20,)).astype(np.float32)
    S = rng.standard_normal((m, 20)).astype(np.float32)

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        a = b.input("a", data_type="float32", shape=[m, 24])
        s = b.input("s", data_type="float32", shape=[m, 20])
        z = b.gemm(a, b.constant(B), c=b.constant(C), b_transpose=True, alpha=0.5)
        return b, {"z": b.max(b.mul(s, z), b.constant(np.float32(-0.5).reshape(())))}, {"a": A, "s": S}

    names = _kernels(ctx, build)
    assert not FUSION or (len(names) == 1 and names[0].startswith("gemm")), names
    ref = 0.5 * A.astype(np.float64) @ B.T.astype(np.float64) + C
    _check(_run(ctx, build)["z"], np.maximum(S * ref, -0.5))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("value,mode_pads", [(0.0, "channels"), (0.0, "spatial"), (-1.5, "both")])
def test_residual_through_a_constant_pad(ctx, rng, layout, value, mode_pads, dtype):
    # BlazePalm / BlazeFace blocks: conv(z) + pad(max_pool(x)) (channels padded with zeros): the
    # epilogue reads the pool's output through the pad, so the pad launches nothing
    N, C, C2, H, W = 2, 4, 10, 8, 6
    nhwc = layout == "nhwc"
    ch = C2 - C if mode_pads in ("channels", "both") else 0
    sp = (1, 0, 2, 1) if mode_pads in ("spatial", "both") else (0, 0, 0, 0)
    OH, OW = H // 2 + sp[0] + sp[1], W // 2 + sp[2] + sp[3]
    X = rng.standard_normal((N, C, H, W)).astype(dtype)
    Z = rng.standard_normal((N, C2, OH, OW)).astype(dtype)
    Wt = (rng.standard_normal((C + ch, C2, 1, 1)) * 0.5).astype(dtype)

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type=dtype, shape=_nhwc(X).shape if nhwc else X.shape)
        z = b.input("z", data_type=dtype, shape=_nhwc(Z).shape if nhwc else Z.shape)
        p = b.max_pool2d(x, window_dimensions=[2, 2], strides=[2, 2], layout=layout)
        c_ax, h_ax, w_ax = (3, 1, 2) if nhwc else (1, 2, 3)
        begin, end = [0] * 4, [0] * 4
        end[c_ax], begin[h_ax], end[h_ax], begin[w_ax], end[w_ax] = ch, sp[0], sp[1], sp[2], sp[3]
        r = b.pad(p, begin, end, value=value)
        kw = dict(input_layout=layout, filter_layout="ohwi" if nhwc else "oihw")
        y = b.conv2d(z, b.constant(_nhwc(Wt) if nhwc else Wt), **kw)
        return b, {"y": b.relu(b.add(y, r))}, {"x": _nhwc(X) if nhwc else X, "z": _nhwc(Z) if nhwc else Z}

    names = [n for n in _kernels(ctx, build) if not n.startswith(("pack_", "unpack_"))]  # f16 edges without shader-f16
    assert not FUSION or (len(names) == 2 and not any(n.startswith("pad") for n in names)), names
    got = _run(ctx, build)["y"]
    pooled = X.reshape(N, C, H // 2, 2, W // 2, 2).max(axis=(3, 5)).astype(np.float64)
    r = np.pad(pooled, ((0, 0), (0, ch), (sp[0], sp[1]), (sp[2], sp[3])), constant_values=value)
    ref = np.maximum(conv2d_ref(Z.astype(np.float64), Wt.astype(np.float64)) + r, 0)
    got = (got.transpose(0, 3, 1, 2) if nhwc else got).astype(np.float64)
    np.testing.assert_allclose(
        got, ref, rtol=1e-4 if dtype == "float32" else 1e-2, atol=1e-4 if dtype == "float32" else 2e-2
    )


def test_pad_read_twice_still_launches(ctx, rng):
    X = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)

    def build():
        b = mltensor.MLGraphBuilder(ctx)
        x = b.input("x", data_type="float32", shape=[1, 4, 4, 4])
        r = b.pad(x, [0, 0, 0, 0], [0, 4, 0, 0])
        y = b.conv2d(
            b.input("z", data_type="float32", shape=[1, 8, 4, 4]),
            b.constant(np.eye(8, dtype=np.float32).reshape(8, 8, 1, 1)),
        )
        return b, {"y": b.add(y, r), "r": r}, {"x": X[:, :4], "z": X}

    names = _kernels(ctx, build)
    assert not FUSION or (any(n.startswith("pad") for n in names)), names
    got = _run(ctx, build)
    want = np.pad(X[:, :4], ((0, 0), (0, 4), (0, 0), (0, 0)))
    _check(got["r"], want)
    _check(got["y"], X + want)
