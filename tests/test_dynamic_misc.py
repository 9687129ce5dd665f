"""Dynamic dimensions (mltensor/dynamic/) in pooling, resample2d, quantize/dequantize_linear and
the recurrent operators: one build per graph, dispatched at several sizes (1, the maximum, odd
ones), checked against the numpy references of the tests/test_ops_* files and bit for bit
against a static build of the same graph at each size."""

import math

import numpy as np
import pytest
from test_ops_pool import pool_ref
from test_ops_quantize import ref_dequantize, ref_quantize
from test_ops_resample import reference as resample_ref
from test_ops_rnn import ref_gru_cell, ref_lstm_cell, ref_rnn

import mltensor
from helpers import dispatch_at
from mltensor.dynamic.dims import MLDynamicDimension as D
from mltensor.errors import NotSupportedError

NP = mltensor.dtypes.NUMPY


_dispatch = dispatch_at


def _gen(rng, dt, shape):
    if dt in ("uint8", "int8", "int32", "uint32"):
        lo, hi = {"uint8": (0, 256), "int8": (-128, 128), "uint32": (0, 1000)}.get(dt, (-1000, 1000))
        return rng.integers(lo, hi, shape).astype(NP[dt])
    return rng.standard_normal(shape).astype(NP[dt])


def _shape(s, sizes):
    return tuple(sizes[d[0]] if isinstance(d, tuple) else d for d in s)


def build(ctx, inputs, make):
    b = mltensor.MLGraphBuilder(ctx)
    ops = {
        n: b.input(n, data_type=dt, shape=[D(*d) if isinstance(d, tuple) else d for d in s])
        for n, (dt, s) in inputs.items()
    }
    return b.build_sync(make(b, ops))


def check(ctx, inputs, make, ref, cases, gen=None, tol=None):
    """inputs: {name: (data type, shape)}, shape entries ints or ("name", max_size); make(b, ops)
    -> {output name: operand}; ref(arrays, sizes) -> {output name: numpy array} (compared exactly,
    or within `tol` (rtol = atol)); cases: [{dim: size}]; gen: {input name: fn(rng, shape)}.
    Every output is also compared bit for bit with a static build at the same sizes."""
    rng = np.random.default_rng(0)
    g = build(ctx, inputs, make)
    assert g.dynamic_dimensions
    for sizes in cases:
        feeds = {}
        for n, (dt, s) in inputs.items():
            shape = _shape(s, sizes)
            fn = (gen or {}).get(n)
            feeds[n] = fn(rng, shape) if fn else _gen(rng, dt, shape)
        got = _dispatch(ctx, g, feeds)
        gs = build(ctx, {n: (dt, feeds[n].shape) for n, (dt, _) in inputs.items()}, make)
        static = _dispatch(ctx, gs, feeds)
        gs.destroy()
        for n, w in ref(feeds, sizes).items():
            assert got[n].shape == w.shape, (n, sizes, got[n].shape, w.shape)
            if tol is None:
                np.testing.assert_array_equal(got[n], w.astype(got[n].dtype), err_msg=f"{n} at {sizes}")
            else:
                np.testing.assert_allclose(
                    got[n].astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol, err_msg=f"{n} at {sizes}"
                )
            assert got[n].tobytes() == static[n].tobytes(), (n, sizes)
    return g


def dispatch_error(ctx, g, feeds, match):
    """A dispatch of `g` with these input shapes raises TypeError matching `match`."""
    with pytest.raises(TypeError, match=match):
        _dispatch(ctx, g, {n: np.zeros(s, NP[g.input_descriptors[n][0]]) for n, s in feeds.items()})


# -- pooling --------------------------------------------------------------------------------------

POOLS = {"avg": "average_pool2d", "l2": "l2_pool2d", "max": "max_pool2d"}


def _pool_case(mode, layout, opts, dt="float32"):
    def make(b, o):
        return {"y": getattr(b, POOLS[mode])(o["x"], layout=layout, **opts)}

    def ref(f, sizes):
        x = f["x"].transpose(0, 3, 1, 2) if layout == "nhwc" else f["x"]
        win = opts.get("window_dimensions", x.shape[2:])
        pad, st, dil = opts.get("padding", (0,) * 4), opts.get("strides", (1, 1)), opts.get("dilations", (1, 1))
        spans = [x.shape[2 + k] + pad[2 * k] + pad[2 * k + 1] - (win[k] - 1) * dil[k] - 1 for k in (0, 1)]
        rnd = math.ceil if opts.get("rounding_type") == "ceil" else math.floor
        out_hw = [rnd(s / st[k]) + 1 for k, s in enumerate(spans)]
        y = pool_ref(x, mode, win, pad, st, dil, out_hw)
        return {"y": y.transpose(0, 2, 3, 1) if layout == "nhwc" else y}

    return make, ref


