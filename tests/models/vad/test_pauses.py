"""VAD that costs no words on pause-heavy speech: tests/data/speech/pauses1.flac (three espeak-ng sentences in
different voices, each starting right after 6-12 s of soft pink noise; tests/models/vad/pause_audio.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

CLIP = Path(__file__).resolve().parents[2] / "data" / "speech" / "pauses1.flac"


def test_vad_costs_no_words_and_times_stay_in_the_speech():
    """With the CLI's defaults (temperature fallback on): VAD's WER at most the run without it + 0.01, every
    sentence's first word kept, fewer encoder windows, and every segment's times inside its own sentence's
    speech (a 0.1 s join between two sentences stands for a pause of many seconds)."""
    from tests.models.vad.pause_audio import load
    from tests.models.whisper.test_whisper_transcribe import whisper
    from tests.support.whisper_peers import wer

    pytest.importorskip("soundfile", reason="reading FLAC needs soundfile")
    audio, texts, spans = load(CLIP)
    w = whisper("tiny.en")
    try:
        w.vad()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no Silero VAD weights: {e}")
    reference = " ".join(texts)
    plain = " ".join(s.text for s in w.transcribe(audio))
    windows = w.timings.windows
    segments = w.transcribe(audio, vad=True)
    text = " ".join(s.text for s in segments)
    assert wer(reference, text) <= wer(reference, plain) + 0.01
    assert w.timings.windows < windows
    words = text.lower().split()
    for sentence in texts:
        assert sentence.split()[0].lower() in words
    for s in segments:
        assert any(a - 0.5 <= s.start and s.end <= b + 0.5 for a, b in spans), (s.start, s.end, s.text)


def test_vad_decodes_the_clip_as_faster_whisper():
    """The default VAD path is faster-whisper's end to end (its segments, joined without a gap, its log-mel
    padding, attention over the audio alone): the text faster-whisper's vad_filter gives on the clip
    (committed by make_faster_whisper_refs.py), greedy."""
    import json

    from tests.models.vad.pause_audio import load
    from tests.models.whisper.test_whisper_transcribe import whisper

    pytest.importorskip("soundfile", reason="reading FLAC needs soundfile")
    audio, _, _ = load(CLIP)
    w = whisper("tiny.en")
    paddings = []
    log_mel = w.log_mel
    w.log_mel = lambda samples, padding="whisper.cpp": paddings.append(padding) or log_mel(samples, padding)
    try:
        segments = w.transcribe(audio, vad=True, temperatures=(0.0,))
    finally:
        del w.log_mel
    expected = json.loads((Path(__file__).parent / "data" / "faster_whisper_pauses1.json").read_text())["texts"]
    assert [s.text for s in segments] == expected
    assert paddings == ["faster-whisper"]
