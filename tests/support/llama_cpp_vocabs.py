"""llama.cpp's tokenizer test set (its models/ggml-vocab-*.gguf with .inp/.out), as tests/models/data keeps it.

The 19 vocabularies travel in one xz archive (similar vocabularies compress together); ``VocabSet`` unpacks it
once into a temporary directory.
"""

import json
import tarfile
from functools import cache
from pathlib import Path

from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.text.load import load_tokenizer

VOCAB_DIR = Path(__file__).resolve().parents[1] / "models" / "data" / "llama_cpp_vocabs"
ARCHIVE = VOCAB_DIR / "vocabs.tar.xz"
CORPUS_REFS = VOCAB_DIR / "corpus_refs.json"
VOCABS = ("aquila", "baichuan", "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4",
          "gpt-2", "gpt-neox", "llama-bpe", "llama-spm", "mpt", "nomic-bert-moe", "phi-3", "qwen2", "qwen35",
          "refact", "starcoder")
WITH_TESTS = tuple(v for v in VOCABS if v not in ("aquila", "baichuan", "gpt-neox", "nomic-bert-moe"))
SEPARATOR = "\n__ggml_vocab_test__\n"


def file_name(vocab):
    return f"ggml-vocab-{vocab}.gguf"


def read_cases(vocab):
    """(text, ids) pairs of a vocabulary's .inp/.out, read as test-tokenizer-0.cpp reads them: texts are cut at
    the separator (a text after the last one only when it is not empty), .out lines are stripped ids."""
    raw = (VOCAB_DIR / f"{file_name(vocab)}.inp").read_text(encoding="utf-8")
    texts = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        texts.pop()
    lines = (VOCAB_DIR / f"{file_name(vocab)}.out").read_text(encoding="utf-8").splitlines()
    assert len(texts) == len(lines), f"{vocab}: {len(texts)} texts, {len(lines)} id lines"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines, strict=True)]


@cache
def corpus_refs():
    return json.loads(CORPUS_REFS.read_text(encoding="utf-8"))


class VocabSet:
    """The vocabularies, unpacked under ``directory`` when the first one is asked for."""

    def __init__(self, directory):
        self.directory = Path(directory)

    def path(self, vocab):
        path = self.directory / file_name(vocab)
        if not path.exists():
            with tarfile.open(ARCHIVE) as archive:
                archive.extractall(self.directory, filter="data")
        return path

    def load(self, vocab):
        with GGUFFile.open(self.path(vocab)) as f:
            return load_tokenizer(f)
