"""FLASH_ATTN_EXT over an F32 or F16 KV cache, as kernels/attention.py computes it: per query row the scores
q·k * scale (soft-capped: softcap * tanh(score * scale / softcap)) plus slope * mask, a softmax whose max
includes the sink and whose sum is float32, then the weighted sum of V rows divided by that sum (0 for a
row with every key masked and no sink). One pass over K and one over V per token and K/V head (the query
heads sharing it are done together), no score matrix."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import widen
from pyggml.backend.cpu.jit.floatbits import expf
from pyggml.backend.cpu.jit.reduce import dot_f32, max_f32


@jit
def flash_attn_rows(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, sinks: np.ndarray,
                    slopes: np.ndarray, out: np.ndarray, pre_scale: np.float32, softcap: np.float32,
                    table: np.ndarray) -> None:
    """q: (ne3, n_head, n_tokens, d_k), k: (ne3, n_head_kv, n_kv, d_k), v: (ne3, n_head_kv, n_kv, d_v) as
    float32 or F16 bits (uint16, widened through table); mask: (m3, m2, >= n_tokens, n_kv) likewise, reused by
    index modulo, or of size 0; sinks: one per head or size 0; out: (ne3, n_tokens, n_head, d_v) float32.
    pre_scale is scale, or scale / softcap (rounded once to float32) when softcap is not 0."""
    ne3, n_head, n_tokens, d_k = q.shape
    n_head_kv, n_kv, d_v = k.shape[1], k.shape[2], v.shape[3]
    group = n_head // n_head_kv  # the query heads that share one K/V head, done together: K and V read once
    has_mask, has_sinks = mask.size > 0, sinks.size > 0
    scores = np.empty((group, n_kv), np.float32)
    qrows = np.empty((group, d_k), np.float32)
    acc = np.empty((group, d_v), np.float32)
    totals = np.empty(group, np.float32)
    for i3 in range(ne3):
        for hk in range(n_head_kv):
            for t in range(n_tokens):
                for g in range(group):
                    for d in range(np.uintp(d_k)):
                        qrows[g, d] = widen(q[i3, hk * group + g, t, d], table)
                for j in range(np.uintp(n_kv)):
                    krow = k[i3, hk, j]
                    for g in range(group):
                        scores[g, j] = dot_f32(qrows[g], krow, table) * pre_scale
                for g in range(group):
                    h = hk * group + g
                    row = scores[g]
                    for j in range(np.uintp(n_kv)):
                        s = row[j]
                        if softcap != np.float32(0):
                            s = np.tanh(s) * softcap
                        if has_mask:
                            s += slopes[h] * widen(mask[i3 % mask.shape[0], h % mask.shape[1], t, j], table)
                        row[j] = s
                    peak = max_f32(row)
                    if has_sinks:
                        peak = max(peak, sinks[h])
                    if peak == np.float32(-np.inf):
                        peak = np.float32(0)
                    total = np.float32(0)
                    for j in range(np.uintp(n_kv)):
                        row[j] = expf(row[j] - peak)
                        total += row[j]
                    if has_sinks:
                        total += expf(sinks[h] - peak)
                    totals[g] = total
                acc[:, :] = 0
                for j in range(np.uintp(n_kv)):
                    vrow = v[i3, hk, j]
                    for g in range(group):
                        w = scores[g, j]
                        if w != np.float32(0):
                            for d in range(np.uintp(d_v)):
                                acc[g, d] += w * widen(vrow[d], table)
                for g in range(group):
                    for d in range(np.uintp(d_v)):
                        out[i3, t, hk * group + g, d] = acc[g, d] / totals[g] if totals[g] != np.float32(0) \
                            else np.float32(0)
