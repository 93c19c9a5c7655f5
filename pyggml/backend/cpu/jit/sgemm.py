"""F32 x F32 products in ggml's CPU orders (ir/sgemm_ir.py): llamafile's tinyBLAS where ggml takes it (k a
multiple of 16, rows of a a multiple of 4, b contiguous; kernels/mul_mat.py says which), ggml's values bit for bit
at about a one-thread BLAS sgemm's speed (tiles of 4 rows by 4 columns); elsewhere ggml_vec_dot_f32's, four rows'
dots side by side. F16 x F16 (the patch embeddings' im2col by their kernel) the same on the values widened to
float32, but for ggml_vec_dot_f16's float64 tail."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.ir.sgemm_ir import (TILE_COLUMNS, TILE_ROWS, VEC_DOT_ROWS, tile_4x1, tile_4x4, vec_dot_f16,
                                                vec_dot_f32, vec_dots_f16, vec_dots_f32)

BLOCK_ROWS = 64  # rows of a at a time: a block of a 768-value row's matrix (196 KiB) stays in L2 while b streams


@jit
def sgemm_band(a: np.ndarray, b: np.ndarray, out: np.ndarray, r0: np.intp, r1: np.intp, f16: bool) -> None:
    """out[j, i] = a[i]·b[j] for rows r0 <= i < r1 of a (a multiple of 4 apart) and every row j of b; a (m, k) and
    b (n, k) float32 with contiguous rows, k a multiple of 16 (f16: the same order, as vec_dot_band's argument)."""
    n = b.shape[0]
    whole = n // TILE_COLUMNS * TILE_COLUMNS
    for block in range(r0, r1, BLOCK_ROWS):
        end = min(r1, block + BLOCK_ROWS)
        for j in range(0, whole, TILE_COLUMNS):
            for i in range(block, end, TILE_ROWS):
                tile_4x4(a, b, out, i, j)
        for j in range(whole, n):
            for i in range(block, end, TILE_ROWS):
                tile_4x1(a, b, out, i, j)


@jit
def vec_dot_band(a: np.ndarray, b: np.ndarray, out: np.ndarray, r0: np.intp, r1: np.intp, f16: bool) -> None:
    """out[j, i] = a[i]·b[j] in ggml_vec_dot_f32's order (ggml_vec_dot_f16's with f16) for rows r0 <= i < r1 of
    a and every row j of b."""
    whole = r0 + (r1 - r0) // VEC_DOT_ROWS * VEC_DOT_ROWS
    for j in range(b.shape[0]):
        for i in range(r0, whole, VEC_DOT_ROWS):
            if f16:
                vec_dots_f16(a, i, b, j, out)
            else:
                vec_dots_f32(a, i, b, j, out)
        for i in range(whole, r1):
            if f16:
                vec_dot_f16(a, i, b, j, out)
            else:
                vec_dot_f32(a, i, b, j, out)
