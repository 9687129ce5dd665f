"""TFLite operators -> MLGraphBuilder calls, in NHWC (TFLite's own layout: no transposes).

Each converter takes (imp, op) and returns the output operand(s). Constants stay numpy arrays in
`imp.consts` until an operator needs them as operands, so load-time folding (DEQUANTIZE of float16
or int8 weights, RESHAPE of a constant) is plain numpy.
"""

import struct

import numpy as np
import tflite

from ..errors import DataError, NotSupportedError
from . import control, general_ops, int16, mediapipe_ops, quantized, staging
from .common import PAD, activation, op_error, opt
from .hybrid import HYBRID_OPS, hybrid_inputs
from .reader import Model, Operator

# -- padding arithmetic (pure; unit-tested) ----------------------------------------------------


def same_padding(in_size, kernel, stride, dilation=1):
    """TFLite SAME padding as WebNN (beginning, ending): out = ceil(in / stride), the odd pixel at
    the end (ComputePaddingWithOffset in tensorflow/lite/kernels/padding.h)."""
    eff = (kernel - 1) * dilation + 1
    out = (in_size + stride - 1) // stride
    total = max((out - 1) * stride + eff - in_size, 0)
    return total // 2, total - total // 2


def conv_padding(padding, in_hw, kernel_hw, strides, dilations=(1, 1)):
    """TFLite Padding (SAME / VALID) -> WebNN padding [top, bottom, left, right]."""
    if padding == PAD.VALID:
        return [0, 0, 0, 0]
    if padding != PAD.SAME:
        raise NotSupportedError(f"[tflite] unknown padding type {padding}")
    t, b = same_padding(in_hw[0], kernel_hw[0], strides[0], dilations[0])
    l, r = same_padding(in_hw[1], kernel_hw[1], strides[1], dilations[1])
    return [t, b, l, r]


def transpose_conv_padding(padding, in_size, kernel, stride, out_size):
    """Builtin TRANSPOSE_CONV: (beginning, ending, output_padding) for a given output size.

    TFLite computes the padding as if a convolution mapped the output back to the input
    (transpose_conv.cc), starts each input pixel's footprint at `in * stride - beginning`, and
    drops what falls outside [0, out_size)."""
    if padding == PAD.SAME:
        beg, _ = same_padding(out_size, kernel, stride)
    else:
        beg = 0
    full = (in_size - 1) * stride + kernel
    end = full - out_size - beg
    out_pad = 0
    if end < 0:
        out_pad, end = -end, 0
    return beg, end, out_pad


def mediapipe_transpose_conv_padding(padding, in_size, kernel, stride):
    """MediaPipe Convolution2DTransposeBias: (beginning, ending), output size follows from them.
    padding uses TfLitePadding (1 = SAME, 2 = VALID)."""
    if padding == 1:
        total = max(0, kernel - (in_size - 1) % stride - 1)
        return total // 2, total - total // 2
    return 0, 0


# subgraphs (IF, WHILE, CALL_ONCE) within subgraphs, at most this deep
MAX_DEPTH = 16

# -- the importer -------------------------------------------------------------------------------


class _Float16Builder:
    """The builder as the converters see it in float16 mode: float32 host constants they make
    (activation bounds, MediaPipe's coordinate grids, folded weights) become float16, so that
    every float tensor of the graph is float16. Everything else is the builder itself."""

    def __init__(self, builder):
        self._b = builder

    def __getattr__(self, name):
        return getattr(self._b, name)

    def constant(self, *args, **kw):
        if len(args) == 1 and not kw and isinstance(args[0], np.ndarray) and args[0].dtype.kind == "f":
            args = (args[0].astype(np.float16),)
        elif kw.get("data_type") == "float32":
            kw["data_type"] = "float16"
        return self._b.constant(*args, **kw)


