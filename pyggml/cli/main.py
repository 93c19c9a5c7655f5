"""`pyggml <command>`: each command is a module of this package with `add_parser(subparsers)` and `run(args)`."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys

from pyggml.errors import GGMLError

# module names under pyggml.cli, one per command
COMMANDS = ["cache", "chat", "convert", "demo", "devices", "generate", "plan", "rpc_server", "serve", "transcribe",
            "vad"]
INTERRUPTED = 130  # a shell's status for a process ended by SIGINT
BROKEN_PIPE = 141  # ... and by SIGPIPE (`pyggml generate ... | head` once head has had its fill)


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says it or there is none to say."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # it brings the email package: 5-10 ms a start

    try:
        return version("pyggml")
    except PackageNotFoundError:  # run from a source tree that was not installed
        from pyggml import __version__

        return __version__


class VersionAction(argparse.Action):
    """`--version`: the installed version, read only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"pyggml {package_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pyggml", description="ggml's tensor runtime in Python")
    parser.add_argument("--version", action=VersionAction, help="show the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
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
    except KeyboardInterrupt:
        print(f"pyggml {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # the reader of stdout has gone: end quietly, as a C program killed by SIGPIPE
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the final flush finds somewhere to go
        return BROKEN_PIPE


def run_and_exit() -> None:
    """The `pyggml` program: main(), then the process ends at once, without Python's teardown.

    Once a command has returned there is nothing left to save: it closed its files and servers, and Numba
    wrote its cache when it compiled. Tearing down the interpreter (every module's objects, LLVM's compiled
    code, OpenMP's threads) took 0.2 s of a 1.8 s `pyggml generate -n 32`; the memory goes back to the OS
    either way. So the logs and the standard streams are flushed and the process exits with main()'s status."""
    code = main()
    layout_cache = sys.modules.get("pyggml.models.gguf.layout_cache")
    if layout_cache is not None:  # a new entry of the loader's layout cache still being flushed (atexit never runs)
        layout_cache.finish_writes()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run_and_exit()
