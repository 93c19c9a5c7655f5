"""Whisper's hyperparameters, as whisper.cpp's ``whisper_hparams`` holds them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# ggml_ftype values whisper.cpp files use (llama.cpp's "mostly" file types).
FTYPE_ALL_F32 = 0
FTYPE_MOSTLY_F16 = 1
FTYPE_MOSTLY_Q4_0 = 2
FTYPE_MOSTLY_Q4_1 = 3
FTYPE_MOSTLY_Q8_0 = 7
FTYPE_MOSTLY_Q5_0 = 8
FTYPE_MOSTLY_Q5_1 = 9
QNT_VERSION = 2  # GGML_QNT_VERSION: quantized legacy files store ftype + QNT_VERSION * QNT_VERSION_FACTOR
QNT_VERSION_FACTOR = 1000

MULTILINGUAL_MIN_VOCAB = 51865  # whisper.cpp's whisper_is_multilingual: n_vocab >= 51865


@dataclass(frozen=True)
class WhisperHParams:
    """The eleven int32 fields a whisper.cpp ggml file starts with, in the same order.

    ``ftype`` is the plain ggml_ftype (0 all F32, 1 mostly F16, 2/3 Q4_0/Q4_1, 7 Q8_0, 8/9 Q5_0/Q5_1): the
    quantization version that legacy files add on top is stripped when reading.
    """

    n_vocab: int = 51864
    n_audio_ctx: int = 1500
    n_audio_state: int = 384
    n_audio_head: int = 6
    n_audio_layer: int = 4
    n_text_ctx: int = 448
    n_text_state: int = 384
    n_text_head: int = 6
    n_text_layer: int = 4
    n_mels: int = 80
    ftype: int = FTYPE_MOSTLY_F16

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= MULTILINGUAL_MIN_VOCAB

    def as_tuple(self) -> tuple[int, ...]:
        """The fields in file order."""
        return tuple(asdict(self).values())
