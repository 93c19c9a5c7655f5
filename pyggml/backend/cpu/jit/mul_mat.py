"""Products and row gathers on weights kept in their block formats (F16, BF16, the Q and K quants).

A weight is read in place from its buffer's bytes: `src` is the whole buffer (uint8, read-only view),
`p` the byte offset of a row. Two ways to multiply, chosen by the caller by the number of columns:
- `mul_mat_vec` (generation: a few columns): threads take bands of rows; each row is dotted with every
  column in registers by its type's row dot (vec_dot.py), or, for a type without one, dequantized into a
  small per-band F32 scratch first. The weight bytes are read once per call, which is what bounds a
  token's time.
- `dequantize_rows` (prompts: many columns): a tile of rows becomes F32 on the calling thread, which
  hands it to a one-thread BLAS sgemm; the caller shares row bands out over Python threads
  (dequantizing on Numba's threads right before BLAS's made both pools spin against each other on
  2 cores: 2.5-3x slower than dequantizing on one).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pyggml.backend.cpu.jit import PerType, jit, parallel_jit
from pyggml.backend.cpu.jit.ir.float_rows_ir import row_dots_1, row_dots_2
from pyggml.backend.cpu.jit.prefetch import prefetch
from pyggml.backend.cpu.jit.reduce import dot_f32
from pyggml.backend.cpu.jit.quants import _F16, _Q4_0, _Q4_1, _Q4_K, _Q5_0, _Q5_K, _Q6_K, _Q8_0, U, dequantize_row
from pyggml.backend.cpu.jit.vec_dot import (vec_dot_f16_f32, vec_dot_q4_0_f32, vec_dot_q4_1_f32,
                                            vec_dot_q4_K_f32, vec_dot_q5_0_f32, vec_dot_q5_K_f32, vec_dot_q6_K_f32,
                                            vec_dot_q8_0_f32)


@jit(inline="always")
def _rows_dot(dot, src, base, row_stride, r0, r1, nb, x, y):
    """y[c, r] = dot(row r at byte base + r·row_stride of src, x[c]) for r in [r0, r1) (inlined where it is
    called, with dot a known function: each type's row loop is compiled with its dot inside)."""
    for r in range(U(r0), U(r1)):
        row = U(base) + r * U(row_stride)
        for c in range(U(x.shape[0])):
            y[c, r] = dot(src, row, x[c], U(0), U(nb))


@jit(inline="always")
def _dequantized_rows_times_columns(qtype, src, base, row_stride, r0, r1, nb, x, y):
    """The same for a type without a row dot: each row through a float32 row."""
    ncols, k = x.shape
    values = np.empty(k, np.float32)
    for r in range(U(r0), U(r1)):
        dequantize_row(qtype, src, U(base) + r * U(row_stride), values, U(0), U(nb))
        for c in range(U(ncols)):
            y[c, r] = dot_f32(x[c], values, U(0))


@jit(inline="always")
def _rows_times_columns(qtype, src, base, row_stride, r0, r1, nb, x, y):
    """y[c, r] = dot(row r of ggml type qtype at byte base + r·row_stride of src, x[c]) for r in [r0, r1): in
    registers with the type's row dot (vec_dot.py) where it has one, else through a float32 row. The type is
    chosen once for the rows: choosing it per row, among all the types in one loop, ran a Q4_0 product at
    0.6x the speed."""
    if qtype == _Q8_0:
        _rows_dot(vec_dot_q8_0_f32, src, base, row_stride, r0, r1, nb, x, y)
    elif qtype == _Q5_0:
        _rows_dot(vec_dot_q5_0_f32, src, base, row_stride, r0, r1, nb, x, y)
    elif qtype == _Q4_K:
        _rows_dot(vec_dot_q4_K_f32, src, base, row_stride, r0, r1, nb, x, y)
    elif qtype == _Q6_K:
        _rows_dot(vec_dot_q6_K_f32, src, base, row_stride, r0, r1, nb, x, y)
    elif qtype == _F16:
        _rows_dot(vec_dot_f16_f32, src, base, row_stride, r0, r1, nb, x, y)
    elif qtype == _Q4_0:
        _rows_dot(vec_dot_q4_0_f32, src, base, row_stride, r0, r1, nb, x, y)
    elif qtype == _Q4_1:
        _rows_dot(vec_dot_q4_1_f32, src, base, row_stride, r0, r1, nb, x, y)
    elif qtype == _Q5_K:
        _rows_dot(vec_dot_q5_K_f32, src, base, row_stride, r0, r1, nb, x, y)
    else:
        _dequantized_rows_times_columns(qtype, src, base, row_stride, r0, r1, nb, x, y)


def _mul_mat_vec(qtype: int):
    @parallel_jit
    def mul_mat_vec(src, planes, row_stride, nrows, nb, x, y, bands):
        per = (nrows + bands - 1) // bands
        for task in prange(planes.shape[0] * bands):
            plane, band = task // bands, task % bands
            _rows_times_columns(qtype, src, planes[plane], row_stride, min(nrows, band * per),
                                min(nrows, (band + 1) * per), nb, x[plane], y[plane])
    return mul_mat_vec


mul_mat_vec = PerType(_mul_mat_vec)
"""mul_mat_vec(qtype, src, planes, row_stride, nrows, nb, x, y, bands): y[i, c, r] = dot(row r of weight plane i,
x[i, c]) for every plane i, column c and row r < nrows.

Row r of plane i starts at byte planes[i] + r·row_stride of src and holds nb blocks of ggml type qtype;
`bands` row bands per plane are shared out over the threads (more bands than threads balances a busy
machine)."""


PREFETCH_ROWS = 8  # rows ahead a strided row is asked for: the best of 2, 4, 8, 16 (an 8B layer's K product)


@jit
def _float_rows_times_columns(a, base, row_stride, r0, r1, k, x, y):
    """y[c, r] = dot(row r of a float matrix, x[c]) for r in [r0, r1): row r starts at element base + r·row_stride
    of the flat array a (float32, or F16 bits as uint16). Each row is read once for two columns (an odd last
    column alone), every column's sum in the one order of ir/float_rows_ir.py, so that a column gives the same
    bits alone and beside others. Rows that are not back to back (the KV cache's heads and cells) are prefetched
    PREFETCH_ROWS ahead (jit/prefetch.py)."""
    ncols, width = U(x.shape[0]), U(x.shape[1])
    strided = U(row_stride) != U(k)
    per_line = U(64 // a.itemsize)
    for r in range(U(r0), U(r1)):
        row = U(base) + r * U(row_stride)
        if strided:
            ahead = row + U(PREFETCH_ROWS) * U(row_stride)
            for j in range(U(0), U(k), per_line):
                prefetch(a, ahead + j)
        for c in range(U(0), ncols - U(1), U(2)):
            y[c, r], y[c + U(1), r] = row_dots_2(a, row, x, (c * width, (c + U(1)) * width), k)
        if ncols % U(2) == U(1):
            y[ncols - U(1), r] = row_dots_1(a, row, x, ((ncols - U(1)) * width,), k)[0]


@parallel_jit
def mul_mat_float_columns(a, planes, row_stride, nrows, k, x, y, bands):
    """mul_mat_vec for float32 or F16 matrices given as flat arrays of their values (planes[i]: the element
    where plane i starts): the KV cache in generation, read row by row for up to four query heads at once."""
    per = (nrows + bands - 1) // bands
    for task in prange(planes.shape[0] * bands):
        plane, band = task // bands, task % bands
        _float_rows_times_columns(a, planes[plane], row_stride, min(nrows, band * per),
                                  min(nrows, (band + 1) * per), k, x[plane], y[plane])


def _dequantize_rows(qtype: int):
    @jit
    def dequantize_rows(src, rows, nb, out):
        for i in range(U(rows.shape[0])):
            dequantize_row(qtype, src, U(rows[i]), out[i], U(0), U(nb))
    return dequantize_rows


dequantize_rows = PerType(_dequantize_rows)
"""dequantize_rows(qtype, src, rows, nb, out): out[i] = the values of the row at byte rows[i] of src (nb blocks
each): tiles and get_rows."""
