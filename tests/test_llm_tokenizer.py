"""GGUF tokenizers (mltensor/llm/tokenizer.py) against transformers' tokenizers built from the same
file (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, which converts GGUF vocabularies), on a
multilingual text set: identical ids, encode and decode.

The files carry real vocabularies trained here, offline, by the `tokenizers` library's BPE trainer:
a byte-level BPE (with merges of digits, so the pre-tokenizers' digit rules show) written with
each `tokenizer.ggml.pre`, and a SentencePiece-style vocabulary (scores, `▁`, the 256 `<0xNN>`
byte tokens, control and user-defined tokens) whose alphabet lacks CJK and emoji: those go
through byte fallback. SmolLM2's own vocabulary (from the model registry) is the `slow` case.
"""

import itertools
import json
import os

import pytest

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from mltensor.errors import NotSupportedError  # noqa: E402
from mltensor.llm.gguf import GGUFFile  # noqa: E402
from mltensor.llm.tokenizer import GGUFTokenizer  # noqa: E402

TEXTS = [
    "What is the capital of France?",
    "In 2024, naïve café — 日本語 🤗  two  spaces\n\nend",
    "Ça va? Größe, señor, Øresund, déjà vu, Ångström.",
    "Привет, как дела? Съешь же ещё этих мягких французских булок.",
    "中文测试：你好，世界！日本語のテキスト。한국어 텍스트",
    "emoji 👍🏽 🤖🧠 ❤️‍🔥 family 👨‍👩‍👧‍👦",
    "def f(x):\n    return x ** 2  # square\n\tif x != 0: print(f'{x:>8}')",
    "trailing   \n\n\n  \t tabs\t\t",
    "1234567 3.14159 0.5e-10 1,000,000 123abc456 2024-11-28",
    "I'm you're we'll they've she'd IT'S DON'T",
    "\r\n windows\r\nlines",
    "a",
    "hello<|im_start|>user there<|im_end|>",
]
# texts that start with whitespace: SentencePiece puts its prefix before them (see below)
LEADING = ["   leading and trailing   ", " x", "\nnewline first"]

CORPUS = """The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is the capital.
Le café est très bon, déjà vu, naïve, Größe, señor, Øresund, ça va bien, élève, où est la gare?
Привет, как дела? Съешь же ещё этих мягких французских булок, да выпей чаю. Москва столица России.
def f(x):
    return x ** 2
for i in range(10):
    print(i, i * 2)  # twice
The numbers 1234, 2024, 2025, 123456 and 3.14 are here. I'm sure you're right, we'll see, they've gone.
"""


class HFTokenizer:
    """transformers' tokenizer of a GGUF file: the `tokenizers` backend that
    `AutoTokenizer.from_pretrained(dir, gguf_file=...)` wraps, built by the same two functions (the
    wrapper's import chain reaches torchvision and triton, whose LLVM clashes with lavapipe's in a
    process that holds a Vulkan adapter)."""

    def __init__(self, path):
        pytest.importorskip("transformers")
        from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

        arch, tokenizer, self.config = get_gguf_tokenizer(path)
        self.backend, _ = convert_gguf_tokenizer(arch, tokenizer)

    def encode(self, text, add_special_tokens=False):
        assert not add_special_tokens
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.backend.decode(ids, skip_special_tokens=False)


