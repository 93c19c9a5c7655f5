"""Language detection (whisper.cpp's --detect-language, faster-whisper's detect_language) on the multilingual
base model: the same most likely language as whisper.cpp on espeak-ng speech in five languages, with close
probabilities (references: data/language_refs.json, from language_refs.py)."""

from __future__ import annotations

import json

import pytest

from tests.models.whisper.language_refs import CLIPS, REFERENCES, SPEECH, whisper_cpp_languages
from tests.models.whisper.test_whisper_transcribe import whisper

REFS = json.loads(REFERENCES.read_text())


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_same_language_as_whisper_cpp(name):
    """The top language is whisper.cpp's (and the one spoken); its probability within 0.05 of whisper.cpp's."""
    probs = whisper("base").language_probabilities(SPEECH / name)
    ref = REFS[name]["whisper.cpp"]
    top = next(iter(probs))
    assert top == next(iter(ref)) == CLIPS[name]
    assert abs(probs[top] - ref[top]) < 0.05
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-4)
    assert list(probs.values()) == sorted(probs.values(), reverse=True)


def test_english_only_model_is_english():
    assert whisper("tiny.en").language_probabilities(SPEECH / "de1.wav") == {"en": 1.0}


def test_cli_detect_language(capsys):
    from pyggml.cli.main import main

    whisper("base")
    assert main(["transcribe", "--model", "base", "--detect-language", str(SPEECH / "de1.wav")]) == 0
    out = capsys.readouterr().out
    assert "de1.wav: language de (p = 0.9" in out


@pytest.mark.peer
def test_against_whisper_cpp_live(tmp_path):
    """The committed references are whisper.cpp's output today (pywhispercpp installed)."""
    pytest.importorskip("pywhispercpp.model", reason="pywhispercpp (whisper.cpp) is not installed")
    from tests.support.whisper_peers import ggml_bin

    name = "es1.wav"
    live = whisper_cpp_languages(ggml_bin("base", tmp_path), SPEECH / name)
    assert next(iter(live)) == next(iter(REFS[name]["whisper.cpp"]))
    assert live[next(iter(live))] == pytest.approx(REFS[name]["whisper.cpp"][next(iter(live))], abs=1e-3)
