"""BPE pre-tokenizers: llama.cpp's regexes, run on its collapsed text with its Unicode classes. Their agreement
with llama.cpp on whole vocabularies is in test_tokenizer.py (one small trained vocabulary per pre-tokenizer
type) and test_llama_cpp_vocabs.py; here are the translation rules and the quirks they must keep."""

import re

import pytest

from pyggml.models.text.pre_tokenizer import PRE_TOKENIZERS, _collapse, _translate


def split(name, text):
    return PRE_TOKENIZERS[name].split(text)


def test_collapsed_text_has_one_class_byte_per_codepoint():
    assert _collapse("aé1٣,«$€\u0301\u3000\x1c🦙") == "a\xd21\xd1,\xd3$\xd5\xd4\x0b\x1c\xd5"
    assert _collapse("\ue000\u0378") == "\xd0\xd0"  # private use and unassigned: neither letter nor anything else


def test_translation_to_python_regex():
    assert _translate(r"\p{L}+", True) == r"[\xd2A-Za-z]+"
    assert _translate(r"[^\s\p{N}]", True) == r"[^\t\n\x0b\f\r \xd10-9]"
    assert _translate(r"\s+(?!\S)", False) == r"[\t\n\x0b\f\r ]+(?![^\t\n\x0b\f\r ])"
    assert _translate(r"\s+$", False) == r"[\t\n\x0b\f\r ]+\Z"  # ECMAScript's $: the very end only
    assert re.fullmatch(_translate(r"[\p{P}\$\+<=>\^~\|`]+", True), "!$+<=>^~|`\xd3\xd5") is None  # symbols ≠ P
    assert re.fullmatch(_translate(r"[\p{P}\$\+<=>\^~\|`]+", True), "!$+<=>^~|`\xd3")


def test_whitespace_is_c_locale_plus_non_ascii_white_space():
    # \x1c-\x1f are whitespace to Python but not to llama.cpp; U+3000 and U+00A0 are, through the collapse
    assert split("gpt-2", "a\x1cb") == ["a", "\x1c", "b"]
    assert split("gpt-2", "a\u3000\u3000 b") == ["a", "\u3000\u3000", " b"]  # \s+(?!\S)
    assert split("llama3", "a\u3000\u3000b") == ["a", "\u3000", "\u3000b"]  # [^\r\n\p{L}\p{N}]?\p{L}+


def test_cased_word_regexes_treat_non_ascii_letters_as_not_lowercase():
    assert split("gpt-4o", "HelloWorld XMLHttp") == ["Hello", "World", " XMLHttp"]
    assert split("gpt-4o", "ÀbC") == ["Àb", "C"]
    assert split("tekken", "I'M you'RE") == ["I", "'M", " you", "'RE"]
    assert split("gpt-4o", "I'M you'RE 12345") == ["I'M", " you'RE", " ", "123", "45"]


def test_every_regex_splits_the_pieces_of_the_previous_one():
    # deepseek-llm's third regex takes ASCII letters too ([:-~]), so it splits words the second one kept whole
    assert split("deepseek-llm", " wörld  ") == [" w", "ö", "rld", "  "]
    assert split("deepseek-coder", "foo123 bar") == ["foo", "1", "2", "3", " bar"]
    assert split("falcon", "x=1234;") == ["x", "=", "123", "4", ";"]


def test_sentencepiece_style_bpe_splits_only_at_newlines():
    gemma4 = PRE_TOKENIZERS["gemma4"]
    assert gemma4.split("a▁b\n\nc") == ["a▁b", "\n\n", "c"]
    assert (gemma4.byte_encode, gemma4.escape_whitespaces, gemma4.force_bos) == (False, True, True)


@pytest.mark.parametrize("name,flags", [
    ("qwen2", (False, False, None)), ("llama-bpe", (True, True, True)), ("smollm", (False, False, None)),
    ("starcoder", (True, False, None)), ("tekken", (False, True, True)), ("llama4", (False, False, None)),
])
def test_names_carry_llama_cpp_flags(name, flags):
    pre = PRE_TOKENIZERS[name]
    assert (pre.clean_spaces, pre.ignore_merges, pre.add_bos) == flags


def test_empty_text_has_no_words():
    assert all(pre.split("") == [] for pre in PRE_TOKENIZERS.values())
