"""Dynamic dimensions (mltensor/dynamic/) in data movement, indexing, layout and comparisons:
one build per graph, dispatched at several sizes (1, the maximum, odd ones), checked against
numpy and bit for bit against a static build of the same graph at each size."""

import numpy as np
import pytest

import mltensor
from helpers import context_with_env, dispatch_at
from mltensor.dynamic.dims import MLDynamicDimension as D

NP = mltensor.dtypes.NUMPY


_dispatch = dispatch_at


def _gen(rng, dt, shape):
    if dt == "uint8":
        return rng.integers(0, 2, shape).astype(np.uint8)
    if dt in ("int32", "int64", "uint32"):
        return rng.integers(-50, 50, shape).astype(NP[dt])
    return rng.standard_normal(shape).astype(NP[dt])


def check(ctx, inputs, make, ref, cases, gen=None):
    """inputs: {name: (data type, shape)}, shape entries ints or ("name", max_size); make(b, ops)
    -> {output name: operand}; ref(arrays) -> {output name: numpy array}; cases: [{dim: size}];
    gen: {input name: fn(rng, shape)} for inputs that need special values (indices)."""
    rng = np.random.default_rng(0)
    b = mltensor.MLGraphBuilder(ctx)
    ops = {
        n: b.input(n, data_type=dt, shape=[D(*d) if isinstance(d, tuple) else d for d in s])
        for n, (dt, s) in inputs.items()
    }
    g = b.build_sync(make(b, ops))
    assert g.dynamic_dimensions
    for sizes in cases:
        feeds = {}
        for n, (dt, s) in inputs.items():
            shape = tuple(sizes[d[0]] if isinstance(d, tuple) else d for d in s)
            fn = (gen or {}).get(n)
            feeds[n] = fn(rng, shape) if fn else _gen(rng, dt, shape)
        got = _dispatch(ctx, g, feeds)
        bs = mltensor.MLGraphBuilder(ctx)
        sops = {n: bs.input(n, data_type=dt, shape=feeds[n].shape) for n, (dt, _) in inputs.items()}
        gs = bs.build_sync(make(bs, sops))
        static = _dispatch(ctx, gs, feeds)
        gs.destroy()
        want = ref(feeds)
        for n, w in want.items():
            assert got[n].shape == w.shape, (n, sizes, got[n].shape, w.shape)
            np.testing.assert_array_equal(got[n], w.astype(got[n].dtype), err_msg=f"{n} at {sizes}")
            assert got[n].tobytes() == static[n].tobytes(), (n, sizes)
    g.destroy()


BS = [{"B": 1, "S": 1}, {"B": 3, "S": 16}, {"B": 2, "S": 7}]


# -- transformer patterns -------------------------------------------------------------------


def test_head_split_and_merge(ctx):
    # [B, S, 96] -> [B, S, 4, 24] -> [B, 4, S, 24] and back to [B*S, 96]
    def make(b, o):
        x = o["x"]
        B, S = x.shape[:2]
        h = b.transpose(b.reshape(x, [B, S, 4, 24]), permutation=[0, 2, 1, 3])
        back = b.reshape(b.transpose(h, permutation=[0, 2, 1, 3]), [B * S, 96])
        return {"h": h, "back": back}

    check(
        ctx,
        {"x": ("float32", [("B", 3), ("S", 16), 96])},
        make,
        lambda f: {"h": f["x"].reshape(*f["x"].shape[:2], 4, 24).transpose(0, 2, 1, 3), "back": f["x"].reshape(-1, 96)},
        BS,
    )


def test_transpose_three_dynamic_dims(ctx):
    # (the 1-D launch: more than one dynamic dimension inside the outermost)
    def make(b, o):
        x = o["x"]
        return {"y": b.transpose(x, permutation=[2, 0, 1]), "z": b.transpose(x, permutation=[0, 2, 1])}

    check(
        ctx,
        {"x": ("int32", [("A", 4), ("B", 5), ("C", 6)])},
        make,
        lambda f: {"y": f["x"].transpose(2, 0, 1), "z": f["x"].transpose(0, 2, 1)},
        [{"A": 1, "B": 1, "C": 1}, {"A": 4, "B": 5, "C": 6}, {"A": 3, "B": 2, "C": 5}],
    )


