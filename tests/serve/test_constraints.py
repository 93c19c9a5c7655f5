"""llguidance constraints on a real (truncated Gemma 3) vocabulary: the mask against llguidance's own NumPy
path, walks under JSON-schema and GBNF constraints that end in valid output, per-sequence state, bad grammars."""

import json

import numpy as np
import pytest

from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.text.load import load_tokenizer
from pyggml.serve.constraints import JSON_STYLE, ConstraintFactory
from pyggml.serve.protocol import APIError
from tests.support.serve import write_chat_model

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"},
                                           "tag": {"enum": ["red", "blue"]}},
          "required": ["n", "ok", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    gguf = GGUFFile.open(write_chat_model(tmp_path_factory.mktemp("c") / "m.gguf"))
    tokenizer = load_tokenizer(gguf)
    return ConstraintFactory(tokenizer, tokenizer.n_vocab)


def _walk(factory, constraint, seed=0, limit=200):
    """Sample from random logits under the constraint until an end-of-generation token; the text."""
    rng, tok, out = np.random.default_rng(seed), factory._tokenizer, []
    for _ in range(limit):
        logits = rng.normal(size=factory.n_vocab).astype(np.float32) * 3
        constraint.logits_processor(out, logits)
        token = int(np.argmax(logits))
        constraint.on_token(token)
        if tok.is_eog(token):
            return tok.decode(out)
        out.append(token)
    raise AssertionError(f"no end after {limit} tokens: {tok.decode(out)!r}")


def test_mask_matches_llguidance_numpy_path(factory):
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, apply_token_bitmask_inplace, fill_next_token_bitmask

    c = factory.compile("json_schema", json.dumps(SCHEMA), "response_format")
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), defaults=JSON_STYLE)
    reference = llguidance.LLMatcher(factory.lltokenizer(), grammar, log_level=0)
    for text in ['{"n":', "1", "2,"]:
        logits = np.random.default_rng(1).normal(size=factory.n_vocab).astype(np.float32)
        expected = logits.copy()[None]
        mask = allocate_token_bitmask(1, factory.n_vocab)
        fill_next_token_bitmask(reference, mask)
        apply_token_bitmask_inplace(expected, mask)
        c.logits_processor([], logits)
        np.testing.assert_array_equal(logits, expected[0])
        for t in factory._tokenizer.encode(text, add_special=False):
            c.on_token(t)
            assert reference.consume_token(t)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_walk_gives_valid_json(factory, seed):
    value = json.loads(_walk(factory, factory.compile("json_schema", json.dumps(SCHEMA), "x"), seed))
    assert set(value) == {"n", "ok", "tag"} and isinstance(value["n"], int) and isinstance(value["ok"], bool)
    assert value["tag"] in ("red", "blue")


def test_gbnf_grammar(factory):
    grammar = 'root ::= answer "!"\nanswer ::= "yes" | "no"'
    texts = {_walk(factory, factory.compile("gbnf", grammar, "grammar"), seed) for seed in range(4)}
    assert texts <= {"yes!", "no!"} and texts


def test_each_sequence_has_its_own_state(factory):
    a = factory.compile("gbnf", 'root ::= "ab" | "cd"', "grammar")
    b = factory.compile("gbnf", 'root ::= "ab" | "cd"', "grammar")
    a.on_token(factory._tokenizer.encode("a", add_special=False)[0])
    assert not np.array_equal(a.allowed(), b.allowed())
    assert a.error is None


@pytest.mark.parametrize("kind, text", [("gbnf", "root ::= ("), ("gbnf", "root ::= undefined_rule"),
                                        ("json_schema", "{not json"), ("json_schema", '{"type": "nonsense"}')])
def test_bad_grammars_are_400_naming_the_field(factory, kind, text):
    with pytest.raises(APIError) as e:
        factory.compile(kind, text, "grammar")
    assert e.value.status == 400 and e.value.param == "grammar"
