"""The engine's context shift (llama-server's --context-shift): a request generates past its share of the context.
With one layer, each token after a shift has the log-probability a fresh run gives over the shifted tokens at
positions 0, 1, ... (the kept keys are rotated by the RoPE delta, not recomputed; a layer's keys and values
depend on the token and its position alone only in the first layer, so deeper models differ from a fresh run by
design, in llama.cpp too); also with several slots shifting at once, and with n_keep. With two layers, each
token's log-probability is the one the same KV operations give through the model's own API (decode, seq_rm,
seq_add; agreement of those with llama.cpp is tests/models/test_kv_cache's). Done says truncated; without the
option a request cannot ask for more than the context."""

import pytest

from pyggml.core import GGMLType
from pyggml.errors import ParameterError
from pyggml.models import load_model
from pyggml.models.llm.engine import Done, Engine, Request, Token, log_sum_exp
from pyggml.models.llm.generate import SamplingParams
from pyggml.models.llm.speculative import ModelDrafter, SpecParams

from tests.support.tiny_models import write_gpt2, write_llama

N_CTX = 64
LOGPROB_TOL = 2e-3   # rotated keys against keys computed at their positions (F32)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("shift") / "llama.gguf", n_ctx=256, seed=3, n_layer=1)


@pytest.fixture(scope="module")
def deep_path(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("shift") / "deep.gguf", n_ctx=256, seed=4, n_layer=2)


@pytest.fixture(scope="module")
def fresh(path):
    return load_model(path, n_ctx=N_CTX, n_batch=N_CTX, kv_type=GGMLType.F32)


def run(engine, requests):
    handles = [engine.submit(r) for r in requests]
    out = []
    for h in handles:
        events = list(h)
        out.append(([e for e in events if isinstance(e, Token)], events[-1]))
    return out


