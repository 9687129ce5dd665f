"""Copy-free concat (issue 15): producers write straight into their slice of the concat output.
Checked against numpy, and for the launch counts against MLTENSOR_NO_FUSION=1 builds."""

import os

import numpy as np

import mltensor

# counts are checked with fusion on; under MLTENSOR_NO_FUSION=1 only the values are
FUSION = os.environ.get("MLTENSOR_NO_FUSION", "") in ("", "0")


def _build(ctx, fn, shapes):
    b = mltensor.MLGraphBuilder(ctx)
    xs = [b.input(f"x{i}", data_type="float32", shape=list(s)) for i, s in enumerate(shapes)]
    return b, b.build_sync({"y": fn(b, *xs)})


def _run(ctx, g, arrays):
    ins = {}
    for i, a in enumerate(arrays):
        t = ctx.create_tensor_sync(data_type="float32", shape=list(a.shape), writable=True)
        ctx.write_tensor(t, a)
        ins[f"x{i}"] = t
    dt, shape = g.output_descriptors["y"]
    out = ctx.create_tensor_sync(data_type=dt, shape=list(shape), readable=True)
    ctx.dispatch(g, ins, {"y": out})
    return ctx.read_tensor_sync(out)


def _concat_kernels(g):
    return sum("concat" in k for k in g.kernel_names)


def test_channel_concat_of_computed_values_launches_no_copy(ctx, rng):
    """NCHW channel concat of three relu/sigmoid results, then a consumer (so the concat is an
    intermediate): the producers write into their slabs; values as numpy."""
    shape = (1, 8, 4, 4)
    a, c = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)

    def f(b, x0, x1):
        cat = b.concat([b.relu(x0), b.sigmoid(x1), b.tanh(x0)], 1)
        return b.mul(cat, b.constant(data_type="float32", value=2.0))

    _, g = _build(ctx, f, [shape, shape])
    assert not FUSION or _concat_kernels(g) == 0, g.kernel_names
    want = 2 * np.concatenate([np.maximum(a, 0), 1 / (1 + np.exp(-c)), np.tanh(a)], 1)
    np.testing.assert_allclose(_run(ctx, g, [a, c]), want, rtol=1e-5, atol=1e-6)


def test_nested_concats_dense_block(ctx, rng):
    """densenet's pattern: x1 = concat(x0, f(x0)), x2 = concat(x1, f(x1)), ... every value lives
    inside the last concat; the reads of earlier slabs still see the right data."""
    shape = (1, 4, 4, 4)
    a = rng.standard_normal(shape).astype(np.float32)

    def f(b, x):
        x = b.relu(x)
        for k in range(4):
            x = b.concat([x, b.sigmoid(b.reduce_mean(x, axes=[1], keep_dimensions=True))], 1)
        return b.relu(x)

    _, g = _build(ctx, f, [shape])
    assert not FUSION or _concat_kernels(g) == 0, g.kernel_names
    x = np.maximum(a, 0)
    for _ in range(4):
        x = np.concatenate([x, 1 / (1 + np.exp(-x.mean(1, keepdims=True)))], 1)
    np.testing.assert_allclose(_run(ctx, g, [a]), np.maximum(x, 0), rtol=1e-5, atol=1e-6)


def test_concat_of_inputs_and_same_value_twice_still_copies(ctx, rng):
    """Caller's tensors cannot be moved into the output, and one value cannot live in two
    slabs: those slabs are still copied, and the result is right."""
    shape = (1, 3, 2, 5)
    a = rng.standard_normal(shape).astype(np.float32)

    def f(b, x):
        r = b.relu(x)
        return b.concat([x, r, r], 1)

    _, g = _build(ctx, f, [shape])
    assert not FUSION or _concat_kernels(g) >= 2, g.kernel_names
    np.testing.assert_allclose(_run(ctx, g, [a]), np.concatenate([a, np.maximum(a, 0), np.maximum(a, 0)], 1))


