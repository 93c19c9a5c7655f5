"""llama.cpp's Unicode tables, where they differ from Python 3.11's unicodedata (Unicode 14)."""

import unicodedata

from pyggml.models.text import unicode_data as ud


def test_categories_follow_llama_cpp_not_the_interpreter():
    assert (ud.category(ord("A")), ud.category(ord("5")), ud.category(ord(",")), ud.category(ord("$"))) == \
        (ud.LETTER, ud.NUMBER, ud.PUNCTUATION, ud.SYMBOL)
    assert (ud.category(0x0301), ud.category(0x200B), ud.category(0x3000)) == (ud.MARK, ud.CONTROL, ud.SEPARATOR)
    # U+1FAE8 SHAKING FACE came with Unicode 15: a symbol to llama.cpp, unassigned to unicodedata 14
    assert ud.category(0x1FAE8) == ud.SYMBOL and unicodedata.category("\U0001fae8") == "Cn"
    assert ud.category(0x0378) == ud.UNDEFINED


def test_whitespace_is_the_white_space_property():
    assert {0x09, 0x20, 0x85, 0xA0, 0x3000} <= ud.WHITESPACE and not {0x1C, 0x200B} & ud.WHITESPACE


def test_lowercase_is_one_codepoint_to_one():
    assert ud.to_lower(ord("A")) == ord("a") and ud.to_lower(ord("a")) == ord("a")
    assert ud.to_lower(0x130) == ord("i")  # İ: str.lower() gives two codepoints
    assert ud.to_lower(ord("Σ")) == ord("σ")


def test_nfd_keeps_the_first_codepoint_only():
    assert ud.nfd_first(ord("é")) == ord("e") and ud.nfd_first(ord("Å")) == ord("A")
    assert ud.nfd_first(ord("e")) == ord("e") and ud.nfd_first(0x1F7D) == 0x3C9
