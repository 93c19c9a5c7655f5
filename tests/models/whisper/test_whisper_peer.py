"""whisper.cpp (pywhispercpp) loads and transcribes the ggml .bin files pyggml writes."""

import re

import pytest

from pyggml.models.whisper.ggml_bin import write_ggml_bin

from tests.support.whisper_peers import whisper_cpp_text

pytestmark = pytest.mark.peer


def words(text):
    return re.sub(r"[^a-z0-9 ]", "", text.lower()).split()


@pytest.mark.parametrize("wtype", ["f16", "q8_0"])
def test_whisper_cpp_transcribes_our_file(tiny_en, speech, tmp_path, wtype, monkeypatch):
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")
    pytest.importorskip("pywhispercpp.model", reason="pywhispercpp (whisper.cpp) is not installed")
    path = tmp_path / f"ggml-tiny.en-{wtype}.bin"
    write_ggml_bin(tiny_en, path, weight_type=wtype)
    text = whisper_cpp_text(path, speech["en1.wav"]["path"], 1, "en")
    expected = words(speech["en1.wav"]["text"].replace("two", "2"))
    assert words(text) == expected