def test_kv_cache_concat(ctx):
    # past [B, H, P, D] and new [B, H, S, D], P and S different named dims: out along P + S
    def make(b, o):
        return {"kv": b.concat([o["past"], o["new"]], axis=2)}

    cases = [{"B": 1, "P": 1, "S": 1}, {"B": 2, "P": 20, "S": 8}, {"B": 1, "P": 5, "S": 3}]
    check(
        ctx,
        {"past": ("float32", [("B", 2), 4, ("P", 20), 8]), "new": ("float32", [("B", 2), 4, ("S", 8), 8])},
        make,
        lambda f: {"kv": np.concatenate([f["past"], f["new"]], 2)},
        cases,
    )


def test_concat_three_dynamic_and_static(ctx):
    def make(b, o):
        return {"y": b.concat([o["a"], o["c"], o["a"]], axis=1)}

    check(
        ctx,
        {"a": ("int32", [("N", 5), ("S", 9)]), "c": ("int32", [("N", 5), 3])},
        make,
        lambda f: {"y": np.concatenate([f["a"], f["c"], f["a"]], 1)},
        [{"N": 1, "S": 1}, {"N": 5, "S": 9}, {"N": 3, "S": 4}],
    )


def test_causal_mask_slice(ctx):
    bias = np.tril(np.ones((64, 64), np.float32)).reshape(1, 1, 64, 64) * np.arange(64, dtype=np.float32)

    # scores [1, 1, S, P + S] (as attention over a KV cache gives), plus the mask's slice
    def make(b, o):
        past, seq = o["p"].shape[3], o["x"].shape[2]
        m = b.slice(b.constant(bias), [0, 0, past, 0], [1, 1, seq, past + seq])
        return {"m": m, "y": b.add(b.concat([o["p"], o["x"]], axis=3), m)}

    def ref(f):
        p, s = f["p"].shape[3], f["x"].shape[2]
        m = bias[:, :, p : p + s, : p + s]
        return {"m": m, "y": np.concatenate([f["p"], f["x"]], 3) + m}

    cases = [{"P": 1, "S": 1}, {"P": 40, "S": 24}, {"P": 9, "S": 5}]
    check(
        ctx,
        {"p": ("float32", [1, 1, ("S", 24), ("P", 40)]), "x": ("float32", [1, 1, ("S", 24), ("S", 24)])},
        make,
        ref,
        cases,
    )


def test_causal_mask_triangular(ctx):
    # keep c - r <= past over a [seq, past + seq] operand
    def make(b, o):
        x, past = o["x"], o["past"].shape[0]
        return {"y": b.triangular(x, upper=False, diagonal=past), "u": b.triangular(x, diagonal=1)}

    cases = [{"P": 1, "S": 1, "T": 2}, {"P": 12, "S": 9, "T": 21}, {"P": 4, "S": 5, "T": 9}]
    check(
        ctx,
        {"past": ("float32", [("P", 12)]), "x": ("float32", [("S", 9), ("T", 21)])},
        make,
        lambda f: {"y": np.tril(f["x"], f["past"].shape[0]), "u": np.triu(f["x"], 1)},
        cases,
    )


@pytest.fixture(scope="module")
def emulated_ctx():
    c = context_with_env(MLTENSOR_DISABLE_INT64="1")  # int64 as two 32-bit words (i64e)
    yield c
    c.destroy()


@pytest.mark.parametrize("it", ["int32", "int64", "int64e"])
def test_embedding_gather(request, it):
    c = request.getfixturevalue("emulated_ctx" if it == "int64e" else "ctx")
    it = it.rstrip("e")
    table = np.random.default_rng(1).standard_normal((100, 16)).astype(np.float32)

    def make(b, o):
        return {"y": b.gather(b.constant(table), o["ids"], axis=0), "t": b.gather(o["tt"], o["ids"], axis=1)}

    def ref(f):
        i = f["ids"]
        return {"y": table[i], "t": f["tt"][:, np.clip(np.where(i < 0, i + 5, i), 0, 4)]}

    check(
        c,
        {"ids": (it, [("B", 3), ("S", 16)]), "tt": ("int64", [("B", 3), 5])},
        make,
        ref,
        BS,
        gen={
            "ids": lambda rng, s: rng.integers(-5, 100, s).astype(NP[it]),
            "tt": lambda rng, s: rng.integers(-(2**62), 2**62, s),
        },
    )


