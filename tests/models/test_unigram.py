"""Unigram (T5-style) on a tiny hand-made vocabulary; llama.cpp's nomic-bert-moe vocabulary, with its
precompiled character map, is in test_llama_cpp_vocabs.py."""

import pytest
from gguf import TokenType

from pyggml.errors import GGUFError
from pyggml.models.text.unigram import CharsMap, UGMTokenizer
from tests.support.vocab_files import write_vocab

TOKENS = [("<pad>", TokenType.CONTROL, 0.0), ("</s>", TokenType.CONTROL, 0.0), ("<unk>", TokenType.UNKNOWN, 0.0),
          ("▁", TokenType.NORMAL, -2.0), ("▁a", TokenType.NORMAL, -1.0), ("b", TokenType.NORMAL, -3.0),
          ("▁ab", TokenType.NORMAL, -5.0), ("c", TokenType.NORMAL, -1.0), ("▁abc", TokenType.NORMAL, -4.5),
          ("<u>", TokenType.USER_DEFINED, -100.0)]


def t5(path, **extra):
    words, types, scores = zip(*TOKENS, strict=True)
    return write_vocab(path, "t5", list(words), list(types), list(scores), add_space_prefix=True, extra=extra)


@pytest.fixture(scope="module")
def ugm(tmp_path_factory):
    return t5(tmp_path_factory.mktemp("ugm") / "t5.gguf")


def names(tok, ids):
    return [tok.tokens[i] for i in ids]


def test_best_total_score_wins(ugm):
    assert isinstance(ugm, UGMTokenizer)
    assert names(ugm, ugm.encode("ab")) == ["▁a", "b", "</s>"]  # -4 beats ▁ab's -5
    assert names(ugm, ugm.encode("abc", add_special=False)) == ["▁abc"]  # -4.5 beats ▁a b c's -5


def test_unknown_runs_become_one_token(ugm):
    # x and y have no token: each costs the lowest normal score minus 10, and the run collapses into one <unk>
    assert names(ugm, ugm.encode("axyb", add_special=False)) == ["▁a", "<unk>", "b"]


def test_spaces_are_escaped_and_prefixed(ugm):
    assert ugm.normalize("a  b") == "▁a▁▁b"
    assert names(ugm, ugm.encode("a b", add_special=False)) == ["▁a", "▁", "b"]


def test_extra_whitespace_removed_when_the_file_says_so(tmp_path):
    tok = t5(tmp_path / "rx.gguf", **{"tokenizer.ggml.remove_extra_whitespaces": True})
    assert tok.normalize("  a   b  ") == "▁a▁b"


def test_user_defined_tokens_are_cut_out_first(ugm):
    assert names(ugm, ugm.encode("a<u>b", add_special=False)) == ["▁a", "<u>", "▁", "b"]


def test_detokenize(ugm):
    ids = ugm.encode("a b")
    assert ugm.decode(ids) == "a b"  # the prefixed space is removed again
    assert ugm.decode(ids, unparse_special=True) == "a b</s>"
    assert ugm.decode(ids, remove_special=True, unparse_special=True) == "a b"


def test_bad_charsmaps_are_gguf_errors():
    with pytest.raises(GGUFError, match="too few"):
        CharsMap(b"\x01\x00", "x.gguf")
    with pytest.raises(GGUFError, match="says 64 bytes"):
        CharsMap(b"\x40\x00\x00\x00" + b"\x00" * 8, "x.gguf")
    trie = CharsMap((8).to_bytes(4, "little") + (5 << 10).to_bytes(4, "little") + b"\0" * 4 + b"x\0", "x.gguf")
    with pytest.raises(GGUFError, match="index .* out of bounds"):
        trie.longest_prefix(b"a", 0)
