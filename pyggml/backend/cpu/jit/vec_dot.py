"""Dot products of one block-format row with float32 values, dequantizing in registers: `vec_dot_<type>_f32`.

ggml's CPU backend first quantizes the activations to Q8_0/Q8_K and multiplies integers; here the
activations stay float32 and each block's quants are turned into floats as they are multiplied. Both
were measured on Gemma 3 270M's 127 matrices (2 threads: 12.0 ms a token this way, 12.3 ms the integer
way; the head is memory-bound either way), so the float way is kept: it adds no activation rounding,
so results match a float64 product of the dequantized weights to ~1e-6 instead of ~1e-2.

Each function reads `nb` blocks of the row at byte s of src and values x[xo:]; per block the quants are
summed against x first and scaled once (d·Σq·x, and for types with a minimum m·Σx), the order ggml uses.
`vec_dot` picks by ggml type number; types without one here go through a dequantized row (mul_mat.py).
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.quants import (_F16, _Q4_0, _Q4_1, _Q4_K, _Q5_0, _Q5_K, _Q6_K, _Q8_0, QK_K, U, _fp16,
                                           _u32, k45_quants, k45_sub_scales)

F32 = np.float32
FASTMATH = {"reassoc", "contract"}  # lets LLVM split a dot's sum over vector lanes; NaN and inf still propagate
BITS = np.array([1 << i for i in range(32)], np.uint32)


@jit(fastmath=FASTMATH)
def vec_dot_f16_f32(src, s, x, xo, n):
    acc = F32(0.0)
    for j in range(n):
        acc += _fp16(src, s + U(2) * j) * x[xo + j]
    return acc


@jit(fastmath=FASTMATH)
def vec_dot_q8_0_f32(src, s, x, xo, nb):
    acc = F32(0.0)
    for b in range(nb):
        p, t = s + U(34) * b, xo + U(32) * b
        part = F32(0.0)
        for j in range(U(32)):
            part += F32(np.int8(src[p + U(2) + j])) * x[t + j]
        acc += _fp16(src, p) * part
    return acc


@jit(fastmath=FASTMATH)
def vec_dot_q4_0_f32(src, s, x, xo, nb):
    acc = F32(0.0)
    for b in range(nb):
        p, t = s + U(18) * b, xo + U(32) * b
        part = F32(0.0)
        for j in range(U(16)):
            q = src[p + U(2) + j]
            lo, hi = np.int32(np.int32(q & 15) - np.int32(8)), np.int32(np.int32(q >> 4) - np.int32(8))
            part += F32(lo) * x[t + j] + F32(hi) * x[t + U(16) + j]
        acc += _fp16(src, p) * part
    return acc


@jit(fastmath=FASTMATH)
def vec_dot_q4_1_f32(src, s, x, xo, nb):
    acc = F32(0.0)
    for b in range(nb):
        p, t = s + U(20) * b, xo + U(32) * b
        part, total = F32(0.0), F32(0.0)
        for j in range(U(16)):
            q = src[p + U(4) + j]
            lo, hi = x[t + j], x[t + U(16) + j]
            part += F32(np.int32(q & 15)) * lo + F32(np.int32(q >> 4)) * hi
            total += lo + hi
        acc += _fp16(src, p) * part + _fp16(src, p + U(2)) * total
    return acc


@jit(fastmath=FASTMATH)
def vec_dot_q5_0_f32(src, s, x, xo, nb):
    # Numba widens integer arithmetic to 64 bits; truncating each result to int32 (and testing the fifth bit
    # against a mask table rather than shifting by the lane) lets LLVM keep 32-bit vector lanes
    bit = BITS
    acc = F32(0.0)
    for b in range(nb):
        p, t = s + U(22) * b, xo + U(32) * b
        qh = _u32(src, p + U(2))
        part = F32(0.0)
        for j in range(U(16)):
            q = np.int32(src[p + U(6) + j])
            h0 = np.int32(16) if np.int32(qh & bit[j]) != 0 else np.int32(0)
            h1 = np.int32(16) if np.int32(qh & bit[j + U(16)]) != 0 else np.int32(0)
            lo = np.int32(np.int32(np.int32(q & np.int32(15)) | h0) - np.int32(16))
            hi = np.int32(np.int32(np.int32(q >> np.int32(4)) | h1) - np.int32(16))
            part += F32(lo) * x[t + j] + F32(hi) * x[t + U(16) + j]
        acc += _fp16(src, p) * part
    return acc


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


HAS_VEC_DOT = frozenset({_F16, _Q8_0, _Q4_0, _Q4_1, _Q5_0, _Q4_K, _Q5_K, _Q6_K})


@jit
def vec_dot(qtype, src, s, x, xo, nb):
    """Σ row·x for a row of ggml type qtype in HAS_VEC_DOT (0 for others: callers check first)."""
    if qtype == _Q8_0:
        return vec_dot_q8_0_f32(src, s, x, xo, nb)
    if qtype == _Q5_0:
        return vec_dot_q5_0_f32(src, s, x, xo, nb)
    if qtype == _Q4_K:
        return vec_dot_q4_K_f32(src, s, x, xo, nb)
    if qtype == _Q6_K:
        return vec_dot_q6_K_f32(src, s, x, xo, nb)
    if qtype == _F16:
        return vec_dot_f16_f32(src, s, x, xo, nb)
    if qtype == _Q4_0:
        return vec_dot_q4_0_f32(src, s, x, xo, nb)
    if qtype == _Q4_1:
        return vec_dot_q4_1_f32(src, s, x, xo, nb)
    if qtype == _Q5_K:
        return vec_dot_q5_K_f32(src, s, x, xo, nb)
    return F32(0.0)
