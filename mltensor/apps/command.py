"""`mltensor`: the umbrella console entry; `mltensor <command> ...` runs one of COMMANDS (today:
`serve`, the OpenAI-compatible server of mltensor/serve/). The single-purpose entries
(mltensor-chat, mltensor-selfie, mltensor-batch) stay as they are."""

import argparse
import sys

from ..serve import cli as serve_cli

PROG = "mltensor"
#: command -> (its main(argv, prog=...), one line of help)
COMMANDS = {
    "serve": (serve_cli.main, "an OpenAI-compatible HTTP server for GGUF and ONNX embedding models"),
}


def build_parser():
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="mltensor's commands. `mltensor <command> --help` describes one.",
    )
    sub = ap.add_subparsers(dest="command", metavar="command")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return ap


def main(argv=None):
    """The console entry: `mltensor <command> [options]`; returns the command's exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in COMMANDS:
        ap = build_parser()
        if not argv:
            ap.print_help()
            return 2
        ap.parse_args(argv[:1])  # -h, or an unknown command: argparse's message and status
        return 2
    run, _ = COMMANDS[argv[0]]
    return run(argv[1:], prog=f"{PROG} {argv[0]}")


if __name__ == "__main__":
    sys.exit(main())