def test_concat_slab_read_and_written_by_one_kernel_is_not_placed(ctx, rng):
    """y = concat(x0r, add(x0r, x0r)): the add would read one slab of a buffer and write another
    (a WebGPU usage conflict), so that placement is undone; values as numpy."""
    shape = (1, 2, 8, 8)
    a = rng.standard_normal(shape).astype(np.float32)

    def f(b, x):
        r = b.relu(x)
        return b.sigmoid(b.concat([r, b.mul(r, b.constant(data_type="float32", value=3.0))], 1))

    _, g = _build(ctx, f, [shape])
    r = np.maximum(a, 0)
    want = 1 / (1 + np.exp(-np.concatenate([r, 3 * r], 1)))
    np.testing.assert_allclose(_run(ctx, g, [a]), want, rtol=1e-5, atol=1e-6)


def test_no_fusion_keeps_the_copies(ctx, rng, monkeypatch):
    monkeypatch.setenv("MLTENSOR_NO_FUSION", "1")
    shape = (1, 8, 4, 4)
    _, g = _build(ctx, lambda b, x: b.relu(b.concat([b.relu(x), b.tanh(x)], 1)), [shape])
    assert _concat_kernels(g) == 2, g.kernel_names


def test_split_and_slice_of_contiguous_runs_are_views(ctx, rng):
    """split along channels at batch 1 and a slice of leading rows are contiguous runs of their
    source: no copy launched, consumers read the source's storage at an offset."""
    shape = (1, 8, 4, 4)
    a = rng.standard_normal(shape).astype(np.float32)

    def f(b, x):
        r = b.relu(x)
        p, q = b.split(r, 2, axis=1)
        s = b.slice(r, [0, 2, 0, 0], [1, 4, 4, 4])
        return b.concat([b.sigmoid(p), b.tanh(q), b.neg(s)], 1)

    _, g = _build(ctx, f, [shape])
    assert not FUSION or not any(k.startswith(("split", "slice")) for k in g.kernel_names), g.kernel_names
    r = np.maximum(a, 0)
    want = np.concatenate([1 / (1 + np.exp(-r[:, :4])), np.tanh(r[:, 4:]), -r[:, 2:6]], 1)
    np.testing.assert_allclose(_run(ctx, g, [a]), want, rtol=1e-5, atol=1e-6)


def test_views_of_callers_tensors(ctx, rng):
    """A concat that is the graph's output hosts its producers inside the caller's tensor, and
    a split of a caller's input reads it in place (both bound at dispatch with offsets); run
    twice with other tensors to check the per-set bind groups."""
    shape = (1, 8, 4, 4)

    def f(b, x):
        p, q = b.split(x, 2, axis=1)
        return b.concat([b.relu(q), b.sigmoid(p), b.tanh(x)], 1)

    _, g = _build(ctx, f, [shape])
    # values only: placing producers inside the caller's output tensor is not built (yet), so
    # this graph may still copy into the output
    for _ in range(2):
        a = rng.standard_normal(shape).astype(np.float32)
        want = np.concatenate([np.maximum(a[:, 4:], 0), 1 / (1 + np.exp(-a[:, :4])), np.tanh(a)], 1)
        np.testing.assert_allclose(_run(ctx, g, [a]), want, rtol=1e-5, atol=1e-6)


def test_recurrence_keeps_every_other_placement(ctx, rng):
    """h_t = f(h_{t-1}) written into consecutive slabs of one output: the kernel would read one
    slab and write the next (a usage conflict), so some copies stay; values as numpy."""
    shape = (1, 4)

    def f(b, x):
        hs = [b.relu(x)]
        for _ in range(5):
            hs.append(b.tanh(b.add(hs[-1], b.constant(data_type="float32", value=0.25))))
        return b.concat([b.reshape(h, [1, 1, 4]) for h in hs], 0)

    _, g = _build(ctx, f, [shape])
    assert _concat_kernels(g) <= 6, g.kernel_names  # values are what matters here (see docstring)
    a = rng.standard_normal(shape).astype(np.float32)
    hs = [np.maximum(a, 0)]
    for _ in range(5):
        hs.append(np.tanh(hs[-1] + 0.25))
    np.testing.assert_allclose(_run(ctx, g, [a]), np.stack(hs), rtol=1e-5, atol=1e-6)
