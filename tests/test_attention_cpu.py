"""The ROWS attention kernel of CPU adapters (shaders/attention_cpu.wgsl, ops/attention.py
row_config): a thread per query row, RQ rows a thread, no workgroup memory. Against float64
numpy over what its callers pass: grouped-query heads, causal, biases broadcast along any axis,
a where condition (from the compiler's fusion), K given transposed, layout bshd (ranks 3 and
4), head sizes that are not multiples of 4 (quads gathered from scalars) and values wider than
one pass of outputs, softcap, a sliding window, rows that see no key, float16, every RQ, and
MLTENSOR_NO_ROW_ATTENTION=1 (the staged kernel instead)."""

import functools
import re

import numpy as np
import pytest
from helpers import dispatch_at

import mltensor
from mltensor.ops import attention
from mltensor.runtime.wgsl import cpu_device
from mltensor.switches import switch


@pytest.fixture(autouse=True)
def _cpu_only(ctx):
    if not cpu_device(ctx.device):
        pytest.skip("the ROWS kernel is the CPU adapters' (GPUs never run it)")
    if switch("MLTENSOR_NO_ROW_ATTENTION"):
        pytest.skip("MLTENSOR_NO_ROW_ATTENTION=1: no ROWS kernel")


def reference(q, k, v, scale, bias=None, causal=False, softcap=0.0, window=0):
    """float64 attention over [.., H, S, D] operands, K/V heads repeated for grouped heads; a row
    that sees no key is NaN (softmax's 0 / 0)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    r = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, r, axis=-3), np.repeat(v, r, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    sq, sk = s.shape[-2:]
    pos = np.arange(sq)[:, None] + sk - sq  # each row's own key
    if causal:
        s = np.where(np.arange(sk)[None] > pos, -np.inf, s)
    if window:
        s = np.where(np.arange(sk)[None] <= pos - window, -np.inf, s)
    with np.errstate(invalid="ignore"):
        e = np.where(np.isneginf(s), 0.0, np.exp(s - s.max(-1, keepdims=True)))
        return e / e.sum(-1, keepdims=True) @ v


def _run(ctx, feeds, dt="float32", layout="bhsd", **kw):
    """(kernel names, output) of _attention over feeds q, k, v [, bias]."""
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type=dt, shape=a.shape) for n, a in feeds.items()}
    o = b._attention(ins["q"], ins["k"], ins["v"], bias=ins.get("bias"), layout=layout, **kw)
    g = b.build_sync({"o": o})
    try:
        return g.kernel_names, dispatch_at(ctx, g, feeds)["o"]
    finally:
        g.destroy()


def _check(got, want, tol=2e-5):
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok].astype(np.float64), want[ok], rtol=tol, atol=tol)


CASES = {  # B, H, Hkv, Sq, Sk, D, DV, bias shape (None: none), options
    "mobilevit": (2, 4, 4, 196, 196, 16, 16, None, {}),
    "gqa_causal": (2, 6, 2, 37, 45, 32, 32, None, {"causal": True}),
    "mqa_padding_bias": (2, 4, 1, 20, 77, 64, 64, (2, 1, 1, 77), {}),
    "row_bias": (1, 2, 2, 30, 9, 20, 20, (30, 1), {}),
    "full_bias_kt": (1, 3, 3, 17, 40, 24, 24, (1, 3, 17, 40), {"k_transposed": True}),
    "odd_heads": (1, 2, 1, 13, 50, 30, 6, None, {"causal": True}),
    "wide_values": (1, 2, 2, 9, 33, 8, 130, None, {}),  # 3 passes of outputs, the last partial
    "rows_past_keys": (1, 2, 2, 40, 7, 32, 32, None, {"causal": True}),  # 33 rows see no key
    "softcap_window": (1, 4, 2, 50, 70, 16, 16, None, {"causal": True, "softcap": 2.5, "window": 9}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_operator(ctx, rng, case):
    B, H, Hkv, Sq, Sk, D, DV, bshape, opts = CASES[case]
    kt = opts.get("k_transposed", False)
    feeds = {
        "q": rng.standard_normal((B, H, Sq, D)).astype(np.float32),
        "k": rng.standard_normal((B, Hkv, D, Sk) if kt else (B, Hkv, Sk, D)).astype(np.float32),
        "v": rng.standard_normal((B, Hkv, Sk, DV)).astype(np.float32),
    }
    if bshape is not None:
        # (-1e4 masks keys; a bias along rows only shifts a row's scores, where -1e4 would leave
        # f32 too few bits of them)
        masked = rng.random(bshape) < (0.25 if bshape[-1] > 1 else 0.0)
        feeds["bias"] = np.where(masked, -1e4, rng.standard_normal(bshape)).astype(np.float32)
    names, got = _run(ctx, feeds, scale=D**-0.5, **opts)
    assert len(names) == 1 and "_rows" in names[0], names
    # vec4 bindings where the head sizes allow (never k transposed), scalar quads elsewhere
    vec = re.search(r"_rows\d+k\d+(?:v4(\w+))?$", names[0]).group(1) or ""
    assert vec == "".join(x for x, n in (("q", D), ("k", -1 if kt else D), ("v", DV)) if n % 4 == 0), names
    k = np.swapaxes(feeds["k"], -1, -2) if kt else feeds["k"]
    o = {n: opts[n] for n in ("causal", "softcap", "window") if n in opts}
    want = reference(feeds["q"], k, feeds["v"], D**-0.5, feeds.get("bias"), **o)
    _check(got, want)
    if case == "rows_past_keys":
        assert np.isnan(got[..., :33, :]).all() and not np.isnan(got[..., 33:, :]).any()


@pytest.mark.parametrize("rq", [1, 2, 4, 8, 16])
def test_rows_per_thread(ctx, rng, monkeypatch, rq):
    """Every RQ the heuristic may choose, ragged against the rows of a workgroup (8 RQ), with a
    causal limit that ends inside a workgroup's rows."""
    monkeypatch.setattr(attention, "row_config", functools.partial(attention.row_config, rq=rq))
    feeds = {n: rng.standard_normal((2, 3, s, 20)).astype(np.float32) for n, s in zip("qkv", (101, 103, 103))}
    names, got = _run(ctx, feeds, scale=0.3, causal=True)
    assert f"_rows{rq}k" in names[0], names
    _check(got, reference(*(feeds[n] for n in "qkv"), 0.3, causal=True))


