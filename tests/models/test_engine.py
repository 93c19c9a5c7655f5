"""The engine: many requests through a few slots give exactly what each gets alone, prefixes are reused,
requests wait for cells rather than fail, cancels free cells, callbacks and async iteration work."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pyggml.core import GGMLType
from pyggml.errors import GGMLError, ParameterError
from pyggml.models import load_model
from pyggml.models.llm.engine import Done, Engine, Request, Token, log_sum_exp, top_tokens
from pyggml.models.llm.generate import SamplingParams

from tests.support.tiny_models import bpe_vocab, write_llama


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "llama.gguf"
    write_llama(path, n_ctx=512)
    return path


def _model(path, n_ctx=256):
    return load_model(path, n_ctx=n_ctx, n_batch=32, kv_type=GGMLType.F32)


def alone(model, request: Request, max_new: int) -> tuple[list[int], str]:
    """What a request gets decoded by itself, greedy: its tokens cut after EOS or the token that completes a
    stop string, and the finish reason."""
    out = list(model.generate_tokens(request.prompt, max_new)) if max_new else []
    for i, t in enumerate(out):
        text = model.detokenize([u for u in out[:i + 1] if not model.tokenizer.is_eog(u)])
        if model.tokenizer.is_eog(t) or any(s in text for s in request.stop):
            return out[:i + 1], "stop"
    return out, "length"


def _consume(handle, cancel_after=None):
    tokens, text = [], ""
    for event in handle:
        if isinstance(event, Token):
            tokens.append(event.id)
            text += event.text
            if cancel_after is not None and len(tokens) == cancel_after:
                handle.cancel()
        else:
            return tokens, text, event


@pytest.mark.parametrize("n_requests", [60, pytest.param(200, marks=pytest.mark.long_only)])
def test_random_requests_through_sixteen_slots_get_what_each_gets_alone(model_path, n_requests):
    """Random prompt lengths (many sharing prefixes), token limits (some -1), stop strings and cancels, on a
    cache too small for all 16 slots at once: each finished request has exactly its lone greedy tokens and
    reason, each cancelled one a prefix of them; afterwards only the kept prefixes hold cells, and none after
    close."""
    rng = np.random.default_rng(7)
    model = _model(model_path)
    bases = [rng.integers(3, 64, 24).tolist() for _ in range(6)]
    pieces = [model.detokenize([t]) for t in range(3, 64)]
    requests, cancels = [], []
    for _ in range(n_requests):
        prompt = (bases[rng.integers(6)][:int(rng.integers(0, 24))] if rng.random() < 0.5 else [])
        prompt = prompt + rng.integers(3, 64, int(rng.integers(1, 16))).tolist()
        stop = tuple(pieces[int(i)][:int(rng.integers(1, 4))] for i in rng.integers(0, 61, int(rng.integers(0, 3))))
        max_tokens = int(rng.choice([-1, 0, 1, 3, 8, 20]))
        requests.append(Request(prompt, max_tokens=max_tokens, stop=tuple(s for s in stop if s)))
        cancels.append(None if rng.random() < 0.8 else ("queued" if rng.random() < 0.5 else int(rng.integers(0, 4))))
    limit = [r.max_tokens if r.max_tokens >= 0 else max(256 // 16, len(r.prompt) + 1) - len(r.prompt)
             for r in requests]
    expected = [alone(model, r, n) for r, n in zip(requests, limit, strict=True)]
    seen_waiting = []
    with Engine(model, n_slots=16) as engine:
        handles = [engine.submit(r) for r in requests]
        for h, c in zip(handles, cancels, strict=True):
            if c == "queued":
                h.cancel()
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(_consume, h, c if isinstance(c, int) else None)
                       for h, c in zip(handles, cancels, strict=True)]
            while not all(f.done() for f in futures):
                stats = engine.stats()
                seen_waiting.append(stats.waiting_for_cells and stats.queued > 0)
                time.sleep(0.01)
            results = [f.result() for f in futures]
        for (tokens, text, done), (want, reason), c, r in zip(results, expected, cancels, requests, strict=True):
            if done.finish_reason == "cancelled":
                assert c is not None and tokens == want[:len(tokens)]
                continue
            assert (tokens, done.finish_reason) == (want, reason)
            assert done.completion_tokens == len(want) and done.prompt_tokens == len(r.prompt)
            if reason == "stop" and r.stop and not model.tokenizer.is_eog(want[-1]):
                assert not any(s in text for s in r.stop)
        kept = engine.call(lambda m: [(m.cells.seq_cells(s.seq_id), len(s.cached)) for s in engine.slots]).result()
        assert all(n_cells == n_tokens for n_cells, n_tokens in kept)
        stats = engine.stats()
        assert stats.slots_busy == 0 and stats.queued == 0 and stats.cached_tokens > 0
        assert stats.kv_cells_used == model.cells.used <= sum(n for n, _ in kept)
    assert any(seen_waiting)
    assert model.cells.used == 0


def test_a_request_waits_for_cells_and_the_wait_shows(model_path):
    model = _model(model_path, n_ctx=64)
    release = threading.Event()
    with Engine(model, n_slots=2) as engine:
        first = engine.submit(Request(list(range(3, 33)), max_tokens=20,
                                      logits_processor=lambda ids, row: release.wait(10)))
        second = engine.submit(Request(list(range(4, 34)), max_tokens=20))
        for _ in range(500):
            stats = engine.stats()
            if stats.waiting_for_cells:
                break
            threading.Event().wait(0.01)
        assert stats.waiting_for_cells and stats.queued == 1 and stats.slots_busy == 1
        release.set()
        assert _consume(first)[2].finish_reason == "length"
        assert _consume(second)[2].finish_reason == "length"


def test_a_repeated_prompt_reuses_its_cached_prefix_and_gives_the_same_tokens(model_path):
    model = _model(model_path)
    prompt = list(range(5, 40))
    with Engine(model, n_slots=2) as engine:
        first = _consume(engine.submit(Request(prompt, max_tokens=6)))
        again = _consume(engine.submit(Request(prompt, max_tokens=6)))
        longer = _consume(engine.submit(Request(prompt + first[0][:3] + [7], max_tokens=4)))
    assert first[0] == again[0] and again[2].cached_tokens == len(prompt) - 1
    assert longer[2].cached_tokens == len(prompt) + 3


def test_callbacks_logprobs_seeds_and_async_iteration(model_path):
    model = _model(model_path)
    seen, told = [], []

    def ban_argmax(ids, row):
        seen.append(list(ids))
        row[np.argmax(row)] = -np.inf

    sampling = SamplingParams(temperature=0.8, seed=3)
    with Engine(model, n_slots=3) as engine:
        banned = _consume(engine.submit(Request([5, 6, 7], max_tokens=4, logits_processor=ban_argmax,
                                                on_token=told.append, n_probs=3)))
        sampled = [_consume(engine.submit(Request([5, 6, 7], max_tokens=6, sampling=sampling)))[0] for _ in range(2)]

        async def run():
            return [event async for event in engine.submit(Request([5, 6, 7], max_tokens=3, n_probs=2))]

        events = asyncio.run(run())
        assert engine.call(lambda m: m.n_vocab).result() == 64
    assert seen == [banned[0][:i] for i in range(4)] and told == banned[0]
    assert sampled[0] == sampled[1]  # one seed, one draw sequence, whatever ran beside it
    assert [type(e) for e in events] == [Token, Token, Token, Done]
    assert all(len(e.top) == 2 and e.top[0][1] >= e.top[1][1] and e.logprob <= 0 for e in events[:3])


def test_stop_strings_are_held_back_and_not_emitted(model_path):
    model = _model(model_path)
    request = Request([5, 6, 7], max_tokens=12)
    want, _ = alone(model, request, 12)
    text = model.detokenize(want)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    with Engine(model, n_slots=1) as engine:
        tokens, got, done = _consume(engine.submit(Request([5, 6, 7], max_tokens=12, stop=[stop])))
    assert done.finish_reason == "stop" and got == text[:text.find(stop)]


def test_bad_requests_and_a_closed_engine_are_refused(model_path):
    model = _model(model_path, n_ctx=64)
    engine = Engine(model, n_slots=2)
    for bad, match in [(Request([]), "non-empty"), (Request([64]), "outside"), (Request([3] * 60, max_tokens=8),
                       "over the context"), (Request([3], max_tokens=-2), "max_tokens"),
                       (Request([3], stop="x"), "stop"), (Request([3], n_probs=-1), "n_probs"),
                       (Request([True]), "outside"), (Request([3], max_tokens=True), "max_tokens"),
                       (Request([3, 3, 3], images=[(1, np.zeros((2, model.arch.n_embd)))]), "images"),
                       (Request([3], sampling=None), "SamplingParams"), (Request([3], n_keep=-2), "n_keep"),
                       (Request([3], slot=2), "slot"), ([3], "takes a Request")]:
        with pytest.raises(ParameterError, match=match):
            engine.submit(bad)
    engine.close()
    with pytest.raises(GGMLError, match="closed"):
        engine.submit(Request([3]))


def test_streamed_texts_add_up_to_the_text_and_hold_back_incomplete_characters(tmp_path):
    """A byte-level vocabulary: random tokens split UTF-8 characters; no Token's text ends in the middle of
    one (its bytes wait for the rest, unless it is the last) and the texts add up to the detokenized output."""
    vocab = bpe_vocab("gpt-2")
    path = tmp_path / "bpe.gguf"
    write_llama(path, n_vocab=vocab.n_tokens, vocab=vocab, n_ctx=256)
    model = _model(path)
    with Engine(model, n_slots=4) as engine:
        handles = [engine.submit(Request(list(range(100 + 37 * i, 120 + 37 * i)), max_tokens=24, ignore_eos=True))
                   for i in range(4)]
        runs = [list(h) for h in handles]
    for events in runs:
        tokens = [e for e in events if isinstance(e, Token)]
        assert events[-1].finish_reason == "length" and len(tokens) == 24
        assert "".join(e.text for e in tokens) == model.detokenize([e.id for e in tokens])
        assert not any(e.text.endswith("\ufffd") for e in tokens[:-1])
    assert any(e.text == "" for events in runs for e in events[:-2])  # some bytes did wait for the next token


def test_top_tokens_and_log_sum_exp_match_a_full_sort_and_softmax():
    rng = np.random.default_rng(3)
    for n in (0, 1, 3, 10, 50, 64):
        for _ in range(50):
            x = rng.integers(-3, 3, size=50).astype(np.float32)  # many ties: the order must be the stable sort's
            assert list(top_tokens(x, n)) == list(np.argsort(-x, kind="stable")[:n])
    x = rng.standard_normal(262144).astype(np.float32) * 8
    z = x.astype(np.float64) - x.max()
    np.testing.assert_allclose(x - log_sum_exp(x), z - np.log(np.exp(z).sum()), atol=1e-5)


def test_load_model_runs_on_a_thread_that_ends(tmp_path, monkeypatch):
    """The compiled kernels' parallel loops of loading run on a thread that is gone afterwards (an idle OpenMP
    pool left in the caller's thread slowed every step of an engine computing on its own thread)."""
    from pyggml.models.llm import model as model_module

    seen = []
    real = model_module.Model.__init__

    def spy(self, *args, **kwargs):
        seen.append(threading.current_thread())
        real(self, *args, **kwargs)
    monkeypatch.setattr(model_module.Model, "__init__", spy)
    path = tmp_path / "m.gguf"
    write_llama(path)
    model_module.load_model(path, n_ctx=64)
    assert seen and seen[0] is not threading.current_thread() and not seen[0].is_alive()
    assert seen[0].name.startswith("pyggml-load")
