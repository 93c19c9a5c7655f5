"""whisper.cpp's legacy ggml model files (``ggml-*.bin``, the files whisper.rn and whisper.cpp load).

Layout (little-endian, no padding), as whisper.cpp's ``whisper_model_load`` reads it::

    u32 magic 0x67676d6c ("ggml")
    i32 n_vocab n_audio_ctx n_audio_state n_audio_head n_audio_layer
        n_text_ctx n_text_state n_text_head n_text_layer n_mels ftype   (ftype + 1000 * qnt_version)
    i32 n_mel, i32 n_fft(201), f32 filters[n_mel * n_fft]
    i32 n_tokens (50256 English-only / 50257 multilingual; some converters add the specials), { u32 len, bytes } each
    until EOF: { i32 n_dims, i32 name_len, i32 type, i32 ne[n_dims], name, data }

The file lists only the text tokens; whisper.cpp makes up the special ones, and so do we
(with their real texts, see ``tokenizer.special_tokens``).
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

import numpy as np

from pyggml.core import types as T
from pyggml.core.types import GGMLType
from pyggml.errors import UnsupportedTypeError, WhisperFileError
from pyggml.models.whisper.files import (
    FTYPE_OF_TYPE, GGML_MAGIC, Weight, WhisperFile, check_tensors, expected_tensors, layout_type)
from pyggml.models.whisper.hparams import QNT_VERSION, QNT_VERSION_FACTOR, WhisperHParams
from pyggml.models.whisper.mel import N_FFT, mel_filters
from pyggml.models.whisper.tokenizer import n_text_tokens, special_tokens

WRITE_TYPES = (GGMLType.F16, GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q4_0, GGMLType.Q4_1)
MAX_NAME = 1024


class _Cursor:
    def __init__(self, buf: np.ndarray, path: Path):
        self.buf, self.path, self.pos = buf, path, 0

    def take(self, n: int, what: str) -> np.ndarray:
        if n < 0 or n > len(self.buf) - self.pos:
            raise WhisperFileError(f"{self.path}: {what} at offset {self.pos} needs {n} bytes but the file ends "
                                   f"after {len(self.buf) - self.pos} (truncated?)")
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def ints(self, n: int, what: str, fmt: str = "i") -> tuple[int, ...]:
        return struct.unpack(f"<{n}{fmt}", self.take(4 * n, what).tobytes())


def read_ggml_bin(path) -> WhisperFile:
    """Read a whisper.cpp ggml .bin; tensors stay views of the mapped file."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            buf = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
    except (OSError, ValueError) as e:
        raise WhisperFileError(f"{path}: cannot map the file: {e}") from e
    cur = _Cursor(buf, path)
    if cur.ints(1, "magic", "I")[0] != GGML_MAGIC:
        raise WhisperFileError(f"{path}: not a whisper.cpp ggml file (magic is not 0x67676d6c)")
    fields = list(cur.ints(11, "hyperparameters"))
    fields[-1] %= QNT_VERSION_FACTOR
    hp = WhisperHParams(*fields)
    if min(fields[:-1]) <= 0:
        raise WhisperFileError(f"{path}: hyperparameters {hp} are not all positive (corrupt header)")
    n_mel, n_fft = cur.ints(2, "mel filter sizes")
    if n_mel != hp.n_mels or n_fft != N_FFT // 2 + 1:
        raise WhisperFileError(f"{path}: mel filters of {n_mel} x {n_fft}, expected {hp.n_mels} x {N_FFT // 2 + 1}")
    filters = cur.take(4 * n_mel * n_fft, "mel filters").view("<f4").reshape(n_mel, n_fft).copy()
    n_tokens, n_text = cur.ints(1, "token count")[0], n_text_tokens(hp.n_vocab)
    if not n_text <= n_tokens <= hp.n_vocab:
        raise WhisperFileError(f"{path}: {n_tokens} tokens for n_vocab {hp.n_vocab}, expected {n_text} "
                               f"(or up to {hp.n_vocab} with the special tokens)")
    vocab = []
    for i in range(n_tokens):
        vocab.append(cur.take(cur.ints(1, f"length of token {i}", "I")[0], f"token {i}").tobytes())
    vocab = vocab[:n_text] + special_tokens(hp.n_vocab)  # whisper.cpp, too, names the special tokens itself
    tensors = {}
    while cur.pos < len(buf):
        n_dims, name_len, ttype = cur.ints(3, f"tensor {len(tensors)} header")
        if not 1 <= n_dims <= 4 or not 0 < name_len <= MAX_NAME:
            raise WhisperFileError(f"{path}: tensor {len(tensors)} header at offset {cur.pos - 12} is corrupt "
                                   f"(n_dims {n_dims}, name length {name_len})")
        ne = cur.ints(n_dims, f"tensor {len(tensors)} shape")
        name = cur.take(name_len, f"tensor {len(tensors)} name").tobytes().decode("utf-8", errors="replace")
        try:
            ttype = T.as_type(ttype)
            nbytes = T.row_size(ttype, ne[0]) * int(np.prod(ne[1:], dtype=np.int64))
        except UnsupportedTypeError as e:
            raise WhisperFileError(f"{path}: tensor {name!r}: {e}") from None
        tensors[name] = Weight(ttype, tuple(ne), cur.take(nbytes, f"data of tensor {name!r}"))
    check_tensors(tensors, hp, str(path))
    return WhisperFile(hparams=hp, tensors=tensors, vocab=vocab, mel_filters=filters, format="ggml", path=str(path))


def tensors_as(file: WhisperFile, weight_type) -> dict[str, Weight]:
    """The file's tensors in whisper.cpp's layout for ``weight_type`` (one of WRITE_TYPES): matrices in that type,
    conv kernels F16, the rest F32; tensors already of the right type are not copied."""
    wtype = T.as_type(weight_type)
    if wtype not in WRITE_TYPES:
        raise UnsupportedTypeError(f"Whisper files are written as {', '.join(t.name for t in WRITE_TYPES)}, "
                                   f"not {wtype.name} (whisper.cpp's conv needs F16 kernels)")
    return {n: w.converted(layout_type(n, w.ne, wtype)) for n, w in file.tensors.items()}


def write_ggml_bin(file: WhisperFile, path, weight_type=GGMLType.F16) -> None:
    """Write ``file`` as a whisper.cpp ggml .bin with matrices in ``weight_type`` (one of WRITE_TYPES)."""
    tensors = tensors_as(file, weight_type)
    hp = file.hparams
    ftype = FTYPE_OF_TYPE[T.as_type(weight_type)]
    stored_ftype = ftype + (QNT_VERSION * QNT_VERSION_FACTOR if T.is_quantized(weight_type) else 0)
    filters = file.mel_filters if file.mel_filters is not None else mel_filters(hp.n_mels)
    n_tokens = n_text_tokens(hp.n_vocab)
    with open(path, "wb") as f:
        f.write(struct.pack("<I11i", GGML_MAGIC, *hp.as_tuple()[:-1], stored_ftype))
        f.write(struct.pack("<2i", *filters.shape))
        f.write(np.ascontiguousarray(filters, "<f4").tobytes())
        f.write(struct.pack("<i", n_tokens))
        for tok in file.vocab[:n_tokens]:
            f.write(struct.pack("<I", len(tok)) + tok)
        for name in expected_tensors(hp):
            w = tensors[name]
            raw_name = name.encode()
            f.write(struct.pack(f"<3i{len(w.ne)}i", len(w.ne), len(raw_name), w.type, *w.ne) + raw_name)
            w.data.tofile(f) if w.data.flags.c_contiguous else f.write(w.data.tobytes())
