"""Conversation: later turns decode only what changed since the last one (the KV cache keeps the common prefix)
and answer exactly as a fresh run over the same history; the oldest turns go when the context would overflow."""

import pytest

from pyggml.errors import ParameterError
from pyggml.models import load_model
from pyggml.models.llm.conversation import Conversation
from tests.support.serve import write_chat_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(write_chat_model(tmp_path_factory.mktemp("conv") / "tiny.gguf"), n_ctx=256)


def test_a_later_turn_reuses_the_cache_and_answers_as_a_fresh_run(model):
    conv = Conversation(model, system="Be brief.", reply_room=8)
    "".join(conv.reply("Hi"))
    history = [dict(t) for t in conv.turns]
    second = "".join(conv.reply("And then?"))
    full = len(model.tokenize(model.chat_prompt(conv.messages[:-1]), add_special=True, parse_special=True))
    assert 0 < conv.last["prompt_tokens"] < full // 2

    fresh = Conversation(model, system="Be brief.", reply_room=8)
    fresh.turns = history
    model.reset()
    fresh.cached = []
    assert "".join(fresh.reply("And then?")) == second
    assert fresh.last["prompt_tokens"] == full


def test_the_oldest_turns_are_dropped_to_fit(model):
    conv = Conversation(model, reply_room=100)
    dropped = 0
    for _ in range(6):
        "".join(conv.reply("one two three four five six seven eight nine ten"))
        dropped += conv.dropped
        assert len(conv.cached) <= model.n_ctx and conv.turns[0]["role"] == "user"
    assert dropped >= 2


def test_a_message_that_cannot_fit_is_refused_and_forgotten(model):
    conv = Conversation(model, reply_room=200)
    with pytest.raises(ParameterError, match="does not fit the context of 256 tokens"):
        "".join(conv.reply("word " * 100))
    assert conv.turns == []
