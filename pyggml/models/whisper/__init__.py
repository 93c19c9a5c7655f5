"""Whisper speech-to-text: model files, audio front end, tokenizer (and the graphs that run them)."""

from pyggml.models.whisper.audio import load_audio
from pyggml.models.whisper.files import Weight, WhisperFile
from pyggml.models.whisper.hparams import WhisperHParams
from pyggml.models.whisper.mel import log_mel_spectrogram, mel_filters
from pyggml.models.whisper.reader import load_whisper_file
from pyggml.models.whisper.tokenizer import WhisperTokenizer

__all__ = ["Weight", "WhisperFile", "WhisperHParams", "WhisperTokenizer", "load_audio", "load_whisper_file",
           "log_mel_spectrogram", "mel_filters"]