@pytest.mark.parametrize("it", ["int32", "uint32", "int64"])
def test_gather_dynamic_axis(ctx, it):
    # along a dynamic axis, negative and out-of-range indices included (clamped, never outside)
    def make(b, o):
        return {"y": b.gather(o["x"], o["ids"], axis=1)}

    def ids(rng, s):
        return np.array([0, 3, -1, 2, 100, -100], dtype=np.int64).astype(NP[it])

    def ref(f):
        x, i = f["x"], f["ids"].astype(np.int64)
        n = x.shape[1]
        return {"y": x[:, np.clip(np.where(i < 0, i + n, i), 0, n - 1)]}

    check(ctx, {"x": ("float32", [("B", 3), ("S", 16), 5]), "ids": (it, [6])}, make, ref, BS, gen={"ids": ids})


def test_expand_and_where(ctx):
    # [1, 1, S] -> [B, H, S]; where(cond [B, 1, S], x [B, H, S], y [S])
    def make(b, o):
        m, x = o["m"], o["x"]
        e = b.expand(m, x.shape)
        return {"e": e, "w": b.where(o["c"], x, o["y"])}

    def ref(f):
        x = f["x"]
        return {"e": np.broadcast_to(f["m"], x.shape), "w": np.where(f["c"] != 0, x, f["y"])}

    check(
        ctx,
        {
            "m": ("float32", [1, 1, ("S", 16)]),
            "x": ("float32", [("B", 3), 4, ("S", 16)]),
            "c": ("uint8", [("B", 3), 1, ("S", 16)]),
            "y": ("float32", [("S", 16)]),
        },
        make,
        ref,
        BS,
    )


def test_compare_and_logical(ctx):
    def make(b, o):
        x, y = o["x"], o["y"]
        gt, eq = b.greater(x, y), b.equal(x, y)
        return {
            "gt": gt,
            "ne": b.not_equal(x, x),
            "le": b.lesser_or_equal(y, x),
            "or": b.logical_or(gt, eq),
            "not": b.logical_not(gt),
            "nan": b.is_nan(x),
            "inf": b.is_infinite(b.div(x, y)),
        }

    def ref(f):
        x, y = f["x"], f["y"]
        with np.errstate(all="ignore"):
            return {
                "gt": x > y,
                "ne": x != x,
                "le": y <= x,
                "or": (x > y) | (x == y),
                "not": ~(x > y),
                "nan": np.isnan(x),
                "inf": np.isinf(x / y),
            }

    def gen(rng, s):
        a = rng.integers(-2, 3, s).astype(np.float32)
        a.flat[::5] = np.nan
        return a

    check(
        ctx,
        {"x": ("float32", [("B", 3), ("S", 16)]), "y": ("float32", [1, ("S", 16)])},
        make,
        lambda f: {k: v.astype(np.uint8) for k, v in ref(f).items()},
        BS,
        gen={"x": gen, "y": lambda rng, s: rng.integers(-2, 3, s).astype(np.float32)},
    )


# -- the other operators ----------------------------------------------------------------------


def test_slice_strided_and_split(ctx):
    def make(b, o):
        x = o["x"]
        S = x.shape[1]
        a, c = b.split(x, [2, 4], axis=2)
        z = o["z"]
        return {
            "s": b.slice(x, [0, 1, 1], [x.shape[0], S - 1, 4], strides=[1, 2, 3]),
            "a": a,
            "c": c,
            "tail": b.slice(x, [0, S - 2, 0], [x.shape[0], 2, 6]),  # a start read at dispatch
            "h": b.split(b.concat([z, b.neg(z)], axis=1), 2, axis=1)[1],
        }  # 2*S in two

    check(
        ctx,
        {"x": ("float32", [("B", 3), ("S", 16), 6]), "z": ("float32", [("B", 3), ("S", 16)])},
        make,
        lambda f: {
            "s": f["x"][:, 1::2, 1:5:3],
            "a": f["x"][:, :, :2],
            "c": f["x"][:, :, 2:],
            "h": -f["z"],
            "tail": f["x"][:, -2:],
        },
        [{"B": 1, "S": 2}, {"B": 3, "S": 16}, {"B": 2, "S": 6}],
    )


