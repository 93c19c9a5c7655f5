"""Transcripts as text files: plain text, SubRip (srt), WebVTT (vtt) and JSON, as whisper.cpp writes them."""

from __future__ import annotations

import json
from dataclasses import asdict

from pyggml.errors import WhisperError

FORMATS = ("txt", "srt", "vtt", "json")


def _clock(seconds: float, decimal: str) -> str:
    ms = int(round(seconds * 1000))
    h, ms = divmod(ms, 3600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def format_segments(segments, fmt: str) -> str:
    """The segments in one of FORMATS."""
    if fmt == "txt":
        return "".join(s.text.strip() + "\n" for s in segments)
    if fmt == "srt":
        return "".join(f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
                       for i, s in enumerate(segments, 1))
    if fmt == "vtt":
        return "WEBVTT\n\n" + "".join(f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n"
                                      for s in segments)
    if fmt == "json":
        return json.dumps({"text": "".join(s.text for s in segments).strip(),
                           "segments": [asdict(s) for s in segments]}, indent=1) + "\n"
    raise WhisperError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
