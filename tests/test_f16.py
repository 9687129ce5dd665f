"""float16 computed in f16 (the context uses "shader-f16") and in f32 (MLTENSOR_DISABLE_F16=1).

- Every operator x operand group listing float16 in op_support_limits() runs on random float16
  inputs in both modes and is compared with the same graph in float32 on the same values (the
  float32 kernels are checked against numpy in tests/test_ops_*.py), rounded to float16.
  Tolerances per operator family (TOL below): elementwise and data movement within ~2 float16 ulp;
  families that accumulate (reductions, softmax, normalizations, pooling averages, matmul / gemm /
  conv, recurrent) within 1e-2, since inputs and intermediate results are float16 there.
- Moves (transpose, slice, concat, pad, gather, reshape, expand, where) keep every bit: NaN
  payloads, signaling NaNs, subnormals, -0.
- Range: results past 65504 become +-inf like numpy's float16; NaN stays NaN.
- Mixed graphs: casts between float16, float32 and integers, int8 dequantize to float16 and
  quantize from it, float16 and float32 constants.
- Bytes: float16 tensors move 2 bytes an element (writes, reads, graph constants), and with f16 on
  a float16 graph has no edge conversions and 2-byte intermediates.
"""

import numpy as np
import pytest
from helpers import FUSION, context_with_env, run_graph
from test_op_support_limits import RECIPES

import mltensor
from mltensor import dtypes

# Families whose float16 kernels accumulate (f32 accumulators over float16 operands and outputs):
ACCUMULATING = {
    "reduce_l1",
    "reduce_l2",
    "reduce_log_sum",
    "reduce_log_sum_exp",
    "reduce_mean",
    "reduce_product",
    "reduce_sum",
    "reduce_sum_square",
    "softmax",
    "batch_normalization",
    "instance_normalization",
    "layer_normalization",
    "average_pool2d",
    "l2_pool2d",
    "matmul",
    "gemm",
    "conv2d",
    "conv_transpose2d",
    "gru",
    "gru_cell",
    "lstm",
    "lstm_cell",
    "cumulative_sum",
}
TOL = {"elementwise": dict(rtol=2e-3, atol=2e-3), "accumulating": dict(rtol=1e-2, atol=1e-2)}
# inputs that must be positive (logs, roots, variances, quantization scales)
POSITIVE_OPS = {"log", "sqrt", "reduce_log_sum", "pow"}
POSITIVE_KEYS = {"variance", "scale"}


@pytest.fixture(scope="module")
def f16off_ctx():
    c = context_with_env(MLTENSOR_DISABLE_F16="1")
    yield c
    c.destroy()


@pytest.fixture(scope="module", params=["f16", "f32"])
def mctx(request, ctx, f16off_ctx):
    """Both float16 modes: native f16 (skipped where the adapter lacks shader-f16) and f32."""
    if request.param == "f32":
        assert not f16off_ctx._f16
        return f16off_ctx
    if not ctx._f16:
        pytest.skip("the adapter has no shader-f16 (the f32 run covers this device)")
    return ctx


def test_switch(ctx, f16off_ctx):
    assert not f16off_ctx._f16 and "shader-f16" not in f16off_ctx.device.features
    assert ctx._f16 == ("shader-f16" in ctx.device.features)


def test_op_support_limits_same_in_both_modes(ctx, f16off_ctx):
    # float16 is listed where it works (the sweep below runs each listing), in both modes alike
    assert ctx.op_support_limits() == f16off_ctx.op_support_limits()


# -- the sweep: every operator listing float16 -------------------------------------------------


