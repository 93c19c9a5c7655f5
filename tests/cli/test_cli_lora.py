"""--lora FILE[,SCALE] and --lora-scaled FILE SCALE on generate and serve (llama.cpp's options)."""

import argparse

import pytest

from pyggml.cli.lora import add_lora_options, lora_file, lora_specs
from pyggml.cli.main import main
from pyggml.models import load_model
from pyggml.testing.synthetic import write_llama, write_lora


@pytest.mark.parametrize("text, spec", [("a.gguf", ("a.gguf", 1.0)), ("a.gguf,0.25", ("a.gguf", 0.25)),
                                        ("dir,x/a.gguf", ("dir,x/a.gguf", 1.0)), ("a,b.gguf,-1", ("a,b.gguf", -1.0))])
def test_lora_file_takes_an_optional_scale(text, spec):
    assert lora_file(text) == spec


def test_both_options_repeat_in_order():
    p = argparse.ArgumentParser()
    add_lora_options(p)
    args = p.parse_args(["--lora", "a.gguf", "--lora-scaled", "b.gguf", "0.5", "--lora", "c.gguf,2"])
    assert lora_specs(args) == [("a.gguf", 1.0), ("c.gguf", 2.0), ("b.gguf", 0.5)]


def test_generate_applies_the_adapter(tmp_path, capsys):
    base = write_llama(tmp_path / "tiny.gguf")
    adapter = write_lora(tmp_path / "lora.gguf", base, std=3.0, seed=1)
    texts = []
    for extra in ([], ["--lora", f"{adapter},1.5"], ["--lora-scaled", str(adapter), "1.5"]):
        assert main(["generate", "the a", "--model", str(base), "-n", "8", "--ctx", "32", *extra]) == 0
        texts.append(capsys.readouterr().out)
    expected = "the a" + load_model(base, n_ctx=32, lora=[(adapter, 1.5)]).generate("the a", n=8)
    assert texts[1] == texts[2] != texts[0]
    assert texts[1].rstrip("\n") == expected


def test_a_bad_scale_or_adapter_is_an_error(tmp_path, capsys):
    base = write_llama(tmp_path / "tiny.gguf")
    assert main(["generate", "x", "--model", str(base), "--lora-scaled", "a.gguf", "big"]) == 2
    assert "--lora-scaled a.gguf: 'big' is not a number" in capsys.readouterr().err
    assert main(["generate", "x", "--model", str(base), "--lora", str(base)]) == 2
    assert "a LoRA adapter has 'adapter'" in capsys.readouterr().err
