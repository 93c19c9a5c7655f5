"""pyggml's logits against llama.cpp's on random-weight models of every architecture (parity_cases.py),
teacher-forced and measured as llama-perplexity --kl-divergence measures a quantized model: KL(llama.cpp ||
pyggml) per position and top-1 agreement.

With F32 weights the mean KLD must stay <= 1e-6. With quantized weights pyggml may be no further from
llama.cpp than llama.cpp's own run on the same weights converted to F32 (the yardstick: what leaving out
llama.cpp's quantized products costs); 1% of slack covers two float32 computations of one F32 model
(their KLD is below 1e-8), and top-1 may differ at one position more.

CI compares against the committed logits (data/llamacpp_logits.npz, data/llamacpp_parity.json, written by
data/make_llamacpp_refs.py parity); the `peer` tests do the same against llama-cpp-python where installed.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.models import load_model
from pyggml.models.agreement import agreement
from pyggml.models.synthetic import write_f32_copy

from parity_cases import CASES, N_BATCH, N_CTX, N_TOKENS, sha256, write_case

DATA = Path(__file__).parent / "data"
SUMMARY = json.loads((DATA / "llamacpp_parity.json").read_text())
F32_BOUND = 1e-6
SLACK = 1.01


@pytest.fixture(scope="module")
def refs():
    with np.load(DATA / "llamacpp_logits.npz") as f:
        return dict(f)


def pyggml_logits(path, tokens) -> np.ndarray:
    return load_model(path, n_ctx=N_CTX, n_batch=N_BATCH).decode(list(tokens), all_logits=True)


def check_agreement(case, got: dict, yardstick: dict | None) -> None:
    if not case.quantized:
        assert got["kld_mean"] <= F32_BOUND, f"{case.name}: mean KLD {got['kld_mean']:.3e} with F32 weights"
        return
    assert got["kld_mean"] <= SLACK * yardstick["kld_mean"], (
        f"{case.name}: mean KLD {got['kld_mean']:.3e} against llama.cpp's own F32-weights {yardstick['kld_mean']:.3e}")
    assert got["top1"] >= yardstick["top1"] - 1.0 / N_TOKENS, f"{case.name}: top-1 {got['top1']} < {yardstick['top1']}"


def test_cases_cover_the_architectures_vocabularies_and_types():
    names = " ".join(c.name for c in CASES)
    for part in ("llama", "qwen2", "gemma3", "gpt2", "spm", "bpe", "tied", "f32", "q4_0", "q4_1", "q8_0", "k-quants"):
        assert part in names
    assert len(SUMMARY["cases"]) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_logits_agree_with_committed_llamacpp_logits(tmp_path, refs, case):
    path = write_case(case, tmp_path)
    entry = SUMMARY["cases"][case.name]
    assert sha256(path) == entry["sha256"], (
        f"{case.name}: the file differs from the one llama.cpp ran on; rerun make_llamacpp_refs.py parity")
    tokens = refs[f"{case.name}/tokens"]
    assert tokens.tolist() == case.tokens()
    check_agreement(case, agreement(refs[f"{case.name}/logits"], pyggml_logits(path, tokens)), entry.get("yardstick"))


@pytest.mark.peer
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_logits_agree_with_live_llamacpp(tmp_path, case):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.models.llamacpp import llamacpp_logits

    path, tokens = write_case(case, tmp_path), case.tokens()
    reference = llamacpp_logits(path, tokens)
    yardstick = None
    if case.quantized:
        write_f32_copy(path, tmp_path / "f32.gguf")
        yardstick = agreement(reference, llamacpp_logits(tmp_path / "f32.gguf", tokens))
    check_agreement(case, agreement(reference, pyggml_logits(path, tokens)), yardstick)
