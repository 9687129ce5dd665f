"""The tokenizer and chat template stored in a GGUF file's metadata, built with the `tokenizers`
library as llama.cpp reads them (src/llama-vocab.cpp).

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE (GPT-2's byte-to-unicode alphabet) from
  tokenizer.ggml.tokens and tokenizer.ggml.merges, the text split first by the regexes of its
  pre-tokenizer (tokenizer.ggml.pre, table PRE below, each regex llama.cpp's):
  - "llama3" / "llama-bpe" / "llama-v3" / "falcon3": Llama 3's regex (contractions, letters with
    one leading non-letter, digits in groups of 1-3, ...); whole words that are tokens are taken
    whole (llama.cpp's ignore_merges); BOS added unless the file says otherwise;
  - "dbrx" / "smaug-bpe": Llama 3's regex, every word merged;
  - "qwen2" / "deepseek-r1-qwen" / "stablelm2": the same with digits one by one;
  - "smollm" / "starcoder" / "refact" / "codeshell" / "command-r": digits one by one, then GPT-2's;
  - "gpt-2" / "phi-2" / "mpt" / "olmo", and "default" (or no key): GPT-2's regex. (llama.cpp's
    "default", for files converted before the key existed, adds three punctuation and digit
    splits of its own and warns that quality degrades; here it is GPT-2's, as transformers reads
    such files.)
- `tokenizer.ggml.model == "llama"`: SentencePiece (Llama 2, Gemma, Mistral v0.1, Phi-3): a BPE
  whose merges come from tokenizer.ggml.scores (the pair whose joined token scores highest merges
  first, as llama.cpp's llm_tokenizer_spm and sentencepiece's BPE do), spaces spelled `▁`, one `▁`
  before the text when tokenizer.ggml.add_space_prefix (default true), sentencepiece's dummy
  prefix (none before a text that starts with a special token, none after the special tokens in
  it: sentencepiece and transformers agree there, llama.cpp adds one after each), characters outside the vocabulary as their UTF-8 bytes through
  the `<0xNN>` tokens (byte fallback). Gemma's whitespace-run tokens, stored with real spaces, are
  spelled with `▁` (as transformers' GGUF reader does).
- Tokens of type CONTROL (3) and USER_DEFINED (4) are matched whole in the text (`<|im_start|>`,
  `<s>`), and skipped when decoding with skip_special=True (CONTROL ones).
- BOS / EOS: tokenizer.ggml.add_bos_token (default, as llama.cpp: true for SentencePiece and
  the Llama 3 pre-tokenizers, false for the other BPEs) and add_eos_token; `stop_ids`: EOS, EOT and the end-of-turn tokens of the common
  templates that the vocabulary has.
- The chat template: tokenizer.chat_template, or when the file has none the architecture's known
  format (templates.py); `template_source` says which ("file", or "built-in <name>: the file has
  none").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import DataError, NotSupportedError
from .templates import BUILTIN, END_OF_TURN, builtin_template, render

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
DIGITS_SPLIT = r"\p{N}"

#: tokenizer.ggml.pre -> (the regexes applied in turn, ignore_merges), as llama-vocab.cpp sets them
PRE: dict[str, tuple[tuple[str, ...], bool]] = {}
#: the pre-tokenizers after which llama.cpp adds BOS when the file has no tokenizer.ggml.add_bos_token
BOS_BY_DEFAULT = frozenset({"llama3", "llama-bpe", "llama-v3", "falcon3"})
for _names, _spec in (
    (tuple(BOS_BY_DEFAULT), ((LLAMA3_SPLIT,), True)),
    (("dbrx", "smaug-bpe"), ((LLAMA3_SPLIT,), False)),
    (("qwen2", "deepseek-r1-qwen", "stablelm2"), ((QWEN2_SPLIT,), False)),
    (("smollm", "starcoder", "refact", "codeshell", "command-r"), ((DIGITS_SPLIT, GPT2_SPLIT), False)),
    (("gpt-2", "phi-2", "mpt", "olmo", "default"), ((GPT2_SPLIT,), False)),
):
    PRE.update(dict.fromkeys(_names, _spec))

if TYPE_CHECKING:
    from .gguf import GGUFFile

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE = 1, 2, 3, 4, 6
_SPACE = "\u2581"


def _library() -> ModuleType:
    try:
        import tokenizers
    except ImportError as e:  # pragma: no cover - declared in the `test` / `llm` extras
        raise NotSupportedError("the GGUF tokenizer needs the `tokenizers` package: pip install tokenizers") from e
    return tokenizers


def score_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece's score order: every split of a token into two
    tokens, the best-scoring joined token first (ties: the longer left part, then the longer right
    part, then by the parts' ids), as transformers' generate_merges orders them."""
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    found: list[tuple[float, int, int, int, str, str]] = []
    for t, s in zip(tokens, scores):
        local = []
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                local.append((vocab[a], vocab[b], a, b, s))
        local.sort()
        found.extend((-float(s), -len(a), -len(b), n, a, b) for n, (_, _, a, b, s) in enumerate(local, len(found)))
    found.sort()
    return [(a, b) for _, _, _, _, a, b in found]


