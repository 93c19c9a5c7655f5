"""Whisper's tokenizer: GPT-2 byte-level BPE plus Whisper's special tokens, from a model's vocabulary.

The ids follow whisper.cpp (``whisper_vocab``): after the text tokens come
``<|endoftext|>``, ``<|startoftranscript|>``, one token per language, ``<|translate|>``,
``<|transcribe|>``, ``<|startoflm|>``, ``<|startofprev|>``, ``<|nospeech|>``,
``<|notimestamps|>`` and 1501 timestamps ``<|0.00|>`` .. ``<|30.00|>`` (0.02 s apart).
English-only models have one text token fewer, so every special id is one lower.
The special tokens' texts are openai-whisper's, whatever file the model came from
(Hugging Face vocabularies say ``<|iw|>`` for Hebrew and ``<|nocaptions|>``; whisper.cpp
files carry none).

Encoding (for initial prompts) is tiktoken's BPE over the vocabulary alone: the token
ids are the merge ranks, so no merges table is needed.
"""

from __future__ import annotations

from functools import cached_property

from pyggml.errors import WhisperError
from pyggml.models.text.pre_tokenizer import GPT2_WORDS
from pyggml.models.text.tokenizer import _bytes_to_unicode
from pyggml.models.whisper.hparams import MULTILINGUAL_MIN_VOCAB

# Whisper's languages in token order; the first 99 are in every model, "yue" only in large-v3's vocabulary.
LANGUAGES = (
    "en", "zh", "de", "es", "ru", "ko", "fr", "ja", "pt", "tr", "pl", "ca", "nl", "ar", "sv", "it", "id", "hi",
    "fi", "vi", "he", "uk", "el", "ms", "cs", "ro", "da", "hu", "ta", "no", "th", "ur", "hr", "bg", "lt", "la",
    "mi", "ml", "cy", "sk", "te", "fa", "lv", "bn", "sr", "az", "sl", "kn", "et", "mk", "br", "eu", "is", "hy",
    "ne", "mn", "bs", "kk", "sq", "sw", "gl", "mr", "pa", "si", "km", "sn", "yo", "so", "af", "oc", "ka", "be",
    "tg", "sd", "gu", "am", "yi", "lo", "uz", "fo", "ht", "ps", "tk", "nn", "mt", "sa", "lb", "my", "bo", "tl",
    "mg", "as", "tt", "haw", "ln", "ha", "ba", "jw", "su", "yue",
)
LANGUAGE_ALIASES = {"iw": "he"}  # Hugging Face's code for Hebrew
N_TIMESTAMPS = 1501
TIMESTAMP_STEP = 0.02  # seconds per timestamp token

_CHAR_OF_BYTE = _bytes_to_unicode()
_BYTE_OF_CHAR = {c: b for b, c in _CHAR_OF_BYTE.items()}

# whisper.cpp's non-speech symbols (after openai-whisper's): suppressed, alone or after a space, when
# the file lists no suppress_ids.
_NON_SPEECH = ('"', "#", "(", ")", "*", "+", "/", ":", ";", "<", "=", ">", "@", "[", "\\", "]", "^", "_", "`",
               "{", "|", "}", "~", "「", "」", "『", "』", "<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('",
               "(\"", "((", "))", "(((", ")))", "[[", "]]", "{{", "}}", "♪♪", "♪♪♪", "♩", "♪", "♫", "♬", "♭", "♮",
               "♯")


def token_bytes(text: str) -> bytes:
    """The bytes of a vocabulary entry written in GPT-2's printable byte alphabet (KeyError on other characters)."""
    return bytes(_BYTE_OF_CHAR[c] for c in text)


def token_text(raw: bytes) -> str:
    """The inverse of ``token_bytes``: a token's bytes as GPT-2's printable characters (always valid UTF-8)."""
    return "".join(_CHAR_OF_BYTE[b] for b in raw)


def n_text_tokens(n_vocab: int) -> int:
    """Text (non-special) tokens: 50256 for English-only vocabularies, 50257 for multilingual ones."""
    return 50257 if n_vocab >= MULTILINGUAL_MIN_VOCAB else 50256


def special_tokens(n_vocab: int) -> list[bytes]:
    """The texts of the special tokens, in id order from ``<|endoftext|>`` (id ``n_text_tokens(n_vocab)``)."""
    n_lang = 99 + max(0, n_vocab - MULTILINGUAL_MIN_VOCAB)
    names = ["endoftext", "startoftranscript", *LANGUAGES[:n_lang], "translate", "transcribe", "startoflm",
             "startofprev", "nospeech", "notimestamps", *(f"{i * TIMESTAMP_STEP:.2f}" for i in range(N_TIMESTAMPS))]
    specials = [f"<|{n}|>".encode() for n in names]
    if n_text_tokens(n_vocab) + len(specials) != n_vocab:
        raise WhisperError(f"a vocabulary of {n_vocab} tokens is not a Whisper vocabulary "
                           f"(expected 51864 English-only, 51865 multilingual or 51866 large-v3)")
    return specials


