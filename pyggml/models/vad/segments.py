"""Speech segments from Silero's per-window probabilities, and the speech-only audio Whisper decodes.

`speech_segments` is silero-vad's `get_speech_timestamps` as whisper.cpp (`whisper_vad_segments_from_probs`)
and faster-whisper (`vad.get_speech_timestamps`) port it: speech starts at a window whose probability is
>= threshold; inside speech a window below neg_threshold (threshold - 0.15 unless given) starts a tentative
end that becomes final after min_silence; segments of min_speech or less are dropped; a segment longer than
max_speech is split at its last silence of more than 98 ms, else cut hard; then each side is padded by
speech_pad (half the gap when two segments are closer than twice the padding). whisper.cpp then also
merges segments less than `merge_gap_ms` (200 ms) apart and drops those shorter than min_speech.

The two programs' defaults differ; both are here (`VadOptions.whisper_cpp()`, the default, and
`VadOptions.faster_whisper()`).

`SpeechAudio` is whisper.cpp's `whisper_vad`: the segments laid end to end (each but the last extended by
`samples_overlap` seconds), `gap_s` of zeros between them (whisper.cpp 0.1 s; faster-whisper's collect_chunks
joins them with none), and a table of (time in that audio, time in the original) points through which
Whisper's timestamps are mapped back by linear interpolation. `VadOptions.padding` names the front end the
speech audio then goes through (Whisper.log_mel): each program's own, so that with one program's options
pyggml decodes the same audio the same way as that program.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pyggml.errors import WhisperError

SAMPLE_RATE = 16000
WINDOW = 512
GAP_S = 0.1          # zeros between two segments in the speech-only audio (whisper.cpp)


@dataclass(frozen=True)
class VadOptions:
    threshold: float = 0.5
    neg_threshold: float | None = None     # None: max(threshold - 0.15, 0.01)
    min_speech_ms: int = 250
    min_silence_ms: int = 100
    max_speech_s: float = float("inf")
    speech_pad_ms: int = 30
    samples_overlap: float = 0.1           # seconds added after each segment but the last (whisper.cpp)
    merge_gap_ms: int = 200                # whisper.cpp merges segments closer than this; 0: no merging
    gap_s: float = GAP_S                   # zeros between two segments in the speech-only audio
    padding: str = "whisper.cpp"           # the speech audio's padding (Whisper.log_mel): whose front end

    @classmethod
    def whisper_cpp(cls, **changes) -> VadOptions:
        """whisper.cpp's `whisper_vad_default_params` (and whisper-cli's --vad-* defaults)."""
        return replace(cls(), **changes).check()

    @classmethod
    def faster_whisper(cls, **changes) -> VadOptions:
        """faster-whisper's `VadOptions` (vad_filter=True): long silences only, generous padding."""
        return replace(cls(min_speech_ms=0, min_silence_ms=2000, speech_pad_ms=400, samples_overlap=0.0,
                           merge_gap_ms=0, gap_s=0.0, padding="faster-whisper"), **changes).check()

    def check(self) -> VadOptions:
        if not 0.0 < self.threshold < 1.0:
            raise WhisperError(f"VAD threshold must be between 0 and 1, got {self.threshold}")
        if self.neg_threshold is not None and not 0.0 <= self.neg_threshold <= self.threshold:
            raise WhisperError(f"VAD neg_threshold must be between 0 and threshold, got {self.neg_threshold}")
        if self.padding not in ("whisper.cpp", "faster-whisper"):
            raise WhisperError(f"VAD padding must be 'whisper.cpp' or 'faster-whisper', got {self.padding!r}")
        for name in ("min_speech_ms", "min_silence_ms", "speech_pad_ms", "samples_overlap", "merge_gap_ms", "gap_s"):
            if getattr(self, name) < 0:
                raise WhisperError(f"VAD {name} must be >= 0, got {getattr(self, name)}")
        if not self.max_speech_s > 0:
            raise WhisperError(f"VAD max_speech_s must be > 0, got {self.max_speech_s}")
        return self

    @property
    def negative(self) -> float:
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


def _ms(ms: float) -> int:
    return int(SAMPLE_RATE * ms / 1000)


