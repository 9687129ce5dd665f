"""ONNX STFT (opset 17), as audio front-ends export it (torch.stft through torch.onnx.export), DFT
and MelWeightMatrix (the window functions are ONNX functions, expanded at load).

Each frame's DFT is a fixed linear map of the frame's samples, so the whole STFT is one strided
convolution over the signal: the filter holds, for each output bin k, the window times
cos(2 pi k n / L) (the real part) and times -sin(2 pi k n / L) (the imaginary part), and the
stride is frame_step. The signal's length may be known only at run time (the frame count
follows, as the convolution's output does). A complex signal ([.., 2]) is two input channels:
(xr + i xi)(cos - i sin) = (xr cos + xi sin) + i (xi cos - xr sin). float32 sums over L terms in
the GEMM's k order, where onnxruntime runs an FFT: both are within float32 rounding of the exact
transform.
"""

import numpy as np

from ._helpers import X, const, ints
from ._registry import op


def _filters(window, length, bins, complex_input, dt):
    """[2 * bins, channels, 1, length]: real-part filters, then imaginary-part ones."""
    n = np.arange(length, dtype=np.float64)
    k = np.arange(bins, dtype=np.float64)[:, None]
    ang = 2.0 * np.pi * k * n / length
    cos, sin = np.cos(ang) * window, np.sin(ang) * window
    if complex_input:  # channels (real, imaginary)
        re = np.stack([cos, sin], axis=1)
        im = np.stack([-sin, cos], axis=1)
    else:
        re, im = cos[:, None, :], -sin[:, None, :]
    return np.concatenate([re, im], axis=0)[:, :, None, :].astype(dt)


@op("STFT", attrs=("onesided",))
def _stft(im, node, ins, attrs):
    b = im.b
    sig = X(im, ins[0])
    if sig.rank == 2:  # [batch, length]: a real signal (torch.stft's export writes it so; onnxruntime takes it)
        sig = b.reshape(sig, [sig.shape[0], sig.shape[1], 1])
    if sig.rank != 3 or sig.shape[2] not in (1, 2):
        im.malformed(f"signal has shape {list(sig.shape)}, not [batch, length, 1 or 2]")
    if sig.data_type not in ("float32", "float16"):
        im.fail(f"a {sig.data_type} signal is not supported (float32, float16)")
    step = ints(im, ins[1], "frame_step")
    if step is None or len(step) != 1 or step[0] < 1:
        im.malformed(f"frame_step must be one positive integer, got {step}")
    step = step[0]
    window = run_window = None
    if len(ins) > 2 and ins[2] is not None:
        w = ins[2]
        if isinstance(w, np.ndarray):
            window = np.asarray(w, dtype=np.float64).reshape(-1)
        else:  # known at run time: the filters are the DFT's times it (one multiply in the graph)
            run_window = X(im, w)
            if run_window.rank != 1 or not isinstance(run_window.shape[0], int):
                im.malformed(f"window has shape {list(run_window.shape)}, not [frame_length]")
            window = np.ones(run_window.shape[0])
    length = ints(im, ins[3], "frame_length") if len(ins) > 3 and ins[3] is not None else None
    if length is not None:
        if len(length) != 1 or length[0] < 1:
            im.malformed(f"frame_length must be one positive integer, got {length}")
        length = length[0]
    if window is None and length is None:
        im.malformed("STFT needs a window or a frame_length")
    if window is not None and length is not None and window.size != length:
        im.malformed(f"the window has {window.size} values, frame_length is {length}")
    length = length if length is not None else window.size
    window = window if window is not None else np.ones(length)
    if isinstance(sig.shape[1], int) and sig.shape[1] < length:
        im.malformed(f"the signal ({sig.shape[1]} samples) is shorter than a frame ({length})")
    complex_input = sig.shape[2] == 2
    onesided = bool(attrs.get("onesided", 1))
    if onesided and complex_input:
        im.malformed("onesided is only defined for a real signal")
    bins = length // 2 + 1 if onesided else length
    dt = np.float16 if sig.data_type == "float16" else np.float32
    batch = sig.shape[0]
    # [B, T, C] -> [B, C, 1, T]: one row of samples per channel
    x = b.reshape(b.transpose(sig, permutation=[0, 2, 1]), [batch, sig.shape[2], 1, sig.shape[1]])
    filt = b.constant(_filters(window, length, bins, complex_input, dt))
    if run_window is not None:
        win = run_window if run_window.data_type == sig.data_type else b.cast(run_window, sig.data_type)
        filt = b.mul(filt, b.reshape(win, [1, 1, 1, length]))
    y = b.conv2d(x, filt, strides=[1, step])  # [B, 2 * bins, 1, frames]
    frames = y.shape[3]
    y = b.reshape(y, [batch, 2, bins, frames])
    return b.transpose(y, permutation=[0, 3, 2, 1])  # [B, frames, bins, 2]


