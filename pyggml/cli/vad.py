"""`pyggml vad FILE... [--write-ggml PATH]`: the speech segments Silero VAD finds (on pyggml's graphs), as whisper.cpp's
vad-speech-segments example prints them; also the --vad-* options `pyggml transcribe --vad` shares."""

from __future__ import annotations

import sys


def add_vad_options(p, defaults: str = "whisper.cpp") -> None:
    """The --vad-* arguments; `defaults` names the segment rules used when --vad-defaults is not given
    (transcribe: faster-whisper's, whose 400 ms padding keeps segments' first sounds)."""
    p.add_argument("--vad-model", default=None,
                   help="Silero VAD weights: a .npz as shipped, a .onnx or a whisper.cpp ggml VAD file (default: the "
                        "Silero VAD v6 weights shipped with pyggml)")
    p.add_argument("--vad-defaults", default=defaults, choices=["whisper.cpp", "faster-whisper"],
                   help="segment defaults: whisper.cpp's (min speech 250 ms, min silence 100 ms, pad 30 ms) or "
                        f"faster-whisper's vad_filter (0 ms, 2000 ms, 400 ms); default {defaults}")
    p.add_argument("--vad-threshold", type=float, default=None, help="speech probability threshold (0.5)")
    p.add_argument("--vad-min-speech-ms", type=int, default=None, help="drop speech shorter than this")
    p.add_argument("--vad-min-silence-ms", type=int, default=None, help="silence that ends a segment")
    p.add_argument("--vad-speech-pad-ms", type=int, default=None, help="padding on each side of a segment")
    p.add_argument("--vad-max-speech-s", type=float, default=None, help="split segments longer than this")


def vad_options(args):
    """The VadOptions the --vad-* arguments ask for."""
    from pyggml.models.vad.segments import VadOptions

    given = {"threshold": args.vad_threshold, "min_speech_ms": args.vad_min_speech_ms,
             "min_silence_ms": args.vad_min_silence_ms, "speech_pad_ms": args.vad_speech_pad_ms,
             "max_speech_s": args.vad_max_speech_s}
    changes = {k: v for k, v in given.items() if v is not None}
    make = VadOptions.whisper_cpp if args.vad_defaults == "whisper.cpp" else VadOptions.faster_whisper
    return make(**changes)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("vad", help="print the speech segments of audio files (Silero VAD)")
    p.add_argument("audio", nargs="*", help="audio files (WAV; other formats with soundfile installed)")
    add_vad_options(p)
    p.add_argument("--probs", action="store_true", help="also print the speech probability of every 32 ms window")
    p.add_argument("--write-ggml", metavar="PATH", default=None,
                   help="write the weights as whisper.cpp's ggml VAD file (whisper-cli --vad -vm PATH runs it)")
    p.set_defaults(run=run)


def run(args) -> int:
    from pyggml.models.vad.segments import SAMPLE_RATE, speech_segments
    from pyggml.models.vad.silero import SileroVAD
    from pyggml.models.whisper.audio import load_audio

    from pyggml.models.vad.files import load_silero, write_ggml_vad

    opts = vad_options(args)
    weights = load_silero(args.vad_model)
    if args.write_ggml:
        size = write_ggml_vad(weights, args.write_ggml)
        print(f"wrote {args.write_ggml} ({size} bytes, whisper.cpp's ggml VAD format)", file=sys.stderr)
    if not args.audio:
        return 0
    vad = SileroVAD(weights)
    for path in args.audio:
        audio = load_audio(path)
        probs = vad.probs(audio)
        segments = speech_segments(probs, audio.size, opts)
        speech = sum(b - a for a, b in segments) / SAMPLE_RATE
        print(f"{path}: {len(segments)} speech segment(s), {speech:.2f} s of {audio.size / SAMPLE_RATE:.2f} s",
              file=sys.stderr)
        for i, (a, b) in enumerate(segments):
            print(f"Speech segment {i}: start = {a / SAMPLE_RATE:.2f}, end = {b / SAMPLE_RATE:.2f}")
        if args.probs:
            print(" ".join(f"{p:.4f}" for p in probs))
    return 0
