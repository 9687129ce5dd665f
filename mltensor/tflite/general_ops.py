"""TFLite's general builtin operators (what the converter emits for Keras and PyTorch models) as
MLGraphBuilder calls, the way the ONNX importer expresses the same families (mltensor/onnx/ops/).

Shape arithmetic is folded at load: an operator whose inputs are all constants (SHAPE, FILL,
RANGE, PACK of sizes, CAST, GATHER, ...) is computed with numpy and its output stays a constant.
TFLite's BOOL tensors are WebNN uint8 (0 / 1), as the comparisons and logical operators give.
"""

import numpy as np
import tflite

from ..errors import NotSupportedError
from ..onnx.ops.elementwise import gelu as onnx_gelu
from . import control, int16, quantized
from .common import ACT, activation, op_error, opt

# TFLite TensorType -> numpy / WebNN data type of the values the graph holds (BOOL as uint8)
_NP = {
    tflite.TensorType.FLOAT32: np.float32,
    tflite.TensorType.FLOAT16: np.float16,
    tflite.TensorType.INT32: np.int32,
    tflite.TensorType.INT64: np.int64,
    tflite.TensorType.UINT8: np.uint8,
    tflite.TensorType.INT8: np.int8,
    tflite.TensorType.UINT32: np.uint32,
    tflite.TensorType.BOOL: np.uint8,
}


def value_dtype(imp, op, i):
    """The numpy dtype tensor `i` holds in the graph (BOOL as uint8)."""
    t = imp.tensor(i)
    dt = _NP.get(t.type)
    if dt is None:
        raise op_error(op, f"tensor {i} ('{t.name}') has type {t.type_name}, which WebNN does not support",
                       NotSupportedError)  # fmt: skip
    if dt is np.float32 and imp.float16:
        return np.float16
    return dt


def _all_const(imp, op, ks=None):
    ks = range(len(op.inputs)) if ks is None else ks
    return all(op.inputs[k] >= 0 and imp.is_const(op.inputs[k]) and op.inputs[k] not in imp.values for k in ks)


def _c(imp, op, k, what):
    return np.asarray(imp.const_value(op, op.inputs[k], what))


def _ints(imp, op, k, what):
    return [int(v) for v in _c(imp, op, k, what).reshape(-1)]


def _x(imp, op, k=0):
    return imp.operand(op, op.inputs[k])


def _scalar(imp, value, like):
    dt = np.float16 if like.data_type == "float16" else np.dtype(like.data_type).type
    return imp.b.constant(np.array(value, dtype=dt))


def _shape_of(imp, op, k):
    i = op.inputs[k]
    if imp.is_const(i) and i not in imp.values:
        return list(imp.consts[i].shape)
    return list(imp.operand(op, i).shape)


def _axis(op, axis, rank):
    a = int(axis)
    if not -rank <= a < max(rank, 1):
        raise op_error(op, f"axis {axis} is out of range for rank {rank}")
    return a % max(rank, 1)


def _reshape(imp, x, shape):
    shape = [int(d) for d in shape]
    return x if list(x.shape) == shape else imp.b.reshape(x, shape)


def _folding(np_fn, graph_fn):
    """A converter that folds with np_fn(imp, op, *arrays) when every input is a constant."""

    def convert(imp, op):
        if _all_const(imp, op, [k for k, i in enumerate(op.inputs) if i >= 0]):
            arrs = [imp.consts[i] if i >= 0 else None for i in op.inputs]
            out = np_fn(imp, op, *arrs)
            if isinstance(out, list):
                return [np.ascontiguousarray(o) for o in out]
            return np.ascontiguousarray(out)
        return graph_fn(imp, op)

    return convert


# -- shape and movement ---------------------------------------------------------------------------


def _out_shape(imp, op, k=0):
    return list(imp.tensor(op.outputs[k]).shape)


def _expand_dims_shape(imp, op):
    shape = _shape_of(imp, op, 0)
    axis = _ints(imp, op, 1, "axis")[0]
    axis = _axis(op, axis, len(shape) + 1)
    return shape[:axis] + [1] + shape[axis:]


