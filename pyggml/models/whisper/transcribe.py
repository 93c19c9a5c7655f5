"""Speech to text: `load_whisper(...)` and `Whisper.transcribe(audio) -> segments`, as whisper.cpp's
whisper_full.

The audio's log-mel is cut into 30 s windows by a seek position: each window is encoded once, then decoded
(with temperature fallback: when the text compresses too well (a loop, ratio > 2.4) or its average
log-probability is below -1.0, decoding is retried at the next temperature 0.2, 0.4, ... 1.0, sampling with a
seeded generator). A window whose no-speech probability is above 0.6 while its log-probability is low is
silence and yields nothing (so is a window whose no-speech probability is above 0.9). Segments are cut at
timestamp pairs; the next window starts at the last complete pair's end (or after the window when it ends with
a single timestamp), so nothing at a window's edge is lost; as in whisper.cpp, a rest of 1 s or less after a
window is not decoded (a whole encoder pass for at most a word; whisper.cpp also refuses audio of 1 s or less,
pyggml decodes it). The text so far is the next window's prompt
(`<|startofprev|>`), reset after a hot fallback.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, replace

import numpy as np

from pyggml.backend import Backend
from pyggml.errors import AudioError, WhisperError
from pyggml.models.whisper.alignment import word_timestamps
from pyggml.models.whisper.batched import check_batch_size, transcribe_batched
from pyggml.models.whisper.decoding import (TIME_PRECISION, LogitFilter, WindowResult, compression_ratio,
                                            decode_window, log_softmax)
from pyggml.models.llm.runner import backend_list
from pyggml.models.whisper.results import HOP, MAX_SEQUENCES, Segment, Timings
from pyggml.models.whisper.model import AUDIO_CTX_PAD, N_FRAMES, WhisperModel, with_cpu_fallback

SAMPLE_RATE = 16000
FRAMES_PER_TOKEN = round(TIME_PRECISION * SAMPLE_RATE / HOP)   # 2 mel frames per timestamp step
TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
MIN_TAIL_FRAMES = 100                         # a rest of 1 s or less after a window is not decoded (whisper.cpp)


@dataclass
class Options:
    """transcribe()'s decoding options (whisper.cpp's whisper_full_params that matter here)."""

    language: str | None = None
    task: str = "transcribe"
    beam_size: int = 1
    best_of: int = 5
    temperatures: tuple = TEMPERATURES
    compression_ratio_threshold: float = 2.4
    logprob_threshold: float = -1.0
    no_speech_threshold: float | None = 0.6
    no_speech_certain: float | None = 0.9
    condition_on_previous_text: bool = True
    initial_prompt: str | None = None
    timestamps: bool = True
    word_timestamps: bool = False
    seed: int = 0


class Whisper:
    """A loaded Whisper model ready to transcribe (see the module docstring)."""

    def __init__(self, wf, backends: list[Backend], f32: bool = False, gelu: str = "erf", planner: str = "best",
                 flash_attn: bool = True, placement=None, audio_ctx_pad: int = AUDIO_CTX_PAD):
        from pyggml.models.whisper.tokenizer import WhisperTokenizer

        start = time.perf_counter()
        self.file = replace(wf, tensors={})  # the metadata; the tensors' bytes (and the file's pages) go
        self.tokenizer = WhisperTokenizer(wf.vocab)
        self.model = WhisperModel(wf, backends, f32=f32, gelu=gelu, planner=planner, flash_attn=flash_attn,
                                  placement=placement, audio_ctx_pad=audio_ctx_pad)
        self.timings = Timings(load_s=time.perf_counter() - start)
        self._vad = None

    @property
    def is_multilingual(self) -> bool:
        return self.tokenizer.is_multilingual

    # ----- memory ----------------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Bytes of the weights, the KV caches (self and cross), the compute buffers (and ggml's figure for
        the same graphs), and the process's peak RSS."""
        m = self.model
        return {"weights": m.weights.nbytes, "kv": m.kv_bytes, "compute": m.compute_bytes,
                "compute_ggml": m.ggml_compute_bytes,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    # ----- front end -------------------------------------------------------------------------------
    def log_mel(self, audio, padding: str = "whisper.cpp") -> tuple[np.ndarray, int]:
        """(log-mel [n_mels, frames] with at least 30 s after the audio, frames holding audio). `padding` is
        whose padding of the audio the windows encoded next get: whisper.cpp's (30 s of zero samples before the
        log-mel, attention over 1536 audio positions) or faster-whisper's (one hop, zero log-mel frames,
        attention over the 1500 alone; pyggml.models.whisper.mel and .model say what each changes)."""
        from pyggml.models.whisper.mel import log_mel_spectrogram

        samples = _samples(audio)
        mel = log_mel_spectrogram(samples, n_mels=self.model.n_mels, padding=padding, filters=self.file.mel_filters)
        self.model.pad_audio_attention(padding == "whisper.cpp")
        content = samples.size // HOP
        if mel.shape[1] < content + N_FRAMES:
            mel = np.pad(mel, ((0, 0), (0, content + N_FRAMES - mel.shape[1])))
        return mel, content

    # ----- language --------------------------------------------------------------------------------
    def detect_language(self, mel_window: np.ndarray | None = None) -> tuple[str, dict[str, float]]:
        """The most likely language of the window encoded last (or of mel_window) and every language's
        probability: one decoder step on <|startoftranscript|>, softmax over the language tokens."""
        tok = self.tokenizer
        if not tok.is_multilingual:
            return "en", {"en": 1.0}
        if mel_window is not None:
            self.model.encode(mel_window)
        logits = self.model.decode([tok.sot], [0])[0]
        ids = np.asarray(tok.lang_ids)
        probs = np.exp(log_softmax(logits[ids]))
        ranked = {tok.languages[i]: float(probs[i]) for i in np.argsort(-probs, kind="stable")}
        return next(iter(ranked)), ranked

    def language_probabilities(self, audio, padding: str = "whisper.cpp") -> dict[str, float]:
        """{language: probability} for the first 30 s of `audio` (a path or samples), most likely first: as
        whisper.cpp's --detect-language (whisper_lang_auto_detect) and faster-whisper's detect_language, one
        decoder step on <|startoftranscript|> after encoding that window. English-only models: {"en": 1.0}."""
        if not self.tokenizer.is_multilingual:
            return {"en": 1.0}
        mel, _ = self.log_mel(audio, padding)
        return self.detect_language(mel[:, :N_FRAMES])[1]

    # ----- voice activity detection ----------------------------------------------------------------
    def vad(self, weights=None):
        """The Silero VAD this model uses with vad=True (made on first use; `weights` as load_silero takes:
        None for faster-whisper's bundled ONNX, a .onnx, a whisper.cpp ggml VAD file)."""
        from pyggml.models.vad.silero import SileroVAD

        if self._vad is None or weights is not None:
            self._vad = SileroVAD(weights)
        return self._vad

    def stream(self, options=None, **transcribe_options):
        """A real-time transcriber: feed it PCM, get partial and final segments (see stream.Stream; `options` is a
        stream.StreamOptions, the rest are transcribe()'s decoding options)."""
        from pyggml.models.whisper.stream import Stream

        return Stream(self, options, **transcribe_options)

    def transcribe(self, audio, padding: str | None = None, vad: bool = False, vad_options=None,
                   batch_size: int | None = None, **options) -> list[Segment]:
        """Segments of text with their times (seconds) for `audio`: a path (WAV; other formats with
        soundfile) or 16 kHz mono float samples. Options: see `Options` (language=None detects it on
        multilingual models; beam_size > 1 for beam search; temperatures=(0.0,) turns off the fallback).
        `padding` (see log_mel): whisper.cpp's unless given, with vad=True the VAD options' own.

        vad=True decodes only the speech Silero VAD finds: the segments laid end to end, then transcribed as
        one audio; the times are mapped back to the original audio. `vad_options` is a
        pyggml.models.vad.segments.VadOptions; the default is faster-whisper's, end to end (only silences over
        2 s removed, 400 ms kept around speech, no gap between segments, its padding): with whisper.cpp's
        30 ms the first sounds of many segments are cut off ("armoured" for "farmers"), and on pause-heavy
        speech faster-whisper's whole pipeline decodes the text faster-whisper decodes (docs/whisper.md).

        batch_size > 1 decodes that many VAD-cut chunks of up to 30 s together, as faster-whisper's
        BatchedInferencePipeline (pyggml.models.whisper.batched: VAD always, greedy, one segment per chunk;
        `vad_options` default to faster-whisper's batched ones); None or 1 is the path above."""
        if batch_size is not None and check_batch_size(batch_size) > 1:
            return transcribe_batched(self, _samples(audio), batch_size, vad_options, Options(**options))
        if not vad:
            return self._transcribe(audio, padding or "whisper.cpp", options)
        from pyggml.models.vad.segments import SpeechAudio, VadOptions, speech_segments

        vopts = (vad_options or VadOptions.faster_whisper()).check()
        samples = _samples(audio)
        start = time.perf_counter()
        speech = SpeechAudio(samples, speech_segments(self.vad().probs(samples), samples.size, vopts),
                             vopts.samples_overlap, vopts.speech_pad_ms / 1000, vopts.gap_s)
        vad_s = time.perf_counter() - start
        if speech.audio.size >= HOP:
            segments = self._transcribe(speech.audio, padding or vopts.padding, options)
        else:                                   # no speech: nothing to decode
            segments, self.timings = [], Timings(load_s=self.timings.load_s)
        self.timings.vad_s, self.timings.audio_s = vad_s, samples.size / SAMPLE_RATE
        for s in segments:
            s.start, s.end = speech.original_span(s.start, s.end)
            for word in s.words or []:
                word.start, word.end = speech.original_span(word.start, word.end)
        return segments

    def _transcribe(self, audio, padding: str, options: dict) -> list[Segment]:
        opts = Options(**options)
        if not (1 <= opts.beam_size <= MAX_SEQUENCES and 1 <= opts.best_of <= MAX_SEQUENCES):
            raise WhisperError(f"beam_size ({opts.beam_size}) and best_of ({opts.best_of}) "
                               f"must be 1 to {MAX_SEQUENCES}")
        tok = self.tokenizer
        t = Timings(load_s=self.timings.load_s)
        start = time.perf_counter()
        mel, content = self.log_mel(audio, padding)
        t.mel.add(time.perf_counter() - start)
        t.audio_s = content * HOP / SAMPLE_RATE
        self.timings = t
        if opts.language is not None:
            tok.language_token(opts.language)  # an unknown language fails before any work
        tok.sot_sequence(opts.language, opts.task, opts.timestamps)
        flt = LogitFilter(tok, list(self.file.suppress_ids or tok.non_speech_tokens),
                          list(self.file.suppress_ids_begin or []), opts.timestamps)
        rng = np.random.default_rng(opts.seed)
        segments: list[Segment] = []
        history: list[int] = []
        if opts.initial_prompt:
            history = tok.encode(" " + opts.initial_prompt.strip())
        prompt_start = 0
        seek, language = 0, opts.language
        while seek < content:
            if seek > 0 and content - seek <= MIN_TAIL_FRAMES:
                break         # whisper.cpp: "if only 1 second left, then stop"
            window = mel[:, seek:seek + N_FRAMES]
            size = min(N_FRAMES, content - seek)
            offset = seek * HOP / SAMPLE_RATE
            t0 = time.perf_counter()
            self.model.encode(window)
            t.encode.add(time.perf_counter() - t0, 1)
            t0 = time.perf_counter()
            if language is None:
                language = self.detect_language()[0]
            prefix = tok.sot_sequence(language, opts.task, opts.timestamps)
            prompt = history[prompt_start:]
            if prompt:
                prefix = [tok.startofprev] + prompt[-(self.model.n_text_ctx // 2 - 1):] + prefix
            result = self._decode_with_fallback(flt, prefix, opts, rng)
            t.decode.add(time.perf_counter() - t0)
            if self._is_silence(result, opts):
                seek += size          # nothing from this window
                continue
            new, advance = self._segments(result, offset, size)
            if opts.word_timestamps:
                self._add_words(new, result, tok.sot_sequence(language, opts.task), size, offset)
            segments += new
            seek += advance if advance > 0 else size   # a last pair at 0.00 s must not stall the seek
            history += result.tokens
            if result.temperature > 0.5 or not opts.condition_on_previous_text:
                prompt_start = len(history)
        return segments

    def _decode_with_fallback(self, flt, prefix, opts: Options, rng) -> WindowResult:
        result = None
        for temperature in opts.temperatures:
            result = decode_window(self.model, flt, prefix, temperature, opts.beam_size, opts.best_of, rng)
            self.timings.decode.add(0.0, len(result.tokens) + 1)
            text = self.tokenizer.decode([x for x in result.tokens if x < self.tokenizer.eot])
            result.text, result.compression_ratio = text, compression_ratio(text)
            failed = ((opts.compression_ratio_threshold is not None
                       and result.compression_ratio > opts.compression_ratio_threshold)
                      or (opts.logprob_threshold is not None and result.avg_logprob < opts.logprob_threshold))
            if self._is_silence(result, opts):
                failed = False  # no retry
            if not failed:
                break
        return result

    def _add_words(self, segments: list[Segment], r: WindowResult, start_tokens: list[int], size: int,
                   offset: float, slot: int = 0) -> None:
        """Word timestamps for a window's text (cross-attention DTW over the audio in cross-attention slot
        `slot`), shared out to its segments in order."""
        eot = self.tokenizer.eot
        words = word_timestamps(self.model, self.tokenizer, list(self.file.alignment_heads or []), start_tokens,
                                [t for t in r.tokens if t < eot], size, offset, slot)
        for s in segments:
            n, s.words = sum(1 for t in s.tokens if t < eot), []
            while words and n > 0:
                n -= len(words[0].tokens)
                s.words.append(words.pop(0))

    @staticmethod
    def _is_silence(r: WindowResult, opts: Options) -> bool:
        """openai's rule: likely no speech and a poorly predicted text; or a no-speech probability above
        no_speech_certain whatever the text (on digital silence tiny.en says " you" with a fair log-probability)."""
        if opts.no_speech_threshold is None:
            return False
        if opts.no_speech_certain is not None and r.no_speech_prob > opts.no_speech_certain:
            return True
        return (r.no_speech_prob > opts.no_speech_threshold
                and opts.logprob_threshold is not None and r.avg_logprob < opts.logprob_threshold)

    def _segments(self, r: WindowResult, offset: float, size: int) -> tuple[list[Segment], int]:
        """Cut a window's tokens into segments at timestamp pairs; the frames to advance the seek by."""
        tok, tokens = self.tokenizer, r.tokens
        is_ts = [x >= tok.timestamp_begin for x in tokens]
        stats = dict(avg_logprob=r.avg_logprob, no_speech_prob=r.no_speech_prob, temperature=r.temperature,
                     compression_ratio=r.compression_ratio)

        def seg(part: list[int], start: float, end: float) -> Segment:
            text = tok.decode([x for x in part if x < tok.eot])
            return Segment(round(offset + start, 3), round(offset + end, 3), text, part, **stats)

        cuts = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
        single_end = len(tokens) >= 2 and is_ts[-1] and not is_ts[-2]
        if cuts:
            if single_end:
                cuts.append(len(tokens))
            out, last = [], 0
            for cut in cuts:
                part = tokens[last:cut]
                out.append(seg(part, tok.timestamp_seconds(part[0]), tok.timestamp_seconds(part[-1])))
                last = cut
            if single_end:
                return [s for s in out if s.text.strip()], size
            return [s for s in out if s.text.strip()], (tokens[last - 1] - tok.timestamp_begin) * FRAMES_PER_TOKEN
        stamps = [x for x in tokens if x >= tok.timestamp_begin]
        duration = size * HOP / SAMPLE_RATE
        if stamps and stamps[-1] != tok.timestamp_begin:
            duration = tok.timestamp_seconds(stamps[-1])
        out = [seg(tokens, 0.0, duration)]
        return [s for s in out if s.text.strip()], size


def _samples(audio) -> np.ndarray:
    """16 kHz mono float32 samples of a path or an array (an empty one is refused)."""
    if isinstance(audio, np.ndarray):
        samples = np.asarray(audio, dtype=np.float32)
        if samples.ndim != 1:
            raise AudioError(f"audio samples must be 1-D (16 kHz mono), got shape {samples.shape}")
    else:
        from pyggml.models.whisper.audio import load_audio
        samples = load_audio(audio)
    if samples.size < HOP:
        raise AudioError(f"audio is empty or shorter than 10 ms ({samples.size} samples at {SAMPLE_RATE} Hz)")
    return samples


def load_whisper(model="tiny.en", backend="CPU", f32: bool = False, gelu: str = "erf", planner: str = "best",
                 n_threads: int | None = None, flash_attn: bool = True, audio_ctx_pad: int = AUDIO_CTX_PAD) -> Whisper:
    """Load a Whisper model: an installed model's name ("tiny.en", "base"), a CTranslate2 directory, a
    whisper.cpp ggml .bin or a Whisper GGUF, on `backend` (a name, "CPU,TORCH_CPU" to split the layers
    across backends with the scheduler, or Backend objects). Quantized matrices run on the CPU's integer
    products where it has them (pyggml.models.whisper.model); `f32` expands F16/quantized matrices to F32;
    `gelu="tanh"` uses whisper.cpp's GELU approximation instead of the erf form; `n_threads` limits the
    CPU backends' threads; `flash_attn=False` attends with mul_mat + soft_max instead of flash_attn_ext;
    `audio_ctx_pad=1` attends over the audio's positions alone instead of whisper.cpp's padded 1536 (see
    pyggml.models.whisper.model); `planner` is the GraphAllocator's ("best" or "ggml")."""
    from pyggml.backend import load_kernels, set_n_threads
    from pyggml.models.whisper.reader import load_whisper_file

    start = time.perf_counter()
    if isinstance(backend, str) and any(name.strip().upper() != "CPU" for name in backend.split(",")):
        from pyggml.backend.registry import load_all
        load_all()  # plugin backends (TORCH_CPU imports torch: only when asked for)
    backends, placement = with_cpu_fallback(backend_list(backend))
    if n_threads is not None:
        for b in backends:
            set_n_threads(b, n_threads)
    for b in backends:  # the kernels load before the weights are read (see CPU's compile_cache.load_cached)
        load_kernels(b)
    w = Whisper(load_whisper_file(model), backends, f32=f32, gelu=gelu, planner=planner, flash_attn=flash_attn,
                placement=placement, audio_ctx_pad=audio_ctx_pad)
    w.timings.load_s = time.perf_counter() - start
    return w
