"""Sampling the next token from logits, with llama.cpp's default chain and order:
logit bias, penalties (repeat, frequency, presence), top-k, typical-p, top-p, min-p, temperature, then a
draw (or argmax when temperature <= 0)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import math
from numbers import Integral, Real

import numpy as np

from pyggml.errors import ParameterError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    typical_p: float = 1.0                       # 1 disables it
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] | None = None  # added to a token's logit; -inf bans it

    def __post_init__(self):
        check_number("temperature", self.temperature, low=0.0)
        check_count("top_k", self.top_k, "0 disables it")
        check_number("top_p", self.top_p, low=0.0, high=1.0)
        check_number("min_p", self.min_p, low=0.0, high=1.0)
        check_number("repeat_penalty", self.repeat_penalty, low=0.0, low_open=True)
        check_count("repeat_last_n", self.repeat_last_n, "0 disables the penalty window")
        if self.seed is not None:
            check_count("seed", self.seed, "None draws a fresh one")
        check_number("typical_p", self.typical_p, low=0.0, high=1.0, low_open=True)
        check_number("presence_penalty", self.presence_penalty)
        check_number("frequency_penalty", self.frequency_penalty)
        for token, bias in (self.logit_bias or {}).items():
            check_count("a logit_bias token id", token)
            if not (isinstance(bias, Real) and not isinstance(bias, bool) and (math.isfinite(bias) or bias < 0)):
                raise ParameterError(f"logit_bias of token {token} must be a finite number or -inf, got {bias!r}")


def check_n_predict(n) -> int:
    """Tokens to generate: a count, or -1 for no limit but the context (llama.cpp's -n -1)."""
    if isinstance(n, bool) or not isinstance(n, Integral) or n < -1:
        raise ParameterError(f"n (tokens to generate) must be an integer >= 0, or -1 for no limit; got {n!r}")
    return int(n)


def check_count(name: str, value, note: str = "") -> int:
    """A non-negative integer parameter (bool is refused: True is no count)."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ParameterError(f"{name} must be an integer >= 0{f' ({note})' if note else ''}, got {value!r}")
    return int(value)


def check_number(name: str, value, low: float | None = None, high: float | None = None,
                 low_open: bool = False) -> float:
    """A finite real parameter within [low, high] ((low, high] when low_open)."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = (f"{'(' if low_open else '['}{low if low is not None else '-inf'}, "
                  f"{high if high is not None else 'inf'}]")
        raise ParameterError(f"{name} must be a finite number in {bounds}, got {value!r}")
    return float(value)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def apply_repeat_penalty(logits: np.ndarray, recent, penalty: float, frequency: float = 0.0,
                         presence: float = 0.0) -> np.ndarray:
    """llama.cpp's penalties: positive logits of recently seen tokens divided by `penalty`, negative ones
    multiplied; then minus count x frequency and minus presence for each seen token."""
    if (penalty == 1.0 and frequency == 0.0 and presence == 0.0) or not len(recent):
        return logits
    out = logits.copy()
    ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
    seen = out[ids]
    out[ids] = np.where(seen <= 0, seen * penalty, seen / penalty) - counts * frequency - presence
    return out


def apply_logit_bias(logits: np.ndarray, bias: Mapping[int, float] | None) -> np.ndarray:
    if not bias:
        return logits
    out = logits.copy()
    for token, value in bias.items():
        if token < out.size:
            out[token] += value
    return out


def keep_typical(logits: np.ndarray, p: float) -> np.ndarray:
    """Locally typical sampling (llama.cpp's typical_p): the tokens whose surprise is closest to the entropy,
    fewest first, until their probabilities add up to p."""
    if p >= 1.0:
        return logits
    probs = _softmax(logits.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = np.log(probs)
        entropy = -np.nansum(probs * log_p)
        distance = np.where(probs > 0, np.abs(-log_p - entropy), np.inf)
    order = np.argsort(distance, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(probs[order]), p) + 1)
    out = np.full_like(logits, -np.inf)
    out[order[:n_keep]] = logits[order[:n_keep]]
    return out


def keep_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    if k <= 0 or k >= logits.size:
        return logits
    cut = np.partition(logits, -k)[-k]
    return np.where(logits >= cut, logits, -np.inf)


def keep_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """The smallest set of most likely tokens whose probabilities add up to at least p."""
    if p >= 1.0:
        return logits
    order = np.argsort(-logits, kind="stable")
    cum = np.cumsum(_softmax(logits)[order])
    n_keep = int(np.searchsorted(cum, p) + 1)
    out = np.full_like(logits, -np.inf)
    out[order[:n_keep]] = logits[order[:n_keep]]
    return out


def keep_min_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Tokens at least p times as likely as the most likely one."""
    if p <= 0.0:
        return logits
    return np.where(logits >= logits.max() + np.log(p), logits, -np.inf)


class Sampler:
    """Picks tokens from logits; keeps the recent tokens for the penalty and its own random generator."""

    def __init__(self, params: SamplingParams = SamplingParams()):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.recent: list[int] = []

    def accept(self, token: int) -> None:
        """Remember a token for the penalty window (repeat_last_n <= 0 disables the window)."""
        keep = self.params.repeat_last_n
        self.recent = (self.recent + [int(token)])[-keep:] if keep > 0 else []

    def distribution(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The logits after bias and penalties, and the probabilities a draw picks from (None when greedy:
        the token is their argmax)."""
        p = self.params
        x = apply_logit_bias(np.asarray(logits, dtype=np.float32).ravel(), p.logit_bias)
        x = apply_repeat_penalty(x, self.recent, p.repeat_penalty, p.frequency_penalty, p.presence_penalty)
        if p.temperature <= 0.0:
            return x, None
        x = keep_min_p(keep_top_p(keep_typical(keep_top_k(x, p.top_k), p.typical_p), p.top_p), p.min_p)
        return x, _softmax(x.astype(np.float64) / p.temperature)

    def sample(self, logits: np.ndarray) -> int:
        x, probs = self.distribution(logits)
        if probs is None:
            return int(np.argmax(x))
        return int(self.rng.choice(probs.size, p=probs))

    def sample_against(self, logits: np.ndarray, draft: int) -> int:
        """A token distributed exactly as sample(logits)'s, drawn by speculative sampling's rule for a draft
        token: keep the draft with probability min(1, p/q), else draw from norm(max(0, p - q)). Drafts here
        are deterministic (n-gram lookup, a greedy draft model), so q is a point mass on the draft: keep it
        with probability p(draft), else draw from p without it. Greedy: the argmax, as sample gives."""
        x, probs = self.distribution(logits)
        if probs is None:
            return int(np.argmax(x))
        if self.rng.random() < probs[draft]:
            return int(draft)
        rest = probs.copy()
        rest[draft] = 0.0
        total = rest.sum()
        return int(self.rng.choice(rest.size, p=rest / total)) if total > 0 else int(draft)
