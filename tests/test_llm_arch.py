"""The GGUF architectures of mltensor/llm/arch against transformers: a small random-weight
transformers model of each (tests/llm_convert.py: llama, Llama 3 rope scaling, Mistral, qwen2,
qwen3, gemma2, gemma3, phi3), written to a float32 GGUF file as llama.cpp's converter writes it,
and (slow) quantized by llama.cpp's own quantizer (cyllama: here or in MLTENSOR_QUANTIZE_PYTHON).

The check, per file: a prompt longer than the sliding window, then a chunk of tokens, then 24
greedy steps along the reference's tokens; at every step our logits within 1e-3 (relative to the
largest) of the reference's, and the same argmax (so greedy decoding gives the same tokens). The
reference is transformers (float32, eager attention, the whole sequence each step, no cache):
on the original weights for the float32 file, on the file's weights as the gguf package
dequantizes them for a quantized one."""

import os

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mltensor  # noqa: E402
from mltensor.llm import LlamaModel  # noqa: E402
from mltensor.llm.batch import LlamaBatch  # noqa: E402

import llm_convert  # noqa: E402

llm_convert.import_models()  # before any wgpu device (llm_convert.import_models)

REL = 1e-3
STEPS = 24
PROMPT = [5, 17, 99, 200, 3, 42, 7, 0, 255, 31, 64]  # 11 tokens: past the sliding window of 8
CHUNK = [9, 128, 77]


@pytest.fixture(scope="module")
def ctx():
    return mltensor.ml.create_context_sync()


@pytest.fixture(scope="module", autouse=True)
def torch_one_thread():
    """torch on one thread: the reference's tiny matmuls run 40x slower on two threads of two
    busy cores (their synchronization), 0.4 s against 17 s for Gemma 3's 24 steps."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def rel_err(got, ref):
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def compare(ctx, path, hf, steps=STEPS, chunk=True):
    """Ours against transformers along the reference's greedy tokens; returns (largest relative
    logit error, greedy tokens identical) and asserts both."""
    model = LlamaModel(path, ctx, max_context=64, max_step=4)
    s = model.session()
    seq, errs, ours, theirs = [], [], [], []
    feeds = [PROMPT] + ([CHUNK] if chunk else [])
    for _ in range(len(feeds) + steps):
        feed = feeds.pop(0) if feeds else [theirs[-1]]
        seq += feed
        got = ctx.read_tensor_sync(s.feed(np.array(feed, np.int32)))[0]
        with torch.no_grad():
            want = hf(torch.tensor([seq])).logits[0, -1].double().numpy()
        errs.append(rel_err(got, want))
        ours.append(int(got.argmax()))
        theirs.append(int(want.argmax()))
    print(f"[{os.path.basename(path)}: logits within {max(errs):.2e}, greedy tokens identical: {ours == theirs}]")
    assert max(errs) < REL, errs
    assert ours == theirs, (ours, theirs)
    return max(errs), len(ours)


@pytest.mark.parametrize("case", list(llm_convert.CASES))
def test_float_gguf_matches_transformers(ctx, case):
    path, hf = llm_convert.cached_gguf(case)
    model = LlamaModel(path, ctx, max_context=64)
    assert model.config.arch == llm_convert.CASES[case][0]
    compare(ctx, path, hf)


def rows_against_sessions(ctx, path):
    """The serving step (LlamaBatch: sequences of different lengths in one dispatch, prompts read
    in chunks beside decode rows) against one LlamaSession per sequence fed the same chunks: the
    logits of every entry within 1e-4 (relative) and the same argmax, and the first entry's
    bitwise the same alone as in its step. Steps of 3 sequences: a
    prompt past the sliding window and a 1-token prompt, then the third's prompt in two chunks
    beside the others' decode rows, then decode rows of all three, a chunk beside a decode row,
    and decode rows past the positions a sliding layer's ring keeps (model.rows_ring)."""
    model = LlamaModel(path, ctx, max_context=64, max_step=8)
    batch = LlamaBatch(model, 3, rows=16)
    sessions = [model.session() for _ in range(3)]
    third = CHUNK + PROMPT[:5]
    lengths, nxt, worst = [0, 0, 0], [None] * 3, 0.0
    plan = [{0: PROMPT, 2: [7]}, {1: third[:4], 0: None, 2: None}, {1: third[4:], 0: None, 2: None}]
    # decode rows past the ring of a sliding layer's cache (8 + 16 - 1 positions: written over)
    plan += [{0: None, 1: None, 2: None}] * 4 + [{0: None, 2: [5, 6, 7, 8, 9, 10]}] + [{0: None, 1: None, 2: None}] * 10
    for step in plan:
        entries = [(slot, lengths[slot], feed if feed is not None else [nxt[slot]]) for slot, feed in step.items()]
        alone = batch.run(entries[:1])[0]  # (rewritten by the step: the same values)
        got = batch.run(entries)
        assert np.array_equal(alone, got[0])  # a row's logits do not depend on its batch
        for (slot, start, feed), row in zip(entries, got):
            want = ctx.read_tensor_sync(sessions[slot].feed(np.array(feed, np.int32)))[0]
            worst = max(worst, rel_err(row, want.astype(np.float64)))
            assert int(row.argmax()) == int(want.argmax())
            lengths[slot] += len(feed)
            nxt[slot] = int(row.argmax())
    assert worst < 1e-4, worst
    if any(model.config.windows):  # the sliding layers' ring was written over
        assert 0 < batch.ring < max(lengths), (batch.ring, lengths)
    return worst


