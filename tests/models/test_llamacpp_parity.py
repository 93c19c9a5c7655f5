"""pyggml's logits against llama.cpp's on random-weight models of every architecture (parity_cases.py),
teacher-forced and measured as llama-perplexity --kl-divergence measures a quantized model: KL(llama.cpp ||
pyggml) per position and top-1 agreement.

With F32 weights the mean KLD must stay <= 1e-6. With quantized weights pyggml may be no further from
llama.cpp than llama.cpp's own run on the same weights converted to F32 (the yardstick: what leaving out
llama.cpp's quantized products costs), with agreement.within_yardstick's slack.

CI compares against the committed logits (data/llamacpp_logits.npz, data/llamacpp_parity.json, written by
data/make_llamacpp_refs.py parity); the `peer` tests do the same against llama-cpp-python where installed.
"""

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from pyggml.backend.cpu.interleave import has_int8_products
from pyggml.models import load_model
from pyggml.testing.agreement import agreement, within_yardstick
from pyggml.testing.synthetic import write_f32_copy

from tests.support.parity_cases import BY_NAME, CASES, N_BATCH, sha256, write_case

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[2]
SUMMARY = json.loads((DATA / "llamacpp_parity.json").read_text())


@pytest.fixture(scope="module")
def refs():
    with np.load(DATA / "llamacpp_logits.npz") as f:
        return dict(f)


def pyggml_logits(case, path, tokens) -> np.ndarray:
    model = load_model(path, n_ctx=case.n_ctx, n_batch=N_BATCH, kv_type="F32")  # the KV cache's type as the refs'
    return model.decode(list(tokens), all_logits=True)


def check_agreement(case, got: dict, yardstick: dict | None) -> None:
    if not case.quantized:
        assert got["kld_mean"] <= case.f32_bound, f"{case.name}: mean KLD {got['kld_mean']:.3e} with F32 weights"
        return
    for what, holds in within_yardstick(got, yardstick):
        assert holds, f"{case.name}: {what}"


def test_cases_cover_the_architectures_vocabularies_and_types():
    names = " ".join(c.name for c in CASES)
    for part in ("llama", "qwen2", "gemma2", "gemma3", "gpt2", "phi3", "spm", "bpe", "tied", "f32", "q4_0", "q4_1",
                 "q8_0", "k-quants", "biases", "output-bias"):
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
    check_agreement(case, agreement(refs[f"{case.name}/logits"], pyggml_logits(case, path, tokens)),
                    entry.get("yardstick"))


# A case's file with one key or tensor changed or left out, and the least mean KLD from the case's committed
# llama.cpp logits that pyggml then shows: what the case checks moves the logits far beyond its bound.
CHANGED = [
    ("llama31-f32-rope-freqs", dict(drop=("rope_freqs.weight",)), 1e-2),   # Llama 3.1's frequency factors
    ("qwen2-f32-yarn", dict(drop=("qwen2.rope.scaling.type",)), 1e-2),      # YaRN read as linear scaling
    ("gemma2-f32-spm", dict(attn_softcap=1e4, final_softcap=1e4), 1e-3),   # llama.cpp's default soft-caps
    ("gemma2-f32-caps-keys", dict(attn_softcap=None), 1e-2),               # the file's attention soft-cap
    ("gemma2-f32-caps-keys", dict(swa_pattern=None), 1e-2),                # the file's sliding-window layers
    ("llama-f32-biases", dict(biases=("attn_q", "attn_k", "attn_v", "attn_output")), 1e-3),  # the FFN biases
    ("llama-f32-biases", dict(biases=("ffn_gate", "ffn_up", "ffn_down")), 1e-3),  # the attention biases
    ("granite-f32-ffn-biases", dict(biases=()), 1e-5),                     # scaled by residual_scale 0.22
    ("qwen2-f32-output-bias", dict(biases=()), 1e-2),                       # the logits' bias
]


