"""FLASH_ATTN_EXT over an F32 or F16 KV cache, as kernels/attention.py computes it: per query row the scores
q·k * scale (soft-capped: softcap * tanh(score * scale / softcap)) plus slope * mask, a softmax whose max
includes the sink and whose sum is float32, then the weighted sum of V rows divided by that sum (0 for a
row with every key masked and no sink). Per token, K's rows once per query head and V's once per K/V head (the
query heads sharing it done together), no score matrix; a key the mask hides (-inf) is skipped, as ggml skips it."""

from __future__ import annotations

import numpy as np

from numba import prange

from pyggml.backend.cpu.jit import jit, parallel_jit
from pyggml.backend.cpu.jit.f16 import widen
from pyggml.backend.cpu.jit.floatbits import expf
from pyggml.backend.cpu.jit.reduce import max_f32, sum_f32


@jit(inline="always")
def exp_scores(row: np.ndarray, pre_scale: np.float32, softcap: np.float32, mask_row: np.ndarray,
               slope: np.float32, sink: np.float32) -> np.float32:
    """In place: the raw scores q·k of one query row become exp(s - max) for s = softcap·tanh(score·pre_scale)
    (score·pre_scale when softcap is 0) + slope·mask (mask_row of size 0: none); the max includes the sink
    (-inf: none), and a row that is all -inf is shifted by 0. Returns the row's sum plus exp(sink - max)."""
    n = np.uintp(row.shape[0])
    if softcap != np.float32(0):  # one loop per case: a branch or libm call inside a loop stops it vectorising
        for j in range(n):
            row[j] = np.tanh(row[j] * pre_scale) * softcap
    else:
        for j in range(n):
            row[j] *= pre_scale
    if mask_row.size > 0:
        for j in range(n):
            row[j] += slope * widen(mask_row[j])
    peak = max(max_f32(row), sink)
    if peak == np.float32(-np.inf):
        peak = np.float32(0)
    for j in range(n):
        row[j] = expf(row[j] - peak)
    return sum_f32(row) + expf(sink - peak)


@jit
def exp_score_rows(scores: np.ndarray, pre_scale: np.float32, softcap: np.float32, mask: np.ndarray,
                   slopes: np.ndarray, sinks: np.ndarray, totals: np.ndarray) -> None:
    """exp_scores over every row of scores (ne3, n_head, n_tokens, n_kv), totals (ne3, n_head, n_tokens)
    their sums: the middle of attention whose products BLAS does. mask: (m3, m2, >= n_tokens, n_kv),
    reused by index modulo, or of size 0; sinks: one per head or size 0."""
    ne3, n_head, n_tokens = scores.shape[0], scores.shape[1], scores.shape[2]
    no_row = np.zeros(0, mask.dtype)
    for i3 in range(ne3):
        for h in range(n_head):
            sink = sinks[h] if sinks.size > 0 else np.float32(-np.inf)
            for t in range(n_tokens):
                m = mask[i3 % mask.shape[0], h % mask.shape[1], t] if mask.size > 0 else no_row
                totals[i3, h, t] = exp_scores(scores[i3, h, t], pre_scale, softcap, m, slopes[h], sink)


@jit(fastmath={"reassoc", "nsz"})
def key_scores(qrow: np.ndarray, k: np.ndarray, k_head: np.uintp, k_stride: np.uintp, n_kv, mask_row: np.ndarray,
               scores: np.ndarray) -> None:
    """scores[j] = qrow · row j of the K head at k_head (dot_f32's sum), or -inf where mask_row hides key j, whose
    row is then not read (as ggml's CPU kernel: the many sequences of a shared cache each attend their own cells).
    One call a query row, not one a key (a 1B model's generation step at 540 keys: 11.7 -> 9.0 ms of flash
    attention, Intel Xeon; 3 ms without flash attention)."""
    for j in range(np.uintp(n_kv)):
        if mask_row.size > 0 and widen(mask_row[j]) == np.float32(-np.inf):
            scores[j] = np.float32(-np.inf)
        else:
            krow = k_head + j * k_stride
            total = np.float32(0)
            for d in range(np.uintp(qrow.shape[0])):
                total += qrow[d] * widen(k[krow + d])
            scores[j] = total


