"""ggml's block formats decoded in compiled code: one `dequantize_row_<type>` per type, as ggml names them.

Every function reads `nb` whole blocks from the byte array `src` starting at byte `p` and writes their
float32 values to `dst` starting at element `o`; `dequantize_row` picks the function by ggml type number.
The layouts are ggml's (ggml-common.h): fp16 scales little-endian, quants packed as ggml packs them.

Indices are unsigned (`np.uintp`) on purpose: with signed ones Numba emits a negative-index wraparound
per access and LLVM vectorizes nothing (a float32 sum ran 2.2 GB/s instead of 20). Mixing an unsigned
and a plain int literal would make a float in Numba, hence the `U(...)` around every index constant.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.floatbits import bf16_to_f32, e8m0_half_to_f32, f16_to_f32
from pyggml.core.types import GGMLType as G

# LLVM fully unrolls the constant 16- and 32-trip block loops before vectorizing and then leaves them scalar
# (Q8_0 output head at 1 thread: 65 ms with LLVM's default, 10 ms without unrolling). Process-wide.
llvm.set_option("", "-unroll-threshold=0")

U = np.uintp
QK_K = 256

# ggml's non-linear 4-bit code book (kvalues_iq4nl)
KVALUES_IQ4NL = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
# ggml's MXFP4 code book (kvalues_mxfp4): the E2M1 values doubled, so that they are integers; the E8M0 scale is
# read halved to make up for it
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)


@jit(inline="always")
def _u16(src, i):
    return np.uint32(src[i]) | (np.uint32(src[i + U(1)]) << np.uint32(8))


@jit(inline="always")
def _fp16(src, i):
    return f16_to_f32(_u16(src, i))


@jit(inline="always")
def _u32(src, i):
    return _u16(src, i) | (_u16(src, i + U(2)) << np.uint32(16))


@jit
def dequantize_row_f16(src, p, dst, o, n):
    for j in range(n):
        dst[o + j] = _fp16(src, p + U(2) * j)


@jit
def dequantize_row_bf16(src, p, dst, o, n):
    for j in range(n):
        dst[o + j] = bf16_to_f32(_u16(src, p + U(2) * j))


@jit
def dequantize_row_q4_0(src, p, dst, o, nb):
    """18-byte blocks: fp16 d, 16 bytes of nibbles; x = (q - 8)·d, low nibbles first."""
    for b in range(nb):
        s, t = p + U(18) * b, o + U(32) * b
        d = _fp16(src, s)
        for j in range(U(16)):
            q = src[s + U(2) + j]
            dst[t + j] = np.float32(np.int32(q & 15) - np.int32(8)) * d
            dst[t + U(16) + j] = np.float32(np.int32(q >> 4) - np.int32(8)) * d


@jit
def dequantize_row_q4_1(src, p, dst, o, nb):
    """20-byte blocks: fp16 d, fp16 m, 16 bytes of nibbles; x = q·d + m."""
    for b in range(nb):
        s, t = p + U(20) * b, o + U(32) * b
        d, m = _fp16(src, s), _fp16(src, s + U(2))
        for j in range(U(16)):
            q = src[s + U(4) + j]
            dst[t + j] = np.float32(q & 15) * d + m
            dst[t + U(16) + j] = np.float32(q >> 4) * d + m


@jit
def dequantize_row_q5_0(src, p, dst, o, nb):
    """22-byte blocks: fp16 d, 32 fifth bits, 16 bytes of nibbles; x = (q - 16)·d."""
    for b in range(nb):
        s, t = p + U(22) * b, o + U(32) * b
        d, qh = _fp16(src, s), _u32(src, s + U(2))
        for j in range(U(16)):
            q = src[s + U(6) + j]
            h0 = np.int32((qh >> np.uint32(j)) & np.uint32(1)) << np.int32(4)
            h1 = np.int32((qh >> np.uint32(j + U(16))) & np.uint32(1)) << np.int32(4)
            dst[t + j] = np.float32((np.int32(q & 15) | h0) - np.int32(16)) * d
            dst[t + U(16) + j] = np.float32((np.int32(q >> 4) | h1) - np.int32(16)) * d


@jit
def dequantize_row_q5_1(src, p, dst, o, nb):
    """24-byte blocks: fp16 d, fp16 m, 32 fifth bits, 16 bytes of nibbles; x = q·d + m."""
    for b in range(nb):
        s, t = p + U(24) * b, o + U(32) * b
        d, m, qh = _fp16(src, s), _fp16(src, s + U(2)), _u32(src, s + U(4))
        for j in range(U(16)):
            q = src[s + U(8) + j]
            h0 = np.int32((qh >> np.uint32(j)) & np.uint32(1)) << np.int32(4)
            h1 = np.int32((qh >> np.uint32(j + U(16))) & np.uint32(1)) << np.int32(4)
            dst[t + j] = np.float32(np.int32(q & 15) | h0) * d + m
            dst[t + U(16) + j] = np.float32(np.int32(q >> 4) | h1) * d + m


@jit
def dequantize_row_q8_0(src, p, dst, o, nb):
    """34-byte blocks: fp16 d, 32 int8; x = q·d."""
    for b in range(nb):
        s, t = p + U(34) * b, o + U(32) * b
        d = _fp16(src, s)
        for j in range(U(32)):
            dst[t + j] = np.float32(np.int8(src[s + U(2) + j])) * d


@jit(inline="always")
def _dequantize_row_code_book(src, p, dst, o, nb, kv, scale_bytes):
    """Blocks of a scale (`scale_bytes` 2: fp16 d; 1: an E8M0 exponent, read halved) and 16 bytes of nibbles
    indexing the code book kv, low nibbles first: x = kv[q]·d."""
    for b in range(nb):
        s, t = p + (scale_bytes + U(16)) * b, o + U(32) * b
        d = _fp16(src, s) if scale_bytes == U(2) else e8m0_half_to_f32(src[s])
        for j in range(U(16)):
            q = src[s + scale_bytes + j]
            dst[t + j] = np.float32(kv[q & 15]) * d
            dst[t + U(16) + j] = np.float32(kv[q >> 4]) * d


@jit
def dequantize_row_iq4_nl(src, p, dst, o, nb):
    """18-byte blocks: fp16 d, 16 bytes of nibbles indexing KVALUES_IQ4NL; x = kvalue[q]·d."""
    _dequantize_row_code_book(src, p, dst, o, nb, KVALUES_IQ4NL, U(2))


@jit
def dequantize_row_mxfp4(src, p, dst, o, nb):
    """17-byte blocks: an E8M0 exponent e, 16 bytes of nibbles indexing KVALUES_MXFP4; x = kvalue[q]·2^(e - 128)."""
    _dequantize_row_code_book(src, p, dst, o, nb, KVALUES_MXFP4, U(1))


@jit
def dequantize_row_q2_K(src, p, dst, o, nb):
    """84-byte super-blocks of 256: 16 bytes of 4-bit scale/min pairs, 64 bytes of 2-bit quants, fp16 d, dmin.

    Value e: quant bits 2·j of byte 32·n + l (n = e // 128, j = e % 128 // 32, l = e % 32), pair e // 16.
    """
    for b in range(nb):
        s, t = p + U(84) * b, o + U(QK_K) * b
        d, dmin = _fp16(src, s + U(80)), _fp16(src, s + U(82))
        for n in range(U(2)):
            for j in range(U(4)):
                for half in range(U(2)):
                    sc = src[s + n * U(8) + j * U(2) + half]
                    dl, ml = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
                    base = t + n * U(128) + j * U(32) + half * U(16)
                    for l in range(U(16)):
                        q = (src[s + U(16) + n * U(32) + half * U(16) + l] >> (U(2) * j)) & 3
                        dst[base + l] = dl * np.float32(q) - ml


@jit
def dequantize_row_q3_K(src, p, dst, o, nb):
    """110-byte super-blocks: 32 bytes of high bits, 64 bytes of 2-bit quants, 12 bytes of 6-bit scales, fp16 d.

    Value e: 2 low bits at 2·j of byte 32·n + l, minus 4 unless bit 4·n + j of hmask byte l is set; scale
    e // 16 = (low nibble of byte i % 8, the high one for i >= 8) | 2 bits of byte 8 + i % 4 at 2·(i // 4), less 32.
    """
    for b in range(nb):
        s, t = p + U(110) * b, o + U(QK_K) * b
        d = _fp16(src, s + U(108))
        for i in range(U(16)):
            low = (src[s + U(96) + i % U(8)] >> (U(4) * (i // U(8)))) & 15
            high = (src[s + U(104) + i % U(4)] >> (U(2) * (i // U(4)))) & 3
            dl = d * np.float32(np.int32(low | (high << 4)) - np.int32(32))
            n, j, half = i // U(8), (i % U(8)) // U(2), i % U(2)
            for l in range(U(16)):
                ll = half * U(16) + l
                q = np.int32((src[s + U(32) + n * U(32) + ll] >> (U(2) * j)) & 3)
                h = (src[s + ll] >> (U(4) * n + j)) & 1
                dst[t + i * U(16) + l] = dl * np.float32(q - (np.int32(0) if h else np.int32(4)))


@jit(inline="always")
def _scale_min_k4(src, s, j):
    """(scale, min) j of the 8 6-bit pairs packed in the 12 bytes at s (ggml's get_scale_min_k4)."""
    if j < U(4):
        return src[s + j] & 63, src[s + j + U(4)] & 63
    sc = (src[s + j + U(4)] & 15) | ((src[s + j - U(4)] >> 6) << 4)
    mn = (src[s + j + U(4)] >> 4) | ((src[s + j] >> 6) << 4)
    return sc, mn


@jit(inline="always")
def k45_sub_scales(src, s, c):
    """(d·scale, dmin·min) of sub-blocks 2c and 2c + 1 of the Q4_K/Q5_K super-block at byte s."""
    d, dmin = _fp16(src, s), _fp16(src, s + U(2))
    sc1, m1 = _scale_min_k4(src, s + U(4), U(2) * c)
    sc2, m2 = _scale_min_k4(src, s + U(4), U(2) * c + U(1))
    return d * np.float32(sc1), dmin * np.float32(m1), d * np.float32(sc2), dmin * np.float32(m2)


@jit(inline="always")
def k45_quants(src, s, c, l, fifth):
    """Quants of values 64c + l and 64c + 32 + l of the super-block at s: low and high nibble of byte 32c + l
    (Q4_K: quants from byte 16); Q5_K (`fifth`, quants from byte 48) adds bits 2c and 2c + 1 of byte 16 + l."""
    if not fifth:
        q = src[s + U(16) + c * U(32) + l]
        return np.int32(q & 15), np.int32(q >> 4)
    q, h = src[s + U(48) + c * U(32) + l], src[s + U(16) + l]
    lo = np.int32(q & 15) | (np.int32((h >> (U(2) * c)) & 1) << np.int32(4))
    hi = np.int32(q >> 4) | (np.int32((h >> (U(2) * c + U(1))) & 1) << np.int32(4))
    return lo, hi


@jit(inline="always")
def _dequantize_row_k45(src, p, dst, o, nb, size, fifth):
    for b in range(nb):
        s, t = p + size * b, o + U(QK_K) * b
        for c in range(U(4)):
            d1, n1, d2, n2 = k45_sub_scales(src, s, c)
            for l in range(U(32)):
                lo, hi = k45_quants(src, s, c, l, fifth)
                dst[t + c * U(64) + l] = d1 * np.float32(lo) - n1
                dst[t + c * U(64) + U(32) + l] = d2 * np.float32(hi) - n2


@jit
def dequantize_row_q4_K(src, p, dst, o, nb):
    """144-byte super-blocks: fp16 d, dmin, 12 bytes of 6-bit scale/min pairs, 128 bytes of nibbles.

    Each 64 values read 32 bytes: the first 32 their low nibbles (pair 2c), the next 32 the high (pair 2c + 1).
    """
    _dequantize_row_k45(src, p, dst, o, nb, U(144), False)


@jit
def dequantize_row_q5_K(src, p, dst, o, nb):
    """176-byte super-blocks: as Q4_K with 32 bytes of fifth bits before the nibbles."""
    _dequantize_row_k45(src, p, dst, o, nb, U(176), True)


@jit
def dequantize_row_q6_K(src, p, dst, o, nb):
    """210-byte super-blocks: 128 bytes of low nibbles, 64 bytes of 2 high bits, 16 int8 scales, fp16 d.

    Per half n (128 values): value 32k + l takes the low (k < 2) or high nibble of ql byte 64n + l + 32(k % 2),
    2 bits at 2k of qh byte 32n + l, scale 8n + 2k + l // 16; x = d·scale·(q - 32).
    """
    for b in range(nb):
        s, t = p + U(210) * b, o + U(QK_K) * b
        d = _fp16(src, s + U(208))
        for n in range(U(2)):
            for k in range(U(4)):
                for l in range(U(32)):
                    ql = src[s + n * U(64) + (k % U(2)) * U(32) + l]
                    nib = np.int32(ql & 15) if k < U(2) else np.int32(ql >> 4)
                    qh = np.int32((src[s + U(128) + n * U(32) + l] >> (U(2) * k)) & 3)
                    q = (nib | (qh << np.int32(4))) - np.int32(32)
                    sc = np.float32(np.int8(src[s + U(192) + n * U(8) + U(2) * k + l // U(16)]))
                    dst[t + n * U(128) + k * U(32) + l] = d * sc * np.float32(q)


@jit
def dequantize_row_iq4_xs(src, p, dst, o, nb):
    """136-byte super-blocks: fp16 d, 16 high scale bits, 4 bytes of low scale nibbles, 128 bytes of nibbles."""
    kv = KVALUES_IQ4NL
    for b in range(nb):
        s, t = p + U(136) * b, o + U(QK_K) * b
        d, scales_h = _fp16(src, s), _u16(src, s + U(2))
        for ib in range(U(8)):
            low = (src[s + U(4) + ib // U(2)] >> (U(4) * (ib % U(2)))) & 15
            high = (scales_h >> np.uint32(U(2) * ib)) & np.uint32(3)
            dl = d * np.float32(np.int32(low | (high << 4)) - np.int32(32))
            for j in range(U(16)):
                q = src[s + U(8) + ib * U(16) + j]
                dst[t + ib * U(32) + j] = dl * np.float32(kv[q & 15])
                dst[t + ib * U(32) + U(16) + j] = dl * np.float32(kv[q >> 4])


# ggml type numbers with a dequantize_row here, and their (values per block, bytes per block)
BLOCKS = {G.F16: (1, 2), G.BF16: (1, 2), G.Q4_0: (32, 18), G.Q4_1: (32, 20), G.Q5_0: (32, 22),
          G.Q5_1: (32, 24), G.Q8_0: (32, 34), G.Q2_K: (256, 84), G.Q3_K: (256, 110), G.Q4_K: (256, 144),
          G.Q5_K: (256, 176), G.Q6_K: (256, 210), G.IQ4_NL: (32, 18), G.IQ4_XS: (256, 136), G.MXFP4: (32, 17)}
_F16, _BF16, _Q4_0, _Q4_1, _Q5_0, _Q5_1, _Q8_0 = (int(t) for t in (G.F16, G.BF16, G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1,
                                                                 G.Q8_0))
_Q2_K, _Q3_K, _Q4_K, _Q5_K, _Q6_K, _IQ4_NL, _IQ4_XS = (int(t) for t in (G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K,
                                                                       G.IQ4_NL, G.IQ4_XS))
_MXFP4 = int(G.MXFP4)


@jit(inline="always")
def dequantize_row(qtype, src, p, dst, o, nb):  # noqa: C901
    """The values of `nb` blocks of ggml type `qtype` at byte p of src, written to dst from element o."""
    if qtype == _Q8_0:
        dequantize_row_q8_0(src, p, dst, o, nb)
    elif qtype == _Q5_0:
        dequantize_row_q5_0(src, p, dst, o, nb)
    elif qtype == _Q4_K:
        dequantize_row_q4_K(src, p, dst, o, nb)
    elif qtype == _Q6_K:
        dequantize_row_q6_K(src, p, dst, o, nb)
    elif qtype == _F16:
        dequantize_row_f16(src, p, dst, o, nb)
    elif qtype == _Q4_0:
        dequantize_row_q4_0(src, p, dst, o, nb)
    elif qtype == _Q4_1:
        dequantize_row_q4_1(src, p, dst, o, nb)
    elif qtype == _Q5_1:
        dequantize_row_q5_1(src, p, dst, o, nb)
    elif qtype == _Q5_K:
        dequantize_row_q5_K(src, p, dst, o, nb)
    elif qtype == _Q3_K:
        dequantize_row_q3_K(src, p, dst, o, nb)
    elif qtype == _Q2_K:
        dequantize_row_q2_K(src, p, dst, o, nb)
    elif qtype == _BF16:
        dequantize_row_bf16(src, p, dst, o, nb)
    elif qtype == _IQ4_NL:
        dequantize_row_iq4_nl(src, p, dst, o, nb)
    elif qtype == _IQ4_XS:
        dequantize_row_iq4_xs(src, p, dst, o, nb)
    elif qtype == _MXFP4:
        dequantize_row_mxfp4(src, p, dst, o, nb)
