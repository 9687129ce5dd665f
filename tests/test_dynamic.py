"""Dynamic dimensions, the core (mltensor/dynamic/): builder inputs with MLDynamicDimension, size
expressions, deferred checks, compute_shapes, resizable tensors, dispatch-time validation.
Operator families have their own files (test_dynamic_<family>.py)."""

import numpy as np
import pytest

import mltensor
from mltensor import MLDynamicDimension as D
from mltensor import NotSupportedError
from mltensor.dynamic.dims import Sym, cdiv, exact_div, hoisting, untag, wgsl

from helpers import assert_exact


def test_size_expressions_are_canonical():
    p, s = Sym.dim("past", 100), Sym.dim("seq", 10)
    assert p + s == s + p and (p + 1) - 1 == p and p - p == 0
    assert 2 * (p + s) == 2 * p + 2 * s
    assert exact_div(768 * p * s, 12 * s) == 64 * p and exact_div(p + 1, 2) is None
    assert ((p + s) * 64).hi == 110 * 64 and (p - s).lo == 1 - 10
    assert (p + s).eval({"past": 3, "seq": 4}) == 7 and cdiv(s * 3, 2).eval({"seq": 5}) == 8
    assert -(-(s * 768) // 256) == 3 * s  # the ceiling idiom lowerings use
    assert p + 1 > p and p >= 1
    with pytest.raises(TypeError, match="depends on the sizes"):
        p > s
    with pytest.raises(TypeError, match="no value before dispatch"):
        range(p)
    # a lowering's rendering marks an expression for the kernel's (a derived field, else inline)
    assert untag(wgsl(p * 2 + 1), None) == "(2u * dims.d_past + 1u)" and wgsl(5) == "5u"
    assert wgsl(p * 2 + 1) == "\x01(2u * dims.d_past + 1u)\x02" and wgsl(p) == "(dims.d_past)"
    with hoisting(4) as h:
        assert wgsl(p * 2 + 1) == "dims.s0" and wgsl(p) == "(dims.d_past)" and wgsl(s + p * 2 + 1) == "dims.s1"
        assert untag(f"x < {wgsl(p + s)}", None) == "x < dims.s2" and untag(wgsl(p * 2 + 1), h) == "dims.s0"
    assert h.syms == (p * 2 + 1, s + p * 2 + 1, p + s)
    with hoisting(2) as h:  # a common factor stays in the text (16 | the stride: the compiler knows it)
        assert wgsl(16 * ((p - 1) // 2) + 16) == "(16u * dims.s0)" and wgsl(32 * p) == "(32u * dims.d_past)"
    assert h.syms == ((p - 1) // 2 + 1,)
    with hoisting(0) as h:  # no room: inline, as without
        assert wgsl(p * 2 + 1) == "(2u * dims.d_past + 1u)" and h.syms == ()


def test_input_with_dynamic_dimensions(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("batch", 4), 3, {"name": "seq", "max_size": 16}])
    assert x.shape[1] == 3 and x.shape[0].name == "batch" and x.shape[2].max_size == 16
    assert x.dynamic
    y = b.input("y", data_type="float32", shape=[D("seq", 16)])
    assert y.shape[0] == x.shape[2]  # one name, one dimension
    with pytest.raises(TypeError, match="max_size 16 elsewhere"):
        b.input("z", data_type="float32", shape=[D("seq", 8)])
    with pytest.raises(TypeError, match="max_size"):
        D("n", 0)
    with pytest.raises(TypeError, match="byte length"):
        b.input("big", data_type="float32", shape=[D("n", 2**31), 1024])


def test_one_build_every_size_elementwise(ctx, rng):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("batch", 8), 3, D("seq", 100)])
    bias = np.arange(3, dtype=np.float32).reshape(3, 1)
    g = b.build_sync({"y": b.relu(b.add(b.mul(x, x), b.constant(bias)))})
    assert g.dynamic_dimensions == {"batch": 8, "seq": 100}
    for bs, sq in [(1, 1), (8, 100), (3, 33), (2, 7)]:
        a = rng.standard_normal((bs, 3, sq)).astype(np.float32)
        assert g.compute_shapes({"x": [bs, 3, sq]}) == {"y": (bs, 3, sq)}
        tx = ctx.create_tensor_sync(data_type="float32", shape=a.shape, writable=True)
        ty = ctx.create_tensor_sync(data_type="float32", shape=a.shape, readable=True)
        ctx.write_tensor(tx, a)
        ctx.dispatch(g, {"x": tx}, {"y": ty})
        assert_exact(ctx.read_tensor_sync(ty), np.maximum(a * a + bias, 0))


def test_dispatch_checks_sizes(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("n", 8), 4])
    w = b.input("w", data_type="float32", shape=[D("n", 8), 4])
    g = b.build_sync({"y": b.add(x, w)})

    def t(*shape, **kw):
        return ctx.create_tensor_sync(data_type="float32", shape=list(shape), **kw)

    with pytest.raises(TypeError, match=r"dimension 'n' is 9, outside \[1, 8\]"):
        ctx.dispatch(g, {"x": t(9, 4), "w": t(9, 4)}, {"y": t(9, 4, readable=True)})
    with pytest.raises(TypeError, match=r"dimension 'n' is 3 here and 2 elsewhere"):
        ctx.dispatch(g, {"x": t(2, 4), "w": t(3, 4)}, {"y": t(2, 4, readable=True)})
    with pytest.raises(TypeError, match=r"must have shape"):
        ctx.dispatch(g, {"x": t(2, 5), "w": t(2, 5)}, {"y": t(2, 5, readable=True)})
    with pytest.raises(TypeError, match=r"output 'y' must be float32 \[2, 4\]"):
        ctx.dispatch(g, {"x": t(2, 4), "w": t(2, 4)}, {"y": t(3, 4, readable=True)})
    with pytest.raises(TypeError, match="compute_shapes"):
        g.compute_shapes({"x": [2, 4]})