@pytest.mark.parametrize("mode", ["avg", "l2", "max"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_pool_window(ctx, mode, layout):
    # dynamic batch and plane; padding keeps every size valid (H, W >= 1 with a 3x3 window)
    opts = {"window_dimensions": [3, 2], "strides": [2, 1], "padding": [1, 1, 0, 1]}
    make, ref = _pool_case(mode, layout, opts)
    shape = [("N", 3), 4, ("H", 9), ("W", 8)] if layout == "nchw" else [("N", 3), ("H", 9), ("W", 8), 4]
    check(
        ctx,
        {"x": ("float32", shape)},
        make,
        ref,
        [{"N": 1, "H": 1, "W": 1}, {"N": 3, "H": 9, "W": 8}, {"N": 2, "H": 6, "W": 5}],
        tol=1e-5,
    )


@pytest.mark.parametrize(
    "opts",
    [
        {"window_dimensions": [3, 3], "strides": [2, 2], "rounding_type": "ceil"},
        {"window_dimensions": [2, 3], "dilations": [2, 1], "padding": [0, 1, 1, 0]},
    ],
)
def test_pool_deferred_window_check(ctx, opts):
    # the window exceeds the padded plane for small sizes: every dispatch checks it
    make, ref = _pool_case("max", "nchw", opts)
    g = check(
        ctx,
        {"x": ("float32", [2, ("C", 3), ("H", 10), ("W", 9)])},
        make,
        ref,
        [{"C": 1, "H": 3, "W": 3}, {"C": 3, "H": 10, "W": 9}, {"C": 2, "H": 7, "W": 4}],
        tol=0,
    )
    dispatch_error(ctx, g, {"x": (2, 2, 1, 5)}, r"max_pool2d.*height")
    dispatch_error(ctx, g, {"x": (2, 2, 5, 11)}, "W")  # above its maximum


def test_pool_float16_and_epilogue(ctx):
    # float16 (f32 accumulation) with a fused relu + residual add after the pool
    def make(b, o):
        y = b.average_pool2d(o["x"], window_dimensions=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
        return {"y": b.relu(b.add(y, o["r"]))}

    def ref(f, sizes):
        x = f["x"].astype(np.float32)
        y = pool_ref(x, "avg", [3, 3], [1, 1, 1, 1], [2, 2], [1, 1], f["r"].shape[2:])
        return {"y": np.maximum(y.astype(np.float16).astype(np.float32) + f["r"], 0).astype(np.float16)}

    check(
        ctx,
        {"x": ("float16", [("N", 2), 3, ("H", 9), 6]), "r": ("float16", [("N", 2), 3, ("OH", 5), 3])},
        make,
        ref,
        [{"N": 1, "H": 1, "OH": 1}, {"N": 2, "H": 9, "OH": 5}, {"N": 1, "H": 4, "OH": 2}],
        tol=2e-3,
    )


def test_pool_int_max(ctx):
    make, ref = _pool_case("max", "nhwc", {"window_dimensions": [2, 2], "strides": [2, 2]})
    check(
        ctx,
        {"x": ("int32", [("N", 2), ("H", 7), ("W", 6), 3])},
        make,
        ref,
        [{"N": 1, "H": 2, "W": 2}, {"N": 2, "H": 7, "W": 6}, {"N": 1, "H": 3, "W": 5}],
    )


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_pool_whole_plane(ctx, mode, layout):
    # the default window is the (dynamic) plane: planes below GLOBAL_MIN_WINDOW take the window
    # kernel's loop, larger ones the workgroup reduction, as a static build at that size would
    make, ref = _pool_case(mode, layout, {})
    shape = [("N", 2), 5, ("H", 16), ("W", 12)] if layout == "nchw" else [("N", 2), ("H", 16), ("W", 12), 5]
    check(
        ctx,
        {"x": ("float32", shape)},
        make,
        ref,
        [{"N": 1, "H": 1, "W": 1}, {"N": 2, "H": 16, "W": 12}, {"N": 1, "H": 11, "W": 12}, {"N": 2, "H": 3, "W": 7}],
        tol=1e-5,
    )


@pytest.mark.parametrize("mode", ["avg", "l2"])
def test_pool_whole_dynamic_plane_static_output(ctx, mode):
    # static batch and channels: a static output shape over a dynamic plane, large or small
    make, ref = _pool_case(mode, "nchw", {})
    check(
        ctx,
        {"x": ("float32", [2, 3, ("H", 16), ("W", 12)])},
        make,
        ref,
        [{"H": 1, "W": 1}, {"H": 16, "W": 12}, {"H": 5, "W": 9}],
        tol=1e-5,
    )
    # every allowed plane below GLOBAL_MIN_WINDOW: the window kernel with a dynamic window
    make, ref = _pool_case(mode, "nhwc", {})
    check(
        ctx,
        {"x": ("float32", [("N", 2), ("H", 8), ("W", 9), 3])},
        make,
        ref,
        [{"N": 1, "H": 1, "W": 1}, {"N": 2, "H": 8, "W": 9}, {"N": 1, "H": 5, "W": 2}],
        tol=1e-5,
    )


def test_pool_and_resample_large_maxima(ctx):
    # maxima of 2^23 output elements or more: kernels divide by dispatch-time sizes in u32
    # (smaller ones through f32 with an integer correction); run at small sizes
    make, ref = _pool_case("avg", "nchw", {"window_dimensions": [2, 2], "padding": [0, 1, 1, 0]})
    check(
        ctx,
        {"x": ("float32", [("N", 64), 8, ("H", 128), ("W", 128)])},
        make,
        ref,
        [{"N": 1, "H": 1, "W": 1}, {"N": 3, "H": 7, "W": 10}],
        tol=1e-5,
    )
    make, ref = _resample_case({"mode": "linear", "scales": [2.0, 2.0]})
    check(
        ctx,
        {"x": ("float32", [("N", 256), 2, ("H", 64), ("W", 64)])},
        make,
        ref,
        [{"N": 1, "H": 1, "W": 1}, {"N": 3, "H": 5, "W": 9}],
        tol=1e-5,
    )


def test_pool_global_dynamic_batch(ctx):
    # a static window over a large static plane (the "global" path) with a dynamic batch
    make, ref = _pool_case("avg", "nchw", {"window_dimensions": [16, 12]})
    check(
        ctx,
        {"x": ("float32", [("N", 3), ("C", 4), 16, 12])},
        make,
        ref,
        [{"N": 1, "C": 1}, {"N": 3, "C": 4}, {"N": 2, "C": 3}],
        tol=1e-5,
    )


# -- quantize_linear / dequantize_linear -------------------------------------------------------


def _scale(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape).astype(np.float32)


def _zp(dt):
    return lambda rng, shape: rng.integers(-20 if dt in ("int8", "int32") else 0, 21, shape).astype(NP[dt])


@pytest.mark.parametrize("qt", ["uint8", "int8", "int32"])
@pytest.mark.parametrize("kind", ["tensor", "axis", "block", "batch"])
def test_quantize_dequantize(ctx, qt, kind):
    # scale / zero point per tensor, per (static) channel, in static blocks of dynamic dimensions
    # (whole multiples checked at dispatch), or with the input's own dynamic batch
    sshape = {"tensor": [1, 1, 1], "axis": [1, 6, 1], "block": [1, 3, 2], "batch": [("N", 4), 1, 1]}[kind]
    inputs = {"x": ("float32", [("N", 4), 6, ("W", 8)]), "s": ("float32", sshape), "z": (qt, sshape)}

    def make(b, o):
        q = b.quantize_linear(o["x"], o["s"], o["z"])
        return {"q": q, "d": b.dequantize_linear(q, o["s"], o["z"])}

    def ref(f, sizes):
        q = ref_quantize(f["x"], f["s"], f["z"])
        return {"q": q, "d": ref_dequantize(q, f["s"], f["z"])}

    def x(rng, shape):
        v = (rng.standard_normal(shape) * 60).astype(np.float32)
        v.flat[:4] = [0.5, 1.5, 2.5, -2.5][: v.size]  # ties round to even
        return v

    g = check(
        ctx,
        inputs,
        make,
        ref,
        [{"N": 1, "W": 2}, {"N": 4, "W": 8}, {"N": 3, "W": 6}],
        gen={"x": x, "s": _scale(0.25, 1.0), "z": _zp(qt)},
        tol=None,
    )
    if kind == "block":
        dispatch_error(ctx, g, {"x": (2, 6, 5), "s": (1, 3, 2), "z": (1, 3, 2)}, r"quantize_linear.*W")


def test_dequantize_dynamic_scale_blocks(ctx):
    # the scale's dimension is the dynamic one: block size 6 // S, a whole divisor checked at dispatch
    inputs = {"x": ("int8", [4, 6]), "s": ("float32", [1, ("S", 6)]), "z": ("int8", [1, ("S", 6)])}

    def make(b, o):
        return {"y": b.dequantize_linear(o["x"], o["s"], o["z"])}

    g = check(
        ctx,
        inputs,
        make,
        lambda f, sizes: {"y": ref_dequantize(f["x"], f["s"], f["z"])},
        [{"S": 1}, {"S": 6}, {"S": 3}, {"S": 2}],
        gen={"s": _scale(0.01, 2.0), "z": _zp("int8")},
        tol=1e-6,
    )
    dispatch_error(ctx, g, {"x": (4, 6), "s": (1, 4), "z": (1, 4)}, r"dequantize_linear.*multiple")


@pytest.mark.parametrize("ft", ["float32", "float16"])
def test_dequantize_float16(ctx, ft):
    inputs = {"x": ("int8", [("N", 5), 3, ("W", 7)]), "s": (ft, [1, 3, 1]), "z": ("int8", [1, 3, 1])}

    def make(b, o):
        return {"y": b.dequantize_linear(o["x"], o["s"], o["z"])}

    check(
        ctx,
        inputs,
        make,
        lambda f, sizes: {"y": ref_dequantize(f["x"], f["s"], f["z"])},
        [{"N": 1, "W": 1}, {"N": 5, "W": 7}, {"N": 2, "W": 3}],
        gen={"s": lambda rng, shape: rng.uniform(0.01, 2.0, shape).astype(NP[ft]), "z": _zp("int8")},
        tol=1e-3 if ft == "float16" else 1e-6,
    )


# -- gru, gru_cell, lstm, lstm_cell: dynamic batch ----------------------------------------------

RT, RI, RH = 5, 4, 6  # steps, input size, hidden size
BATCHES = [{"B": 1}, {"B": 6}, {"B": 3}]


def _small(scale):
    return lambda rng, shape: (rng.standard_normal(shape) * scale).astype(np.float32)


def _rnn_inputs(kind, nd, init, dt="float32"):
    G = 3 if kind == "gru" else 4
    ins = {
        "x": (dt, [RT, ("B", 6), RI]),
        "W": (dt, [nd, G * RH, RI]),
        "R": (dt, [nd, G * RH, RH]),
        "b": (dt, [nd, G * RH]),
        "rb": (dt, [nd, G * RH]),
    }
    if kind == "lstm":
        ins["p"] = (dt, [nd, 3 * RH])
    if init:
        ins["h0"] = (dt, [nd, ("B", 6), RH])
        if kind == "lstm":
            ins["c0"] = (dt, [nd, ("B", 6), RH])
    gen = {k: _small(0.5 if k in ("W", "R", "h0", "c0") else 0.3 if k != "x" else 1.0) for k in ins}
    return ins, gen


@pytest.mark.parametrize("direction,init", [("forward", False), ("both", True)])
def test_lstm(ctx, direction, init):
    nd = 2 if direction == "both" else 1
    ins, gen = _rnn_inputs("lstm", nd, init)

    def make(b, o):
        h, c, seq = b.lstm(
            o["x"],
            o["W"],
            o["R"],
            RT,
            RH,
            bias=o["b"],
            recurrent_bias=o["rb"],
            peephole_weight=o["p"],
            initial_hidden_state=o.get("h0"),
            initial_cell_state=o.get("c0"),
            return_sequence=True,
            direction=direction,
        )
        return {"h": h, "c": c, "seq": seq}

    def ref(f, sizes):
        h, c, seq = ref_rnn(
            "lstm", f["x"], f["W"], f["R"], RH, direction, f["b"], f["rb"], f["p"], h0=f.get("h0"), c0=f.get("c0")
        )
        return {"h": h, "c": c, "seq": seq}

    check(ctx, ins, make, ref, BATCHES, gen=gen, tol=1e-4)


@pytest.mark.parametrize("reset_after,direction", [(True, "backward"), (False, "forward")])
def test_gru(ctx, reset_after, direction):
    ins, gen = _rnn_inputs("gru", 1, True)

    def make(b, o):
        h, seq = b.gru(
            o["x"],
            o["W"],
            o["R"],
            RT,
            RH,
            bias=o["b"],
            recurrent_bias=o["rb"],
            initial_hidden_state=o["h0"],
            reset_after=reset_after,
            return_sequence=True,
            direction=direction,
            layout="rzn",
        )
        return {"h": h, "seq": seq}

    def ref(f, sizes):
        h, _, seq = ref_rnn(
            "gru",
            f["x"],
            f["W"],
            f["R"],
            RH,
            direction,
            f["b"],
            f["rb"],
            h0=f["h0"],
            reset_after=reset_after,
            layout="rzn",
        )
        return {"h": h, "seq": seq}

    check(ctx, ins, make, ref, BATCHES, gen=gen, tol=1e-4)


def test_lstm_cell_and_gru_cell(ctx):
    ins = {
        "x": ("float32", [("B", 6), RI]),
        "W4": ("float32", [4 * RH, RI]),
        "R4": ("float32", [4 * RH, RH]),
        "W3": ("float32", [3 * RH, RI]),
        "R3": ("float32", [3 * RH, RH]),
        "h": ("float32", [("B", 6), RH]),
        "c": ("float32", [("B", 6), RH]),
        "b": ("float32", [4 * RH]),
        "p": ("float32", [3 * RH]),
    }

    def make(b, o):
        h, c = b.lstm_cell(
            o["x"], o["W4"], o["R4"], o["h"], o["c"], RH, bias=o["b"], peephole_weight=o["p"], layout="ifgo"
        )
        g = b.gru_cell(o["x"], o["W3"], o["R3"], o["h"], RH, activations=("sigmoid", "relu"))
        return {"h": h, "c": c, "g": g}

    def ref(f, sizes):
        h, c = ref_lstm_cell(f["x"], f["W4"], f["R4"], f["h"], f["c"], RH, f["b"], None, f["p"], "ifgo")
        g = ref_gru_cell(f["x"], f["W3"], f["R3"], f["h"], RH, acts=("sigmoid", "relu"))
        return {"h": h, "c": c, "g": g}

    check(ctx, ins, make, ref, BATCHES, gen={k: _small(0.5) for k in ins}, tol=1e-4)


def test_gru_cell_float16(ctx):
    ins = {
        "x": ("float16", [("B", 6), RI]),
        "W": ("float16", [3 * RH, RI]),
        "R": ("float16", [3 * RH, RH]),
        "h": ("float16", [("B", 6), RH]),
        "b": ("float16", [3 * RH]),
    }

    def make(b, o):
        return {"y": b.gru_cell(o["x"], o["W"], o["R"], o["h"], RH, bias=o["b"], layout="rzn")}

    def ref(f, sizes):
        f = {k: v.astype(np.float32) for k, v in f.items()}
        return {"y": ref_gru_cell(f["x"], f["W"], f["R"], f["h"], RH, f["b"], layout="rzn")}

    check(
        ctx,
        ins,
        make,
        ref,
        BATCHES,
        gen={k: (lambda rng, shape: (rng.standard_normal(shape) * 0.5).astype(np.float16)) for k in ins},
        tol=2e-3,
    )


def test_rnn_dynamic_steps_refused(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[D("T", 8), 2, RI])
    W = b.input("W", data_type="float32", shape=[1, 4 * RH, RI])
    R = b.input("R", data_type="float32", shape=[1, 4 * RH, RH])
    with pytest.raises(NotSupportedError, match=r"\[lstm\].*steps"):
        b.lstm(x, W, R, 8, RH)
    with pytest.raises(NotSupportedError, match=r"\[gru\].*steps"):
        b.gru(
            x,
            b.input("W3", data_type="float32", shape=[1, 3 * RH, RI]),
            b.input("R3", data_type="float32", shape=[1, 3 * RH, RH]),
            8,
            RH,
        )


# -- resample2d ---------------------------------------------------------------------------------


def _resample_case(opts, dt="float32"):
    axes = opts.get("axes", [2, 3])

    def make(b, o):
        return {"y": b.resample2d(o["x"], **opts)}

    def ref(f, sizes):
        x = f["x"]
        out = list(x.shape)
        for k, a in enumerate(axes):
            out[a] = opts["sizes"][k] if "sizes" in opts else math.floor(x.shape[a] * opts["scales"][k])
        y = resample_ref(
            x.astype(np.float32),
            out,
            axes,
            opts.get("mode", "nearest-neighbor"),
            opts.get("coordinate_transformation", "half_pixel"),
            opts.get("nearest_rounding", "round_prefer_floor"),
        )
        return {"y": y.astype(NP[dt])}

    return make, ref


NHW = [{"N": 1, "H": 1, "W": 1}, {"N": 2, "H": 9, "W": 11}, {"N": 1, "H": 4, "W": 7}, {"N": 2, "H": 5, "W": 2}]


@pytest.mark.parametrize("mode", ["nearest-neighbor", "linear"])
@pytest.mark.parametrize(
    "opts",
    [
        {"scales": [2.0, 3.0]},  # integer scales: the static build's coordinate constants
        {"scales": [1.0, 2.0], "coordinate_transformation": "align_corners"},
        {"sizes": [5, 8]},  # static output sizes of dynamic inputs: the map computed at dispatch
        {"scales": [1.5, 2.5]},  # floor(size * 3 / 2), floor(size * 5 / 2)
    ],
)
def test_resample(ctx, mode, opts):
    make, ref = _resample_case(dict(opts, mode=mode))
    check(
        ctx,
        {"x": ("float32", [("N", 2), 3, ("H", 9), ("W", 11)])},
        make,
        ref,
        NHW,
        tol=None if mode == "nearest-neighbor" else 1e-5,
    )


@pytest.mark.parametrize(
    "transform,rounding",
    [
        ("pytorch_half_pixel", "round_prefer_ceil"),
        ("align_corners", "floor"),
        ("asymmetric", "ceil"),
        ("half_pixel", "round_prefer_floor"),
    ],
)
@pytest.mark.parametrize("mode", ["nearest-neighbor", "linear"])
def test_resample_transforms(ctx, transform, rounding, mode):
    # NHWC axes, sizes computed at dispatch for both dimensions (H: a downsample whose output may
    # be 1, the pytorch_half_pixel special case; W: static sizes)
    opts = {"mode": mode, "axes": [1, 2], "coordinate_transformation": transform, "nearest_rounding": rounding}
    make, ref = _resample_case(dict(opts, scales=[0.5, 3.0]))
    check(
        ctx,
        {"x": ("float32", [2, ("H", 9), ("W", 6), 3])},
        make,
        ref,
        [{"H": 2, "W": 1}, {"H": 9, "W": 6}, {"H": 3, "W": 5}, {"H": 6, "W": 2}],
        tol=None if mode == "nearest-neighbor" else 1e-5,
    )
    make, ref = _resample_case(dict(opts, sizes=[4, 1]))
    check(
        ctx,
        {"x": ("float32", [2, ("H", 9), ("W", 6), 3])},
        make,
        ref,
        [{"H": 1, "W": 1}, {"H": 9, "W": 6}, {"H": 7, "W": 5}],
        tol=None if mode == "nearest-neighbor" else 1e-5,
    )


def test_resample_float16(ctx):
    make, ref = _resample_case({"mode": "linear", "scales": [2.0, 1.5]}, "float16")
    check(
        ctx,
        {"x": ("float16", [1, ("C", 3), ("H", 6), ("W", 7)])},
        make,
        ref,
        [{"C": 1, "H": 1, "W": 2}, {"C": 3, "H": 6, "W": 7}, {"C": 2, "H": 5, "W": 3}],
        tol=2e-3,
    )


def test_resample_deferred_and_refused(ctx):
    # floor(W * 0.5) is 0 for W = 1: checked at dispatch; a size above the maximum is refused
    make, ref = _resample_case({"scales": [1.0, 0.5]})
    g = check(
        ctx,
        {"x": ("float32", [1, 2, ("H", 4), ("W", 8)])},
        make,
        ref,
        [{"H": 1, "W": 2}, {"H": 4, "W": 8}, {"H": 3, "W": 5}],
    )
    dispatch_error(ctx, g, {"x": (1, 2, 3, 1)}, r"resample2d")
    dispatch_error(ctx, g, {"x": (1, 2, 5, 4)}, r"'H' is 5")
    # a scale whose exact ratio p / q makes size * p overflow 32 bits for the largest size
    b = mltensor.MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[1, 1, D("H", 4096), 8])
    with pytest.raises(NotSupportedError, match=r"\[resample2d\].*scale"):
        b.resample2d(x, scales=[0.3, 1.0])
    assert str(b.resample2d(x, scales=[0.25, 1.0]).shape[2]) == "H // 4"