class _Feeds:
    """inp(key, shape): a graph input of the key's type in T, fed with random values (float16
    representable for float types, ones for integer operands such as indices and zero points)."""

    def __init__(self, b, T, op, rng_seed):
        self.b, self.T, self.op, self.feeds = b, T, op, {}
        self.rng = np.random.default_rng(rng_seed)

    def __call__(self, key, shape):
        name = f"{key}_{len(self.feeds)}"
        dt = self.T[key]
        if dt in ("float16", "float32"):
            v = self.rng.uniform(0.25, 2.0, shape)
            if self.op not in POSITIVE_OPS and key not in POSITIVE_KEYS:
                v = v * self.rng.choice([-1.0, 1.0], shape)
            v = v.astype(np.float16)  # the same values in both graphs
        else:
            v = np.ones(shape)
        self.feeds[name] = v.astype(dtypes.NUMPY[dt])
        return self.b.input(name, data_type=dt, shape=shape)


def _sweep_cases():
    from mltensor.ir.registry import OPS  # what op_support_limits() lists

    cases = []
    for op, (groups, _) in sorted(RECIPES.items()):
        if op not in OPS:
            continue
        for gi, g in enumerate(groups):
            if "float16" in OPS[op].support[g[0]]:
                cases.append((op, gi))
    return cases


SWEEP = _sweep_cases()


def _run_recipe(c, op, T, seed):
    groups, recipe = RECIPES[op]
    b = mltensor.MLGraphBuilder(c)
    inp = _Feeds(b, T, op, seed)
    res = recipe(b, T, inp)
    outs = {f"y{j}": y for j, y in enumerate(res if isinstance(res, (list, tuple)) else [res])}
    return run_graph(c, outs, inp.feeds, b), outs


@pytest.mark.parametrize("op,group", SWEEP, ids=[f"{o}-{g}" for o, g in SWEEP])
def test_float16_sweep(mctx, op, group):
    lim = mctx.op_support_limits()
    groups, _ = RECIPES[op]
    T = {}
    for g in groups:  # other groups: their first listed type (float32 where listed, for a float ref)
        types = lim[op][g[0]]["data_types"]
        t = "float32" if "float32" in types else types[0]
        T.update({k: t for k in g})
    T16 = dict(T, **{k: "float16" for k in groups[group]})
    T32 = dict(T, **{k: "float32" for k in groups[group]})
    got, outs = _run_recipe(mctx, op, T16, 7)
    want, _ = _run_recipe(mctx, op, T32, 7)
    tol = TOL["accumulating" if op in ACCUMULATING else "elementwise"]
    for name, y in outs.items():
        assert got[name].dtype == dtypes.NUMPY[y.data_type] and got[name].shape == y.shape, name
        w = want[name]
        if y.data_type == "float16":
            w = w.astype(np.float16)
        np.testing.assert_allclose(
            got[name].astype(np.float64),
            w.astype(np.float64),
            **tol,
            err_msg=f"{op} group {groups[group]} output {name}",
        )


# -- bits, range, mixed graphs --------------------------------------------------------------------

SPECIAL_BITS = np.array(
    [
        0x7E01,
        0x7C01,
        0xFE33,
        0xFC00,
        0x7C00,
        0x0001,
        0x8001,
        0x03FF,
        0x8000,
        0x7BFF,
        0xFBFF,
        0x3C00,
        0x0400,
        0x83FF,
        0x7FFF,
        0x1234,
    ],
    np.uint16,
)