def _squeeze_shape(imp, op):
    shape = _shape_of(imp, op, 0)
    o = op.options
    dims = [int(d) for d in o.SqueezeDimsAsNumpy()] if o is not None and o.SqueezeDimsLength() else []
    dims = {_axis(op, d, len(shape)) for d in dims} if dims else {k for k, d in enumerate(shape) if d == 1}
    return [d for k, d in enumerate(shape) if k not in dims or d != 1]


def _reshaper(shape_fn):
    return _folding(
        lambda imp, op, x, *_: x.reshape(shape_fn(imp, op)),
        lambda imp, op: _reshape(imp, _x(imp, op), shape_fn(imp, op)),
    )


def _perm(imp, op, rank):
    perm = _ints(imp, op, 1, "perm") if len(op.inputs) > 1 else list(range(rank))[::-1]
    return [_axis(op, p, rank) for p in perm]


transpose = _folding(
    lambda imp, op, x, _: x.transpose(_perm(imp, op, x.ndim)),
    lambda imp, op: imp.b.transpose(_x(imp, op), permutation=_perm(imp, op, _x(imp, op).rank)),
)


def _cast_np(imp, op, x):
    dt = value_dtype(imp, op, op.outputs[0])
    if imp.tensor(op.outputs[0]).type == tflite.TensorType.BOOL:
        return (x != 0).astype(np.uint8)
    return x.astype(dt)


def _cast(imp, op):
    x = _x(imp, op)
    out_t = imp.tensor(op.outputs[0])
    dt = np.dtype(value_dtype(imp, op, op.outputs[0])).name
    if out_t.type == tflite.TensorType.BOOL:
        return imp.b.cast(imp.b.not_equal(x, _scalar(imp, 0, x)), "uint8")
    return x if x.data_type == dt else imp.b.cast(x, dt)


cast = _folding(_cast_np, _cast)


def _shape(imp, op):
    dt = value_dtype(imp, op, op.outputs[0])
    return np.array(_shape_of(imp, op, 0), dtype=dt)


def _fill(imp, op):
    dims = _ints(imp, op, 0, "dims")
    vi = op.inputs[1]
    if imp.is_const(vi) and vi not in imp.values:
        v = imp.consts[vi].reshape(-1)[0]
        return np.full(dims, v, dtype=imp.consts[vi].dtype)
    v = _reshape(imp, imp.operand(op, vi), [1] * len(dims)) if dims else _x(imp, op, 1)
    return imp.b.expand(v, dims) if dims else v


def _range(imp, op, start, limit, delta):
    return np.arange(start.reshape(-1)[0], limit.reshape(-1)[0], delta.reshape(-1)[0]).astype(start.dtype)


def _range_graph(imp, op):
    raise op_error(op, "start, limit and delta must be constants (a size known at load)", NotSupportedError)


def _like(value):
    def np_fn(imp, op, x):
        return np.full(x.shape, value, dtype=x.dtype)

    def graph_fn(imp, op):
        x = _x(imp, op)
        return imp.b.expand(_scalar(imp, value, x), list(x.shape)) if x.shape else _scalar(imp, value, x)

    return _folding(np_fn, graph_fn)


def _pack_axis(imp, op, rank):
    return _axis(op, opt(op, "Axis", 0), rank + 1)


def _pack_np(imp, op, *xs):
    return np.stack(xs, axis=_pack_axis(imp, op, xs[0].ndim))


def _pack(imp, op):
    xs = [_x(imp, op, k) for k in range(len(op.inputs))]
    axis = _pack_axis(imp, op, xs[0].rank)
    shape = list(xs[0].shape)
    xs = [_reshape(imp, x, shape[:axis] + [1] + shape[axis:]) for x in xs]
    return xs[0] if len(xs) == 1 else imp.b.concat(xs, axis)


def _unpack_np(imp, op, x):
    axis = _axis(op, opt(op, "Axis", 0), x.ndim)
    return [np.take(x, k, axis=axis) for k in range(x.shape[axis])]


