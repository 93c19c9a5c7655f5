"""Audio in: any file or array to the 16 kHz mono float32 samples Whisper hears.

WAV (PCM 8/16/24/32-bit) is read with the standard library's ``wave``; other formats
with ``soundfile`` (libsndfile: FLAC, OGG, MP3 with libsndfile >= 1.1) when installed,
else with the ``ffmpeg`` program when it is on PATH. Resampling uses ``soxr``.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import wave
from pathlib import Path

import numpy as np

from pyggml.errors import AudioError
from pyggml.models.whisper.mel import SAMPLE_RATE


def _pcm_to_float(raw: bytes, width: int, channels: int) -> np.ndarray:
    """Interleaved little-endian PCM -> float32 in [-1, 1), shape (frames, channels)."""
    if width == 1:
        x = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        x = ((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8).astype(np.float32) / 8388608.0
    elif width == 4:
        x = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    else:
        raise AudioError(f"WAV sample width of {width} bytes is not PCM")
    return x.reshape(-1, channels)


def _read_wav(path: Path) -> tuple[np.ndarray, int] | None:
    """(samples (frames, channels), rate), or None when the file is a WAV that ``wave`` does not read
    (float or compressed samples, WAVE_FORMAT_EXTENSIBLE): then another decoder gets it."""
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(n)
    except wave.Error as e:
        if "unknown format" in str(e):
            return None
        raise AudioError(f"{path}: corrupt WAV file: {e}") from e
    except EOFError as e:
        raise AudioError(f"{path}: truncated WAV file") from e
    except (RuntimeError, ValueError, struct.error) as e:  # wave's chunk reader on bad chunk sizes
        raise AudioError(f"{path}: corrupt WAV file (bad chunk sizes)") from e
    if len(raw) % (width * channels):
        raw = raw[:len(raw) - len(raw) % (width * channels)]
    return _pcm_to_float(raw, width, channels), rate


def _read_soundfile(path: Path) -> tuple[np.ndarray, int]:
    import soundfile

    try:
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError) as e:
        raise AudioError(f"{path}: soundfile cannot decode it: {e}") from e
    return data, rate


def _read_ffmpeg(path: Path, ffmpeg: str, sr: int) -> tuple[np.ndarray, int]:
    cmd = [ffmpeg, "-nostdin", "-v", "error", "-i", str(path), "-f", "f32le", "-ac", "1", "-ar", str(sr), "-"]
    result = subprocess.run(cmd, capture_output=True)
    if result.returncode != 0:
        raise AudioError(f"{path}: ffmpeg cannot decode it: {result.stderr.decode(errors='replace').strip()}")
    return np.frombuffer(result.stdout, "<f4").reshape(-1, 1), sr


def _decode(path: Path, sr: int) -> tuple[np.ndarray, int]:
    if path.suffix.lower() in (".wav", ".wave"):
        got = _read_wav(path)
        if got is not None:
            return got
    try:
        import soundfile  # noqa: F401
        has_soundfile = True
    except (ImportError, OSError):  # OSError: the wheel is there but libsndfile is not
        has_soundfile = False
    ffmpeg = shutil.which("ffmpeg")
    if has_soundfile:
        try:
            return _read_soundfile(path)
        except AudioError:
            if ffmpeg is None:
                raise
    if ffmpeg is not None:
        return _read_ffmpeg(path, ffmpeg, sr)
    raise AudioError(f"{path}: {path.suffix or 'this'} audio needs a decoder: pip install soundfile, or install "
                     f"ffmpeg (WAV PCM is read without either)")


def resample(samples: np.ndarray, rate: int, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Resample float32 samples (one axis) from ``rate`` to ``sr`` Hz with soxr (high quality)."""
    if rate == sr:
        return samples
    if rate <= 0:
        raise AudioError(f"sample rate {rate} Hz is not positive")
    try:
        import soxr
    except ImportError:
        raise AudioError(f"audio at {rate} Hz needs resampling to {sr} Hz: pip install soxr") from None
    return soxr.resample(samples, rate, sr, quality="HQ").astype(np.float32, copy=False)


def load_audio(source, sr: int = SAMPLE_RATE, source_sr: int | None = None) -> np.ndarray:
    """Mono float32 samples at ``sr`` Hz from a file path, or from an array (then ``source_sr`` is its rate,
    default ``sr``; a 2-D array is (frames, channels)). Channels are averaged."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise AudioError(f"{path}: no such audio file")
        if path.stat().st_size == 0:
            raise AudioError(f"{path}: audio file is empty")
        data, rate = _decode(path, sr)
        name = str(path)
    else:
        data, rate, name = np.asarray(source), source_sr or sr, "audio array"
        if data.dtype.kind not in "fiu":
            raise AudioError(f"{name}: samples of dtype {data.dtype} are not numbers")
        if data.dtype.kind in "iu":
            data = data.astype(np.float32) / float(np.iinfo(data.dtype).max + 1)
        if data.ndim == 1:
            data = data[:, None]
        if data.ndim != 2:
            raise AudioError(f"{name}: shape {data.shape}; expected (samples,) or (samples, channels)")
    if data.shape[0] == 0:
        raise AudioError(f"{name}: no audio samples")
    mono = np.ascontiguousarray(data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0],
                                dtype=np.float32)
    if not np.all(np.isfinite(mono)):
        raise AudioError(f"{name}: samples contain NaN or infinity")
    return resample(mono, rate, sr)
