"""soft_max_ext over float32 rows: softmax(a * scale + slope[head] * mask (+ sink)), as kernels/attention.py
computes it (the row max includes the sink; an all -inf row is shifted by 0; the sum in float64), with the
vectorising expf.

A causal mask ends each row with -inf: those values are exactly 0 after the softmax (0 * 1/sum), so the
max, exp and sum passes stop where the mask's last finite value is (half the work of a prompt's rows).
That holds while the tail of the scaled row really is -inf: a +inf or NaN score there, or a slope <= 0,
makes the row go the whole way, as ggml computes it.
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import widen
from pyggml.backend.cpu.jit.floatbits import expf
from pyggml.backend.cpu.jit.reduce import max_f32, sum_f64


@jit
def finite_prefix(m: np.ndarray) -> np.intp:
    """The length of a mask row up to its last value that is not -inf (a max over the row, which
    vectorises, where a scan back from the end stayed scalar)."""
    last = np.intp(-1)
    for i in range(np.uintp(m.shape[0])):
        last = max(last, np.intp(i) if widen(m[i]) != np.float32(-np.inf) else np.intp(-1))
    return last + 1


@jit
def soft_max_rows(a: np.ndarray, out: np.ndarray, scale: np.float32, mask: np.ndarray, slopes: np.ndarray,  # noqa: C901
                  sinks: np.ndarray) -> None:
    """a, out: (ne3, ne2, ne1, ne0) with contiguous rows (out may be a). mask: (m3, m2, >= ne1, ne0), reused
    over ne3 and ne2 by index modulo, float32 or F16 bits (uint16), or of size 0 for none;
    slopes: one per head (ne2); sinks: one per head, or of size 0 for none."""
    ne3, ne2, ne1, ne0 = a.shape
    n = np.uintp(ne0)
    has_mask, has_sinks = mask.size > 0, sinks.size > 0
    row = np.empty(ne0, np.float32)
    ends = np.empty((mask.shape[0], mask.shape[1], ne1) if has_mask else (1, 1, 1), np.intp)  # read with a mask only
    if has_mask:
        for j3 in range(mask.shape[0]):
            for j2 in range(mask.shape[1]):
                for i1 in range(ne1):
                    ends[j3, j2, i1] = finite_prefix(mask[j3, j2, i1])
    for i3 in range(ne3):
        for i2 in range(ne2):
            slope = slopes[i2]
            for i1 in range(ne1):
                x = a[i3, i2, i1]
                end = n
                if has_mask:
                    m = mask[i3 % mask.shape[0], i2 % mask.shape[1], i1]
                    for i in range(n):
                        row[i] = x[i] * scale + slope * widen(m[i])
                    end = np.uintp(ends[i3 % mask.shape[0], i2 % mask.shape[1], i1])
                    not_minus_inf = 0
                    for i in range(end, n):
                        not_minus_inf += row[i] != np.float32(-np.inf)
                    if not_minus_inf:
                        end = n
                else:
                    for i in range(n):
                        row[i] = x[i] * scale
                live = row[:end]
                peak = max_f32(live)
                if has_sinks:
                    peak = max(peak, sinks[i2])
                if peak == np.float32(-np.inf):
                    peak = np.float32(0)
                for i in range(end):
                    row[i] = expf(row[i] - peak)
                total = sum_f64(live)
                if has_sinks:
                    total += np.float64(expf(sinks[i2] - peak))
                inv = np.float32(1.0 / total)
                y = out[i3, i2, i1]
                for i in range(end):
                    y[i] = row[i] * inv
                masked = np.float32(0) * inv  # exp(-inf) / total: 0, or NaN where the total is 0, as ggml
                for i in range(end, n):
                    y[i] = masked