@pytest.mark.parametrize("name, change, least", CHANGED, ids=[f"{n}-{'-'.join(c)}" for n, c, _ in CHANGED])
def test_what_a_case_checks_moves_its_logits(tmp_path, refs, name, change, least):
    case = BY_NAME[name]
    path = partial(case.write, **change)(tmp_path / "changed.gguf")
    got = agreement(refs[f"{name}/logits"], pyggml_logits(case, path, refs[f"{name}/tokens"]))
    assert got["kld_mean"] > least


@pytest.mark.peer
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_logits_agree_with_live_llamacpp(tmp_path, case):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.testing.llamacpp import llamacpp_logits

    path, tokens = write_case(case, tmp_path), case.tokens()
    reference = llamacpp_logits(path, tokens)
    yardstick = None
    if case.quantized:
        write_f32_copy(path, tmp_path / "f32.gguf")
        yardstick = agreement(reference, llamacpp_logits(tmp_path / "f32.gguf", tokens))
    check_agreement(case, agreement(reference, pyggml_logits(case, path, tokens)), yardstick)


@pytest.mark.peer
def test_kld_benchmark_measures_all_positions_and_second_halves(tmp_path):
    """benchmarks/kld_vs_llamacpp.py end to end on a small quantized model: 2 chunks of 64 tokens of GPL-3."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    path = write_case(BY_NAME["llama-q4_1"], tmp_path)
    cmd = [sys.executable, "-m", "benchmarks.kld_vs_llamacpp", "--model", str(path), "--ctx", "64",
           "--chunks", "2", "--json", str(tmp_path / "out.json")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["chunks"] == 2 and all(out["checks"].values()), out["checks"]
    results = out["results"]["pyggml"]
    assert results["all"]["n"] == 2 * 63 and results["second_half"]["n"] == 2 * 31
    assert results["all"]["ppl_ref"] > 1 and results["all"]["ppl_other"] > 1


def test_architecture_table_rows_from_the_committed_logits(tmp_path, refs):
    """benchmarks/arch_kld_table.py's row of a quantized case: its matrix types, the mean KLD the parity test
    measures, the committed yardstick and the ratio to it."""
    from argparse import Namespace

    from benchmarks import arch_kld_table as table

    case = BY_NAME["gemma2-q4_k_m"]
    row = table.measure(case, write_case(case, tmp_path), Namespace(live=False), refs, SUMMARY)
    assert (row["arch"], row["positions"], set(row["weights"].split(", "))) == ("gemma2", 32,
                                                                                 {"Q5_0", "Q8_0", "Q4_K", "Q6_K"})
    assert row["yardstick"] == SUMMARY["cases"][case.name]["yardstick"]
    line = table.markdown([row]).splitlines()[-1]
    ratio = row["pyggml"]["kld_mean"] / row["yardstick"]["kld_mean"]
    assert line.startswith("| gemma2-q4_k_m |") and f"| {ratio:.3f} |" in line


@pytest.mark.skipif(not has_int8_products(), reason="the integer products need AVX-512 VNNI or AVX2")
def test_the_integer_k_quant_products_give_llamacpps_logits(tmp_path, refs):
    """Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS in one model, multiplied in int8 against Q8_K (Q8_0)
    activations with ggml's integer sums: llama.cpp's logits up to float32 rounding that moved one Q8_K quant of
    an activation (mean KLD 1.2e-5 measured; 3e-14 while the F32 KV cache's 5-16-column products were summed by
    sgemm, before they were summed per column as for one token alone), where the float products sat at the
    F32-weights yardstick (2.7e-3)."""
    case = BY_NAME["llama-k-quants"]
    path = write_case(case, tmp_path)
    got = agreement(refs[f"{case.name}/logits"], pyggml_logits(case, path, refs[f"{case.name}/tokens"]))
    assert got["kld_mean"] < 1e-4 and got["top1"] == 1.0
