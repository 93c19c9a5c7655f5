"""Draft tokens for speculative decoding, as llama.cpp's common/speculative.cpp makes them.

A drafter guesses the next tokens of a sequence; the engine feeds the sequence's pending token and the
draft in one batched step of the target model, with logits for each, keeps the longest prefix of the draft
the target's own choices agree with (Sampler.sample_against), and gives back the KV cells of the rest.
Two drafters:

- NgramDrafter (llama.cpp's `--spec-type ngram`, prompt lookup): the tokens that followed the latest earlier
  occurrence of the sequence's last n tokens. No model: it pays off where the output repeats its context
  (code edits, summaries, quotes).
- ModelDrafter (`--model-draft`): a smaller model of the same vocabulary (checked as llama.cpp's
  common_speculative_are_compatible checks it) generates the draft greedily, stopping early when its top
  probability falls below p_min. It keeps each sequence's tokens in its own KV cache and re-reads only what
  changed since the last draft.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyggml.errors import AllocationError, ParameterError
from pyggml.models.llm.batch import Batch, common_prefix

SPEC_TYPES = ("draft", "ngram")
VOCAB_MAX_SIZE_DIFFERENCE = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE
VOCAB_CHECK_START_TOKEN_ID = 5   # llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID: ids below may differ


@dataclass(frozen=True)
class SpecParams:
    """llama.cpp's --draft-max, --draft-min, --draft-p-min, and the n-gram size of prompt lookup."""

    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.75
    ngram: int = 3

    def __post_init__(self):
        for name in ("n_max", "ngram"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) \
                    or getattr(self, name) < 1:
                raise ParameterError(f"speculative {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if isinstance(self.n_min, bool) or not isinstance(self.n_min, int) or not 0 <= self.n_min <= self.n_max:
            raise ParameterError(f"speculative n_min must be an integer in [0, n_max={self.n_max}], got "
                                 f"{self.n_min!r}")
        if not 0.0 <= self.p_min <= 1.0:
            raise ParameterError(f"speculative p_min must be in [0, 1], got {self.p_min!r}")


class NgramDrafter:
    """Prompt lookup: the continuation of the latest earlier match of the last n tokens (n = params.ngram,
    then shorter down to 1 when it has no match)."""

    def __init__(self, params: SpecParams = SpecParams()):
        self.params = params

    def prepare(self, n_seq: int) -> None:
        """Nothing is kept per sequence."""

    def draft(self, seq_id: int, context: list[int], n_max: int) -> list[int]:
        ctx = np.asarray(context, dtype=np.int64)
        for n in range(min(self.params.ngram, len(ctx) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)
            hits = np.flatnonzero((windows == ctx[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return _at_least(ctx[start:start + n_max].tolist(), self.params.n_min)
        return []


class ModelDrafter:
    """A draft model generating greedily in the same sequence ids as the target (its own KV cache)."""

    def __init__(self, model, params: SpecParams = SpecParams()):
        self.model = model
        self.params = params
        self._cached: dict[int, list[int]] = {}  # seq id -> the tokens in the draft model's cells

    def prepare(self, n_seq: int) -> None:
        """Serve sequence ids [0, n_seq) from an empty cache."""
        self.model.reset()
        self._cached.clear()
        if self.model.n_seq_max < n_seq:
            self.model.set_n_seq_max(n_seq)

    def draft(self, seq_id: int, context: list[int], n_max: int) -> list[int]:
        try:
            return _at_least(self._draft(seq_id, context, n_max), self.params.n_min)
        except AllocationError:  # the draft cache is full of other sequences: start again from this one alone
            for other in list(self._cached):
                self.forget(other)
            return _at_least(self._draft(seq_id, context, n_max), self.params.n_min)

    def _draft(self, seq_id: int, context: list[int], n_max: int) -> list[int]:
        have = self._cached.get(seq_id, [])
        keep = min(common_prefix(have, context), len(context) - 1)
        self.model.seq_rm(seq_id, keep, -1)
        self._cached[seq_id] = list(context[:keep])
        logits = self.model.decode_batch(Batch.sequence(context[keep:], keep, seq_id))[-1]
        self._cached[seq_id] = list(context)
        out: list[int] = []
        while True:
            token, p = _top(logits)
            if p < self.params.p_min:
                return out
            out.append(token)
            if len(out) == n_max:
                return out
            logits = self.model.decode_batch(Batch.sequence([token], len(self._cached[seq_id]), seq_id))[-1]
            self._cached[seq_id].append(token)

    def forget(self, seq_id: int) -> None:
        self.model.seq_rm(seq_id)
        self._cached.pop(seq_id, None)


def _top(logits: np.ndarray) -> tuple[int, float]:
    token = int(np.argmax(logits))
    m = float(logits[token])
    return token, 1.0 / float(np.exp(logits.astype(np.float64) - m).sum())


def _at_least(draft: list[int], n_min: int) -> list[int]:
    """llama.cpp drops a draft shorter than --draft-min."""
    return draft if len(draft) >= max(n_min, 1) else []


def check_compatible(target, draft) -> None:
    """Refuse a draft model whose vocabulary differs from the target's as llama.cpp does: the vocabulary type,
    BOS and EOS (whether added, and which), a size difference over 128, or any token text from id 5 on."""
    t, d = target.tokenizer, draft.tokenizer
    checks = [("vocabulary type", type(t).__name__, type(d).__name__),
              ("add BOS", t.add_bos, d.add_bos), ("add EOS", t.add_eos, d.add_eos)]
    if t.add_bos:
        checks.append(("BOS token", t.bos_id, d.bos_id))
    if t.add_eos:
        checks.append(("EOS token", t.eos_id, d.eos_id))
    for what, a, b in checks:
        if a != b:
            raise ParameterError(f"the draft model's {what} ({b}) differs from the target's ({a})")
    if abs(t.n_vocab - d.n_vocab) > VOCAB_MAX_SIZE_DIFFERENCE:
        raise ParameterError(f"the draft model's vocabulary has {d.n_vocab} tokens, the target's {t.n_vocab}: more "
                             f"than {VOCAB_MAX_SIZE_DIFFERENCE} apart")
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(t.n_vocab, d.n_vocab)):
        if t.tokens[i] != d.tokens[i]:
            raise ParameterError(f"the draft model's token {i} is {d.tokens[i]!r}, the target's {t.tokens[i]!r}")
