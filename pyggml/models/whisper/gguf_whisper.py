"""Whisper as GGUF: whisper.cpp's tensor names and layout, its hyperparameters and vocabulary as metadata.

whisper.cpp itself reads only its legacy files; this is pyggml's own GGUF for Whisper,
written with the ``gguf`` package and read with pyggml's validating GGUF reader. Keys:
``general.architecture = "whisper"``, ``whisper.<hparam>`` for each whisper.cpp
hyperparameter (uint32), ``tokenizer.ggml.model = "whisper"``, ``tokenizer.ggml.tokens``
(every token in GPT-2's printable byte alphabet, so all are valid UTF-8),
``whisper.mel_filters`` (float32, n_mels x 201, row-major), and when known
``whisper.alignment_heads`` (flat layer, head pairs), ``whisper.suppress_ids``,
``whisper.suppress_ids_begin`` and ``whisper.lang_ids`` (int32 arrays).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from pyggml.core import types as T
from pyggml.core.types import GGMLType
from pyggml.errors import GGUFError, WhisperFileError
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.whisper.files import FTYPE_OF_TYPE, Weight, WhisperFile, check_tensors, expected_tensors
from pyggml.models.whisper.ggml_bin import tensors_as
from pyggml.models.whisper.hparams import WhisperHParams
from pyggml.models.whisper.mel import N_FFT, mel_filters
from pyggml.models.whisper.tokenizer import token_bytes, token_text

ARCH = "whisper"
_LISTS = ("suppress_ids", "suppress_ids_begin", "lang_ids")


def write_gguf(file: WhisperFile, path, weight_type=GGMLType.F16) -> None:
    """Write ``file`` as a Whisper GGUF, matrices in ``weight_type`` (ggml_bin.WRITE_TYPES), as whisper.cpp lays it."""
    tensors = tensors_as(file, weight_type)
    hp = file.hparams
    w = GGUFWriter(str(path), ARCH)
    w.add_file_type(FTYPE_OF_TYPE[T.as_type(weight_type)])
    for f in fields(hp):
        if f.name != "ftype":
            w.add_uint32(f"{ARCH}.{f.name}", getattr(hp, f.name))
    w.add_tokenizer_model(ARCH)
    w.add_token_list([token_text(t) for t in file.vocab])
    filters = file.mel_filters if file.mel_filters is not None else mel_filters(hp.n_mels)
    w.add_array(f"{ARCH}.mel_filters", np.asarray(filters, np.float32).reshape(-1).tolist())
    if file.alignment_heads:
        w.add_array(f"{ARCH}.alignment_heads", [int(x) for pair in file.alignment_heads for x in pair])
    for key in _LISTS:
        if getattr(file, key) is not None:
            w.add_array(f"{ARCH}.{key}", [int(x) for x in getattr(file, key)])
    for name in expected_tensors(hp):
        t = tensors[name]
        row_bytes = T.row_size(t.type, t.ne[0])
        if T.is_quantized(t.type):
            data = t.data.reshape(*t.shape[:-1], row_bytes)
        else:
            data = t.data.view(T.numpy_dtype(t.type)).reshape(t.shape)
        w.add_tensor(name, data, raw_dtype=GGMLQuantizationType(int(t.type)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _ints(g: GGUFFile, key: str) -> list[int] | None:
    value = g.get(f"{ARCH}.{key}")
    return None if value is None else [int(x) for x in value]


def read_gguf(path) -> WhisperFile:
    """Read a Whisper GGUF written by ``write_gguf``; tensors stay views of the mapped file."""
    path = Path(path)
    try:
        g = GGUFFile.open(path)
    except GGUFError as e:
        raise WhisperFileError(str(e)) from e
    if g.get("general.architecture") != ARCH:
        raise WhisperFileError(f"{path}: a GGUF of architecture {g.get('general.architecture')!r}, not Whisper")
    try:
        values = {f.name: int(g.require(f"{ARCH}.{f.name}")) for f in fields(WhisperHParams) if f.name != "ftype"}
        hp = WhisperHParams(**values, ftype=int(g.require("general.file_type")))
        vocab = [token_bytes(t) for t in g.require("tokenizer.ggml.tokens", GGUFValueType.ARRAY)]
    except GGUFError as e:
        raise WhisperFileError(str(e)) from e
    except KeyError as e:
        raise WhisperFileError(f"{path}: a token has character {e} outside GPT-2's byte alphabet") from None
    if len(vocab) != hp.n_vocab:
        raise WhisperFileError(f"{path}: {len(vocab)} tokens, n_vocab is {hp.n_vocab}")
    tensors = {}
    for info in g.tensors:
        tensors[info.name] = Weight(GGMLType(int(info.type)), tuple(info.ne[:info.n_dims]),
                                    np.frombuffer(g.tensor_bytes(info), np.uint8))
    check_tensors(tensors, hp, str(path))
    filters = g.get(f"{ARCH}.mel_filters")
    heads = _ints(g, "alignment_heads")
    return WhisperFile(
        hparams=hp, tensors=tensors, vocab=vocab,
        mel_filters=None if filters is None else np.asarray(filters, np.float32).reshape(hp.n_mels, N_FFT // 2 + 1),
        alignment_heads=None if heads is None else list(zip(heads[::2], heads[1::2], strict=False)),
        **{key: _ints(g, key) for key in _LISTS}, format="gguf", path=str(path))
