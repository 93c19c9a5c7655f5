"""Whisper's batched encoder: B windows through one encoder graph (WhisperModel.encode_batch, as batched
transcription runs it) against the same B windows one graph each (encode(mel, slot), as before), alternating
within each round in one process so that both see the same load; per-round times, medians, the ratio, and the
load average. The two leave the same cross-attention K/V (checked every round, bit for bit).

The windows: the log-mel of the test sentences (tests/data/speech), cycled to B windows of 30 s.

    python -m benchmarks.whisper_encoder_batch [--model tiny.en] [--batch 8] [--rounds 5] [--threads 2] [--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO / "tests" / "data" / "speech"


def windows(w, n: int) -> np.ndarray:
    """n windows' log-mel [n, n_mels, 3000] of the test sentences, cycled."""
    from pyggml.models.whisper.audio import load_audio
    from pyggml.models.whisper.model import N_FRAMES

    clips = sorted(SPEECH.glob("*.wav"))
    return np.array([w.log_mel(load_audio(clips[i % len(clips)]))[0][:, :N_FRAMES] for i in range(n)])


def cross_kv(model) -> list[np.ndarray]:
    from pyggml.backend import tensor_get

    return [tensor_get(t).copy() for t in model.cross_k + model.cross_v]


def run(model_name: str, batch: int, rounds: int, threads: int) -> dict:
    from pyggml.models.whisper.transcribe import load_whisper

    w = load_whisper(model_name, n_threads=threads)
    model, mels = w.model, windows(w, batch)
    model.ensure_cross_slots(batch)
    model.encode_batch(mels)          # warm: the graphs built and placed once before timing
    for slot, mel in enumerate(mels):
        model.encode(mel, slot)
    rows = []
    for _ in range(rounds):
        load = os.getloadavg()[0]
        start = time.perf_counter()
        for slot, mel in enumerate(mels):
            model.encode(mel, slot)
        one_by_one, alone = time.perf_counter() - start, cross_kv(model)
        start = time.perf_counter()
        model.encode_batch(mels)
        together = time.perf_counter() - start
        same = all(np.array_equal(a, b) for a, b in zip(alone, cross_kv(model), strict=True))
        rows.append({"one_by_one_s": one_by_one, "batched_s": together, "ratio": together / one_by_one,
                     "same_cross_kv": same, "loadavg": [round(load, 2), round(os.getloadavg()[0], 2)]})
        print(f"{batch} windows: one graph each {one_by_one:.2f} s, one graph {together:.2f} s, "
              f"ratio {together / one_by_one:.3f}, same K/V {same}, load avg {rows[-1]['loadavg']}", flush=True)
    return {"model": model_name, "batch": batch, "threads": threads, "rounds": rows,
            "compute_buffer_mib": model.enc_runner.buffer_size / 2**20,
            "median_one_by_one_s": float(np.median([r["one_by_one_s"] for r in rows])),
            "median_batched_s": float(np.median([r["batched_s"] for r in rows])),
            "median_ratio": float(np.median([r["ratio"] for r in rows]))}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny.en")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    out = run(a.model, a.batch, a.rounds, a.threads)
    print(f"median: one graph each {out['median_one_by_one_s']:.2f} s, one graph {out['median_batched_s']:.2f} s, "
          f"batched / one by one {out['median_ratio']:.3f} (compute buffer {out['compute_buffer_mib']:.0f} MiB)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
