"""The LoRA options `generate` and `serve` share, as llama.cpp's: `--lora FILE[,SCALE]` (scale 1 when left out)
and `--lora-scaled FILE SCALE`, each repeatable; the adapters apply in the order given."""

from __future__ import annotations

import argparse


def lora_file(text: str) -> tuple[str, float]:
    """FILE or FILE,SCALE (a last comma-separated part that is no number belongs to the file's name)."""
    path, _, scale = text.rpartition(",")
    if path:
        try:
            return path, float(scale)
        except ValueError:
            pass
    return text, 1.0


def add_lora_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", action="append", type=lora_file, default=[], metavar="FILE[,SCALE]",
                   help="LoRA adapter (GGUF, as convert_lora_to_gguf.py writes it) at SCALE (default 1); repeatable")
    p.add_argument("--lora-scaled", action="append", nargs=2, default=[], metavar=("FILE", "SCALE"),
                   help="LoRA adapter at SCALE; repeatable")


def lora_specs(args) -> list[tuple[str, float]]:
    """The (file, scale) pairs of --lora and --lora-scaled (ParameterError naming a SCALE that is no number)."""
    from pyggml.errors import ParameterError

    specs = list(args.lora)
    for path, scale in args.lora_scaled:
        try:
            specs.append((path, float(scale)))
        except ValueError:
            raise ParameterError(f"--lora-scaled {path}: {scale!r} is not a number") from None
    return specs
