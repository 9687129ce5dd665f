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
- llama.cpp's own tokenizer (llama_tokenize with special tokens parsed, llama_detokenize), where
  llama-cpp-python is installed here or in MLTENSOR_LLAMA_CPP_PYTHON (else skipped): the same ids
  and text on every text above, the ones transformers departs on included, and the same BOS.
"""

import json
import subprocess

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from llm_convert import llama_cpp_python  # noqa: E402
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


# transformers reads these files' 150k-400k token strings with the gguf package's reader, 9-15 s
# each on a 2-core machine: its comparison on them runs with -m slow
BIG = ("llama-bpe", "qwen2", "command-r")
NAMES = sorted(VOCABS)


@pytest.fixture(scope="module", params=NAMES)
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


@pytest.mark.parametrize(
    "vocab", [pytest.param(n, marks=[pytest.mark.slow] if n in BIG else []) for n in NAMES], indirect=True
)
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


# llama.cpp's tokenizer on a vocab-only load: the texts on stdin, ids and text back on stdout
LLAMA_CPP_TOKENIZE = r"""
import ctypes, json, sys
import llama_cpp

m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
vocab = m._model.vocab


def detokenize(ids):  # llama_detokenize: special tokens written out, the SentencePiece prefix removed
    buf = ctypes.create_string_buffer(16 * len(ids) + 64)
    n = llama_cpp.llama_detokenize(vocab, (llama_cpp.llama_token * len(ids))(*ids), len(ids), buf, len(buf), False, True)
    assert n >= 0, n
    return buf.raw[:n].decode("utf-8")


def piece(i):  # llama_token_to_piece, special tokens written out: what llama.cpp streams
    buf = ctypes.create_string_buffer(1024)
    n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
    assert n >= 0, n
    return buf.raw[:n]


def pieces(ids):
    return b"".join(piece(i) for i in ids).decode("utf-8")


ids = [m.tokenize(s.encode("utf-8"), add_bos=False, special=True) for s in json.loads(sys.stdin.read())]
bos = m.tokenize(b"Hello world", add_bos=True, special=True)  # (add_bos: BOS where the vocabulary wants it)
text = [detokenize(i) for i in ids]
print("RESULT " + json.dumps({"ids": ids, "text": text, "pieces": [pieces(i) for i in ids], "bos": bos}))
"""


def test_llama_cpp_tokenizer_agrees(vocab):
    name, path, ours, cases = vocab
    python = llama_cpp_python()
    if python is None:
        pytest.skip("needs llama-cpp-python, here or in MLTENSOR_LLAMA_CPP_PYTHON")
    texts = list(dict.fromkeys(TEXTS + LEADING + [s for s, _ in cases]))
    r = subprocess.run(
        [python, "-c", LLAMA_CPP_TOKENIZE, path], input=json.dumps(texts), capture_output=True, text=True, timeout=600
    )
    result = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert r.returncode == 0 and result, r.stderr[-2000:]
    ref = json.loads(result[0][len("RESULT ") :])
    wrong = [(s, a, b) for s, b in zip(texts, ref["ids"]) if (a := ours.encode(s, add_bos=False, add_eos=False)) != b]
    assert wrong == [], f"{name}: {len(wrong)} texts tokenized unlike llama.cpp: {wrong[:3]}"
    # decoding: llama_detokenize for SentencePiece; for byte-level BPE the pieces joined, since
    # llama_detokenize applies clean_up_tokenization_spaces to GPT-2-style vocabularies (" ?" -> "?",
    # "x != 0" -> "x!= 0"), which ours, like the pieces llama.cpp streams, leaves out
    want = ref["text"] if ours.kind == "llama" else ref["pieces"]
    unread = [(ids, a, b) for ids, b in zip(ref["ids"], want) if (a := ours.decode(ids)) != b]
    assert unread == [], f"{name}: {len(unread)} id lists decoded unlike llama.cpp: {unread[:3]}"
    assert ours.encode("Hello world") == ref["bos"], name