def speech_segments(probs, n_samples: int, opts: VadOptions | None = None) -> list[tuple[int, int]]:  # noqa: C901
    """(start, end) sample pairs of speech in audio of n_samples whose windows had `probs`."""
    opts = (opts or VadOptions()).check()
    min_speech, min_silence, pad = _ms(opts.min_speech_ms), _ms(opts.min_silence_ms), _ms(opts.speech_pad_ms)
    max_speech = (SAMPLE_RATE * opts.max_speech_s - WINDOW - 2 * pad) if np.isfinite(opts.max_speech_s) else np.inf
    silence_at_max = _ms(98)
    speeches: list[list[int]] = []
    triggered, start, temp_end, prev_end, next_start = False, 0, 0, 0, 0
    for i, p in enumerate(np.asarray(probs, np.float64).tolist()):   # floats compare faster than NumPy scalars
        sample = WINDOW * i
        if p >= opts.threshold and temp_end:
            temp_end = 0
            if next_start < prev_end:
                next_start = sample
        if p >= opts.threshold and not triggered:
            triggered, start = True, sample
            continue
        if triggered and sample - start > max_speech:
            if prev_end:
                speeches.append([start, prev_end])
                if next_start < prev_end:   # silence since, not speech again yet
                    triggered = False
                else:
                    start = next_start
                prev_end = next_start = temp_end = 0
            else:
                speeches.append([start, sample])
                prev_end = next_start = temp_end = 0
                triggered = False
                continue
        if p < opts.negative and triggered:
            if not temp_end:
                temp_end = sample
            if sample - temp_end > silence_at_max:
                prev_end = temp_end
            if sample - temp_end < min_silence:
                continue
            if temp_end - start > min_speech:
                speeches.append([start, temp_end])
            prev_end = next_start = temp_end = 0
            triggered = False
    if triggered and n_samples - start > min_speech:
        speeches.append([start, n_samples])
    if opts.merge_gap_ms:
        merged: list[list[int]] = []
        for s in speeches:
            if merged and s[0] - merged[-1][1] < _ms(opts.merge_gap_ms):
                merged[-1][1] = s[1]
            else:
                merged.append(s)
        speeches = [s for s in merged if s[1] - s[0] >= min_speech]
    for i, s in enumerate(speeches):
        if i == 0:
            s[0] = max(0, s[0] - pad)
        if i + 1 < len(speeches):
            gap = speeches[i + 1][0] - s[1]
            half = gap // 2 if gap < 2 * pad else pad
            s[1] = min(n_samples, s[1] + half)
            speeches[i + 1][0] = max(0, speeches[i + 1][0] - half)
        else:
            s[1] = min(n_samples, s[1] + pad)
    return [(int(a), int(b)) for a, b in speeches]


class SpeechAudio:
    """The speech-only audio of `segments` (sample pairs) cut from `audio`, and the way back to its times."""

    def __init__(self, audio: np.ndarray, segments: list[tuple[int, int]], samples_overlap: float = 0.1,
                 speech_pad_s: float = 0.0, gap_s: float = GAP_S):
        self.segments = segments
        parts, points, gaps, offset = [], [], [], 0
        overlap, gap = int(samples_overlap * SAMPLE_RATE), int(gap_s * SAMPLE_RATE)
        pads = [min(int(speech_pad_s * SAMPLE_RATE), (b - a) // 2) for a, b in segments]
        for i, (a, b) in enumerate(segments):
            last = i + 1 == len(segments)
            stop = b if last else min(b + overlap, audio.size)
            parts.append(audio[a:stop])
            points += [(offset, a), (offset + b - a, b)]
            offset += stop - a
            if not last:
                parts.append(np.zeros(gap, np.float32))
                points += [(offset, b), (offset + gap, segments[i + 1][0])]
                gaps.append((offset + b - a - (stop - a) - pads[i], offset + gap + pads[i + 1], b, segments[i + 1][0]))
                offset += gap
        self.audio = np.concatenate(parts, dtype=np.float32) if parts else np.zeros(0, np.float32)
        self._starts = np.array([p for p, o in points[::4]], np.float64) / SAMPLE_RATE   # each segment's, processed
        # in processed order; a join without a gap is two points at one processed time
        self._processed = np.array([p for p, _ in points], np.float64) / SAMPLE_RATE
        self._original = np.array([o for _, o in points], np.float64) / SAMPLE_RATE
        self._gaps = np.array(gaps, np.float64).reshape(-1, 4) / SAMPLE_RATE   # processed from, to; original

    def original_time(self, t: float, end: bool = False) -> float:
        """A time (seconds) in the speech-only audio -> the same moment in the original audio. A time between
        two segments' speech (their padding, the overlap and the zeros) stands for the whole pause that was cut
        out: as the start of a segment or word it is the next segment's start, as an `end` the previous
        segment's end. A linear map would put it anywhere in a pause of many seconds (0.1 s of zeros stand for
        all of it), and Whisper, hearing no pause, often puts the boundary between two sentences inside the
        first one's padding: both times would land in the wrong sentence."""
        if self._processed.size == 0:
            return t
        inside = np.flatnonzero((self._gaps[:, 0] < t) & (t < self._gaps[:, 1]))
        if inside.size:
            return round(float(self._gaps[inside[0], 2 if end else 3]), 3)
        return round(float(np.interp(t, self._processed, self._original)), 3)

    def original_span(self, start: float, end: float) -> tuple[float, float]:
        """A segment's or word's (start, end) in the speech-only audio -> in the original audio. Its middle
        decides which speech segment it belongs to: a start still in an earlier segment becomes this one's
        start, an end already in a later one this one's end (Whisper hears no pause between two sentences
        laid end to end and may put their boundary before the first one's last sound, where no padding rule
        can tell it), then as original_time."""
        if self._starts.size == 0:
            return start, end
        home = int(np.searchsorted(self._starts, (start + end) / 2, "right")) - 1
        first, last = (int(np.searchsorted(self._starts, t, "right")) - 1 for t in (start, end))
        a = self.segments[home][0] / SAMPLE_RATE if first < home else self.original_time(start)
        b = self.segments[home][1] / SAMPLE_RATE if last > home else self.original_time(end, end=True)
        return round(a, 3), round(max(a, b), 3)