def contexts(prompt, tokens, share, n_keep, add_bos):
    """The tokens each sampled token was computed over, shifting as llama-server does."""
    ctx, out = list(prompt), []
    for t in tokens:
        out.append(list(ctx))
        if len(ctx) + 1 >= share:
            keep = min(share - 4, (len(prompt) if n_keep < 0 else n_keep) + int(add_bos))
            n_left = len(ctx) - keep
            del ctx[keep:keep + max(0, min(n_left // 2, n_left - 1))]
        ctx.append(t)
    return out


def check_against_fresh_runs(fresh, prompt, tokens, share, n_keep=0):
    worst = 0.0
    for ctx, token in zip(contexts(prompt, [t.id for t in tokens], share, n_keep, fresh.tokenizer.add_bos), tokens,
                          strict=True):
        fresh.reset()
        row = fresh.decode(ctx)
        worst = max(worst, abs(float(row[token.id]) - log_sum_exp(row) - token.logprob))
    assert worst <= LOGPROB_TOL


@pytest.mark.parametrize("n_keep", [0, -1])
def test_a_shifted_continuation_is_a_fresh_run_over_the_shifted_tokens(path, fresh, n_keep):
    model = load_model(path, n_ctx=N_CTX, n_batch=16, kv_type=GGMLType.F32)
    prompt = [1] + list(range(40, 60))
    with Engine(model, n_slots=1, context_shift=True) as engine:
        [(tokens, done)] = run(engine, [Request(prompt, max_tokens=150, sampling=SamplingParams(temperature=0.0),
                                                ignore_eos=True, n_keep=n_keep)])
        assert engine.stats().kv_cells_used == 0   # a shifted sequence's cells are not kept for reuse
    assert done.finish_reason == "length" and done.completion_tokens == 150 and done.truncated
    assert len(tokens) == 150 > N_CTX
    check_against_fresh_runs(fresh, prompt, tokens, N_CTX, n_keep)


def test_two_layers_match_the_same_kv_operations_through_the_model(deep_path):
    model = load_model(deep_path, n_ctx=N_CTX, n_batch=16, kv_type=GGMLType.F32)
    prompt = [1] + list(range(40, 60))
    with Engine(model, n_slots=1, context_shift=True) as engine:
        [(tokens, done)] = run(engine, [Request(prompt, max_tokens=120, sampling=SamplingParams(temperature=0.0),
                                                ignore_eos=True)])
    assert done.truncated
    replay = load_model(deep_path, n_ctx=N_CTX, n_batch=N_CTX, kv_type=GGMLType.F32)
    row, n_past, shifts, worst = replay.decode(prompt), len(prompt), 0, 0.0
    for token in tokens:
        worst = max(worst, abs(float(row[token.id]) - log_sum_exp(row) - token.logprob))
        if n_past + 1 >= N_CTX:   # keep the BOS, drop half of the rest, move the later half down
            n_discard = (n_past - 1) // 2
            replay.seq_rm(0, 1, 1 + n_discard)
            replay.seq_add(0, 1 + n_discard, n_past, -n_discard)
            n_past, shifts = n_past - n_discard, shifts + 1
        row, n_past = replay.decode([token.id]), n_past + 1
    assert shifts >= 2 and worst <= LOGPROB_TOL


def test_slots_shift_their_own_shares_side_by_side(path, fresh):
    """Two slots of 32 positions each, the same prompt (no shared cells while shifting), max_tokens -1 is
    bounded here by an EOS-free run of 80 tokens."""
    model = load_model(path, n_ctx=N_CTX, n_batch=16, kv_type=GGMLType.F32)
    prompt = [1, 7, 9, 11, 13, 15, 17, 19, 21, 23]
    with Engine(model, n_slots=2, context_shift=True) as engine:
        runs = run(engine, [Request(prompt, max_tokens=80, sampling=SamplingParams(temperature=0.0),
                                    ignore_eos=True) for _ in range(2)])
    for tokens, done in runs:
        assert done.truncated and len(tokens) == 80
        check_against_fresh_runs(fresh, prompt, tokens, N_CTX // 2)


def test_a_draft_fits_in_the_share_a_shift_left(path):
    """Speculative decoding and context shift together: the draft model is the target itself (every guess is
    kept, so drafts are as long as the room allows); greedy tokens are those of the run without a drafter, and
    no slot ever holds more than its share less one cell, rejected draft tokens included."""
    prompt = [1, 7, 9, 11, 13, 15, 17, 19, 21, 23]
    requests = [Request(prompt, max_tokens=80, sampling=SamplingParams(temperature=0.0), ignore_eos=True)
                for _ in range(2)]
    with Engine(load_model(path, n_ctx=N_CTX, n_batch=16, kv_type=GGMLType.F32), n_slots=2,
                context_shift=True) as engine:
        plain = run(engine, requests)
    held = []
    drafter = ModelDrafter(load_model(path, n_ctx=N_CTX, n_batch=16, kv_type=GGMLType.F32),
                           SpecParams(n_max=6, p_min=0.0))
    with Engine(load_model(path, n_ctx=N_CTX, n_batch=16, kv_type=GGMLType.F32), n_slots=2, drafter=drafter,
                context_shift=True) as engine:
        watched = [Request(r.prompt, r.max_tokens, r.sampling, ignore_eos=True,
                           on_token=lambda _: held.append(max(len(s.cached) for s in engine.slots)))
                   for r in requests]
        spec = run(engine, watched)
    for (tokens, _done), (spec_tokens, spec_done) in zip(plain, spec, strict=True):
        assert [t.id for t in spec_tokens] == [t.id for t in tokens]
        assert spec_done.truncated and spec_done.draft_accepted > 0
    assert max(held) <= N_CTX // 2 - 1


def test_without_a_shift_nothing_is_truncated_and_the_context_bounds_max_tokens(path):
    model = load_model(path, n_ctx=N_CTX, kv_type=GGMLType.F32)
    with Engine(model, n_slots=1, context_shift=True) as engine:
        [(tokens, done)] = run(engine, [Request([1, 5, 6], max_tokens=10, ignore_eos=True)])
    assert not done.truncated and len(tokens) == 10
    with Engine(model, n_slots=1) as engine:
        with pytest.raises(ParameterError, match="over the context of 64"):
            engine.submit(Request([1, 5, 6], max_tokens=N_CTX))
        [(tokens, done)] = run(engine, [Request([1, 5, 6], max_tokens=-1, ignore_eos=True)])
    assert isinstance(done, Done) and len(tokens) == N_CTX - 3 and not done.truncated


def test_an_architecture_that_cannot_move_keys_refuses_the_option(tmp_path):
    model = load_model(write_gpt2(tmp_path / "g.gguf"), n_ctx=N_CTX)
    with pytest.raises(ParameterError, match="context shift: gpt2 cannot move cached positions"):
        Engine(model, context_shift=True)


def test_n_keep_is_checked(path):
    with Engine(load_model(path, n_ctx=N_CTX), n_slots=1) as engine, pytest.raises(ParameterError, match="n_keep"):
        engine.submit(Request([1, 2], n_keep=-2))