class GGUFTokenizer:
    """The tokenizer of a GGUF file (`GGUFTokenizer(GGUFFile(path))`; an LLM has one as
    `llm.tokenizer`): encode(text) -> list of ids, decode(ids) -> text,
    apply_chat_template(messages) -> text. Attributes: kind ("gpt2" or "llama"), pre (the
    pre-tokenizer), tokens, vocab_size, bos_id, eos_id, add_bos, stop_ids, chat_template,
    template_source.

    Parameters
    ----------
    f : mltensor.llm.GGUFFile
        The opened GGUF file, whose ``tokenizer.*`` metadata describes the vocabulary.

    Raises
    ------
    mltensor.NotSupportedError
        The ``tokenizers`` package is missing, or a tokenizer model other than "gpt2" (byte-level
        BPE) and "llama" (SentencePiece).
    mltensor.DataError
        The file has no tokenizer, or its metadata disagree (token and type counts).
    """

    def __init__(self, f: GGUFFile) -> None:
        tk = _library()
        kind = f.get("tokenizer.ggml.model")
        if kind is None:
            raise DataError(f"[tokenizer] {f.path} has no tokenizer (tokenizer.ggml.model)")
        if kind not in ("gpt2", "llama"):
            raise NotSupportedError(
                f"[tokenizer] tokenizer model {kind!r} is not supported (supported: gpt2 (byte-level BPE), "
                "llama (SentencePiece))"
            )
        self.kind = kind
        self.arch = f.get("general.architecture", "")
        tokens = [str(t) for t in f.require("tokenizer.ggml.tokens")]
        types = list(f.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise DataError(f"[tokenizer] {len(tokens)} tokens but {len(types)} token types")
        self.pre: str | None  # the pre-tokenizer (byte-level BPE only)
        if kind == "gpt2":
            self._tk, self.pre = self._byte_level(tk, f, tokens)
            default_bos = self.pre in BOS_BY_DEFAULT
        else:
            self._tk, self.pre = self._sentencepiece(tk, f, tokens, types), None
            default_bos = True
        self.special = {tokens[i]: i for i, ty in enumerate(types) if ty in (_CONTROL, _USER_DEFINED)}
        specials = [
            tk.AddedToken(tokens[i], special=ty == _CONTROL, normalized=False)
            for i, ty in enumerate(types)
            if ty in (_CONTROL, _USER_DEFINED)
        ]
        self._tk.add_special_tokens([t for t in specials if t.special])
        self._tk.add_tokens([t for t in specials if not t.special])
        self._special_texts = tuple(self.special)
        self.add_space_prefix = getattr(self, "add_space_prefix", False)
        self.tokens = tokens
        self.vocab_size = len(tokens)
        self.bos_id = f.get("tokenizer.ggml.bos_token_id")
        self.eos_id = f.get("tokenizer.ggml.eos_token_id")
        self.add_bos = bool(f.get("tokenizer.ggml.add_bos_token", default_bos)) and self.bos_id is not None
        self.add_eos = bool(f.get("tokenizer.ggml.add_eos_token", False)) and self.eos_id is not None
        # ids that end a reply: EOS, EOT, and the end-of-turn tokens the vocabulary has
        self.stop_ids = {i for i in (self.eos_id, f.get("tokenizer.ggml.eot_token_id")) if i is not None}
        self.stop_ids.update(self.special[t] for t in END_OF_TURN if t in self.special)
        self.chat_template = f.get("tokenizer.chat_template")
        if self.chat_template:
            self.template_source = "file"
        else:
            name = builtin_template(self.arch, tokens, kind == "llama")
            self.chat_template = BUILTIN[name]
            self.template_source = f"built-in {name}: the file has none"

    @staticmethod
    def _byte_level(tk: ModuleType, f: GGUFFile, tokens: list[str]) -> tuple[Any, str]:
        pre = f.get("tokenizer.ggml.pre", "default")
        if pre not in PRE:
            raise NotSupportedError(
                f"[tokenizer] pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(PRE))})"
            )
        regexes, ignore_merges = PRE[pre]
        merges = list(f.get("tokenizer.ggml.merges") or [])
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)  # a duplicate keeps its first id, as llama.cpp's lookup does
        pairs = []
        for m in merges:
            a, sep, b = m.partition(" ")
            if not sep or not a or not b:
                raise DataError(f"[tokenizer] malformed merge {m!r}")
            pairs.append((a, b))
        t = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges))
        steps = [tk.pre_tokenizers.Split(tk.Regex(r), behavior="isolated") for r in regexes]
        steps.append(tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        t.pre_tokenizer = tk.pre_tokenizers.Sequence(steps)
        t.decoder = tk.decoders.ByteLevel()
        return t, pre

    def _sentencepiece(self, tk: ModuleType, f: GGUFFile, tokens: list[str], types: list[int]) -> Any:
        scores = f.get("tokenizer.ggml.scores")
        if scores is None:
            scores = [-float(i) for i in range(len(tokens))]  # no scores: the file's order
        scores = [float(s) for s in scores]
        if len(scores) != len(tokens):
            raise DataError(f"[tokenizer] {len(tokens)} tokens but {len(scores)} scores")
        if self.arch in ("gemma", "gemma2", "gemma3"):
            tokens[:] = [_SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        # merges among the pieces of text only: control, byte and unknown tokens are never joined
        plain = [(t, s) for t, s, ty in zip(tokens, scores, types) if ty in (_NORMAL, _USER_DEFINED)]
        merges = score_merges([t for t, _ in plain], [s for _, s in plain])
        unk_id = f.get("tokenizer.ggml.unknown_token_id")
        unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
        t = tk.Tokenizer(tk.models.BPE(vocab=vocab, merges=merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
        self.add_space_prefix = bool(f.get("tokenizer.ggml.add_space_prefix", True))
        t.normalizer = tk.normalizers.Replace(" ", _SPACE)  # (the prefix: encode())
        dec = [tk.decoders.Replace(_SPACE, " "), tk.decoders.ByteFallback(), tk.decoders.Fuse()]
        if self.add_space_prefix:
            dec.append(tk.decoders.Strip(content=" ", left=1))
        t.decoder = tk.decoders.Sequence(dec)
        return t

    def encode(self, text: str, *, add_bos: bool | None = None, add_eos: bool | None = None) -> list[int]:
        """Token ids of `text`; special tokens written in it are matched whole.

        Parameters
        ----------
        text : str
            The text.
        add_bos : bool or None, default None
            Put the BOS token first; None: as the file says.
        add_eos : bool or None, default None
            Put the EOS token last; None: as the file says.

        Returns
        -------
        list of int
            The ids.

        Raises
        ------
        TypeError
            `text` is not a str.
        """
        if not isinstance(text, str):
            raise TypeError(f"[tokenizer] text must be a str, got {type(text).__name__}")
        if text and self.add_space_prefix and not text.startswith(self._special_texts):
            text = " " + text  # SentencePiece's prefix: once, before the text
        ids = self._tk.encode(text, add_special_tokens=False).ids if text else []
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        if (self.add_eos if add_eos is None else add_eos) and self.eos_id is not None:
            ids = ids + [self.eos_id]
        return ids

    def encode_chat(self, text: str) -> list[int]:
        """`encode` of a rendered conversation (`apply_chat_template`'s text): BOS as the file
        says, but no second one where the template wrote one; no EOS.

        Parameters
        ----------
        text : str
            The rendered conversation.

        Returns
        -------
        list of int
            The ids.
        """
        bos = self.tokens[self.bos_id] if self.bos_id is not None else None
        return self.encode(text, add_bos=self.add_bos and not (bos and text.startswith(bos)), add_eos=False)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """The text of token ids.

        Parameters
        ----------
        ids : iterable of int
            Token ids.
        skip_special : bool, default False
            Leave out the CONTROL tokens (BOS, EOS, ``<|im_end|>``...).

        Returns
        -------
        str
            The text.
        """
        text: str = self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special)
        return text

    def apply_chat_template(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """The conversation `messages` as text, through the file's chat template or the
        architecture's built-in one (`template_source` says which).

        Parameters
        ----------
        messages : sequence of dict
            Dicts with str "role" ("system", "user", "assistant") and "content".
        add_generation_prompt : bool, default True
            End with the start of the assistant's turn.

        Returns
        -------
        str
            The rendered text.

        Raises
        ------
        TypeError
            A message that is not a dict with str "role" and "content".
        """
        tok = self.tokens
        return render(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok[self.bos_id] if self.bos_id is not None else "",
            eos_token=tok[self.eos_id] if self.eos_id is not None else "",
        )
