"""What a transcription gives back (its segments and stage timings), and the sizes both the sequential and
the batched decoders follow: apart from pyggml.models.whisper.transcribe so that its batched path
(pyggml.models.whisper.batched) needs nothing of it."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyggml.models.timings import Stage

HOP = 160                                     # samples per mel frame (10 ms)
MAX_SEQUENCES = 16                            # beams or samples decoded together


@dataclass
class Segment:
    start: float
    end: float
    text: str
    tokens: list[int]
    avg_logprob: float = 0.0
    no_speech_prob: float = 0.0
    temperature: float = 0.0
    compression_ratio: float = 0.0
    words: list | None = None     # alignment.Word items with word_timestamps=True


@dataclass
class Timings:
    """Seconds per stage of the last transcription, and the audio's length; the encoder counts its windows, the
    decoder its steps."""

    load_s: float = 0.0
    vad_s: float = 0.0
    audio_s: float = 0.0
    mel: Stage = field(default_factory=Stage)
    encode: Stage = field(default_factory=Stage)
    decode: Stage = field(default_factory=Stage)

    mel_s = property(lambda self: self.mel.seconds)
    encode_s = property(lambda self: self.encode.seconds)
    decode_s = property(lambda self: self.decode.seconds)
    windows = property(lambda self: self.encode.count)
    decoder_steps = property(lambda self: self.decode.count)

    @property
    def total_s(self) -> float:
        return self.vad_s + self.mel_s + self.encode_s + self.decode_s

    @property
    def rtf(self) -> float:
        return self.total_s / self.audio_s if self.audio_s else 0.0