class WhisperTokenizer:
    """Token ids <-> text for one Whisper vocabulary (``vocab[i]`` = token i's bytes)."""

    def __init__(self, vocab: list[bytes]):
        self.vocab = list(vocab)
        self.n_vocab = len(self.vocab)
        self.is_multilingual = self.n_vocab >= MULTILINGUAL_MIN_VOCAB
        self.eot = n_text_tokens(self.n_vocab)
        specials = special_tokens(self.n_vocab)
        self.n_languages = len(specials) - 8 - N_TIMESTAMPS
        self.sot = self.eot + 1
        self.language_base = self.sot + 1
        self.translate = self.language_base + self.n_languages
        self.transcribe = self.translate + 1
        self.startoflm = self.transcribe + 1
        self.startofprev = self.startoflm + 1
        self.nospeech = self.startofprev + 1
        self.nocaptions = self.nospeech  # the Hugging Face name
        self.notimestamps = self.nospeech + 1
        self.timestamp_begin = self.notimestamps + 1
        self._ranks = {tok: i for i, tok in enumerate(self.vocab[:self.eot])}
        self._cache: dict[str, list[int]] = {}

    # -- special tokens -----------------------------------------------------------------------

    @property
    def languages(self) -> tuple[str, ...]:
        return LANGUAGES[:self.n_languages]

    @property
    def lang_ids(self) -> list[int]:
        return list(range(self.language_base, self.language_base + self.n_languages))

    def language_token(self, code: str) -> int:
        code = LANGUAGE_ALIASES.get(code, code)
        if code not in self.languages:
            raise WhisperError(f"unknown language {code!r}; Whisper knows: {' '.join(self.languages)}")
        return self.language_base + self.languages.index(code)

    def language_of(self, token: int) -> str:
        """The language code of a language token."""
        if not self.language_base <= token < self.translate:
            raise WhisperError(f"token {token} is not a language token")
        return self.languages[token - self.language_base]

    def sot_sequence(self, language: str | None = None, task: str = "transcribe", timestamps: bool = True) -> list[int]:
        """The decoder's first tokens: [sot, language, task] for multilingual models, [sot] for English-only
        ones (which accept only language None or "en" and task "transcribe"), then <|notimestamps|> when
        timestamps are off."""
        if task not in ("transcribe", "translate"):
            raise WhisperError(f"unknown task {task!r}: expected 'transcribe' or 'translate'")
        seq = [self.sot]
        if self.is_multilingual:
            seq += [self.language_token(language or "en"), self.transcribe if task == "transcribe" else self.translate]
        elif language not in (None, "en") or task != "transcribe":
            raise WhisperError(f"an English-only model cannot {task} language {language!r}; use a multilingual model")
        if not timestamps:
            seq.append(self.notimestamps)
        return seq

    def is_timestamp(self, token: int) -> bool:
        return token >= self.timestamp_begin

    def timestamp_seconds(self, token: int) -> float:
        return (token - self.timestamp_begin) * TIMESTAMP_STEP

    def timestamp_token(self, seconds: float) -> int:
        """The timestamp token nearest ``seconds`` (clamped to 0..30 s)."""
        return self.timestamp_begin + min(N_TIMESTAMPS - 1, max(0, round(seconds / TIMESTAMP_STEP)))

    @cached_property
    def non_speech_tokens(self) -> list[int]:
        """Tokens whisper.cpp suppresses with suppress_nst: the non-speech symbols alone or after a space,
        when one token spells them, plus " -" and " '" (allowed inside words, not to start one)."""
        ids = {tok: i for i, tok in enumerate(self.vocab[:self.eot])}
        texts = [s.encode() for sym in _NON_SPEECH for s in (sym, " " + sym)] + [b" -", b" '"]
        return sorted({ids[t] for t in texts if t in ids})

    # -- text -----------------------------------------------------------------------------------

    def _check(self, token: int) -> None:
        if not 0 <= token < self.n_vocab:
            raise WhisperError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")

    def decode_bytes(self, ids) -> bytes:
        """The bytes of the text tokens (special tokens, timestamps included, are skipped)."""
        for t in ids:
            self._check(t)
        return b"".join(self.vocab[t] for t in ids if t < self.eot)

    def decode(self, ids) -> str:
        """Text of the text tokens; a byte sequence cut inside a UTF-8 character becomes U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_with_timestamps(self, ids) -> str:
        """Text with timestamp tokens written inline as ``<|1.08|>`` (other special tokens skipped)."""
        out, run = [], []
        for t in ids:
            self._check(t)
            if self.is_timestamp(t):
                out.append(b"".join(run).decode("utf-8", errors="replace"))
                out.append(f"<|{self.timestamp_seconds(t):.2f}|>")
                run = []
            elif t < self.eot:
                run.append(self.vocab[t])
        out.append(b"".join(run).decode("utf-8", errors="replace"))
        return "".join(out)

    @cached_property
    def _words(self):
        import regex  # \p{L} and \p{N}; tiktoken's GPT-2 pattern ends with a bare \s+

        return regex.compile(GPT2_WORDS + r"|\s+")

    def encode(self, text: str) -> list[int]:
        """Text tokens of ``text`` (no special tokens), as openai-whisper's tiktoken encoder gives them."""
        out = []
        for word in self._words.findall(text):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._cache[word] = self._bpe(word.encode("utf-8"))
            out += ids
        return out

    def _bpe(self, word: bytes) -> list[int]:
        """Merge the adjacent pair whose joined bytes have the lowest rank until no pair is a token."""
        ranks = self._ranks
        parts = [word[i:i + 1] for i in range(len(word))]
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        return [ranks[p] for p in parts]