def test_resizable_tensors(ctx):
    """A tensor with dynamic dimensions is sized for their maximum; writes of an array and
    dispatches writing it set its shape, so one tensor serves every size (a decode loop)."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, D("seq", 50)])
    g = b.build_sync({"y": b.mul(x, b.constant(np.float32(2)))})
    tx = ctx.create_tensor_sync(data_type="float32", shape=[1, D("seq", 50)], writable=True)
    ty = ctx.create_tensor_sync(data_type="float32", shape=g.output_descriptors["y"][1], readable=True)
    assert tx.shape == (1, 50) and tx.max_shape[1].max_size == 50
    alive = ctx.counters["tensors_alive"]
    for n in (5, 50, 1, 17):
        a = np.arange(n, dtype=np.float32).reshape(1, n)
        ctx.write_tensor(tx, a)
        assert tx.shape == (1, n)
        ctx.dispatch(g, {"x": tx}, {"y": ty})
        assert ty.shape == (1, n)
        assert_exact(ctx.read_tensor_sync(ty), 2 * a)
    assert ctx.counters["tensors_alive"] == alive
    with pytest.raises(TypeError, match="outside"):
        ctx.write_tensor(tx, np.zeros((1, 51), np.float32))
    with pytest.raises(TypeError, match="must have shape"):
        ctx.write_tensor(tx, np.zeros((2, 5), np.float32))


def test_read_keeps_the_shape_at_the_call(ctx):
    """A read started before a dispatch resizes the tensor returns the earlier shape's data."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("n", 64)])
    g = b.build_sync({"y": b.add(x, b.constant(np.float32(1)))})
    tx = ctx.create_tensor_sync(data_type="float32", shape=[D("n", 64)], writable=True, readable=True)
    ty = ctx.create_tensor_sync(data_type="float32", shape=[D("n", 64)], readable=True)
    ctx.write_tensor(tx, np.arange(3, dtype=np.float32))
    ctx.dispatch(g, {"x": tx}, {"y": ty})
    import asyncio

    async def go():
        first = ctx.read_tensor_async(ty)
        ctx.write_tensor(tx, np.arange(7, dtype=np.float32))
        ctx.dispatch(g, {"x": tx}, {"y": ty})
        return await first, await ctx.read_tensor_async(ty)

    a, c = asyncio.run(go())
    assert_exact(a, np.arange(3, dtype=np.float32) + 1)
    assert_exact(c, np.arange(7, dtype=np.float32) + 1)


