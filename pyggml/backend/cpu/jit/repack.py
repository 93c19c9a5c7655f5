"""Q4_0 weights repacked 16 rows at a time and multiplied in int8 against activations quantized to Q8_0, as
ggml's CPU repack kernels do (ggml_gemm_q4_0_8x8_q8_0 and its kin), on CPUs with AVX-512 VNNI.

Layout "Q4_0_16x4": rows go in groups of 16; a group's block b (288 bytes, as many as 16 Q4_0 blocks)
holds the 16 rows' fp16 scales, then four 64-byte vectors: vector m holds bytes 4m .. 4m+3 of each
row's 16 quant bytes, row after row. A quant byte keeps value j in its low nibble and value j + 16 in
its high one, so vector m's low nibbles are values 4m .. 4m+3 of the 16 rows and its high nibbles values
16+4m .. 16+4m+3: each int32 lane of the vector is one row (vnni_ir.py multiplies them). The bytes are
the file's, moved: the repacked tensor takes exactly its Q4_0 size.

Activations become Q8_0 blocks as ggml's quantize_row_q8_0 makes them (d = max|x| / 127 kept as fp16,
q = round(x / d)), split into quants, float scales and -8·Σq (what vnni_ir.py's accumulators start from).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pyggml.backend.cpu.jit import jit, parallel_jit
from pyggml.backend.cpu.jit.f16 import f16_bits
from pyggml.backend.cpu.jit.floatbits import f16_to_f32
from pyggml.backend.cpu.jit.vnni_ir import BLOCK_BYTES, ROWS, TOKENS, tile_q4_0_16x1_q8_0, tile_q4_0_16x4_q8_0

Q4_0_BLOCK = 18  # bytes of a Q4_0 block: fp16 d, 16 quant bytes


def repack_q4_0_16x4(rows: np.ndarray) -> np.ndarray:
    """The Q4_0_16x4 bytes of Q4_0 rows (uint8, shape (n_rows, nb·18), n_rows a multiple of 16)."""
    n_rows, row_bytes = rows.shape
    nb = row_bytes // Q4_0_BLOCK
    blocks = rows.reshape(n_rows // ROWS, ROWS, nb, Q4_0_BLOCK)
    out = np.empty((n_rows // ROWS, nb, BLOCK_BYTES), np.uint8)
    out[:, :, : 2 * ROWS] = blocks[:, :, :, :2].transpose(0, 2, 1, 3).reshape(n_rows // ROWS, nb, 2 * ROWS)
    quants = blocks[:, :, :, 2:].reshape(n_rows // ROWS, ROWS, nb, 4, 4)        # (g, row, b, m, byte)
    out[:, :, 2 * ROWS:] = quants.transpose(0, 2, 3, 1, 4).reshape(n_rows // ROWS, nb, 16 * ROWS)
    return out.reshape(n_rows, row_bytes)


@jit
def quantize_q8_0_rows(x: np.ndarray, first: np.intp, end: np.intp, xq: np.ndarray, xd: np.ndarray,
                       xc: np.ndarray) -> None:
    """Rows first .. end-1 of x (n, nb·32) float32 -> xq (n·nb·32,) int8 bits, xd (n·nb,) float32 scales,
    xc (n·nb,) -8·Σq. Rounding to nearest even, as ggml's AVX code (_mm256_round_ps) does."""
    nb = x.shape[1] // 32
    for t in range(first, end):
        for b in range(nb):
            row = x[t, b * 32: b * 32 + 32]
            amax = np.float32(0)
            for j in range(32):
                amax = max(amax, abs(row[j]))
            d = amax / np.float32(127)
            inv = np.float32(1) / d if d != 0 else np.float32(0)
            total = np.int32(0)
            at = (t * nb + b) * 32
            for j in range(32):
                q = np.int32(np.rint(row[j] * inv))
                xq[at + j] = np.uint8(q & 0xFF)
                total += q
            xd[t * nb + b] = f16_to_f32(f16_bits(d))
            xc[t * nb + b] = np.int32(-8) * total


PARALLEL_ROWS = 16  # rows per thread's share below which quantizing is not worth a parallel launch


@parallel_jit
def quantize_q8_0_parallel(x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xc: np.ndarray) -> None:
    n = x.shape[0]
    chunks = -(-n // PARALLEL_ROWS)
    for c in prange(chunks):
        quantize_q8_0_rows(x, c * PARALLEL_ROWS, min(n, (c + 1) * PARALLEL_ROWS), xq, xd, xc)


def quantize_q8_0(x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xc: np.ndarray) -> None:
    """All rows of x quantized (see quantize_q8_0_rows): a generation step's row on this thread, a batch's
    rows on Numba's threads."""
    if x.shape[0] <= PARALLEL_ROWS:
        quantize_q8_0_rows(x, 0, x.shape[0], xq, xd, xc)
    else:
        quantize_q8_0_parallel(x, xq, xd, xc)


@parallel_jit
def gemm_q4_0_16x4_q8_0(w: np.ndarray, first: np.uintp, nb: np.intp, n_groups: np.intp, xq: np.ndarray,
                        xd: np.ndarray, xc: np.ndarray, n_tokens: np.intp, y: np.ndarray) -> None:
    """y (n_tokens, n_groups·16) = the Q4_0_16x4 matrix at byte `first` of w times the Q8_0 tokens, row
    groups split over the threads (each group's 16 rows stay in L1 while all the tokens pass)."""
    ys = y.shape[1]
    flat = y.reshape(-1)
    group_bytes = nb * BLOCK_BYTES
    for g in prange(n_groups):
        start = first + g * group_bytes
        t = 0
        while t + TOKENS <= n_tokens:
            tile_q4_0_16x4_q8_0(w, start, nb, xq, xd, xc, t, flat, t * ys + g * ROWS, ys)
            t += TOKENS
        while t < n_tokens:
            tile_q4_0_16x1_q8_0(w, start, nb, xq, xd, xc, t, flat, t * ys + g * ROWS, ys)
            t += 1
