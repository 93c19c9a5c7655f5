"""SET_ROWS of float32 rows into float32, F16 (uint16 bit patterns), Q8_0 or Q4_0 rows, one plane: a KV cache write.

The quantized rows are made as ggml's CPU backend makes them (its from_float): quantize_row_q8_0 (d = max|x| / 127
rounded to F16, q = x·127 / max|x| rounded to nearest even, as its AVX code) and quantize_row_q4_0 (its reference:
d = m / -8 for the value m of largest magnitude, q = min(15, trunc(x / d + 8.5))).
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import f16_bits

U = np.uintp


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


@jit
def quantize_row_q8_0(x: np.ndarray, y: np.ndarray) -> None:
    """x (float32, a multiple of 32 values) -> y (its Q8_0 blocks' bytes: fp16 d, 32 int8 quants each)."""
    for b in range(U(x.shape[0]) // U(32)):
        amax = np.float32(0)
        for j in range(U(32)):
            amax = max(amax, abs(x[b * U(32) + j]))
        d = amax / np.float32(127)
        inv = np.float32(127) / amax if amax != np.float32(0) else np.float32(0)
        bits = f16_bits(d)
        at = b * U(34)
        y[at], y[at + U(1)] = np.uint8(bits & np.uint16(0xFF)), np.uint8(bits >> np.uint16(8))
        for j in range(U(32)):
            y[at + U(2) + j] = np.uint8(np.int32(np.rint(x[b * U(32) + j] * inv)) & np.int32(0xFF))


@jit
def quantize_row_q4_0(x: np.ndarray, y: np.ndarray) -> None:
    """x (float32, a multiple of 32 values) -> y (its Q4_0 blocks' bytes: fp16 d, 16 bytes of nibbles each, value j
    in the low nibble of byte j and value j + 16 in its high one)."""
    for b in range(U(x.shape[0]) // U(32)):
        amax, peak = np.float32(0), np.float32(0)
        for j in range(U(32)):
            v = x[b * U(32) + j]
            if abs(v) > amax:
                amax, peak = abs(v), v
        d = peak / np.float32(-8)
        inv = np.float32(1) / d if d != np.float32(0) else np.float32(0)
        bits = f16_bits(d)
        at = b * U(18)
        y[at], y[at + U(1)] = np.uint8(bits & np.uint16(0xFF)), np.uint8(bits >> np.uint16(8))
        for j in range(U(16)):
            low = min(np.int32(15), np.int32(x[b * U(32) + j] * inv + np.float32(8.5)))
            high = min(np.int32(15), np.int32(x[b * U(32) + U(16) + j] * inv + np.float32(8.5)))
            y[at + U(2) + j] = np.uint8(low | (high << np.int32(4)))


@jit
def set_rows_q8_0(src: np.ndarray, ids: np.ndarray, dst: np.ndarray) -> np.intp:
    """set_rows_f32 into Q8_0 rows (dst: the rows' bytes, 2-D uint8)."""
    bad = first_bad_id(ids, dst.shape[0])
    if bad < 0:
        for i in range(U(src.shape[0])):
            quantize_row_q8_0(src[i], dst[U(ids[i])])
    return bad


@jit
def set_rows_q4_0(src: np.ndarray, ids: np.ndarray, dst: np.ndarray) -> np.intp:
    """set_rows_f32 into Q4_0 rows (dst: the rows' bytes, 2-D uint8)."""
    bad = first_bad_id(ids, dst.shape[0])
    if bad < 0:
        for i in range(U(src.shape[0])):
            quantize_row_q4_0(src[i], dst[U(ids[i])])
    return bad
