"""The engine's slot controls llama-server exposes: a request pinned to a slot (id_slot), a request that reads
its whole prompt (cache_prompt false), and an idle slot's cache saved to a file, restored into another slot and
erased."""

import pytest

from pyggml.errors import ParameterError
from pyggml.models import load_model
from pyggml.models.llm.engine import Done, Engine, Request
from pyggml.models.llm.generate import SamplingParams
from tests.support.tiny_models import bpe_vocab, write_llama

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tmp_path_factory.mktemp("slots") / "m.gguf"
    vocab = bpe_vocab()
    write_llama(path, vocab=vocab, n_vocab=vocab.n_tokens)
    with Engine(load_model(path, n_ctx=256), n_slots=3) as e:
        yield e


def _run(engine, prompt, **kw) -> tuple[list[int], Done]:
    events = list(engine.submit(Request(prompt=prompt, max_tokens=4, sampling=GREEDY, ignore_eos=True, **kw)))
    return [e.id for e in events[:-1]], events[-1]


def test_a_pinned_request_runs_in_its_slot_and_cache_prompt_false_reads_everything(engine):
    prompt = list(range(10, 40))
    for slot in (2, 0, 1):
        assert _run(engine, prompt, slot=slot)[1].slot == slot
    again = _run(engine, prompt, slot=1)[1]
    assert again.cached_tokens == len(prompt) - 1
    assert _run(engine, prompt, slot=1, cache_prompt=False)[1].cached_tokens == 0
    with pytest.raises(ParameterError):
        engine.submit(Request(prompt=prompt, slot=3))


def test_save_restore_erase(engine, tmp_path):
    prompt = list(range(50, 90))
    tokens, done = _run(engine, prompt, slot=0)
    n = engine.save_slot(0, tmp_path / "s.npz").result()
    assert n == len(prompt) + len(tokens) - 1  # the last sampled token was never fed
    for slot in range(3):
        assert engine.erase_slot(slot).result() >= 0
    assert engine.restore_slot(2, tmp_path / "s.npz").result() == n
    info = {i: cached for i, _, cached in engine.slots_info().result()}
    assert len(info[2]) == n and info[0] == info[1] == []
    again, done = _run(engine, prompt, slot=2)
    assert again == tokens and done.cached_tokens == len(prompt) - 1
    with pytest.raises(ParameterError):
        engine.save_slot(7, tmp_path / "x.npz").result()
