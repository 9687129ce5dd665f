"""Attention as one kernel (issue 28): the `_attention` builder operator (ops/attention.py,
shaders/attention.wgsl) against float64 numpy, and the compiler's recognition of
matmul(Q, K^T) -> [scale] -> [+ mask] -> [where] -> softmax -> matmul(P, V)
(compiler/fusion/attention.py) against numpy and against the same graph built with
MLTENSOR_NO_FUSION=1, with kernel counts; the Sq x Sk scores never reach memory."""

import pickle

import numpy as np
import pytest
from helpers import FUSION, dispatch_at, run_graph

import mltensor
from mltensor.dynamic.dims import MLDynamicDimension
from mltensor.ops.attention import DECODE_SPLIT_MIN_SK, attention_candidates
from mltensor.runtime import autotune
from mltensor.runtime.wgsl import cpu_device
from mltensor.switches import switch

NP = {"float32": np.float32, "float16": np.float16}
NEG = np.float32(-3.4028235e38)


@pytest.fixture
def unfused_ctx():
    """Stands for "ctx with MLTENSOR_NO_FUSION=1" in _build_pair (the switch is read per build)."""
    return "unfused"


def reference(q, k, v, scale, bias=None, causal=False, k_transposed=False):
    """float64 attention; k/v heads repeated for grouped heads; -inf rows give NaN (0 / 0)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    if k_transposed:
        k = np.swapaxes(k, -1, -2)
    if q.ndim == 4 and k.shape[1] != q.shape[1]:
        k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
        v = np.repeat(v, q.shape[1] // v.shape[1], axis=1)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        s = s + np.asarray(bias, np.float64)
    sq, sk = s.shape[-2:]
    if causal:
        s = np.where(np.arange(sk)[None] > np.arange(sq)[:, None] + sk - sq, -np.inf, s)
    with np.errstate(invalid="ignore"):
        m = s.max(-1, keepdims=True)
        e = np.where(np.isneginf(s), 0.0, np.exp(s - m))
        p = e / e.sum(-1, keepdims=True)
    return p @ v


def close(got, want, tol):
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def compute(names):
    """Kernel names less the edge conversions (a uint8 mask input is unpacked to u32 words), a
    split decode's reduce kernel counted with its partials kernel (one attention step)."""
    return [n for n in names if not n.startswith(("unpack_", "pack_")) and "_reduce" not in n]


def f16_tag(ctx):
    """What float16 kernels are named after: f16 where the device computes in f16, else f32
    (MLTENSOR_DISABLE_F16=1: float16 computes in f32 behind edge conversions)."""
    return "f16" if ctx._f16 else "f32"


# -- the operator ---------------------------------------------------------------------------------

DIRECT = [  # B, H, Hkv, Sq, Sk, D, causal, k_transposed, bias shape (None: none)
    (1, 2, 2, 7, 7, 32, False, False, None),
    (2, 3, 1, 64, 200, 64, True, False, None),  # MQA (ratio 3), causal, ragged tiles
    (1, 4, 1, 1, 200, 80, False, False, (1, 1, 1, 200)),  # decode, ratio 4, padding bias
    (1, 4, 4, 3, 9, 128, True, True, None),  # decode, K given transposed
    (2, 6, 2, 7, 64, 64, False, True, (2, 1, 7, 64)),  # ratio 3
    (1, 8, 2, 200, 7, 32, True, False, (1, 8, 200, 7)),  # ratio 4; causal rows past Sk all masked
    (1, 2, 2, 1, 1, 128, False, False, None),
]


@pytest.mark.parametrize(
    "case",
    DIRECT,
    ids=lambda c: "B{}H{}kv{}q{}k{}d{}{}{}{}".format(
        *c[:6], "_causal" if c[6] else "", "_kt" if c[7] else "", "_bias" if c[8] else ""
    ),
)
def test_operator_against_numpy(ctx, rng, case):
    B, H, Hkv, Sq, Sk, D, causal, kt, bshape = case
    qa = rng.standard_normal((B, H, Sq, D)).astype(np.float32)
    ka = rng.standard_normal((B, Hkv, D, Sk) if kt else (B, Hkv, Sk, D)).astype(np.float32)
    va = rng.standard_normal((B, Hkv, Sk, D)).astype(np.float32)
    feeds = {"q": qa, "k": ka, "v": va}
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=a.shape) for n, a in feeds.items()}
    bias = None
    if bshape is not None:
        ba = np.where(rng.random(bshape) < 0.2, -60.0, rng.standard_normal(bshape)).astype(np.float32)
        feeds["bias"] = ba
        bias = b.input("bias", data_type="float32", shape=bshape)
    out = b._attention(ins["q"], ins["k"], ins["v"], scale=D**-0.5, bias=bias, causal=causal, k_transposed=kt)
    got = run_graph(ctx, {"o": out}, feeds, b)["o"]
    want = reference(qa, ka, va, D**-0.5, feeds.get("bias"), causal, kt)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-5, atol=2e-5)
    if Sq < Sk or not causal:
        assert not np.isnan(got).any()
    else:  # rows i < Sq - Sk see no key: NaN, as an unfused softmax of all -inf
        assert np.isnan(got[..., : Sq - Sk, :]).all() and not np.isnan(got[..., Sq - Sk :, :]).any()


