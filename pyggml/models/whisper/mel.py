"""Whisper's log-mel front end in NumPy, as whisper.cpp and openai-whisper compute it.

n_fft 400 (25 ms), hop 160 (10 ms), periodic Hann window, centred frames (reflect
padding), power spectrum without the last frame, Slaney mel filters computed by formula,
log10 clamped at 1e-10, floored at (max - 8), then (x + 4) / 4.

Padding, the one place the peers differ:

- ``"whisper.cpp"`` (default; openai-whisper does the same): 30 s of zeros are appended
  to the *audio* before the STFT, so a window's frames past the speech are the log-mel of
  silence (the floor, max - 8) and the last speech frames see zeros, not a reflection;
- ``"faster-whisper"``: as its FeatureExtractor, only one hop (160 zeros) is appended;
  faster-whisper then zero-pads the *log-mel* to the 30 s window (``pad_or_trim``), so
  the frames past the speech are 0, not the floor.

The tokens decoded from the two differ now and then (a word here and there), so a
token-for-token comparison must feed each peer its own front end.
"""

from __future__ import annotations

import numpy as np

from pyggml.errors import AudioError

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE  # 480000 samples in one 30 s window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 mel frames in one window
PADDINGS = ("whisper.cpp", "faster-whisper")
_PAD_SAMPLES = {"whisper.cpp": N_SAMPLES, "faster-whisper": HOP_LENGTH}


def _hz_to_mel(f):
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    min_log_hz, min_log_mel, logstep = 1000.0, 15.0, np.log(6.4) / 27.0
    linear = 3.0 * f / 200.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, 1e-10) / min_log_hz) / logstep, linear)


def _mel_to_hz(m):
    m = np.asarray(m, dtype=np.float64)
    min_log_hz, min_log_mel, logstep = 1000.0, 15.0, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), 200.0 * m / 3.0)


def mel_filters(n_mels: int = 80, n_fft: int = N_FFT, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Slaney-normalised triangular mel filters, (n_mels, n_fft // 2 + 1) float32, over 0..sr/2 Hz
    (librosa.filters.mel(sr, n_fft, n_mels), which openai-whisper's mel_filters.npz stores)."""
    fft_freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel_points = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2), n_mels + 2))
    widths = np.diff(mel_points)
    ramps = mel_points[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_points[2:] - mel_points[:-2]))[:, None]
    return weights.astype(np.float32)


FRAMES_PER_BLOCK = 4096  # STFT frames transformed at a time: the FFT's temporaries stay a few MiB, reused


def _mel_power(audio: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """filters @ |STFT|^2 of centred, reflect-padded frames with a periodic Hann window, without the last frame:
    (n_mels, n_frames). Computed a block of frames at a time: on a whole file at once the FFT's float64
    temporaries (about 1 GiB for 13 minutes) cost more in fresh pages than the transform itself."""
    if len(audio) <= N_FFT // 2:
        audio = np.pad(audio, (0, N_FFT // 2 + 1 - len(audio)))  # reflect padding needs more samples than it adds
    padded = np.pad(audio, N_FFT // 2, mode="reflect")
    n_frames = (len(padded) - N_FFT) // HOP_LENGTH  # the last frame is dropped, as whisper does
    frames = np.lib.stride_tricks.as_strided(
        padded, (n_frames, N_FFT), (padded.strides[0] * HOP_LENGTH, padded.strides[0]), writeable=False)
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)
    out = np.empty((filters.shape[0], n_frames), np.float32)
    for start in range(0, n_frames, FRAMES_PER_BLOCK):
        spec = np.fft.rfft(frames[start:start + FRAMES_PER_BLOCK] * window, axis=-1)
        power = (spec.real ** 2 + spec.imag ** 2).astype(np.float32)
        out[:, start:start + len(power)] = filters @ power.T
    return out


def log_mel_spectrogram(audio, n_mels: int = 80, padding: str = "whisper.cpp",
                        filters: np.ndarray | None = None) -> np.ndarray:
    """(n_mels, n_frames) float32 log-mel of 16 kHz mono audio.

    With ``padding="whisper.cpp"`` n_frames = len(audio) // 160 + 3000 (the audio's frames
    then a 30 s window of silence); with ``"faster-whisper"`` n_frames = len(audio) // 160 + 1,
    to be cut into windows with ``pad_or_trim``. ``filters`` defaults to
    ``mel_filters(n_mels)``; pass a file's own filters to use them.
    """
    if padding not in PADDINGS:
        raise AudioError(f"unknown mel padding {padding!r}; expected one of {PADDINGS}")
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise AudioError(f"log-mel wants mono audio (one axis), got shape {audio.shape}")
    if audio.size == 0:
        raise AudioError("log-mel of empty audio")
    filters = mel_filters(n_mels) if filters is None else np.asarray(filters, dtype=np.float32)
    if filters.shape != (n_mels, N_FFT // 2 + 1):
        raise AudioError(f"mel filters of shape {filters.shape}, expected ({n_mels}, {N_FFT // 2 + 1})")
    mel = _mel_power(np.concatenate([audio, np.zeros(_PAD_SAMPLES[padding], np.float32)]), filters)
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


def pad_or_trim(mel: np.ndarray, n_frames: int = N_FRAMES) -> np.ndarray:
    """Cut or zero-pad the frame axis (the last) to ``n_frames``, as the encoder's 30 s window needs."""
    if mel.shape[-1] >= n_frames:
        return mel[..., :n_frames]
    return np.pad(mel, [(0, 0)] * (mel.ndim - 1) + [(0, n_frames - mel.shape[-1])])