class Importer:
    """One subgraph recorded into the builder. The model's subgraph 0 is the root; IF branches,
    WHILE bodies and CALL_ONCE's initialization run as children (`run_subgraph`) on the same
    builder, sharing the root's resource variables (control.py)."""

    def __init__(self, model: Model, builder, free_dimensions=None, float16=False, parent=None):
        self.model = model
        self.parent = parent
        self.root = self if parent is None else parent.root
        self.depth = 0 if parent is None else parent.depth + 1
        # float16: the graph computes in float16 (in f16 where the context has "shader-f16"):
        # float16 weights stay float16, float32 ones are rounded to it, float32 inputs and
        # outputs keep their type with a cast at the edge
        self.float16 = bool(float16)
        if parent is not None:
            self.b = parent.b
        else:
            self.b = _Float16Builder(builder) if self.float16 else builder
        self.values = {}  # tensor index -> MLOperand
        self.consts = {}  # tensor index -> numpy array (float16/int8 weights already dequantized)
        self.handles = {}  # tensor index -> the resource variable a VAR_HANDLE names (control.py)
        self.free = dict(free_dimensions or {}) if parent is None else parent.free
        self.mode = "main" if parent is None else parent.mode  # "init": CALL_ONCE's subgraph
        if parent is None:
            self.variables = {}  # (container, shared_name) -> control.Variable
            self.file_consts = {}  # (subgraph, tensor) -> MLOperand: a child's weights made once
            self.initialized = set()  # subgraphs CALL_ONCE ran
            self.carry_variable_tensors = False  # an LSTM's state tensors carried between calls
            self.staged = None  # staging.Snapshot: an import as stages (InferenceSession), else one graph
        self.start = 0  # the operator run_ops starts at (a resumed stage's: staging.bind)
        self.branch_of = None  # the main subgraph's IF this is a branch of, where a stage may end inside
        for t in model.tensors:
            if t.data is not None:
                self.consts[t.index] = t.data

    # tensors
    def tensor(self, i):
        return self.model.tensors[i]

    def is_const(self, i):
        return i in self.consts

    def const_value(self, op, i, what):
        if i not in self.consts:
            raise NotSupportedError(
                f"[tflite] operator {op.index} ({op.display}): {what} (tensor {i} '{self.tensor(i).name}') "
                f"must be a constant"
            )
        return self.consts[i]

    def operand(self, op, i):
        """The MLOperand for tensor i (a constant becomes a builder constant on first use)."""
        if i in self.values:
            return self.values[i]
        if i in self.consts:
            arr = self.consts[i]
            t = self.tensor(i)
            if t.scale is not None and arr.dtype.kind in "iu":  # int8 weights, int32 biases
                arr = quantized.dequantize_array(arr, t)
            if arr.dtype == np.float64:
                arr = arr.astype(np.float32)
            if self.float16 and arr.dtype.kind == "f":
                arr = arr.astype(np.float16)
            if arr.dtype == np.bool_:
                arr = arr.astype(np.uint8)  # TFLite BOOL is WebNN uint8 0 / 1, as comparisons give
            from_file = self.consts[i] is t.data and self.parent is not None
            key = (self.model.index, i)
            v = self.root.file_consts.get(key) if from_file else None
            if v is None:
                v = self.b.constant(np.array(arr, order="C"))  # (ascontiguousarray makes scalars 1-d)
                if from_file:  # a loop body unrolled: its weights are one constant, not one an iteration
                    self.root.file_consts[key] = v
            self.values[i] = v
            return v
        t = self.tensor(i)
        raise DataError(
            f"[tflite] operator {op.index} ({op.display}) reads tensor {i} ('{t.name}') before it is computed"
        )

    def input_shape(self, t):
        shape = list(t.shape)
        if t.name in self.free:
            want = [int(d) for d in self.free[t.name]]
            if len(want) != len(shape) or any(s != -1 and s != w for s, w in zip(t.signature, want)):
                raise TypeError(
                    f"[tflite] free_dimensions['{t.name}'] = {want} does not fit the input's shape signature "
                    f"{list(t.signature)} (-1 marks a free dimension)"
                )
            return want
        for k, d in enumerate(t.signature):
            if d == -1 and k == 0 and "batch" in self.free:
                shape[k] = int(self.free["batch"])
        return shape

    # the run
    def run(self):
        m = self.model
        names = []
        known = {m.tensors[i].name for i in m.inputs} | {"batch"}
        unknown = sorted(set(self.free) - known)
        if unknown:
            raise TypeError(
                f"[tflite] free_dimensions keys {unknown} name no model input; use an input name "
                f"({', '.join(sorted(known - {'batch'}))}) with its full shape, or 'batch' for free leading dimensions"
            )
        for i in m.inputs:
            t = m.tensors[i]
            if (
                t.data_type in (None, "int16")
                or t.scale is not None
                and t.data_type not in ("float32", *quantized.QUANT_TYPES)
            ):
                raise NotSupportedError(
                    f"[tflite] input {i} ('{t.name}') has type {t.type_name}"
                    f"{' (quantized)' if t.scale is not None else ''}; {t.type_name} inputs are not supported"
                )
            shape = self.input_shape(t)
            name = t.name or f"input_{i}"
            x = self.b.input(name, data_type=t.data_type, shape=shape)
            if quantized.is_quantized(t):
                x = quantized.from_integer(self.b, x, t, "float16" if self.float16 else "float32")  # real values
            self.values[i] = self.b.cast(x, "float16") if self.float16 and t.data_type == "float32" else x
            names.append((name, t.data_type, tuple(shape)))

        if self.staged is not None:
            staging.bind(self)  # a resumed stage: the values the earlier stage left, as inputs
        self.run_ops()

        if not m.outputs:
            raise DataError("[tflite] subgraph 0 lists no outputs")
        outputs = {}
        out_desc = []
        for i in m.outputs:
            t = m.tensors[i]
            name = t.name or f"output_{i}"
            v = self.values.get(i)
            if v is None and i in self.consts:
                v = self.operand(None, i)
            if v is None:
                raise DataError(f"[tflite] model output {i} ('{name}') is never computed")
            if self.float16 and v.data_type == "float16" and t.data_type == "float32":
                v = self.b.cast(v, "float32")  # the type the model declares
            if quantized.is_quantized(t) and v.data_type != t.data_type:
                v = quantized.to_integer(self.b, v, t)
            if v._kind in ("input", "constant") or name in outputs:
                v = self.b.identity(v)
            outputs[name] = v
            out_desc.append((name, v.data_type, tuple(v.shape)))
        control.state_edges(self, names, outputs, out_desc)
        return outputs, names, out_desc

    def run_ops(self):
        """Convert this subgraph's operators in order (their inputs already set)."""
        for op in self.model.operators[self.start :]:
            fn = CONVERTERS.get(op.custom_code if op.custom_code is not None else op.name)
            if fn is None:
                raise NotSupportedError(unsupported_message(op))
            self.check_types(op)
            try:
                out = control.fold(self, op)
                if out is None:
                    out = fn(self, op)
            except (DataError, NotSupportedError):
                raise
            except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, OverflowError, AttributeError,
                    struct.error) as e:  # fmt: skip
                # The builder rejected what the file asked for (shapes that do not fit together,
                # an axis out of range...): the model is inconsistent.
                raise DataError(f"[tflite] operator {op.index} ({op.display}): {e}") from e
            if out is None:  # folded at load
                continue
            outs = out if isinstance(out, (list, tuple)) else [out]
            if len(outs) < len(op.outputs):
                raise op_error(op, f"lists {len(op.outputs)} outputs, it computes {len(outs)}")
            for i, v in zip(op.outputs, outs):
                if isinstance(v, control.Handle):
                    self.handles[i] = v.key
                    continue
                self.check_shape(op, i, v)
                if isinstance(v, np.ndarray):
                    self.consts[i] = v
                elif quantized.is_quantized(self.tensor(i)) and v.data_type in ("float32", "float16"):
                    self.values[i] = quantized.requantize(self.b, v, self.tensor(i))  # onto its int8 grid
                else:
                    self.values[i] = v

    def run_subgraph(self, op, index, args, mode=None, branch=False):
        """Subgraph `index` run on `args` (operands, numpy constants or control.Handle, one an input):
        its outputs, constants where they fold at load. mode "init": CALL_ONCE's initialization.
        branch: the subgraph is a branch of IF `op`, inside which a stage may end (staging.py)."""
        subgraphs = self.model.subgraphs
        if not 0 < index < len(subgraphs):
            raise op_error(op, f"names subgraph {index}; the model has {len(subgraphs)} (0 is the main one)")
        if self.depth >= MAX_DEPTH:
            raise op_error(op, f"subgraphs nest deeper than {MAX_DEPTH} (a subgraph that calls itself?)")
        sg = subgraphs[index]
        if len(args) != len(sg.inputs):
            raise op_error(op, f"passes {len(args)} values to subgraph {index}, which has {len(sg.inputs)} inputs")
        child = Importer(sg, None, float16=self.float16, parent=self)
        child.mode = mode or self.mode
        for i, v in zip(sg.inputs, args):
            if isinstance(v, control.Handle):
                child.handles[i] = v.key
            elif isinstance(v, np.ndarray):
                child.consts[i] = v
            else:
                child.values[i] = v
        if branch:
            child.branch_of = op
            staging.bind_branch(child, op)
        child.run_ops()
        outs = []
        for i in sg.outputs:
            if i in child.handles:
                outs.append(control.Handle(child.handles[i]))
            elif i in child.values:
                outs.append(child.values[i])
            elif i in child.consts:
                outs.append(child.consts[i])
            else:
                raise op_error(op, f"subgraph {index}'s output {i} ('{sg.tensors[i].name}') is never computed")
        return outs

    def arg(self, op, i):
        """Tensor i as an argument of a subgraph: a constant, a resource handle or an operand."""
        if i in self.handles:
            return control.Handle(self.handles[i])
        if i in self.consts and i not in self.values:
            return self.consts[i]
        return self.operand(op, i)

    def check_shape(self, op, i, v):
        """The shape an operator computes must be the one the file declares (where the declaration
        is fixed): a corrupted shape otherwise flows on into huge or inconsistent tensors."""
        t = self.tensor(i)
        got = tuple(int(d) for d in v.shape)
        if len(got) != len(t.shape) and t.shape:
            ok = False
        else:
            ok = not t.shape or all(s == -1 or d == g for d, s, g in zip(t.shape, t.signature, got))
        if not ok and not self.free:
            raise DataError(
                f"[tflite] operator {op.index} ({op.display}) computes tensor {i} ('{t.name}') with shape "
                f"{list(got)}, the model declares {list(t.shape)}"
            )

    def is_hybrid(self, op):
        """A float operator reading an int8 / uint8 quantized constant (dynamic-range weights)."""
        ts = [self.tensor(i) for i in op.inputs if i >= 0]
        float_act = any(t.data_type in ("float32", "float16") and t.index not in self.consts for t in ts)
        q_const = any(t.index in self.consts and quantized.is_quantized(t) for t in ts)
        return float_act and q_const

    def check_types(self, op):
        """Reject types WebNN has no form for (int16 that is not a quantized activation) and dynamic-range forms
        LiteRT computes with a run-time quantization hybrid.py does not reproduce, naming the operator."""
        if op.name not in HYBRID_OPS and op.name != "DEQUANTIZE" and self.is_hybrid(op):
            raise NotSupportedError(
                f"[tflite] operator {op.index} ({op.display}): int8 weights with float activations (dynamic range) "
                f"are supported for {', '.join(HYBRID_OPS)}, not this operator"
            )
        for i in list(op.inputs) + list(op.outputs):
            if i < 0:
                continue
            t = self.tensor(i)
            if i in self.consts and op.name == "DEQUANTIZE":
                continue
            if t.type == tflite.TensorType.RESOURCE and op.name in control.RESOURCE_OPS:
                continue
            if t.data_type is None and i not in self.consts and t.type != tflite.TensorType.BOOL:
                raise NotSupportedError(
                    f"[tflite] operator {op.index} ({op.display}): tensor {i} ('{t.name}') has type {t.type_name}, "
                    f"which WebNN does not support"
                )


