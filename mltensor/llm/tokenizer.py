"""The tokenizer and chat template stored in a GGUF file's metadata.

- `tokenizer.ggml.model == "gpt2"`: byte-level BPE (GPT-2's byte-to-unicode alphabet) built
  with the `tokenizers` library from tokenizer.ggml.tokens and tokenizer.ggml.merges; the
  pre-tokenizer follows tokenizer.ggml.pre as llama.cpp does (llama-vocab.cpp): "smollm",
  "starcoder", "refact", "codeshell" split digits one by one, then GPT-2's regex; "gpt-2" and
  "default" use GPT-2's regex alone. Tokens of type CONTROL (3) and USER_DEFINED (4) are special
  tokens matched whole in the text (<|im_start|>...) and skipped when decoding with
  skip_special=True. Other tokenizer models and pre-tokenizers raise NotSupportedError.
- `tokenizer.chat_template`: a Jinja template, rendered in jinja2's immutable sandbox (the
  template comes from the file) with `messages`, `add_generation_prompt`, `bos_token`,
  `eos_token`, as Hugging Face's apply_chat_template does.
"""

from ..errors import DataError, NotSupportedError

# pre-tokenizer names (llama.cpp's tokenizer.ggml.pre) -> whether digits are split one by one
_PRE = {"smollm": True, "starcoder": True, "refact": True, "codeshell": True, "gpt-2": False, "default": False}
_CONTROL, _USER_DEFINED = 3, 4


class GGUFTokenizer:
    """encode(text) -> list of ids, decode(ids) -> text, apply_chat_template(messages) -> text."""

    def __init__(self, f):
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        except ImportError as e:  # pragma: no cover - declared in the `test` / `llm` extras
            raise NotSupportedError("the GGUF tokenizer needs the `tokenizers` package: pip install tokenizers") from e
        kind = f.get("tokenizer.ggml.model")
        if kind is None:
            raise DataError(f"[tokenizer] {f.path} has no tokenizer (tokenizer.ggml.model)")
        if kind != "gpt2":
            raise NotSupportedError(
                f"[tokenizer] tokenizer model {kind!r} is not supported (supported: gpt2, byte-level BPE)"
            )
        pre = f.get("tokenizer.ggml.pre", "default")
        if pre not in _PRE:
            raise NotSupportedError(
                f"[tokenizer] pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE))})"
            )
        tokens = list(f.require("tokenizer.ggml.tokens"))
        merges = list(f.get("tokenizer.ggml.merges") or [])
        types = list(f.get("tokenizer.ggml.token_type") or [1] * len(tokens))
        if len(types) != len(tokens):
            raise DataError(f"[tokenizer] {len(tokens)} tokens but {len(types)} token types")
        vocab = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)  # a duplicate keeps its first id, as llama.cpp's lookup does
        pairs = []
        for m in merges:
            a, sep, b = m.partition(" ")
            if not sep or not a or not b:
                raise DataError(f"[tokenizer] malformed merge {m!r}")
            pairs.append((a, b))
        tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
        steps = [pre_tokenizers.Digits(individual_digits=True)] if _PRE[pre] else []
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
        tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tk.decoder = decoders.ByteLevel()
        self.special = {tokens[i]: i for i, ty in enumerate(types) if ty in (_CONTROL, _USER_DEFINED)}
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.special])
        self._tk = tk
        self.tokens = tokens
        self.vocab_size = len(tokens)
        self.bos_id = f.get("tokenizer.ggml.bos_token_id")
        self.eos_id = f.get("tokenizer.ggml.eos_token_id")
        self.add_bos = bool(f.get("tokenizer.ggml.add_bos_token", False))
        self.chat_template = f.get("tokenizer.chat_template")
        # ids that end a reply: EOS, and the end-of-turn token where the template uses one
        self.stop_ids = {i for i in (self.eos_id, f.get("tokenizer.ggml.eot_token_id")) if i is not None}
        if "<|im_end|>" in self.special:
            self.stop_ids.add(self.special["<|im_end|>"])

    def encode(self, text, *, add_bos=None):
        if not isinstance(text, str):
            raise TypeError(f"[tokenizer] text must be a str, got {type(text).__name__}")
        ids = self._tk.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids, *, skip_special=False):
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def apply_chat_template(self, messages, *, add_generation_prompt=True):
        if not self.chat_template:
            raise NotSupportedError("[tokenizer] the file has no chat template (tokenizer.chat_template)")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise TemplateError(msg)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TypeError(f"[tokenizer] each message must be a dict with str 'role' and 'content', got {m!r}")
        tok = self.tokens
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok[self.bos_id] if self.bos_id is not None else "",
            eos_token=tok[self.eos_id] if self.eos_id is not None else "",
        )