@pytest.mark.parametrize("mode", ["constant", "edge", "reflection"])
def test_pad(ctx, mode):
    def make(b, o):
        return {"y": b.pad(o["x"], [0, 1, 2], [0, 0, 1], mode=mode, value=-3)}

    np_mode = {"constant": "constant", "edge": "edge", "reflection": "reflect"}[mode]
    kw = {"constant_values": -3} if mode == "constant" else {}
    check(
        ctx,
        {"x": ("float32", [("B", 3), ("S", 16), 5])},
        make,
        lambda f: {"y": np.pad(f["x"], [(0, 0), (1, 0), (2, 1)], mode=np_mode, **kw)},
        [{"B": 1, "S": 2}, {"B": 3, "S": 16}, {"B": 2, "S": 7}],
    )


def test_reverse_and_tile(ctx):
    def make(b, o):
        x = o["x"]
        return {"r": b.reverse(x, axes=[1, 2]), "t": b.tile(x, [2, 1, 3])}

    check(
        ctx,
        {"x": ("int32", [("B", 3), ("S", 16), 3])},
        make,
        lambda f: {"r": f["x"][:, ::-1, ::-1], "t": np.tile(f["x"], (2, 1, 3))},
        BS,
    )


def test_gather_scatter_elements_nd(ctx):
    def make(b, o):
        x, i = o["x"], o["i"]
        return {
            "ge": b.gather_elements(x, i, axis=1),
            "se": b.scatter_elements(x, i, o["u"], axis=1),
            "gn": b.gather_nd(x, o["nd"]),
            "sn": b.scatter_nd(x, o["nd"], o["v"]),
        }

    def idx(rng, s):
        return rng.integers(0, 2, s).astype(np.int32)  # below the smallest S used

    def nd(rng, s):
        return np.stack([rng.permutation(s[0]), np.zeros(s[0], int)], 1).astype(np.int32)

    def ref(f):
        x, i, n = f["x"], f["i"], f["nd"]
        se = x.copy()
        np.put_along_axis(se, i, f["u"], axis=1)
        sn = x.copy()
        sn[n[:, 0], n[:, 1]] = f["v"]
        return {"ge": np.take_along_axis(x, i, 1), "gn": x[n[:, 0], n[:, 1]], "sn": sn, "se": se}

    check(
        ctx,
        {
            "x": ("float32", [("B", 3), ("S", 9), 4]),
            "i": ("int32", [("B", 3), 1, 4]),
            "u": ("float32", [("B", 3), 1, 4]),
            "nd": ("int32", [("B", 3), 2]),
            "v": ("float32", [("B", 3), 4]),
        },
        make,
        ref,
        [{"B": 1, "S": 2}, {"B": 3, "S": 9}, {"B": 2, "S": 5}],
        gen={"i": idx, "nd": nd},
    )


def test_static_graph_kernels_unchanged(ctx):
    # a static graph keeps its kernels: a split part read in place, concat inputs written into
    # their slabs (no concat kernel), constants baked into the WGSL
    b = mltensor.MLGraphBuilder(ctx)
    x = b.relu(b.input("x", data_type="float32", shape=[1, 8, 4, 4]))
    a, c = b.split(x, 2, axis=1)
    y = b.concat([b.sigmoid(a), b.relu(b.slice(x, [0, 2, 0, 0], [1, 4, 4, 4]))], axis=1)
    g = b.build_sync({"y": y, "t": b.transpose(x, permutation=[0, 2, 3, 1]), "c": c})
    assert g.kernel_names == [
        "ew_relu_vec4f32_n128",
        "split1_n64_64",
        "ew_sigmoid_vec4f32_n64",
        "ew_relu_vec4f32_n64",
        "transpose_n128_16x8",
    ]
    g.destroy()


# -- errors ---------------------------------------------------------------------------------


def _graph(ctx, inputs, make):
    b = mltensor.MLGraphBuilder(ctx)
    ops = {
        n: b.input(n, data_type="float32", shape=[D(*d) if isinstance(d, tuple) else d for d in s])
        for n, s in inputs.items()
    }
    return b.build_sync(make(b, ops))


def test_size_above_maximum(ctx):
    g = _graph(ctx, {"x": [("S", 8), 4]}, lambda b, o: {"y": b.transpose(o["x"])})
    with pytest.raises(TypeError, match="outside"):
        _dispatch(ctx, g, {"x": np.zeros((9, 4), np.float32)})
    g.destroy()


