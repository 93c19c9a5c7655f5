"""rms_norm and norm over contiguous float32 rows, in the arithmetic order of kernels/norm.py (ggml's):
sums in float64, mean and scale rounded to float32, one float32 multiply per value."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.reduce import sum_f64, sum_squares_f64


@jit(inline="always")
def _scale_row(x: np.ndarray, out: np.ndarray, r, scale: np.float32, shift: np.float32, in_place: bool) -> None:
    """out[r] = (x[r] - shift) * scale, as a loop over one array when out is x: with two arrays that alias,
    LLVM's runtime overlap check picks its scalar loop (2x slower on a 640-value row)."""
    n = np.uintp(x.shape[1])
    if in_place:
        for i in range(n):
            x[r, i] = (x[r, i] - shift) * scale
    else:
        for i in range(n):
            out[r, i] = (x[r, i] - shift) * scale


@jit
def rms_norm_rows(x: np.ndarray, out: np.ndarray, eps: np.float32) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) for 2-D C-contiguous rows (out may be x)."""
    n = np.uintp(x.shape[1])
    in_place = x.ctypes.data == out.ctypes.data
    for r in range(np.uintp(x.shape[0])):
        mean = np.float32(sum_squares_f64(x[r]) / n)
        _scale_row(x, out, r, np.float32(1) / np.sqrt(mean + eps), np.float32(0), in_place)


@jit
def norm_rows(x: np.ndarray, out: np.ndarray, eps: np.float32) -> None:
    """out[r] = (x[r] - mean) / sqrt(variance + eps) for 2-D C-contiguous rows (out may be x)."""
    n = np.uintp(x.shape[1])
    in_place = x.ctypes.data == out.ctypes.data
    for r in range(np.uintp(x.shape[0])):
        mean = np.float32(sum_f64(x[r])) / np.float32(n)
        _scale_row(x, out, r, np.float32(1), mean, in_place)
        variance = np.float32(sum_squares_f64(out[r]) / n)
        _scale_row(out, out, r, np.float32(1) / np.sqrt(variance + eps), np.float32(0), True)
