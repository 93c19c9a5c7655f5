"""Row reductions for compiled kernels, free to reorder their additions (`reassoc`) so that LLVM
vectorises them: ggml's own SIMD reductions do not add in row order either."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import widen


@jit(fastmath={"reassoc", "nsz"})
def sum_f64(x: np.ndarray) -> float:
    """Sum of a float32 row, accumulated in float64 (ggml_float)."""
    total = 0.0
    for i in range(np.uintp(x.shape[0])):
        total += np.float64(x[i])
    return total


@jit(fastmath={"reassoc", "nsz"})
def sum_f32(x: np.ndarray) -> np.float32:
    """Sum of a float32 row, in float32 (attention's softmax denominators, as ggml's flash attention)."""
    total = np.float32(0)
    for i in range(np.uintp(x.shape[0])):
        total += x[i]
    return total


@jit(fastmath={"reassoc", "nsz"})
def sum_squares_f64(x: np.ndarray) -> float:
    """Sum of the float32 squares of a float32 row, accumulated in float64."""
    total = 0.0
    for i in range(np.uintp(x.shape[0])):
        total += np.float64(x[i] * x[i])
    return total


LANES = 64  # running maxima: four AVX-512 registers of float32 (LLVM vectorises a loop of 64, not of 16)


@jit(fastmath={"reassoc", "nsz", "nnan"})
def max_f32(x: np.ndarray) -> np.float32:
    """The largest value of a float32 row (-inf for an empty row; NaNs are not looked for).

    LLVM leaves a max reduction written as one running value scalar (it vectorises sums, not this select):
    LANES running maxima over consecutive values are vector code, 2.6x faster on a 1500-value row."""
    lanes = np.empty(LANES, np.float32)  # not np.full: that is one more function to compile (0.1 s)
    for lane in range(np.uintp(LANES)):
        lanes[lane] = -np.inf
    n = np.uintp(x.shape[0])
    whole = n // np.uintp(LANES) * np.uintp(LANES)
    for i in range(np.uintp(0), whole, np.uintp(LANES)):
        for lane in range(np.uintp(LANES)):
            v = x[i + lane]
            lanes[lane] = v if v > lanes[lane] else lanes[lane]
    peak = np.float32(-np.inf)
    for lane in range(np.uintp(LANES)):
        peak = lanes[lane] if lanes[lane] > peak else peak
    for i in range(whole, n):
        peak = x[i] if x[i] > peak else peak
    return peak


@jit(fastmath={"reassoc", "nsz"})
def dot_f32(x: np.ndarray, y: np.ndarray, yo: np.uintp) -> np.float32:
    """Dot product of a float32 row with the float32 or F16-bits values y[yo:], in float32."""
    total = np.float32(0)
    for i in range(np.uintp(x.shape[0])):
        total += x[i] * widen(y[yo + i])
    return total
