"""ROPE / ROPE_BACK rotations of float32 rows by precomputed cos and sin (kernels/attention.py builds and
caches them as ggml's rope cache does), each pair as ggml's rotate_pairs compiles: x0 cos - x1 sin and
x0 sin + x1 cos with the first product fused into the subtraction / addition (one FMA, ggml's values bit for
bit); and those cos and sin themselves."""

from __future__ import annotations

import math

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.floatbits import fma


@jit
def rope_rows(x: np.ndarray, out: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_pairs: np.intp, step: np.intp,
              partner: np.intp, sign: np.float32) -> None:
    """x, out: (ne3, tokens, heads, ne0) (out may be x); cos, sin: (tokens, n_pairs). Pair p is (j0, j0 + partner)
    with j0 = p * step (NORMAL: step 2, partner 1; NEOX and M-RoPE: 1, n_pairs; VISION: 1, n_pairs over the whole
    row); it becomes (x0 cos - x1 sin', x0 sin' + x1 cos) with sin' = sign * sin; dims from 2 n_pairs on are
    copied."""
    ne3, n_tokens, n_heads, ne0 = x.shape
    for i3 in range(ne3):
        for t in range(n_tokens):
            for h in range(n_heads):
                for p in range(np.uintp(n_pairs)):
                    j0 = p * np.uintp(step)
                    j1 = j0 + np.uintp(partner)
                    c, s = cos[t, p], sin[t, p] * sign
                    x0, x1 = x[i3, t, h, j0], x[i3, t, h, j1]
                    out[i3, t, h, j0] = fma(x0, c, -(x1 * s))
                    out[i3, t, h, j1] = fma(x0, s, x1 * c)
                for j in range(np.uintp(2 * n_pairs), np.uintp(ne0)):
                    out[i3, t, h, j] = x[i3, t, h, j]


@jit
def cos_sin_f32(theta: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """cos and sin of float32 angles (any shape, C-contiguous) by the C library's cosf and sinf, as ggml's rope
    cache calls them: they are not correctly rounded (about 1% of float32 angles here differ from NumPy's)."""
    t, c, s = theta.reshape(-1), cos.reshape(-1), sin.reshape(-1)
    for i in range(t.shape[0]):
        c[i] = math.cos(t[i])
        s[i] = math.sin(t[i])
