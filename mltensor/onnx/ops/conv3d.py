"""3-D (NCDHW) Conv, ConvTranspose and pools, lowered onto WebNN's 2-D operators.

WebNN's convolutions and pools are 2-D (the spec, and this builder), so the ONNX handlers in
conv.py and pool.py send 5-D inputs here. Nothing here adds a kernel: the depth axis is folded
into the batch or the channel axis of the 2-D operators with one `gather` whose indices are
computed on the host.

Convolution (`conv3d`), per output depth `do`: y[do] = sum over taps kd of
conv2d(x[do*sd + kd*dd - pd0], W[:, :, kd]). Rather than KD conv2d launches plus KD-1 adds (the
per-tap form), the KD input planes of each output depth are laid side by side along the
channel axis, (c, kd) with kd fastest, so ONE conv2d with the filter reshaped (free) from
[O, C/g, KD, KH, KW] to [O, C/g*KD, KH, KW] sums over the taps inside its GEMM (K = C/g*KD*KH*KW).
Channel c of group g is c = g*C/g + cg, so channel (c, kd) = g*(C/g*KD) + cg*KD + kd: the groups
stay contiguous, and grouped and depthwise convolutions fold the same way. Which planes go where
is one `gather` along the flattened (C*D) axis of x viewed as [N, C*D, H, W]: indices
[Do, C*KD], index c*D + (do*sd + kd*dd - pd0), so the gather also applies the depth stride, the
depth dilation and the NCDHW -> (N*Do)CHW transpose. Depth padding is one zero plane appended to
that axis (a `pad`, only when some tap reaches the padding) that every padded tap indexes.
H and W (pads, strides, dilations) are the conv2d's own. Launches: [pad] + gather + conv2d
(bias and any epilogue fused) + the transpose back to NCDHW (none when Do = 1): 3 or 4, against
2 + KD for the per-tap form, and one large GEMM instead of KD small ones. The price is memory:
the gathered tensor holds KD copies of each plane (N*Do*C*KD*H*W elements).

Transposed convolution (`conv_transpose3d`): y[z] = sum over (d, kd) with d*sd + kd*dd - pd0 = z
of conv_transpose2d(x[d], W[:, :, kd]). For a given z and kd there is at most one d, so the same
gather (index c*D + d, or the zero plane where (z + pd0 - kd*dd) is not a multiple of sd or d is
outside [0, D)) builds [N*Dout, C*KD, H, W], and ONE conv_transpose2d with the filter
[C, O/g, KD, KH, KW] -> [C*KD, O/g, KH, KW] sums the taps over its input channels. Depth
strides, padding, output_padding and output_shape are all in the indices; H and W are the 2-D
operator's. About 1 - 1/sd of the gathered planes are the zero plane (the zero-insertion of a
strided transposed convolution), which the GEMM multiplies anyway: a per-phase split would avoid
that at sd times the launches.

Pools (`pool3d`) are separable over box windows: a 2-D pool over (H, W) with depth folded into
the channels ([N, C*D, H, W], a free reshape), then a 2-D pool with a [KD, 1] window over
[N, C, D, Ho*Wo] (free reshape again): 2 launches, no data movement. Max of maxes is the max;
WebNN averages over the real elements only, and the real elements of a box window are the
product of per-axis counts, so the mean of per-plane means (each plane of a window has the same
count) is the 3-D mean (count_include_pad=0) exactly, edges and ceil_mode included.
count_include_pad=1 multiplies by a host-computed [Do, Ho*Wo] map of real/counted elements
(fused into the second pool as an epilogue). LpPool: p = 2 is two l2 pools (sqrt of a sum of
squared l2 norms); other p pools |x|^p by averages times a map of real counts, then ^(1/p).

Dynamic dimensions: the batch, H and W may be dynamic (the 2-D operators, gather, pad and
transpose take them). The gather indices and the count maps are computed on the host, so a
convolution's channels and depth, and the sizes of a pool that needs a count map, must be
static: otherwise the import is refused with NotSupportedError and InferenceSession builds per
size instead.
"""

import numpy as np

from ... import dtypes
from ...dynamic.dims import Sym
from ..errors import unsupported
from ._helpers import X
from ._window import pool_out


