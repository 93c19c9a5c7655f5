"""FLASH_ATTN_EXT over an F32 or F16 KV cache, as kernels/attention.py computes it: per query row the scores
q·k * scale (soft-capped: softcap * tanh(score * scale / softcap)) plus slope * mask, a softmax whose max
includes the sink and whose sum is float32, then the weighted sum of V rows divided by that sum (0 for a
row with every key masked and no sink). One pass over K and one over V per row, no score matrix."""

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
    group = n_head // n_head_kv
    has_mask, has_sinks = mask.size > 0, sinks.size > 0
    scores = np.empty(n_kv, np.float32)
    qrow = np.empty(d_k, np.float32)
    acc = np.empty(d_v, np.float32)
    for i3 in range(ne3):
        for h in range(n_head):
            hk = h // group
            for t in range(n_tokens):
                for d in range(np.uintp(d_k)):
                    qrow[d] = widen(q[i3, h, t, d], table)
                for j in range(np.uintp(n_kv)):
                    s = dot_f32(qrow, k[i3, hk, j], table) * pre_scale
                    if softcap != np.float32(0):
                        s = np.tanh(s) * softcap
                    if has_mask:
                        s += slopes[h] * widen(mask[i3 % mask.shape[0], h % mask.shape[1], t, j], table)
                    scores[j] = s
                peak = max_f32(scores)
                if has_sinks:
                    peak = max(peak, sinks[h])
                if peak == np.float32(-np.inf):
                    peak = np.float32(0)
                total = np.float32(0)
                for j in range(np.uintp(n_kv)):
                    scores[j] = expf(scores[j] - peak)
                    total += scores[j]
                if has_sinks:
                    total += expf(sinks[h] - peak)
                acc[:] = 0
                for j in range(np.uintp(n_kv)):
                    w = scores[j]
                    if w != np.float32(0):
                        for d in range(np.uintp(d_v)):
                            acc[d] += w * widen(v[i3, hk, j, d], table)
                for d in range(np.uintp(d_v)):
                    out[i3, t, h, d] = acc[d] / total if total != np.float32(0) else np.float32(0)