def unsupported_message(op):
    supported = (
        ", ".join(sorted(k for k in CONVERTERS if k.isupper()))
        + ", CUSTOM "
        + ", ".join(f"'{k}'" for k in sorted(k for k in CONVERTERS if not k.isupper()))
    )
    return f"[tflite] operator {op.index} ({op.display}) is not supported; supported operators: {supported}"


# -- helpers for converters ----------------------------------------------------------------------


def _f32(arr):
    return np.ascontiguousarray(arr, dtype=np.float32)


def _bias(imp, op, k):
    if len(op.inputs) <= k or op.inputs[k] < 0:
        return None
    return imp.operand(op, op.inputs[k])


# -- converters -----------------------------------------------------------------------------------


def _weighted(imp, op):
    """(input, weight, bias, rescale) operands; int8 weights of a float operator (dynamic range)
    via hybrid.py, int8 activations in XNNPACK's integer arithmetic via quantized.py."""
    q = quantized.integer_weighted(imp, op)
    if q is not None:
        return q
    x = imp.operand(op, op.inputs[0])
    x, w = hybrid_inputs(imp, op, x, 1)
    return x, (w if w is not None else imp.operand(op, op.inputs[1])), _bias(imp, op, 2), lambda y: y


def conv_2d(imp, op):
    x, w, bias, rescale = _weighted(imp, op)
    sh, sw = opt(op, "StrideH", 1), opt(op, "StrideW", 1)
    dh, dw = opt(op, "DilationHFactor", 1), opt(op, "DilationWFactor", 1)
    o, kh, kw, ci = w.shape
    pad = conv_padding(opt(op, "Padding", PAD.SAME), x.shape[1:3], (kh, kw), (sh, sw), (dh, dw))
    groups = x.shape[3] // ci if ci else 1
    y = imp.b.conv2d(
        x,
        w,
        padding=pad,
        strides=[sh, sw],
        dilations=[dh, dw],
        groups=groups,
        input_layout="nhwc",
        filter_layout="ohwi",
        bias=bias,
    )
    return activation(imp, op, rescale(y))