@parallel_jit
def flash_attn_rows(q: np.ndarray, k: np.ndarray, k_strides: np.ndarray, v: np.ndarray, v_strides: np.ndarray,  # noqa: C901
                    kv_dims: np.ndarray, mask: np.ndarray, sinks: np.ndarray, slopes: np.ndarray, out: np.ndarray,
                    pre_scale: np.float32, softcap: np.float32) -> None:
    """q: (ne3, n_head, n_tokens, d_k); k and v: the memory of (ne3, n_head_kv, n_kv, d) arrays as one 1-D
    array each, element (i3, h, j, d) at i3·s[0] + h·s[1] + j·s[2] + d for their strides s (so that the
    loops over a row see unit stride and vectorise); kv_dims: (n_head_kv, n_kv, d_v). Values are float32
    or F16 bits (uint16). mask: (m3, m2, >= n_tokens, n_kv) likewise, reused by index modulo, or of size 0;
    sinks: one per head or size 0; out: (ne3, n_tokens, n_head, d_v) float32. pre_scale is scale, or
    scale / softcap (rounded once to float32) when softcap is not 0. The K/V heads are shared over Numba's
    threads (launch under PARALLEL_LAUNCH): a 1B model's generation step at 540 keys 6.4 -> 3.8 ms of attention,
    the 3 ms of the products and softmax without flash attention."""
    ne3, n_head, n_tokens, d_k = q.shape
    n_head_kv, n_kv, d_v = kv_dims[0], kv_dims[1], kv_dims[2]
    group = n_head // n_head_kv  # the query heads that share one K/V head, done together: V read once
    has_mask, has_sinks = mask.size > 0, sinks.size > 0
    for task in prange(ne3 * n_head_kv):  # a K/V head and its query heads a task, shared over the threads
        i3, hk = task // n_head_kv, task % n_head_kv
        no_row = np.zeros(0, mask.dtype)
        scores = np.empty((group, n_kv), np.float32)
        qrows = np.empty((group, d_k), np.float32)
        acc = np.empty((group, d_v), np.float32)
        vrow_f32 = np.empty(d_v, np.float32)
        totals = np.empty(group, np.float32)
        k_head = np.uintp(i3 * k_strides[0] + hk * k_strides[1])
        v_head = np.uintp(i3 * v_strides[0] + hk * v_strides[1])
        for t in range(n_tokens):
            for g in range(group):
                for d in range(np.uintp(d_k)):
                    qrows[g, d] = widen(q[i3, hk * group + g, t, d])
            for g in range(group):
                h = hk * group + g
                m = mask[i3 % mask.shape[0], h % mask.shape[1], t] if has_mask else no_row
                key_scores(qrows[g], k, k_head, np.uintp(k_strides[2]), n_kv, m, scores[g])
                totals[g] = exp_scores(scores[g], pre_scale, softcap, m, slopes[h], sinks[h] if has_sinks else
                                       np.float32(-np.inf))
            acc[:, :] = 0
            for j in range(np.uintp(n_kv)):
                seen = False
                for g in range(group):
                    seen = seen or scores[g, j] != np.float32(0)
                if not seen:
                    continue  # a row no query head weighs (hidden by the mask) is not read
                vrow = v_head + j * np.uintp(v_strides[2])
                for d in range(np.uintp(d_v)):  # widened once for the group, not once a head: 3.7x faster
                    vrow_f32[d] = widen(v[vrow + d])
                for g in range(group):
                    w = scores[g, j]
                    if w != np.float32(0):
                        for d in range(np.uintp(d_v)):
                            acc[g, d] += w * vrow_f32[d]
            for g in range(group):
                for d in range(np.uintp(d_v)):
                    out[i3, t, hk * group + g, d] = acc[g, d] / totals[g] if totals[g] != np.float32(0) \
                        else np.float32(0)
