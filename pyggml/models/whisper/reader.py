"""``load_whisper_file``: a Whisper model in any format pyggml reads, by what the path holds (apart from
files.py, whose types the format readers build on, so that no module of this folder imports one that imports it)."""

from __future__ import annotations

from pathlib import Path

from pyggml.errors import WhisperFileError
from pyggml.models.whisper import ct2, ggml_bin, gguf_whisper
from pyggml.models.whisper.files import GGML_MAGIC, GGUF_MAGIC, PACKAGED_MODELS, WhisperFile, packaged_model_parts


def load_whisper_file(path) -> WhisperFile:
    """Read a Whisper model: a CTranslate2 directory (or its model.bin), a whisper.cpp ggml .bin, a Whisper
    GGUF, or the name of a model installed from PyPI ("tiny.en", "base")."""
    p = Path(path)
    if not p.exists():
        if str(path) in PACKAGED_MODELS:
            directory, parts = packaged_model_parts(str(path))
            return ct2.read_ct2(directory, parts)
        raise WhisperFileError(f"{path}: no such file or directory (and not an installed model name: "
                               f"{', '.join(PACKAGED_MODELS)})")
    if p.is_dir():
        return ct2.read_ct2(p)
    with open(p, "rb") as f:
        head = f.read(4)
    if head == GGUF_MAGIC:
        return gguf_whisper.read_gguf(p)
    if len(head) == 4 and int.from_bytes(head, "little") == GGML_MAGIC:
        return ggml_bin.read_ggml_bin(p)
    if p.name == "model.bin":
        return ct2.read_ct2(p.parent)
    raise WhisperFileError(f"{p}: unknown model format (starts with {head!r}): expected a CTranslate2 model "
                           f"directory, a whisper.cpp ggml .bin (magic 'lmgg') or a GGUF file")
