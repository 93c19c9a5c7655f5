"""Long audio with pauses: pyggml with and without Silero VAD against whisper.cpp (--vad, through pywhispercpp, with
the ggml VAD file pyggml writes) and faster-whisper (vad_filter=True); and pyggml's streaming at real time.

The audio: the 60 sentences of benchmarks/data/vad_sentences.txt spoken twice by espeak-ng (voices and speeds
varied), with 1-5 s of silence, faint white noise or louder brown noise between them (seeded), about 11 minutes
of which over 40 % is pause. Every engine: tiny.en (--model), 2 threads, greedy without fallback, English, in a process
of its own; RTF = transcription wall time / audio seconds; WER against the sentences in order.

Streaming: the first --stream-s seconds played at real-time pace into Whisper.stream(); latency = wall time
when an utterance's final text arrives - the moment its speech ended in the played audio (p50, p95), and how much
of it is audio fed before the final's decode began (the final's `emitted_at`: the closing silence, plus any
backlog of audio that arrived during earlier decodes); the final text's WER against the offline run with VAD on
the same audio; partial revisions per second; segments whose times lie wholly inside a pause (text during
silence). `--stream-fast` feeds as fast as it decodes, without partials, for the finals' WER over long audio in
a fraction of the real time (finals do not depend on the pace; no latencies then).

--per-sentence prints, for every sentence where the engines' word errors differ (or any engine has more than 2),
each engine's error count and words, the errors charged per sentence (whisper_peers.sentence_errors): this is how
the VAD runs' extra errors were traced to where they fall.

--pauses N[:SEED] replaces that audio with pause-heavy speech (tests/models/vad/pause_audio.py: N espeak-ng
sentences in several voices, each right after 6-12 s of soft pink noise, so over half the audio is pause): the
audio on which a VAD can cost words at the speech onsets. --fallback decodes with each engine's temperature
fallback (its default, as `pyggml transcribe` runs) instead of greedy alone.

Batched transcription: `--engines pyggml,pyggml-batched,faster-whisper,faster-whisper-batched` adds pyggml's
transcribe(batch_size=8) and faster-whisper's BatchedInferencePipeline(batch_size=8) (both greedy, VAD-cut
chunks of up to 30 s decoded 8 at a time), each against its plain transcribe in the same round; the ratio
printed is the batched wall time over the plain one (its inverse is the RTF gain).

--rounds N runs the engines' list N times in turn (with and without VAD alternating), so that ratios are taken
between runs under the same load; each round prints every engine's time with VAD over its own without, and
pyggml-vad's over whisper.cpp-vad's.

    python -m benchmarks.vad_vs_peers [--engines ...] [--rounds 2] [--stream-s 120 [--stream-fast]]
        [--pauses 5:1] [--fallback] [--per-sentence] [--json out.json]
    python -m benchmarks.vad_vs_peers --engines pyggml,pyggml-batched,faster-whisper,faster-whisper-batched \
        --rounds 3 --stream-s 0
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SENTENCES = REPO / "benchmarks" / "data" / "vad_sentences.txt"
SR = 16000
THREADS = 2
ENGINES = ("pyggml", "pyggml-vad", "whisper.cpp", "whisper.cpp-vad", "faster-whisper", "faster-whisper-vad")
BATCHED = ("pyggml-batched", "faster-whisper-batched")   # --engines pyggml,pyggml-batched,faster-whisper,...
RATIOS = ([(e + "-vad", e) for e in ("pyggml", "whisper.cpp", "faster-whisper")] + [("pyggml-vad", "whisper.cpp-vad")]
          + [(e + "-batched", e) for e in ("pyggml", "faster-whisper")]
          + [("pyggml-batched", "faster-whisper-batched")])
BATCH_SIZE = 8
VOICES = ("en-us", "en-gb", "en-us+m3", "en-gb+f2")
SPEEDS = (135, 150, 165, 175)


def say(text: str, voice: str, speed: int, out: Path) -> np.ndarray:
    from pyggml.models.whisper.audio import load_audio

    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(out), text], check=True)
    return load_audio(out)


def long_audio(workdir: Path) -> tuple[np.ndarray, list[str], list[tuple[float, float]]]:
    """(audio, sentence texts in order, (start, end) seconds of each sentence's speech); cached in workdir."""
    texts = [t.strip() for t in SENTENCES.read_text().splitlines() if t.strip()] * 2
    cache = workdir / "long_audio.npz"
    if cache.exists():
        d = np.load(cache)
        return d["audio"], texts, [tuple(x) for x in d["spans"]]
    rng = np.random.default_rng(2024)
    parts, spans, pos = [np.zeros(SR, np.float32)], [], SR
    for i, text in enumerate(texts):
        speech = say(text, VOICES[i % len(VOICES)], SPEEDS[(i // 2) % len(SPEEDS)], workdir / "s.wav")
        parts.append(speech)
        spans.append((pos / SR, (pos + speech.size) / SR))
        pos += speech.size
        n = int(rng.uniform(1.0, 5.0) * SR)
        kind = i % 3
        gap = (np.zeros(n) if kind == 0 else 0.003 * rng.standard_normal(n) if kind == 1
               else 0.02 * np.cumsum(rng.standard_normal(n)) / np.sqrt(np.arange(1, n + 1)).clip(30))
        parts.append(gap.astype(np.float32))
        pos += n
    audio = np.concatenate(parts).astype(np.float32)
    np.savez(cache, audio=audio, spans=np.array(spans))
    return audio, texts, spans


def bench_audio(workdir: Path, pauses: str | None) -> tuple[np.ndarray, list[str], list[tuple[float, float]]]:
    """The long audio, or with `pauses` ("N" or "N:SEED") the pause-heavy audio of N sentences."""
    if not pauses:
        return long_audio(workdir)
    from tests.models.vad.pause_audio import make

    n, _, seed = pauses.partition(":")
    return make(int(n), int(seed or 0))


def worker(engine: str, workdir: Path, pauses: str | None = None, fallback: bool = False,
           model: str = "tiny.en") -> dict:
    from tests.support import whisper_peers as peers

    audio, _, _ = bench_audio(workdir, pauses)
    wav = workdir / (f"pauses-{pauses.replace(':', '-')}.wav" if pauses else "long_audio.wav")
    if not wav.exists():
        import wave
        with wave.open(str(wav), "wb") as f:
            f.setnchannels(1)
            f.setsampwidth(2)
            f.setframerate(SR)
            f.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    vad, stages = engine.endswith("-vad"), {}      # stages: where pyggml's time went
    batch = {"batch_size": BATCH_SIZE} if engine.endswith("-batched") else {}
    start = time.perf_counter()
    if engine.startswith("pyggml"):
        from pyggml.models.whisper.transcribe import load_whisper
        w = load_whisper(model, n_threads=THREADS)
        if vad or batch:
            w.vad()
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        temperatures = {} if fallback else {"temperatures": (0.0,)}
        english = {"language": "en"} if w.is_multilingual else {}   # as the peers are told
        text = " ".join(s.text.strip() for s in w.transcribe(audio, vad=vad, **temperatures, **batch, **english))
        t = w.timings
        stages = {"vad_s": t.vad_s, "mel_s": t.mel_s, "encode_s": t.encode_s, "decode_s": t.decode_s,
                  "windows": t.windows, "decoder_steps": t.decoder_steps}
    elif engine.startswith("faster-whisper"):
        from faster_whisper import WhisperModel
        fw = WhisperModel(str(peers.ct2_dir(model, workdir)), device="cpu", compute_type="float32",
                          cpu_threads=THREADS)
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        temperature = {} if fallback else {"temperature": 0.0}
        if batch:
            from faster_whisper import BatchedInferencePipeline
            segments, _ = BatchedInferencePipeline(fw).transcribe(audio, language="en", beam_size=1, **batch)
        else:
            segments, _ = fw.transcribe(audio, language="en", beam_size=1, vad_filter=vad, **temperature)
        text = peers.join_segments(s.text for s in segments)
    else:
        from pywhispercpp.model import Model

        from pyggml.models.vad.files import load_silero, write_ggml_vad
        vad_file = workdir / "ggml-silero-v6.bin"
        write_ggml_vad(load_silero(), vad_file)
        params = dict(vad=True, vad_model_path=str(vad_file)) if vad else {}
        wc = Model(str(peers.ggml_bin(model, workdir)), n_threads=THREADS, print_progress=False,
                   print_realtime=False, language="en", **params, **({} if fallback else {"temperature_inc": 0.0}))
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        text = peers.join_segments(s.text for s in wc.transcribe(str(wav)))
    return {"engine": engine, "load_s": load_s, "wall_s": time.perf_counter() - start, "text": text, "stages": stages}


def stream_worker(workdir: Path, seconds: float, fast: bool = False, pauses: str | None = None) -> dict:
    """Play the first `seconds` at real-time pace into Whisper.stream() (`fast`: as fast as decoded, no
    partials, for the finals' text alone); latencies against the true speech ends."""
    from pyggml.models.whisper.stream import StreamOptions
    from pyggml.models.whisper.transcribe import load_whisper

    audio, _, spans = bench_audio(workdir, pauses)
    audio = audio[:int(seconds * SR)]
    spans = [s for s in spans if s[1] <= seconds]
    w = load_whisper("tiny.en", n_threads=THREADS)
    w.vad()
    offline = " ".join(s.text.strip() for s in w.transcribe(audio, vad=True, temperatures=(0.0,)))
    stream = w.stream(StreamOptions(partial_every_s=0) if fast else None)
    chunk, pos, events = SR // 10, 0, []
    t0 = time.perf_counter()
    while pos < audio.size:
        due = pos + chunk if fast else int((time.perf_counter() - t0) * SR)
        if due < pos + chunk:
            time.sleep((pos + chunk - due) / SR)
            due = pos + chunk
        end = min(audio.size, due)
        for e in stream.feed(audio[pos:end]):
            events.append((time.perf_counter() - t0, e))
        pos = end
    events += [(time.perf_counter() - t0, e) for e in stream.finish()]
    latencies, waits = [], []
    for a, b in spans:   # the first final whose segment reaches into this sentence
        arrivals = [(t, e) for t, e in events if e.final and e.end > a and e.start < b]
        if arrivals:
            t, e = min(arrivals, key=lambda x: x[0])
            latencies.append(t - b)
            waits.append(e.emitted_at - b)
    in_pause = sum(1 for _, e in events if not any(e.start < b and e.end > a for a, b in spans))
    return {"audio_s": audio.size / SR, "fast": fast, "offline_text": offline, "final_text": stream.final_text,
            "latencies": latencies, "stream_waits": waits, "partials": stream.partials, "in_pause": in_pause,
            "sentences": len(spans), "decode_s": stream.decode_seconds}


def main() -> None:
    from tests.support.whisper_peers import wer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default=",".join(ENGINES),
                    help="comma-separated subset of " + ", ".join(ENGINES + BATCHED))
    ap.add_argument("--rounds", type=int, default=1, help="run the engines' list this many times, alternating")
    ap.add_argument("--stream-s", type=float, default=120.0, help="seconds streamed at real time (0: none)")
    ap.add_argument("--stream-fast", action="store_true",
                    help="stream as fast as decoded, without partials: the finals' WER only (no latencies)")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "pyggml-vad-bench"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--pauses", help="N or N:SEED: pause-heavy audio of N sentences instead of the long audio")
    ap.add_argument("--fallback", action="store_true", help="decode with each engine's temperature fallback")
    ap.add_argument("--model", default="tiny.en", help="an installed Whisper model's name (default tiny.en; streaming "
                    "always runs tiny.en)")
    ap.add_argument("--per-sentence", action="store_true", help="print the sentences whose errors differ by engine")
    args = ap.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.worker:
        r = (stream_worker(workdir, args.stream_s, args.stream_fast, args.pauses) if args.worker == "stream"
             else worker(args.worker, workdir, args.pauses, args.fallback, args.model))
        print(json.dumps(r))
        return
    audio, texts, spans = bench_audio(workdir, args.pauses)
    speech_s = sum(b - a for a, b in spans)
    audio_s = audio.size / SR
    reference = " ".join(texts)
    print(f"{audio_s:.1f} s of audio, {len(texts)} sentences, {100 * (1 - speech_s / audio_s):.0f} % pauses; "
          f"{args.model}, {THREADS} threads, greedy{' with fallback' if args.fallback else ''}")
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), GGML_NO_BACKTRACE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    results, rounds = {}, []
    engines = [e for e in args.engines.split(",") if e]
    jobs = engines * max(1, args.rounds) + (["stream"] if args.stream_s > 0 else [])
    for n, job in enumerate(jobs):
        if engines and n % len(engines) == 0:
            rounds.append({})
        before = os.getloadavg()[0]
        cmd = [sys.executable, "-m", "benchmarks.vad_vs_peers", "--worker", job, "--workdir", str(workdir),
               "--stream-s", str(args.stream_s)] + (["--stream-fast"] if args.stream_fast else []) \
            + (["--pauses", args.pauses] if args.pauses else []) + (["--fallback"] if args.fallback else []) \
            + ["--model", args.model]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        if out.returncode != 0:
            print(f"{job}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["loadavg"] = [round(before, 2), round(os.getloadavg()[0], 2)]
        results[job] = r
        if job == "stream":
            lat = np.array(r["latencies"] or [np.nan])
            ref = " ".join(t for t, (a, b) in zip(texts, spans, strict=False) if b <= r["audio_s"])
            quality = (f"WER final {wer(ref, r['final_text']):.3f} vs offline {wer(ref, r['offline_text']):.3f} "
                       f"(final vs offline text {wer(r['offline_text'], r['final_text']):.3f}); "
                       f"{r['in_pause']} segments in pauses; load avg {r['loadavg'][0]}/{r['loadavg'][1]}")
            if r["fast"]:
                print(f"stream ({r['audio_s']:.0f} s as fast as decoded, {r['decode_s']:.0f} s decoding): {quality}")
            else:
                print(f"stream ({r['audio_s']:.0f} s at real time): final-text latency p50 "
                      f"{np.percentile(lat, 50):.2f} s, p95 {np.percentile(lat, 95):.2f} s over "
                      f"{len(r['latencies'])}/{r['sentences']} sentences (of which p50 "
                      f"{np.median(r['stream_waits'] or [np.nan]):.2f} s of audio fed before the final's decode "
                      f"began, the rest decoding and any backlog); {r['partials'] / r['audio_s']:.2f} partial "
                      f"revisions/s; {quality}")
        else:
            r["rtf"], r["wer"] = r["wall_s"] / audio_s, wer(reference, r["text"])
            rounds[-1][job] = r
            print(f"{job:<20} load {r['load_s']:6.2f} s  wall {r['wall_s']:7.2f} s  RTF {r['rtf']:.4f}  "
                  f"WER {r['wer']:.3f}  load avg {r['loadavg'][0]}/{r['loadavg'][1]}", flush=True)
            if r["stages"]:
                print("    " + "  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                         for k, v in r["stages"].items()), flush=True)
    print_ratios(rounds)
    results["rounds"] = [{job: {k: r[k] for k in ("rtf", "wer", "loadavg")} for job, r in rd.items()}
                         for rd in rounds]
    if args.per_sentence:
        print_sentence_errors(texts, {job: r["text"] for job, r in results.items() if "text" in r})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def print_ratios(rounds: list[dict]) -> None:
    """Per round: each engine's wall time with VAD (or batched) over its own without, and pyggml's over its
    peer's; for batched runs also the gain (the inverse) and the WER difference."""
    for k, rd in enumerate(rounds):
        for vad, other in RATIOS:
            if vad in rd and other in rd:
                print(f"round {k + 1}: {vad} / {other} wall time {rd[vad]['wall_s'] / rd[other]['wall_s']:.3f}"
                      + (f" (RTF gain {rd[other]['wall_s'] / rd[vad]['wall_s']:.2f}x, WER "
                         f"{rd[vad]['wer'] - rd[other]['wer']:+.3f})" if vad.endswith("-batched") else ""))


def print_sentence_errors(texts: list[str], outputs: dict[str, str]) -> None:
    """Each sentence whose word errors differ between engines (or exceed 2): the errors and words of each."""
    from tests.support.whisper_peers import sentence_errors

    per = {job: sentence_errors(texts, text) for job, text in outputs.items()}
    for k, text in enumerate(texts):
        counts = [errors[k][0] for errors in per.values()]
        if counts and (len(set(counts)) > 1 or max(counts) > 2):
            print(f"{k:3d} {text}")
            for job, errors in per.items():
                print(f"      {job:<20} {errors[k][0]}  {' '.join(errors[k][1])}")


if __name__ == "__main__":
    main()
