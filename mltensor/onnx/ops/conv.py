"""ONNX Conv and ConvTranspose (the padding helpers they share with pooling are in _window.py)."""

import numpy as np

from ._helpers import X
from ._registry import op
from ._window import explicit_pads, spatial_rank, to2d, webnn_pad
from .conv3d import conv3d, conv_transpose3d


@op("Conv", attrs=("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"))
def conv(im, node, ins, attrs):
    x = X(im, ins[0])
    w = X(im, ins[1], x)
    sp = len(x.shape) - 2
    if len(w.shape) != len(x.shape):
        im.malformed(f"W has shape {list(w.shape)} and X {list(x.shape)}: their ranks must be the same")
    spatial_rank(sp, "convolutions")
    k = attrs.get("kernel_shape") or list(w.shape[2:])
    s = attrs.get("strides") or [1] * sp
    d = attrs.get("dilations") or [1] * sp
    begin, end = explicit_pads(attrs, list(x.shape[2:]), k, s, d)
    if sp == 3:
        return conv3d(im, x, w, ins[2] if len(ins) > 2 else None, k, s, d, begin, end, attrs.get("group", 1))
    if sp == 1:
        k, s, d, begin, end = [1] + list(k), [1] + list(s), [1] + list(d), [0] + begin, [0] + end
        w = im.b.reshape(w, list(w.shape[:2]) + [1, w.shape[2]])
    x2 = to2d(im, x, sp)
    kw = dict(padding=webnn_pad(begin, end), strides=list(s), dilations=list(d), groups=attrs.get("group", 1))
    if len(ins) > 2 and ins[2] is not None:
        kw["bias"] = X(im, ins[2], x)
    y = im.b.conv2d(x2, w, **kw)
    if sp == 1:
        y = im.b.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
    return y


@op(
    "ConvTranspose",
    attrs=("auto_pad", "dilations", "group", "kernel_shape", "output_padding", "output_shape", "pads", "strides"),
)
def _conv_transpose(im, node, ins, attrs):
    x = X(im, ins[0])
    sp = len(x.shape) - 2
    spatial_rank(sp, "transposed convolutions")
    # (3-D rearranges a constant filter on the host: no operand of the original one)
    w = ins[1] if sp == 3 and isinstance(ins[1], np.ndarray) else X(im, ins[1], x)
    in_sp = list(x.shape[2:])
    k = list(attrs.get("kernel_shape") or w.shape[2:])
    s = list(attrs.get("strides") or [1] * sp)
    d = list(attrs.get("dilations") or [1] * sp)
    op_ = list(attrs.get("output_padding") or [0] * sp)
    auto = attrs.get("auto_pad", "NOTSET")
    out_shape = attrs.get("output_shape")
    if out_shape is not None:
        out_shape = list(out_shape)[-sp:]
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            out_shape = [in_sp[i] * s[i] for i in range(sp)]
        begin, end = [], []
        for i in range(sp):
            total = s[i] * (in_sp[i] - 1) + op_[i] + (k[i] - 1) * d[i] + 1 - out_shape[i]
            if total < 0:
                # extra output rows come from output padding
                op_[i] -= total
                total = 0
            if auto == "SAME_UPPER":
                begin.append(total // 2)
                end.append(total - total // 2)
            else:
                begin.append(total - total // 2)
                end.append(total // 2)
    elif auto == "VALID":
        begin, end = [0] * sp, [0] * sp
    else:
        p = list(attrs.get("pads", [0] * (2 * sp)))
        begin, end = p[:sp], p[sp:]
    if sp == 3:
        return conv_transpose3d(
            im, x, ins[1], ins[2] if len(ins) > 2 else None, k, s, d, begin, end, op_, attrs.get("group", 1)
        )
    if sp == 1:
        k, s, d, op_, begin, end = [1] + k, [1] + s, [1] + d, [0] + op_, [0] + begin, [0] + end
        w = im.b.reshape(w, list(w.shape[:2]) + [1, w.shape[2]])
    x2 = to2d(im, x, sp)
    kw = dict(padding=webnn_pad(begin, end), strides=s, dilations=d, groups=attrs.get("group", 1))
    if any(op_):
        kw["output_padding"] = op_
    if len(ins) > 2 and ins[2] is not None:
        kw["bias"] = X(im, ins[2], x)
    y = im.b.conv_transpose2d(x2, w, **kw)
    if sp == 1:
        y = im.b.reshape(y, [y.shape[0], y.shape[1], y.shape[3]])
    return y
