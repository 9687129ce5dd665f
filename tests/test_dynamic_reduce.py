"""Dynamic dimensions in the reductions, softmax, normalizations and scans (reduce.py,
normalization.py, scan.py): one build per graph, run at several sizes (1, the maximum, odd
sizes), against numpy and bit for bit against a static build of the same graph at each size.

The dynamic kernels take the shape the static build at the same sizes takes (one thread or one
workgroup per output, the two-level split), decided at dispatch where the bounds do not decide it,
so results are identical, not merely close; the sizes below cross those thresholds (K = 32 / 256,
M = 256 / 16384, K = 4096 for the split)."""

import numpy as np
import pytest
from helpers import FUSION

import mltensor
from mltensor import MLDynamicDimension as D
from mltensor import dtypes

R = np.random.default_rng(7)


def _random(shape, data_type):
    if data_type in ("float32", "float16"):
        return R.standard_normal(shape).astype(dtypes.NUMPY[data_type])
    return R.integers(-50, 50, shape).astype(dtypes.NUMPY[data_type])


def _build(ctx, specs, fn):
    """specs: {name: (data type, shape)} of the inputs; fn(builder, *inputs) -> output operand."""
    b = mltensor.MLGraphBuilder(ctx)
    xs = [b.input(n, data_type=dt, shape=s) for n, (dt, s) in specs.items()]
    return b.build_sync({"y": fn(b, *xs)})


def _run(ctx, g, arrays):
    ins = {}
    for n, a in arrays.items():
        t = ctx.create_tensor_sync(data_type=dtypes.normalize(a.dtype, "test"), shape=a.shape, writable=True)
        ctx.write_tensor(t, a)
        ins[n] = t
    shape = g.compute_shapes({n: list(a.shape) for n, a in arrays.items()})["y"]
    out = ctx.create_tensor_sync(data_type=g.output_descriptors["y"][0], shape=shape, readable=True)
    ctx.dispatch(g, ins, {"y": out})
    r = ctx.read_tensor_sync(out)
    for t in [*ins.values(), out]:
        t.destroy()
    return r


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64, 1: np.uint8}[a.itemsize])


def check(ctx, specs, fn, sizes, ref, rtol=1e-5, atol=1e-5):
    """Build fn over inputs with dynamic dimensions once; for each {dimension: size} in sizes, run
    it on random inputs and compare with ref(*arrays) (numpy, float64 where it accumulates) and
    bit for bit with a static build at those sizes. Returns the dynamic graph's kernel names."""
    g = _build(ctx, specs, fn)
    assert g.dynamic_dimensions
    for values in sizes:
        shapes = {n: [values[d.name] if hasattr(d, "max_size") else d for d in s] for n, (_, s) in specs.items()}
        arrays = {n: _random(shapes[n], dt) for n, (dt, _) in specs.items()}
        got = _run(ctx, g, arrays)
        want = np.asarray(ref(*arrays.values()))
        assert got.shape == want.shape, (values, got.shape, want.shape)
        if got.dtype.kind == "f":
            np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol, err_msg=str(values))
        else:
            np.testing.assert_array_equal(got, want, err_msg=str(values))
        gs = _build(ctx, {n: (dt, shapes[n]) for n, (dt, _) in specs.items()}, fn)
        static = _run(ctx, gs, arrays)
        gs.destroy()
        assert np.array_equal(_bits(got), _bits(static)), (values, np.abs(got.astype(np.float64) - static).max())
    names = g.kernel_names
    g.destroy()
    return names


def _f64(a):
    return a.astype(np.float64)


# -- reductions ---------------------------------------------------------------------------------


def _lse(a, axis, keepdims):
    a = _f64(a)
    m = a.max(axis=axis, keepdims=True)
    r = np.log(np.exp(a - m).sum(axis=axis, keepdims=True)) + m
    return r if keepdims else np.squeeze(r, axis=axis)