def test_moves_keep_every_bit(mctx):
    x16 = SPECIAL_BITS.view(np.float16)
    b = mltensor.MLGraphBuilder(mctx)
    x = b.input("x", data_type="float16", shape=[4, 4])
    outs = {
        "t": b.transpose(x),
        "s": b.slice(x, [1, 1], [3, 3]),
        "c": b.concat([x, b.slice(x, [0, 0], [4, 1])], 1),
        "p": b.pad(x, [1, 0], [0, 1], value=1.0),
        "g": b.gather(x, b.constant(np.array([3, 0, 2], np.int32)), axis=1),
        "r": b.reshape(b.transpose(x), [16]),
        "e": b.expand(b.slice(x, [0, 0], [1, 4]), [3, 4]),
        "w": b.where(b.constant(np.array([1, 0, 1, 0], np.uint8)), x, b.reverse(x)),
        "i": b.identity(x),
    }
    r = run_graph(mctx, outs, {"x": x16.reshape(4, 4)}, b)
    xs = x16.reshape(4, 4)
    ref = {
        "t": xs.T,
        "s": xs[1:4, 1:4],
        "c": np.concatenate([xs, xs[:, :1]], 1),
        "p": np.pad(xs, [(1, 0), (0, 1)], constant_values=np.float16(1.0)),
        "g": xs[:, [3, 0, 2]],
        "r": xs.T.reshape(16),
        "e": np.broadcast_to(xs[:1], (3, 4)),
        "w": np.where(np.array([1, 0, 1, 0], bool), xs, xs[::-1, ::-1]),
        "i": xs,
    }
    for k, v in ref.items():
        want = np.ascontiguousarray(v).view(np.uint16)
        if not mctx._f16:
            # f32 mode widens float16 to f32 at the edges, which quiets signaling NaNs (0x7c01 ->
            # 0x7e01); every other bit pattern survives
            want = np.where(((want & 0x7C00) == 0x7C00) & ((want & 0x3FF) != 0), want | 0x200, want)
        np.testing.assert_array_equal(r[k].view(np.uint16), want, err_msg=k)


def test_range_and_nan(mctx):
    # f16 results past 65504 are +-inf (numpy float16 semantics), NaN propagates
    a = np.array([60000, -60000, 1, np.nan, 65504, 11, -11, 0.5], np.float16)
    c = np.array([60000, -60000, np.inf, 1, 16, 1, 1, -np.inf], np.float16)
    b = mltensor.MLGraphBuilder(mctx)
    x, y = b.input("a", data_type="float16", shape=[8]), b.input("c", data_type="float16", shape=[8])
    outs = {
        "add": b.add(x, y),
        "mul": b.mul(x, y),
        "exp": b.exp(x),
        "relu": b.relu(x),
        "sq": b.reduce_sum_square(b.reshape(x, [2, 4]), axes=[1]),
        "from32": b.cast(b.mul(b.cast(x, "float32"), b.constant(np.float32(4).reshape(()))), "float16"),
        "isnan": b.is_nan(b.add(x, y)),
        "isinf": b.is_infinite(b.add(x, y)),
    }
    with np.errstate(all="ignore"):
        a32, c32 = a.astype(np.float32), c.astype(np.float32)
        ref = {
            "add": (a32 + c32).astype(np.float16),
            "mul": (a32 * c32).astype(np.float16),
            "exp": np.exp(a32).astype(np.float16),
            "relu": np.where(np.isnan(a32), a32, np.maximum(a32, 0)).astype(np.float16),
            "sq": (a32.reshape(2, 4).astype(np.float64) ** 2).sum(1).astype(np.float16),
            "from32": (a32 * 4).astype(np.float16),
            "isnan": np.isnan(a32 + c32).astype(np.uint8),
            "isinf": np.isinf((a32 + c32).astype(np.float16) if mctx._f16 else a32 + c32).astype(np.uint8),
        }
    # (f32 mode keeps intermediates in f32: the sum overflows only when stored as float16)
    r = run_graph(mctx, outs, {"a": a, "c": c}, b)
    for k, v in ref.items():
        np.testing.assert_array_equal(r[k], v, err_msg=k)


