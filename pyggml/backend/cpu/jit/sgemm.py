"""F32 x F32 products in llamafile's tinyBLAS order (ggml's CPU backend takes them so where tinyBLAS applies:
k a multiple of 16, rows of a a multiple of 4, two columns or more): ggml's values bit for bit, at about a
one-thread BLAS sgemm's speed (tiles of 4 rows by 4 columns in LLVM vector IR, ir/sgemm_ir.py)."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.ir.sgemm_ir import TILE_COLUMNS, TILE_ROWS, tile_4x1, tile_4x4

BAND_ROWS = 64  # rows of a per band: a band of a 768-value row's matrix (196 KiB) stays in L2 while b streams


@jit
def sgemm_band(a: np.ndarray, b: np.ndarray, out: np.ndarray, r0: np.intp, r1: np.intp) -> None:
    """out[j, i] = a[i]·b[j] for rows r0 <= i < r1 of a (a multiple of 4 apart) and every row j of b; a (m, k) and
    b (n, k) float32 with contiguous rows, k a multiple of 16."""
    n = b.shape[0]
    whole = n // TILE_COLUMNS * TILE_COLUMNS
    for j in range(0, whole, TILE_COLUMNS):
        for i in range(r0, r1, TILE_ROWS):
            tile_4x4(a, b, out, i, j)
    for j in range(whole, n):
        for i in range(r0, r1, TILE_ROWS):
            tile_4x1(a, b, out, i, j)
