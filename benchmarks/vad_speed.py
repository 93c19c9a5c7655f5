"""The VAD stage of batched transcription alone: pyggml's Silero VAD (SileroVAD.probs, then speech_segments with the
batched pipeline's options) against faster-whisper's (get_speech_timestamps: the same Silero v6 network in ONNX
Runtime, then its segment rules), alternating within each round in one process, both on one thread as each
pipeline runs it (--threads gives pyggml's more: its BLAS threads then spin a while after each of its rounds, into
faster-whisper's, so compare wall times only); per-round wall and CPU times, medians, the ratio, the load
average, and whether the segments are the same (sample for sample).

The audio: benchmarks/vad_vs_peers.py's long audio (813 s of espeak-ng speech with pauses; made once and cached in
--workdir), or its first --seconds.

    python -m benchmarks.vad_speed [--rounds 5] [--seconds 0] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def timed(fn):
    """(fn(), wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def run(audio: np.ndarray, rounds: int, threads: int = 1) -> dict:
    from faster_whisper.vad import get_speech_timestamps

    from pyggml.models.vad.segments import speech_segments
    from pyggml.models.vad.silero import SileroVAD
    from pyggml.models.whisper.batched import batched_vad_options

    vad, options = SileroVAD(n_threads=threads), batched_vad_options()
    theirs_options = dict(min_silence_duration_ms=options.min_silence_ms, max_speech_duration_s=options.max_speech_s)

    def ours():
        return speech_segments(vad.probs(audio), audio.size, options)

    def theirs():
        return [(s["start"], s["end"]) for s in get_speech_timestamps(audio, **theirs_options)]

    ours(), theirs()          # warm: kernels loaded, graphs built, the ONNX session made
    rows = []
    for _ in range(rounds):
        load = os.getloadavg()[0]
        segments, wall, cpu = timed(ours)
        their_segments, their_wall, their_cpu = timed(theirs)
        rows.append({"pyggml_s": wall, "pyggml_cpu_s": cpu, "faster_whisper_s": their_wall,
                     "faster_whisper_cpu_s": their_cpu, "ratio": wall / their_wall,
                     "segments": len(segments), "same_segments": segments == their_segments,
                     "loadavg": [round(load, 2), round(os.getloadavg()[0], 2)]})
        print(f"pyggml {wall:.3f} s (CPU {cpu:.3f} s), faster-whisper {their_wall:.3f} s (CPU {their_cpu:.3f} s), "
              f"ratio {wall / their_wall:.2f}, {len(segments)} segments, same {rows[-1]['same_segments']}, "
              f"load avg {rows[-1]['loadavg']}", flush=True)
    medians = {f"median_{k}": float(np.median([r[k] for r in rows])) for k in
               ("pyggml_s", "pyggml_cpu_s", "faster_whisper_s", "faster_whisper_cpu_s", "ratio")}
    return {"audio_s": audio.size / 16000, "threads": threads, "rounds": rows, **medians}


def main(argv=None) -> dict:
    from benchmarks.vad_vs_peers import long_audio

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.0, help="only the audio's first seconds (0: all of it)")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "pyggml-vad-bench"))
    ap.add_argument("--threads", type=int, default=1, help="pyggml's VAD threads (faster-whisper's is 1)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    Path(a.workdir).mkdir(parents=True, exist_ok=True)
    audio = long_audio(Path(a.workdir))[0]
    if a.seconds:
        audio = audio[:int(a.seconds * 16000)]
    print(f"{audio.size / 16000:.1f} s of audio, batched transcription's VAD options, pyggml on {a.threads} "
          f"thread(s), faster-whisper on 1")
    out = run(audio, a.rounds, a.threads)
    print(f"median: pyggml {out['median_pyggml_s']:.3f} s (CPU {out['median_pyggml_cpu_s']:.3f} s), faster-whisper "
          f"{out['median_faster_whisper_s']:.3f} s (CPU {out['median_faster_whisper_cpu_s']:.3f} s), "
          f"ratio {out['median_ratio']:.2f}")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