REF = {
    "reduce_sum": lambda a, ax, k: _f64(a).sum(axis=ax, keepdims=k),
    "reduce_mean": lambda a, ax, k: _f64(a).mean(axis=ax, keepdims=k),
    "reduce_max": lambda a, ax, k: a.max(axis=ax, keepdims=k),
    "reduce_min": lambda a, ax, k: a.min(axis=ax, keepdims=k),
    "reduce_l2": lambda a, ax, k: np.sqrt((_f64(a) ** 2).sum(axis=ax, keepdims=k)),
    "reduce_log_sum_exp": _lse,
}


@pytest.mark.parametrize("op", sorted(REF))
def test_reduce_dynamic_axis(ctx, op):
    """Reduced axis and kept axis both dynamic: thread (K <= 32), group and split kernels by size."""
    specs = {"x": ("float32", [D("m", 300), D("k", 9000)])}
    sizes = [{"m": 1, "k": 1}, {"m": 7, "k": 33}, {"m": 3, "k": 5000}, {"m": 300, "k": 9000}, {"m": 257, "k": 7}]
    names = check(
        ctx,
        specs,
        lambda b, x: getattr(b, op)(x, axes=[1]),
        sizes,
        lambda a: REF[op](a, 1, False),
        rtol=1e-4,
        atol=1e-4,
    )
    assert [n.rsplit("_", 1)[-1] for n in names] == ["partialN", "finalN"], names


