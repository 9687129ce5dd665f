"""ONNX STFT (opset 17), as audio front-ends export it (torch.stft through torch.onnx.export).

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

from ._helpers import X, ints
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
    window = None
    if len(ins) > 2 and ins[2] is not None:
        w = ins[2]
        if not isinstance(w, np.ndarray):
            im.fail("a window computed at run time is not supported (a constant window is)")
        window = np.asarray(w, dtype=np.float64).reshape(-1)
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
    y = b.conv2d(x, filt, strides=[1, step])  # [B, 2 * bins, 1, frames]
    frames = y.shape[3]
    y = b.reshape(y, [batch, 2, bins, frames])
    return b.transpose(y, permutation=[0, 3, 2, 1])  # [B, frames, bins, 2]
