"""soft_max_ext over float32 rows: softmax(a * scale + slope[head] * mask (+ sink)), as kernels/attention.py
computes it (the row max includes the sink; an all -inf row is shifted by 0; the sum in float64), with the
vectorising expf."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import widen
from pyggml.backend.cpu.jit.floatbits import expf
from pyggml.backend.cpu.jit.reduce import max_f32, sum_f64


@jit
def soft_max_rows(a: np.ndarray, out: np.ndarray, scale: np.float32, mask: np.ndarray, slopes: np.ndarray,
                  sinks: np.ndarray) -> None:
    """a, out: (ne3, ne2, ne1, ne0) with contiguous rows (out may be a). mask: (m3, m2, >= ne1, ne0), reused
    over ne3 and ne2 by index modulo, float32 or F16 bits (uint16), or of size 0 for none;
    slopes: one per head (ne2); sinks: one per head, or of size 0 for none."""
    ne3, ne2, ne1, ne0 = a.shape
    n = np.uintp(ne0)
    has_mask, has_sinks = mask.size > 0, sinks.size > 0
    row = np.empty(ne0, np.float32)
    for i3 in range(ne3):
        for i2 in range(ne2):
            slope = slopes[i2]
            for i1 in range(ne1):
                x = a[i3, i2, i1]
                if has_mask:
                    m = mask[i3 % mask.shape[0], i2 % mask.shape[1], i1]
                    for i in range(n):
                        row[i] = x[i] * scale + slope * widen(m[i])
                else:
                    for i in range(n):
                        row[i] = x[i] * scale
                peak = max_f32(row)
                if has_sinks:
                    peak = max(peak, sinks[i2])
                if peak == np.float32(-np.inf):
                    peak = np.float32(0)
                for i in range(n):
                    row[i] = expf(row[i] - peak)
                total = sum_f64(row)
                if has_sinks:
                    total += np.float64(expf(sinks[i2] - peak))
                inv = np.float32(1.0 / total)
                y = out[i3, i2, i1]
                for i in range(n):
                    y[i] = row[i] * inv
