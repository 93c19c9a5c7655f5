"""rms_norm and norm over contiguous float32 rows, in the arithmetic order of kernels/norm.py (ggml's):
sums in float64, mean and scale rounded to float32, one float32 multiply per value."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.reduce import sum_f64, sum_squares_f64


@jit
def rms_norm_rows(x: np.ndarray, out: np.ndarray, eps: np.float32) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) for 2-D C-contiguous rows (out may be x)."""
    n = np.uintp(x.shape[1])
    for r in range(np.uintp(x.shape[0])):
        mean = np.float32(sum_squares_f64(x[r]) / n)
        scale = np.float32(1) / np.sqrt(mean + eps)
        for i in range(n):
            out[r, i] = x[r, i] * scale


@jit
def norm_rows(x: np.ndarray, out: np.ndarray, eps: np.float32) -> None:
    """out[r] = (x[r] - mean) / sqrt(variance + eps) for 2-D C-contiguous rows (out may be x)."""
    n = np.uintp(x.shape[1])
    for r in range(np.uintp(x.shape[0])):
        mean = np.float32(sum_f64(x[r])) / np.float32(n)
        for i in range(n):
            out[r, i] = x[r, i] - mean
        variance = np.float32(sum_squares_f64(out[r]) / n)
        scale = np.float32(1) / np.sqrt(variance + eps)
        for i in range(n):
            out[r, i] = out[r, i] * scale