def test_deferred_slice_check(ctx):
    bias = np.zeros((1, 1, 16, 16), np.float32)

    def make(b, o):
        p, s = o["past"].shape[0], o["x"].shape[0]
        return {"m": b.slice(b.constant(bias), [0, 0, p, 0], [1, 1, s, p + s])}

    g = _graph(ctx, {"past": [("P", 12)], "x": [("S", 8)]}, make)
    assert _dispatch(ctx, g, {"past": np.zeros(8, np.float32), "x": np.zeros(8, np.float32)})["m"].shape == (
        1,
        1,
        8,
        16,
    )
    with pytest.raises(TypeError, match=r"\[slice\]"):
        _dispatch(ctx, g, {"past": np.zeros(10, np.float32), "x": np.zeros(8, np.float32)})
    g.destroy()


def test_deferred_reshape_and_concat_checks(ctx):
    def make(b, o):
        x, y, z = o["x"], o["y"], o["z"]
        return {"r": b.reshape(y, [x.shape[0], 2]), "c": b.concat([x, z], axis=1)}  # C == 2*A, A == E

    g = _graph(ctx, {"x": [("A", 6), 2], "y": [("C", 12)], "z": [("E", 6), 3]}, make)
    r = _dispatch(
        ctx,
        g,
        {"x": np.ones((3, 2), np.float32), "y": np.arange(6, dtype=np.float32), "z": np.zeros((3, 3), np.float32)},
    )
    assert r["r"].shape == (3, 2) and r["c"].shape == (3, 5)
    np.testing.assert_array_equal(r["r"], np.arange(6).reshape(3, 2))
    with pytest.raises(TypeError, match=r"\[reshape\]"):
        _dispatch(
            ctx, g, {"x": np.ones((3, 2), np.float32), "y": np.zeros(8, np.float32), "z": np.zeros((3, 3), np.float32)}
        )
    with pytest.raises(TypeError, match=r"\[concat\]"):
        _dispatch(
            ctx, g, {"x": np.ones((3, 2), np.float32), "y": np.zeros(6, np.float32), "z": np.zeros((4, 3), np.float32)}
        )
    g.destroy()
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("A", 6), 2])
    with pytest.raises(TypeError, match=r"\[reshape\]"):
        b.reshape(x, [x.shape[0], 3])  # 3*A never equals 2*A
    with pytest.raises(TypeError, match=r"\[slice\]"):
        b.slice(x, [x.shape[0], 0], [1, 2])  # never inside
    c = b.input("c", data_type="float32", shape=[D("C", 6)])
    with pytest.raises(TypeError, match=r"\[slice\]"):
        b.slice(x, [0, 0], [c.shape[0], 3])  # C <= A deferred, then 3 > 2 raises
    with pytest.raises(TypeError, match=r"\[concat\]"):
        b.concat([x, b.input("w", data_type="float32", shape=[1, 3])], axis=0)
    assert not b._constraints  # the calls that raised deferred nothing


# -- constant steps that read sizes run at dispatch (compiler/plan.py _reads_sizes) ----------------


def test_constant_slice_at_dynamic_start_feeding_constant_math(ctx):
    tab = np.arange(64, dtype=np.float32).reshape(16, 4)

    def make(b, o):
        x = o["x"]
        row = b.slice(b.constant(tab), [x.shape[0], 0], [1, 4])  # static shape, dynamic start
        return {"y": b.add(b.mul(row, b.constant(np.full((1, 4), 2, np.float32))), b.slice(x, [0, 0], [1, 4]))}

    check(
        ctx,
        {"x": ("float32", [("P", 8), 4])},
        make,
        lambda f: {"y": tab[f["x"].shape[0]][None] * 2 + f["x"][:1]},
        [{"P": 1}, {"P": 5}],
    )


def test_expand_constant_to_dynamic_shape(ctx):
    def make(b, o):
        x = o["x"]
        return {"y": b.concat([x, b.expand(b.constant(np.arange(3, dtype=np.float32).reshape(3, 1)), x.shape)], 0)}

    check(
        ctx,
        {"x": ("float32", [3, ("S", 8)])},
        make,
        lambda f: {"y": np.concatenate([f["x"], np.broadcast_to(np.arange(3.0).reshape(3, 1), f["x"].shape)])},
        [{"S": 1}, {"S": 5}],
    )
