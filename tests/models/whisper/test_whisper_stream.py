"""Real-time transcription with a scripted stream: partial then final text, finals never rewritten and equal to
the offline run with VAD, a final decoded after the previous utterance's audio keeps only its own words, nothing
during silence, the final soon after the utterance ends; the CLI on stdin."""

from __future__ import annotations

import io
import sys
from itertools import pairwise

import numpy as np
import pytest

from pyggml.errors import WhisperError
from tests.models.whisper.test_whisper_transcribe import SPEECH, whisper
from tests.support.whisper_peers import wer

SR = 16000


def model_with_vad():
    w = whisper("tiny.en")
    try:
        w.vad()
    except Exception as e:  # noqa: BLE001 - no Silero weights installed
        pytest.skip(f"no Silero VAD weights: {e}")
    return w


def scripted():
    """1 s of silence, en1 (7.4 s), 1.5 s of faint noise: (audio, speech start, speech end) in seconds."""
    from pyggml.models.whisper.audio import load_audio

    speech = load_audio(SPEECH / "en1.wav")
    noise = 0.002 * np.random.default_rng(5).standard_normal(int(1.5 * SR))
    audio = np.concatenate([np.zeros(SR), speech, noise]).astype(np.float32)
    return audio, 1.0, 1.0 + speech.size / SR