def depthwise_conv_2d(imp, op):
    x, w, bias, rescale = _weighted(imp, op)  # w: [1, kh, kw, C * multiplier]: WebNN "ihwo", groups = C
    sh, sw = opt(op, "StrideH", 1), opt(op, "StrideW", 1)
    dh, dw = opt(op, "DilationHFactor", 1), opt(op, "DilationWFactor", 1)
    _, kh, kw, _ = w.shape
    pad = conv_padding(opt(op, "Padding", PAD.SAME), x.shape[1:3], (kh, kw), (sh, sw), (dh, dw))
    y = imp.b.conv2d(
        x,
        w,
        padding=pad,
        strides=[sh, sw],
        dilations=[dh, dw],
        groups=x.shape[3],
        input_layout="nhwc",
        filter_layout="ihwo",
        bias=bias,
    )
    return activation(imp, op, rescale(y))


def transpose_conv(imp, op):
    out_shape = [int(v) for v in imp.const_value(op, op.inputs[0], "output_shape").reshape(-1)]
    w = imp.operand(op, op.inputs[1])  # [O, kh, kw, I]
    x = imp.operand(op, op.inputs[2])
    bias = _bias(imp, op, 3)
    sh, sw = opt(op, "StrideH", 1), opt(op, "StrideW", 1)
    _, kh, kw, _ = w.shape
    padding = opt(op, "Padding", PAD.SAME)
    t, bo, ph = transpose_conv_padding(padding, x.shape[1], kh, sh, out_shape[1])
    l, r, pw = transpose_conv_padding(padding, x.shape[2], kw, sw, out_shape[2])
    y = imp.b.conv_transpose2d(
        x,
        w,
        padding=[t, bo, l, r],
        strides=[sh, sw],
        output_padding=[ph, pw],
        output_sizes=out_shape[1:3],
        input_layout="nhwc",
        filter_layout="ohwi",
        bias=bias,
    )
    return activation(imp, op, y)