def _unpack(imp, op):
    x = _x(imp, op)
    axis = _axis(op, opt(op, "Axis", 0), x.rank)
    n = x.shape[axis]
    parts = imp.b.split(x, n, axis=axis) if n > 1 else [x]
    shape = [d for k, d in enumerate(x.shape) if k != axis]
    return [_reshape(imp, p, shape) for p in parts]


def _gather_np(imp, op, x, idx):
    if opt(op, "BatchDims", 0):
        raise op_error(op, "batch_dims != 0 is not supported", NotSupportedError)
    return np.take(x, idx.astype(np.int64), axis=_axis(op, opt(op, "Axis", 0), x.ndim))


def _gather(imp, op):
    if opt(op, "BatchDims", 0):
        raise op_error(op, "batch_dims != 0 is not supported", NotSupportedError)
    x = _x(imp, op)
    return imp.b.gather(x, _x(imp, op, 1), axis=_axis(op, opt(op, "Axis", 0), x.rank))


def _gather_nd_np(imp, op, x, idx):
    idx = idx.astype(np.int64)
    return x[tuple(np.moveaxis(idx, -1, 0))]


def _slice_bounds(imp, op, shape):
    begin = _ints(imp, op, 1, "begin")
    size = _ints(imp, op, 2, "size")
    size = [n - b if s == -1 else s for b, s, n in zip(begin, size, shape)]
    return begin, size


def _slice_np(imp, op, x, *_):
    begin, size = _slice_bounds(imp, op, x.shape)
    return x[tuple(slice(b, b + s) for b, s in zip(begin, size))]


def _slice(imp, op):
    x = _x(imp, op)
    begin, size = _slice_bounds(imp, op, x.shape)
    if begin == [0] * x.rank and size == list(x.shape):
        return x
    return imp.b.slice(x, begin, size)


