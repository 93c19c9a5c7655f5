"""Tiny hand-made GGUF vocabularies for the tokenizer tests."""

from gguf import GGUFWriter

from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.text.load import load_tokenizer


def write_vocab(path, model, tokens, types, scores=None, merges=None, pre=None, extra=None, **flags):
    """Write a vocabulary-only GGUF file and load its tokenizer. ``flags`` go through GGUFWriter's add_<name>
    methods; ``extra`` maps other keys to booleans."""
    w = GGUFWriter(str(path), "tiny")
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for name, value in flags.items():
        getattr(w, f"add_{name}")(value)
    for key, value in (extra or {}).items():
        w.add_bool(key, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with GGUFFile.open(path) as f:
        return load_tokenizer(f)
