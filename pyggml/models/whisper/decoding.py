"""Decoding one 30 s window, as whisper.cpp and openai-whisper do: logit filters, greedy, sampling, beam search.

A window's decoder input is a prefix (an optional `<|startofprev|>` prompt, then `<|startoftranscript|>`,
language and task tokens, and `<|notimestamps|>` when timestamps are off) and the sampled tokens after it.
At every step the logits are filtered before a token is chosen:
- suppressed tokens (the model's list and the special tokens), and at the first step the blank (" ") and
  `<|endoftext|>`;
- timestamp rules: timestamps come in pairs (a text token cannot follow a lone timestamp, a timestamp cannot
  follow a pair), they never decrease, the first token is a timestamp of at most 1.0 s, and a timestamp is
  forced when the timestamps' total probability beats the most likely text token.
Greedy takes the best token; a temperature > 0 samples (seeded) `best_of` sequences; beam search keeps
`beam_size` sequences (each in its own block of KV cache cells) and ranks the finished ones by
log-probability / length. Ties are broken by order, so results are deterministic.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from pyggml.errors import GGMLError

TIME_PRECISION = 0.02       # seconds per timestamp token
MAX_INITIAL_TIMESTAMP = 1.0


@dataclass
class WindowResult:
    """One window's decoded tokens (after the prefix, without `<|endoftext|>`) and their statistics."""

    tokens: list[int]
    sum_logprob: float
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    text: str = ""
    compression_ratio: float = 0.0


@dataclass
class LogitFilter:
    """whisper.cpp's whisper_process_logits / openai's logit filters for one window."""

    tok: object  # WhisperTokenizer: the special token ids
    suppress: list[int] = field(default_factory=list)
    suppress_begin: list[int] = field(default_factory=list)
    timestamps: bool = True

    def __post_init__(self):
        sp = self.tok
        specials = [sp.translate, sp.transcribe, sp.sot, sp.startofprev, sp.startoflm, sp.nospeech]
        self._suppress = np.unique(np.asarray([t for t in [*self.suppress, *specials] if 0 <= t < sp.n_vocab],
                                              dtype=np.int64))
        self._suppress_begin = np.asarray(self.suppress_begin or [220, sp.eot], dtype=np.int64)
        self._max_initial = sp.timestamp_begin + round(MAX_INITIAL_TIMESTAMP / TIME_PRECISION)

    def apply(self, logits: np.ndarray, tokens: list[int]) -> np.ndarray:
        """Filter the logits (in place) for the token after `tokens` (the tokens sampled so far)."""
        logits[self._suppress] = -np.inf
        if not tokens:
            logits[self._suppress_begin] = -np.inf
        tb = self.tok.timestamp_begin
        if not self.timestamps:
            logits[tb:] = -np.inf
            return logits
        logits[self.tok.notimestamps] = -np.inf
        last_ts = len(tokens) >= 1 and tokens[-1] >= tb
        penultimate_ts = len(tokens) < 2 or tokens[-2] >= tb
        if last_ts:
            if penultimate_ts:
                logits[tb:] = -np.inf           # after a pair (or a first timestamp): text
            else:
                logits[:self.tok.eot] = -np.inf  # after text and one timestamp: its pair or the end
        stamps = [t for t in tokens if t >= tb]
        if stamps:
            floor = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
            logits[tb:floor] = -np.inf          # timestamps never go back
        if not tokens:
            logits[:tb] = -np.inf               # the first token is a timestamp ...
            logits[self._max_initial + 1:] = -np.inf  # ... of at most 1.0 s
        logprobs = log_softmax(logits)
        text_max = logprobs[:tb].max()
        if np.logaddexp.reduce(logprobs[tb:]) > text_max:
            logits[:tb] = -np.inf               # the timestamps together are more likely than any text
        return logits


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compression_ratio(text: str) -> float:
    """Bytes / zlib-compressed bytes: high for repetitive (looping) text."""
    raw = text.encode("utf-8")
    return len(raw) / len(zlib.compress(raw)) if raw else 0.0


