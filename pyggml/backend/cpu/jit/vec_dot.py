"""Dot products of one block-format row with float32 values, dequantizing in registers: `vec_dot_<type>_f32`.

ggml's CPU backend first quantizes the activations to Q8_0/Q8_K and multiplies integers; here the
activations stay float32 and each block's quants are turned into floats as they are multiplied. Both
were measured on Gemma 3 270M's 127 matrices (2 threads: 12.0 ms a token this way, 12.3 ms the integer
way; the head is memory-bound either way), so the float way is kept for weights read in the file's
layout: it adds no activation rounding, so results match a float64 product of the dequantized weights to
~1e-6 instead of ~1e-2. (On AVX-512 VNNI, a model whose layers are all Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 is
interleaved and multiplied the integer way instead: repack.py, ir/vnni_ir.py.)

Each function reads `nb` blocks of the row at byte s of src and values x[xo:]. The 32-value block types
(Q4_0, Q4_1, Q5_0, Q8_0) are LLVM vector IR (block_ir.py: one vector accumulator per row, 1.2-1.8x the
speed of the same loops in Python); the K-quants sum each sub-block's quants against x first and scale
once (d·Σq·x, and for types with a minimum m·Σx), the order ggml uses.
mul_mat.py picks them by ggml type number; types without one here go through a dequantized row.
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.ir.block_ir import row_dot_q4_0, row_dot_q4_1, row_dot_q5_0, row_dot_q8_0
from pyggml.backend.cpu.jit.quants import QK_K, U, _fp16, k45_quants, k45_sub_scales

F32 = np.float32
FASTMATH = {"reassoc", "contract"}  # lets LLVM split a dot's sum over vector lanes; NaN and inf still propagate


@jit(fastmath=FASTMATH)
def vec_dot_f16_f32(src, s, x, xo, n):
    acc = F32(0.0)
    for j in range(n):
        acc += _fp16(src, s + U(2) * j) * x[xo + j]
    return acc


@jit
def vec_dot_q8_0_f32(src, s, x, xo, nb):
    return row_dot_q8_0(src, s, x, xo, nb)


@jit
def vec_dot_q4_0_f32(src, s, x, xo, nb):
    return row_dot_q4_0(src, s, x, xo, nb)


@jit
def vec_dot_q4_1_f32(src, s, x, xo, nb):
    return row_dot_q4_1(src, s, x, xo, nb)


@jit
def vec_dot_q5_0_f32(src, s, x, xo, nb):
    return row_dot_q5_0(src, s, x, xo, nb)


@jit(inline="always", fastmath=FASTMATH)
def _vec_dot_k45(src, s, x, xo, nb, size, fifth):
    acc = F32(0.0)
    for b in range(nb):
        p, t = s + size * b, xo + U(QK_K) * b
        for c in range(U(4)):
            d1, n1, d2, n2 = k45_sub_scales(src, p, c)
            dot1, dot2, sum1, sum2 = F32(0.0), F32(0.0), F32(0.0), F32(0.0)
            for l in range(U(32)):
                lo, hi = k45_quants(src, p, c, l, fifth)
                xl, xh = x[t + c * U(64) + l], x[t + c * U(64) + U(32) + l]
                dot1 += F32(lo) * xl
                dot2 += F32(hi) * xh
                sum1 += xl
                sum2 += xh
            acc += d1 * dot1 + d2 * dot2 - (n1 * sum1 + n2 * sum2)
    return acc


@jit(fastmath=FASTMATH)
def vec_dot_q4_K_f32(src, s, x, xo, nb):
    return _vec_dot_k45(src, s, x, xo, nb, U(144), False)


@jit(fastmath=FASTMATH)
def vec_dot_q5_K_f32(src, s, x, xo, nb):
    return _vec_dot_k45(src, s, x, xo, nb, U(176), True)


@jit(fastmath=FASTMATH)
def vec_dot_q6_K_f32(src, s, x, xo, nb):
    acc = F32(0.0)
    for b in range(nb):
        p, t = s + U(210) * b, xo + U(QK_K) * b
        d = _fp16(src, p + U(208))
        for n in range(U(2)):
            for k in range(U(4)):
                for half in range(U(2)):
                    part = F32(0.0)
                    for l in range(U(16)):
                        ll = half * U(16) + l
                        ql = src[p + n * U(64) + (k % U(2)) * U(32) + ll]
                        nib = np.int32(ql & 15) if k < U(2) else np.int32(ql >> 4)
                        qh = np.int32((src[p + U(128) + n * U(32) + ll] >> (U(2) * k)) & 3)
                        q = np.int32(np.int32(nib | np.int32(qh << np.int32(4))) - np.int32(32))
                        part += F32(q) * x[t + n * U(128) + k * U(32) + ll]
                    acc += d * F32(np.int8(src[p + U(192) + n * U(8) + U(2) * k + half])) * part
    return acc
