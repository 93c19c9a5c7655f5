"""Audio in: WAV by the standard library, other formats by soundfile or ffmpeg, resampling by soxr, clear errors."""

import wave

import numpy as np
import pytest

from pyggml.errors import AudioError
from pyggml.models.whisper import audio as audio_mod
from pyggml.models.whisper import load_audio


def write_wav(path, samples, rate=16000, width=2, channels=1):
    """Integer PCM WAV from float samples in [-1, 1) of shape (frames,) or (frames, channels)."""
    x = np.asarray(samples, np.float64).reshape(len(samples), channels)
    scale = 2 ** (8 * width - 1)
    ints = np.clip(np.round(x * scale), -scale, scale - 1).astype(np.int64)
    if width == 1:
        raw = (ints + 128).astype(np.uint8).tobytes()
    else:
        raw = b"".join(int(v).to_bytes(width, "little", signed=True) for v in ints.reshape(-1)) if width == 3 \
            else ints.astype(f"<i{width}").tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)


def tone(freq, seconds, rate):
    return 0.5 * np.sin(2 * np.pi * freq * np.arange(int(seconds * rate)) / rate)


def dominant_freq(x, rate=16000):
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return np.argmax(spectrum) * rate / len(x)


def test_speech_wav(speech):
    x = load_audio(speech["en1.wav"]["path"])
    assert x.dtype == np.float32 and x.ndim == 1
    assert len(x) == speech["en1.wav"]["samples"]
    assert 0.05 < np.abs(x).max() <= 1.0


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_widths(tmp_path, width):
    p = tmp_path / "t.wav"
    ref = tone(440, 0.25, 16000)
    write_wav(p, ref, width=width)
    np.testing.assert_allclose(load_audio(p), ref, atol=2.0 ** (1 - 8 * width) * 1.01)


def test_stereo_44k_is_mixed_and_resampled(tmp_path):
    p = tmp_path / "s.wav"
    left, right = tone(1000, 1.0, 44100), tone(1000, 1.0, 44100)
    write_wav(p, np.stack([left, right], axis=1), rate=44100, channels=2)
    x = load_audio(p)
    assert len(x) == 16000
    assert dominant_freq(x) == pytest.approx(1000, abs=2)
    assert np.abs(x[1000:-1000]).max() == pytest.approx(0.5, abs=0.01)


def test_array_input():
    ints = (tone(300, 0.5, 8000) * 32767).astype(np.int16)
    x = load_audio(ints, source_sr=8000)
    assert len(x) == 8000 and dominant_freq(x) == pytest.approx(300, abs=3)


def test_other_formats_via_soundfile(tmp_path):
    soundfile = pytest.importorskip("soundfile", reason="soundfile is not installed")
    ref = tone(500, 0.5, 16000).astype(np.float32)
    for name, subtype in (("t.flac", "PCM_16"), ("f.wav", "FLOAT")):  # float WAV: the standard library refuses it
        soundfile.write(tmp_path / name, ref, 16000, subtype=subtype)
        np.testing.assert_allclose(load_audio(tmp_path / name), ref, atol=1e-4)


def test_no_decoder_names_what_to_install(tmp_path, monkeypatch):
    import sys

    p = tmp_path / "a.ogg"
    p.write_bytes(b"OggS" + bytes(100))
    monkeypatch.setitem(sys.modules, "soundfile", None)  # import soundfile -> ImportError
    monkeypatch.setattr(audio_mod.shutil, "which", lambda _: None)
    with pytest.raises(AudioError, match="pip install soundfile, or install ffmpeg"):
        load_audio(p)


def test_bad_audio(tmp_path):
    with pytest.raises(AudioError, match="no such audio file"):
        load_audio(tmp_path / "missing.wav")
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioError, match="empty"):
        load_audio(empty)
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunkjunkjunk")
    with pytest.raises(AudioError, match="corrupt WAV|truncated WAV"):
        load_audio(corrupt)
    garbage = tmp_path / "noise.mp3"
    garbage.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(AudioError, match="cannot decode"):
        load_audio(garbage)
    no_frames = tmp_path / "zero.wav"
    write_wav(no_frames, np.zeros(0))
    with pytest.raises(AudioError, match="no audio samples"):
        load_audio(no_frames)
    with pytest.raises(AudioError, match="NaN"):
        load_audio(np.array([0.0, np.nan], np.float32))
    with pytest.raises(AudioError, match="not numbers"):
        load_audio(np.array(["a", "b"]))


def test_ffmpeg_fallback(tmp_path, monkeypatch):
    """Without soundfile, other formats go through the ffmpeg program (here a stand-in that prints f32le samples)."""
    import sys

    ref = tone(250, 0.1, 16000).astype("<f4")
    (tmp_path / "pcm.f32").write_bytes(ref.tobytes())
    fake = tmp_path / "ffmpeg"
    fake.write_text(f"#!{sys.executable}\nimport sys\nassert '-ar' in sys.argv and sys.argv[-1] == '-'\n"
                    f"sys.stdout.buffer.write(open({str(tmp_path / 'pcm.f32')!r}, 'rb').read())\n")
    fake.chmod(0o755)
    clip = tmp_path / "clip.m4a"
    clip.write_bytes(b"\x00\x00\x00\x18ftypM4A " + bytes(64))
    monkeypatch.setattr(audio_mod.shutil, "which", lambda name: str(fake) if name == "ffmpeg" else None)
    monkeypatch.setitem(sys.modules, "soundfile", None)  # import soundfile -> ImportError
    np.testing.assert_array_equal(load_audio(clip), ref)
    fake.write_text(f"#!{sys.executable}\nimport sys\nsys.stderr.write('moov atom not found')\nsys.exit(1)\n")
    with pytest.raises(AudioError, match="ffmpeg cannot decode it: moov atom not found"):
        load_audio(clip)