def _static(what, *vals):
    """Sizes the host-side index computation needs as numbers (a dynamic one: the session falls
    back to a build per size)."""
    for v in vals:
        if isinstance(v, Sym):
            unsupported(f"{what} needs static sizes, got a dynamic dimension ({v})")


def _ints(where, name, v, n, lo):
    v = [int(i) for i in v]
    if len(v) != n:
        raise TypeError(f"[{where}] {name} must have {n} values, got {v}")
    if any(i < lo for i in v):
        raise TypeError(f"[{where}] {name} must be >= {lo}, got {v}")
    return v


def _fold_back(b, y, n, dout):
    """[N*Do, O, Ho, Wo] -> [N, O, Do, Ho, Wo] (a reshape when Do is 1, else one transpose)."""
    o, ho, wo = y.shape[1:]
    if dout == 1:
        return b.reshape(y, [n, o, 1, ho, wo])
    y = b.reshape(y, [n, dout, o, ho, wo])
    return b.transpose(y, permutation=[0, 2, 1, 3, 4])


def _gather_depth(im, x, idx, zero):
    """x [N, C, D, H, W] -> [N*Do, C*KD, H, W] with channel (c, kd) of output depth do the plane
    idx[do, c*KD + kd] of x viewed as [N, C*D (+1 zero plane), H, W]."""
    b = im.b
    n, c, d, h, w = x.shape
    dout, ck = idx.shape
    xr = b.reshape(x, [n, c * d, h, w])
    if zero:
        xr = b.pad(xr, [0, 0, 0, 0], [0, 1, 0, 0])  # plane c*d: the depth padding
    elif dout == 1 and ck == c * d and np.array_equal(idx[0], np.arange(ck)):
        return xr  # every plane in order (one output depth covering all of x): no copy
    g = b.gather(xr, b.constant(np.ascontiguousarray(idx, dtype=np.int32)), axis=1)
    return b.reshape(g, [n * dout, ck, h, w])


def conv3d(im, x, w_in, bias_in, k, s, d, begin, end, groups):
    """ONNX Conv on NCDHW (pads already resolved from auto_pad by the caller)."""
    where = "Conv 3-D"
    b = im.b
    w = X(im, w_in, x)
    if len(w.shape) != 5:
        raise TypeError(f"[{where}] the filter must be 5-D [O, C/group, KD, KH, KW], got shape {list(w.shape)}")
    n, c, depth, h, wd = x.shape
    _static(f"[{where}] the input's channels and depth", c, depth)
    o, cg, kd, kh, kw = w.shape
    k = _ints(where, "kernel_shape", k, 3, 1)
    if k != [kd, kh, kw]:
        raise TypeError(f"[{where}] kernel_shape {k} does not match the filter's {[kd, kh, kw]}")
    s, d = _ints(where, "strides", s, 3, 1), _ints(where, "dilations", d, 3, 1)
    begin, end = _ints(where, "pads", begin, 3, 0), _ints(where, "pads", end, 3, 0)
    if groups < 1 or c % groups or o % groups:
        raise TypeError(
            f"[{where}] input channels ({c}) and output channels ({o}) must be divisible by group ({groups})"
        )
    if c // groups != cg:
        raise TypeError(
            f"[{where}] input channels ({c}) / group ({groups}) must equal the filter's input channels ({cg})"
        )
    ek = (kd - 1) * d[0] + 1
    span = depth + begin[0] + end[0] - ek
    if span < 0:
        raise TypeError(
            f"[{where}] the dilated filter depth ({ek}) exceeds the padded input depth ({depth + begin[0] + end[0]})"
        )
    dout = span // s[0] + 1
    # idx[do, c, kd]: the plane c*D + z of tap kd, z = do*sd + kd*dd - pd0; c*D (the appended zero
    # plane) where z is padding
    z = np.arange(dout)[:, None] * s[0] + np.arange(kd)[None, :] * d[0] - begin[0]  # [Do, KD]
    inside = (z >= 0) & (z < depth)
    plane = np.where(inside[:, None, :], np.arange(c)[None, :, None] * depth + z[:, None, :], c * depth)
    g = _gather_depth(im, x, plane.reshape(dout, c * kd), not inside.all())
    w2 = b.reshape(w, [o, cg * kd, kh, kw])
    kw2 = dict(padding=[begin[1], end[1], begin[2], end[2]], strides=s[1:], dilations=d[1:], groups=groups)
    if bias_in is not None:
        kw2["bias"] = X(im, bias_in, x)
    return _fold_back(b, b.conv2d(g, w2, **kw2), n, dout)


