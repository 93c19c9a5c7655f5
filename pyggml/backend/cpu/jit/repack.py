"""Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and MXFP4 weights repacked 16 rows at a time and multiplied in int8 against
activations quantized to Q8_0 (the K-quants and IQ4_XS against Q8_K, ir/vnni_k_ir.py), as ggml's CPU repack
kernels do (ggml_gemm_q4_0_8x8_q8_0 and its kin), on CPUs with AVX-512 VNNI or AVX2.

Layout "16x4": rows go in groups of 16; a group's block b holds the fields before the quants, each for
the 16 rows in turn (fp16 d, or MXFP4's E8M0 byte; Q4_1's and Q5_1's fp16 m; Q5_0's and Q5_1's 4 bytes of fifth
bits), then vectors of 64 bytes: vector j holds bytes 4j .. 4j+3 of each row's quant bytes, row after row, so each
int32 lane of a vector is one row. A 4-bit quant byte keeps value j in its low nibble and value j + 16 in
its high one: vector j's low nibbles are values 4j .. 4j+3, its high ones 16+4j .. 16+4j+3 (4 vectors a
block). Q8_0's 32 bytes are 8 vectors, each byte stored + 128 (unsigned, as vpdpbusd takes one side). The
repacked tensor takes exactly its size in the file. A stack of matrices (a MoE layer's experts) is each matrix
interleaved in turn: its groups never straddle two matrices.

The products take segments: segment i multiplies the matrix at byte firsts[i] with tokens starts[i] ..
starts[i+1] - 1, all in one parallel launch (one segment for a dense product, one per expert for mul_mat_id).

Activations become Q8_0 blocks as ggml's quantize_row_q8_0 makes them (d = max|x| / 127 kept as fp16,
q = round(x·127/max)), split into quants, float scales, Σq (what ir/vnni_ir.py's sums start from) and
Q8_1's s = fp16(d·Σq) (what ggml multiplies Q4_1's and Q5_1's minimum with).

Where this says 16 rows and 64-byte vectors, a CPU with AVX2 alone has groups of 8 rows and vectors of 32 bytes
(vnni_ir.ROWS; ir/int8_ir.py); the layout cache keeps the two apart (interleave.py).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import prange

from pyggml.backend.cpu.jit import PerType, jit, parallel_jit
from pyggml.backend.cpu.jit.f16 import f16_bits
from pyggml.backend.cpu.jit.floatbits import f16_to_f32
from pyggml.backend.cpu.jit.ir.amx_ir import TOKENS as AMX_TOKENS
from pyggml.backend.cpu.jit.ir.amx_ir import WORDS as AMX_WORDS
from pyggml.backend.cpu.jit.ir.amx_ir import amx_usable, tile_amx_q4_K, tile_amx_q6_K
from pyggml.backend.cpu.jit.ir.vnni_ir import (FORMATS, ROWS, tile_iq4_nl, tile_mxfp4, tile_q4_0, tile_q4_1, tile_q5_0,
                                               tile_q5_1, tile_q8_0)
from pyggml.backend.cpu.jit.ir.vnni_k_ir import (K_FORMATS, MINUS_8_SUMS_OF_32, MINUS_32_SUMS_OF_8, PAIRS_OF_16,
                                                 PAIRS_OF_32, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8K_WORDS, SUMS_OF_16,
                                                 KLayout, tile_iq4_xs, tile_q2_K, tile_q3_K, tile_q4_K, tile_q5_K,
                                                 tile_q6_K)
from pyggml.backend.cpu.jit.quants import U
from pyggml.backend.cpu.jit.unaligned import load_u16, load_u32, store_u16, store_u32
from pyggml.core.types import GGMLType

Q4_0, Q4_1, Q5_0, Q5_1 = int(GGMLType.Q4_0), int(GGMLType.Q4_1), int(GGMLType.Q5_0), int(GGMLType.Q5_1)
Q8_0, IQ4_NL, MXFP4 = int(GGMLType.Q8_0), int(GGMLType.IQ4_NL), int(GGMLType.MXFP4)


def fields(qtype: int) -> tuple:
    """(block bytes, the block's fields in their interleaved order as (offset, bytes)) of an interleaved type."""
    if qtype in K_FORMATS:
        return K_FORMATS[qtype]
    block_bytes, before, _ = FORMATS[qtype]
    quants_at = sum(size for _, size in before)
    return block_bytes, (*before, (quants_at, block_bytes - quants_at))


def repack_16x4(qtype: int, rows: np.ndarray) -> np.ndarray:
    """The 16x4 bytes of rows (uint8, shape (n_rows, nb·block bytes), n_rows a multiple of 16) of an interleaved
    type: per group and block, each field in turn for the 16 rows, a 1- or 2-byte field (E8M0, fp16) row after row,
    the others as vectors of 64 bytes (vector j: bytes 4j .. 4j+3 of each row)."""
    block_bytes, layout = fields(qtype)
    n_rows, row_bytes = rows.shape
    groups, nb = n_rows // ROWS, row_bytes // block_bytes
    blocks = rows.reshape(groups, ROWS, nb, block_bytes)
    out = np.empty((groups, nb, ROWS * block_bytes), rows.dtype)
    at = 0
    for offset, size in layout:
        piece = size if size <= 2 else 4
        field = blocks[:, :, :, offset: offset + size].reshape(groups, ROWS, nb, size // piece, piece)
        out[:, :, at: at + ROWS * size] = field.transpose(0, 2, 3, 1, 4).reshape(groups, nb, ROWS * size)
        at += ROWS * size
    if qtype == Q8_0 and rows.dtype == np.uint8:
        out[:, :, ROWS * 2:] ^= 0x80  # int8 -> uint8 + 128
    return out.reshape(n_rows, row_bytes)


@functools.cache
def _field_table(qtype: int) -> np.ndarray:
    """repack_16x4's layout as int64 rows (offset in the block, bytes, piece bytes, XOR applied to each piece) for
    the compiled repack: 1- and 2-byte fields (E8M0, fp16) move whole, the others in pieces of 4; Q8_0's quants
    become uint8 + 128."""
    table = [(offset, size, size if size <= 2 else 4, 0x80808080 if qtype == Q8_0 and offset else 0)
             for offset, size in fields(qtype)[1]]
    return np.array(table, np.int64)


@jit
def repack_groups(rows: np.ndarray, row_bytes: int, block_bytes: int, table: np.ndarray, out: np.ndarray) -> None:
    """repack_16x4 of the flat bytes rows into out, each piece moved as one word. Indices unsigned: signed ones
    add a check for negative values to every move."""
    nb = U(row_bytes // block_bytes)
    stride = U(row_bytes)
    for g in range(rows.size // (ROWS * row_bytes)):
        first = U(g) * U(ROWS) * stride
        at = first
        for b in range(nb):
            block = first + b * U(block_bytes)
            for f in range(table.shape[0]):
                src, size, piece, flip = block + U(table[f, 0]), U(table[f, 1]), table[f, 2], np.uint32(table[f, 3])
                if piece == 4:
                    for p in range(U(0), size, U(4)):
                        for r in range(U(ROWS)):
                            store_u32(out, at, load_u32(rows, src + p + r * stride) ^ flip)
                            at += U(4)
                elif piece == 2:
                    for r in range(U(ROWS)):
                        store_u16(out, at, load_u16(rows, src + r * stride))
                        at += U(2)
                else:
                    for r in range(U(ROWS)):
                        out[at] = rows[src + r * stride]
                        at += U(1)


def repack_16x4_into(qtype: int, rows: np.ndarray, out: np.ndarray) -> None:
    """repack_16x4 compiled, written straight into out (uint8, rows.size) on this thread, without the GIL: the
    loader's path, without the NumPy version's temporary arrays (an 8B file's weights: 24 s with those)."""
    repack_groups(rows.reshape(-1), rows.shape[-1], fields(qtype)[0], _field_table(qtype), out)


@functools.cache
def row_places(qtype: int, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(where each byte of row r of a 16-row group lies in the group's 16x4 bytes (16, row_bytes), what to XOR it
    with to get the file's byte back): the inverse of repack_16x4, for reading single rows (GET_ROWS)."""
    moved = repack_16x4(qtype, np.arange(ROWS * row_bytes, dtype=np.int64).reshape(ROWS, row_bytes)).reshape(-1)
    places = np.argsort(moved).reshape(ROWS, row_bytes)
    flips = repack_16x4(qtype, np.zeros((ROWS, row_bytes), np.uint8)).reshape(-1)[places]
    return places, flips


def unpack_rows(qtype: int, w: np.ndarray, first: int, row_bytes: int, ids: np.ndarray) -> np.ndarray:
    """The file's bytes (len(ids), row_bytes) of rows ids of the 16x4 matrix at byte `first` of w."""
    places, flips = row_places(qtype, row_bytes)
    ids = ids.reshape(-1).astype(np.int64)
    in_group = ids % ROWS
    return w[first + (ids - in_group)[:, None] * row_bytes + places[in_group]] ^ flips[in_group]


@jit
def quantize_q8_0_rows(x: np.ndarray, first: np.intp, end: np.intp, xq: np.ndarray, xd: np.ndarray,
                       xs: np.ndarray, xm: np.ndarray) -> None:
    """Rows first .. end-1 of x (n, nb·32) float32 -> xq (n·nb·32,) int8 bits, xd (n·nb,) fp16-rounded
    scales, xs (n·nb,) Σq, xm (n·nb,) Q8_1's s = fp16(d·Σq). As ggml's AVX code: q = round(x·127/max),
    to nearest even (_mm256_round_ps)."""
    nb = U(x.shape[1]) // U(32)  # unsigned indices, as quantize_q8_K_rows
    for t in range(U(first), U(end)):
        for b in range(nb):
            row = x[t, b * U(32): b * U(32) + U(32)]
            amax = np.float32(0)
            for j in range(U(32)):
                amax = max(amax, abs(row[j]))
            d = amax / np.float32(127)
            inv = np.float32(127) / amax if amax != 0 else np.float32(0)
            total = np.int32(0)
            at = (t * nb + b) * U(32)
            for j in range(U(32)):
                q = np.int32(np.rint(row[j] * inv))
                xq[at + j] = np.uint8(q & 0xFF)
                total += q
            xd[t * nb + b] = f16_to_f32(f16_bits(d))
            xs[t * nb + b] = total
            xm[t * nb + b] = f16_to_f32(f16_bits(d * np.float32(total)))


PARALLEL_ROWS = 16  # rows per thread's share below which quantizing is not worth a parallel launch


@parallel_jit
def quantize_q8_0_parallel(x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray, xm: np.ndarray) -> None:
    n = x.shape[0]
    chunks = -(-n // PARALLEL_ROWS)
    for c in prange(chunks):
        quantize_q8_0_rows(x, c * PARALLEL_ROWS, min(n, (c + 1) * PARALLEL_ROWS), xq, xd, xs, xm)


def quantize_q8_0(x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xs: np.ndarray, xm: np.ndarray) -> None:
    """All rows of x quantized (see quantize_q8_0_rows): a generation step's row on this thread, a batch's
    rows on Numba's threads."""
    if x.shape[0] <= PARALLEL_ROWS:
        quantize_q8_0_rows(x, 0, x.shape[0], xq, xd, xs, xm)
    else:
        quantize_q8_0_parallel(x, xq, xd, xs, xm)


BLOCK_BYTES = np.array([FORMATS[t][0] if t in FORMATS else 0 for t in range(max(FORMATS) + 1)], np.int64)


@jit(inline="always")
def _tile_q8_0(qtype, w, start, nb, xq, xd, xs, xm, n, y, yo, ys):
    if qtype == Q4_0:
        tile_q4_0(w, start, nb, xq, xd, xs, xm, n, y, yo, ys)
    elif qtype == Q4_1:
        tile_q4_1(w, start, nb, xq, xd, xs, xm, n, y, yo, ys)
    elif qtype == Q5_0:
        tile_q5_0(w, start, nb, xq, xd, xs, xm, n, y, yo, ys)
    elif qtype == Q5_1:
        tile_q5_1(w, start, nb, xq, xd, xs, xm, n, y, yo, ys)
    elif qtype == Q8_0:
        tile_q8_0(w, start, nb, xq, xd, xs, xm, n, y, yo, ys)
    elif qtype == MXFP4:
        tile_mxfp4(w, start, nb, xq, xd, xs, xm, n, y, yo, ys)
    else:
        tile_iq4_nl(w, start, nb, xq, xd, xs, xm, n, y, yo, ys)


def _gemm_16x4_q8_0(qtype: int):
    @parallel_jit
    def gemm_16x4_q8_0(w, firsts, nb, n_groups, xq, xd, xs, xm, starts, y):
        ys = y.shape[1]
        flat = y.reshape(-1)
        group_bytes = nb * ROWS * BLOCK_BYTES[qtype]
        for task in prange((starts.shape[0] - 1) * n_groups):
            i, g = task // n_groups, task % n_groups
            t0, n = starts[i], starts[i + 1] - starts[i]
            at = t0 * nb
            _tile_q8_0(qtype, w, firsts[i] + g * group_bytes, nb, xq[at * 32:], xd[at:], xs[at:], xm[at:], n, flat,
                       t0 * ys + g * ROWS, ys)
    return gemm_16x4_q8_0


gemm_16x4_q8_0 = PerType(_gemm_16x4_q8_0)
"""gemm_16x4_q8_0(qtype, w, firsts, nb, n_groups, xq, xd, xs, xm, starts, y): y (starts[-1], n_groups·16): row t
in starts[i] .. starts[i+1] - 1 = the 16x4 matrix of qtype at byte firsts[i] of w times Q8_0 token t; the
(segment, row group) pairs split over the threads (each group's 16 rows stay in L1 while the segment's tokens
pass)."""


@jit(inline="always")
def _int16_pair(low, high) -> np.int32:
    """Two values below 2^15 in magnitude as one int32: low in bits 0-15, high in 16-31 (vpdpwssd's pairs)."""
    return np.int32((low & 0xFFFF) | (high << 16))


@jit(inline="always")
def _block_words(sums_of_8: np.ndarray, xb: np.ndarray, words) -> None:
    """A Q8_K block's int32 words from its 32 sums of 8 quants, as ir/vnni_k_ir.py reads them: the 16 sums of 16
    (ggml's bsums), the sums of 32 as four int16 pairs, -8 times each sum of 32, -32 times each sum of 8, the sums
    of 16 as eight int16 pairs."""
    sums_of_16 = xb[words + U(SUMS_OF_16):words + U(SUMS_OF_16 + 16)]
    for i in range(U(16)):
        sums_of_16[i] = sums_of_8[U(2) * i] + sums_of_8[U(2) * i + U(1)]
    for i in range(U(8)):
        xb[words + U(PAIRS_OF_16) + i] = _int16_pair(sums_of_16[U(2) * i], sums_of_16[U(2) * i + U(1)])
    for i in range(U(4)):
        low = sums_of_16[U(4) * i] + sums_of_16[U(4) * i + U(1)]
        high = sums_of_16[U(4) * i + U(2)] + sums_of_16[U(4) * i + U(3)]
        xb[words + U(PAIRS_OF_32) + i] = _int16_pair(low, high)
        xb[words + U(MINUS_8_SUMS_OF_32) + U(2) * i] = -8 * low
        xb[words + U(MINUS_8_SUMS_OF_32) + U(2) * i + U(1)] = -8 * high
    for i in range(U(32)):
        xb[words + U(MINUS_32_SUMS_OF_8) + i] = -32 * sums_of_8[i]


@jit
def quantize_q8_K_rows(x: np.ndarray, first: np.intp, end: np.intp, xq: np.ndarray, xd: np.ndarray,
                       xb: np.ndarray) -> None:
    """Rows first .. end-1 of x (n, nb·256) float32 -> xq (n·nb·256,) int8 bits, xd (n·nb,) scales, xb
    (n·nb·Q8K_WORDS,) each block's sums of its quants (_block_words): ggml's quantize_row_q8_K (its x86 build uses
    the reference code): iscale = -127/max, max the value of largest magnitude, q = min(127, round(iscale·x)) to
    nearest even, d = 1/iscale."""
    nb = U(x.shape[1]) // U(256)  # unsigned indices: signed ones kept the loops scalar (2x slower)
    lanes = np.empty(16, np.float32)  # 16 running maxima: one chain of 256 dependent maxima took half the time
    where = np.empty(16, np.uint64)   # each lane's first index of its maximum (read only where it is > 0, so set
    quants, sums_of_8 = np.empty(256, np.int32), np.empty(32, np.int32)  # in this block): a scan after the
    # maximum for the block's first such value stayed scalar (28% of the time)
    for t in range(U(first), U(end)):
        for b in range(nb):
            row = x[t, b * U(256): b * U(256) + U(256)]
            at = (t * nb + b) * U(256)
            lanes[:] = 0
            for j in range(U(0), U(256), U(16)):
                for i in range(U(16)):
                    a = abs(row[j + i])
                    larger = a > lanes[i]                        # NaN never wins, as in ggml's `ax > amax`
                    lanes[i] = a if larger else lanes[i]
                    where[i] = j + i if larger else where[i]
            amax, at_max = np.float32(0), U(255)
            for i in range(U(16)):
                amax = lanes[i] if lanes[i] > amax else amax
            for i in range(U(16)):  # ggml keeps the first value of that magnitude
                at_max = where[i] if lanes[i] == amax and where[i] < at_max else at_max
            vmax = row[at_max] if amax != 0 else np.float32(0)
            iscale = np.float32(-127) / vmax if amax != 0 else np.float32(0)
            for j in range(U(256)):  # one flat loop, then the sums: in runs of 8 the rounding stayed scalar (4x slower)
                quants[j] = min(np.int32(127), np.int32(np.rint(iscale * row[j])))
                xq[at + j] = np.uint8(quants[j] & 0xFF)
            for i in range(U(32)):
                total = np.int32(0)
                for j in range(U(8)):
                    total += quants[i * U(8) + j]
                sums_of_8[i] = total
            _block_words(sums_of_8, xb, (t * nb + b) * U(Q8K_WORDS))
            xd[t * nb + b] = np.float32(1) / iscale if amax != 0 else np.float32(0)


@parallel_jit
def quantize_q8_K_parallel(x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray) -> None:
    n = x.shape[0]
    chunks = -(-n // PARALLEL_ROWS)
    for c in prange(chunks):
        quantize_q8_K_rows(x, c * PARALLEL_ROWS, min(n, (c + 1) * PARALLEL_ROWS), xq, xd, xb)


def quantize_q8_K(x: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray) -> None:
    """All rows of x quantized to Q8_K (see quantize_q8_K_rows), as quantize_q8_0 shares them out."""
    if x.shape[0] <= PARALLEL_ROWS:
        quantize_q8_K_rows(x, 0, x.shape[0], xq, xd, xb)
    else:
        quantize_q8_K_parallel(x, xq, xd, xb)


K_GROUP_BLOCK = np.array([ROWS * K_FORMATS[t][0] if t in K_FORMATS else 0 for t in range(max(K_FORMATS) + 1)],
                         np.int64)


@jit(inline="always")
def _tile_q8_K(qtype, w, start, nb, xq, xd, xb, n, y, yo, ys):
    if qtype == Q4_K:
        tile_q4_K(w, start, nb, xq, xd, xb, n, y, yo, ys)
    elif qtype == Q6_K:
        tile_q6_K(w, start, nb, xq, xd, xb, n, y, yo, ys)
    elif qtype == Q5_K:
        tile_q5_K(w, start, nb, xq, xd, xb, n, y, yo, ys)
    elif qtype == Q3_K:
        tile_q3_K(w, start, nb, xq, xd, xb, n, y, yo, ys)
    elif qtype == Q2_K:
        tile_q2_K(w, start, nb, xq, xd, xb, n, y, yo, ys)
    else:
        tile_iq4_xs(w, start, nb, xq, xd, xb, n, y, yo, ys)


# A prompt's product whose tokens' activations outgrow L2 (more than L2_ACTIVATIONS bytes of quants and words) gives
# each task a run of row groups whose weights fit in L2 (at most L2_WEIGHTS bytes) and takes the tokens STEP_TOKENS
# at a time through all of them: each step's activations are read once from beyond L2 for the run, where one group
# at a time read all the tokens' again for every group (an 8B model's down projection: 14 MB of them, 448 times
# over on each thread; its Q4_K products 15% faster, a 1B model's 4-8%; Q6_K's 12% slower, so they keep one group a
# task). Shorter prompts lost 5% to the steps.
# Q6_K goes in runs too where a group is 8 rows (AVX2; Zen 3, 2 threads, 512 tokens, alternating: 2048 x 8192
# 166 -> 259 GOPS, 8192 x 2048 200 -> 219).
L2_ACTIVATIONS, L2_WEIGHTS = 1 << 19, 1 << 20
RUN_TYPES = (Q4_K, Q6_K) if ROWS == 8 else (Q4_K,)
STEP_TOKENS = 16
MIN_TASKS = 8


@jit(inline="always")
def run_of_groups(n_groups, group_bytes):
    """Row groups of group_bytes each that L2_WEIGHTS holds, leaving at least MIN_TASKS runs to share out."""
    return max(1, min(L2_WEIGHTS // group_bytes, n_groups // MIN_TASKS))


@jit(inline="always")
def groups_per_task(qtype, n_groups, group_bytes, nb, starts):
    """Row groups a task of gemm_16x4_q8_K takes: a run of them (run_of_groups) for RUN_TYPES where a segment's
    activations outgrow L2_ACTIVATIONS; else 1 (a generation step, a short prompt, an expert's rows, Q6_K's
    products in 16-row groups, which were 12% slower in runs on an Intel Xeon)."""
    longest = 0
    for i in range(starts.shape[0] - 1):
        longest = max(longest, starts[i + 1] - starts[i])
    if qtype not in RUN_TYPES or longest * nb * (256 + 4 * Q8K_WORDS) <= L2_ACTIVATIONS:
        return 1
    return run_of_groups(n_groups, group_bytes)


def _gemm_16x4_q8_K(qtype: int):
    @parallel_jit
    def gemm_16x4_q8_K(w, firsts, nb, n_groups, xq, xd, xb, starts, y):
        ys = y.shape[1]
        flat = y.reshape(-1)
        group_bytes = nb * K_GROUP_BLOCK[qtype]
        per = groups_per_task(qtype, n_groups, group_bytes, nb, starts)
        runs, step = -(-n_groups // per), STEP_TOKENS if per > 1 else max(1, starts[-1] - starts[0])
        for task in prange((starts.shape[0] - 1) * runs):
            i, g0 = task // runs, task % runs * per
            for t0 in range(starts[i], starts[i + 1], step):
                n, at = min(step, starts[i + 1] - t0), t0 * nb
                for g in range(g0, min(n_groups, g0 + per)):
                    _tile_q8_K(qtype, w, firsts[i] + g * group_bytes, nb, xq[at * 256:], xd[at:],
                               xb[at * Q8K_WORDS:], n, flat, t0 * ys + g * ROWS, ys)
    return gemm_16x4_q8_K


gemm_16x4_q8_K = PerType(_gemm_16x4_q8_K)
"""gemm_16x4_q8_K(qtype, w, firsts, nb, n_groups, xq, xd, xb, starts, y): gemm_16x4_q8_0 for a K-quant qtype
against Q8_K tokens (segments as there), each task a run of row groups (groups_per_task: a K-quant matrix's groups
are larger, an 8B model's down projection's 130 KB)."""

Q4_K_QUANTS_AT = KLayout(Q4_K).at[16]   # where a Q4_K group block's 32 quant vectors start


Q6_K_AT = KLayout(Q6_K).at          # where each of a Q6_K group block's fields is, by its offset in the file's block
Q6_K_QL = np.array([[Q6_K_AT[64 * h + 16 * half], Q6_K_AT[64 * h + 32 + 16 * half]] for h in range(2)
                    for half in range(2)], np.int64)           # (h, half): ql of runs g = 0, 2 and of g = 1, 3
Q6_K_QH = np.array([Q6_K_AT[128 + 32 * h + 16 * half] for h in range(2) for half in range(2)], np.int64)


@jit
def unpack_group(qtype: np.intp, w: np.ndarray, g: np.intp, nb: np.intp, wu: np.ndarray) -> None:
    """The quants of the Q4_K or Q6_K row group at byte g of w as bytes, for the tile unit (ir/amx_ir.py): per block
    and sub-block (Q4_K: 8 of 32 values, Q6_K: 16 of 16), values / 4 rows of 64 bytes, each the interleaved
    layout's vector of those 4 values of the 16 rows: Q4_K's nibbles (vector 8·(j // 2) + m: low for sub-block j
    even, high for odd), Q6_K's 6 bits (value 128h + 32g + l: low 4 bits in ql, the low nibble for g < 2, high 2
    bits at bit 2g of qh, as KLayout._q6_k_sub_block reads them). Every shift is a constant of its loop, so the
    loops vectorise (with the shift a variable they ran at 5 GB/s)."""
    group_block = U(K_GROUP_BLOCK[qtype])
    for b in range(U(nb)):
        block = U(g) + b * group_block
        if qtype == Q4_K:
            for pair in range(U(4)):                      # sub-blocks 2·pair and 2·pair + 1: 8 vectors, 512 bytes
                src = block + U(Q4_K_QUANTS_AT) + pair * U(512)
                low = (b * U(8) + U(2) * pair) * U(512)
                for i in range(U(512)):
                    wu[low + i] = ((w[src + i] & U(15)) + U(248)) & U(255)     # nibble - 8, signed
                    wu[low + U(512) + i] = ((w[src + i] >> U(4)) + U(248)) & U(255)
        else:
            for piece in range(U(4)):                     # (h, half): 4 vectors of each field, 256 bytes
                h, half = piece // U(2), piece % U(2)
                ql0, ql1 = block + U(Q6_K_QL[piece, 0]), block + U(Q6_K_QL[piece, 1])
                qh = block + U(Q6_K_QH[piece])
                dst = (b * U(16) + U(8) * h + half) * U(256)     # sub-block 8h + 2g + half
                for i in range(U(256)):
                    high = w[qh + i]
                    wu[dst + i] = (w[ql0 + i] & U(15)) | ((high & U(3)) << U(4))
                    wu[dst + U(512) + i] = (w[ql1 + i] & U(15)) | (((high >> U(2)) & U(3)) << U(4))
                    wu[dst + U(1024) + i] = (w[ql0 + i] >> U(4)) | (((high >> U(4)) & U(3)) << U(4))
                    wu[dst + U(1536) + i] = (w[ql1 + i] >> U(4)) | ((high >> U(6)) << U(4))


@jit(inline="always")
def tiles_of_tokens(t, nb, word, words, xq, xd, xb, xa, xs, xw) -> None:
    """Token t's Q8_K block data as the tile unit's kernels read them, per 16 tokens: its quants into xa (per block
    and 32 values, the 16 tokens' 32 bytes in turn), its scales into xs and the `words` words from `word` on of
    each block into xw (per block, the 16 tokens' in turn: the words a block's vector steps read lie together, where
    in xb a long prompt's lay beyond L2 at 272 bytes a token: 2048 x 8192 at 512 tokens 22.2 -> 18.3 ms)."""
    tile, lane = t // AMX_TOKENS, t % AMX_TOKENS
    for chunk in range(nb * 8):
        at = ((tile * nb * 8 + chunk) * AMX_TOKENS + lane) * 32
        xa[at:at + 32] = xq[t * nb * 256 + chunk * 32:t * nb * 256 + chunk * 32 + 32]
    for b in range(nb):
        at, src = (tile * nb + b) * AMX_TOKENS + lane, (t * nb + b) * Q8K_WORDS + word
        xs[at] = xd[t * nb + b]
        xw[at * words:(at + 1) * words] = xb[src:src + words]


def _gemm_amx(qtype: int):
    if not amx_usable():  # asks Linux for the tile state first: a tile instruction without it kills the process
        raise RuntimeError("the tile unit's products need AMX-INT8, granted to this process")
    word, words = AMX_WORDS[qtype]

    @parallel_jit
    def gemm_amx(w, first, nb, n_groups, xq, xd, xb, y, config):
        n, ys = y.shape[0], y.shape[1]
        flat = y.reshape(-1)
        group_bytes = nb * K_GROUP_BLOCK[qtype]
        full = n // AMX_TOKENS * AMX_TOKENS
        xa, xs, xw = (np.empty(full * nb * 256, np.uint8), np.empty(full * nb, np.float32),
                      np.empty(full * nb * words, np.int32))
        for t in prange(full):
            tiles_of_tokens(t, nb, word, words, xq, xd, xb, xa, xs, xw)
        unpacked = nb * 4096
        per = run_of_groups(n_groups, unpacked)
        for task in prange(-(-n_groups // per)):
            g0, g1 = task * per, min(n_groups, task * per + per)
            wu, sums = np.empty((g1 - g0) * unpacked, np.uint8), np.empty(8192, np.int32)
            for g in range(g0, g1):
                unpack_group(qtype, w, first + g * group_bytes, nb, wu[(g - g0) * unpacked:])
            for t0 in range(0, full, AMX_TOKENS):
                for g in range(g0, g1):
                    start, mine = first + g * group_bytes, wu[(g - g0) * unpacked:]
                    if qtype == Q4_K:
                        tile_amx_q4_K(w, start, nb, mine, xa, xs, xw, t0, flat, g * ROWS, ys, sums, config)
                    else:
                        tile_amx_q6_K(w, start, nb, mine, xa, xs, xw, t0, flat, g * ROWS, ys, sums, config)
            if full < n:
                at = full * nb
                for g in range(g0, g1):
                    _tile_q8_K(qtype, w, first + g * group_bytes, nb, xq[at * 256:], xd[at:], xb[at * Q8K_WORDS:],
                               n - full, flat, full * ys + g * ROWS, ys)
    return gemm_amx


gemm_amx = PerType(_gemm_amx)
"""gemm_amx(qtype, w, first, nb, n_groups, xq, xd, xb, y, config): gemm_16x4_q8_K for the Q4_K or Q6_K matrix at
byte `first` of w and all the Q8_K tokens (y: (n, n_groups·16)), the tile unit taking them 16 at a time
(ir/amx_ir.py; config: tile_config(qtype)), the last n % 16 on the VNNI tiles: the same bits. Each task unpacks a
run of row groups that L2 holds (nb·4 KiB each, at most L2_WEIGHTS) and takes every 16 tokens through them (one
group at a time read all the tokens again from beyond L2 for each group); the tokens' quants are first laid out as
the tile unit reads them (per 16 tokens, block and 32 values, the 16 tokens' 32 bytes in turn)."""
