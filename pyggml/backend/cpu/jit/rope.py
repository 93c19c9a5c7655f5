"""ROPE / ROPE_BACK rotations of float32 rows by precomputed cos and sin (kernels/attention.py builds and
caches them as ggml's rope cache does), for the NORMAL (adjacent pairs) and NEOX (i, i + n_dims/2) modes."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit


@jit
def rope_rows(x: np.ndarray, out: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_dims: np.intp, neox: bool,
              sign: np.float32) -> None:
    """x, out: (ne3, tokens, heads, ne0) (out may be x); cos, sin: (tokens, n_dims / 2). Each pair becomes
    (x0 cos - x1 sin', x0 sin' + x1 cos) with sin' = sign * sin; dims from n_dims on are copied."""
    ne3, n_tokens, n_heads, ne0 = x.shape
    n_pairs = np.uintp(n_dims // 2)
    step = np.uintp(1) if neox else np.uintp(2)
    partner = n_pairs if neox else np.uintp(1)
    for i3 in range(ne3):
        for t in range(n_tokens):
            for h in range(n_heads):
                for p in range(n_pairs):
                    j0 = p * step
                    j1 = j0 + partner
                    c, s = cos[t, p], sin[t, p] * sign
                    x0, x1 = x[i3, t, h, j0], x[i3, t, h, j1]
                    out[i3, t, h, j0] = x0 * c - x1 * s
                    out[i3, t, h, j1] = x0 * s + x1 * c
                for j in range(np.uintp(n_dims), np.uintp(ne0)):
                    out[i3, t, h, j] = x[i3, t, h, j]