@pytest.mark.parametrize("op", sorted(REF))
@pytest.mark.parametrize("keep", [False, True])
def test_reduce_static_axis_dynamic_outer(ctx, op, keep):
    """A static reduced axis with dynamic outer dimensions (batch, sequence), the reduced axis in
    the middle: strides and the output count are read at dispatch."""
    specs = {"x": ("float32", [D("batch", 3), 40, D("seq", 33)])}
    sizes = [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 33}, {"batch": 2, "seq": 7}]
    check(
        ctx,
        specs,
        lambda b, x: getattr(b, op)(x, axes=[1], keep_dimensions=keep),
        sizes,
        lambda a: REF[op](a, 1, keep),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.parametrize("keep", [False, True])
def test_reduce_several_dynamic_axes(ctx, keep):
    specs = {"x": ("float32", [D("batch", 4), 5, D("seq", 257)])}
    sizes = [{"batch": 1, "seq": 1}, {"batch": 4, "seq": 257}, {"batch": 3, "seq": 7}]
    check(
        ctx,
        specs,
        lambda b, x: b.reduce_sum(x, axes=[0, 2], keep_dimensions=keep),
        sizes,
        lambda a: _f64(a).sum(axis=(0, 2), keepdims=keep),
        rtol=1e-4,
        atol=1e-4,
    )
    check(
        ctx, specs, lambda b, x: b.reduce_max(x, keep_dimensions=keep), sizes, lambda a: a.max(axis=None, keepdims=keep)
    )


def test_reduce_many_outputs_threshold(ctx, monkeypatch):
    """K = 100 static, M dynamic across MANY_OUTPUTS (16384): one workgroup per output below it,
    one thread per output from it on, in one kernel. (The GPUs' rule: a CPU adapter takes a thread
    per output up to CPU_THREAD_MAX_K whatever M, so that is lowered to the GPUs' bound here.)"""
    from mltensor.ops import reduce as reduce_mod

    monkeypatch.setattr(reduce_mod, "CPU_THREAD_MAX_K", reduce_mod.THREAD_MAX_K)
    specs = {"x": ("float32", [D("rows", 16500), 100])}
    sizes = [{"rows": 1}, {"rows": 16384}, {"rows": 257}]
    names = check(
        ctx, specs, lambda b, x: b.reduce_mean(x, axes=[1]), sizes, lambda a: _f64(a).mean(axis=1), rtol=1e-5, atol=1e-6
    )
    assert len(names) == 1 and "auto_group" in names[0], names


def test_reduce_integers(ctx):
    specs = {"x": ("int32", [D("m", 9), D("k", 300)])}
    sizes = [{"m": 1, "k": 1}, {"m": 9, "k": 300}, {"m": 7, "k": 33}]
    check(ctx, specs, lambda b, x: b.reduce_sum(x, axes=[1]), sizes, lambda a: a.sum(axis=1, dtype=np.int32))
    check(ctx, specs, lambda b, x: b.reduce_min(x, axes=[0]), sizes, lambda a: a.min(axis=0))


# -- softmax ------------------------------------------------------------------------------------


def _softmax(a, axis):
    a = _f64(a)
    e = np.exp(a - a.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_dynamic_last_axis(ctx):
    """Attention scores [batch, heads, query, key]: query and key lengths dynamic (past the
    thread-per-row bound of GPUs, 32, and of CPU adapters, 1024: the choice made at dispatch)."""
    specs = {"x": ("float32", [D("batch", 2), 3, D("q", 33), D("k", 1300)])}
    sizes = [
        {"batch": 1, "q": 1, "k": 1},
        {"batch": 2, "q": 33, "k": 300},
        {"batch": 1, "q": 5, "k": 1300},
        {"batch": 1, "q": 7, "k": 257},
        {"batch": 2, "q": 1, "k": 33},
    ]
    names = check(ctx, specs, lambda b, x: b.softmax(x, 3), sizes, lambda a: _softmax(a, 3), rtol=1e-5, atol=1e-6)
    assert len(names) == 1 and "auto" in names[0], names


def test_softmax_static_axis_dynamic_rows(ctx):
    specs = {"x": ("float32", [D("rows", 40), 7, 5])}
    sizes = [{"rows": 1}, {"rows": 40}, {"rows": 33}]
    check(ctx, specs, lambda b, x: b.softmax(x, 1), sizes, lambda a: _softmax(a, 1), rtol=1e-5, atol=1e-6)


# -- normalizations -----------------------------------------------------------------------------


def _layer(a, axes, scale=None, bias=None, eps=1e-5):
    a = _f64(a)
    m = a.mean(axis=axes, keepdims=True)
    v = ((a - m) ** 2).mean(axis=axes, keepdims=True)
    r = (a - m) / np.sqrt(v + eps)
    if scale is not None:
        r = r * scale
    if bias is not None:
        r = r + bias
    return r


def test_layer_normalization_last_axis(ctx):
    """A transformer's layer normalization: [batch, seq, hidden] with batch and seq dynamic, scale
    and bias constants, and a fused activation after it."""
    h = 96
    scale = R.uniform(0.5, 1.5, h).astype(np.float32)
    bias = R.standard_normal(h).astype(np.float32)
    specs = {"x": ("float32", [D("batch", 3), D("seq", 257), h])}

    def fn(b, x):
        return b.relu(b.layer_normalization(x, axes=[2], scale=b.constant(scale), bias=b.constant(bias)))

    sizes = [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 257}, {"batch": 2, "seq": 7}, {"batch": 1, "seq": 33}]
    names = check(ctx, specs, fn, sizes, lambda a: np.maximum(_layer(a, (2,), scale, bias), 0), rtol=1e-4, atol=1e-4)
    if FUSION:
        assert len(names) == 1, names


def test_layer_normalization_two_axes(ctx):
    """Over [seq, hidden] with seq dynamic (the reduced count is read at dispatch), and over the
    last axis when it is the dynamic one (thread or workgroup per row by size)."""
    specs = {"x": ("float32", [D("batch", 5), D("seq", 300), 8])}
    sizes = [{"batch": 1, "seq": 1}, {"batch": 5, "seq": 300}, {"batch": 3, "seq": 3}, {"batch": 2, "seq": 33}]
    check(
        ctx,
        specs,
        lambda b, x: b.layer_normalization(x, axes=[1, 2]),
        sizes,
        lambda a: _layer(a, (1, 2)),
        rtol=1e-4,
        atol=1e-4,
    )
    specs = {"x": ("float32", [D("rows", 40), D("hidden", 300)])}
    sizes = [
        {"rows": 1, "hidden": 1},
        {"rows": 40, "hidden": 300},
        {"rows": 7, "hidden": 33},
        {"rows": 33, "hidden": 7},
    ]
    check(
        ctx,
        specs,
        lambda b, x: b.layer_normalization(x, axes=[1]),
        sizes,
        lambda a: _layer(a, (1,)),
        rtol=1e-4,
        atol=1e-4,
    )


def test_layer_normalization_dynamic_parameters(ctx):
    """Scale and bias given as inputs whose shape is the dynamic normalized axis."""
    specs = {"x": ("float32", [4, D("n", 70)]), "s": ("float32", [D("n", 70)]), "t": ("float32", [D("n", 70)])}
    sizes = [{"n": 1}, {"n": 70}, {"n": 33}]
    check(
        ctx,
        specs,
        lambda b, x, s, t: b.layer_normalization(x, axes=[1], scale=s, bias=t),
        sizes,
        lambda a, s, t: _layer(a, (1,), s, t),
        rtol=1e-4,
        atol=1e-4,
    )


def test_instance_normalization(ctx):
    c = 3
    scale = R.uniform(0.5, 1.5, c).astype(np.float32)
    bias = R.standard_normal(c).astype(np.float32)

    def ref_nchw(a):
        return _layer(a, (2, 3), scale.reshape(1, c, 1, 1), bias.reshape(1, c, 1, 1))

    specs = {"x": ("float32", [D("batch", 2), c, D("h", 33), D("w", 9)])}
    sizes = [{"batch": 1, "h": 1, "w": 1}, {"batch": 2, "h": 33, "w": 9}, {"batch": 1, "h": 7, "w": 5}]
    check(
        ctx,
        specs,
        lambda b, x: b.instance_normalization(x, scale=b.constant(scale), bias=b.constant(bias)),
        sizes,
        ref_nchw,
        rtol=1e-4,
        atol=1e-4,
    )
    specs = {"x": ("float32", [D("batch", 2), D("h", 7), 5, c])}
    sizes = [{"batch": 1, "h": 1}, {"batch": 2, "h": 7}]
    check(
        ctx,
        specs,
        lambda b, x: b.instance_normalization(x, scale=b.constant(scale), layout="nhwc"),
        sizes,
        lambda a: _layer(a, (1, 2), scale),
        rtol=1e-4,
        atol=1e-4,
    )


def test_batch_normalization(ctx):
    c = 4
    mean = R.standard_normal(c).astype(np.float32)
    var = R.uniform(0.5, 2, c).astype(np.float32)
    scale = R.uniform(0.5, 1.5, c).astype(np.float32)
    bias = R.standard_normal(c).astype(np.float32)

    def fn(axis):
        return lambda b, x: b.batch_normalization(
            x, b.constant(mean), b.constant(var), scale=b.constant(scale), bias=b.constant(bias), axis=axis
        )

    def ref(axis):
        def r(a):
            sh = [1] * a.ndim
            sh[axis] = c
            m, v, s, t = (p.reshape(sh).astype(np.float64) for p in (mean, var, scale, bias))
            return (_f64(a) - m) / np.sqrt(v + 1e-5) * s + t

        return r

    specs = {"x": ("float32", [D("batch", 3), c, D("h", 33), 5])}
    sizes = [{"batch": 1, "h": 1}, {"batch": 3, "h": 33}, {"batch": 2, "h": 7}]
    check(ctx, specs, fn(1), sizes, ref(1), rtol=1e-5, atol=1e-5)
    specs = {"x": ("float32", [D("rows", 257), c])}
    check(ctx, specs, fn(1), [{"rows": 1}, {"rows": 257}], ref(1), rtol=1e-5, atol=1e-5)


# -- arg_min / arg_max, cumulative_sum ----------------------------------------------------------


@pytest.mark.parametrize("op", ["arg_max", "arg_min"])
def test_arg_dynamic_axis(ctx, op):
    """Greedy decoding's arg_max over a dynamic vocabulary axis, with dynamic rows."""
    specs = {"x": ("float32", [D("rows", 5), D("vocab", 257)])}
    sizes = [{"rows": 1, "vocab": 1}, {"rows": 5, "vocab": 257}, {"rows": 3, "vocab": 33}]
    npf = np.argmax if op == "arg_max" else np.argmin
    check(ctx, specs, lambda b, x: getattr(b, op)(x, 1), sizes, lambda a: npf(a, axis=1).astype(np.int32))
    specs = {"x": ("int32", [2, D("seq", 33), 3])}
    check(
        ctx,
        specs,
        lambda b, x: getattr(b, op)(x, 1, keep_dimensions=True, output_data_type="int64"),
        [{"seq": 1}, {"seq": 33}, {"seq": 7}],
        lambda a: npf(a, axis=1)[:, None, :].astype(np.int64),
    )


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("rev", [False, True])
def test_cumulative_sum(ctx, exclusive, rev):
    def ref(a, axis=1):
        a = _f64(a)
        if rev:
            a = np.flip(a, axis)
        r = np.cumsum(a, axis)
        if exclusive:
            r = r - a
        return np.flip(r, axis) if rev else r

    specs = {"x": ("float32", [D("batch", 3), D("seq", 257), 2])}
    sizes = [{"batch": 1, "seq": 1}, {"batch": 3, "seq": 257}, {"batch": 2, "seq": 7}]
    check(
        ctx,
        specs,
        lambda b, x: b.cumulative_sum(x, 1, exclusive=exclusive, reversed=rev),
        sizes,
        ref,
        rtol=1e-4,
        atol=1e-4,
    )


# -- float16 ------------------------------------------------------------------------------------


def test_float16(ctx):
    """f16 values loaded through f32 accumulators (or f32 throughout without shader-f16)."""
    tol = dict(rtol=1e-2, atol=1e-2)
    specs = {"x": ("float16", [D("m", 9), D("k", 5000)])}
    sizes = [{"m": 1, "k": 1}, {"m": 2, "k": 5000}, {"m": 9, "k": 33}]
    check(ctx, specs, lambda b, x: b.reduce_sum(x, axes=[1]), sizes, lambda a: _f64(a).sum(axis=1), rtol=1e-2, atol=0.5)
    check(ctx, specs, lambda b, x: b.reduce_log_sum_exp(x, axes=[1]), sizes, lambda a: _lse(a, 1, False), **tol)
    check(ctx, specs, lambda b, x: b.softmax(x, 1), sizes, lambda a: _softmax(a, 1), **tol)
    check(ctx, specs, lambda b, x: b.layer_normalization(x, axes=[1]), sizes, lambda a: _layer(a, (1,)), **tol)
    check(ctx, specs, lambda b, x: b.arg_max(x, 1), sizes, lambda a: np.argmax(a, axis=1).astype(np.int32))
    check(
        ctx,
        {"x": ("float16", [D("m", 9), D("k", 300)])},
        lambda b, x: b.cumulative_sum(x, 1),
        [{"m": 1, "k": 1}, {"m": 9, "k": 300}],
        lambda a: np.cumsum(_f64(a), 1),
        rtol=1e-2,
        atol=0.1,
    )


# -- errors -------------------------------------------------------------------------------------


def test_size_out_of_range_raises_at_dispatch(ctx):
    g = _build(ctx, {"x": ("float32", [D("rows", 8), D("k", 16)])}, lambda b, x: b.softmax(x, 1))
    for shape in ([9, 16], [8, 17]):
        x = ctx.create_tensor_sync(data_type="float32", shape=shape, writable=True)
        y = ctx.create_tensor_sync(data_type="float32", shape=shape, readable=True)
        with pytest.raises(TypeError, match="outside"):
            ctx.dispatch(g, {"x": x}, {"y": y})
        x.destroy()
        y.destroy()
    g.destroy()


def test_static_graphs_unchanged(ctx):
    """A static build has no immediate sizes: its kernels are the same constants-only WGSL."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, 300])
    g = b.build_sync(
        {
            "a": b.reduce_sum(x, axes=[1]),
            "b": b.softmax(x, 1),
            "c": b.layer_normalization(x),
            "d": b.cumulative_sum(x, 1),
        }
    )
    assert not g.dynamic_dimensions
    assert not any("auto" in n or n.endswith("N") for n in g.kernel_names), g.kernel_names
    g.destroy()


def test_parameter_sizes_checked_at_dispatch(ctx):
    """A static scale for a dynamic normalized axis (or parameters with another dimension name)
    must match at dispatch: TypeError there when they do not, never an out-of-bounds read."""
    scale = R.uniform(0.5, 1.5, 70).astype(np.float32)
    specs = {"x": ("float32", [3, D("n", 100)])}
    g = _build(ctx, specs, lambda b, x: b.layer_normalization(x, axes=[1], scale=b.constant(scale)))
    a = _random([3, 70], "float32")
    np.testing.assert_allclose(_run(ctx, g, {"x": a}), _layer(a, (1,), scale), rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match="scale shape"):
        _run(ctx, g, {"x": _random([3, 33], "float32")})
    g.destroy()
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[3, D("n", 100)])
    with pytest.raises(TypeError, match="scale shape"):
        b.layer_normalization(x, axes=[1], scale=b.constant(np.ones(101, np.float32)))


def test_dispatch_time_decisions_match_static():
    """thread_flag and split_plan, evaluated for given sizes, are the static decisions
    (reduce_shape and the chunking of the two-level scheme), derived sizes (past + 1) included."""
    from mltensor.dynamic.dims import Sym, evaluate
    from mltensor.ops.reduce import reduce_shape, split_plan, thread_flag

    m, k = Sym.dim("m", 20000), Sym.dim("k", 5_000_000)
    pairs = [
        (mv, kv)
        for mv in (1, 2, 255, 256, 257, 16383, 16384, 20000)
        for kv in (1, 32, 33, 256, 257, 4096, 4097, 12289, 70000, 4_194_304, 5_000_000)
    ]
    for M, K in ((m, k), (m + 1, k), (m, 2 * k + 3)):
        thr, (S, chunk) = thread_flag(M, K), split_plan(M, K)
        for mv, kv in pairs:
            v = {"m": mv, "k": kv}
            sm, sk = evaluate(M, v), evaluate(K, v)
            kind, s = reduce_shape(sm, sk)
            assert evaluate(thr, v) == (kind == "thread"), (sm, sk)
            if kind == "split":
                c = -(-sk // s)
                assert (evaluate(S, v), evaluate(chunk, v)) == (-(-sk // c), c), (sm, sk)
            elif kind == "group":
                assert (evaluate(S, v), evaluate(chunk, v)) == (1, sk), (sm, sk)


def test_workgroup_limit_named_at_build():
    from mltensor import NotSupportedError
    from mltensor.dynamic.dims import Sym
    from mltensor.ops.reduce import groups

    with pytest.raises(NotSupportedError, match=r"\[reduce_sum\]"):
        groups("reduce_sum", Sym.dim("a", 1 << 20) * Sym.dim("b", 1 << 20))
    assert groups("reduce_sum", Sym.dim("a", 1 << 20)).n == Sym.dim("a", 1 << 20)