def _dft_matrices(n, bins, length, inverse, half_spectrum, dt):
    """cos and sin [n, bins] of angle 2 pi k j / length between n input samples (or bins) j and
    output k. half_spectrum (an inverse of a one-sided spectrum: a real signal): input bin j
    weighs 2, except 0 and length/2 which appear once in the full spectrum."""
    j = np.arange(n, dtype=np.float64)[:, None]
    k = np.arange(bins, dtype=np.float64)[None, :]
    ang = 2.0 * np.pi * j * k / length
    cos, sin = np.cos(ang), np.sin(ang)
    if inverse:
        w = np.ones((n, 1))
        if half_spectrum:
            w[1:] = 2.0
            if length % 2 == 0 and n > length // 2:
                w[length // 2] = 1.0
        cos, sin = cos * w / length, sin * w / length
    return cos.astype(dt), sin.astype(dt)


@op("DFT", attrs=("axis", "inverse", "onesided"))
def _dft(im, node, ins, attrs):
    """DFT (opset 17: axis an attribute, default 1; 20: an input, default -2) of a real ([.., 1])
    or complex ([.., 2]) signal along one axis, as two matmuls with constant cos / sin matrices
    (a DFT is linear): X = x (cos - i sin), the inverse x (cos + i sin) / length. dft_length pads
    or truncates the axis; onesided keeps bins 0 .. length/2 of a real signal's transform, and
    with inverse takes such a half spectrum to the real signal (the missing bins are the
    conjugates of the kept ones)."""
    b = im.b
    x = X(im, ins[0])
    if x.data_type not in ("float32", "float16"):
        im.fail(f"a {x.data_type} signal is not supported (float32, float16)")
    r = x.rank
    if r < 2 or x.shape[-1] not in (1, 2):
        im.malformed(f"input has shape {list(x.shape)}: the last dimension must be 1 (real) or 2 (complex)")
    if len(ins) > 2 and ins[2] is not None:
        ax = ints(im, ins[2], "axis")
        if ax is None or len(ax) != 1:
            im.malformed(f"axis must be one integer, got {ax}")
        axis = ax[0]
    else:
        axis = attrs.get("axis", 1 if im.cur_opset < 20 else -2)
    axis = axis + r if axis < 0 else axis
    if not 0 <= axis < r - 1:
        im.malformed(f"axis {axis} is not a signal axis of the rank {r} input (the last is the complex one)")
    n = x.shape[axis]
    if not isinstance(n, int):
        im.fail("a DFT along an axis whose size is known only at run time is not supported")
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    complex_in = x.shape[-1] == 2
    if onesided and not inverse and complex_in:
        im.malformed("onesided is only defined for a real signal's forward transform or an inverse of a half spectrum")
    length = None
    if len(ins) > 1 and ins[1] is not None:
        dl = ints(im, ins[1], "dft_length")
        if dl is None or len(dl) != 1 or dl[0] < 1:
            im.malformed(f"dft_length must be one positive integer, got {dl}")
        length = dl[0]
    if length is None:
        length = 2 * (n - 1) if inverse and onesided else n
    dt = np.float16 if x.data_type == "float16" else np.float32
    # the signal axis last: [.., n] per channel (real, imaginary)
    perm = [d for d in range(r - 1) if d != axis] + [axis]
    parts = [b.slice(x, [0] * r, list(x.shape[:-1]) + [1])]
    if complex_in:
        parts.append(b.slice(x, [0] * (r - 1) + [1], list(x.shape[:-1]) + [1]))
    parts = [b.transpose(b.reshape(p, list(x.shape[:-1])), permutation=perm) for p in parts]
    if inverse and onesided:  # half spectrum -> real signal of `length` samples
        used = min(n, length // 2 + 1)
        bins = length
    else:
        used = min(n, length)  # (samples past dft_length dropped, zeros past n add nothing)
        bins = length // 2 + 1 if onesided else length
    if used < n:
        parts = [b.slice(p, [0] * (r - 1), list(p.shape[:-1]) + [used]) for p in parts]
    cos, sin = _dft_matrices(used, bins, length, inverse, inverse and onesided, dt)
    cos, sin = b.constant(cos), b.constant(sin)
    xr = parts[0]
    xi = parts[1] if complex_in else None
    # forward: re = xr cos + xi sin, im = xi cos - xr sin; inverse: re = xr cos - xi sin,
    # im = xi cos + xr sin (both / length, folded into the matrices)
    sign = -1.0 if inverse else 1.0
    re = b.matmul(xr, cos)
    im_ = b.mul(b.matmul(xr, sin), b.constant(np.array(-sign, dt)))
    if xi is not None:
        re = b.add(re, b.mul(b.matmul(xi, sin), b.constant(np.array(sign, dt))))
        im_ = b.add(im_, b.matmul(xi, cos))
    inv = [perm.index(d) for d in range(r - 1)]
    out_shape = list(x.shape[:-1])
    out_shape[axis] = bins
    if inverse and onesided:  # a real signal: [.., 1]
        return b.reshape(b.transpose(re, permutation=inv), out_shape + [1])
    re = b.reshape(b.transpose(re, permutation=inv), out_shape + [1])
    im_ = b.reshape(b.transpose(im_, permutation=inv), out_shape + [1])
    return b.concat([re, im_], r - 1)


def _scalar(im, v, what):
    c = const(im, v, what)
    if c is None or np.asarray(c).size != 1:
        im.malformed(f"{what} must be one value, got {c}")
    return np.asarray(c).reshape(()).item()


@op("MelWeightMatrix", attrs=("output_datatype",))
def _mel_weight_matrix(im, node, ins, attrs):
    """The [dft_length / 2 + 1, num_mel_bins] triangular filter bank, computed at load as the ONNX
    reference computes it (its inputs are sizes and frequencies: constants, or small inputs bound
    by value at the first run)."""
    if len(ins) < 5 or any(v is None for v in ins[:5]):
        im.malformed("MelWeightMatrix takes num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz")
    bins, length, rate = (
        int(_scalar(im, v, w)) for v, w in zip(ins[:3], ("num_mel_bins", "dft_length", "sample_rate"))
    )
    lo, hi = (float(_scalar(im, v, w)) for v, w in zip(ins[3:5], ("lower_edge_hertz", "upper_edge_hertz")))
    if bins < 1 or length < 1 or rate < 1 or not 0 <= lo < hi:
        im.malformed(f"num_mel_bins {bins}, dft_length {length}, sample_rate {rate}, edges {lo}..{hi}")
    spec = length // 2 + 1
    mel = np.arange(bins + 2) * ((2595 * np.log10(1 + hi / 700) - 2595 * np.log10(1 + lo / 700)) / (bins + 2))
    mel = mel + 2595 * np.log1p(lo / 700) / np.log(10)
    edges = (((length + 1) * (700 * np.expm1(mel / 2595 * np.log(10)))) // rate).astype(int)
    if edges.max() >= spec or edges.min() < 0:
        im.malformed(f"the upper edge {hi} Hz lies past the spectrum's {spec} bins at {rate} Hz")
    out = np.zeros((spec, bins))
    for i in range(bins):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1.0
        else:
            out[left : center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    dtype = int(attrs.get("output_datatype", 1))
    np_type = {1: np.float32, 10: np.float16, 11: np.float64}.get(dtype)
    if np_type is None:
        im.fail(f"output_datatype {dtype} is not supported (FLOAT, FLOAT16, DOUBLE)")
    return out.astype(np_type)
