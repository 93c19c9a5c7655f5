"""Log-mel front end: Slaney filters by formula against openai's, features against faster-whisper's."""

from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import AudioError
from pyggml.models.whisper import load_audio, log_mel_spectrogram, mel_filters
from pyggml.models.whisper.mel import N_FRAMES, pad_or_trim

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.mark.parametrize("n_mels", [80, 128])
def test_filters_match_openai(n_mels):
    openai = np.load(DATA / "whisper" / "openai_mel_filters.npz")[f"mel_{n_mels}"]
    ours = mel_filters(n_mels)
    assert ours.shape == openai.shape == (n_mels, 201) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, openai, rtol=0, atol=1e-8)


def test_faster_whisper_padding_matches_its_features(speech, refs):
    ref = refs["features"]
    mel = log_mel_spectrogram(load_audio(speech[ref["file"]]["path"]), padding="faster-whisper")
    assert list(mel.shape) == ref["shape"]
    for frame, values in ref["frames"].items():
        np.testing.assert_allclose(mel[:, int(frame)], values, rtol=0, atol=1e-6)


def test_whisper_cpp_padding(speech, refs):
    """30 s of zeros after the audio: the speech frames are faster-whisper's, the rest sits at the floor (max - 8)."""
    audio = load_audio(speech["en1.wav"]["path"])
    mel = log_mel_spectrogram(audio)
    assert mel.shape == (80, len(audio) // 160 + N_FRAMES)
    fw = log_mel_spectrogram(audio, padding="faster-whisper")
    np.testing.assert_allclose(mel[:, :fw.shape[1] - 1], fw[:, :-1], rtol=0, atol=1e-6)
    floor = mel.max() - 2  # log10 floored at max - 8, then divided by 4
    np.testing.assert_allclose(mel[:, -N_FRAMES // 2:], floor, atol=1e-6)
    window = pad_or_trim(fw)
    assert window.shape == (80, N_FRAMES) and not window[:, fw.shape[1]:].any()


def test_live_faster_whisper_features(speech):
    fe = pytest.importorskip("faster_whisper.feature_extractor", reason="faster-whisper is not installed")
    audio = load_audio(speech["en3.wav"]["path"])
    np.testing.assert_allclose(log_mel_spectrogram(audio, padding="faster-whisper"),
                               fe.FeatureExtractor()(audio), rtol=0, atol=1e-6)
    np.testing.assert_allclose(fe.FeatureExtractor().mel_filters, mel_filters(80), rtol=0, atol=1e-8)


def test_bad_input():
    with pytest.raises(AudioError, match="empty"):
        log_mel_spectrogram(np.zeros(0, np.float32))
    with pytest.raises(AudioError, match="mono"):
        log_mel_spectrogram(np.zeros((2, 100), np.float32))
    with pytest.raises(AudioError, match="unknown mel padding"):
        log_mel_spectrogram(np.zeros(100, np.float32), padding="none")
    with pytest.raises(AudioError, match="filters of shape"):
        log_mel_spectrogram(np.zeros(1000, np.float32), filters=np.zeros((80, 100)))