@pytest.mark.parametrize("rank", [3, 4])
def test_layout_bshd(ctx, rng, rank):
    """q [.., Sq, H, D], k and v [.., Sk, Hkv, D]: read and written through strides."""
    H, Hkv, Sq, Sk, D = 6, 2, 25, 31, 32
    lead = (2,) if rank == 4 else ()
    feeds = {
        "q": rng.standard_normal(lead + (Sq, H, D)).astype(np.float32),
        "k": rng.standard_normal(lead + (Sk, Hkv, D)).astype(np.float32),
        "v": rng.standard_normal(lead + (Sk, Hkv, D)).astype(np.float32),
        "bias": np.where(rng.random((1, Sk)) < 0.2, -30.0, 0.0).astype(np.float32),
    }
    names, got = _run(ctx, feeds, layout="bshd", scale=0.2, causal=True)
    assert "_rows" in names[0] and "_bshd" in names[0], names
    bhsd = {n: np.swapaxes(feeds[n], -2, -3) for n in "qkv"}
    _check(got, np.swapaxes(reference(bhsd["q"], bhsd["k"], bhsd["v"], 0.2, feeds["bias"], causal=True), -2, -3))


def test_where_condition(ctx, rng):
    """The compiler's fusion of matmul -> div -> where(cond, s, -3.4e38) -> softmax -> matmul:
    the condition read per (row, key) by the ROWS kernel."""
    B, H, Sq, Sk, D = 2, 2, 21, 21, 16
    feeds = {n: rng.standard_normal((B, H, Sq, D)).astype(np.float32) for n in "qkv"}
    keep = (np.arange(Sk)[None] <= np.arange(Sq)[:, None]).astype(np.uint8)
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=a.shape) for n, a in feeds.items()}
    cond = b.input("cond", data_type="uint8", shape=keep.shape)
    s = b.div(b.matmul(ins["q"], b.transpose(ins["k"], permutation=[0, 1, 3, 2])), b.constant(np.float32(4.0)))
    s = b.where(cond, s, b.constant(np.float32(-3.4028235e38)))
    g = b.build_sync({"o": b.matmul(b.softmax(s, 3), ins["v"])})
    try:
        names = [n for n in g.kernel_names if not n.startswith(("unpack_", "pack_"))]
        got = dispatch_at(ctx, g, dict(feeds, cond=keep))["o"]
    finally:
        g.destroy()
    assert len(names) == 1 and "_rows" in names[0], g.kernel_names
    _check(got, reference(*(feeds[n] for n in "qkv"), 0.25, causal=True))


def test_float16(ctx, rng):
    feeds = {n: rng.standard_normal((1, 2, s, 64)).astype(np.float16) for n, s in zip("qkv", (40, 50, 50))}
    names, got = _run(ctx, feeds, dt="float16", scale=0.125)
    assert "_rows" in names[-1], names
    assert got.dtype == np.float16
    _check(got, reference(*(feeds[n] for n in "qkv"), 0.125), 3e-3)


def test_switch_off(ctx, rng, monkeypatch):
    """MLTENSOR_NO_ROW_ATTENTION=1: the staged kernel, the same values."""
    feeds = {n: rng.standard_normal((1, 2, 30, 16)).astype(np.float32) for n in "qkv"}
    want = reference(*(feeds[n] for n in "qkv"), 0.25)
    monkeypatch.setenv("MLTENSOR_NO_ROW_ATTENTION", "1")
    names, got = _run(ctx, feeds, scale=0.25)
    assert "_rows" not in names[0] and "_tile" in names[0], names
    _check(got, want)
