"""Batched transcription, as faster-whisper's BatchedInferencePipeline: Silero VAD cuts the audio into
speech segments (at most 30 s each, silences over 160 ms end one), consecutive segments are merged into
chunks of up to 30 s (faster-whisper's collect_chunks: back to back; with whisper.cpp's VAD options 0.1 s of
zeros between two segments, counted in the 30 s), read through the VAD options' front end (VadOptions.padding),
and `batch_size` chunks are decoded together: one encoder graph encodes them all, each into its own
cross-attention slot, then one decoder graph per step advances every chunk's sequence (a matrix product over
B rows instead of B matrix-vector products, the gain on a CPU).

As faster-whisper's batched mode: greedy, no temperature fallback, no timestamp tokens (one segment per
chunk, its times those of the chunk's speech), no previous text as prompt (chunks are independent);
word timestamps come from the alignment heads per chunk, mapped back to the original audio.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from pyggml.errors import ParameterError
from pyggml.models.vad.segments import SpeechAudio, VadOptions, speech_segments
from pyggml.models.whisper.decoding import LogitFilter, compression_ratio, decode_batch
from pyggml.models.whisper.model import N_FRAMES
from pyggml.models.whisper.results import HOP, MAX_SEQUENCES, Segment, Timings

SAMPLE_RATE = 16000
CHUNK_S = 30.0


def batched_vad_options(**changes) -> VadOptions:
    """faster-whisper's batched VAD: its VadOptions with max_speech_duration_s=30, min_silence 160 ms."""
    return VadOptions.faster_whisper(min_silence_ms=160, max_speech_s=CHUNK_S, **changes)


def speech_chunks(segments: list[tuple[int, int]], max_s: float = CHUNK_S,
                  gap_s: float = 0.0) -> list[list[tuple[int, int]]]:
    """Consecutive speech segments (sample pairs) merged while the chunk, gap_s of zeros between two of
    them, lasts at most max_s seconds (faster-whisper's collect_chunks)."""
    limit, gap = int(max_s * SAMPLE_RATE), int(gap_s * SAMPLE_RATE)
    chunks, current, size = [], [], 0
    for a, b in segments:
        grown = size + gap + b - a if current else b - a
        if current and grown > limit:
            chunks.append(current)
            current, grown = [], b - a
        current.append((a, b))
        size = grown
    return chunks + [current] if current else chunks


def check_batch_size(batch_size) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_SEQUENCES:
        raise ParameterError(f"batch_size must be an integer from 1 to {MAX_SEQUENCES}, got {batch_size!r}")
    return batch_size


def transcribe_batched(whisper, samples: np.ndarray, batch_size: int, vad_options: VadOptions | None, opts):
    """Segments (one per speech chunk) of `samples` decoded `batch_size` chunks at a time (module docstring);
    `opts` is a transcribe.Options (beam_size 1: greedy); `vad_options` have their max_speech_s cut to 30 s."""
    if opts.beam_size != 1:
        raise ParameterError(f"batched transcription is greedy: beam_size must be 1, got {opts.beam_size}")
    model, tok = whisper.model, whisper.tokenizer
    t = whisper.timings = Timings(load_s=whisper.timings.load_s, audio_s=samples.size / SAMPLE_RATE)
    start = time.perf_counter()
    vopts = replace(vad_options, max_speech_s=min(vad_options.max_speech_s, CHUNK_S)).check() if vad_options \
        else batched_vad_options()   # as faster-whisper, a segment never outlasts a chunk
    segments = speech_segments(whisper.vad().probs(samples), samples.size, vopts)
    chunks = [SpeechAudio(samples, c, 0.0, vopts.speech_pad_ms / 1000, vopts.gap_s)
              for c in speech_chunks(segments, CHUNK_S, vopts.gap_s)]
    t.vad_s = time.perf_counter() - start
    if opts.language is not None:
        tok.language_token(opts.language)  # an unknown language fails before any work
    flt = LogitFilter(tok, list(whisper.file.suppress_ids or tok.non_speech_tokens),
                      list(whisper.file.suppress_ids_begin or []), timestamps=False)
    model.ensure_cross_slots(min(batch_size, len(chunks)))
    prompt = tok.encode(" " + opts.initial_prompt.strip()) if opts.initial_prompt else []
    language, segments = opts.language, []
    for first in range(0, len(chunks), batch_size):
        batch = chunks[first:first + batch_size]
        start = time.perf_counter()
        mels = np.array([whisper.log_mel(c.audio, vopts.padding)[0][:, :N_FRAMES] for c in batch])
        t.mel.add(time.perf_counter() - start)
        start = time.perf_counter()
        model.encode_batch(mels)
        t.encode.add(time.perf_counter() - start, len(batch))
        start = time.perf_counter()
        if language is None:
            language = whisper.detect_language()[0]   # the first chunk's language (in slot 0)
        prefix = tok.sot_sequence(language, opts.task, False)
        if prompt:
            prefix = [tok.startofprev] + prompt[-(model.n_text_ctx // 2 - 1):] + prefix
        results = decode_batch(model, flt, prefix, len(batch))
        t.decode.add(0.0, max(len(r.tokens) for r in results) + 1)
        for slot, (speech, r) in enumerate(zip(batch, results, strict=True)):
            r.text = tok.decode([x for x in r.tokens if x < tok.eot])
            r.compression_ratio = compression_ratio(r.text)
            if whisper._is_silence(r, opts) or not r.text.strip():
                continue
            segment = Segment(round(speech.segments[0][0] / SAMPLE_RATE, 3),
                              round(speech.segments[-1][1] / SAMPLE_RATE, 3), r.text, r.tokens,
                              r.avg_logprob, r.no_speech_prob, 0.0, r.compression_ratio)
            if opts.word_timestamps:
                whisper._add_words([segment], r, tok.sot_sequence(language, opts.task), speech.audio.size // HOP,
                                   0.0, slot)
                for word in segment.words:
                    word.start, word.end = speech.original_span(word.start, word.end)
            segments.append(segment)
        t.decode.add(time.perf_counter() - start)
    return segments
