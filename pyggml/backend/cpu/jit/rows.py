"""SET_ROWS of float32 rows into float32 or F16 (uint16 bit patterns) rows, one plane: a KV cache write."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import f16_bits


@jit
def first_bad_id(ids: np.ndarray, n_rows: np.intp) -> np.intp:
    """The position of the first id outside [0, n_rows), or -1."""
    for i in range(ids.shape[0]):
        if ids[i] < 0 or ids[i] >= n_rows:
            return i
    return -1


@jit
def set_rows_f32(src: np.ndarray, ids: np.ndarray, dst: np.ndarray) -> np.intp:
    """dst[ids[i]] = src[i] for 2-D float32 arrays. Nothing is written when an id lies outside dst's rows:
    the position of the first such id is returned (else -1)."""
    bad = first_bad_id(ids, dst.shape[0])
    if bad >= 0:
        return bad
    if src.shape[1] == 1:  # one-value rows (a transposed V cache written value by value): no inner loop
        for i in range(np.uintp(src.shape[0])):
            dst[np.uintp(ids[i]), 0] = src[i, 0]
        return bad
    for i in range(np.uintp(src.shape[0])):
        r = np.uintp(ids[i])
        for j in range(np.uintp(src.shape[1])):
            dst[r, j] = src[i, j]
    return bad


@jit
def set_rows_f16(src: np.ndarray, ids: np.ndarray, dst: np.ndarray) -> np.intp:
    """set_rows_f32 into F16 rows (dst holds their uint16 bit patterns), rounding to nearest even."""
    bad = first_bad_id(ids, dst.shape[0])
    if bad < 0:
        for i in range(np.uintp(src.shape[0])):
            r = np.uintp(ids[i])
            for j in range(np.uintp(src.shape[1])):
                dst[r, j] = f16_bits(src[i, j])
    return bad
