"""The text output: pieces handed out token by token (or several at once) add up to the whole decode, cut at
the first stop string; incomplete UTF-8 and possible stop beginnings wait; the space clean-up stays exact."""

import numpy as np
import pytest

from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.llm.text_output import TextOutput
from pyggml.models.text.load import load_tokenizer

from tests.support.tiny_models import DATA

TEXT = ("Hello , world ! It 's fine . They 're ' quoted ' here ; we 've got 😀 and Ça va ? "
        "def f(x):\n    return x  # done .")


def _tokenizer(name):
    with GGUFFile.open(DATA / name) as f:
        return load_tokenizer(f)


@pytest.fixture(scope="module", params=["bpe_vocabs/gpt-2.gguf", "bpe_vocabs/llama3.gguf", "bpe_vocabs/smollm.gguf",
                                        "spm_vocabs/gemma3.gguf"])
def tokenizer(request):
    return _tokenizer(request.param)


def _streams(tokenizer, ids, chunks, stop=()):
    """The pieces of ids fed `chunks` at a time, then the final flush."""
    out = TextOutput(tokenizer, stop)
    pieces = [out.add(ids[i:i + chunks]) for i in range(0, len(ids), chunks)]
    return pieces + [out.add([], final=True)], out


@pytest.mark.parametrize("chunks", [1, 3])
def test_pieces_add_up_to_the_whole_decode(tokenizer, chunks):
    rng = np.random.default_rng(0)
    texts = [tokenizer.encode(TEXT, add_special=False),
             [int(t) for t in rng.integers(0, tokenizer.n_vocab, 300)]]  # byte tokens cut characters too
    for ids in texts:
        pieces, _ = _streams(tokenizer, ids, chunks)
        assert "".join(pieces) == tokenizer.decode(ids)
        assert all("\ufffd" not in p for p in pieces[:-1]) or "\ufffd" in tokenizer.decode(ids)


def test_space_clean_up_is_exact_across_tokens():
    tokenizer = _tokenizer("bpe_vocabs/gpt-2.gguf")
    assert tokenizer.clean_spaces
    ids = tokenizer.encode(TEXT, add_special=False)
    assert tokenizer.decode(ids) != TEXT  # the clean-up rewrote something
    pieces, _ = _streams(tokenizer, ids, 1)
    assert "".join(pieces) == tokenizer.decode(ids)


@pytest.mark.parametrize("chunks", [1, 4])
def test_stop_string_cuts_the_text_and_is_never_sent(tokenizer, chunks):
    ids = tokenizer.encode(TEXT, add_special=False)
    whole = tokenizer.decode(ids)
    for stop in ["they", "quoted", " 😀", "done ."]:
        pieces, out = _streams(tokenizer, ids, chunks, stop=[stop, "never there"])
        cut = whole.find(stop)
        assert out.stopped == (cut >= 0)
        assert "".join(pieces) == (whole[:cut] if cut >= 0 else whole)


def test_a_possible_stop_beginning_waits_for_the_next_token():
    tokenizer = _tokenizer("bpe_vocabs/gpt-2.gguf")
    out = TextOutput(tokenizer, ["ab"])
    a, c = tokenizer.encode("a", add_special=False), tokenizer.encode("c", add_special=False)
    assert out.add(a) == ""        # may begin "ab"
    assert out.add(c) == "ac"
    assert out.add(a, final=True) == "a"