def mediapipe_transpose_conv_bias(imp, op):
    x = imp.operand(op, op.inputs[0])
    w = imp.operand(op, op.inputs[1])  # [O, kh, kw, I]
    bias = _bias(imp, op, 2)
    if len(op.custom_options) < 12:
        raise DataError(
            f"[tflite] operator {op.index} ({op.display}): custom options must hold TfLiteTransposeConvParams "
            f"(12 bytes: padding, stride_w, stride_h), got {len(op.custom_options)} bytes"
        )
    padding, sw, sh = struct.unpack("<iii", op.custom_options[:12])
    _, kh, kw, _ = w.shape
    t, bo = mediapipe_transpose_conv_padding(padding, x.shape[1], kh, sh)
    l, r = mediapipe_transpose_conv_padding(padding, x.shape[2], kw, sw)
    return imp.b.conv_transpose2d(
        x,
        w,
        padding=[t, bo, l, r],
        strides=[sh, sw],
        input_layout="nhwc",
        filter_layout="ohwi",
        bias=bias,
    )


def fully_connected(imp, op):
    x, w, bias, rescale = _weighted(imp, op)  # w: [N, K]
    if opt(op, "WeightsFormat", 0) != 0:
        raise NotSupportedError(f"[tflite] operator {op.index} ({op.display}): shuffled weights are not supported")
    n, k = w.shape
    batch = int(np.prod(x.shape)) // k
    x2 = x if tuple(x.shape) == (batch, k) else imp.b.reshape(x, [batch, k])
    y = activation(imp, op, rescale(imp.b.gemm(x2, w, c=bias, b_transpose=True)))
    out_shape = list(imp.tensor(op.outputs[0]).shape)
    if opt(op, "KeepNumDims", False):
        out_shape = list(x.shape[:-1]) + [n]
    if len(out_shape) and int(np.prod(out_shape)) == batch * n and tuple(out_shape) != (batch, n):
        y = imp.b.reshape(y, out_shape)
    return y


