"""/v1/audio/transcriptions and /v1/audio/translations with OpenAI's multipart fields and response formats
(json, text, srt, vtt, verbose_json with word and segment timestamps), on pyggml's Whisper. A Whisper model
decodes one file at a time, so requests take turns on it in a worker thread."""

from __future__ import annotations

import os
import tempfile

from pyggml.errors import WhisperError
from pyggml.serve.protocol import APIError
from pyggml.serve.state import ServerState, run_blocking

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("word", "segment")
MAX_UPLOAD = 25 * 1024 * 1024  # OpenAI's limit
LONG_AUDIO_S = 60.0              # longer uploads are transcribed in batches of LONG_AUDIO_BATCH chunks
LONG_AUDIO_BATCH = 8


def read_form(form, task: str) -> dict:
    """The form's fields, checked; `timestamp_granularities[]` is read as the OpenAI client sends it."""
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise APIError("'file' (the audio, as a multipart file) is required", param="file")
    fmt = form.get("response_format") or "json"
    if fmt not in FORMATS:
        raise APIError(f"'response_format' must be one of {', '.join(FORMATS)}, got {fmt!r}", param="response_format")
    granularities = form.getlist("timestamp_granularities[]") or form.getlist("timestamp_granularities")
    for g in granularities:
        if g not in GRANULARITIES:
            raise APIError(f"'timestamp_granularities[]' values must be word or segment, got {g!r}",
                           param="timestamp_granularities[]")
    if granularities and fmt != "verbose_json":
        raise APIError("'timestamp_granularities[]' needs response_format verbose_json",
                       param="timestamp_granularities[]")
    try:
        temperature = float(form.get("temperature") or 0.0)
    except ValueError:
        raise APIError(f"'temperature' must be a number, got {form.get('temperature')!r}",
                       param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise APIError(f"'temperature' must be in [0, 1], got {temperature}", param="temperature")
    language = form.get("language") or None
    if task == "translate" and language is not None:
        raise APIError("translations take no 'language': the output is English", param="language")
    return {"upload": upload, "model": form.get("model"), "format": fmt, "words": "word" in granularities,
            "temperature": temperature, "language": language, "prompt": form.get("prompt") or None}


async def transcribe(state: ServerState, form, task: str):
    """(body, media type): a dict for the JSON formats, text for the others."""
    fields = read_form(form, task)
    whisper = state.whisper_model(fields["model"])
    if task == "translate" and not whisper.is_multilingual:
        raise APIError("this Whisper model is English-only and cannot translate", param="model")
    data = await fields["upload"].read()
    if not data:
        raise APIError("'file' is empty", param="file")
    if len(data) > MAX_UPLOAD:
        raise APIError(f"'file' is {len(data)} bytes; the limit is {MAX_UPLOAD}", status=413, param="file")
    suffix = os.path.splitext(fields["upload"].filename or "")[1] or ".wav"
    state.admit()
    outcome = "error"
    try:
        result = await run_blocking(_run, state, whisper, data, suffix, fields, task)
        outcome = "completed"
        return result
    except WhisperError as e:  # undecodable audio, unknown language: the request's fault
        raise APIError(str(e), param="language" if "language" in str(e) else "file") from None
    finally:
        state.release(1, outcome)


def _run(state: ServerState, whisper, data: bytes, suffix: str, fields: dict, task: str):
    from pyggml.models.whisper import load_audio
    from pyggml.models.whisper.formats import format_segments
    from pyggml.models.whisper.transcribe import TEMPERATURES

    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(data)
        f.flush()
        samples = load_audio(f.name)
    t = fields["temperature"]
    with state.whisper_lock:
        language = fields["language"] or _language(whisper, samples)
        segments = whisper.transcribe(samples, language=language, task=task, initial_prompt=fields["prompt"],
                                      temperatures=TEMPERATURES if t == 0.0 else (t,),
                                      word_timestamps=fields["words"], batch_size=_batch_size(samples, t))
        duration = whisper.timings.audio_s
    text = "".join(s.text for s in segments).strip()
    fmt = fields["format"]
    if fmt == "json":
        return {"text": text}, "application/json"
    if fmt == "text":
        return text + "\n", "text/plain"
    if fmt in ("srt", "vtt"):
        return format_segments(segments, fmt), "text/vtt" if fmt == "vtt" else "text/plain"
    return _verbose(segments, text, language, duration, task, fields["words"]), "application/json"


def _batch_size(samples, temperature: float) -> int | None:
    """Long audio (over LONG_AUDIO_S) at the default temperature is transcribed in batches of VAD-cut chunks
    (Whisper.transcribe's batch_size, faster-whisper's batched pipeline); shorter audio, or a temperature
    asked for, as one sequence of windows with the temperature fallback."""
    return LONG_AUDIO_BATCH if temperature == 0.0 and samples.size > LONG_AUDIO_S * 16000 else None


def _language(whisper, samples) -> str:
    """The spoken language (English-only models: en), from the first 30 s window."""
    if not whisper.is_multilingual:
        return "en"
    from pyggml.models.whisper.model import N_FRAMES

    mel, _ = whisper.log_mel(samples)
    return whisper.detect_language(mel[:, :N_FRAMES])[0]


def _verbose(segments, text: str, language: str, duration: float, task: str, words: bool) -> dict:
    out = {"task": task, "language": language, "duration": round(duration, 3), "text": text,
           "segments": [{"id": i, "seek": round(s.start * 100), "start": s.start, "end": s.end, "text": s.text,
                         "tokens": s.tokens,
                         "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                         "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}
                        for i, s in enumerate(segments)]}
    if words:
        out["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                        for s in segments for w in (s.words or [])]
    return out
