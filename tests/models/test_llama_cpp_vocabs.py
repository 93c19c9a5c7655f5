"""llama.cpp's own tokenizer test set: every vocabulary of its models/ggml-vocab-*.gguf loads, and each one with
an .inp/.out pair tokenizes those texts to exactly llama.cpp's ids (test-tokenizer-0: no special tokens added or
parsed) and detokenizes the ids back the way llama.cpp does."""

import pytest

from tests.support.llama_cpp_vocabs import VOCABS, WITH_TESTS, VocabSet, read_cases


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    return VocabSet(tmp_path_factory.mktemp("llama_cpp_vocabs"))


@pytest.mark.parametrize("vocab", VOCABS)
def test_vocabulary_loads(vocabs, vocab):
    tok = vocabs.tokenizer(vocab)
    assert tok.n_vocab > 1000


@pytest.mark.parametrize("vocab", WITH_TESTS)
def test_tokenizes_like_test_tokenizer_0(vocabs, vocab):
    tok = vocabs.tokenizer(vocab)
    cases = read_cases(vocab)
    assert len(cases) >= 40
    wrong = [(text, tok.encode(text, add_special=False), ids) for text, ids in cases
             if tok.encode(text, add_special=False) != ids]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]}"