def conv_transpose3d(im, x, w_in, bias_in, k, s, d, begin, end, out_pad, groups):
    """ONNX ConvTranspose on NCDHW (pads and output padding already resolved from auto_pad and
    output_shape by the caller)."""
    where = "ConvTranspose 3-D"
    b = im.b
    n, c, depth, h, wd = x.shape
    _static(f"[{where}] the input's channels and depth", c, depth)
    wshape = list(np.shape(w_in)) if isinstance(w_in, np.ndarray) else list(X(im, w_in, x).shape)
    if len(wshape) != 5:
        raise TypeError(f"[{where}] the filter must be 5-D [C, O/group, KD, KH, KW], got shape {wshape}")
    wc, og, kd, kh, kw = wshape
    k = _ints(where, "kernel_shape", k, 3, 1)
    if k != [kd, kh, kw]:
        raise TypeError(f"[{where}] kernel_shape {k} does not match the filter's {[kd, kh, kw]}")
    s, d = _ints(where, "strides", s, 3, 1), _ints(where, "dilations", d, 3, 1)
    begin, end = _ints(where, "pads", begin, 3, 0), _ints(where, "pads", end, 3, 0)
    out_pad = _ints(where, "output_padding", out_pad, 3, 0)
    if wc != c:
        raise TypeError(f"[{where}] input channels ({c}) must equal the filter's input channels ({wc})")
    if groups < 1 or c % groups:
        raise TypeError(f"[{where}] input channels ({c}) must be divisible by group ({groups})")
    dout = s[0] * (depth - 1) + out_pad[0] + (kd - 1) * d[0] + 1 - begin[0] - end[0]
    if dout < 1:
        raise TypeError(f"[{where}] output depth would be {dout}; pads {begin + end} are too large")
    # idx[z, c, kd]: plane c*D + i where i*sd + kd*dd - pd0 = z, else the zero plane c*D
    t = np.arange(dout)[:, None] + begin[0] - np.arange(kd)[None, :] * d[0]  # [Dout, KD]: i*sd
    i = t // s[0]
    inside = (t >= 0) & (t % s[0] == 0) & (i < depth)
    plane = np.where(inside[:, None, :], np.arange(c)[None, :, None] * depth + i[:, None, :], c * depth)
    g = _gather_depth(im, x, plane.reshape(dout, c * kd), not inside.all())
    # filter [C, O/g, KD, KH, KW] -> [C, KD, O/g, KH, KW] -> [C*KD, O/g, KH, KW] (iohw): input
    # channel (c, kd) as gathered (on the host for a constant filter)
    if isinstance(w_in, np.ndarray):
        w2 = X(im, np.ascontiguousarray(np.transpose(w_in, (0, 2, 1, 3, 4))).reshape(c * kd, og, kh, kw), x)
    else:
        w2 = b.reshape(b.transpose(X(im, w_in, x), permutation=[0, 2, 1, 3, 4]), [c * kd, og, kh, kw])
    kw2 = dict(padding=[begin[1], end[1], begin[2], end[2]], strides=s[1:], dilations=d[1:], groups=groups)
    if any(out_pad[1:]):
        kw2["output_padding"] = out_pad[1:]
    if bias_in is not None:
        kw2["bias"] = X(im, bias_in, x)
    return _fold_back(b, b.conv_transpose2d(g, w2, **kw2), n, dout)


def _axis_counts(size, k, s, d, p0, p1, out):
    """Per output position of one axis: (real taps, taps inside the padded input)."""
    start = np.arange(out) * s - p0
    taps = start[:, None] + np.arange(k)[None, :] * d
    real = ((taps >= 0) & (taps < size)).sum(1)
    padded = ((taps >= -p0) & (taps < size + p1)).sum(1)
    return real, padded


