"""Constrained output with llguidance (the library llama.cpp itself can use): a grammar (GBNF or Lark), a JSON
schema or "any JSON object" becomes a per-sequence `logits_processor` / `on_token` pair for the engine, so
each sequence of a batch carries its own constraint. The token mask is computed from the matcher's state
before each sampling and the tokens outside it are set to -inf."""

from __future__ import annotations

import threading

import numpy as np

from pyggml.models.text.tokenizer import TokenAttr
from pyggml.serve.protocol import APIError

_CONTROL, _USER_DEFINED = int(TokenAttr.CONTROL), int(TokenAttr.USER_DEFINED)  # what llguidance treats as special
# Compact JSON (`{"a":1,"b":2}`) with no free whitespace, which a weak model pads with forever; a schema's own
# "x-guidance" options override this
JSON_STYLE = {"whitespace_flexible": False}


class _VocabView:
    """What llguidance's TokenizerWrapper reads: each token's bytes (special ones marked with a 0xff prefix, as
    llguidance's llama.cpp bridge does), the ends of generation, and a text encoder."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eog_ids)
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [self._piece(i) for i in range(tokenizer.n_vocab)]
        self.special_token_ids = [i for i, a in enumerate(tokenizer.attrs) if a & _CONTROL]

    def _piece(self, i: int) -> bytes:
        piece = self._tokenizer.token_to_piece(i, special=True)
        attr = self._tokenizer.attrs[i]
        if attr & _CONTROL or (attr & _USER_DEFINED and piece.startswith(b"<") and piece.endswith(b">")):
            return b"\xff" + piece
        return piece

    def __call__(self, text: bytes) -> list[int]:
        return self._tokenizer.encode(text.decode("utf-8", "replace"), add_special=False, parse_special=False)


class ConstraintFactory:
    """Compiles request constraints for one model; llguidance's tokenizer is built once, on first use."""

    def __init__(self, tokenizer, n_vocab: int):
        self._tokenizer, self.n_vocab = tokenizer, n_vocab
        self._lltokenizer = None
        self._lock = threading.Lock()

    def lltokenizer(self):
        import llguidance

        with self._lock:
            if self._lltokenizer is None:
                vocab = _VocabView(self._tokenizer)
                self._lltokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(vocab), n_vocab=self.n_vocab,
                                                           eos_token=sorted(self._tokenizer.eog_ids))
            return self._lltokenizer

    def compile(self, kind: str, text: str, param: str) -> "Constraint":
        """kind: "gbnf" (also Lark), "json_schema" (a JSON text), "regex"; an APIError naming `param` when the
        grammar does not compile."""
        import llguidance

        try:
            if kind == "json_schema":
                grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_STYLE)
            else:
                grammar = llguidance.grammar_from(kind, text)
        except Exception as e:  # the converters raise ValueError or their own errors on bad text
            raise APIError(f"'{param}' is not a valid {kind} grammar: {e}", param=param) from None
        matcher = llguidance.LLMatcher(self.lltokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise APIError(f"'{param}' is not a valid {kind} grammar: {matcher.get_error()}", param=param)
        return Constraint(matcher, self.n_vocab)



class Constraint:
    """One sequence's grammar state: `logits_processor` masks, `on_token` advances (both on the engine thread)."""

    def __init__(self, matcher, n_vocab: int):
        self.matcher, self.n_vocab = matcher, n_vocab
        self._mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)

    def allowed(self) -> np.ndarray:
        """Boolean [n_vocab]: the tokens the grammar accepts next."""
        self.matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        return np.unpackbits(self._mask.view(np.uint8), bitorder="little")[:self.n_vocab].astype(bool)

    def logits_processor(self, generated: list[int], logits: np.ndarray) -> None:
        logits[~self.allowed()[:logits.shape[-1]]] = -np.inf

    def on_token(self, token: int) -> None:
        self.matcher.consume_token(int(token))

    @property
    def error(self) -> str | None:
        return self.matcher.get_error() if self.matcher.is_error() else None
