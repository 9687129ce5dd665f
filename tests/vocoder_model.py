"""A Kokoro-style vocoder (issue 42): the iSTFTNet generator of StyleTTS2 / Kokoro-82M's decoder
with seeded random weights, for tests/test_onnx_vocoder.py. Run as a script in a child process
(torch must not load where lavapipe has): `python vocoder_model.py SIZE STFT EXPORTER OUT.onnx
OUT.npz T1,T2,...` exports it with torch.onnx.export and saves, for each frame count T, inputs
and the float64 torch output.

The generator: a harmonic source (sines of f0 and its harmonics plus noise) taken through a
forward STFT (magnitude and atan2 phase), ConvTranspose1d upsampling stages with LeakyReLU, each
followed by residual blocks of dilated Conv1d with Snake activations and AdaIN (instance norm
scaled by the style), the source's spectrum added through a strided Conv1d; conv_post gives
exp(magnitude) and sin(phase), and an inverse STFT written as conv_transpose1d with a windowed
inverse DFT basis, divided by the overlap-added squared window (kokoro-onnx's CustomSTFT: torch.istft
does not export). STFT "conv": the forward STFT as conv1d with a DFT basis (CustomSTFT), "torch":
torch.stft (ONNX STFT), with an odd n_fft: for a real signal the imaginary part of the Nyquist bin
is zero, so its atan2 phase would be +-pi by the sign of each runtime's rounding (onnxruntime's
float32 twiddles leave 3e-8, ours 1e-16 of the opposite sign).
"""

import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MANUAL_NORM = False


class Snake(nn.Module):
    def __init__(s, c):
        super().__init__()
        s.alpha = nn.Parameter(torch.rand(1, c, 1) + 0.5)

    def forward(s, x):
        return x + (1 / s.alpha) * torch.sin(s.alpha * x) ** 2


class AdaIN(nn.Module):
    def __init__(s, c, sd):
        super().__init__()
        s.norm = nn.InstanceNorm1d(c, affine=False)
        s.fc = nn.Linear(sd, 2 * c)

    def forward(s, x, style):
        h = s.fc(style).unsqueeze(2)
        gamma, beta = torch.chunk(h, 2, dim=1)
        if MANUAL_NORM:  # (the TorchScript exporter refuses instance_norm of an unknown channel count)
            mean = x.mean(dim=2, keepdim=True)
            var = ((x - mean) ** 2).mean(dim=2, keepdim=True)
            n = (x - mean) / torch.sqrt(var + 1e-5)
        else:
            n = s.norm(x)
        return (1 + gamma) * n + beta