@pytest.mark.parametrize("case", list(llm_convert.CASES))
def test_serving_rows_match_sessions(ctx, case):
    path, _ = llm_convert.cached_gguf(case)
    rows_against_sessions(ctx, path)


QUANTS = ["Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K"]  # (Q8_0 of the small model: the default run)
# sizes whose rows are whole K-quant super-blocks (256 values), so that Q4_K_M holds Q4_K / Q6_K
BIG = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 512, "vocab": 512}


@pytest.fixture(scope="module")
def quantizer():
    py = llm_convert.quantizer_python()
    if py is None:
        pytest.skip("needs cyllama (pip install cyllama), here or in MLTENSOR_QUANTIZE_PYTHON")
    return py


@pytest.mark.parametrize("case", list(llm_convert.CASES))
def test_q8_0_gguf_matches_transformers(ctx, quantizer, case):
    """The small model quantized to Q8_0 by llama.cpp (its quantizer takes about a second; the
    file is cached), against transformers over the file's dequantized weights."""
    path, hf = llm_convert.cached_gguf(case, "Q8_0", python=quantizer)
    assert "Q8_0" in {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    compare(ctx, path, llm_convert.hf_from_gguf(hf, path))


@pytest.mark.slow
@pytest.mark.parametrize("ftype", QUANTS)
@pytest.mark.parametrize("case", list(llm_convert.CASES))
def test_quantized_gguf_matches_transformers(ctx, quantizer, case, ftype):
    """llama.cpp's quantizer on the float file; the reference is transformers over the quantized
    file's weights as the gguf package dequantizes them."""
    sizes = dict(BIG)
    if llm_convert.CASES[case][3].get("head_dim"):
        sizes["head_dim"] = 128  # key_length other than hidden / heads (qwen3, gemma3)
    path, hf = llm_convert.cached_gguf(case, ftype, python=quantizer, **sizes)
    kinds = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert ftype[:4] in " ".join(kinds), kinds
    compare(ctx, path, llm_convert.hf_from_gguf(hf, path))
    rows_against_sessions(ctx, path)


# -- the attention kernel's sliding window and soft-cap ---------------------------------------


@pytest.mark.parametrize(
    "sq, sk, window, softcap",
    [
        (1, 20, 8, 0.0),  # decode, one workgroup a head ("dec")
        (2, 20, 8, 3.0),
        (1, 300, 8, 0.0),  # decode, keys split over workgroups (flash-decoding): blocks before the window
        (3, 300, 50, 3.0),
        (2, 260, 4096, 0.0),  # a window wider than the cache (Gemma 2's 4096): every key
        (11, 11, 4, 0.0),  # prompt (tiled): tiles before the window skipped
        (40, 100, 7, 3.0),
        (70, 70, 33, 3.0),
    ],
)
def test_attention_window_and_softcap(ctx, sq, sk, window, softcap):
    """_attention(window=W, softcap=c) against numpy in each kernel family: row i (position
    i + sk - sq) sees keys (i + sk - sq - W, i + sk - sq]; scores c * tanh(s / c)."""
    from mltensor import MLGraphBuilder

    rng = np.random.default_rng(sq * 1000 + sk)
    nh, nkv, d = 4, 2, 16
    arrays = {
        "q": rng.standard_normal((sq, nh, d)).astype(np.float32),
        "k": (2 * rng.standard_normal((sk, nkv, d))).astype(np.float32),
        "v": rng.standard_normal((sk, nkv, d)).astype(np.float32),
    }
    b = MLGraphBuilder(ctx)
    ins = {n: b.input(n, data_type="float32", shape=list(a.shape)) for n, a in arrays.items()}
    y = b._attention(
        ins["q"], ins["k"], ins["v"], scale=d**-0.5, causal=True, layout="bshd", window=window, softcap=softcap
    )
    g = b.build_sync({"y": y})
    feeds = {}
    for n, a in arrays.items():
        feeds[n] = ctx.create_tensor_sync(data_type="float32", shape=list(a.shape), writable=True)
        ctx.write_tensor(feeds[n], a)
    ty = ctx.create_tensor_sync(data_type="float32", shape=[sq, nh, d], readable=True)
    ctx.dispatch(g, feeds, {"y": ty})
    got = ctx.read_tensor_sync(ty)
    q, k, v = (arrays[n].astype(np.float64) for n in "qkv")
    pos, key = np.arange(sq)[:, None] + sk - sq, np.arange(sk)[None, :]
    for h in range(nh):
        s = q[:, h] @ k[:, h // 2].T * d**-0.5
        if softcap:
            s = softcap * np.tanh(s / softcap)
        s[(key > pos) | (pos - key >= window)] = -np.inf
        p = np.exp(s - s.max(1, keepdims=True))
        np.testing.assert_allclose(got[:, h], (p / p.sum(1, keepdims=True)) @ v[:, h // 2], atol=2e-6)
    b = MLGraphBuilder(ctx)
    x = b.input("x", data_type="float32", shape=[4, nh, d])
    with pytest.raises(TypeError, match="causal"):
        b._attention(x, x, x, window=4)
    with pytest.raises(TypeError, match="softcap"):
        b._attention(x, x, x, softcap=-1.0)


def test_config_per_layer(tmp_path):
    """What the descriptions read from the converted files: Gemma 3's five sliding layers (rope
    base 10000, no scaling) then a global one (1e6, linear scale 1/8); Gemma 2's soft-caps and
    every other layer sliding; Phi-3's partial rotary; Llama 3's rope factors; YaRN refused."""
    from mltensor.errors import NotSupportedError
    from mltensor.llm import LlamaWeights

    c = LlamaWeights(llm_convert.cached_gguf("gemma3")[0]).config
    assert c.windows == [8, 8, 8, 8, 8, 0] and c.head_dim == 32 and c.attn_softcap == 0.0
    assert c.layer_ropes == [(10000.0, 1.0)] * 5 + [(1000000.0, 0.125)]
    c = LlamaWeights(llm_convert.cached_gguf("gemma2")[0]).config
    assert c.windows == [8, 0] and (c.attn_softcap, c.final_softcap) == (4.0, 12.0)
    assert LlamaWeights(llm_convert.cached_gguf("phi3")[0]).config.rope_dims == 8
    w = LlamaWeights(llm_convert.cached_gguf("llama3")[0])
    assert w.rope_freqs is not None and w.rope_freqs.dense.max() == 8.0 and w.rope_freqs.dense.min() == 1.0
    src = llm_convert.cached_gguf("qwen2")[0]
    r = gguf.GGUFReader(src)
    out = gguf.GGUFWriter(str(tmp_path / "yarn.gguf"), "qwen2")
    for key, field in r.fields.items():
        if key.startswith("qwen2."):
            v = field.contents()
            (out.add_float32 if isinstance(v, float) else out.add_uint32)(key, v)
    out.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    for t in r.tensors:
        out.add_tensor(t.name, np.asarray(t.data).reshape([int(x) for x in reversed(t.shape.tolist())]))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    with pytest.raises(NotSupportedError, match="yarn"):
        LlamaWeights(str(tmp_path / "yarn.gguf"))


def test_serving_ring_keeps_what_a_reused_prefix_needs(ctx):
    """A slot reused by a sequence sharing the start of what it holds (the engine's prompt cache):
    with a sliding layer's ring written over, LlamaBatch.reusable keeps the shared start only
    where the ring still holds the keys the next position reads, and the logits then equal a
    fresh session's."""
    path, _ = llm_convert.cached_gguf("gemma3")
    model = LlamaModel(path, ctx, max_context=64, max_step=8)
    batch = LlamaBatch(model, 2, rows=16)
    held = list(range(3, 33))  # 30 positions: past the ring (8 + 16 - 1)
    for i in range(0, len(held), 10):
        batch.run([(0, i, held[i : i + 10])])
    assert batch.reusable(len(held), 5) == 0  # its keys 0..5 are gone from the ring
    n = batch.reusable(len(held), 28)
    assert n == 28
    new = held[:28] + [7, 9]
    got = batch.run([(0, n, new[n:])])[0]
    want = ctx.read_tensor_sync(model.session().feed(np.array(new, np.int32)))[0]
    assert rel_err(got, want.astype(np.float64)) < 1e-4 and got.argmax() == want.argmax()


@pytest.mark.parametrize("case", ["gemma2", "gemma3"])
def test_session_ring_bounds_the_cache(ctx, case):
    """A LlamaSession of a model with sliding-window layers keeps a ring of window + max_step - 1
    positions for them (its other layers every position), feeds a first prompt longer than the
    ring in steps, and after the ring has wrapped keeps a shared prefix only where the ring still
    holds what the next position reads (LlamaSession.keep): the logits then equal transformers'
    on the whole sequence (the transformers check of test_float_gguf_matches_transformers feeds
    past the wrap too)."""
    path, hf = llm_convert.cached_gguf(case)
    model = LlamaModel(path, ctx, max_context=64, max_step=4)
    windows = model.config.windows
    ring = max(windows) + 4 - 1
    s = model.session()
    for i, w in enumerate(windows):
        rows = s.cache_tensors[f"cache_k{i}"].shape[0]
        assert rows == (ring if w else 64), (i, w, rows)
    held = [(7 * i + 3) % 200 for i in range(30)]  # 30 positions: the ring (11) written over
    s.feed(np.array(held, np.int32))
    assert s.keep(5) == 0 and s.length == 0  # keys 0..4 are gone from the ring: fed again
    s.feed(np.array(held, np.int32))
    assert s.keep(28) == 28
    seq = held[:28] + [9, 128]
    got = ctx.read_tensor_sync(s.feed(np.array(seq[28:], np.int32)))[0]
    with torch.no_grad():
        want = hf(torch.tensor([seq])).logits[0, -1].double().numpy()
    assert rel_err(got, want) < REL and got.argmax() == want.argmax()