def test_refused_dynamic_dimensions_name_the_operator(ctx):
    """What cannot be dynamic raises NotSupportedError at build, naming the operator: a recurrent
    network's steps (unrolled at build); static operands are unaffected in the same builder."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("steps", 8), 1, 4])
    w = b.constant(np.ones((1, 12, 4), np.float32))
    r = b.constant(np.ones((1, 12, 4), np.float32))
    with pytest.raises(NotSupportedError, match=r"\[gru\].*steps"):
        b.gru(x, w, r, 8, 4)
    s = b.input("s", data_type="float32", shape=[8, 1, 4])
    assert b.gru(s, w, r, 8, 4)[0].shape == (1, 1, 4)


def test_deferred_check_raises_at_dispatch(ctx):
    """A size that is positive only for some inputs (past - seq) is checked by each dispatch."""
    b = mltensor.MLGraphBuilder(ctx)
    p = b.input("p", data_type="float32", shape=[D("past", 16)])
    s = b.input("s", data_type="float32", shape=[D("seq", 16)])
    r = b._range(p, 0, 1, p.shape[0] - s.shape[0], "int32")
    g = b.build_sync({"r": r})
    tp = ctx.create_tensor_sync(data_type="float32", shape=[5], writable=True)
    ts = ctx.create_tensor_sync(data_type="float32", shape=[2], writable=True)
    tr = ctx.create_tensor_sync(data_type="int32", shape=[3], readable=True)
    ctx.dispatch(g, {"p": tp, "s": ts}, {"r": tr})
    assert_exact(ctx.read_tensor_sync(tr), np.arange(3, dtype=np.int32))
    with pytest.raises(TypeError, match=r"\[_range\] output dimension past - seq is 0"):
        ctx.dispatch(g, {"p": ts, "s": ts}, {"r": tr})


def test_static_graphs_unchanged(ctx):
    """A graph without dynamic dimensions reads no sizes at dispatch (every size a constant)."""
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[2, 3])
    g = b.build_sync({"y": b.relu(x)})
    assert g._dyn is None and g.dynamic_dimensions == {}
    assert g.compute_shapes({"x": [2, 3]}) == {"y": (2, 3)}
    with pytest.raises(TypeError, match="must have shape"):
        g.compute_shapes({"x": [3, 3]})


def test_broadcasting_unifies_dynamic_dimensions(ctx):
    """Two different dynamic sizes (or one against a static size) broadcast as equal; each
    dispatch checks that they are (an attention mask of `total` against scores of past + seq)."""
    b = mltensor.MLGraphBuilder(ctx)
    m = b.input("mask", data_type="float32", shape=[D("total", 16)])
    p = b.input("p", data_type="float32", shape=[2, D("past", 8)])
    s = b.input("s", data_type="float32", shape=[2, D("seq", 8)])
    scores = b.concat([p, s], 1)  # [2, past + seq]
    g = b.build_sync({"y": b.add(scores, m)})

    def run(past, seq, total):
        t = {
            n: ctx.create_tensor_sync(data_type="float32", shape=sh, writable=True)
            for n, sh in (("mask", [total]), ("p", [2, past]), ("s", [2, seq]))
        }
        vals = {n: np.arange(np.prod(x.shape), dtype=np.float32).reshape(x.shape) for n, x in t.items()}
        for n, x in t.items():
            ctx.write_tensor(x, vals[n])
        out = ctx.create_tensor_sync(data_type="float32", shape=[2, past + seq], readable=True)
        ctx.dispatch(g, t, {"y": out})
        want = np.concatenate([vals["p"], vals["s"]], 1) + vals["mask"]
        assert_exact(ctx.read_tensor_sync(out), want)

    run(3, 2, 5)
    run(1, 7, 8)
    with pytest.raises(TypeError, match=r"\[add\] broadcast dimensions .* must be equal"):
        run(3, 2, 4)
    with pytest.raises(TypeError, match="not broadcastable"):
        b2 = mltensor.MLGraphBuilder(ctx)
        x = b2.input("x", data_type="float32", shape=[D("n", 4)])
        b2.add(x, b2.constant(np.zeros(9, np.float32)))  # n can never be 9
