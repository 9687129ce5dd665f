"""Shape-only ONNX operators and constants, folded at load on operands."""

import numpy as np
from onnx import helper

from ...dynamic.dims import Sym
from .. import symbolic
from ..errors import unsupported
from ._helpers import const, mark_bool, prod, sizes, X
from ._registry import op

# -- shape-only ops (folded at load on operands) ------------------------------------------------


@op("Shape", attrs=("start", "end"))
def _shape(im, node, ins, attrs):
    s = list(ins[0].shape)
    r = len(s)
    start = attrs.get("start", 0)
    end = attrs.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return symbolic.array(s[start:end])  # Syms for dynamic dimensions (onnx/symbolic.py)


@op("Size")
def _size(im, node, ins, attrs):
    return symbolic.array([prod(ins[0].shape)], ())


@op("EyeLike", attrs=("dtype", "k"))
def _eyelike(im, node, ins, attrs):
    x = ins[0]
    shape = x.shape
    et = attrs.get("dtype", im.onnx_type(x, node.input[0]))
    return np.eye(shape[0], shape[1], k=attrs.get("k", 0)).astype(helper.tensor_dtype_to_np_dtype(et))


@op("ConstantOfShape", attrs=("value",))
def _constant_of_shape(im, node, ins, attrs):
    shape = sizes(im, ins[0], "shape")
    if any(not isinstance(d, Sym) and d < 0 for d in shape):
        im.malformed(f"shape [{', '.join(str(d) for d in shape)}] has a negative dimension")
    v = attrs.get("value", np.zeros(1, np.float32))
    if any(isinstance(d, Sym) for d in shape):  # a dynamic shape: the value expanded at dispatch
        c = X(im, np.asarray(v.reshape(-1)[0], dtype=v.dtype))
        y = im.b.expand(c, shape)
        if v.dtype == np.bool_:
            mark_bool(im, y)
        return y
    return np.full(shape, v.reshape(-1)[0], dtype=v.dtype)


@op("Constant", attrs=None)
def _constant(im, node, ins, attrs):
    for k in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if k in attrs:
            v = attrs[k]
            dt = np.float32 if "float" in k else (np.int64 if "int" in k else None)
            return np.asarray(v, dtype=dt) if dt else np.asarray(v)
    unsupported(f"attributes {sorted(attrs)}")


@op("Dropout", attrs=("ratio", "seed", "is_test", "consumed_inputs"))
def _dropout(im, node, ins, attrs):
    if len(ins) > 2 and ins[2] is not None:
        tm = const(im, ins[2], "training_mode")
        if bool(tm.reshape(-1)[0]):
            unsupported("training_mode=True is not supported")
    x = X(im, ins[0])
    outs = [im.b.identity(x)]
    if len(node.output) > 1 and node.output[1]:
        outs.append(np.ones(x.shape, dtype=np.bool_))
    return outs
