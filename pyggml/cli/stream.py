"""`pyggml transcribe --stream`: feed a live source to Whisper.stream() and print what it says as it says it.

Sources: a file (fed as fast as it is decoded, or at real-time pace with --realtime: what arrived while a
decode ran is fed at once, as a live source would deliver it), '-' (16 kHz mono signed 16-bit PCM on stdin),
'mic' (the default input device through sounddevice)."""

from __future__ import annotations

import queue
import sys
import time

import numpy as np

from pyggml.errors import AudioError

SAMPLE_RATE = 16000


def _clock(s: float) -> str:
    m, s = divmod(s, 60)
    return f"{int(m):02d}:{s:06.3f}"


def file_chunks(path: str, chunk: int, realtime: bool):
    """A file's samples in chunks; at real-time pace, every sample whose time has come since the last chunk."""
    from pyggml.models.whisper.audio import load_audio

    audio = load_audio(path)
    start, pos = time.perf_counter(), 0
    while pos < audio.size:
        if realtime:
            due = int((time.perf_counter() - start) * SAMPLE_RATE)
            if due < pos + chunk:
                time.sleep((pos + chunk - due) / SAMPLE_RATE)
                due = pos + chunk
            end = min(audio.size, due)
        else:
            end = min(audio.size, pos + chunk)
        yield audio[pos:end]
        pos = end


def stdin_chunks(chunk: int):
    """16 kHz mono s16le PCM from stdin until it closes."""
    stream = sys.stdin.buffer
    while True:
        data = stream.read(2 * chunk)
        if not data:
            return
        yield np.frombuffer(data[:len(data) // 2 * 2], dtype="<i2").astype(np.float32) / 32768.0


def mic_chunks(chunk: int):
    """The default input device through sounddevice, until Ctrl-C."""
    try:
        import sounddevice
    except ImportError as e:
        raise AudioError("streaming from the microphone needs sounddevice (pip install sounddevice)") from e
    q: queue.Queue = queue.Queue()
    with sounddevice.InputStream(samplerate=SAMPLE_RATE, channels=1, dtype="float32", blocksize=chunk,
                                 callback=lambda data, *_: q.put(data[:, 0].copy())):
        try:
            while True:
                yield q.get()
        except KeyboardInterrupt:
            return


def run_stream(w, args) -> int:
    from pyggml.models.whisper.stream import StreamOptions

    chunk = SAMPLE_RATE * args.chunk_ms // 1000
    if len(args.audio) != 1:
        raise AudioError("--stream takes one source: a file, '-' (stdin) or 'mic'")
    source = args.audio[0]
    chunks = (stdin_chunks(chunk) if source == "-" else mic_chunks(chunk) if source == "mic"
              else file_chunks(source, chunk, args.realtime))
    opts = StreamOptions(threshold=args.vad_threshold or 0.5,
                         min_silence_ms=args.vad_min_silence_ms or StreamOptions.min_silence_ms,
                         min_speech_ms=args.vad_min_speech_ms or StreamOptions.min_speech_ms)
    stream = w.stream(opts, language=args.language, beam_size=args.beam_size, initial_prompt=args.prompt)
    latencies = []
    t_start = time.perf_counter()
    for samples in chunks:
        _show(stream.feed(samples) if samples.size else [], latencies, t_start, args.realtime)
    _show(stream.finish(), latencies, t_start, args.realtime)
    lat = np.array(latencies) if latencies else np.zeros(1)
    print(f"{stream.position / SAMPLE_RATE:.2f} s streamed, {stream.utterances} utterance(s), {stream.partials} "
          f"partial(s), decoding {stream.decode_seconds:.2f} s; final text after the utterance's audio ended: "
          f"p50 {np.percentile(lat, 50):.2f} s, p95 {np.percentile(lat, 95):.2f} s", file=sys.stderr)
    return 0


def _show(segments, latencies, t_start, realtime: bool) -> None:
    """Print partials (stderr) and finals (stdout); note how long after its utterance's end the final came:
    wall time at real-time pace, else stream time (the silence that ended it)."""
    for seg in segments:
        if seg.final:
            print(f"[{_clock(seg.start)} --> {_clock(seg.end)}] {seg.text.strip()}", flush=True)
        else:
            print(f"... {seg.text}", file=sys.stderr, flush=True)
    finals = [s for s in segments if s.final]
    if finals:
        end = max(s.end for s in finals)
        latencies.append(time.perf_counter() - t_start - end if realtime else finals[-1].emitted_at - end)