def _pool(kind):
    def convert(imp, op):
        x = imp.operand(op, op.inputs[0])
        sh, sw = opt(op, "StrideH", 1), opt(op, "StrideW", 1)
        fh, fw = opt(op, "FilterHeight", 1), opt(op, "FilterWidth", 1)
        pad = conv_padding(opt(op, "Padding", PAD.SAME), x.shape[1:3], (fh, fw), (sh, sw))
        fn = imp.b.average_pool2d if kind == "average" else imp.b.max_pool2d

        def pool(v):
            return fn(v, window_dimensions=[fh, fw], padding=pad, strides=[sh, sw], layout="nhwc")

        y = None
        if kind == "average":  # TFLite's integer rounding (quantized.py)
            y = quantized.average_pool(imp.b, x, imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0]), pool)
        return activation(imp, op, pool(x) if y is None else y)

    return convert


def _binary(method):
    def convert(imp, op):
        a = imp.operand(op, op.inputs[0])
        c = imp.operand(op, op.inputs[1])
        y = None
        if method in ("add", "sub", "mul"):  # int8: XNNPACK's integer add / multiply (quantized.py)
            ta, tc, to = (imp.tensor(i) for i in (op.inputs[0], op.inputs[1], op.outputs[0]))
            y = (
                quantized.mul(imp.b, a, c, ta, tc, to)
                if method == "mul"
                else quantized.add_sub(imp.b, a, c, ta, tc, to, method == "sub")
            )
        return activation(imp, op, getattr(imp.b, method)(a, c) if y is None else y)

    return convert


def _unary(fn):
    def convert(imp, op):
        return fn(imp.b, imp.operand(op, op.inputs[0]))

    return convert


def hard_swish(imp, op):
    x = imp.operand(op, op.inputs[0])
    tx, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
    y = quantized.lookup(imp.b, x, tx, to, lambda q: quantized.hard_swish_reference(q, tx, to))
    return imp.b.hard_swish(x) if y is None else y  # int8: TFLite's fixed-point kernel, as a table


def _resize(mode):
    def convert(imp, op):
        x = imp.operand(op, op.inputs[0])
        size = [int(v) for v in imp.const_value(op, op.inputs[1], "size").reshape(-1)]
        # TFLite nearest: floor(o * scale) by default, round half up (away from zero) of the
        # mapped coordinate with align_corners or half_pixel_centers.
        if opt(op, "AlignCorners", False):
            ct, rounding = "align_corners", "round_prefer_ceil"
        elif opt(op, "HalfPixelCenters", False):
            ct, rounding = "half_pixel", "round_prefer_ceil"
        else:
            ct, rounding = "asymmetric", "floor"
        kw = {"nearest_rounding": rounding} if mode == "nearest-neighbor" else {}
        if mode == "linear":  # int8: XNNPACK's integer blend (quantized.py)
            tx, to = imp.tensor(op.inputs[0]), imp.tensor(op.outputs[0])
            y = quantized.resize_bilinear(imp.b, x, tx, to, size, ct == "align_corners", ct == "half_pixel")
            if y is not None:
                return y
        return imp.b.resample2d(x, mode=mode, sizes=size, axes=[1, 2], coordinate_transformation=ct, **kw)

    return convert


def reshape(imp, op):
    x_i = op.inputs[0]
    if len(op.inputs) > 1 and op.inputs[1] >= 0 and imp.is_const(op.inputs[1]):
        shape = [int(v) for v in imp.consts[op.inputs[1]].reshape(-1)]
    elif op.options is not None and op.options.NewShapeLength():
        shape = [int(v) for v in op.options.NewShapeAsNumpy()]
    else:
        shape = list(imp.tensor(op.outputs[0]).shape)
    if imp.is_const(x_i) and x_i not in imp.values:
        return imp.consts[x_i].reshape(shape)
    x = imp.operand(op, x_i)
    size = int(np.prod(x.shape))
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = size // known if known else 0
    if tuple(shape) == tuple(x.shape):
        return x
    return imp.b.reshape(x, shape)


def concatenation(imp, op):
    xs = [imp.operand(op, i) for i in op.inputs]
    axis = int(opt(op, "Axis", 0)) % xs[0].rank
    return activation(imp, op, imp.b.concat(xs, axis))


def pad(imp, op):
    x = imp.operand(op, op.inputs[0])
    p = imp.const_value(op, op.inputs[1], "paddings").reshape(-1, 2).astype(np.int64)
    value = 0.0
    if op.name == "PADV2" and len(op.inputs) > 2 and op.inputs[2] >= 0:
        value = float(imp.const_value(op, op.inputs[2], "constant_values").reshape(-1)[0])
    if not p.any():
        return x
    return imp.b.pad(x, [int(v) for v in p[:, 0]], [int(v) for v in p[:, 1]], mode="constant", value=value)


