"""Sampling: each filter of llama.cpp's default chain, greedy argmax, and seeded reproducibility."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pyggml.errors import ParameterError
from pyggml.models.llm.generate import (Sampler, SamplingParams, apply_repeat_penalty, keep_min_p, keep_top_k,
                                    keep_top_p)

LOGITS = st.integers(2, 50).flatmap(
    lambda n: arrays(np.float32, n, elements=st.floats(-20, 20, width=32), unique=True))


def test_greedy_takes_the_argmax():
    assert Sampler().sample(np.array([0.1, 3.0, -1.0, 2.9], np.float32)) == 1


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits():
    out = apply_repeat_penalty(np.array([2.0, -2.0, 4.0], np.float32), [0, 1, 1], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 4.0])


def test_repeat_penalty_can_change_the_greedy_choice():
    s = Sampler(SamplingParams(repeat_penalty=2.0))
    s.accept(1)
    assert s.sample(np.array([0.0, 3.0, 2.0], np.float32)) == 2


@given(LOGITS, st.integers(1, 60))
def test_top_k_keeps_the_k_largest(logits, k):
    kept = np.isfinite(keep_top_k(logits, k))
    assert kept.sum() == min(k, logits.size)
    assert logits[kept].min() >= logits[~kept].max(initial=-np.inf)


@given(LOGITS, st.floats(0.01, 0.99))
def test_top_p_keeps_the_smallest_set_reaching_p(logits, p):
    kept = np.isfinite(keep_top_p(logits, p))
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    assert probs[kept].sum() >= p - 1e-6
    assert probs[kept].sum() - probs[kept].min() < p + 1e-6  # dropping the least likely kept one falls short


@given(LOGITS, st.floats(0.0, 1.0))
def test_min_p_keeps_tokens_at_least_p_times_the_best(logits, p):
    kept = np.isfinite(keep_min_p(logits, p))
    probs = np.exp(logits.astype(np.float64) - logits.max())
    assert kept[np.argmax(logits)]
    assert np.all(probs[kept] >= p * (1 - 1e-5)) and np.all(probs[~kept] <= p * (1 + 1e-5))


def test_seeded_sampling_is_reproducible_and_stays_inside_top_k():
    logits = np.random.default_rng(0).normal(size=100).astype(np.float32)
    params = SamplingParams(temperature=1.5, top_k=5, top_p=1.0, min_p=0.0, seed=42)
    a = [Sampler(params).sample(logits) for _ in range(3)]
    s = Sampler(params)
    b = [s.sample(logits) for _ in range(200)]
    assert a[0] == a[1] == a[2] == b[0]
    assert set(b) <= set(np.argsort(-logits)[:5].tolist()) and len(set(b)) > 1


def test_penalty_window_forgets_old_tokens():
    s = Sampler(SamplingParams(repeat_last_n=2))
    for t in (1, 2, 3):
        s.accept(t)
    assert s.recent == [2, 3]
    s = Sampler(SamplingParams(repeat_last_n=0))
    s.accept(1)
    assert s.recent == []


@pytest.mark.parametrize("field, value, fragment", [
    ("temperature", -0.5, "temperature must be a finite number in [0.0, inf]"),
    ("temperature", float("inf"), "temperature must be"),
    ("top_k", -3, "top_k must be an integer >= 0 (0 disables it), got -3"),
    ("top_k", 2.5, "top_k must be an integer"),
    ("top_k", True, "top_k must be an integer"),
    ("top_p", 1.01, "top_p must be a finite number in [0.0, 1.0]"),
    ("min_p", -1e-3, "min_p must be"),
    ("repeat_penalty", 0.0, "repeat_penalty must be a finite number in (0.0, inf]"),
    ("repeat_last_n", -64, "repeat_last_n must be an integer >= 0"),
    ("seed", -1, "seed must be an integer >= 0"),
    ("seed", "42", "seed must be an integer"),
])
def test_sampling_params_refuse_values_out_of_range(field, value, fragment):
    with pytest.raises(ParameterError) as e:
        SamplingParams(**{field: value})
    assert fragment in str(e.value) and isinstance(e.value, ValueError)


def test_sampling_params_accept_the_edges():
    SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1e-3, repeat_last_n=0, seed=0)
    SamplingParams(top_p=0.0, min_p=1.0, seed=2**40)


def test_load_model_refuses_a_kv_type_the_attention_cannot_read_before_opening_the_file():
    from pyggml.models import load_model

    with pytest.raises(ParameterError, match="kv_type_k must be one of F32, F16, Q8_0, Q4_0, got 'Q5_1'"):
        load_model("/nonexistent.gguf", kv_type="Q5_1")
    with pytest.raises(ParameterError, match="kv_type_v must be one of .*, got 'BF16'"):
        load_model("/nonexistent.gguf", kv_type_v="BF16")
