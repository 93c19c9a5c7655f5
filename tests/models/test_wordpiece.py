"""WordPiece (BERT) on a tiny hand-made vocabulary; llama.cpp's bert-bge test set is in test_llama_cpp_vocabs.py."""

import pytest
from gguf import TokenType

from pyggml.errors import GGUFError
from pyggml.models.text.wordpiece import WPMTokenizer
from tests.support.vocab_files import write_vocab

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["▁hello", "▁world", "▁un", "aff", "able", "▁!", "▁,", "▁$", "▁中", "▁cafe", "▁e", "€", "▁x€"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    types = [TokenType.CONTROL] * len(SPECIAL) + [TokenType.NORMAL] * len(WORDS)
    return write_vocab(tmp_path_factory.mktemp("wpm") / "bert.gguf", "bert", SPECIAL + WORDS, types,
                       unk_token_id=1, bos_token_id=2, sep_token_id=3, pad_token_id=0)


def names(tok, ids):
    return [tok.tokens[i] for i in ids]


def test_cls_words_sep(bert):
    assert isinstance(bert, WPMTokenizer)
    assert names(bert, bert.encode("Hello, WORLD!")) == ["[CLS]", "▁hello", "▁,", "▁world", "▁!", "[SEP]"]
    assert names(bert, bert.encode("hello", add_special=False)) == ["▁hello"]


def test_longest_match_first_and_unknown_words(bert):
    assert names(bert, bert.encode("unaffable", add_special=False)) == ["▁un", "aff", "able"]
    # one position without a token makes the whole word unknown, not only its tail
    assert names(bert, bert.encode("unaffablex hello", add_special=False)) == ["[UNK]", "▁hello"]


def test_normalizer_lowercases_drops_accents_and_controls(bert):
    assert names(bert, bert.encode("CAFÉ\x07", add_special=False)) == ["▁cafe"]
    assert bert.words("Ça\u0301 va\tbien\u3000ok") == ["ca", "va", "bien", "ok"]


def test_pre_tokenizer_splits_punctuation_ascii_symbols_and_cjk(bert):
    assert bert.words("a$b x€y 中文") == ["a", "$", "b", "x€y", "中", "文"]
    assert names(bert, bert.encode("x€ 中", add_special=False)) == ["▁x€", "▁中"]


def test_cased_vocabulary_keeps_case(tmp_path):
    types = [TokenType.CONTROL] * len(SPECIAL) + [TokenType.NORMAL] * 2
    cased = write_vocab(tmp_path / "cased.gguf", "bert", SPECIAL + ["▁Hello", "▁hello"], types, unk_token_id=1,
                        bos_token_id=2, sep_token_id=3,
                        extra={"tokenizer.ggml.normalizer.lowercase": False})
    assert names(cased, cased.encode("Hello hello", add_special=False)) == ["▁Hello", "▁hello"]
    assert cased.words("Ça") == ["Ça"]  # strip_accents follows lowercase unless the file says otherwise


def test_vocabulary_without_sep_token_is_a_gguf_error(tmp_path):
    with pytest.raises(GGUFError, match=r"needs a \[SEP\] token"):
        write_vocab(tmp_path / "nosep.gguf", "bert", ["[UNK]", "[CLS]", "▁a"], [2, 3, 1], unk_token_id=0,
                    bos_token_id=1)


def test_detokenize_joins_words_with_spaces_and_cleans_them(bert):
    ids = bert.encode("Hello, world!")
    assert bert.decode(ids) == " hello, world!"
    assert bert.decode(ids, remove_special=True, unparse_special=True) == " hello, world![SEP]"
    assert bert.decode(ids, unparse_special=True) == "[CLS] hello, world![SEP]"