def prelu(imp, op):
    # TFLite's alpha broadcasts against the input (usually [1, 1, C] per channel), as WebNN's slope does.
    return imp.b.prelu(imp.operand(op, op.inputs[0]), imp.operand(op, op.inputs[1]))


def strided_slice(imp, op):
    """STRIDED_SLICE with constant begin/end/strides, begin/end/shrink masks and `offset`; a negative
    stride reverses the axis first. Ellipsis and new-axis masks are rejected."""
    x_i = op.inputs[0]
    begin = [int(v) for v in imp.const_value(op, op.inputs[1], "begin").reshape(-1)]
    end = [int(v) for v in imp.const_value(op, op.inputs[2], "end").reshape(-1)]
    strides = [int(v) for v in imp.const_value(op, op.inputs[3], "strides").reshape(-1)]
    if opt(op, "EllipsisMask", 0) or opt(op, "NewAxisMask", 0):
        raise op_error(op, "ellipsis and new-axis masks are not supported", NotSupportedError)
    shape = list(
        imp.const_value(op, x_i, "input").shape
        if imp.is_const(x_i) and x_i not in imp.values
        else imp.operand(op, x_i).shape
    )
    if not (len(begin) == len(end) == len(strides) == len(shape)):
        raise op_error(op, f"begin/end/strides have {len(begin)}/{len(end)}/{len(strides)} values for an input "
                           f"of rank {len(shape)}")  # fmt: skip
    bmask, emask, smask = opt(op, "BeginMask", 0), opt(op, "EndMask", 0), opt(op, "ShrinkAxisMask", 0)
    offset = bool(opt(op, "Offset", False))
    ranges, out_shape = [], []  # per axis, the input indices taken (a range: negative steps too)
    for k, n in enumerate(shape):
        if strides[k] == 0:
            raise op_error(op, f"stride {k} is 0")
        if smask >> k & 1:
            b0 = begin[k] + n if begin[k] < 0 else begin[k]
            if not 0 <= b0 < n:
                raise op_error(op, f"shrunk index {begin[k]} is outside [0, {n})")
            ranges.append(range(b0, b0 + 1))
            continue
        start = None if bmask >> k & 1 else begin[k]
        stop = None if emask >> k & 1 else (begin[k] + end[k] if offset else end[k])
        ranges.append(range(*slice(start, stop, strides[k]).indices(n)))
        out_shape.append(len(ranges[-1]))
    if imp.is_const(x_i) and x_i not in imp.values:  # folded at load
        picked = imp.consts[x_i][np.ix_(*[np.asarray(r, np.int64) for r in ranges])]
        return np.ascontiguousarray(picked).reshape(out_shape)
    x = imp.operand(op, x_i)
    counts = [len(r) for r in ranges]
    if 0 in counts:
        raise op_error(op, "an empty slice is not supported", NotSupportedError)
    rev = [k for k, r in enumerate(ranges) if r.step < 0]
    if rev:  # reverse the axis: index i becomes n - 1 - i and the step turns positive
        x = imp.b.reverse(x, axes=rev)
    starts = [shape[k] - 1 - r.start if r.step < 0 else r.start for k, r in enumerate(ranges)]
    steps = [abs(r.step) for r in ranges]
    if starts != [0] * len(shape) or counts != shape or steps != [1] * len(shape):
        # WebNN's sizes are input extents: ceil(size / stride) elements come out.
        extents = [(c - 1) * st + 1 for c, st in zip(counts, steps)]
        x = imp.b.slice(x, starts, extents, strides=steps)
    if list(x.shape) != out_shape:
        x = imp.b.reshape(x, out_shape)
    return x


def densify(imp, op):
    # The reader already densified every sparse constant, so this is the constant itself.
    return imp.const_value(op, op.inputs[0], "input")


def depth_to_space(imp, op):
    """NHWC, TensorFlow's DCR order: out[n, h*bs + i, w*bs + j, c] = in[n, h, w, (i*bs + j)*C + c]."""
    x = imp.operand(op, op.inputs[0])
    bs = int(opt(op, "BlockSize", 0))
    n, h, w, c = x.shape
    if bs < 1 or c % (bs * bs):
        raise op_error(op, f"block size {bs} does not split {c} channels into {bs} x {bs} blocks")
    co = c // (bs * bs)
    y = imp.b.reshape(x, [n * h, w, bs, bs * co])  # rank 4 at most: split the channels, move i before w
    y = imp.b.transpose(y, permutation=[0, 2, 1, 3])  # [n*h, bs(i), w, bs*co]
    return imp.b.reshape(y, [n, h * bs, w * bs, co])


