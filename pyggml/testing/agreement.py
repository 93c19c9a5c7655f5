"""How close two implementations' logits are, measured as llama.cpp measures a quantized model against
its reference (llama-perplexity --kl-divergence): teacher-forced, per position, the KL divergence
KL(reference || other) of the next-token distributions, whether both pick the same top-1 token, and
each side's log-likelihood of the actual next token (for the two perplexities).

Rows are reduced in float64 blocks so full-vocabulary logits of long chunks stay small in memory and
divergences near 1e-7 are not lost to float32 rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_ROWS = 32  # rows per float64 block (32 x 262144 values = 64 MiB)
F32_BOUND = 1e-6      # mean KLD allowed with F32 weights on both sides
# Against the yardstick (llama.cpp on the weights converted to F32): two float32 runs of one F32 model differ
# by a KLD below 1e-8, which moves a comparison with a third run by a little; measured ratios 1.000 to 1.005.
YARDSTICK_SLACK = 1.01


def within_yardstick(got: dict, yardstick: dict) -> list[tuple[str, bool]]:
    """(what, holds) for: mean KLD no more than the yardstick's (with YARDSTICK_SLACK) and top-1 agreement
    no lower than the yardstick's but for one position. Both are summaries of the same positions."""
    ratio = got["kld_mean"] / yardstick["kld_mean"] if yardstick["kld_mean"] else float("inf")
    return [(f"mean KLD {got['kld_mean']:.3e} = {ratio:.4f} x the yardstick's {yardstick['kld_mean']:.3e} "
             f"(<= {YARDSTICK_SLACK})", got["kld_mean"] <= YARDSTICK_SLACK * yardstick["kld_mean"]),
            (f"top-1 {100 * got['top1']:.2f}% >= the yardstick's {100 * yardstick['top1']:.2f}% less one position",
             got["top1"] >= yardstick["top1"] - 1.0 / got["n"])]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass
class Agreement:
    """Per-position measurements, accumulated chunk by chunk; `summary()` reduces them."""

    kld: list = field(default_factory=list)
    same_top1: list = field(default_factory=list)
    nll_ref: list = field(default_factory=list)
    nll_other: list = field(default_factory=list)

    def add(self, ref_logits: np.ndarray, logits: np.ndarray, next_tokens=None) -> None:
        """Rows of both sides' logits for the same positions; next_tokens (one per row, -1 where the
        next token is unknown) give the perplexities."""
        ref_logits, logits = np.atleast_2d(ref_logits), np.atleast_2d(logits)
        if ref_logits.shape != logits.shape:
            raise ValueError(f"logits of shapes {ref_logits.shape} and {logits.shape} do not pair up")
        targets = np.full(len(logits), -1) if next_tokens is None else np.asarray(next_tokens)
        for i in range(0, len(logits), _ROWS):
            lp, lq = log_softmax(ref_logits[i:i + _ROWS]), log_softmax(logits[i:i + _ROWS])
            self.kld.extend((np.exp(lp) * (lp - lq)).sum(axis=-1).clip(min=0.0))
            self.same_top1.extend(lp.argmax(axis=-1) == lq.argmax(axis=-1))
            rows = np.arange(len(lp))
            t = targets[i:i + _ROWS]
            known = t >= 0
            self.nll_ref.extend(-lp[rows[known], t[known]])
            self.nll_other.extend(-lq[rows[known], t[known]])

    def summary(self) -> dict:
        kld = np.asarray(self.kld)
        out = {"n": int(kld.size), "kld_mean": float(kld.mean()), "kld_median": float(np.median(kld)),
               "kld_p99": float(np.percentile(kld, 99)), "kld_max": float(kld.max()),
               "top1": float(np.mean(self.same_top1))}
        if self.nll_ref:
            out["ppl_ref"] = float(np.exp(np.mean(self.nll_ref)))
            out["ppl_other"] = float(np.exp(np.mean(self.nll_other)))
        return out


def agreement(ref_logits: np.ndarray, logits: np.ndarray, next_tokens=None) -> dict:
    """The summary of one set of rows (see Agreement)."""
    a = Agreement()
    a.add(ref_logits, logits, next_tokens)
    return a.summary()


def topk_kld_lower_bound(ref_top_logits: np.ndarray, ref_top_ids: np.ndarray, ref_logsumexp: np.ndarray,
                         logits: np.ndarray) -> np.ndarray:
    """Per row, a lower bound of KL(reference || other) knowing only the reference's k largest logits and
    its log-sum-exp, and the other side's full logits: the top-k terms exactly, plus the tail by the
    log-sum inequality (the reference's remaining mass m_P against the other's mass m_Q on the same
    tokens contributes at least m_P log(m_P / m_Q)). Tight when the top k hold nearly all the mass."""
    lq = log_softmax(logits)
    rows = np.arange(len(lq))[:, None]
    lp_top = np.asarray(ref_top_logits, np.float64) - np.asarray(ref_logsumexp, np.float64)[:, None]
    lq_top = lq[rows, ref_top_ids]
    head = (np.exp(lp_top) * (lp_top - lq_top)).sum(axis=-1)
    m_p = np.clip(1.0 - np.exp(lp_top).sum(axis=-1), 1e-300, None)
    m_q = np.clip(1.0 - np.exp(lq_top).sum(axis=-1), 1e-300, None)
    return np.clip(head + m_p * np.log(m_p / m_q), 0.0, None)
