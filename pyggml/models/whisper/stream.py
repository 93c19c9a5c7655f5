"""Real-time transcription of a live stream: `Whisper.stream()` -> `Stream`; feed 16 kHz PCM, get partial and
final segments.

Policy: utterance slices cut by voice activity, as whisper.rn's RealtimeTranscriber slices audio (with Silero run
statefully over every 32 ms window, not its ring buffer re-scored each half second). Silero's rules run online: a
window at or above `threshold` opens an utterance (`speech_pad_ms` before it); while it is open, every
`partial_every_s` of new audio its audio so far is transcribed again and returned as partial text (`final=False`,
free to change). A partial delays a final that falls due while it runs, so partials start only while the last
window is speech (never once it fades), and at most every 4x the last partial's wall time (under load they thin
out instead of keeping the decoder busy when the utterance ends); when
the probability stays below the negative threshold for `min_silence_ms`, or the utterance reaches
`max_utterance_s`, it is transcribed once more (from its start to where the silence began, padded by
`speech_pad_ms`) and that text is final: it is never rewritten, and it joins the prompt of the next utterances
(the previous text as prompt, as whisper.cpp's condition on previous text). Utterances with less than
`min_speech_ms` of speech are dropped undecoded, and nothing is decoded while no utterance is open, so silence
yields no text.

The final decode hears the previous utterances too: as many of the last ones as fit in `context_s` (15) seconds
laid end to end with 0.1 s of silence between (as whisper.cpp's VAD lays speech), then the new utterance,
with the final text before them as prompt; the words whose time (word timestamps) lies past the join are the new
final text. An offline run with VAD decodes each utterance after the ones before it in the same window; decoded
alone, tiny.en misheard far more: "let me cut my hand" for "the baker sells fresh bread". Finals' WER on the long
benchmark's 813 s (offline with VAD 0.113): alone 0.16 (first 300 s), the previous utterance only 0.136, the last
utterances within 10 s 0.123, 15 s 0.112, 20 s 0.124; on a second long audio of other voices, speeds and pauses
(offline 0.116), 15 s gives 0.112 (docs/whisper.md). If no word lands past the join (the model stopped after
the context), the utterance is decoded alone.

Why this and not LocalAgreement-2 (ufal's whisper_streaming: commit the longest common prefix of the last two
hypotheses): a final here is one decode of the utterance in the context an offline run with VAD gives it, and the
latency after an utterance ends is the silence that ends it plus one decode; LocalAgreement commits word by word
sooner inside long speech, but its committed prefix depends on where chunks fall.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pyggml.errors import AudioError, WhisperError

SAMPLE_RATE = 16000
WINDOW = 512
JOIN = SAMPLE_RATE // 10        # silence between the context and the new utterance (whisper.cpp's VAD join)
MAX_DECODE = 29 * SAMPLE_RATE   # context + join + utterance stay inside one 30 s Whisper window
PARTIAL_SHARE = 0.25            # partials may keep the decoder busy this part of the stream's time, no more


@dataclass(frozen=True)
class StreamOptions:
    threshold: float = 0.5
    neg_threshold: float | None = None      # None: max(threshold - 0.15, 0.01), as Silero
    min_silence_ms: int = 500               # silence that ends an utterance
    min_speech_ms: int = 250                # shorter utterances are dropped undecoded
    speech_pad_ms: int = 200                # audio kept before and after the speech (30 ms, whisper.cpp's VAD
                                            # padding, cuts off first sounds: "armoured" for "farmers")
    partial_every_s: float = 1.0            # new audio between partial transcriptions (0: no partials)
    max_utterance_s: float = 25.0           # an utterance this long is cut (kept under Whisper's 30 s window)
    prompt_chars: int = 200                 # how much of the final text so far prompts the next utterance
    context_s: float = 15.0                 # the last utterances' audio decoded before a final (0: alone)

    def check(self) -> StreamOptions:
        if not 0.0 < self.threshold < 1.0:
            raise WhisperError(f"stream threshold must be between 0 and 1, got {self.threshold}")
        if min(self.min_silence_ms, self.min_speech_ms, self.speech_pad_ms, self.partial_every_s,
               self.prompt_chars, self.context_s) < 0:
            raise WhisperError("stream durations and prompt_chars must be >= 0")
        if not 1.0 <= self.max_utterance_s <= 29.0:
            raise WhisperError(f"max_utterance_s must be 1 to 29 s (one Whisper window), got {self.max_utterance_s}")
        return self

    @property
    def negative(self) -> float:
        return self.neg_threshold if self.neg_threshold is not None else max(self.threshold - 0.15, 0.01)


@dataclass
class StreamSegment:
    start: float            # seconds from the start of the stream
    end: float
    text: str
    final: bool
    emitted_at: float       # stream position (seconds of audio fed) when it was returned
    utterance: int          # index of the utterance it belongs to


class Stream:
    """Feed PCM with `feed(samples)`; each call returns the segments it produced (partials and finals, in
    order); `finish()` ends the stream (the open utterance becomes final). `final_text` is everything final."""

    def __init__(self, whisper, options: StreamOptions | None = None, **transcribe_options):
        from pyggml.models.vad.silero import SileroVAD

        self.whisper = whisper
        self.opts = (options or StreamOptions()).check()
        self.decode_options = {"temperatures": (0.0,), **transcribe_options}
        self.vad = SileroVAD(whisper.vad().weights)
        self.audio = np.zeros(0, np.float32)    # everything fed (kept for the open utterance's slices)
        self.base = 0                           # stream sample of self.audio[0]
        self.n_windows = 0                      # VAD windows scored so far
        self.start: int | None = None           # open utterance: its first sample (padded)
        self.speech_samples = 0
        self.silence_from: int | None = None
        self.last_partial = 0
        self.partial_cost = 0.0                 # wall seconds the last partial took
        self.speaking = False                   # the last window was at or above threshold
        self.utterances = 0
        self.finals: list[StreamSegment] = []
        self.history: list[tuple[int, np.ndarray]] = []   # (utterance, audio): the finals in context
        self.partials = 0
        self.decode_seconds = 0.0

    @property
    def position(self) -> int:
        return self.base + self.audio.size

    @property
    def final_text(self) -> str:
        return " ".join(s.text.strip() for s in self.finals if s.text.strip())

    def feed(self, samples) -> list[StreamSegment]:
        samples = np.asarray(samples)
        if samples.dtype == np.int16:
            samples = samples.astype(np.float32) / 32768.0
        samples = samples.astype(np.float32).reshape(-1)
        if samples.size and not np.isfinite(samples).all():
            raise AudioError("stream audio has NaN or infinite samples")
        self.audio = np.concatenate([self.audio, samples])
        out: list[StreamSegment] = []
        pad = SAMPLE_RATE * self.opts.speech_pad_ms // 1000
        for p in self.vad.process(samples):
            at = self.n_windows * WINDOW
            self.n_windows += 1
            if self.start is None:
                if p >= self.opts.threshold:
                    self.start = max(at - pad, self.base, 0)
                    self.speech_samples, self.silence_from, self.speaking = WINDOW, None, True
                    self.last_partial = at
                continue
            self.speaking = p >= self.opts.threshold
            if self.speaking:
                self.silence_from = None
                self.speech_samples += WINDOW
            elif p < self.opts.negative and self.silence_from is None:
                self.silence_from = at
            silent = self.silence_from is not None and at + WINDOW - self.silence_from >= \
                SAMPLE_RATE * self.opts.min_silence_ms // 1000
            too_long = at + WINDOW - self.start >= self.opts.max_utterance_s * SAMPLE_RATE
            if silent or too_long:
                out += self._close(min(self.silence_from + pad, at + WINDOW) if silent else at + WINDOW)
        every = max(self.opts.partial_every_s, self.partial_cost / PARTIAL_SHARE)
        if (self.start is not None and self.opts.partial_every_s and self.speaking
                and self.position - self.last_partial >= every * SAMPLE_RATE):
            self.last_partial = self.position
            t0 = time.perf_counter()
            out += self._partial(self.start, self.position)
            self.partial_cost = time.perf_counter() - t0
        self._trim()
        return out

    def finish(self) -> list[StreamSegment]:
        """End of the stream: an open utterance becomes final."""
        return self._close(self.position) if self.start is not None else []

    def _close(self, end: int) -> list[StreamSegment]:
        start, self.start = self.start, None
        self.silence_from = None
        if self.speech_samples < SAMPLE_RATE * self.opts.min_speech_ms // 1000:
            return []
        audio = self.audio[start - self.base:end - self.base]
        if audio.size < SAMPLE_RATE // 10:
            return []
        segments = self._final_in_context(audio, start) or self._final_alone(audio, start)
        self.finals += segments
        self.utterances += 1
        self._remember(audio)
        return segments

    def _remember(self, audio: np.ndarray) -> None:
        """Keep the last utterances whose audio, laid end to end with JOIN between, fits in context_s (the last
        one cut to context_s when it alone is longer)."""
        limit = int(self.opts.context_s * SAMPLE_RATE)
        if not limit:
            return
        self.history.append((self.utterances - 1, audio[-limit:].copy()))
        while len(self.history) > 1 and sum(a.size + JOIN for _, a in self.history) - JOIN > limit:
            self.history.pop(0)

    def _final_in_context(self, audio: np.ndarray, start: int) -> list[StreamSegment]:
        """The new words of a decode of [the utterances in context, 0.1 s silence, this utterance] ([] if none)."""
        room = MAX_DECODE - JOIN - audio.size
        if not self.history or room < SAMPLE_RATE // 2 or not self.whisper.file.alignment_heads:
            return []
        gap = np.zeros(JOIN, np.float32)
        context = np.concatenate([x for _, a in self.history for x in (a, gap)][:-1])[-room:]
        join = (context.size + JOIN) / SAMPLE_RATE
        prompt = " ".join(s.text.strip() for s in self.finals if s.utterance < self.history[0][0] and s.text.strip())
        decoded = self._transcribe(np.concatenate([context, gap, audio]), prompt, word_timestamps=True)
        offset, end = start / SAMPLE_RATE - join, (start + audio.size) / SAMPLE_RATE
        out = []
        for s in decoded:
            words = [w for w in s.words or [] if w.start + w.end >= 2 * join]
            if words:
                out.append(StreamSegment(round(max(offset + words[0].start, start / SAMPLE_RATE), 3),
                                         round(min(offset + words[-1].end, end), 3), "".join(w.word for w in words),
                                         True, self.position / SAMPLE_RATE, self.utterances))
        return out

    def _final_alone(self, audio: np.ndarray, start: int) -> list[StreamSegment]:
        offset, end = start / SAMPLE_RATE, (start + audio.size) / SAMPLE_RATE
        return [StreamSegment(round(offset + s.start, 3), round(min(offset + s.end, end), 3), s.text, True,
                              self.position / SAMPLE_RATE, self.utterances)
                for s in self._transcribe(audio, self.final_text)]

    def _partial(self, start: int, end: int) -> list[StreamSegment]:
        audio = self.audio[start - self.base:end - self.base]
        if audio.size < SAMPLE_RATE // 10:
            return []
        self.partials += 1
        text = " ".join(s.text.strip() for s in self._transcribe(audio, self.final_text) if s.text.strip())
        return [StreamSegment(start / SAMPLE_RATE, end / SAMPLE_RATE, text, False, self.position / SAMPLE_RATE,
                              self.utterances)] if text else []

    def _transcribe(self, audio: np.ndarray, prompt: str, **extra) -> list:
        """Whisper's segments for `audio`, the last prompt_chars of `prompt` as its prompt."""
        options = {**self.decode_options, **extra}
        if prompt and self.opts.prompt_chars:
            options["initial_prompt"] = prompt[-self.opts.prompt_chars:]
        t0 = time.perf_counter()
        segments = self.whisper.transcribe(audio, **options)
        self.decode_seconds += time.perf_counter() - t0
        return segments

    def _trim(self) -> None:
        """Drop audio no utterance can reach any more (all but the padding before the next one)."""
        keep_from = self.start if self.start is not None else self.position - SAMPLE_RATE
        if keep_from - self.base > 10 * SAMPLE_RATE:
            self.audio = self.audio[keep_from - self.base:]
            self.base = keep_from
