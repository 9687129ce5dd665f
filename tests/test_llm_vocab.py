"""GGUF tokenizers (mltensor/llm/tokenizer.py) on real vocabularies: the vocab-only GGUF files of
llama.cpp's repository (models/ggml-vocab-<name>.gguf: Llama 2's and Phi-3's SentencePiece, Llama
3's, Qwen2's, GPT-2's, StarCoder's, Refact's, MPT's and Command-R's byte-level BPE, as their
converters wrote them), fetched from the llama-cpp-python source distribution
(`mltensor.models.fetch_vocab`; every test skips when it cannot be fetched).

- llama.cpp's own tokenizer test cases beside each file (.gguf.inp texts, .gguf.out the ids the
  model's Hugging Face tokenizer gave, which llama.cpp's test-tokenizer-0 checks itself against):
  the same ids, and decoding those ids gives the text back.
- transformers' tokenizer built from the same file (its GGUF reader) on test_llm_tokenizer.py's
  multilingual texts (English, code, Chinese, Japanese, Korean, emoji, Cyrillic, whitespace runs,
  numbers, special tokens) and llama.cpp's texts: the same ids and text, except where transformers'
  GGUF reader departs from the model's own tokenizer (DEPARTS, each departure shown on llama.cpp's
  cases: transformers differs from the .out ids there).
- BOS as llama.cpp adds it when the file does not say.
"""

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from test_llm_tokenizer import LEADING, TEXTS, HFTokenizer  # noqa: E402

from mltensor.llm.gguf import GGUFFile  # noqa: E402
from mltensor.llm.tokenizer import GGUFTokenizer  # noqa: E402
from mltensor.models import VOCABS, FetchError, fetch_vocab  # noqa: E402

SEPARATOR = "\n__ggml_vocab_test__\n"

#: vocabulary -> (texts where transformers' GGUF reader departs from the model's tokenizer, why)
DEPARTS = {
    # sentencepiece (and llama.cpp) put the dummy prefix before any text; transformers' Metaspace
    # ("first") puts none before a text that starts with a space
    "llama-spm": (lambda s: s[:1] == " ", "no dummy prefix before a leading space"),
    # MPT's runs of 2-24 spaces are user-defined tokens that its tokenizer.json and llama.cpp match
    # whole before the BPE; transformers' GGUF reader leaves them to the merges
    "mpt": (lambda s: "  " in s, "whitespace-run tokens not matched whole"),
}


# the gguf package reads these files' 150k-400k token strings in 9-15 s each on a 2-core machine:
# the default run keeps the smaller vocabularies (SentencePiece and GPT-2-sized BPEs, 1-3 s each)
BIG = ("llama-bpe", "qwen2", "command-r")


@pytest.fixture(
    scope="module", params=[pytest.param(n, marks=[pytest.mark.slow] if n in BIG else []) for n in sorted(VOCABS)]
)
def vocab(request):
    """(name, path, our tokenizer, llama.cpp's cases [(text, ids)]) of one real vocabulary."""
    try:
        path = fetch_vocab(request.param, progress=False)
    except FetchError as e:
        pytest.skip(f"llama.cpp's vocabularies cannot be fetched: {e}")
    return request.param, path, GGUFTokenizer(GGUFFile(path)), llama_cpp_cases(path)


def llama_cpp_cases(path):
    """llama.cpp's test cases of a vocabulary file, read as tests/test-tokenizer-0.cpp reads them."""
    with open(path + ".inp", encoding="utf-8", newline="") as f:
        raw = f.read()
    texts, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEPARATOR, pos)
        texts.append(raw[pos:] if nxt < 0 else raw[pos:nxt])
        pos = len(raw) if nxt < 0 else nxt + len(SEPARATOR)
    with open(path + ".out", encoding="utf-8") as f:
        ids = [[int(t) for t in line.split()] for line in f.read().splitlines()]
    assert len(texts) == len(ids) > 40, (len(texts), len(ids))
    return list(zip(texts, ids))


def test_llama_cpp_cases(vocab):
    name, _, t, cases = vocab
    wrong = [(s, want, got) for s, want in cases if (got := t.encode(s, add_bos=False, add_eos=False)) != want]
    assert wrong == [], f"{name}: {len(wrong)} of {len(cases)} cases differ from llama.cpp's ids: {wrong[:3]}"
    unread = [(s, back) for s, want in cases if (back := t.decode(want)) != s]
    assert unread == [], f"{name}: decoding llama.cpp's ids does not give the text: {unread[:3]}"


def test_transformers_agrees(vocab):
    name, path, ours, cases = vocab
    hf = HFTokenizer(path)
    departs, why = DEPARTS.get(name, (lambda s: False, ""))
    texts = list(dict.fromkeys(TEXTS + LEADING + [s for s, _ in cases]))
    differ = []
    for s in texts:
        a, b = ours.encode(s, add_bos=False, add_eos=False), hf.encode(s)
        if (a != b or ours.decode(a) != hf.decode(b)) and not departs(s):
            differ.append((s, a, b))
    # where transformers differs on llama.cpp's own cases, llama.cpp's ids (which ours gives:
    # test_llama_cpp_cases) are the model's tokenizer's
    known = {s for s, want in cases if hf.encode(s) != want}
    differ = [d for d in differ if d[0] not in known]
    assert differ == [], f"{name}: ours and transformers differ on {len(differ)} texts: {differ[:3]}"
    if name in DEPARTS:  # the departure is real: llama.cpp's cases show it
        assert any(departs(s) for s in known), f"{name}: transformers no longer departs ({why}); update DEPARTS"


#: the BOS llama.cpp puts first (add_special): tokenizer.ggml.add_bos_token where the file has it
#: (Llama 2, Phi-3 and Command-R: true), else llama-vocab.cpp's default (SentencePiece and the Llama 3
#: pre-tokenizers: yes; other BPEs: no)
BOS = {"llama-spm": "<s>", "phi-3": "<s>", "command-r": "<BOS_TOKEN>", "llama-bpe": "<|begin_of_text|>"}


def test_bos_as_llama_cpp_adds_it(vocab):
    name, _, t, _ = vocab
    ids, plain = t.encode("Hello world"), t.encode("Hello world", add_bos=False)
    if name in BOS:
        assert t.add_bos and [t.tokens[i] for i in ids[:1]] == [BOS[name]] and ids[1:] == plain, (name, ids)
    else:
        assert not t.add_bos and ids == plain, (name, ids)
