"""The audio Silero VAD's tests and references use: real speech, a synthetic signal, and speech with silence and
noise between sentences (built from tests/data/speech with a seeded generator, so nothing large is committed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

SPEECH = Path(__file__).resolve().parents[1] / "data" / "speech"
SR = 16000


def _speech(name: str) -> np.ndarray:
    from pyggml.models.whisper.audio import load_audio
    return load_audio(SPEECH / name)


def synthetic() -> np.ndarray:
    """Silence, white noise, a tone, faint noise and a chirp: 4.5 s that are not speech (mostly)."""
    rng = np.random.default_rng(7)
    t = np.arange(SR) / SR
    parts = [np.zeros(SR), 0.1 * rng.standard_normal(SR), 0.3 * np.sin(2 * np.pi * 440 * t[:SR // 2]),
             0.01 * rng.standard_normal(SR), 0.2 * np.sin(2 * np.pi * (200 + 1500 * t) * t)]
    return np.concatenate(parts).astype(np.float32)


def mixed() -> np.ndarray:
    """1.5 s of silence, en2, 2.5 s of faint noise, en3, 1 s of silence."""
    rng = np.random.default_rng(11)
    parts = [np.zeros(int(1.5 * SR)), _speech("en2.wav"), 0.003 * rng.standard_normal(int(2.5 * SR)),
             _speech("en3.wav"), np.zeros(SR)]
    return np.concatenate(parts).astype(np.float32)


def clips() -> dict[str, np.ndarray]:
    return {"en1": _speech("en1.wav"), "synthetic": synthetic(), "mixed": mixed()}
