"""argparse types for counts and ports: nonsense fails at parse time with argparse's one-line usage error."""

from __future__ import annotations

import argparse


def _int_at_least(low: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
        return value
    parse.__name__ = what  # argparse names the type in its messages
    return parse


positive_int = _int_at_least(1, "an integer >= 1")
non_negative_int = _int_at_least(0, "an integer >= 0")


def port(text: str) -> int:
    """A TCP port, 0 meaning any free one."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 to 65535, got {value}")
    return value