@pytest.mark.parametrize("sq", [1, 3, 40])
@pytest.mark.parametrize("dv", [6, 20])
def test_value_head_size(ctx, rng, sq, dv):
    """v's head size differs from q's and k's, and is not a multiple of 4 (padded V rows)."""
    qa, ka = (
        rng.standard_normal((2, 3, sq, 32)).astype(np.float32),
        rng.standard_normal((2, 3, 45, 32)).astype(np.float32),
    )
    va = rng.standard_normal((2, 3, 45, dv)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    q, k, v = (b.input(x, data_type="float32", shape=a.shape) for x, a in zip("qkv", (qa, ka, va)))
    got = run_graph(ctx, {"o": b._attention(q, k, v, scale=0.2)}, {"q": qa, "k": ka, "v": va}, b)["o"]
    close(got, reference(qa, ka, va, 0.2), 2e-5)


@pytest.mark.parametrize("sq", [1, 3, 64])
@pytest.mark.parametrize("D", [80, 256])
def test_every_candidate(ctx, rng, sq, D):
    """Each tile configuration (autotune candidates; 0 is lavapipe's) is correct, ragged sizes."""
    Sk = 77
    lim = ctx.device.limits["max-compute-workgroup-storage-size"]
    n = len(attention_candidates(sq, Sk, D, D, lim)[0])
    assert n >= 3
    qa = rng.standard_normal((1, 2, sq, D)).astype(np.float32)
    ka = rng.standard_normal((1, 1, Sk, D)).astype(np.float32)
    va = rng.standard_normal((1, 1, Sk, D)).astype(np.float32)
    want = reference(qa, ka, va, 0.1, causal=True)
    for i in range(n):
        with autotune.force(i):
            b = mltensor.MLGraphBuilder(ctx)
            q, k, v = (b.input(x, data_type="float32", shape=a.shape) for x, a in zip("qkv", (qa, ka, va)))
            got = run_graph(ctx, {"o": b._attention(q, k, v, scale=0.1, causal=True)}, {"q": qa, "k": ka, "v": va}, b)
        close(got["o"], want, 2e-5)


def test_operator_float16(ctx, rng):
    for Sq in (1, 40):
        qa, ka, va = (rng.standard_normal((1, 2, n, 64)).astype(np.float16) for n in (Sq, 50, 50))
        b = mltensor.MLGraphBuilder(ctx)
        q, k, v = (b.input(x, data_type="float16", shape=a.shape) for x, a in zip("qkv", (qa, ka, va)))
        g = b.build_sync({"o": b._attention(q, k, v, scale=0.125)})
        assert len(compute(g.kernel_names)) == 1 and f16_tag(ctx) in compute(g.kernel_names)[0], g.kernel_names
        got = dispatch_at(ctx, g, {"q": qa, "k": ka, "v": va})["o"]
        g.destroy()
        assert got.dtype == np.float16
        close(got, reference(qa, ka, va, 0.125), 3e-3)


def test_operator_validation(ctx):
    b = mltensor.MLGraphBuilder(ctx)
    q = b.input("q", data_type="float32", shape=[1, 4, 3, 16])
    with pytest.raises(TypeError, match="batch dimensions"):
        b._attention(
            q,
            b.input("k", data_type="float32", shape=[1, 3, 5, 16]),
            b.input("v", data_type="float32", shape=[1, 3, 5, 16]),
        )
    with pytest.raises(TypeError, match="head sizes"):
        b._attention(
            q,
            b.input("k2", data_type="float32", shape=[1, 4, 5, 8]),
            b.input("v2", data_type="float32", shape=[1, 4, 5, 16]),
        )
    assert "_attention" not in ctx.op_support_limits()


# -- position-major layout and the split decode (flash-decoding) -----------------------------------


def _to_bhsd(x):
    """[.., S, H, D] (layout "bshd", rank 3 or 4) as [B, H, S, D] for the reference."""
    x = x if x.ndim == 4 else x[None]
    return np.swapaxes(x, 1, 2)


def _split_candidates(ctx, sq, sk, d, ratio):
    lim = ctx.device.limits["max-compute-workgroup-storage-size"]
    return [i for i, c in enumerate(attention_candidates(sq, sk, d, d, lim, ratio=ratio)[0]) if c["SPLIT"]]


@pytest.mark.parametrize("rank", [3, 4])
@pytest.mark.parametrize("sq", [1, 3, 40])
def test_layout_bshd(ctx, rng, rank, sq):
    """q [.., Sq, H, D], k and v [.., Sk, Hkv, D] (a KV cache appended in place), out [.., Sq, H,
    D]: read and written through strides by every candidate (decode, split, tiled), 6 query heads
    on 2 K/V heads, causal with a bias, against numpy."""
    H, Hkv, D = 6, 2, 32
    Sk = 45 if sq > 4 else 200  # (a decode of up to DECODE_SPLIT_MIN_SK keys has no split candidates)
    lead = (2,) if rank == 4 else ()
    feeds = {
        "q": rng.standard_normal(lead + (sq, H, D)).astype(np.float32),
        "k": rng.standard_normal(lead + (Sk, Hkv, D)).astype(np.float32),
        "v": rng.standard_normal(lead + (Sk, Hkv, D)).astype(np.float32),
        "bias": np.where(rng.random((1, Sk)) < 0.2, -30.0, 0.0).astype(np.float32),
    }
    want = np.swapaxes(reference(*(_to_bhsd(feeds[n]) for n in "qkv"), 0.2, feeds["bias"], causal=True), 1, 2)
    want = want if rank == 4 else want[0]
    lim = ctx.device.limits["max-compute-workgroup-storage-size"]
    n = len(attention_candidates(sq, Sk, D, D, lim, ratio=H // Hkv)[0])
    kinds = set()
    for i in range(n):
        with autotune.force(i):
            b = mltensor.MLGraphBuilder(ctx)
            ins = {x: b.input(x, data_type="float32", shape=a.shape) for x, a in feeds.items()}
            o = b._attention(ins["q"], ins["k"], ins["v"], scale=0.2, bias=ins["bias"], causal=True, layout="bshd")
            assert o.shape == feeds["q"].shape
            g = b.build_sync({"o": o})
        kinds.add(g.kernel_names[0].rsplit("_", 1)[1][:3])
        assert all("_bshd" in k for k in g.kernel_names), g.kernel_names
        got = dispatch_at(ctx, g, feeds)["o"]
        g.destroy()
        close(got, want, 2e-5)
    assert kinds == ({"spl", "dec"} if sq <= 4 else {"til"}), kinds


SPLIT_KEYS = [1, 7, 64, 192, 193, 1000, 2048]


@pytest.mark.parametrize("dt", ["float32", "float16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("which", ["lavapipe", pytest.param("others", marks=pytest.mark.slow)])
def test_split_decode(ctx, rng, D, dt, which):
    """Flash-decoding: one query row per head, 9 query heads on 3 K/V heads (position-major, as
    the LLM's cache), one build with a dynamic key count run at 1, 7, 64, 192 keys (the
    one-launch decode kernel, gated at dispatch: DECODE_SPLIT_MIN_SK), 193 (the split decode,
    ragged tiles), 1000 and 2048 (many blocks), against numpy. "lavapipe": the CPU adapters'
    choice (candidate 0) and the largest workgroup; "others" (slow): the other split
    candidates."""
    H, Hkv = 9, 3
    total = MLDynamicDimension("total", 2048)
    idx = _split_candidates(ctx, 1, total, D, H // Hkv)
    idx = [idx[0], idx[-1]] if which == "lavapipe" else idx[1:-1]
    tol = 2e-5 if dt == "float32" else 3e-3
    for i in idx:
        with autotune.force(i):
            b = mltensor.MLGraphBuilder(ctx)
            q = b.input("q", data_type=dt, shape=[1, H, D])
            k = b.input("k", data_type=dt, shape=[total, Hkv, D])
            v = b.input("v", data_type=dt, shape=[total, Hkv, D])
            g = b.build_sync({"o": b._attention(q, k, v, scale=D**-0.5, causal=True, layout="bshd")})
        names = [n for n in g.kernel_names if not n.startswith(("unpack_", "pack_"))]  # (edges: no shader-f16)
        assert ["_dec" in n for n in names] == [True, False, False], g.kernel_names
        assert "_split" in names[1] and "_reduce" in names[2], g.kernel_names
        assert all(n.startswith(f"attention_{f16_tag(ctx) if dt == 'float16' else 'f32'}_") for n in names)
        for sk in SPLIT_KEYS:
            feeds = {
                "q": rng.standard_normal((1, H, D)).astype(NP[dt]),
                "k": rng.standard_normal((sk, Hkv, D)).astype(NP[dt]),
                "v": rng.standard_normal((sk, Hkv, D)).astype(NP[dt]),
            }
            got = dispatch_at(ctx, g, feeds)["o"]
            assert got.dtype == NP[dt]
            want = np.swapaxes(reference(*(_to_bhsd(feeds[n]) for n in "qkv"), D**-0.5, causal=True), 1, 2)[0]
            close(got, want, tol)
        g.destroy()


@pytest.mark.parametrize("case", ["k_transposed", "odd_head", "masked_rows", "mqa_bias"])
def test_split_decode_edges(ctx, rng, case):
    """Every split candidate where q, k and v are not read as vec4 (K given transposed, a head
    size of 30), with query rows that see no key (causal, Sq = 4 > Sk = 2: NaN, as the unfused
    graph; so few keys run the one-launch decode kernel, whichever candidate is forced), and
    one K/V head for 8 query heads with a padding bias."""
    B, H, Hkv, Sq, Sk, D, kt, bias = {
        "k_transposed": (1, 4, 2, 1, 300, 32, True, False),
        "odd_head": (2, 6, 3, 2, 230, 30, False, False),
        "masked_rows": (1, 2, 1, 4, 2, 16, False, False),
        "mqa_bias": (1, 8, 1, 3, 257, 64, False, True),
    }[case]
    feeds = {
        "q": rng.standard_normal((B, H, Sq, D)).astype(np.float32),
        "k": rng.standard_normal((B, Hkv, D, Sk) if kt else (B, Hkv, Sk, D)).astype(np.float32),
        "v": rng.standard_normal((B, Hkv, Sk, D)).astype(np.float32),
    }
    if bias:
        feeds["bias"] = np.where(rng.random((B, 1, 1, Sk)) < 0.3, -1e4, 0.0).astype(np.float32)
    want = reference(feeds["q"], feeds["k"], feeds["v"], 0.3, feeds.get("bias"), causal=True, k_transposed=kt)
    for i in _split_candidates(ctx, Sq, Sk, D, H // Hkv):
        with autotune.force(i):
            b = mltensor.MLGraphBuilder(ctx)
            ins = {n: b.input(n, data_type="float32", shape=a.shape) for n, a in feeds.items()}
            o = b._attention(
                ins["q"], ins["k"], ins["v"], scale=0.3, bias=ins.get("bias"), causal=True, k_transposed=kt
            )
            g = b.build_sync({"o": o})
        if Sk > DECODE_SPLIT_MIN_SK:
            assert "_split" in g.kernel_names[0] and ("v4" in g.kernel_names[0]) == (case == "mqa_bias")
        else:
            assert "_dec" in g.kernel_names[0] and len(g.kernel_names) == 1, g.kernel_names
        got = dispatch_at(ctx, g, feeds)["o"]
        g.destroy()
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        np.testing.assert_allclose(got[ok], want[ok], rtol=2e-5, atol=2e-5)
    if case == "masked_rows":
        assert np.isnan(want[..., :2, :]).all() and not np.isnan(want[..., 2:, :]).any()


# -- recognition in the compiler ------------------------------------------------------------------


def _chain(
    b, ins, *, scale_op="div", scale=8.0, bias=None, where=None, where_first_keeps=True, transpose=True, dt="float32"
):
    """The exported pattern: matmul(q, transpose(k)) -> scale -> + bias -> where -> softmax -> matmul v."""
    q, k, v = ins["q"], ins["k"], ins["v"]
    kt = b.transpose(k, permutation=list(range(k.rank - 2)) + [k.rank - 1, k.rank - 2]) if transpose else k
    s = b.matmul(q, kt)
    if scale_op is not None:
        c = b.constant(np.array(scale, NP[dt]))
        s = b.mul(s, c) if scale_op == "mul" else b.div(s, c)
    if bias is not None:
        s = b.add(s, bias)
    if where is not None:
        with np.errstate(over="ignore"):  # (-3.4e38 is -inf in float16, as in an exported float16 model)
            neg = b.constant(np.array(NEG, NP[dt]))
        s = b.where(where, s, neg) if where_first_keeps else b.where(where, neg, s)
    p = b.softmax(s, s.rank - 1)
    return b.matmul(p, v)


def _build_pair(ctxs, feeds, dtypes_, fn):
    """{ctx: (kernel names, output, memory)} of the graph fn(builder, inputs) built in each context."""
    out = {}
    real = ctxs[0]
    for c in ctxs:
        with pytest.MonkeyPatch.context() as mp:
            if c == "unfused":
                mp.setenv("MLTENSOR_NO_FUSION", "1")
            b = mltensor.MLGraphBuilder(real)
            ins = {n: b.input(n, data_type=dtypes_[n], shape=a.shape) for n, a in feeds.items()}
            g = b.build_sync({"o": fn(b, ins)})
        try:
            out[c] = (g.kernel_names, dispatch_at(real, g, feeds)["o"], g.memory)
        finally:
            g.destroy()
    return out


MASKS = ["none", "padding", "causal", "both", "where"]
SHAPES = [  # B, H, Hkv (1: MQA through matmul broadcasting), Sq, Sk, D, rank
    (1, 2, 2, 7, 7, 32, 4),
    (2, 2, 1, 1, 64, 64, 4),
    (1, 3, 3, 64, 64, 80, 4),
    (1, 2, 2, 200, 200, 128, 4),
    (6, 1, 1, 7, 200, 64, 3),  # [B*H, S, D]
    (2, 4, 4, 1, 7, 32, 4),
]


def _masks(kind, rng, B, H, Sq, Sk, rank):
    """(feeds, builder types, how the chain uses them) for a mask kind."""
    lead = (B, 1) if rank == 4 else (B,)
    causal = np.where(np.arange(Sk)[None] > np.arange(Sq)[:, None] + Sk - Sq, -np.inf, 0.0).astype(np.float32)
    pad = np.zeros(lead + (1, Sk), np.float32)
    pad[0, ..., Sk - Sk // 3 :] = -10000.0  # batch 0 padded on the right (every row sees key 0)
    if kind == "none":
        return {}, None
    if kind == "padding":
        return {"mask": pad}, "bias"
    if kind == "causal":
        return {"mask": causal.reshape((1,) * (rank - 2) + causal.shape)}, "bias"
    if kind == "both":
        return {"mask": (pad + causal).astype(np.float32)}, "bias"
    keep = (np.arange(Sk)[None] <= np.arange(Sq)[:, None] + Sk - Sq).astype(np.uint8)
    return {"cond": keep.reshape((1,) * (rank - 2) + keep.shape)}, "where"


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}kv{}q{}k{}d{}r{}".format(*s))
def test_fused_chain(ctx, unfused_ctx, rng, shape, mask):
    B, H, Hkv, Sq, Sk, D, rank = shape
    lead = (B, H) if rank == 4 else (B * H,)
    klead = (B, Hkv) if rank == 4 else (B * Hkv,)
    feeds = {
        "q": rng.standard_normal(lead + (Sq, D)).astype(np.float32),
        "k": rng.standard_normal(klead + (Sk, D)).astype(np.float32),
        "v": rng.standard_normal(klead + (Sk, D)).astype(np.float32),
    }
    extra, use = _masks(mask, rng, B, H, Sq, Sk, rank)
    feeds.update(extra)
    types = {n: ("uint8" if n == "cond" else "float32") for n in feeds}

    def fn(b, ins):
        return _chain(b, ins, bias=ins.get("mask"), where=ins.get("cond"))

    res = _build_pair([ctx, unfused_ctx], feeds, types, fn)
    names, got, _ = res[ctx]
    names = compute(names)
    _, unfused, _ = res[unfused_ctx]
    bias = feeds.get("mask")
    if use == "where":
        bias = np.where(feeds["cond"] != 0, 0.0, NEG).astype(np.float64)
    want = reference(feeds["q"], feeds["k"], feeds["v"], 1 / 8.0, bias)
    assert np.array_equal(np.isnan(got), np.isnan(unfused)) and not np.isnan(want).any()
    close(got, want, 3e-5)
    close(got, unfused.astype(np.float64), 3e-5)
    if FUSION:
        assert len(names) == 1 and names[0].startswith("attention_f32"), names
        assert len(compute(res[unfused_ctx][0])) >= 4


@pytest.mark.parametrize("variant", ["mul", "no_scale", "kt_input", "where_flipped", "epilogue", "mqa_rank3"])
def test_pattern_variants(ctx, unfused_ctx, rng, variant):
    """Scale by mul or none, K given already transposed (read as [.., D, Sk]), where(cond, c, s),
    an elementwise node after P @ V (the attention's epilogue)."""
    B, H, Sq, Sk, D = 2, 2, 9, 33, 32
    feeds = {
        "q": rng.standard_normal((B, H, Sq, D)).astype(np.float32),
        "k": rng.standard_normal((B, H, D, Sk) if variant == "kt_input" else (B, H, Sk, D)).astype(np.float32),
        "v": rng.standard_normal((B, H, Sk, D)).astype(np.float32),
    }
    if variant == "mqa_rank3":
        feeds = {"q": feeds["q"].reshape(B * H, Sq, D), "k": feeds["k"][:1, 0], "v": feeds["v"][:1, 0]}
    if variant == "where_flipped":
        feeds["cond"] = (rng.random((1, 1, Sq, Sk)) < 0.3).astype(np.uint8)  # 1: masked
    if variant == "epilogue":
        feeds["r"] = rng.standard_normal((B, H, Sq, D)).astype(np.float32)
    types = {n: ("uint8" if n == "cond" else "float32") for n in feeds}

    def fn(b, ins):
        kw = {
            "mul": dict(scale_op="mul", scale=0.3),
            "no_scale": dict(scale_op=None),
            "kt_input": dict(transpose=False),
            "where_flipped": dict(where=ins.get("cond"), where_first_keeps=False),
        }.get(variant, {})
        o = _chain(b, ins, **kw)
        return b.relu(b.add(o, ins["r"])) if variant == "epilogue" else o

    res = _build_pair([ctx, unfused_ctx], feeds, types, fn)
    names, got, _ = res[ctx]
    names = compute(names)
    unfused = res[unfused_ctx][1]
    k = np.swapaxes(feeds["k"], -1, -2) if variant == "kt_input" else feeds["k"]
    scale = {"mul": 0.3, "no_scale": 1.0}.get(variant, 1 / 8.0)
    bias = None
    if variant == "where_flipped":
        bias = np.where(feeds["cond"] != 0, NEG, 0.0).astype(np.float64)
    want = reference(feeds["q"], k, feeds["v"], scale, bias)
    if variant == "epilogue":
        want = np.maximum(want + feeds["r"], 0)
    close(got, want, 3e-5)
    close(got, unfused.astype(np.float64), 3e-5)
    if FUSION:
        assert len(names) == 1 and names[0].startswith("attention_"), names
        assert ("_kt" in names[0]) == (variant == "kt_input")


@pytest.mark.parametrize("H, Hkv", [(8, 2), (6, 2)])
def test_grouped_heads_by_expand(ctx, unfused_ctx, rng, H, Hkv):
    """K/V heads repeated by expand + reshape before the matmuls (ratios 4 and 3): the attention
    kernel reads the shared K/V heads, no repeat copies: one kernel."""
    B, S, D = 1, 20, 32
    feeds = {
        "q": rng.standard_normal((B, H, S, D)).astype(np.float32),
        "k": rng.standard_normal((B, Hkv, S, D)).astype(np.float32),
        "v": rng.standard_normal((B, Hkv, S, D)).astype(np.float32),
    }

    def fn(b, ins):
        def rep(x):
            return b.reshape(b.expand(b.reshape(x, [B, Hkv, 1, S, D]), [B, Hkv, H // Hkv, S, D]), [B, H, S, D])

        return _chain(b, {"q": ins["q"], "k": rep(ins["k"]), "v": rep(ins["v"])})

    res = _build_pair([ctx, unfused_ctx], feeds, dict.fromkeys(feeds, "float32"), fn)
    names, got, _ = res[ctx]
    names = compute(names)
    close(got, reference(feeds["q"], feeds["k"], feeds["v"], 1 / 8.0), 3e-5)
    close(got, res[unfused_ctx][1].astype(np.float64), 3e-5)
    if FUSION:
        assert sum(n.startswith("attention_") for n in names) == 1 and len(names) == 1, names


def test_fully_masked_rows_match_unfused(ctx, unfused_ctx, rng):
    """Rows whose scores are all -inf (an additive -inf mask, and where() with -inf): NaN where the
    unfused graph gives NaN, the same values elsewhere."""
    B, H, Sq, Sk, D = 1, 2, 5, 6, 32
    mask = np.zeros((1, 1, Sq, Sk), np.float32)
    mask[..., 1, :] = -np.inf
    mask[..., 3, 2:] = -np.inf
    feeds = {
        "q": rng.standard_normal((B, H, Sq, D)).astype(np.float32),
        "k": rng.standard_normal((B, H, Sk, D)).astype(np.float32),
        "v": rng.standard_normal((B, H, Sk, D)).astype(np.float32),
        "mask": mask,
    }
    res = _build_pair(
        [ctx, unfused_ctx], feeds, dict.fromkeys(feeds, "float32"), lambda b, ins: _chain(b, ins, bias=ins["mask"])
    )
    names, got, _ = res[ctx]
    names = compute(names)
    unfused = res[unfused_ctx][1]
    assert np.isnan(unfused[..., 1, :]).all() and np.array_equal(np.isnan(got), np.isnan(unfused))
    ok = ~np.isnan(unfused)
    np.testing.assert_allclose(got[ok], unfused[ok], rtol=3e-5, atol=3e-5)
    if FUSION:
        assert len(names) == 1, names


NOT_FUSED = {  # what the chain does instead of matching: (output, extra graph outputs)
    "softmax over another axis": lambda b, q, kt, v, m: (b.matmul(b.softmax(b.matmul(q, kt), 2), v), {}),
    "scores also an output": lambda b, q, kt, v, m: (b.matmul(b.softmax(s := b.matmul(q, kt), 3), v), {"s": s}),
    "bias before the scale": lambda b, q, kt, v, m: (
        b.matmul(b.softmax(b.mul(b.add(b.matmul(q, kt), m), b.constant(np.float32(0.5))), 3), v),
        {},
    ),
    "scale not a constant": lambda b, q, kt, v, m: (b.matmul(b.softmax(b.mul(b.matmul(q, kt), m), 3), v), {}),
    "probabilities also an output": lambda b, q, kt, v, m: (b.matmul(p := b.softmax(b.matmul(q, kt), 3), v), {"p": p}),
    # (two biases fuse: sdpa.py merge_biases adds them first, test_window_attention_dynamic_batch)
}


@pytest.mark.parametrize("what", list(NOT_FUSED))
def test_not_fused(ctx, monkeypatch, what):
    """Chains that do not match exactly keep the kernels they had without the pass."""
    shapes = {"q": (1, 2, 8, 16), "k": (1, 2, 8, 16), "v": (1, 2, 8, 16), "m": (1, 2, 8, 8)}
    names = {}
    for off in (False, True):
        monkeypatch.setenv("MLTENSOR_NO_ATTENTION", "1" if off else "0")
        b = mltensor.MLGraphBuilder(ctx)
        ins = {n: b.input(n, data_type="float32", shape=s) for n, s in shapes.items()}
        kt = b.transpose(ins["k"], permutation=[0, 1, 3, 2])
        o, more = NOT_FUSED[what](b, ins["q"], kt, ins["v"], ins["m"])
        g = b.build_sync({"o": o, **more})
        names[off] = g.kernel_names
        g.destroy()
    assert names[False] == names[True]
    assert not any(n.startswith("attention_") for n in names[False])


def test_fusion_report_names_the_softmax_left(ctx):
    """A softmax the attention pass leaves (over another axis) is in graph.fusion_report() with
    the check that failed, under the node's label."""
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=(1, 2, 8, 16)) for n in "qkv"}
    kt = b.transpose(ins["k"], permutation=[0, 1, 3, 2])
    p = b.softmax(b.matmul(ins["q"], kt), 2, label="scores_softmax")
    g = b.build_sync({"o": b.matmul(p, ins["v"])})
    (finding,) = [r for r in g.fusion_report() if r["kind"] == "attention"]
    assert finding["op"] == "softmax" and finding["label"] == "scores_softmax", finding
    assert "last axis" in finding["reason"], finding
    g.destroy()


# -- dynamic sizes, float16, memory, models --------------------------------------------------------


@pytest.mark.parametrize("max_keys", [90, 300])
def test_dynamic_sizes(ctx, rng, max_keys):
    """One build with dynamic query and key lengths, run at several sizes, against numpy and a
    static build of each size. Up to 300 keys: the decode is the one-launch kernel up to
    DECODE_SPLIT_MIN_SK keys and the split decode past it, gated on the key length too."""
    sq, sk = MLDynamicDimension("seq", 40), MLDynamicDimension("total", max_keys)
    b = mltensor.MLGraphBuilder(ctx)
    q = b.input("q", data_type="float32", shape=[1, 2, sq, 32])
    k = b.input("k", data_type="float32", shape=[1, 2, sk, 32])
    v = b.input("v", data_type="float32", shape=[1, 2, sk, 32])
    m = b.input("mask", data_type="float32", shape=[1, 1, 1, sk])
    g = b.build_sync({"o": _chain(b, {"q": q, "k": k, "v": v}, bias=m)})
    if FUSION:  # the decode and the prompt kernel, each gated on the dispatch's query length
        kinds = [n.rsplit("_", 1)[1][:3] for n in g.kernel_names]
        # (the prompt kernel: CPU adapters' ROWS kernel, test_attention_cpu.py, else the tiled one)
        prompt = "row" if cpu_device(ctx.device) and not switch("MLTENSOR_NO_ROW_ATTENTION") else "til"
        assert kinds == (["dec", prompt] if max_keys <= DECODE_SPLIT_MIN_SK else ["dec", "spl", "red", prompt]), kinds
        assert all(n.startswith("attention_") for n in g.kernel_names), g.kernel_names
    sizes = [(1, 1), (40, 90), (7, 33), (17, 17)]
    if max_keys > DECODE_SPLIT_MIN_SK:
        # (the split decode at Sq = 4, the decode variant's own rows: its blocks then match the static build's)
        sizes += [(1, DECODE_SPLIT_MIN_SK), (4, DECODE_SPLIT_MIN_SK + 1), (4, 300), (40, 300)]
    for s, t in sizes:
        feeds = {
            "q": rng.standard_normal((1, 2, s, 32)).astype(np.float32),
            "k": rng.standard_normal((1, 2, t, 32)).astype(np.float32),
            "v": rng.standard_normal((1, 2, t, 32)).astype(np.float32),
            "mask": np.where(rng.random((1, 1, 1, t)) < 0.3, -1e4, 0).astype(np.float32),
        }
        got = dispatch_at(ctx, g, feeds)["o"]
        close(got, reference(feeds["q"], feeds["k"], feeds["v"], 1 / 8.0, feeds["mask"]), 3e-5)
        bs = mltensor.MLGraphBuilder(ctx)
        ins = {n: bs.input(n, data_type="float32", shape=a.shape) for n, a in feeds.items()}
        static = run_graph(ctx, {"o": _chain(bs, ins, bias=ins["mask"])}, feeds, bs)["o"]
        if autotune.enabled(ctx.device):  # (the tuner may pick other tiles at other sizes)
            close(got, static.astype(np.float64), 3e-5)
        else:  # the kernel a static build of these sizes runs, with the same tiles: the same bits
            np.testing.assert_array_equal(got, static)
    g.destroy()


@pytest.mark.parametrize("windows", [1, 4])
def test_window_attention_dynamic_batch(ctx, rng, windows):
    """Swin's (shifted) window attention with the batch known at dispatch: scores + a relative
    position bias [1, H, N, N], viewed [n, nW, H, N, N] + a per-window mask [1, nW, 1, N, N],
    viewed back (compiler/fusion/sdpa.py window_masks, merge_biases): one attention kernel (the
    mask expanded to the windows and the biases summed per dispatch), no softmax; numpy."""
    nb, H, N, Dh = MLDynamicDimension("n", 3), 2, 9, 8
    rel = (rng.standard_normal((1, H, N, N)) * 0.5).astype(np.float32)
    mask = np.where(rng.random((1, windows, 1, N, N)) < 0.3, -100.0, 0.0).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=[nb, windows, H, N, Dh]) for n in "qkv"}
    n = ins["q"].shape[0]
    q, k, v = (b.reshape(ins[x], [n * windows, H, N, Dh]) for x in "qkv")
    s = b.add(
        b.matmul(b.mul(q, b.constant(data_type="float32", value=Dh**-0.5)), b.transpose(k, permutation=[0, 1, 3, 2])),
        b.constant(rel),
    )
    s = b.reshape(b.add(b.reshape(s, [n, windows, H, N, N]), b.constant(mask)), [n * windows, H, N, N])
    g = b.build_sync({"o": b.matmul(b.softmax(s, axis=3), v)})
    if FUSION:
        assert not [k for k in g.kernel_names if k.startswith("softmax")], g.kernel_names
        assert [k for k in g.kernel_names if k.startswith("attention")], g.kernel_names
    for batch in (1, 3):
        f = {x: rng.standard_normal((batch, windows, H, N, Dh)).astype(np.float32) for x in "qkv"}
        bias = (rel[:, None] + mask[:, :, :]).reshape(1, windows, H, N, N) + np.zeros((batch, 1, 1, 1, 1))
        want = reference(
            *(f[x].reshape(batch * windows, H, N, Dh) for x in "qkv"), Dh**-0.5, bias.reshape(batch * windows, H, N, N)
        )
        close(dispatch_at(ctx, g, f)["o"], want, 3e-5)
    g.destroy()


def test_einsum_attention_rank5(ctx, rng):
    """MaxViT's attention as torch.onnx.export writes its einsums: rank-5 [b, P, H, N, D]
    operands, identity transposes and same-shape reshapes around each MatMul (noop.py), K scaled
    before its transpose (sdpa.py hoist_scales), a relative position bias [1, H, N, N]: one
    attention kernel, nothing else; numpy."""
    nb, P, H, N, Dh = MLDynamicDimension("n", 3), 4, 2, 5, 8
    rel = rng.standard_normal((1, H, N, N)).astype(np.float32)
    b = mltensor.MLGraphBuilder(ctx)
    q, k, v = (b.input(x, data_type="float32", shape=[nb, P, H, N, Dh]) for x in "qkv")

    def noop(x):  # (what the exporter writes around an einsum's MatMul)
        return b.reshape(b.transpose(x, permutation=list(range(5))), list(x.shape))

    kt = b.transpose(b.mul(k, b.constant(data_type="float32", value=Dh**-0.5)), permutation=[0, 1, 2, 4, 3])
    s = b.add(noop(b.matmul(noop(q), noop(kt))), b.constant(rel))
    g = b.build_sync({"o": b.matmul(noop(b.softmax(s, axis=4)), noop(v))})
    if FUSION:
        assert [k.split("_")[0] for k in compute(g.kernel_names)] == ["attention"] * len(compute(g.kernel_names))
    for batch in (1, 3):
        f = {x: rng.standard_normal((batch, P, H, N, Dh)).astype(np.float32) for x in "qkv"}
        want = reference(f["q"], f["k"], f["v"], Dh**-0.5, rel[None])
        close(dispatch_at(ctx, g, f)["o"], want, 3e-5)
    g.destroy()


def test_fused_chain_float16(ctx, unfused_ctx, rng):
    B, H, Sq, Sk, D = 1, 2, 33, 47, 64
    feeds = {
        "q": rng.standard_normal((B, H, Sq, D)).astype(np.float16),
        "k": rng.standard_normal((B, H, Sk, D)).astype(np.float16),
        "v": rng.standard_normal((B, H, Sk, D)).astype(np.float16),
        "cond": (np.arange(Sk)[None] <= np.arange(Sq)[:, None] + Sk - Sq).astype(np.uint8),
    }
    types = {"q": "float16", "k": "float16", "v": "float16", "cond": "uint8"}
    res = _build_pair([ctx, unfused_ctx], feeds, types, lambda b, ins: _chain(b, ins, where=ins["cond"], dt="float16"))
    names, got, _ = res[ctx]
    names = compute(names)
    assert got.dtype == np.float16
    bias = np.where(feeds["cond"] != 0, 0.0, -np.inf)
    close(got, reference(feeds["q"], feeds["k"], feeds["v"], 1 / 8.0, bias), 4e-3)
    close(got, res[unfused_ctx][1].astype(np.float64), 4e-3)
    if FUSION:
        assert len(names) == 1 and names[0].startswith(f"attention_{f16_tag(ctx)}"), names


def test_no_scores_in_memory(ctx, unfused_ctx, rng):
    """S = 1024: the unfused graph holds the H x S x S scores; the fused one nothing of that size."""
    H, S, D = 2, 1024, 32
    shapes = {"q": (1, H, S, D), "k": (1, H, S, D), "v": (1, H, S, D)}
    mem = {}
    for c in (ctx, unfused_ctx):
        with pytest.MonkeyPatch.context() as mp:
            if c == "unfused":
                mp.setenv("MLTENSOR_NO_FUSION", "1")
            b = mltensor.MLGraphBuilder(ctx)
            ins = {n: b.input(n, data_type="float32", shape=s) for n, s in shapes.items()}
            g = b.build_sync({"o": _chain(b, ins)})
        mem[c] = g.memory["intermediates"]
        g.destroy()
    assert mem[unfused_ctx] >= H * S * S * 4
    if FUSION:
        assert mem[ctx] < S * S * 4, mem[ctx]


def test_graph_is_picklable_data(ctx):
    """Kernel parameters are plain values (the graph cache pickles them)."""
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=(1, 2, 5, 16)) for n in "qkv"}
    g = b.build_sync({"o": _chain(b, ins)})
    for k in g._kernels:
        pickle.loads(pickle.dumps(k.params))
    g.destroy()


def test_tiny_gpt2_against_onnxruntime(ctx, monkeypatch):
    """The decoder's attention (MatMul, Transpose of K, Div, Add of the padding mask, Where of
    the causal mask, Softmax, MatMul) runs as one kernel per layer, prompt and decode steps,
    static and dynamic builds, with onnxruntime's logits and caches."""
    ort = pytest.importorskip("onnxruntime")
    from mltensor.models_synthetic import tiny_gpt2

    # (the persistent graph cache keys sessions by model, not by MLTENSOR_NO_FUSION: build here)
    monkeypatch.setenv("MLTENSOR_GRAPH_CACHE", "0")

    L, H, D, V = 2, 4, 16, 128
    model = tiny_gpt2(layers=L, heads=H, head_size=D, vocab=V, attention_mask=True)
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for dynamic in (True, False):
        sess = mltensor.InferenceSession(
            model, ctx, dynamic=dynamic, **({"max_dimensions": {"past_sequence": 32}} if dynamic else {})
        )
        names = [o.name for o in sess.get_outputs()]
        mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], np.int64)
        f = {"input_ids": rng.integers(0, V, (2, 5)), "attention_mask": mask}
        f.update(
            {f"past_key_values.{i}.{k}": np.zeros((2, H, 0, D), np.float32) for i in range(L) for k in ("key", "value")}
        )
        for step in range(4):
            got = dict(zip(names, sess.run(None, f)))
            want = dict(zip(names, ref.run(None, f)))
            for n in names:
                np.testing.assert_allclose(got[n], want[n], rtol=1e-4, atol=1e-4, err_msg=f"{n} step {step}")
            if FUSION:
                kn = sess.graph.kernel_names
                # one per layer; a dynamic prompt build has two (decode and tiled kernels,
                # gated on the dispatch's query length)
                gated = dynamic and step == 0
                assert sum(n.startswith("attention_") for n in compute(kn)) == L * (2 if gated else 1), kn
                assert not any(n.startswith("softmax") for n in kn), kn
            nxt = want["logits"][:, -1].argmax(-1).reshape(2, 1)
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], 1)
            f = {"input_ids": nxt, "attention_mask": mask}
            f.update({f"past_key_values.{n[len('present.') :]}": want[n] for n in names if n.startswith("present.")})


@pytest.mark.slow
def test_long_sequence(ctx, rng):
    H, S, D = 2, 2048, 64
    feeds = {n: rng.standard_normal((1, H, S, D)).astype(np.float32) for n in "qkv"}
    b = mltensor.MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=a.shape) for n, a in feeds.items()}
    got = run_graph(ctx, {"o": b._attention(ins["q"], ins["k"], ins["v"], scale=0.125, causal=True)}, feeds, b)["o"]
    close(got, reference(feeds["q"], feeds["k"], feeds["v"], 0.125, causal=True), 3e-5)