def _count_map(in_sp, k, s, d, begin, end, out, include_pad):
    """[Do, Ho*Wo]: real taps per window (include_pad False), or real / counted taps (True)."""
    real, padded = zip(*(_axis_counts(in_sp[i], k[i], s[i], d[i], begin[i], end[i], out[i]) for i in range(3)))

    def outer(v):
        return (v[0][:, None, None] * v[1][None, :, None] * v[2][None, None, :]).astype(np.float64)

    r = outer(real)
    m = r / np.maximum(outer(padded), 1) if include_pad else r
    return m.reshape(out[0], out[1] * out[2])


def pool3d(im, kind, x, k, s, d, begin, end, out, include_pad=False, p=2):
    """ONNX MaxPool / AveragePool / LpPool on NCDHW. out: the ONNX output sizes (floor or ceil
    rounding resolved by the caller); the pads are explicit."""
    where = f"{kind} 3-D"
    b = im.b
    n, c, depth, h, w = x.shape
    k = _ints(where, "kernel_shape", k, 3, 1)
    s, d = _ints(where, "strides", s, 3, 1), _ints(where, "dilations", d, 3, 1)
    begin, end = _ints(where, "pads", begin, 3, 0), _ints(where, "pads", end, 3, 0)
    lp_sum = kind == "LpPool" and p != 2  # sum |x|^p as average times real count
    fn = {
        "MaxPool": "max_pool2d",
        "AveragePool": "average_pool2d",
        "LpPool": "average_pool2d" if lp_sum else "l2_pool2d",
    }[kind]
    scale = None
    if lp_sum or (kind == "AveragePool" and include_pad and any(begin + end)):
        _static(f"[{where}] the per-window element counts", depth, h, w, *out)
        scale = _count_map([depth, h, w], k, s, d, begin, end, out, kind == "AveragePool")
        if kind == "AveragePool" and np.all(scale == 1):
            scale = None
    src = x
    if lp_sum:
        src = b.pow(b.abs(x), b.constant(np.array(float(p), dtype=_np_type(x))))
    hw_id = k[1:] == [1, 1] and s[1:] == [1, 1] and not any(begin[1:] + end[1:])
    d_id = k[0] == 1 and s[0] == 1 and not (begin[0] or end[0])
    y, ho, wo = src, h, w
    if not hw_id or d_id:  # (a 1x1x1 window still runs one pool)
        ho, wo = out[1], out[2]
        kw2 = dict(
            window_dimensions=k[1:], padding=[begin[1], end[1], begin[2], end[2]], strides=s[1:], dilations=d[1:]
        )
        if [ho, wo] != pool_out([h, w], k[1:], s[1:], d[1:], begin[1:], end[1:], False):
            kw2["output_sizes"] = [ho, wo]
        y = getattr(b, fn)(b.reshape(src, [n, c * depth, h, w]), **kw2)  # [N, C*D, Ho, Wo]
        if scale is not None and d_id:
            scale = scale[0].reshape(ho, wo)  # (every depth counts the same: a 1-deep window)
    if not d_id:
        kw2 = dict(
            window_dimensions=[k[0], 1], padding=[begin[0], end[0], 0, 0], strides=[s[0], 1], dilations=[d[0], 1]
        )
        if out[0] != pool_out([depth], k[:1], s[:1], d[:1], begin[:1], end[:1], False)[0]:
            kw2["output_sizes"] = [out[0], ho * wo]
        y = getattr(b, fn)(b.reshape(y, [n, c, depth, ho * wo]), **kw2)  # [N, C, Do, Ho*Wo]
    if scale is not None:
        # on the last pool's own output, so that the product is that pool's epilogue
        y = b.mul(y, b.constant(np.ascontiguousarray(scale, dtype=_np_type(x))))
    if lp_sum:
        y = b.pow(y, b.constant(np.array(1.0 / p, dtype=_np_type(x))))
    y = b.reshape(y, [n, c, out[0], ho, wo])
    return y


def _np_type(x):
    return dtypes.NUMPY[x.data_type]
