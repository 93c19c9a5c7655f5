"""Pause-heavy speech: espeak-ng sentences in several voices, each starting right after 6-12 s of soft pink noise.

This is the audio on which a VAD can cost words: the speech onset comes straight after a long pause, with no
silence of its own (espeak-ng's leading and trailing silence is trimmed), so a segment that starts late or a
window decoded without the preceding text loses the first words. Deterministic for a seed (voices, speeds,
pause lengths and the noise all come from it; espeak-ng 1.51 and SoX 14.4 as on Debian).

    python -m tests.models.vad.pause_audio OUT.flac [--sentences N] [--seed S]   # writes OUT and OUT's .json

The committed clip tests/data/speech/pauses1.flac (and pauses1.json, its texts and speech spans) was made with
`python -m tests.models.vad.pause_audio tests/data/speech/pauses1.flac --sentences 3 --seed 0`: the track
without its noise, which `load` adds (seeded), so that the file holds little more than its speech.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SR = 16000
VOICES = ("en-us", "en-gb", "en-us+m3", "en-gb+f2", "en-us+f3", "en-gb-x-rp")
SPEEDS = (140, 150, 160, 170)
PAUSE_S = (6.0, 12.0)
NOISE_RMS = 0.002            # soft: well under the speech (espeak-ng peaks near 0.5), still not digital silence
SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Every morning the baker opens his shop before the sun comes up.",
    "Our train was delayed for an hour because of snow on the tracks.",
    "She planted tomatoes, beans and onions in the small garden behind the house.",
    "The museum will close early on Friday for a private event.",
    "Two students fixed the old radio with a new battery and some tape.",
    "Please send me the report by email before the meeting starts.",
    "A strong wind blew the leaves across the empty parking lot.",
    "He forgot his umbrella at the office and walked home in the rain.",
    "The children counted twenty seven birds sitting on the wire.",
    "Fresh bread and warm soup were served to the tired travelers.",
    "The pilot announced that we would land in about fifteen minutes.",
)


def pink_noise(n: int, rng: np.random.Generator, rms: float = NOISE_RMS) -> np.ndarray:
    """n samples of 1/f noise at `rms` (white noise shaped in the frequency domain)."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    f = np.arange(spectrum.size, dtype=np.float64)
    f[0] = 1.0
    noise = np.fft.irfft(spectrum / np.sqrt(f), n)
    return (noise * rms / max(float(np.sqrt(np.mean(noise ** 2))), 1e-12)).astype(np.float32)


def speak(text: str, voice: str, speed: int, workdir: Path) -> np.ndarray:
    """espeak-ng's speech as 16 kHz float32, its leading and trailing silence cut off."""
    raw, wav = workdir / "raw.wav", workdir / "s.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(wav)], check=True)
    import wave
    with wave.open(str(wav)) as f:
        x = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768.0
    loud = np.flatnonzero(np.abs(x) > 0.01)
    return x[loud[0]:loud[-1] + 1] if loud.size else x


def speech_track(n_sentences: int, seed: int) -> tuple[np.ndarray, list[str], list[tuple[float, float]]]:
    """(audio, texts in order, (start, end) seconds of each sentence): pause, sentence, ..., pause, the pauses
    digital silence (the noise is added by `with_noise`, so a committed track compresses to its speech)."""
    rng = np.random.default_rng(seed)
    texts = [SENTENCES[(seed + i) % len(SENTENCES)] for i in range(n_sentences)]
    parts, spans, pos = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for text in texts:
            pause = np.zeros(int(rng.uniform(*PAUSE_S) * SR), np.float32)
            speech = speak(text, VOICES[rng.integers(len(VOICES))], int(SPEEDS[rng.integers(len(SPEEDS))]),
                           Path(tmp))
            parts += [pause, speech]
            spans.append(((pos + pause.size) / SR, (pos + pause.size + speech.size) / SR))
            pos += pause.size + speech.size
    parts.append(np.zeros(int(rng.uniform(*PAUSE_S) * SR), np.float32))
    return np.concatenate(parts), texts, spans


def with_noise(audio: np.ndarray, seed: int) -> np.ndarray:
    """The track with soft pink noise throughout (under the speech too), the same for the same seed."""
    return (audio + pink_noise(audio.size, np.random.default_rng(10_000 + seed))).astype(np.float32)


def make(n_sentences: int, seed: int) -> tuple[np.ndarray, list[str], list[tuple[float, float]]]:
    """The noisy pause-heavy audio, its texts and speech spans."""
    audio, texts, spans = speech_track(n_sentences, seed)
    return with_noise(audio, seed), texts, spans


def write(path: Path, n_sentences: int, seed: int) -> None:
    """The speech track (without noise) as 16-bit FLAC or WAV (by suffix) and its texts and spans as path.json."""
    import soundfile

    audio, texts, spans = speech_track(n_sentences, seed)
    soundfile.write(str(path), np.clip(audio, -1, 1), SR, subtype="PCM_16")
    path.with_suffix(".json").write_text(json.dumps(
        {"texts": texts, "spans": [[round(a, 4), round(b, 4)] for a, b in spans], "seed": seed,
         "seconds": round(audio.size / SR, 4)}, indent=1) + "\n")


def load(path: Path) -> tuple[np.ndarray, list[str], list[tuple[float, float]]]:
    """A written track with its noise added: (audio, texts, spans)."""
    from pyggml.models.whisper.audio import load_audio

    meta = json.loads(path.with_suffix(".json").read_text())
    return with_noise(load_audio(path), meta["seed"]), meta["texts"], [tuple(s) for s in meta["spans"]]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sentences", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write(a.out, a.sentences, a.seed)
