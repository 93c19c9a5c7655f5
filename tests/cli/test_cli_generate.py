"""`pyggml generate` on a small random llama file: text on stdout, speed and memory figures on stderr."""

import sys

from pyggml.cli.main import main

from tests.support.tiny_models import write_llama  # noqa: E402


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
    assert "architecture 'mistral' is not supported (supported: gemma3, gpt2, llama, qwen2" in err
