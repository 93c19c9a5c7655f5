"""`pyggml <command>`: each command is a module of this package with `add_parser(subparsers)` and `run(args)`."""

from __future__ import annotations

import argparse
import importlib
import sys

from pyggml.errors import GGMLError

# module names under pyggml.cli, one per command
COMMANDS = ["convert", "demo", "devices", "generate", "plan", "rpc_server", "serve", "transcribe", "vad"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyggml", description="ggml's tensor runtime in Python")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"pyggml.cli.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args) or 0
    except GGMLError as e:
        print(f"pyggml {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
