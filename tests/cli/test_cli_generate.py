"""`pyggml generate` on a small random llama file: text on stdout, speed and memory figures on stderr."""

import sys

import pytest

from pyggml.cli.main import main
from pyggml.errors import ParameterError

from tests.support.tiny_models import write_llama


def test_generate_prints_text_then_speed_and_memory(tmp_path, capsys):
    path = write_llama(tmp_path / "tiny.gguf")
    assert main(["generate", "the a", "--model", str(path), "-n", "5", "--ctx", "32", "--seed", "1",
                 "--temp", "0.8"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("the a") and len(out) > len("the a\n")
    for label in ("prompt:", "eval:", "tokens/s", "weights:", "KV cache:", "compute:", "ggml's planner", "peak RSS:"):
        assert label in err


def test_generate_reports_a_bad_model_file_as_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    assert main(["generate", "x", "--model", str(bad)]) == 2
    assert "pyggml generate: error:" in capsys.readouterr().err


def test_generate_kv_type_f16_halves_the_kv_cache(tmp_path, capsys):
    path = write_llama(tmp_path / "tiny.gguf")
    sizes = {}
    for kv_type in ("F32", "F16"):
        assert main(["generate", "the a", "--model", str(path), "-n", "2", "--ctx", "2048", "--kv-type", kv_type]) == 0
        line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("KV cache:"))
        sizes[kv_type] = float(line.split()[2])
    assert sizes["F32"] > 0 and sizes["F16"] == sizes["F32"] / 2


def test_flash_attention_on_off_and_auto_as_llama_cpps_fa(tmp_path):
    """-fa on gives the F16 cache's run the same greedy text; -fa off with a quantized V is refused in one line
    (a quantized V needs flash attention)."""
    import argparse

    from pyggml.cli.model_options import add_model_options, open_model

    path = write_llama(tmp_path / "tiny.gguf", n_embd=64, n_head=2, n_head_kv=1)  # heads of 64: Q8_0 rows
    p = argparse.ArgumentParser()
    add_model_options(p)

    def model(*flags):
        return open_model(p.parse_args(["--model", str(path), "--ctx", "64", *flags]))

    plain, flash = model(), model("-fa", "on")
    assert not plain.kv.flash_attn and flash.kv.flash_attn and model("-ctv", "q8_0").kv.flash_attn
    assert plain.generate("the a", 8) == flash.generate("the a", 8)
    with pytest.raises(ParameterError, match="needs flash attention"):
        model("-fa", "off", "--kv-type", "q8_0")


def test_generate_on_the_cpu_loads_no_plugin_backend(tmp_path):
    """Installed plugins (the torch backend imports torch: 180 MiB of RSS) load only when a backend other than
    the CPU is asked for."""
    import subprocess
    path = write_llama(tmp_path / "tiny.gguf")
    code = ("import sys; from pyggml.cli.main import main; "
            f"assert main(['generate', 'the a', '--model', {str(path)!r}, '-n', '1', '--ctx', '32']) == 0; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False"), out.stdout


@pytest.mark.parametrize("argv, fragment", [
    (["-n", "-5"], "n (tokens to generate) must be an integer >= 0, or -1"),
    (["--top-p", "1.5"], "top_p must be a finite number in [0.0, 1.0], got 1.5"),
    (["--top-k", "-1"], "top_k must be an integer >= 0"),
    (["--min-p", "-0.1"], "min_p must be"),
    (["--temp", "-1"], "temperature must be a finite number in [0.0, inf], got -1.0"),
    (["--temp", "nan"], "temperature must be"),
    (["--repeat-penalty", "0"], "repeat_penalty must be a finite number in (0.0, inf]"),
    (["--seed", "-3"], "seed must be an integer >= 0"),
])
def test_generate_refuses_nonsense_arguments_in_one_line(tmp_path, capsys, argv, fragment):
    path = write_llama(tmp_path / "tiny.gguf")
    assert main(["generate", "hi", "--model", str(path), *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("pyggml generate: error: ") and fragment in err and err.count("\n") == 1


def test_generate_n_minus_one_runs_to_the_end_of_the_context(tmp_path, capsys):
    path = write_llama(tmp_path / "tiny.gguf")
    assert main(["generate", "the a", "--model", str(path), "-n", "-1", "--ctx", "16"]) == 0
    assert "eval:" in capsys.readouterr().err


def test_generate_refuses_an_unknown_choice(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["generate", "hi", "--kv-type", "Q5_1"])
    assert e.value.code == 2 and "invalid choice: 'Q5_1'" in capsys.readouterr().err


def test_generate_names_the_supported_architectures_for_another(tmp_path, capsys):
    import gguf

    path = tmp_path / "mistral.gguf"   # llama.cpp has no `mistral` architecture: Mistral's files are `llama`
    w = gguf.GGUFWriter(str(path), "mistral")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert main(["generate", "x", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    from pyggml.models.arch import ARCHITECTURES
    assert f"architecture 'mistral' is not supported (supported: {', '.join(sorted(ARCHITECTURES))})" in err


@pytest.mark.parametrize("spec", [["--spec-type", "ngram", "--draft-max", "4"], ["--model-draft", "SELF"]])
def test_generate_speculative_prints_the_plain_greedy_text_and_the_acceptance(tmp_path, capsys, spec):
    path = write_llama(tmp_path / "tiny.gguf")
    prompt = "the a the a the a the a the"
    assert main(["generate", prompt, "--model", str(path), "-n", "12", "--ctx", "64"]) == 0
    plain = capsys.readouterr().out
    spec = [str(path) if a == "SELF" else a for a in spec]
    assert main(["generate", prompt, "--model", str(path), "-n", "12", "--ctx", "64", *spec]) == 0
    out, err = capsys.readouterr()
    assert out == plain
    assert "draft:" in err and "accepted" in err and "eval:" in err


def test_generate_refuses_a_draft_model_of_another_vocabulary(tmp_path, capsys):
    from tests.support.tiny_models import bpe_vocab

    path, other = write_llama(tmp_path / "tiny.gguf"), tmp_path / "bpe.gguf"
    vocab = bpe_vocab("gpt-2")
    write_llama(other, n_vocab=vocab.n_tokens, vocab=vocab)
    assert main(["generate", "x", "--model", str(path), "--model-draft", str(other)]) == 2
    assert "draft model" in capsys.readouterr().err


def test_generate_reads_the_prompt_from_p_or_a_file(tmp_path, capsys):
    path = write_llama(tmp_path / "tiny.gguf")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("the a b", encoding="utf-8")
    assert main(["generate", "-p", "the b", "--model", str(path), "-n", "1", "--ctx", "32"]) == 0
    assert capsys.readouterr().out.startswith("the b")
    assert main(["generate", "-f", str(prompt), "--model", str(path), "-n", "1", "--ctx", "32", "-t", "1"]) == 0
    assert capsys.readouterr().out.startswith("the a b")
    assert main(["generate", "x", "-p", "y", "--model", str(path)]) == 2
    assert "give the prompt once" in capsys.readouterr().err
    assert main(["generate", "-f", str(tmp_path / "none.txt"), "--model", str(path)]) == 2
    assert "none.txt: cannot read the prompt" in capsys.readouterr().err


def test_load_model_threads_reach_the_cpu_backend(tmp_path):
    from pyggml.models import load_model

    model = load_model(write_llama(tmp_path / "tiny.gguf"), n_ctx=32, n_threads=1)
    assert model.backend.n_threads == 1


def test_generate_splits_the_layers_over_an_rpc_server(tmp_path, capsys):
    from pyggml.backend.cpu import CPU_REG
    from pyggml.backend.rpc import RPCServer

    path = write_llama(tmp_path / "tiny.gguf")
    from pyggml.backend.rpc import RPC_REG

    with RPCServer([CPU_REG.device(0)]).start() as server:
        try:
            assert main(["generate", "the a", "--model", str(path), "-n", "2", "--ctx", "32",
                         "--rpc", server.endpoint]) == 0
        finally:
            RPC_REG.remove_server(server.endpoint)  # the registry outlives the server: later tests list devices
    assert "RPC" in capsys.readouterr().err


def _program(*argv: str) -> list[str]:
    """The `pyggml` program as its console script runs it (run_and_exit), with these arguments."""
    code = "import sys; from pyggml.cli.main import run_and_exit; sys.argv[0] = 'pyggml'; run_and_exit()"
    return [sys.executable, "-c", code, *argv]


def test_the_program_flushes_all_its_output_and_keeps_mains_status(tmp_path):
    """It ends without Python's teardown: what was printed still arrives whole through a pipe, and the exit
    status is main()'s (0 for text, 2 for an error)."""
    import subprocess
    path = write_llama(tmp_path / "tiny.gguf")
    done = subprocess.run(_program("generate", "the a", "--model", str(path), "-n", "5", "--ctx", "32"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.startswith("the a") and done.stdout.endswith("\n")
    assert done.stderr.rstrip().splitlines()[-1].startswith("peak RSS:")
    bad = subprocess.run(_program("generate", "x", "--model", str(tmp_path / "none.gguf")), capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "none.gguf" in bad.stderr


def test_a_reader_that_goes_away_ends_the_program_quietly(tmp_path):
    """`pyggml generate ... | head -c 3` once head has gone: the broken pipe ends it with SIGPIPE's shell status and
    no traceback."""
    import os
    import subprocess
    path = write_llama(tmp_path / "tiny.gguf")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first word is written
    try:
        done = subprocess.run(_program("generate", "the a", "--model", str(path), "-n", "5", "--ctx", "32"),
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and "Traceback" not in done.stderr


def test_importing_pyggml_leaves_the_collector_as_found_with_what_the_imports_made_out_of_its_sight():
    """The imports run without collections, and what they made is frozen (it lives as long as the process);
    the collector's on/off state is restored after them."""
    import subprocess
    code = """
import gc, sys
enabled = sys.argv[1] == "on"
if not enabled:
    gc.disable()
import pyggml
print(gc.isenabled() == enabled, gc.get_freeze_count() > 10000)
"""
    for state in ("on", "off"):
        done = subprocess.run([sys.executable, "-c", code, state], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr
