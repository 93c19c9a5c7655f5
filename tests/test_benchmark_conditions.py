"""What the *_vs_* benchmarks report about their conditions: benchmarks/peer_run.py (CPU model, load at each
run's start, the noisy mark, the differences table) and the generate benchmark's reading of llama.cpp's log."""

from pathlib import Path

import pytest

from benchmarks import peer_run

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


LLAMA_LOG = """\
load_tensors:   CPU_REPACK model buffer size =    12.66 MiB
llama_context: constructing llama_context
llama_context: flash_attn            = disabled
llama_context: n_outputs_max         = 512
llama_kv_cache: size =   15.00 MiB (  1024 cells,  15 layers,  1/1 seqs), K (f16):    7.50 MiB, V (f16):    7.50 MiB
sched_reserve:        CPU compute buffer size =   514.50 MiB
llama_context: constructing llama_context
llama_context: flash_attn            = disabled
llama_context: n_outputs_max         = 1
sched_reserve:        CPU compute buffer size =    21.76 MiB
~llama_context:        CPU compute buffer size is 514.5020 MiB, matches expectation of 514.5020 MiB
"""


def test_cpu_model_reads_x86_and_arm_cpuinfo(tmp_path):
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13 64-Core Processor\n")
    arm.write_text("processor\t: 0\nBogoMIPS\t: 108.00\n\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n")
    assert peer_run.cpu_model(str(x86)) == "AMD EPYC 7B13 64-Core Processor"
    assert peer_run.cpu_model(str(arm)) == "Raspberry Pi 5 Model B Rev 1.0"
    assert peer_run.cpu_model(str(tmp_path / "absent"))  # falls back to platform's guess, never empty


def test_runs_started_above_one_load_per_core_are_noisy(monkeypatch, capsys):
    log = peer_run.RunLog(cores=2, cpu="Test CPU")
    monkeypatch.setattr(peer_run.os, "getloadavg", lambda: (1.9, 1.0, 0.5))
    log.start("ours")
    assert capsys.readouterr().out == "ours: load 1.90 1.00 0.50 (0.95 per core)\n"
    assert log.summary().startswith("quiet: all 1 runs started at or below load 1.0 per core (highest 0.95)")
    monkeypatch.setattr(peer_run.os, "getloadavg", lambda: (2.4, 1.0, 0.5))
    run = log.start("theirs", echo=False)
    assert run.noisy and run.cpu == "Test CPU" and capsys.readouterr().out == ""
    assert log.noisy == [run]
    assert log.summary().startswith("NOISY: 1 of 2 runs started above load 1.0 per core (worst: theirs at 1.20)")


def test_differences_mark_the_aspects_that_differ():
    table = peer_run.differences([("KV cache type", "F32", "F16"), ("threads", "2", "2")], ("pyggml", "llama.cpp"))
    lines = table.splitlines()
    assert lines[1].split() == ["what", "pyggml", "llama.cpp"]
    assert lines[2].split() == ["*", "KV", "cache", "type", "F32", "F16"]
    assert lines[3].split() == ["threads", "2", "2"] and lines[3].startswith(" ")


def test_the_generate_benchmark_reads_both_llama_contexts_from_the_log():
    from benchmarks import generate_vs_llamacpp as generate

    facts = generate.llama_log_facts(LLAMA_LOG)
    assert facts == {"compute_buffer": 514.50 * 2**20, "compute_buffer_1_output": 21.76 * 2**20, "kv_type": "F16",
                     "outputs_reserved": "512", "flash_attn": "disabled",
                     "weights_kind": "quantized, repacked (CPU_REPACK)", "buffer_types": "CPU_REPACK 12.66 MiB"}
    older = LLAMA_LOG.replace("n_outputs_max         = 1\n", "")  # a llama.cpp that ignores n_outputs_max
    assert generate.llama_log_facts(older)["compute_buffer_1_output"] is None


def test_the_peers_buffer_types_are_read_from_its_load_log():
    from pyggml.testing.llamacpp import buffer_types

    log = ("load_tensors:   CPU_Mapped model buffer size =   469.12 MiB\n"
           "load_tensors:   CPU_REPACK model buffer size =   401.06 MiB\n"
           "repack: repack tensor blk.0.attn_q.weight with q4_K_8x8\n"
           "repack: repack tensor blk.0.attn_k.weight with q4_K_8x8\n"
           "repack: repack tensor blk.0.ffn_down.weight with q6_K_8x8\n")
    assert buffer_types(log) == "CPU_Mapped 469.12 MiB, CPU_REPACK 401.06 MiB; repacked: q4_K_8x8 x2, q6_K_8x8 x1"
    assert buffer_types("no load log") == "unknown (no verbose load log)"


def test_the_generate_benchmark_counts_the_weights_a_step_reads(tmp_path):
    """Every matrix a step multiplies (the layers and the output head), not an untied token embedding, which
    GET_ROWS reads a row of; a tied embedding is the head."""
    from benchmarks import generate_vs_llamacpp as generate
    from pyggml.models.gguf.gguf_file import GGUFFile
    from pyggml.testing.synthetic import write_llama

    for tied in (False, True):
        path = write_llama(tmp_path / f"{tied}.gguf", tied=tied)
        sizes = {t.name: t.nbytes for t in GGUFFile.open(path).tensors}
        all_bytes = sum(sizes.values())
        expected = all_bytes if tied else all_bytes - sizes["token_embd.weight"]
        assert generate.weight_bytes_per_token(str(path)) == expected


def test_the_generate_benchmark_measures_read_bandwidth():
    from benchmarks import generate_vs_llamacpp as generate

    assert 1e8 < generate.read_bandwidth(1, gib=1 / 64, repeats=2) < 1e13


LLAMA_BENCH_JSON = """[
  {
    "build_commit": "8337e4cd3",
    "n_prompt": 512,
    "n_gen": 0,
    "avg_ts": 71.98,
    "stddev_ts": 3.7
  },
  {
    "build_commit": "8337e4cd3",
    "n_prompt": 0,
    "n_gen": 32,
    "avg_ts": 16.48,
    "stddev_ts": 0.73
  }
]
"""


def test_the_generate_benchmark_reads_a_third_sides_llama_bench_json():
    from benchmarks import generate_vs_llamacpp as generate

    assert generate.bench_speeds("warming up\n" + LLAMA_BENCH_JSON, 512, 32) == {"prompt_tps": 71.98,
                                                                                 "gen_tps": 16.48}
    with pytest.raises(SystemExit, match="no test of 128 prompt tokens and 32 generated"):
        generate.bench_speeds(LLAMA_BENCH_JSON, 128, 32)