def test_mixed_graph(mctx, rng):
    q = rng.integers(-128, 128, (3, 4)).astype(np.int8)
    x = rng.uniform(-4, 4, (3, 4)).astype(np.float16)
    x32 = rng.uniform(-4, 4, (3, 4)).astype(np.float32)
    b = mltensor.MLGraphBuilder(mctx)
    qi = b.input("q", data_type="int8", shape=[3, 4])
    xi = b.input("x", data_type="float16", shape=[3, 4])
    fi = b.input("f", data_type="float32", shape=[3, 4])
    scale16 = b.constant(np.array([[0.5, 0.25, 2.0, 0.125]], np.float16))
    zp = b.constant(np.array([[0, 1, -2, 3]], np.int8))
    deq = b.dequantize_linear(qi, scale16, zp)  # int8 -> float16
    s = b.add(deq, xi)
    outs = {
        "deq": deq,
        "mix": b.cast(b.mul(b.cast(s, "float32"), fi), "float16"),
        "to32": b.add(b.cast(xi, "float32"), fi),
        "to_i32": b.cast(xi, "int32"),
        "to_u8": b.cast(b.abs(xi), "uint8"),
        "from_i8": b.cast(qi, "float16"),
        "quant": b.quantize_linear(xi, scale16, zp),
    }
    r = run_graph(mctx, outs, {"q": q, "x": x, "f": x32}, b)
    sc = np.array([0.5, 0.25, 2.0, 0.125], np.float32)
    z = np.array([0, 1, -2, 3], np.float32)
    deq_ref = ((q.astype(np.float32) - z) * sc).astype(np.float16)
    s_ref = (deq_ref.astype(np.float32) + x.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(r["deq"], deq_ref)
    np.testing.assert_allclose(
        r["mix"].astype(np.float32), (s_ref.astype(np.float32) * x32).astype(np.float16), rtol=1e-3
    )
    np.testing.assert_allclose(r["to32"], x.astype(np.float32) + x32, rtol=1e-6)
    np.testing.assert_array_equal(r["to_i32"], x.astype(np.float32).astype(np.int32))
    np.testing.assert_array_equal(r["to_u8"], np.abs(x).astype(np.float32).astype(np.uint8))
    np.testing.assert_array_equal(r["from_i8"], q.astype(np.float16))
    qref = np.clip(np.round(x.astype(np.float32) / sc) + z, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(r["quant"], qref)


# -- bytes ------------------------------------------------------------------------------------------


def test_float16_tensors_move_two_bytes_an_element(mctx):
    n = 1000
    before = mctx.counters
    t = mctx.create_tensor_sync(data_type="float16", shape=[n], readable=True, writable=True)
    mctx.write_tensor(t, np.arange(n, dtype=np.float16))
    back = mctx.read_tensor_sync(t)
    after = mctx.counters
    assert back.dtype == np.float16 and back.tolist() == list(range(n))
    assert after["bytes_uploaded"] - before["bytes_uploaded"] == 2 * n
    assert after["bytes_downloaded"] - before["bytes_downloaded"] == 2 * n
    t.destroy()


def test_float16_constants_upload_two_bytes_an_element(mctx):
    n = 1001  # odd: the last word is half padding
    w = (np.arange(n) % 7).astype(np.float16)
    b = mltensor.MLGraphBuilder(mctx)
    x = b.input("x", data_type="float16", shape=[n])
    before = mctx.counters["bytes_uploaded"]
    g = b.build_sync({"y": b.mul(x, b.constant(w))})
    uploaded = mctx.counters["bytes_uploaded"] - before
    # f16: the constant as it is (2 bytes an element); f32 mode: widened to f32 (4)
    assert uploaded == (2 if mctx._f16 else 4) * n
    xt = mctx.create_tensor_sync(data_type="float16", shape=[n], writable=True)
    yt = mctx.create_tensor_sync(data_type="float16", shape=[n], readable=True)
    mctx.write_tensor(xt, np.full(n, 3, np.float16))
    mctx.dispatch(g, {"x": xt}, {"y": yt})
    np.testing.assert_array_equal(mctx.read_tensor_sync(yt), (w.astype(np.float32) * 3).astype(np.float16))
    for o in (xt, yt, g):
        o.destroy()


def test_f16_graph_has_no_edge_conversions_and_two_byte_intermediates(mctx):
    from mltensor.compiler.lower import KernelContext

    b = mltensor.MLGraphBuilder(mctx)
    x = b.input("x", data_type="float16", shape=[64, 64])
    y = b.softmax(b.add(b.transpose(b.exp(x)), x), 1)
    g = b.build_sync({"y": y})
    names = " ".join(g.kernel_names)
    kc = KernelContext(mctx.device, f16=mctx._f16)
    if mctx._f16:
        assert "unpack" not in names and "pack_" not in names, names
        assert kc.nbytes(x) == 2 * 64 * 64
        assert all(buf.size <= 2 * 64 * 64 for buf in g._buffers), [buf.size for buf in g._buffers]
    else:
        assert "unpack_float16" in names and "pack_float16" in names, names
        assert kc.nbytes(x) == 4 * 64 * 64
    g.destroy()


@pytest.mark.parametrize(
    "case", ["sum_split", "mean_group", "lse_split", "softmax_group", "layer_group", "global_avg", "cumsum"]
)
def test_large_accumulations(mctx, rng, case):
    """The workgroup and two-level kernel shapes of the accumulating families (the sweep's small
    shapes take the one-thread paths): f32 accumulators over float16 inputs stay within 1e-2 of a
    float64 numpy reference, where float16 accumulation would drift far beyond it."""
    shapes = {
        "sum_split": (2, 60000),
        "mean_group": (8, 3000),
        "lse_split": (1, 70000),
        "softmax_group": (4, 2000),
        "layer_group": (4, 2000),
        "global_avg": (1, 3, 40, 40),
        "cumsum": (2, 3000),
    }
    x = rng.uniform(0.5, 1.5, shapes[case]).astype(np.float16)
    x64 = x.astype(np.float64)
    b = mltensor.MLGraphBuilder(mctx)
    xi = b.input("x", data_type="float16", shape=x.shape)
    if case == "sum_split":
        y, ref = b.reduce_sum(xi, axes=[1]), x64.sum(1)
    elif case == "mean_group":
        y, ref = b.reduce_mean(xi, axes=[1]), x64.mean(1)
    elif case == "lse_split":
        y, ref = b.reduce_log_sum_exp(xi, axes=[1]), np.log(np.exp(x64).sum(1))
    elif case == "softmax_group":
        y, ref = b.softmax(xi, 1), np.exp(x64) / np.exp(x64).sum(1, keepdims=True)
    elif case == "layer_group":
        y = b.layer_normalization(xi, axes=[1])
        ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    elif case == "global_avg":
        y, ref = b.average_pool2d(xi), x64.mean((2, 3), keepdims=True)
    else:
        y, ref = b.cumulative_sum(xi, 1), np.cumsum(x64, 1)
    r = run_graph(mctx, {"y": y}, {"x": x}, b)["y"]
    assert r.dtype == np.float16
    np.testing.assert_allclose(r.astype(np.float64), ref.astype(np.float16).astype(np.float64), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("vec", [False, True])
@pytest.mark.parametrize("mkn", [(3, 40, 9), (64, 64, 64), (33, 70, 45), (8, 4096, 8)])
def test_gemm_family_f16_paths(mctx, rng, monkeypatch, vec, mkn):
    """matmul in float16 on every GEMM path (gemv, tiled, tiled with ragged edges, split-K), with
    and without vec4 loads (vec4<f16> -> vec4<f32> staging), and a fused epilogue (residual add
    and relu on the f16 output): f32 accumulation keeps it within 1e-2 of numpy."""
    from mltensor.ops import _gemm as mm

    monkeypatch.setattr(mm, "VEC_LOADS", vec)
    M, K, N = mkn
    a = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    w = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    r = rng.uniform(-1, 1, (M, N)).astype(np.float16)
    b = mltensor.MLGraphBuilder(mctx)
    ai = b.input("a", data_type="float16", shape=[M, K])
    ri = b.input("r", data_type="float16", shape=[M, N])
    y = b.relu(b.add(b.matmul(ai, b.constant(w)), ri))
    got = run_graph(mctx, {"y": y}, {"a": a, "r": r}, b)["y"]
    mm64 = a.astype(np.float64) @ w.astype(np.float64)
    ref = np.maximum(mm64.astype(np.float16).astype(np.float64) + r, 0)
    scale = np.sqrt(K)  # the sum's magnitude: tolerance relative to it
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float16), rtol=1e-2, atol=1e-2 * scale / 4)


@pytest.mark.parametrize("vec", [False, True])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("kind", ["bn_relu", "scaled_add", "depthwise"])
def test_conv_prologues_f16(mctx, rng, monkeypatch, kind, layout, vec):
    """The convolution prologues (compiler/fusion/conv_prologue.py: batch_normalization + activation, per-channel
    scale + residual, depthwise conv + clamp feeding a 1x1 conv) in float16: one kernel, within
    1e-2 of the same graph in float32 on the same values."""
    from mltensor.ops import _gemm as mm

    monkeypatch.setattr(mm, "VEC_LOADS", vec)
    monkeypatch.setenv("MLTENSOR_FUSE_DEPTHWISE", "1")  # opt-in (compiler/fusion/conv_prologue.py fuse_depthwise)
    N, C, H, W, OC = 1, 8, 7, 7, 12
    nhwc = layout == "nhwc"
    xs = (N, H, W, C) if nhwc else (N, C, H, W)
    x = rng.uniform(-1, 1, xs).astype(np.float16)
    k = 1 if kind == "depthwise" else 3
    wconv = rng.uniform(-1, 1, (OC, k, k, C) if nhwc else (OC, C, k, k)).astype(np.float16)
    params = {
        "mean": rng.uniform(-0.5, 0.5, C),
        "var": rng.uniform(0.5, 1.5, C),
        "sc": rng.uniform(0.5, 1.5, C),
        "bi": rng.uniform(-0.5, 0.5, C),
        "q": rng.uniform(-1, 1, (1, 1, 1, C) if nhwc else (1, C, 1, 1)),
        "r": rng.uniform(-1, 1, xs),
        "wd": rng.uniform(-1, 1, (C, 3, 3, 1) if nhwc else (C, 1, 3, 3)),
        "bd": rng.uniform(-0.5, 0.5, C),
    }
    params = {n: v.astype(np.float16) for n, v in params.items()}

    def build(c, dt):
        b = mltensor.MLGraphBuilder(c)
        xi = b.input("x", data_type=dt, shape=list(xs))
        p = {n: b.constant(v.astype(dt)) for n, v in params.items()}
        kw = dict(input_layout=layout, filter_layout="ohwi" if nhwc else "oihw")
        if kind == "bn_relu":
            y = b.relu(
                b.batch_normalization(xi, p["mean"], p["var"], scale=p["sc"], bias=p["bi"], axis=3 if nhwc else 1)
            )
        elif kind == "scaled_add":
            y = b.add(b.mul(xi, p["q"]), p["r"])
        else:
            y = b.clamp(
                b.conv2d(xi, p["wd"], groups=C, bias=p["bd"], padding=[1, 1, 1, 1], **kw), min_value=0.0, max_value=6.0
            )
        out = b.conv2d(y, b.constant(wconv.astype(dt)), padding=[k // 2] * 4, **kw)
        return b, {"y": out}

    b16, o16 = build(mctx, "float16")
    g = b16.build_sync(o16)
    names = [n for n in g.kernel_names if "pack_float16" not in n]  # f32 mode: edge conversions
    g.destroy()
    tag = {"bn_relu": "_bn_", "scaled_add": "_scaled_", "depthwise": "_dw_"}[kind]
    assert not FUSION or (len(names) == 1 and tag in names[0]), names
    b16, o16 = build(mctx, "float16")
    got = run_graph(mctx, o16, {"x": x}, b16)["y"]
    b32, o32 = build(mctx, "float32")
    want = run_graph(mctx, o32, {"x": x.astype(np.float32)}, b32)["y"]
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
