"""llama.cpp's own tokenizer test set: every vocabulary of its models/ggml-vocab-*.gguf loads, and each one with
an .inp/.out pair tokenizes those texts to exactly llama.cpp's ids (test-tokenizer-0: no special tokens added or
parsed) and detokenizes the ids back the way llama.cpp does."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.llama_cpp_vocabs import VOCABS, WITH_TESTS, VocabSet, corpus_refs, read_cases


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    return VocabSet(tmp_path_factory.mktemp("llama_cpp_vocabs"))


@pytest.fixture(scope="module")
def vocab(request):
    """The vocabulary's name; module-scoped, so pytest runs a vocabulary's tests together and holds one at a time."""
    return request.param


@pytest.fixture(scope="module")
def tok(vocabs, vocab):
    return vocabs.load(vocab)


@pytest.mark.parametrize("vocab", VOCABS, indirect=True)
def test_vocabulary_loads(tok, vocab):
    assert tok.n_vocab > 1000


@pytest.mark.parametrize("vocab", WITH_TESTS, indirect=True)
def test_tokenizes_like_test_tokenizer_0(tok, vocab):
    cases = read_cases(vocab)
    assert len(cases) >= 40
    wrong = [(text, tok.encode(text, add_special=False), ids) for text, ids in cases
             if tok.encode(text, add_special=False) != ids]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]}"


# -- a corpus of our own, against llama-cpp-python's recorded results (tests/models/data/make_vocab_refs.py) --------


def corpus_differences(tok, vocab):
    """Every way pyggml's ids or detokenized bytes differ from llama.cpp's on the corpus."""
    refs = corpus_refs()
    wrong = []
    for text, ref in zip(refs["texts"], refs["vocabs"][vocab], strict=True):
        got = {
            "ids_plain": tok.encode(text, add_special=False),
            "ids_special": tok.encode(text, add_special=True, parse_special=True),
            "detok_plain": tok.decode_bytes(ref["ids_plain"]).hex(),
            "detok_special": tok.decode_bytes(ref["ids_special"], unparse_special=True).hex(),
            "detok_special_removed": tok.decode_bytes(ref["ids_special"], True, True).hex(),
        }
        wrong += [(text, key, got[key], ref[key]) for key in got if got[key] != ref[key]]
    return wrong


@pytest.mark.parametrize("vocab", VOCABS, indirect=True)
def test_corpus_matches_llama_cpp(tok, vocab):
    assert len(corpus_refs()["texts"]) >= 50
    wrong = corpus_differences(tok, vocab)
    assert not wrong, f"{len(wrong)} differences, first: {wrong[0]}"


@pytest.mark.parametrize("vocab", WITH_TESTS, indirect=True)
def test_test_set_ids_detokenize_like_llama_cpp(tok, vocab):
    expected = corpus_refs()["test_set_detok"][vocab]
    assert [tok.decode_bytes(ids).hex() for _, ids in read_cases(vocab)] == expected


@pytest.mark.parametrize("vocab", VOCABS, indirect=True)
def test_round_trips_exactly_where_llama_cpp_does(tok, vocab):
    """detokenize(tokenize(x)) == x, the check of llama.cpp's test-tokenizer-random: byte-level BPE vocabularies
    without space cleaning give back every text; normalizing ones (WordPiece, unigram) and cleaned spaces do not."""
    refs = corpus_refs()
    detok = dict(zip(refs["texts"], (bytes.fromhex(ref["detok_plain"]) for ref in refs["vocabs"][vocab]), strict=True))
    if vocab in WITH_TESTS:  # and the test set's texts, detokenized from llama.cpp's ids
        detok.update(zip((text for text, _ in read_cases(vocab)), map(bytes.fromhex, refs["test_set_detok"][vocab]),
                         strict=True))
    ours = {text for text in detok if tok.decode_bytes(tok.encode(text, add_special=False)) == text.encode()}
    assert ours == {text for text, back in detok.items() if back == text.encode()}
    if vocab in ("qwen2", "qwen35", "deepseek-llm", "deepseek-coder", "command-r"):
        assert len(ours) == len(detok)


@pytest.mark.peer
@pytest.mark.parametrize("vocab", VOCABS, indirect=True)
def test_live_llama_cpp_python_agrees(vocabs, tok, vocab):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    llm = llama_cpp.Llama(str(vocabs.path(vocab)), vocab_only=True, verbose=False)
    texts = corpus_refs()["texts"] + [text for text, _ in (read_cases(vocab) if vocab in WITH_TESTS else [])]
    try:
        for text in texts:
            for special in (False, True):
                assert tok.encode(text, add_special=special, parse_special=special) == \
                    llm.tokenize(text.encode(), add_bos=special, special=special), (text, special)
    finally:
        llm.close()


LIVE_FUZZED = ("deepseek-llm", "qwen35", "bert-bge", "nomic-bert-moe", "gemma-4")
FUZZ_ALPHABET = "a É1 \n\r\t'sé中👍<>/"  # characters whose runs the pre-tokenizers split differently


@pytest.fixture(scope="module")
def live(vocabs):
    """Each fuzzed vocabulary's tokenizer with llama-cpp-python's, loaded once."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    pairs = {v: (vocabs.load(v), llama_cpp.Llama(str(vocabs.path(v)), vocab_only=True, verbose=False))
             for v in LIVE_FUZZED}
    yield pairs
    for _, llm in pairs.values():
        llm.close()


@pytest.mark.peer
@settings(max_examples=40, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=40) | st.text(FUZZ_ALPHABET, max_size=20))
def test_random_text_agrees_with_live_llama_cpp_python(live, text):
    for vocab, (tok, llm) in live.items():
        for special in (False, True):
            assert tok.encode(text, add_special=special, parse_special=special) == \
                llm.tokenize(text.encode(), add_bos=special, special=special), (vocab, special)
