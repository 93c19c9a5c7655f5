"""benchmarks/batched_vs_llamacpp.py's sides on a small random model: llama-batched-bench's rows per npl, and the
same prompt and generation batches on both sides."""

import argparse

import pytest

from benchmarks import batched_vs_llamacpp as bench
from pyggml.testing.synthetic import write_llama


def _args(path, **kw):
    return argparse.Namespace(**{"model": str(path), "npp": 8, "ntg": 3, "npl": [1, 2, 4], "batch": 16, "threads": 1,
                                 "llama_no_extra_bufts": False, **kw})


def test_pyggml_side_reports_a_row_per_npl(tmp_path):
    path = tmp_path / "llama.gguf"
    write_llama(path, n_ctx=256)
    out = bench.run_pyggml(_args(path))
    assert [r["npl"] for r in out["rows"]] == [1, 2, 4]
    assert all(r["pp_tps"] > 0 and r["tg_tps"] > 0 and r["step_ms"] > 0 for r in out["rows"])
    assert out["kv_type"] == "F16" and out["outputs_reserved"] == 4 and out["compute_buffer"] > 0


def test_batches_hold_each_sequences_prompt_then_one_token_per_sequence_and_step():
    prompt, steps = bench.prompt_and_steps(npl=3, npp=4, ntg=2, n_vocab=64)
    assert [(p, s) for _, p, s, _ in prompt] == [(i, (s,)) for s in range(3) for i in range(4)]
    assert [w for *_, w in prompt] == [False, False, False, True] * 3
    assert [[(p, s) for _, p, s, _ in step] for step in steps] == [[(4 + j, (s,)) for s in range(3)] for j in range(2)]


@pytest.mark.peer
def test_llamacpp_side_runs_the_same_measurement(tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    path = tmp_path / "llama.gguf"
    write_llama(path, n_ctx=256)
    out = bench.run_llama(_args(path))
    assert [r["npl"] for r in out["rows"]] == [1, 2, 4] and all(r["tg_tps"] > 0 for r in out["rows"])