def _split_common(imp, op, x_k, axis_k, sizes_k):
    shape = _shape_of(imp, op, x_k)
    axis = _axis(op, _ints(imp, op, axis_k, "axis")[0], len(shape))
    if sizes_k is None:
        n = int(opt(op, "NumSplits", 1))
        if n < 1 or shape[axis] % n:
            raise op_error(op, f"{n} splits do not divide dimension {axis} of size {shape[axis]}")
        return axis, [shape[axis] // n] * n
    sizes = _ints(imp, op, sizes_k, "size_splits")
    if sizes.count(-1) == 1:
        sizes[sizes.index(-1)] = shape[axis] - sum(s for s in sizes if s != -1)
    return axis, sizes


def _splitter(x_k, axis_k, sizes_k):
    def np_fn(imp, op, *arrs):
        axis, sizes = _split_common(imp, op, x_k, axis_k, sizes_k)
        return np.split(arrs[x_k], np.cumsum(sizes)[:-1], axis=axis)

    def graph_fn(imp, op):
        axis, sizes = _split_common(imp, op, x_k, axis_k, sizes_k)
        x = _x(imp, op, x_k)
        return [x] if len(sizes) == 1 else imp.b.split(x, sizes, axis=axis)

    return _folding(np_fn, graph_fn)


def _tile(imp, op):
    return imp.b.tile(_x(imp, op), _ints(imp, op, 1, "multiples"))


def _broadcast_to(imp, op):
    x = _x(imp, op)
    shape = _ints(imp, op, 1, "shape")
    return imp.b.expand(x, shape) if list(x.shape) != shape else x


def _reverse(imp, op):
    x = _x(imp, op)
    return imp.b.reverse(x, axes=sorted({_axis(op, a, x.rank) for a in _ints(imp, op, 1, "axis")}))


def _mirror_pad(imp, op):
    x = _x(imp, op)
    p = _c(imp, op, 1, "paddings").reshape(-1, 2).astype(np.int64)
    if opt(op, "Mode", 0) != tflite.MirrorPadMode.REFLECT:
        raise op_error(op, "SYMMETRIC mirror padding is not supported (REFLECT is)", NotSupportedError)
    return imp.b.pad(x, [int(v) for v in p[:, 0]], [int(v) for v in p[:, 1]], mode="reflection")


def _space_to_depth(imp, op):
    """NHWC: out[n, h, w, (i*bs + j)*C + c] = in[n, h*bs + i, w*bs + j, c] (depth_to_space's inverse)."""
    x = _x(imp, op)
    bs = int(opt(op, "BlockSize", 0))
    n, h, w, c = x.shape
    if bs < 1 or h % bs or w % bs:
        raise op_error(op, f"block size {bs} does not divide the {h} x {w} image")
    y = imp.b.reshape(x, [n * (h // bs), bs, w // bs, bs * c])  # rank 4: (j, c) stay merged
    y = imp.b.transpose(y, permutation=[0, 2, 1, 3])
    return imp.b.reshape(y, [n, h // bs, w // bs, bs * bs * c])


def _space_batch(to_batch):
    """SPACE_TO_BATCH_ND (pad, then block offsets into the batch) and BATCH_TO_SPACE_ND (the
    inverse, then crop), NHWC with a 2-D block: out[(i*bw + j)*N + n, h, w, c] = padded[n, h*bh + i,
    w*bw + j, c]."""

    def convert(imp, op):
        x = _x(imp, op)
        bh, bw = _ints(imp, op, 1, "block_shape")
        p = _c(imp, op, 2, "paddings" if to_batch else "crops").reshape(-1, 2).astype(np.int64)
        b = imp.b
        if x.rank != 4 or p.shape[0] != 2:
            raise op_error(op, "only NHWC inputs with a 2-D block are supported", NotSupportedError)
        if to_batch:
            if p.any():
                x = b.pad(x, [0, int(p[0, 0]), int(p[1, 0]), 0], [0, int(p[0, 1]), int(p[1, 1]), 0])
            n, h, w, c = x.shape
            y = b.reshape(x, [n, h // bh, bh, w // bw, bw, c])
            y = b.transpose(y, permutation=[2, 4, 0, 1, 3, 5])
            return b.reshape(y, [bh * bw * n, h // bh, w // bw, c])
        nb, h, w, c = x.shape
        n = nb // (bh * bw)
        y = b.reshape(x, [bh, bw, n, h, w, c])
        y = b.transpose(y, permutation=[2, 3, 0, 4, 1, 5])
        y = b.reshape(y, [n, h * bh, w * bw, c])
        if p.any():
            t, l = int(p[0, 0]), int(p[1, 0])
            y = b.slice(y, [0, t, l, 0], [n, h * bh - t - int(p[0, 1]), w * bw - l - int(p[1, 1]), c])
        return y

    return convert


def _add_n(imp, op):
    xs = [_x(imp, op, k) for k in range(len(op.inputs))]
    y = xs[0]
    for v in xs[1:]:
        y = imp.b.add(y, v)
    return y


def _embedding_lookup(imp, op):
    """EMBEDDING_LOOKUP(ids, table): rows of the table (int8 tables dequantized at load)."""
    return imp.b.gather(_x(imp, op, 1), _x(imp, op, 0), axis=0)


# -- elementwise ----------------------------------------------------------------------------------


def _unary(fn):
    def convert(imp, op):
        return fn(imp, _x(imp, op))

    return convert


def _binary(fn):
    def convert(imp, op):
        return activation(imp, op, fn(imp, _x(imp, op), _x(imp, op, 1)))

    return convert


def _bool_out(method):
    """A comparison or logical operator: WebNN gives uint8 0 / 1, TFLite's BOOL as this importer holds it."""

    def convert(imp, op):
        return getattr(imp.b, method)(*[_x(imp, op, k) for k in range(len(op.inputs))])

    return convert


def _floor_div(imp, a, c):
    b = imp.b
    if a.data_type in ("float32", "float16"):
        return b.floor(b.div(a, c))
    raise NotSupportedError(f"[tflite] FLOOR_DIV of {a.data_type} tensors is not supported (float is)")


def _floor_mod(imp, a, c):
    b = imp.b
    if a.data_type in ("float32", "float16"):
        return b.sub(a, b.mul(b.floor(b.div(a, c)), c))
    raise NotSupportedError(f"[tflite] FLOOR_MOD of {a.data_type} tensors is not supported (float is)")


def _gelu(imp, op):
    approx = "tanh" if opt(op, "Approximate", False) else "none"
    return onnx_gelu(_OnnxView(imp), None, [_x(imp, op)], {"approximate": approx})


class _OnnxView:
    """The ONNX importer's interface as its shared elementwise handlers read it (the builder, and
    inputs that already are operands), so TFLite reuses them instead of restating them."""

    def __init__(self, imp):
        self.b = imp.b

    def operand(self, v, like=None):
        return v


def _select(imp, op):
    cond, a, c = (_x(imp, op, k) for k in range(3))
    if op.name == "SELECT" and cond.rank == 1 and a.rank > 1 and cond.shape[0] == a.shape[0] != 1:
        cond = _reshape(imp, cond, [cond.shape[0]] + [1] * (a.rank - 1))  # rank-one select: per row
    return imp.b.where(cond, a, c)


def _l2_norm(imp, op):
    x = _x(imp, op)
    b = imp.b
    norm = b.sqrt(b.reduce_sum(b.mul(x, x), axes=[x.rank - 1], keep_dimensions=True))
    return activation(imp, op, b.div(x, b.max(norm, _scalar(imp, 1e-6, x))))


def _log_softmax(imp, op):
    x = _x(imp, op)
    b = imp.b
    m = b.reduce_max(x, axes=[x.rank - 1], keep_dimensions=True)
    s = b.sub(x, m)
    return b.sub(s, b.log(b.reduce_sum(b.exp(s), axes=[x.rank - 1], keep_dimensions=True)))


# -- reductions, arg max, cumulative sum ---------------------------------------------------------


def _reduction(imp, op):
    """(x, its axes sorted, KeepDims) of a reduction."""
    x = _x(imp, op)
    return x, sorted({_axis(op, a, x.rank) for a in _ints(imp, op, 1, "axes")}), bool(opt(op, "KeepDims", False))


def _reduce(method):
    def convert(imp, op):
        x, axes, keep = _reduction(imp, op)
        return getattr(imp.b, method)(x, axes=axes, keep_dimensions=keep) if axes else x

    return convert


def _arg(method):
    def convert(imp, op):
        x = _x(imp, op)
        axis = _axis(op, _ints(imp, op, 1, "axis")[0], x.rank)
        dt = np.dtype(value_dtype(imp, op, op.outputs[0])).name
        return getattr(imp.b, method)(x, axis, output_data_type=dt)

    return convert


def _cumsum(imp, op):
    x = _x(imp, op)
    axis = _axis(op, _ints(imp, op, 1, "axis")[0], x.rank)
    return imp.b.cumulative_sum(x, axis, exclusive=bool(opt(op, "Exclusive", False)),
                                reversed=bool(opt(op, "Reverse", False)))  # fmt: skip


# -- matmul and the recurrent layer ---------------------------------------------------------------


def _batch_matmul(imp, op):
    a, c = _x(imp, op), _x(imp, op, 1)
    b = imp.b

    def t(v):
        return b.transpose(v, permutation=list(range(v.rank - 2)) + [v.rank - 1, v.rank - 2])

    def mm(x, y):
        return b.matmul(t(x) if opt(op, "AdjX", False) else x, t(y) if opt(op, "AdjY", False) else y)

    ta, tc, to = (imp.tensor(i) for i in (op.inputs[0], op.inputs[1], op.outputs[0]))
    y = quantized.batch_matmul(b, a, c, ta, tc, to, mm)  # int8: TFLite's fixed point
    return mm(a, c) if y is None else y


def _unidirectional_lstm(imp, op):
    """UNIDIRECTIONAL_SEQUENCE_LSTM (float; no peephole, projection or layer normalization) as one
    WebNN lstm with gate layout "ifgo". The state inputs 18 / 19 are variable tensors, which
    LiteRT carries between invokes: in a session (import_model with initial_state) they are state
    kept between runs (control.variable_tensor; zeros at first and after reset_state(), as LiteRT's
    after reset_all_variables()), else zeros at the start of each call."""
    ins = list(op.inputs) + [-1] * (24 - len(op.inputs))
    for k, what in [(9, "peephole"), (10, "peephole"), (11, "peephole"), (16, "projection"),
                    (17, "projection"), (20, "layer normalization"), (21, "layer normalization"),
                    (22, "layer normalization"), (23, "layer normalization")]:  # fmt: skip
        if ins[k] >= 0:
            raise op_error(op, f"{what} weights (input {k}) are not supported", NotSupportedError)
    if ins[1] < 0:
        raise op_error(op, "CIFG (no input gate) is not supported", NotSupportedError)
    if opt(op, "ProjClip", 0.0):
        raise op_error(op, "projection clipping is not supported", NotSupportedError)
    act = {ACT.TANH: "tanh", ACT.RELU: "relu"}.get(opt(op, "FusedActivationFunction", ACT.TANH))
    if act is None:
        raise op_error(op, f"activation {opt(op, 'FusedActivationFunction', 0)} is not supported (TANH, RELU are)",
                       NotSupportedError)  # fmt: skip
    b = imp.b
    x = _x(imp, op)
    time_major = bool(opt(op, "TimeMajor", False))
    if not time_major:
        x = b.transpose(x, permutation=[1, 0, 2])
    steps, batch, _ = x.shape

    def stacked(ks, what):
        arrs = [np.asarray(imp.const_value(op, ins[k], what), np.float32) for k in ks]
        return np.concatenate(arrs, axis=0)[None]

    w = stacked([1, 2, 3, 4], "input weights")  # i, f, c, o -> "ifgo"
    r = stacked([5, 6, 7, 8], "recurrent weights")
    hidden = r.shape[1] // 4
    kw = {"layout": "ifgo", "activations": ["sigmoid", act, act], "return_sequence": True}
    if all(ins[k] >= 0 for k in (12, 13, 14, 15)):
        kw["bias"] = imp.b.constant(np.ascontiguousarray(stacked([12, 13, 14, 15], "gate biases")))
    state = {}
    for k, name in [(18, "initial_hidden_state"), (19, "initial_cell_state")]:
        var = control.variable_tensor(imp, op, ins[k]) if ins[k] >= 0 else None
        if var is not None:
            state[k] = var
            kw[name] = _reshape(imp, control.to_operand(imp, control.read_state(imp, op, var)), [1, batch, hidden])
        elif ins[k] >= 0 and ins[k] in imp.values:
            kw[name] = _reshape(imp, imp.values[ins[k]], [1, batch, hidden])
    c = imp.b.constant
    w, r = c(np.ascontiguousarray(w)), c(np.ascontiguousarray(r))
    clip = float(opt(op, "CellClip", 0.0))
    # |c_t| < t while the cell input is tanh (|i * g| < 1 a step): a clip above the step count
    # never acts (the Keras converter writes 10), so one fused lstm computes the same values
    if clip <= 0 or (act == "tanh" and steps <= clip):
        outs = b.lstm(x, w, r, steps, hidden, **kw)
        y, h, cs = _reshape(imp, outs[2], [steps, batch, hidden]), outs[0], outs[1]
    else:  # the cell state clipped every step: the layer unrolled as lstm_cell steps
        y, h, cs = _clipped_lstm(imp, x, w, r, steps, batch, hidden, clip, kw)
    for k, v in ((18, h), (19, cs)):  # the state the next call starts from
        if k in state:
            control.write_state(state[k], _reshape(imp, v, list(imp.tensor(ins[k]).shape)))
    return y if time_major else b.transpose(y, permutation=[1, 0, 2])


def _clipped_lstm(imp, x, w, r, steps, batch, hidden, clip, kw):
    """TFLite's cell, step by step: gates = x W' + h R' + bias (i, f, g, o), c = clip(f c + i g),
    h = o act(c): the output reads the clipped cell state."""
    b = imp.b
    act = getattr(b, kw["activations"][1])
    zeros = np.zeros((batch, hidden), np.float32)
    h = (
        _reshape(imp, kw["initial_hidden_state"], [batch, hidden])
        if "initial_hidden_state" in kw
        else b.constant(zeros)
    )
    cs = _reshape(imp, kw["initial_cell_state"], [batch, hidden]) if "initial_cell_state" in kw else b.constant(zeros)
    w2, r2 = _reshape(imp, w, w.shape[1:]), _reshape(imp, r, r.shape[1:])
    bias = _reshape(imp, kw["bias"], [kw["bias"].shape[1]]) if "bias" in kw else None
    xs = b.split(x, steps, axis=0) if steps > 1 else [x]
    ys = []
    for xt in xs:
        gates = b.add(b.gemm(_reshape(imp, xt, [batch, x.shape[2]]), w2, c=bias, b_transpose=True),
                      b.gemm(h, r2, b_transpose=True))  # fmt: skip
        i, f, g, o = b.split(gates, 4, axis=1)
        cs = b.add(b.mul(b.sigmoid(f), cs), b.mul(b.sigmoid(i), act(g)))
        cs = b.clamp(cs, min_value=-clip, max_value=clip)
        h = b.mul(b.sigmoid(o), act(cs))
        ys.append(_reshape(imp, h, [1, batch, hidden]))
    return (ys[0] if steps == 1 else b.concat(ys, 0)), h, cs


def _u(name):
    return _unary(lambda imp, x: getattr(imp.b, name)(x))


def squared_difference(imp, op):
    """SQUARED_DIFFERENCE; int8 as TFLite's fixed-point kernel, a 256 x 256 table (quantized.py)."""
    a, c = _x(imp, op), _x(imp, op, 1)
    ta, tc, to = (imp.tensor(i) for i in (op.inputs[0], op.inputs[1], op.outputs[0]))
    y = quantized.lookup2(
        imp.b, a, c, ta, tc, to, lambda p, q: quantized.squared_difference_reference(p, q, ta, tc, to)
    )
    return activation(imp, op, imp.b.mul(imp.b.sub(a, c), imp.b.sub(a, c)) if y is None else y)


def leaky_relu(imp, op):
    """LEAKY_RELU; int8 / uint8 as LiteRT's integer kernels, a 256-entry table (quantized.py)."""
    x, alpha = _x(imp, op), float(opt(op, "Alpha", 0.2))
    tx, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
    y = quantized.lookup(imp.b, x, tx, to, lambda q: quantized.leaky_relu_reference(q, tx, to, alpha))
    return imp.b.leaky_relu(x, alpha=alpha) if y is None else y


def _table_unary(method, reference):
    """LOGISTIC / TANH; int8 / uint8 as TFLite's 256-entry tables (quantized.py)."""

    def convert(imp, op):
        x = _x(imp, op)
        tx, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
        y = quantized.lookup(imp.b, x, tx, to, lambda q: reference(q, tx, to))
        return getattr(imp.b, method)(x) if y is None else y

    return convert


def _softmax(imp, op):
    """SOFTMAX over the last axis; int8 / uint8 as TFLite's table kernel (quantized.py)."""
    x, beta = _x(imp, op), float(opt(op, "Beta", 1.0))
    y = quantized.softmax(imp.b, x, imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0]), beta)
    if y is not None:
        return y
    if beta != 1.0:
        x = imp.b.mul(x, imp.b.constant(data_type=x.data_type, value=beta))
    return imp.b.softmax(x, axis=x.rank - 1)


def _mean(imp, op):
    """MEAN; int8 / uint8 as XNNPACK's integer kernel (quantized.py)."""
    x, axes, keep = _reduction(imp, op)
    if not axes:
        return x
    y = int16.mean(imp, op, x, axes, keep)  # 16x8: TFLite's int16 kernel
    if y is None:
        y = quantized.mean(imp.b, x, imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0]), axes, keep)
    return imp.b.reduce_mean(x, axes=axes, keep_dimensions=keep) if y is None else y


CONVERTERS = {
    "EXPAND_DIMS": _reshaper(_expand_dims_shape),
    "SQUEEZE": _reshaper(_squeeze_shape),
    "TRANSPOSE": transpose,
    "CAST": cast,
    "SHAPE": lambda imp, op: _shape(imp, op),
    "FILL": _fill,
    "RANGE": _folding(_range, _range_graph),
    "ZEROS_LIKE": _like(0),
    "ONES_LIKE": _like(1),
    "PACK": _folding(_pack_np, _pack),
    "UNPACK": _folding(_unpack_np, _unpack),
    "GATHER": _folding(_gather_np, _gather),
    "GATHER_ND": _folding(_gather_nd_np, lambda imp, op: imp.b.gather_nd(_x(imp, op), _x(imp, op, 1))),
    "SLICE": _folding(_slice_np, _slice),
    "SPLIT": _splitter(1, 0, None),
    "SPLIT_V": _splitter(0, 2, 1),
    "TILE": _folding(lambda imp, op, x, m: np.tile(x, m.reshape(-1)), _tile),
    "BROADCAST_TO": _folding(lambda imp, op, x, s: np.broadcast_to(x, s.reshape(-1)), _broadcast_to),
    "REVERSE_V2": _reverse,
    "MIRROR_PAD": _mirror_pad,
    "SPACE_TO_DEPTH": _space_to_depth,
    "SPACE_TO_BATCH_ND": _space_batch(True),
    "BATCH_TO_SPACE_ND": _space_batch(False),
    "RANK": lambda imp, op: np.array(len(_shape_of(imp, op, 0)), value_dtype(imp, op, op.outputs[0])),
    "ADD_N": _add_n,
    "EMBEDDING_LOOKUP": _embedding_lookup,
    "RELU_0_TO_1": _unary(lambda imp, x: imp.b.clamp(x, min_value=0.0, max_value=1.0)),
    "RSQRT": _unary(lambda imp, x: imp.b.reciprocal(imp.b.sqrt(x))),
    "SQRT": _u("sqrt"),
    "SQUARE": _unary(lambda imp, x: imp.b.mul(x, x)),
    "LOG": _u("log"),
    "EXP": _u("exp"),
    "ABS": _u("abs"),
    "NEG": _u("neg"),
    "SIN": _u("sin"),
    "COS": _u("cos"),
    "FLOOR": _u("floor"),
    "CEIL": _u("ceil"),
    "ROUND": _u("round_even"),  # TensorFlow rounds half to even
    "SIGN": _u("sign"),
    "ELU": _u("elu"),
    "GELU": _gelu,
    "LEAKY_RELU": leaky_relu,
    "LOGISTIC": _table_unary("sigmoid", quantized.logistic_reference),
    "TANH": _table_unary("tanh", quantized.tanh_reference),
    "SOFTMAX": _softmax,
    "MEAN": _mean,
    "LOG_SOFTMAX": _log_softmax,
    "L2_NORMALIZATION": _l2_norm,
    "POW": _binary(lambda imp, a, c: imp.b.pow(a, c)),
    "SQUARED_DIFFERENCE": squared_difference,
    "FLOOR_DIV": _binary(_floor_div),
    "FLOOR_MOD": _binary(_floor_mod),
    "EQUAL": _bool_out("equal"),
    "NOT_EQUAL": _bool_out("not_equal"),
    "LESS": _bool_out("lesser"),
    "LESS_EQUAL": _bool_out("lesser_or_equal"),
    "GREATER": _bool_out("greater"),
    "GREATER_EQUAL": _bool_out("greater_or_equal"),
    "LOGICAL_AND": _bool_out("logical_and"),
    "LOGICAL_OR": _bool_out("logical_or"),
    "LOGICAL_NOT": _bool_out("logical_not"),
    "SELECT": _select,
    "SELECT_V2": _select,
    "REDUCE_MAX": _reduce("reduce_max"),
    "REDUCE_MIN": _reduce("reduce_min"),
    "REDUCE_PROD": _reduce("reduce_product"),
    "REDUCE_ANY": _reduce("reduce_max"),  # uint8 0 / 1
    "REDUCE_ALL": _reduce("reduce_min"),
    "SUM": _reduce("reduce_sum"),
    "ARG_MAX": _arg("arg_max"),
    "ARG_MIN": _arg("arg_min"),
    "CUMSUM": _cumsum,
    "BATCH_MATMUL": _batch_matmul,
    "UNIDIRECTIONAL_SEQUENCE_LSTM": _unidirectional_lstm,
}
