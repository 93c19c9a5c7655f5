"""The tokenizer of a GGUF file, by its `tokenizer.ggml.model` (apart from tokenizer.py, whose Tokenizer the
unigram and wordpiece tokenizers build on, so that no module of this folder imports one that imports it)."""

from __future__ import annotations

from pyggml.errors import GGUFError
from pyggml.models.gguf.gguf_file import GGUFValueType
from pyggml.models.text.tokenizer import BPETokenizer, Gemma4Tokenizer, SPMTokenizer
from pyggml.models.text.unigram import UGMTokenizer
from pyggml.models.text.wordpiece import WPMTokenizer

MODELS = {"llama": SPMTokenizer, "gpt2": BPETokenizer, "gemma4": Gemma4Tokenizer, "bert": WPMTokenizer,
          "t5": UGMTokenizer}


def load_tokenizer(gguf):
    """The tokenizer a GGUF file's ``tokenizer.ggml.model`` names."""
    model = gguf.require("tokenizer.ggml.model", GGUFValueType.STRING)
    if model not in MODELS:
        raise GGUFError(f"{gguf.path}: tokenizer.ggml.model '{model}' is not supported "
                        f"(supported: {', '.join(sorted(MODELS))})")
    return MODELS[model](gguf)