class ResBlock(nn.Module):
    def __init__(s, c, k, dil, sd):
        super().__init__()
        s.c1 = nn.ModuleList([nn.Conv1d(c, c, k, dilation=d, padding=d * (k - 1) // 2) for d in dil])
        s.c2 = nn.ModuleList([nn.Conv1d(c, c, k, padding=(k - 1) // 2) for _ in dil])
        s.a1 = nn.ModuleList([Snake(c) for _ in dil])
        s.a2 = nn.ModuleList([Snake(c) for _ in dil])
        s.n1 = nn.ModuleList([AdaIN(c, sd) for _ in dil])
        s.n2 = nn.ModuleList([AdaIN(c, sd) for _ in dil])

    def forward(s, x, style):
        for c1, c2, a1, a2, n1, n2 in zip(s.c1, s.c2, s.a1, s.a2, s.n1, s.n2):
            xt = c1(a1(n1(x, style)))
            xt = c2(a2(n2(xt, style)))
            x = xt + x
        return x


class Vocoder(nn.Module):
    """iSTFTNet generator (Kokoro/StyleTTS2): harmonic source -> STFT, ConvTranspose1d upsampling,
    residual blocks, conv_post -> exp magnitude / sin phase -> iSTFT by conv_transpose1d."""

    def __init__(s, c0, ups, kernels, rk, dils, n_fft, hop, sd, harmonics, sr, torch_stft):
        super().__init__()
        s.n_fft, s.hop, s.torch_stft, s.sr = n_fft, hop, torch_stft, float(sr)
        s.scale = int(math.prod(ups)) * hop
        s.har = nn.Linear(harmonics + 1, 1)
        s.harmonics = harmonics
        bins = n_fft // 2 + 1
        s.ups, s.noise, s.blocks = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        c = c0
        for i, (u, k) in enumerate(zip(ups, kernels)):
            s.ups.append(nn.ConvTranspose1d(c, c // 2, k, u, padding=(k - u) // 2))
            c //= 2
            if i + 1 < len(ups):
                st = int(math.prod(ups[i + 1 :]))
                s.noise.append(nn.Conv1d(2 * bins, c, st * 2, stride=st, padding=(st + 1) // 2))
            else:
                s.noise.append(nn.Conv1d(2 * bins, c, 1))
            s.blocks.append(nn.ModuleList([ResBlock(c, kk, dils, sd) for kk in rk]))
        s.post = nn.Conv1d(c, 2 * bins, 7, padding=3)
        w = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        n = torch.arange(n_fft, dtype=torch.float64)
        f = torch.arange(bins, dtype=torch.float64)
        ang = 2 * math.pi * ((f[:, None] * n[None, :]) % n_fft) / n_fft
        cos, sin = torch.cos(ang), torch.sin(ang)
        cos[cos.abs() < 1e-12] = 0  # exact zeros (sin(pi) is 1.2e-16 in float64): the phase of
        sin[sin.abs() < 1e-12] = 0  # the DC and Nyquist bins is then not decided by rounding
        s.register_buffer("win", w.float())
        s.register_buffer("fwd_re", (cos * w).float().unsqueeze(1))
        s.register_buffer("fwd_im", (-sin * w).float().unsqueeze(1))
        # inverse real DFT of a half spectrum (bins 0 and n/2 once, the others twice), windowed
        scale = torch.full((bins,), 2.0, dtype=torch.float64)
        scale[0] = 1
        scale[-1] = 1
        s.register_buffer("inv_re", (cos * scale[:, None] * w / n_fft).float().unsqueeze(1))
        s.register_buffer("inv_im", (-sin * scale[:, None] * w / n_fft).float().unsqueeze(1))
        s.register_buffer("win_sq", (w * w).float().view(1, 1, n_fft))

    def source(s, f0, noise):
        """The harmonic source (SineGen's shape): sines of f0 and its harmonics plus noise (an
        input, so that runs compare). The phase is kept well-conditioned for float32: per-frame
        increments on a 2^-10 grid wrapped to [0, 1) (their cumulative sum is exact in any order),
        then the in-frame offsets."""
        b, h = f0.shape[0], s.harmonics + 1
        k = torch.arange(1, h + 1, dtype=f0.dtype).view(1, 1, -1)
        cyc = f0.unsqueeze(2) * k / s.sr  # [B, T, H] cycles per sample
        step = torch.round(cyc * (s.scale * 1024.0)) / 1024.0
        step = step - torch.floor(step)
        start = torch.cumsum(step, dim=1) - step
        j = torch.arange(s.scale, dtype=f0.dtype).view(1, 1, -1, 1)
        ph = (start - torch.floor(start)).unsqueeze(2) + j * cyc.unsqueeze(2)  # [B, T, scale, H]
        ph = ph.reshape(b, -1, h)
        sines = 0.1 * torch.sin(2 * math.pi * (ph - torch.floor(ph)))
        return torch.tanh(s.har(sines + 0.003 * noise)).transpose(1, 2)  # [B, 1, N]

    def stft(s, x):  # [B, 1, N] -> [B, 2*bins, frames]
        p = s.n_fft // 2
        if s.torch_stft:
            xp = F.pad(x, (p, s.n_fft - p), mode="replicate").squeeze(1)
            sp = torch.stft(xp, s.n_fft, s.hop, window=s.win, center=False, return_complex=False)
            re, im = sp[..., 0], sp[..., 1]
        else:
            xp = F.pad(x, (p, s.n_fft - p), mode="replicate")
            re = F.conv1d(xp, s.fwd_re, stride=s.hop)
            im = F.conv1d(xp, s.fwd_im, stride=s.hop)
        mag = torch.sqrt(re * re + im * im + 1e-9)
        # (im + 1e-9: the DC bin's imaginary part is an exact zero, whose sign would decide +-pi:
        # torch's atan2 follows the sign of zero, the Atan/Where graph it exports does not)
        return torch.cat([mag, torch.atan2(im + 1e-9, re)], dim=1)

    def istft(s, mag, phase):
        re, im = mag * torch.cos(phase), mag * torch.sin(phase)
        y = F.conv_transpose1d(re, s.inv_re, stride=s.hop) + F.conv_transpose1d(im, s.inv_im, stride=s.hop)
        env = F.conv_transpose1d(torch.ones_like(re[:, :1]), s.win_sq, stride=s.hop)
        y = y / torch.clamp(env, min=1e-6)
        p = s.n_fft // 2
        return y[:, 0, p : p - s.n_fft]

    def forward(s, x, f0, noise, style):
        har = s.stft(s.source(f0, noise))
        for i, (up, noise, blocks) in enumerate(zip(s.ups, s.noise, s.blocks)):
            x = F.leaky_relu(x, 0.1)
            src = noise(har)
            x = up(x)
            if i + 1 == len(s.ups):
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + src
            xs = None
            for b in blocks:
                xs = b(x, style) if xs is None else xs + b(x, style)
            x = xs / len(blocks)
        x = s.post(F.leaky_relu(x))
        bins = s.n_fft // 2 + 1
        return s.istft(torch.exp(x[:, :bins]), torch.sin(x[:, bins:]))


SMALL = dict(c0=32, ups=[4, 2], kernels=[8, 4], rk=[3, 5], dils=[1, 3], n_fft=16, hop=4, sd=8, harmonics=4, sr=24000)
BIG = dict(
    c0=512, ups=[10, 6], kernels=[20, 12], rk=[3, 7, 11], dils=[1, 3, 5], n_fft=20, hop=5, sd=128, harmonics=8, sr=24000
)


def build(size, torch_stft):
    torch.manual_seed(0)
    cfg = dict(BIG if size == "big" else SMALL)
    if torch_stft:
        cfg["n_fft"] -= 1
    m = Vocoder(torch_stft=torch_stft, **cfg).eval()
    with torch.no_grad():  # keep exp(magnitude) tame: a small conv_post
        m.post.weight.mul_(0.1)
    return m, cfg


def inputs(cfg, b, t, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, cfg["c0"], t, generator=g)
    f0 = 100 + 200 * torch.rand(b, t, generator=g)
    noise = torch.randn(b, t * int(math.prod(cfg["ups"])) * cfg["hop"], cfg["harmonics"] + 1, generator=g)
    style = torch.randn(b, cfg["sd"], generator=g)
    return x, f0, noise, style


def export(size, stft, exporter, out):
    global MANUAL_NORM
    MANUAL_NORM = exporter == "torchscript"
    m, cfg = build(size, stft == "torch")
    args = inputs(cfg, 1, 7, 0)
    kw = dict(input_names=["x", "f0", "noise", "style"], output_names=["audio"], opset_version=17)
    if exporter == "dynamo":
        t = torch.export.Dim("t", min=2, max=512)
        per = args[2].shape[1] // 7
        shapes = {"x": {2: t}, "f0": {1: t}, "noise": {1: per * t}, "style": None}
        torch.onnx.export(m, args, out, dynamo=True, dynamic_shapes=shapes, **kw)
    else:
        axes = {"x": {0: "b", 2: "t"}, "f0": {0: "b", 1: "t"}, "noise": {0: "b", 1: "n"}, "style": {0: "b"}}
        torch.onnx.export(m, args, out, dynamo=False, dynamic_axes=axes, **kw)
    return m, cfg


if __name__ == "__main__":
    size, stft, exporter, out, npz, lengths = sys.argv[1:7]
    m, cfg = export(size, stft, exporter, out)
    data = {}
    m = m.double()
    with torch.no_grad():
        for t in map(int, lengths.split(",")):
            args = inputs(cfg, 1, t, t)
            for name, a in zip(["x", "f0", "noise", "style"], args):
                data[f"{t}.{name}"] = a.numpy()
            data[f"{t}.audio"] = m(*(a.double() for a in args)).numpy()
    np.savez(npz, **data)
