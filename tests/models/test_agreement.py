"""pyggml.testing.agreement: KL divergence, top-1, perplexities and the top-k lower bound."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pyggml.testing.agreement import Agreement, agreement, log_softmax, topk_kld_lower_bound, within_yardstick


def _kl(p_logits, q_logits):
    p, q = np.exp(log_softmax(p_logits)), np.exp(log_softmax(q_logits))
    return (p * np.log(p / q)).sum(axis=-1)


def test_identical_logits_agree_exactly_and_perplexity_is_the_next_tokens():
    logits = np.random.default_rng(0).normal(0, 3, (6, 50)).astype(np.float32)
    got = agreement(logits, logits + 7.0, next_tokens=[1, 2, 3, 4, 5, 6])   # a shift changes no distribution
    assert got["kld_max"] < 1e-12 and got["top1"] == 1.0 and got["n"] == 6
    nll = -log_softmax(logits)[np.arange(6), [1, 2, 3, 4, 5, 6]]
    assert np.isclose(got["ppl_ref"], np.exp(nll.mean())) and np.isclose(got["ppl_other"], got["ppl_ref"])


def test_kld_top1_and_chunks_accumulate_like_one_batch():
    rng = np.random.default_rng(1)
    p, q = rng.normal(0, 2, (70, 40)), rng.normal(0, 2, (70, 40))
    whole = agreement(p, q)
    parts = Agreement()
    parts.add(p[:33], q[:33])
    parts.add(p[33:], q[33:])
    assert parts.summary() == whole
    assert np.isclose(whole["kld_mean"], _kl(p, q).mean())
    assert whole["top1"] == np.mean(p.argmax(1) == q.argmax(1))


@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_topk_bound_never_exceeds_the_kld_and_is_exact_with_every_token(seed, k):
    rng = np.random.default_rng(seed)
    p, q = rng.normal(0, 3, (4, 40)), rng.normal(0, 3, (4, 40))
    top = np.argsort(-p, axis=1)[:, :k]
    lse = np.log(np.exp(p).sum(axis=1))
    bound = topk_kld_lower_bound(np.take_along_axis(p, top, 1), top, lse, q)
    assert np.all(bound <= _kl(p, q) + 1e-9)
    if k == 40:
        np.testing.assert_allclose(bound, _kl(p, q), rtol=1e-9, atol=1e-12)


def test_within_yardstick_allows_one_percent_and_one_position():
    yard = {"kld_mean": 1e-3, "top1": 0.95, "n": 100}
    assert all(ok for _, ok in within_yardstick({"kld_mean": 1.009e-3, "top1": 0.94, "n": 100}, yard))
    assert [ok for _, ok in within_yardstick({"kld_mean": 1.02e-3, "top1": 0.93, "n": 100}, yard)] == [False, False]