def test_scripted_stream_partials_then_final():
    from pyggml.models.vad.segments import VadOptions
    from pyggml.models.whisper.stream import StreamOptions

    w = model_with_vad()
    audio, t0, t1 = scripted()
    stream = w.stream(StreamOptions(partial_every_s=3.0))
    events = []
    for i in range(0, audio.size, SR // 4):        # 250 ms chunks
        events += stream.feed(audio[i:i + SR // 4])
    events += stream.finish()
    partials = [e for e in events if not e.final]
    finals = [e for e in events if e.final]
    assert partials and finals and stream.partials == len(partials)
    assert all(e.emitted_at > t0 for e in events)                  # nothing during the leading silence
    assert all(not e.final for e in events[:len(partials)])        # partials first, then the final
    assert all(e.start >= t0 - 0.3 and e.end <= t1 + 0.5 for e in finals)
    assert stream.finals == finals                                  # committed once, never rewritten
    assert max(e.emitted_at for e in finals) - t1 <= 1.0            # the final within 1 s of stream time
    cut = VadOptions.whisper_cpp(speech_pad_ms=stream.opts.speech_pad_ms)   # the slice the stream decodes
    offline = " ".join(s.text for s in w.transcribe(audio, vad=True, vad_options=cut, temperatures=(0.0,)))
    assert wer(offline, stream.final_text) <= 0.02
    assert "weather station" in stream.final_text.lower()


def two_utterances():
    """1 s of silence, en1, 1.5 s of faint noise, en2, 1 s of silence: (audio, en2's start and end in seconds)."""
    from pyggml.models.whisper.audio import load_audio

    first, second = load_audio(SPEECH / "en1.wav"), load_audio(SPEECH / "en2.wav")
    noise = 0.002 * np.random.default_rng(6).standard_normal(int(1.5 * SR))
    parts = [np.zeros(SR), first, noise, second, np.zeros(SR)]
    start = sum(p.size for p in parts[:3]) / SR
    return np.concatenate(parts).astype(np.float32), start, start + second.size / SR


@pytest.mark.parametrize("context_s", [10.0, 0.0])
def test_final_decoded_after_previous_utterance(context_s):
    """With context, the second final is a decode of [en1, 0.1 s, en2] whose words past the join are kept: en2's
    text alone, none of en1's, times inside en2; without, each utterance is decoded alone."""
    from pyggml.models.whisper.stream import JOIN, StreamOptions

    w = model_with_vad()
    audio, t0, t1 = two_utterances()
    stream = w.stream(StreamOptions(partial_every_s=0, context_s=context_s))
    decoded = []
    transcribe = w.transcribe
    w.transcribe = lambda a, **kw: decoded.append(len(a)) or transcribe(a, **kw)
    try:
        for i in range(0, audio.size, SR // 4):
            stream.feed(audio[i:i + SR // 4])
        stream.finish()
    finally:
        del w.transcribe
    second = [s for s in stream.finals if s.utterance == 1]
    assert stream.utterances == 2 and len(decoded) == 2 and second
    own = (t1 - t0) * SR                                            # en2's samples, without the padding
    assert decoded[1] > decoded[0] + JOIN + own / 2 if context_s else decoded[1] < own + SR
    text = " ".join(s.text for s in second)
    assert wer("Please remember to close the kitchen window before you leave the house. The cat likes to climb out "
               "and chase the birds in the garden.", text) <= 0.1
    assert "weather" not in text.lower() and "river" not in text.lower()
    assert all(t0 - 0.3 <= s.start < s.end <= t1 + 0.3 for s in second)


def test_context_is_the_last_utterances_that_fit():
    """The context is as many of the last final utterances as fit in context_s laid end to end (JOIN between),
    the last one cut to context_s when it alone is longer; the prompt is the final text before the context."""
    from pyggml.models.whisper.stream import JOIN, StreamOptions, StreamSegment

    w = model_with_vad()
    stream = w.stream(StreamOptions(partial_every_s=0, context_s=10.0))
    calls = []
    stream._transcribe = lambda audio, prompt, **kw: calls.append((audio.size, prompt)) or []
    kept = []
    for n, seconds in enumerate([4.0, 4.0, 3.0, 12.0]):
        stream.finals.append(StreamSegment(0.0, 1.0, f"utterance{n}.", True, 0.0, n))
        stream.utterances = n + 1
        stream._remember(np.ones(int(seconds * SR), np.float32))
        kept.append([(i, a.size / SR) for i, a in stream.history])
        stream._final_in_context(np.zeros(SR, np.float32), 0)
    assert kept == [[(0, 4.0)], [(0, 4.0), (1, 4.0)], [(1, 4.0), (2, 3.0)], [(3, 10.0)]]
    audio_sizes = [size for size, _ in calls]
    assert audio_sizes == [int((4 + 1) * SR) + JOIN, int((8 + 1) * SR) + 2 * JOIN, int((7 + 1) * SR) + 2 * JOIN,
                           int((10 + 1) * SR) + JOIN]
    assert [prompt for _, prompt in calls] == ["", "", "utterance0.", "utterance0. utterance1. utterance2."]


def test_partials_thin_out_when_decoding_is_slow(monkeypatch):
    """A partial that takes 1 s (a fake clock) spaces the next ones 1 / PARTIAL_SHARE s of audio apart, not
    partial_every_s."""
    from pyggml.models.whisper import stream as stream_module

    w = model_with_vad()
    audio, t0, t1 = scripted()
    clock = [0.0]
    monkeypatch.setattr(stream_module.time, "perf_counter", lambda: clock[0])
    transcribe = w.transcribe
    monkeypatch.setattr(w, "transcribe", lambda a, **kw: clock.__setitem__(0, clock[0] + 1.0) or transcribe(a, **kw))
    stream = w.stream(stream_module.StreamOptions(partial_every_s=0.5))
    times = [e.emitted_at for i in range(0, audio.size, SR // 10) for e in stream.feed(audio[i:i + SR // 10])
             if not e.final]
    gap = 1.0 / stream_module.PARTIAL_SHARE
    assert len(times) >= 2 and stream.partial_cost == 1.0
    assert stream.partials <= (t1 - t0) / gap + 1 and all(b - a >= gap - 1e-9 for a, b in pairwise(times))


def test_silence_and_noise_yield_nothing():
    w = model_with_vad()
    stream = w.stream()
    noise = 0.003 * np.random.default_rng(1).standard_normal(4 * SR).astype(np.float32)
    assert [stream.feed(c) for c in np.split(np.concatenate([np.zeros(2 * SR, np.float32), noise]), 12)] == [[]] * 12
    assert stream.finish() == [] and stream.decode_seconds == 0.0


def test_stream_options_are_checked():
    from pyggml.models.whisper.stream import StreamOptions

    with pytest.raises(WhisperError, match="max_utterance_s"):
        StreamOptions(max_utterance_s=40).check()
    with pytest.raises(WhisperError, match="threshold"):
        StreamOptions(threshold=0).check()
    with pytest.raises(WhisperError, match=">= 0"):
        StreamOptions(context_s=-1).check()


def test_cli_streams_pcm_from_stdin(monkeypatch, capsys):
    from pyggml.cli.main import main

    model_with_vad()
    audio, _, _ = scripted()
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(pcm)))
    assert main(["transcribe", "--stream", "-", "--threads", "2"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("[00:0") and "weather station" in out.lower()
    assert "1 utterance(s)" in err and "p95" in err