def dequantize(imp, op):
    i = op.inputs[0]
    t = imp.tensor(i)
    if imp.is_const(i):  # folded at load into a float32 constant
        arr = imp.consts[i]
        if t.scale is not None and arr.dtype.kind in "iu":
            shape = [1] * arr.ndim
            if t.scale.size > 1:
                shape[t.quantized_dimension] = -1
            arr = (arr.astype(np.float32) - t.zero_point.reshape(shape).astype(np.float32)) * t.scale.reshape(shape)
        if imp.float16 and arr.dtype == np.float16:
            return np.ascontiguousarray(arr)  # float16 weights stay as they are
        return _f32(arr)
    x = imp.operand(op, i)
    if x.data_type == "float16":
        return x if imp.float16 else imp.b.cast(x, "float32")
    if quantized.is_quantized(t) and x.data_type == "float32":
        return x  # already its real values (quantized.py)
    raise NotSupportedError(
        f"[tflite] operator {op.index} ({op.display}): only constant weights or float16 tensors can be dequantized, "
        f"got a computed {t.type_name} tensor"
    )


def quantize(imp, op):
    """Float (or another int8 grid) to int8: the real values as they are; the importer puts every
    quantized output on its grid (quantized.requantize)."""
    return imp.operand(op, op.inputs[0])


CONVERTERS = {
    "CONV_2D": conv_2d,
    "DEPTHWISE_CONV_2D": depthwise_conv_2d,
    "TRANSPOSE_CONV": transpose_conv,
    "Convolution2DTransposeBias": mediapipe_transpose_conv_bias,
    "FULLY_CONNECTED": fully_connected,
    "AVERAGE_POOL_2D": _pool("average"),
    "MAX_POOL_2D": _pool("max"),
    "ADD": _binary("add"),
    "SUB": _binary("sub"),
    "MUL": _binary("mul"),
    "DIV": _binary("div"),
    "MAXIMUM": _binary("max"),
    "MINIMUM": _binary("min"),
    "RELU": _unary(lambda b, x: b.relu(x)),
    "RELU6": _unary(lambda b, x: b.clamp(x, min_value=0.0, max_value=6.0)),
    "RELU_N1_TO_1": _unary(lambda b, x: b.clamp(x, min_value=-1.0, max_value=1.0)),
    "HARD_SWISH": hard_swish,
    "RESIZE_BILINEAR": _resize("linear"),
    "RESIZE_NEAREST_NEIGHBOR": _resize("nearest-neighbor"),
    "RESHAPE": reshape,
    "CONCATENATION": concatenation,
    "PAD": pad,
    "PADV2": pad,
    "DEQUANTIZE": dequantize,
    "QUANTIZE": quantize,
    "PRELU": prelu,
    "DENSIFY": densify,
    "DEPTH_TO_SPACE": depth_to_space,
    "STRIDED_SLICE": strided_slice,
}


CONVERTERS.update(general_ops.CONVERTERS)
CONVERTERS.update(control.CONVERTERS)
CONVERTERS.update(mediapipe_ops.CONVERTERS)
CONVERTERS.update(int16.converters(CONVERTERS, conv_padding))  # 16x8: LiteRT's int16 kernels


def supported_operators() -> list[str]:
    """The operators the importer converts (the docs' TFLite operator page tables them).

    Returns
    -------
    list of str
        Sorted: builtin operator names as the TFLite schema spells them ("CONV_2D") and the
        MediaPipe custom codes ("Convolution2DTransposeBias").
    """
    return sorted(CONVERTERS)


def convert(model: Model, builder, free_dimensions=None, float16=False, initial_state=None):
    """Record the model into `builder`; returns (outputs dict, inputs list, outputs list).
    float16: compute in float16 (see Importer). initial_state: a dict that receives the initial
    values of a stateful model's state inputs (control.py), by name; given, an LSTM's variable
    state tensors are state too (LiteRT carries them between invokes), else zeros each call."""
    imp = Importer(model, builder, free_dimensions, float16)
    imp.carry_variable_tensors = initial_state is not None
    res = imp.run()
    if initial_state is not None:
        initial_state.update(imp.initial_state)
    return res


__all__ = ["convert", "supported_operators", "same_padding", "conv_padding", "Operator"]
