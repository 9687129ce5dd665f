"""`mltensor serve` (also `python -m mltensor.serve`): an OpenAI-compatible HTTP server. Needs the
serve extra: pip install 'mltensor[serve]'.

    mltensor serve                                        # smollm2-135m-instruct on 127.0.0.1:8000
    mltensor serve --model chat=model.gguf --model smollm2-135m-instruct --port 8080
    mltensor serve --embedding minilm=all-MiniLM-L6-v2/model.onnx --api-key "$KEY"

Each --model is a language model ([NAME=]PATH, or a registry name) with its own KV-cache slots and
continuous-batching engine; each --embedding an ONNX sentence-embedding model with a
tokenizer.json beside it. Binds to 127.0.0.1 unless --host says otherwise. SIGINT / SIGTERM shut
down gracefully: no new requests, running ones get --shutdown-timeout seconds to finish, then are
cancelled. A failure the user can mend (missing extra, missing file, no adapter, a port in use) is
one line on stderr and exit status 2 (mltensor/apps/cli.py).
"""

import argparse
import asyncio
import os
import socket
import sys

from ..apps.cli import AppError, create_context, existing_file, fetched, one_line, require_extra, run_entry
from ..errors import DOMException
from ..llm.api import LLM
from ..llm.engine import Engine
from ..models import GGUF_MODELS, fetch_gguf
from .app import ServedModel, create_app
from .embeddings import Embedder

PROG = "mltensor serve"
DEFAULT_MODEL = "smollm2-135m-instruct"
API_KEY_ENV = "MLTENSOR_API_KEY"


def build_parser(prog=PROG):
    ap = argparse.ArgumentParser(
        prog=prog,
        description="Serve GGUF language models and ONNX embedding models over the OpenAI API "
        "(/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, /health, /metrics), "
        "batching concurrent requests into shared decode steps. Needs: pip install 'mltensor[serve]'.",
    )
    ap.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="[NAME=]MODEL",
        help=f"a GGUF file or a registry name ({', '.join(sorted(GGUF_MODELS))}), served as NAME "
        f"(default: the registry name or the file's stem); repeat for several (default: {DEFAULT_MODEL})",
    )
    ap.add_argument(
        "--embedding",
        action="append",
        default=[],
        metavar="[NAME=]MODEL.onnx",
        help="an ONNX sentence-embedding model with its tokenizer.json in the same folder; repeatable",
    )
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    ap.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    ap.add_argument(
        "--api-key",
        default=None,
        help=f"require 'Authorization: Bearer KEY' (default: the {API_KEY_ENV} variable; unset: no key)",
    )
    ap.add_argument("--slots", type=int, default=8, help="sequences decoded together per model (default 8)")
    ap.add_argument("--max-queue", type=int, default=64, help="requests waiting per model before 429 (default 64)")
    ap.add_argument("--max-context", type=int, default=2048, help="positions of a sequence (default 2048)")
    ap.add_argument("--prefill-chunk", type=int, default=64, help="prompt tokens fed per step (default 64)")
    ap.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds running requests may take to finish after SIGINT/SIGTERM (default 30)",
    )
    ap.add_argument("--log-level", default="warning", help="uvicorn's log level (default warning)")
    return ap


def split_spec(spec, option):
    """'NAME=MODEL' -> (NAME, MODEL); 'MODEL' -> (its registry name or file stem, MODEL)."""
    name, eq, src = spec.partition("=")
    if not eq:
        src = spec
        name = spec if spec in GGUF_MODELS else os.path.splitext(os.path.basename(spec))[0]
    if not name or not src:
        raise AppError(f"{option}: expected [NAME=]MODEL, got {spec!r}")
    return name, src


def main(argv=None, *, prog=PROG):
    """The console entry: returns the exit status (0 after a clean shutdown; 2 for a failure the
    user can mend, as one line on stderr)."""
    args = build_parser(prog).parse_args(argv)
    return run_entry(prog, _main, args, prog)


def _check(args):
    for opt, v, lo in (
        ("--slots", args.slots, 1),
        ("--max-queue", args.max_queue, 1),
        ("--max-context", args.max_context, 2),
        ("--prefill-chunk", args.prefill_chunk, 1),
    ):
        if v < lo:
            raise AppError(f"{opt} must be at least {lo}, got {v}")
    if not 0 <= args.port <= 65535:
        raise AppError(f"--port must lie in [0, 65535], got {args.port}")
    if args.shutdown_timeout < 0:
        raise AppError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")


def load_models(args, ctx):
    """{name: ServedModel} and {name: Embedder} of the command line."""
    models, embedders = {}, {}
    for spec in args.model or [DEFAULT_MODEL]:
        name, src = split_spec(spec, "--model")
        if name in models:
            raise AppError(f"--model: the name {name!r} is given twice")
        path = fetched(fetch_gguf, src) if src in GGUF_MODELS else existing_file(src, "--model")
        try:
            llm = LLM(path, ctx, max_context=args.max_context)
            engine = Engine(llm, slots=args.slots, max_queue=args.max_queue, prefill_chunk=args.prefill_chunk)
        except (OSError, TypeError, ValueError, DOMException) as e:
            raise AppError(f"cannot use the model {path}: {one_line(e)}") from None
        models[name] = ServedModel(llm, engine)
    for spec in args.embedding:
        name, src = split_spec(spec, "--embedding")
        if name in models or name in embedders:
            raise AppError(f"--embedding: the name {name!r} is given twice")
        existing_file(src, "--embedding")
        try:
            embedders[name] = Embedder(src, context=ctx)
        except (OSError, TypeError, ValueError, DOMException) as e:
            raise AppError(f"cannot use the embedding model {src}: {one_line(e)}") from None
    return models, embedders


def _main(args, prog):
    require_extra("serve")
    _check(args)
    ctx = create_context()
    models, embedders = load_models(args, ctx)
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    app = create_app(models, embedders, api_key=api_key, grace=args.shutdown_timeout)
    return serve(app, args.host, args.port, prog, log_level=args.log_level, grace=args.shutdown_timeout)


def serve(app, host, port, prog=PROG, *, log_level="warning", grace=30.0, stderr=None):
    """Run `app` with uvicorn until SIGINT / SIGTERM; prints `<prog>: listening on http://...` on
    stderr once the socket is bound. Returns 0."""
    import uvicorn  # the serve extra

    stderr = stderr or sys.stderr

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets)
            if self.started:
                h, p = self.servers[0].sockets[0].getsockname()[:2]
                stderr.write(f"{prog}: listening on http://{h}:{p} (models: {', '.join(_names(app))})\n")
                stderr.flush()

        def handle_exit(self, sig, frame):
            if getattr(self, "loop", None) is not None:  # streams get `grace` seconds from now
                self.loop.call_soon_threadsafe(app.state.serve.begin_shutdown)
            super().handle_exit(sig, frame)
            # a shutdown the signal asked for is a clean exit (status 0): uvicorn would raise the
            # signal again once it is done
            self._captured_signals.clear()

    try:  # bound here: a port in use is one line, not uvicorn's log and exit
        sock = socket.create_server((host, port), family=_family(host))
    except (OSError, OverflowError) as e:
        raise AppError(f"cannot listen on {host}:{port}: {one_line(e)}") from None
    config = uvicorn.Config(
        app,
        log_level=log_level,
        timeout_graceful_shutdown=grace + 5.0,
        lifespan="on",
    )
    server = Server(config)
    with sock:
        server.run(sockets=[sock])
    return 0


def _family(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _names(app):
    s = app.state.serve
    return sorted(s.models) + sorted(s.embedders)