def _sample_len(model, n_prefix: int, sample_len: int | None) -> int:
    """The most tokens to decode after a prefix: half the text context (openai's), as room is left."""
    sample_len = min(sample_len or model.n_text_ctx // 2, model.n_text_ctx - n_prefix)
    if sample_len <= 0:
        raise GGMLError(f"decode: a prefix of {n_prefix} tokens leaves no room in {model.n_text_ctx} positions")
    return sample_len


def decode_window(model, flt: LogitFilter, prefix: list[int], temperature: float = 0.0, beam_size: int = 1,
                  best_of: int = 1, rng: np.random.Generator | None = None, sample_len: int | None = None
                  ) -> WindowResult:
    """Decode the window the model has encoded, after `prefix`; beam search when temperature is 0 and
    beam_size > 1, else greedy (temperature 0) or the best of `best_of` seeded samples."""
    tok = flt.tok
    n_prefix = len(prefix)
    sample_len = _sample_len(model, n_prefix, sample_len)
    model.ensure_sequences(beam_size if temperature == 0 else best_of)
    sot_index = prefix.index(tok.sot)
    rows = sorted({sot_index, n_prefix - 1})
    logits = model.decode(prefix, np.arange(n_prefix), out_rows=rows)
    no_speech = float(np.exp(log_softmax(logits[0])[tok.nospeech]))
    first = logits[-1]
    if temperature == 0 and beam_size > 1:
        tokens, sum_lp = _beam_search(model, flt, first, n_prefix, beam_size, sample_len)
    else:
        n = 1 if temperature == 0 else best_of
        tokens, sum_lp = _sample(model, flt, first, n_prefix, n, temperature, rng, sample_len)
    return WindowResult(tokens, sum_lp, sum_lp / (len(tokens) + 1), no_speech, temperature)


def decode_batch(model, flt: LogitFilter, prefix: list[int], n_batch: int, sample_len: int | None = None
                 ) -> list[WindowResult]:
    """Greedy decoding of the n_batch windows encoded into cross-attention slots 0..n_batch-1, each after
    `prefix`, all sequences stepped together in one graph per step (faster-whisper's batched generate); each
    sequence's tokens are those decode_window gives its window alone. A sequence that has ended is fed
    <|endoftext|> until all have: the batch keeps its shape, so sequence b stays on slot b and a step is
    one graph (chunks of up to 30 s of speech end at similar lengths)."""
    tok = flt.tok
    n_prefix = len(prefix)
    sample_len = _sample_len(model, n_prefix, sample_len)
    model.ensure_sequences(n_batch)
    rows = sorted({prefix.index(tok.sot), n_prefix - 1})
    logits = model.decode(np.tile(prefix, n_batch), np.tile(np.arange(n_prefix), n_batch),
                          np.repeat(np.arange(n_batch), n_prefix),
                          [b * n_prefix + r for b in range(n_batch) for r in rows], n_batch)
    logits = logits.reshape(n_batch, len(rows), -1)
    no_speech = np.exp(log_softmax(logits[:, 0])[:, tok.nospeech])
    current = logits[:, -1]
    tokens, sum_lp, live = [[] for _ in range(n_batch)], [0.0] * n_batch, [True] * n_batch
    for position in range(n_prefix, n_prefix + sample_len):
        for b in range(n_batch):
            if live[b]:
                filtered = flt.apply(current[b].copy(), tokens[b])
                t = int(np.argmax(filtered))
                sum_lp[b] += float(log_softmax(filtered)[t])
                live[b] = t != tok.eot and len(tokens[b]) + 1 < sample_len
                if t != tok.eot:
                    tokens[b].append(t)
        if not any(live):
            break
        fed = [tokens[b][-1] if live[b] else tok.eot for b in range(n_batch)]
        current = model.decode(fed, [position] * n_batch, np.arange(n_batch), range(n_batch), n_batch)
    return [WindowResult(tokens[b], sum_lp[b], sum_lp[b] / (len(tokens[b]) + 1), float(no_speech[b]), 0.0)
            for b in range(n_batch)]


def _rank(candidates: list[tuple[list[int], float]]) -> tuple[list[int], float]:
    """The candidate with the best log-probability per token (openai's ranking without length penalty)."""
    return max(candidates, key=lambda c: c[1] / max(len(c[0]), 1))


def _sample(model, flt, first, n_prefix, n, temperature, rng, sample_len):
    """n independent sequences (greedy when temperature is 0), fed together, sequence i in KV block i."""
    eot = flt.tok.eot
    if n > 1:
        model.copy_sequences([0] * n, n_prefix)
    if temperature > 0 and rng is None:
        raise GGMLError("sampling at a temperature > 0 needs a seeded random generator")
    tokens, sum_lp, live = [[] for _ in range(n)], [0.0] * n, list(range(n))
    logits = np.repeat(first[None], n, axis=0)
    for _ in range(sample_len):
        still = []
        for row, i in enumerate(live):
            filtered = flt.apply(logits[row].copy(), tokens[i])
            lp = log_softmax(filtered)
            if temperature == 0:
                t = int(np.argmax(filtered))
            else:
                p = np.exp(log_softmax(filtered / temperature))
                t = int(min(np.searchsorted(np.cumsum(p), rng.random() * p.sum()), len(p) - 1))
            sum_lp[i] += float(lp[t])
            if t != eot:
                tokens[i].append(t)
                still.append(i)
        live = still
        if not live or len(tokens[live[0]]) >= sample_len:
            break
        logits = model.decode([tokens[i][-1] for i in live], [n_prefix + len(tokens[i]) - 1 for i in live],
                              seqs=live, out_rows=range(len(live)))
    return _rank(list(zip(tokens, sum_lp, strict=True)))


def _beam_search(model, flt, first, n_prefix, beam_size, sample_len):  # noqa: C901
    """openai's BeamSearchDecoder (patience 1): each beam offers its beam_size + 1 best continuations, the
    best beam_size unfinished ones go on, finished ones are kept until beam_size of them exist."""
    eot = flt.tok.eot
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    logits = first[None]
    finished: dict[tuple, float] = {}
    for step in range(sample_len):
        scores: dict[tuple, float] = {}
        sources: dict[tuple, int] = {}
        for b, (seq, score) in enumerate(beams):
            lp = log_softmax(flt.apply(logits[b].copy(), seq))
            for t in np.argsort(-lp, kind="stable")[:beam_size + 1]:
                cand = (*seq, int(t))
                if cand not in scores:
                    scores[cand], sources[cand] = score + float(lp[t]), b
        kept, new_finished = [], {}
        for cand in sorted(scores, key=scores.get, reverse=True):
            if cand[-1] == eot:
                new_finished[cand[:-1]] = scores[cand]
            else:
                kept.append(cand)
                if len(kept) == beam_size:
                    break
        for cand in sorted(new_finished, key=new_finished.get, reverse=True):
            if len(finished) >= beam_size:
                break
            finished.setdefault(cand, new_finished[cand])
        if len(finished) >= beam_size or not kept or step + 1 >= sample_len:
            break
        model.copy_sequences([sources[c] for c in kept], n_prefix + step)
        beams = [(list(c), scores[c]) for c in kept]
        logits = model.decode([c[-1] for c in kept], [n_prefix + step] * len(kept), seqs=range(len(kept)),
                              out_rows=range(len(kept)))
    for seq, score in sorted(beams, key=lambda b: b[1], reverse=True):  # too few finished: the best open beams
        if len(finished) >= beam_size:
            break
        finished.setdefault(tuple(seq), score)
    return _rank([(list(seq), score) for seq, score in finished.items()])
