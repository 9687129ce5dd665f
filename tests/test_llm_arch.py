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

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import mltensor  # noqa: E402
from mltensor.llm import LlamaModel  # noqa: E402

import llm_convert  # noqa: E402

llm_convert.import_models()  # before any wgpu device (llm_convert.import_models)

REL = 1e-3
STEPS = 24
PROMPT = [5, 17, 99, 200, 3, 42, 7, 0, 255, 31, 64]  # 11 tokens: past the sliding window of 8
CHUNK = [9, 128, 77]


@pytest.fixture(scope="module")
def ctx():
    return mltensor.ml.create_context_sync()


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
    assert max(errs) < REL, errs
    assert ours == theirs, (ours, theirs)
    return max(errs), len(ours)


@pytest.mark.parametrize("case", list(llm_convert.CASES))
def test_float_gguf_matches_transformers(ctx, case):
    path, hf = llm_convert.cached_gguf(case)
    model = LlamaModel(path, ctx, max_context=64)
    assert model.config.arch == llm_convert.CASES[case][0]
    compare(ctx, path, hf)


QUANTS = ["Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K"]
# sizes whose rows are whole K-quant super-blocks (256 values), so that Q4_K_M holds Q4_K / Q6_K
BIG = {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 512, "vocab": 512}


@pytest.fixture(scope="module")
def quantizer():
    py = llm_convert.quantizer_python()
    if py is None:
        pytest.skip("needs cyllama (pip install cyllama), here or in MLTENSOR_QUANTIZE_PYTHON")
    return py


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