def _write(path, tokenizer_model, tokens, types, *, arch="llama", pre=None, merges=None, scores=None, **ids):
    w = gguf.GGUFWriter(path, arch)
    w.add_tokenizer_model(tokenizer_model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    if scores is not None:
        w.add_token_scores(scores)
    for k, v in ids.items():
        getattr(w, f"add_{k}")(v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _ours(path):
    return GGUFTokenizer(GGUFFile(path))


@pytest.fixture(scope="module")
def byte_bpe():
    """(tokens, merges, types) of a byte-level BPE trained on CORPUS (merges of digits included)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1
    )
    tk.train_from_iterator([CORPUS] * 20 + ["1234567890 123 4567 12 34 56 789"] * 20, trainer)
    model = json.loads(tk.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    tokens = [t for t, _ in vocab]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [3 if t in specials else 1 for t in tokens]
    assert any(t.isdigit() and len(t) >= 3 for t in tokens)  # the digit rules matter
    return tokens, merges, types


@pytest.fixture(scope="module")
def spm_file(tmp_path_factory):
    """A SentencePiece-style GGUF vocabulary, laid out as llama.cpp's converter writes one: <unk>,
    <s>, </s>, two user-defined tokens, the 256 byte tokens, then the pieces trained on CORPUS
    (score: minus their merge rank; single characters last, lowest)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tk.train_from_iterator([CORPUS] * 20, trainers.BpeTrainer(vocab_size=500, min_frequency=1))
    model = json.loads(tk.to_str())["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    merged = list(dict.fromkeys(m.replace(" ", "") for m in merges))
    chars = [t for t in model["vocab"] if len(t) == 1 and t not in merged]
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3, 4, 4] + [6] * 256
    scores = [0.0] * len(tokens)
    tokens += merged + chars
    types += [1] * (len(merged) + len(chars))
    scores += [-float(i) for i in range(len(merged))] + [-1e4 - i for i in range(len(chars))]
    d = tmp_path_factory.mktemp("spm")
    return _write(
        str(d / "spm.gguf"),
        "llama",
        tokens,
        types,
        scores=scores,
        bos_token_id=1,
        eos_token_id=2,
        unk_token_id=0,
    )


def _compare(ours, hf, texts):
    bad = []
    for s in texts:
        a, b = ours.encode(s, add_bos=False), hf.encode(s, add_special_tokens=False)
        if a != b or ours.decode(a) != hf.decode(b):
            bad.append((s, a, b))
    return bad


@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2", "gpt-2", "default"])
def test_byte_level_pre_tokenizers_match_transformers(tmp_path, byte_bpe, pre):
    tokens, merges, types = byte_bpe
    path = _write(str(tmp_path / "t.gguf"), "gpt2", tokens, types, pre=pre, merges=merges, bos_token_id=0)
    ours = _ours(path)
    hf = HFTokenizer(path)
    assert _compare(ours, hf, TEXTS + LEADING) == []
    for s in TEXTS + LEADING:
        assert ours.decode(ours.encode(s, add_bos=False)) == s
    # no tokenizer.ggml.add_bos_token: BOS after llama.cpp's default (Llama 3's pre-tokenizers add
    # it; transformers' GGUF reader does not: test_llm_vocab.py checks the real Llama 3 file)
    assert (ours.encode("a")[0] == 0) == (pre == "llama-bpe")


def test_byte_level_digit_rules(tmp_path, byte_bpe):
    """Each pre-tokenizer's digits as llama.cpp splits them: llama3 in groups of up to 3, qwen2 and
    smollm one by one, gpt-2 whole runs (merged as the vocabulary allows)."""
    tokens, merges, types = byte_bpe
    got = {}
    for pre in ("llama-bpe", "qwen2", "smollm", "gpt-2"):
        path = _write(str(tmp_path / f"{pre}.gguf"), "gpt2", tokens, types, pre=pre, merges=merges)
        t = _ours(path)
        got[pre] = [t.tokens[i] for i in t.encode("1234567")]
    assert got["qwen2"] == got["smollm"] == list("1234567")
    ends = set(itertools.accumulate(len(p) for p in got["llama-bpe"]))
    assert {3, 6, 7} <= ends and "".join(got["llama-bpe"]) == "1234567"  # 123|456|7
    assert "".join(got["gpt-2"]) == "1234567" and got["gpt-2"] != got["llama-bpe"], got  # one run
    # transformers reads "smollm" with GPT-2's split (digits whole): llama.cpp's rule differs there
    with pytest.raises(NotSupportedError, match="pre-tokenizer 'tekken'"):
        _ours(_write(str(tmp_path / "x.gguf"), "gpt2", tokens, types, pre="tekken", merges=merges))


def test_sentencepiece_matches_transformers(spm_file):
    ours = _ours(spm_file)
    hf = HFTokenizer(spm_file)
    assert ours.kind == "llama" and ours.add_bos and ours.add_space_prefix
    assert _compare(ours, hf, TEXTS) == []
    # BOS as the file says (SentencePiece: added unless add_bos_token is false)
    assert ours.encode("a")[0] == 1 and hf.config["add_bos_token"]
    for s in TEXTS + LEADING:
        assert ours.decode(ours.encode(s, add_bos=False)) == s


def test_sentencepiece_byte_fallback_and_prefix(spm_file):
    t = _ours(spm_file)
    pieces = [t.tokens[i] for i in t.encode("日🤗", add_bos=False)]
    # no CJK or emoji in the vocabulary: the prefix, then each UTF-8 byte as <0xNN>
    assert pieces == ["\u2581"] + [f"<0x{b:02X}>" for b in "日🤗".encode()]
    assert t.decode(t.encode("日🤗"), skip_special=True) == "日🤗"  # (BOS skipped)
    # sentencepiece's dummy prefix goes before the text even when it starts with a space (as
    # sentencepiece itself and llama.cpp do; transformers' Metaspace "first" scheme adds none there)
    spaced = "".join(t.tokens[i] for i in t.encode("   leading", add_bos=False))
    assert spaced.startswith("\u2581" * 4)
    # special tokens are matched whole; no prefix after them (sentencepiece, transformers)
    ids = t.encode("<|im_start|>user", add_bos=False)
    assert ids[0] == 3 and "".join(t.tokens[i] for i in ids[1:]) == "user"
    assert t.decode(t.encode("<s>hi</s>", add_bos=False), skip_special=True) == "hi"
    assert t.stop_ids == {2, 4}  # EOS, and <|im_end|> (an end-of-turn token)
    # no template in the file: the architecture's known one, said in template_source
    assert t.template_source == "built-in chatml: the file has none"


def test_builtin_templates(tmp_path):
    """A file without a chat template gets its architecture's (llama.cpp's built-in formats)."""
    cases = [
        ("gemma3", ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"], "gemma"),
        ("phi3", ["<unk>", "<s>", "</s>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"], "phi3"),
        ("qwen2", ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "x"], "chatml"),
        (
            "llama",
            ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
            "llama3",
        ),
        ("llama", ["<unk>", "<s>", "</s>", "x"], "llama2"),
    ]
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    want = {
        "gemma": "<start_of_turn>user\nS\n\nQ<end_of_turn>\n<start_of_turn>model\n",
        "phi3": "<|system|>\nS<|end|>\n<|user|>\nQ<|end|>\n<|assistant|>\n",
        "chatml": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n",
        "llama3": "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "llama2": "[INST] <<SYS>>\nS\n<</SYS>>\n\nQ [/INST]",
    }
    for i, (arch, specials, name) in enumerate(cases):
        spm = name in ("gemma", "phi3", "llama2")
        tokens = specials + ["a", "b"]
        types = [3] * len(specials) + [1, 1]
        kw = {"scores": [0.0] * len(tokens)} if spm else {"merges": [], "pre": "default"}
        p = _write(str(tmp_path / f"{i}.gguf"), "llama" if spm else "gpt2", tokens, types, arch=arch, **kw)
        t = _ours(p)
        assert t.template_source == f"built-in {name}: the file has none", arch
        assert t.apply_chat_template(msgs) == want[name], name
        end = {"gemma": "<end_of_turn>", "phi3": "<|end|>", "chatml": "<|im_end|>", "llama3": "<|eot_id|>"}.get(name)
        if end:
            assert tokens.index(end) in t.stop_ids


@pytest.mark.slow
@pytest.mark.parametrize("pre", ["smollm", "llama-bpe", "qwen2", "gpt-2", "default"])
def test_smollm2_vocabulary_with_each_pre_tokenizer(tmp_path, pre):
    """SmolLM2's real vocabulary (49152 tokens, 48900 merges) written with each pre-tokenizer."""
    from mltensor.models import fetch_gguf

    f = GGUFFile(fetch_gguf("smollm2-135m-instruct"))
    tokens = list(f.metadata["tokenizer.ggml.tokens"])
    path = _write(
        str(tmp_path / "t.gguf"),
        "gpt2",
        tokens,
        list(f.metadata["tokenizer.ggml.token_type"]),
        pre=pre,
        merges=list(f.metadata["tokenizer.ggml.merges"]),
    )
    ours = _ours(path)
    hf = HFTokenizer(path)
    assert _compare(ours, hf, TEXTS + LEADING) == []


def test_sentencepiece_library_agrees(tmp_path):
    """Where the `sentencepiece` package is installed (not a dependency): a BPE model it trains
    with byte fallback, written into a GGUF file as llama.cpp's converter writes one, tokenizes
    every text, leading whitespace and special tokens included, to sentencepiece's own ids."""
    spm = pytest.importorskip("sentencepiece")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join([CORPUS] * 50), encoding="utf-8")
    user = ["<|im_start|>", "<|im_end|>"]
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(tmp_path / "m"),
        vocab_size=600,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        user_defined_symbols=user,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    n = sp.get_piece_size()
    tokens = [sp.id_to_piece(i) for i in range(n)]
    types = [
        2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 4 if tokens[i] in user else 1
        for i in range(n)
    ]
    scores = [sp.get_score(i) for i in range(n)]
    path = _write(str(tmp_path / "sp.gguf"), "llama", tokens, types, scores=scores, bos_token_id=1, eos_token_id=2)
    t = _ours(path)
    for s in TEXTS + LEADING:
        assert t.encode(s, add_bos=False) == sp.encode(s), s
        assert t.decode(t.encode(s, add_bos=False)) == sp.decode(sp.encode(s)), s


_AUTO = r"""
import json, os, sys
from transformers import AutoTokenizer  # first: triton's LLVM before any Vulkan driver's
from mltensor.llm.gguf import GGUFFile
from mltensor.llm.tokenizer import GGUFTokenizer

bad = []
for path, texts in json.loads(sys.argv[1]):
    ours = GGUFTokenizer(GGUFFile(path))
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    for s in texts:
        a, b = ours.encode(s), hf.encode(s)
        if a != b or ours.decode(a) != hf.decode(b):
            bad.append([path, s, a, b])
print(json.dumps(bad))
"""


@pytest.mark.slow
def test_autotokenizer_agrees(tmp_path, byte_bpe, spm_file):
    """The same comparisons through `AutoTokenizer.from_pretrained(dir, gguf_file=...)` itself, BOS
    included, in a process without a Vulkan adapter (see HFTokenizer)."""
    import subprocess
    import sys

    pytest.importorskip("transformers")
    tokens, merges, types = byte_bpe
    jobs = []
    for pre in ("llama-bpe", "qwen2", "gpt-2", "default"):
        d = tmp_path / pre
        d.mkdir()
        # (BOS said in the file: without it llama.cpp adds one after llama-bpe, transformers does not)
        path = _write(str(d / "t.gguf"), "gpt2", tokens, types, pre=pre, merges=merges, add_bos_token=False)
        jobs.append((path, TEXTS + LEADING))
    jobs.append((spm_file, TEXTS))  # (leading whitespace: see test_sentencepiece_byte_fallback_and_prefix)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run(
        [sys.executable, "-c", _AUTO, json.dumps(jobs)], capture_output=True, text=True, timeout=600, cwd=root
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []
