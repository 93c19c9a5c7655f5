"""Integer tile products of the K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_XS interleaved 16 rows at a time,
against activations quantized to Q8_K, written as LLVM vector IR around AVX-512 VNNI's vpdpbusd (as ggml's
ggml_vec_dot_q4_K_q8_K and its kin compute them, and its block_q4_Kx8 repacked kernels).

A block holds 256 values of a row in sub-blocks (8 of 32 for Q4_K, Q5_K and IQ4_XS, 16 of 16 for Q2_K, Q3_K and
Q6_K), each with its own integer scale (Q2_K: 4 bits; Q3_K, IQ4_XS: 6 bits minus 32; Q4_K, Q5_K: 6 bits; Q6_K:
8 bits signed) and for Q2_K, Q4_K and Q5_K an integer minimum. As in ggml, every sum stays an integer up to the
block: per sub-block, vpdpbusd adds the products of the row's unsigned quants (Q2_K's 2 bits, Q3_K's 3, Q4_K's
nibbles, Q5_K's 5 bits, Q6_K's 6, IQ4_XS's code book values + 128, looked up by vpshufb) and the token's int8
values; the sub-block's sum times its scale (vpmulld) goes into the block's int32 sum; the minimums' term
Σ m_j·(Σ of the token's values in sub-block j) comes from Q8_K's sums of 16 values (bsums), and a zero point z
(Q3_K 4, Q6_K 32, IQ4_XS 128) as -z·bsum starts each sub-block's sum. The block then adds float(sum)·d·dx
(- float(mins)·dmin·dx) to the row's float32 sum, dx being the token's Q8_K scale: ggml's arithmetic, in another
float order.

Layout (jit/repack.py, same bytes as the file's): per 16-row group and block, each 2-byte field for the 16 rows
in turn, then the other fields as vectors of 64 bytes (vector j: bytes 4j .. 4j+3 of each row, so an int32 lane
is one row), in K_FORMATS' order: Q2_K: d, dmin, scales (4 vectors), qs (16); Q3_K: d, scales (3), hmask (8),
qs (16); Q4_K: d, dmin, scales (3), qs (32); Q5_K: d, dmin, scales, qh (8), qs (32); Q6_K: d, scales (4), then ql
and qh in pieces of 4 vectors in the order they are read (Q6_K_QUANTS); IQ4_XS: d, scales_h, scales_l (1), qs (32).

`tile_<type>` is an intrinsic (w, g, nb, xq, xd, xb, n, y, yo, ys): for the group whose blocks start at byte g
of w and tokens 0 .. n-1, y[yo + t·ys + r] = Σ over the nb blocks of row r, four tokens at a time, then one.
xq: the tokens' Q8_K quants (int8 as uint8, nb·256 a token), xd: their scales (float32, nb a token), xb: each
block's Q8K_WORDS int32 words (the sums of each 16 quants and the others below; nb·Q8K_WORDS a token). All arrays
C-contiguous. In a tile of several tokens, Q4_K's and Q6_K's sub-blocks go in pieces whose sums fit an int16,
each multiplied by its scale with one vpdpwssds (_add_sub_block); the integers are the same.

Where this says 16 rows and 64-byte vectors, a CPU with AVX2 alone has groups of 8 rows and vectors of 32 bytes
(vnni_ir.ROWS, VECTOR_BYTES; ir/int8_ir.py).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backend.cpu.jit.ir.block_ir import F32, I32, I64, splat
from pyggml.backend.cpu.jit.ir.int8_ir import AVX2, VI16, both_halves, dpwssd, int8_instructions
from pyggml.backend.cpu.jit.ir.vnni_ir import (ROWS, TOKENS, VECTOR_BYTES, VF16, VF32, VI32, VI8, code_book_values,
                                               load_at, prefetch_ahead, token_products, typed)
from pyggml.core.types import GGMLType

Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS = (int(t) for t in (GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
                                                       GGMLType.Q6_K, GGMLType.IQ4_XS))

# Q6_K's quants in the order the products read them, 16 bytes of a row at a time: for each half h of the block
# and half of each 32-value run, ql's bytes of runs g = 0, 2 (their low and high nibbles), then g = 1, 3, then
# qh's (all four runs' high bits): 768 contiguous bytes serve four sub-blocks, and a block is read front to back.
# In the file's order (all ql, then all qh) the products read from three places at once and ran at a third of
# the speed from memory (one thread, 7.5 against 25 GB/s), though as fast from cache.
Q6_K_QUANTS = tuple(piece for h in range(2) for half in range(2) for piece in (
    (64 * h + 16 * half, 16), (64 * h + 32 + 16 * half, 16), (128 + 32 * h + 16 * half, 16)))

# per type: block bytes, its fields in the interleaved order as (offset in the file's block, bytes), fp16 d first
K_FORMATS = {Q2_K: (84, ((80, 2), (82, 2), (0, 16), (16, 64))),
             Q3_K: (110, ((108, 2), (96, 12), (0, 32), (32, 64))),
             Q4_K: (144, ((0, 2), (2, 2), (4, 12), (16, 128))),
             Q5_K: (176, ((0, 2), (2, 2), (4, 12), (16, 32), (48, 128))),
             Q6_K: (210, ((208, 2), (192, 16), *Q6_K_QUANTS)),
             IQ4_XS: (136, ((0, 2), (2, 2), (4, 4), (8, 128)))}
# The int32 words of a token's Q8_K block beside its quants (jit/repack.py writes them): the 16 sums of 16 quants
# (ggml's bsums), the 8 sums of 32 as four pairs of int16 (sub-blocks 2i and 2i+1, what vpdpwssd multiplies Q4_K's
# pairs of scales and of minimums with), -8 times each sum of 32 and -32 times each sum of 8 (where Q4_K's and
# Q6_K's pieces of products start, see _sums), the sums of 16 as eight pairs of int16 (Q6_K on the tile unit).
SUMS_OF_16, PAIRS_OF_32, MINUS_8_SUMS_OF_32, MINUS_32_SUMS_OF_8, PAIRS_OF_16, Q8K_WORDS = 0, 16, 20, 28, 60, 68
NARROW = {Q4_K: (32, MINUS_8_SUMS_OF_32), Q6_K: (8, MINUS_32_SUMS_OF_8)}  # values a piece, where its start is
DMIN = {Q2_K: 82, Q4_K: 2, Q5_K: 2}          # where the fp16 scale of the minimums is
LARGEST = {Q2_K: 3, Q3_K: 7, Q4_K: 15, Q5_K: 31, Q6_K: 63, IQ4_XS: 255}  # the largest unsigned quant byte
ZERO_POINT = {Q3_K: 4, Q6_K: 32, IQ4_XS: 128}  # unsigned quants minus this are the values: -zero·Σq starts a sum
# With AVX2 a sub-block's products are int16 sums before they become int32, and the vpmaddwd that widens them
# multiplies them by the sub-block's scale too (int8_ir.dot_products); the zero points' and minimums' terms are then
# made once a block by vpmaddwd on int16 pairs (_pairs_term). AMD Zen 3, one thread, 2048 columns from cache, best
# of three alternating runs, one token / 64 tokens: Q4_K 88 -> 93 / 118 -> 137 GOPS, Q6_K 60 -> 64 / 82 -> 111,
# Q5_K 54 -> 60 / 104 -> 113, Q3_K 83 -> 94 for 64 tokens (a token alone keeps the vpmulld: its scales take six
# operations each, and made twice, for the pairs and the multipliers, they cost it 55 -> 48), Q2_K and IQ4_XS level.
SCALED_SUMS = int8_instructions() == AVX2
# On AVX2 a tile of several tokens takes a K-quant block's sub-blocks in a loop of ROUNDS rounds (KLayout.round):
# unrolled over a whole block, LLVM's scheduler made the quant vectors of many sub-blocks ahead of their products
# and parked them on the stack (a Q4_K block of four tokens: 1404 instructions, 343 of them to and from the stack;
# Q6_K's 1859 and 456). A round's few vectors stay in registers. AMD Zen 3, 2048 x 2048 from cache, 64 tokens, both
# kernels compiled in one process and alternating, medians of the pairs' time ratios: Q4_K 1.34-1.67x (1 thread)
# and 1.64x (2 threads), Q6_K 1.61-1.65x and 1.60x; with the test suite running beside (load 1.9-4.3, 1 thread)
# Q5_K 1.39x, Q2_K 1.67x, Q3_K 1.73x, IQ4_XS 1.27x. The same sums to the bit. A token alone gained nothing from the
# loop (Q6_K 0.96-1.00x) and keeps the unrolled block. Q6_K goes in eight rounds of two sub-blocks: its rounds of
# four made 16 quant vectors from 12 loads and still spilled (41 of a round's 366 instructions to and from the
# stack, against 8 of 205 in a round of two); alternating as above, 64 and 128 tokens: 1.05-1.11x (1 thread),
# 1.08-1.10x (2 threads, 2048 x 8192).
ROUNDS = {Q6_K: 8}   # the rounds of a block where not 4


def _i32(builder, value: int):
    return splat(builder, ir.Constant(I32, value), VI32)


def _i8(value: int):
    return ir.Constant(VI8, [value] * 4 * ROWS)


def _bits(builder, word, shift: int, mask: int):
    """(word >> shift) & mask in each int32 lane."""
    return builder.and_(builder.lshr(word, _i32(builder, shift)) if shift else word, _i32(builder, mask))


def _scales_mins_k4(builder, words):
    """Q4_K's and Q5_K's eight 6-bit scales and minimums of each row (ggml's get_scale_min_k4) from the row's 12
    scale bytes as three int32 lanes w0, w1, w2: ([8 x <16 x i32>], [8 x <16 x i32>])."""
    w0, w1, w2 = words
    scales = [_bits(builder, w0, 8 * j, 63) for j in range(4)]
    mins = [_bits(builder, w1, 8 * j, 63) for j in range(4)]
    for j in range(4):
        high_s = builder.shl(_bits(builder, w0, 8 * j + 6, 3), _i32(builder, 4))
        high_m = builder.shl(_bits(builder, w1, 8 * j + 6, 3), _i32(builder, 4))
        scales.append(builder.or_(_bits(builder, w2, 8 * j, 15), high_s))
        mins.append(builder.or_(_bits(builder, w2, 8 * j + 4, 15), high_m))
    return scales, mins


def _q6_k_scale(builder, words, k: int):
    """Q6_K's signed scale k of each row, from its scale bytes as four int32 lanes (KLayout.q6_k_scale_words)."""
    return builder.ashr(builder.shl(words[k // 4], _i32(builder, 24 - 8 * (k % 4))), _i32(builder, 24))


def _lane_bytes(builder, vector, picks):
    """Each int32 lane of vector rebuilt from its own bytes by one byte shuffle (vpshufb): byte i of the lane
    becomes its byte picks[i], or zero where picks[i] is None."""
    size = 4 * ROWS
    order = [size if pick is None else 4 * r + pick for r in range(ROWS) for pick in picks]  # `size`: a zero byte
    moved = builder.shuffle_vector(builder.bitcast(vector, VI8), ir.Constant(VI8, [0] * size),
                                   ir.Constant(ir.VectorType(I32, size), order))
    return builder.bitcast(moved, VI32)


def _q6_k_scale_bytes(builder, words, low: int, high: int):
    """Q6_K's signed scales `low` and `high` (of one word) of each row as the int16 halves of its lane: each byte
    put in the high byte of its half (_lane_bytes), then shifted down with its sign (vpsraw)."""
    moved = _lane_bytes(builder, words[low // 4], (None, low % 4, None, high % 4))
    return builder.bitcast(builder.ashr(builder.bitcast(moved, VI16), ir.Constant(VI16, [8] * 2 * ROWS)), VI32)


def _byte_pair(builder, vector, low: int, high: int, mask: int):
    """(byte `low` & mask) | (byte `high` & mask) << 16 of each int32 lane of vector: both bytes moved into the
    low bytes of the lane's int16 halves (_lane_bytes), then masked."""
    return builder.and_(_lane_bytes(builder, vector, (low, None, high, None)), _i32(builder, mask | mask << 16))


def _k4_scale(builder, words, j: int):
    """Q4_K's scale j of each row in both int16 halves of its lane (what int8_ir.dot_products multiplies by), from
    its 12 scale bytes as three int32 lanes (ggml's get_scale_min_k4) by byte shuffles (vpshufb), where the shifts
    and masks of _scales_mins_k4 and both_halves took about 75 instructions a block with the minimums
    (_k4_min_pairs). The same bits; AMD Zen 3, alternating with those in one process (30 pairs, twice): a prompt's
    64-token tile 1.04x, a token alone 1.05-1.07x from the L3 and 1.01x from memory. Q5_K's, the same way, gained
    nothing."""
    w0, _, w2 = words
    if j < 4:
        return _byte_pair(builder, w0, j, j, 63)
    high = builder.lshr(_byte_pair(builder, w0, j - 4, j - 4, 0xC0), _i32(builder, 2))
    return builder.or_(_byte_pair(builder, w2, j - 4, j - 4, 15), high)


def _k4_min_pairs(builder, words):
    """Q4_K's eight minimums of each row as int16 pairs (2i, 2i+1) (_pairs_term), by byte shuffles (_k4_scale)."""
    _, w1, w2 = words
    pairs = [_byte_pair(builder, w1, 2 * i, 2 * i + 1, 63) for i in range(2)]
    return pairs + [builder.or_(builder.lshr(_byte_pair(builder, w2, 2 * i, 2 * i + 1, 0xF0), _i32(builder, 4)),
                                builder.lshr(_byte_pair(builder, w1, 2 * i, 2 * i + 1, 0xC0), _i32(builder, 2)))
                    for i in range(2)]


def _plus(builder, value, constant: int):
    return builder.add(value, ir.Constant(I64, constant))


def _times(builder, value, constant: int):
    return builder.mul(value, ir.Constant(I64, constant))


def _halve(builder, value):
    """(value // 2, value % 2) of a non-negative i64 value: a round's place in a block's pieces."""
    return builder.lshr(value, ir.Constant(I64, 1)), builder.and_(value, ir.Constant(I64, 1))


def _shift_bytes(builder, v, by: int):
    """Each byte of v shifted left by `by` (right for a negative one)."""
    return builder.shl(v, _i8(by)) if by > 0 else builder.lshr(v, _i8(-by)) if by < 0 else v


class KLayout:
    """Where a type's fields lie in a 16-row group block (from K_FORMATS), and how its sub-blocks' unsigned
    quant vectors are made: `sub_blocks()` gives, per sub-block, [(vector, index of the first of the four
    values each lane holds)] and its scale vector, and the minimums (one per sub-block) where the type has them;
    `size` values a sub-block, `zero` the quants' zero point. The sub-blocks come lazily, each one's IR emitted
    as the caller takes it: built all before the products, Q6_K's 64 quant vectors outlived the 32 vector
    registers and went through the stack (its product 1.36x slower from cache)."""

    def __init__(self, qtype: int):
        block_bytes, fields = K_FORMATS[qtype]
        self.qtype, self.group_block = qtype, ROWS * block_bytes
        self.d_at, self.dmin_at, self.zero = fields[0][0], DMIN.get(qtype), ZERO_POINT.get(qtype, 0)
        self.size = 32 if qtype in (Q4_K, Q5_K, IQ4_XS) else 16
        self.largest, self.rounds = LARGEST[qtype], ROUNDS.get(qtype, 4)
        self.at, at = {}, 0
        for offset, size in fields:
            self.at[offset], at = at, at + ROWS * size

    def vector(self, builder, data, block, field: int, j: int, vtype=VI8):
        """Vector j of a field (by its offset in the file's block)."""
        return load_at(builder, data, builder.add(block, ir.Constant(I64, self.at[field] + VECTOR_BYTES * j)), vtype)

    def header(self, builder, data, block, field: int):
        """An fp16 field of the 16 rows as <16 x float>."""
        return builder.fpext(load_at(builder, data, builder.add(block, ir.Constant(I64, self.at[field])), VF16), VF32)

    def sub_blocks(self, builder, data, block):
        """(an iterator of (sub-block, quants [(vector, first value)], scale <16 x i32>), in the order that keeps
        the fewest loaded vectors live, mins [<16 x i32> per sub-block] or None). Q6_K's scale comes in both int16
        halves of its lane where SCALED_SUMS (int8_ir.both_halves)."""
        return {Q2_K: self._q2_k, Q3_K: self._q3_k, Q6_K: self._q6_k, IQ4_XS: self._iq4_xs}.get(
            self.qtype, self._q4_k_q5_k)(builder, data, block)

    def scale_pairs(self, builder, data, block):
        """The sub-blocks' scales as int16 pairs (2i, 2i+1) of each row (_pairs_term): Q6_K's from their bytes."""
        if self.qtype == Q6_K:
            words = self.q6_k_scale_words(builder, data, block)
            return [_q6_k_scale_bytes(builder, words, k, k + 1) for k in range(0, 16, 2)]
        return _int16_pairs(builder, self._ordered_scales(builder, data, block)[0], signed=True)

    def multipliers(self, builder, data, block):
        """Each sub-block's scale in both int16 halves of its lanes (what int8_ir.dot_products multiplies by), in
        sub-block order (multiplier), and the minimums as sub_blocks gives them (or None): what _rounds multiplies
        by."""
        scales, mins = self._ordered_scales(builder, data, block)
        return [self.multiplier(builder, data, block, j, scale) for j, scale in enumerate(scales)], mins

    def multiplier(self, builder, data, block, j: int, scale):
        """Sub-block j's scale in both int16 halves of its lanes: Q6_K's straight from its byte, Q4_K's by byte
        shuffles (_k4_scale), the others' from `scale`, the int32 lanes sub_blocks gave."""
        if self.qtype == Q6_K:
            return _q6_k_scale_bytes(builder, self.q6_k_scale_words(builder, data, block), j, j)
        if self.qtype == Q4_K:
            return _k4_scale(builder, self.k4_words(builder, data, block), j)
        return both_halves(builder, scale)

    def min_pairs(self, builder, data, block, mins):
        """The minimums as int16 pairs (2i, 2i+1) (_pairs_term): Q4_K's by byte shuffles, the others' from `mins`,
        the int32 lanes sub_blocks gave (None: the type has none)."""
        if self.qtype == Q4_K:
            return _k4_min_pairs(builder, self.k4_words(builder, data, block))
        return None if mins is None else _int16_pairs(builder, mins)

    def k4_words(self, builder, data, block):
        """Q4_K's and Q5_K's 12 scale bytes of each row as three <16 x i32> (w0, w1, w2)."""
        return [self.vector(builder, data, block, 4, j, VI32) for j in range(3)]

    def _ordered_scales(self, builder, data, block):
        """([each sub-block's scale, in sub-block order], the minimums or None), taken from sub_blocks (the quants it
        would make go unused, and LLVM drops them)."""
        subs, mins = self.sub_blocks(builder, data, block)
        scales = dict((j, scale) for j, _, scale in subs)
        return [scales[j] for j in range(len(scales))], mins

    def round(self, builder, data, block, r):
        """The sub-blocks of round r (an i64 value, 0 .. self.rounds - 1): [(sub-block index as i64,
        [(quant vector, first value as i64)])], each type's a quarter of its block, Q6_K's an eighth (see the _round_
        methods)."""
        return {Q4_K: self._round_k4, Q5_K: self._round_k4, Q6_K: self._round_q6_k, Q2_K: self._round_two_bits,
                Q3_K: self._round_two_bits, IQ4_XS: self._round_iq4_xs}[self.qtype](builder, data, block, r)

    def _round_k4(self, builder, data, block, r):
        """Q4_K and Q5_K: sub-blocks 2r (low nibbles) and 2r + 1 (high) of one chunk of 8 vectors, Q5_K's fifth
        bits (bits 2r and 2r + 1 of qh, moved down once as int16 lanes) put back."""
        base = builder.add(block, _plus(builder, _times(builder, r, 8 * VECTOR_BYTES),
                                        self.at[16 if self.qtype == Q4_K else 48]))
        packed = [load_at(builder, data, _plus(builder, base, VECTOR_BYTES * m), VI8) for m in range(8)]
        nibbles = [[builder.lshr(v, _i8(4)) if high else builder.and_(v, _i8(15)) for v in packed] for high in (0, 1)]
        if self.qtype == Q5_K:
            bits = _lanes_down(builder, data, _plus(builder, block, self.at[16]), 8, _times(builder, r, 2))
            nibbles = [[builder.or_(v, builder.and_(_shift_bytes(builder, b, 4 - high), _i8(16)))
                        for v, b in zip(vectors, bits, strict=True)] for high, vectors in enumerate(nibbles)]
        first = _times(builder, r, 64)
        return [(_plus(builder, _times(builder, r, 2), high),
                 [(v, _plus(builder, first, 32 * high + 4 * m)) for m, v in enumerate(vectors)])
                for high, vectors in enumerate(nibbles)]

    def _round_q6_k(self, builder, data, block, r):
        """Q6_K: sub-blocks 8h + 2g + half for g = odd and odd + 2 (odd = r % 2) of piece (h, half) = (r // 4,
        r // 2 % 2) of Q6_K_QUANTS: one set of 4 ql vectors (of g = 0, 2 or of g = 1, 3: low nibbles for g < 2,
        high ones for g >= 2) and the piece's 4 qh vectors, moved down by 2·odd bits once as int16 lanes (bits
        2g and 2g + 1 then at 0 and 1, or at 4 and 5 for g >= 2; what comes in from the byte above is masked off)."""
        piece, odd = _halve(builder, r)
        h, half = _halve(builder, piece)
        base = builder.add(block, _plus(builder, _times(builder, piece, 12 * VECTOR_BYTES),
                                        self.at[Q6_K_QUANTS[0][0]]))
        ql_at = builder.add(base, _times(builder, odd, 4 * VECTOR_BYTES))
        high_bits = _lanes_down(builder, data, _plus(builder, base, 8 * VECTOR_BYTES), 4, _times(builder, odd, 2))
        first = builder.add(_times(builder, h, 128), _times(builder, half, 16))
        sub_blocks = []
        for upper in (0, 1):                    # g = odd, then odd + 2
            g = _plus(builder, odd, 2 * upper)
            run = builder.add(first, _times(builder, g, 32))          # the first value of run g
            quants = []
            for m in range(4):
                ql = load_at(builder, data, _plus(builder, ql_at, VECTOR_BYTES * m), VI8)
                low = builder.lshr(ql, _i8(4)) if upper else builder.and_(ql, _i8(15))
                high = builder.and_(_shift_bytes(builder, high_bits[m], 4 - 4 * upper), _i8(0x30))
                quants.append((builder.or_(low, high), _plus(builder, run, 4 * m)))
            sub_blocks.append((builder.add(_times(builder, h, 8), builder.add(half, _times(builder, g, 2))), quants))
        return sub_blocks

    def _round_two_bits(self, builder, data, block, r):
        """Q2_K and Q3_K: the four sub-blocks 8n + 2j + h (j = 0 .. 3) of (n, h) = (r // 2, r % 2), whose 2-bit
        quants lie in qs vectors 4r .. 4r + 3 (see _two_bits); Q3_K's third bits (bits 4n + j of hmask vectors
        4h .. 4h + 3, moved down by 4n once as int16 lanes) put back."""
        n, h = _halve(builder, r)
        qs_at = self.at[K_FORMATS[self.qtype][1][-1][0]]
        qs = builder.add(block, _plus(builder, _times(builder, r, 4 * VECTOR_BYTES), qs_at))
        packed = [load_at(builder, data, _plus(builder, qs, VECTOR_BYTES * a), VI8) for a in range(4)]
        if self.qtype == Q3_K:
            hmask = builder.add(block, _times(builder, h, 4 * VECTOR_BYTES))
            bits = _lanes_down(builder, data, _plus(builder, hmask, self.at[0]), 4, _times(builder, n, 4))
        first = builder.add(_times(builder, n, 128), _times(builder, h, 16))
        sub_blocks = []
        for j in range(4):
            quants = []
            for a, v in enumerate(packed):
                q = _bits8(builder, v, 2 * j, 3)
                if self.qtype == Q3_K:
                    q = builder.or_(q, _shift_bytes(builder, builder.and_(bits[a], _i8(1 << j)), 2 - j))
                quants.append((q, _plus(builder, first, 32 * j + 4 * a)))
            sub_blocks.append((builder.add(_times(builder, n, 8), _plus(builder, h, 2 * j)), quants))
        return sub_blocks

    def _round_iq4_xs(self, builder, data, block, r):
        """IQ4_XS: sub-blocks 2r and 2r + 1, four vectors each (their low and high nibbles looked up in the code
        book, see _iq4_xs_sub_block)."""
        base = builder.add(block, _plus(builder, _times(builder, r, 8 * VECTOR_BYTES), self.at[8]))
        first = _times(builder, r, 64)
        sub_blocks = []
        for half in (0, 1):
            quants = []
            for a in range(4):
                packed = load_at(builder, data, _plus(builder, base, VECTOR_BYTES * (4 * half + a)), VI8)
                quants += [(code_book_values(builder, builder.and_(packed, _i8(15))),
                            _plus(builder, first, 32 * half + 4 * a)),
                           (code_book_values(builder, builder.lshr(packed, _i8(4))),
                            _plus(builder, first, 32 * half + 16 + 4 * a))]
            sub_blocks.append((_plus(builder, _times(builder, r, 2), half), quants))
        return sub_blocks

    def scales_mins_k4(self, builder, data, block):
        """Q4_K's and Q5_K's 8 scales and 8 minimums of the 16 rows (_scales_mins_k4 on their 12 scale bytes)."""
        return _scales_mins_k4(builder, self.k4_words(builder, data, block))

    def q6_k_scale_words(self, builder, data, block):
        """Q6_K's 16 signed scale bytes of the 16 rows as four <16 x i32> (read one by one with _q6_k_scale)."""
        return [self.vector(builder, data, block, 192, j, VI32) for j in range(4)]

    def _q4_k_q5_k(self, builder, data, block):
        scales, mins = self.scales_mins_k4(builder, data, block)
        return ((j, self._q4_k_q5_k_quants(builder, data, block, j), scales[j]) for j in range(8)), mins

    def _q4_k_q5_k_quants(self, builder, data, block, j: int):
        """Sub-block j: chunk j // 2's low (j even) or high nibbles, Q5_K's fifth bits put back."""
        quants = []
        for m in range(8):
            packed = self.vector(builder, data, block, 16 if self.qtype == Q4_K else 48, 8 * (j // 2) + m)
            nibble = builder.lshr(packed, _i8(4)) if j % 2 else builder.and_(packed, _i8(15))
            if self.qtype == Q5_K:          # bit j of the row's qh byte l is value 32j + l's fifth bit
                high = builder.and_(self.vector(builder, data, block, 16, m), _i8(1 << j))
                nibble = builder.or_(nibble, _shift_bytes(builder, high, 4 - j))
            quants.append((nibble, 32 * j + 4 * m))
        return quants

    def _q6_k(self, builder, data, block):
        """Q6_K's 16 sub-blocks of 16: value 128h + 32g + l (l < 32) has its low 4 bits in ql byte 64h + 32(g % 2)
        + l (low nibble for g < 2, high for g >= 2) and its high 2 bits at bit 2g of qh byte 32h + l; scales are
        signed bytes."""
        words = self.q6_k_scale_words(builder, data, block)
        order = [8 * h + 2 * g + half for h in range(2) for half in range(2) for g in range(4)]  # g = 0 .. 3 in a row
        return ((k, *self._q6_k_sub_block(builder, data, block, words, k)) for k in order), None

    def _q6_k_sub_block(self, builder, data, block, words, k: int):
        h, g, half = k // 8, (k % 8) // 2, k % 2
        scale = _q6_k_scale_bytes(builder, words, k, k) if SCALED_SUMS else _q6_k_scale(builder, words, k)
        quants = []
        for m in range(4):
            ql = self.vector(builder, data, block, 64 * h + 32 * (g % 2) + 16 * half, m)
            low = builder.lshr(ql, _i8(4)) if g >= 2 else builder.and_(ql, _i8(15))
            qh = _shift_bytes(builder, self.vector(builder, data, block, 128 + 32 * h + 16 * half, m), 4 - 2 * g)
            quants.append((builder.or_(low, builder.and_(qh, _i8(0x30))), 128 * h + 32 * g + 16 * half + 4 * m))
        return quants, scale

    def _two_bits(self, builder, data, block, k: int):
        """Q2_K's and Q3_K's sub-block k (16 values): value 128n + 32j + 16h + l takes bits 2j of qs byte 32n + 16h
        + l (k = 8n + 2j + h): [(2-bit quants, first value)] of its four vectors."""
        n, j, h = k // 8, (k % 8) // 2, k % 2
        qs = K_FORMATS[self.qtype][1][-1][0]
        return [(_bits8(builder, self.vector(builder, data, block, qs, 8 * n + 4 * h + a), 2 * j, 3),
                 128 * n + 32 * j + 16 * h + 4 * a) for a in range(4)]

    def _q2_k(self, builder, data, block):
        """Q2_K: 16 sub-blocks of 16, a scale byte each (low 4 bits the scale, high 4 the minimum)."""
        words = [self.vector(builder, data, block, 0, j, VI32) for j in range(4)]
        mins = [_bits(builder, words[k // 4], 8 * (k % 4) + 4, 15) for k in range(16)]
        return ((k, self._two_bits(builder, data, block, k), _bits(builder, words[k // 4], 8 * (k % 4), 15))
                for k in range(16)), mins

    def _q3_k(self, builder, data, block):
        """Q3_K: 16 sub-blocks of 16; value k's third bit is bit k // 32 of hmask byte k % 32 (its quant then is the
        2 low bits + 4·bit, zero point 4); 6-bit scales minus 32, their low 4 bits in byte k % 8 of the 12 scale
        bytes (high nibble from k = 8), the top 2 at bit 2(k // 4) of byte 8 + k % 4 (ggml's kmask shuffle)."""
        words = [self.vector(builder, data, block, 96, j, VI32) for j in range(3)]
        return ((k, *self._q3_k_sub_block(builder, data, block, words, k)) for k in range(16)), None

    def _q3_k_sub_block(self, builder, data, block, words, k: int):
        n, j, h = k // 8, (k % 8) // 2, k % 2
        bit = 4 * n + j
        quants = []
        for a, (low, first) in enumerate(self._two_bits(builder, data, block, k)):
            high = builder.and_(self.vector(builder, data, block, 0, 4 * h + a), _i8(1 << bit))
            quants.append((builder.or_(low, _shift_bytes(builder, high, 2 - bit)), first))
        word, byte = words[(k % 8) // 4], k % 4
        scale = builder.or_(_bits(builder, word, 8 * byte + 4 * (k // 8), 15),
                            builder.shl(_bits(builder, words[2], 8 * byte + 2 * (k // 4), 3), _i32(builder, 4)))
        return quants, builder.sub(scale, _i32(builder, 32))

    def _iq4_xs(self, builder, data, block):
        """IQ4_XS: 8 sub-blocks of 32 (like IQ4_NL's blocks: value l < 16 the low nibble of byte l, l + 16 the high
        one), the code book looked up as unsigned bytes + 128; 6-bit scales minus 32, their low 4 bits at bit 4k
        of scales_l, the top 2 at bit 2k of scales_h."""
        low_bits = self.vector(builder, data, block, 4, 0, VI32)
        high_bits = builder.zext(load_at(builder, data, builder.add(block, ir.Constant(I64, self.at[2])),
                                         ir.VectorType(ir.IntType(16), ROWS)), VI32)
        return ((k, *self._iq4_xs_sub_block(builder, data, block, low_bits, high_bits, k)) for k in range(8)), None

    def _iq4_xs_sub_block(self, builder, data, block, low_bits, high_bits, k: int):
        quants = []
        for a in range(4):
            packed = self.vector(builder, data, block, 8, 4 * k + a)
            quants += [(code_book_values(builder, builder.and_(packed, _i8(15))), 32 * k + 4 * a),
                       (code_book_values(builder, builder.lshr(packed, _i8(4))), 32 * k + 16 + 4 * a)]
        scale = builder.or_(_bits(builder, low_bits, 4 * k, 15),
                            builder.shl(_bits(builder, high_bits, 2 * k, 3), _i32(builder, 4)))
        return quants, builder.sub(scale, _i32(builder, 32))


def _lanes_down(builder, data, at, count: int, by):
    """The count vectors from byte `at` (an i64 value) on, shifted down by `by` (an i64 value) bits as int16
    lanes, as bytes: the bits of a runtime-chosen sub-block at the bottom of each byte (the bits that come in
    from the byte above are masked off by the caller)."""
    down = splat(builder, builder.trunc(by, VI16.element), VI16)
    return [builder.bitcast(builder.lshr(load_at(builder, data, _plus(builder, at, VECTOR_BYTES * m), VI16), down),
                            VI8) for m in range(count)]


def _bits8(builder, v, shift: int, mask: int):
    """(v >> shift) & mask in each byte."""
    return builder.and_(builder.lshr(v, _i8(shift)) if shift else v, _i8(mask))


def _tile(qtype: int):
    layout = KLayout(qtype)

    def typer(typingctx, w, g, nb, xq, xd, xb, n, y, yo, ys):
        arrays = ((w, types.uint8), (xq, types.uint8), (xd, types.float32), (xb, types.int32), (y, types.float32))
        if not typed(arrays, (g, nb, n, yo, ys)):
            return None

        def codegen(context, builder, signature, args):
            data = {i: context.make_array(signature.args[i])(context, builder, args[i]).data for i in (0, 3, 4, 5, 7)}
            g_, nb_, n_, yo_, ys_ = (context.cast(builder, args[i], signature.args[i], types.uintp)
                                     for i in (1, 2, 6, 8, 9))
            full = builder.mul(builder.udiv(n_, ir.Constant(I64, TOKENS)), ir.Constant(I64, TOKENS))
            with cgutils.for_range_slice(builder, ir.Constant(I64, 0), full, ir.Constant(I64, TOKENS)) as (t0, _):
                _tokens(builder, layout, data, g_, nb_, t0, TOKENS, yo_, ys_)
            with cgutils.for_range_slice(builder, full, n_, ir.Constant(I64, 1)) as (t0, _):
                _tokens(builder, layout, data, g_, nb_, t0, 1, yo_, ys_)
            return context.get_dummy_value()

        return types.none(w, g, nb, xq, xd, xb, n, y, yo, ys), codegen

    return intrinsic(typer)


def _int16_pairs(builder, lanes, signed: bool = False):
    """Lanes 2i and 2i+1 of a list of <16 x i32> holding values below 2^15 (and above -2^15 where `signed`), as
    one vector of int16 pairs each."""
    low = (lambda v: builder.and_(v, _i32(builder, 0xFFFF))) if signed else (lambda v: v)
    return [builder.or_(low(lanes[i]), builder.shl(lanes[i + 1], _i32(builder, 16))) for i in range(0, len(lanes), 2)]


class _Tokens:
    """A tile's tokens at one block: their Q8_K quants (from element q0s[t] of xq) and words (from words[t] of xb)."""

    def __init__(self, builder, data, q0s, words):
        self.builder, self.data, self.q0s, self.words = builder, data, q0s, words

    def word(self, t: int, i: int):
        return load_at(self.builder, self.data[5], self.builder.add(self.words[t], ir.Constant(I64, i)), I32, 4)

    def splat_word(self, t: int, i: int):
        return splat(self.builder, self.word(t, i), VI32)

    def bsum(self, t: int, j: int, size: int):
        """Token t's quants summed over sub-block j of `size` values (Q8_K's sums of 16)."""
        sums = [self.word(t, SUMS_OF_16 + i) for i in range(size // 16 * j, size // 16 * (j + 1))]
        return sums[0] if len(sums) == 1 else self.builder.add(*sums)

    def products(self, t: int, s, quants, largest: int, multiplier=None):
        """s + token t's products with the quant vectors [(vector, first value)] by vpdpbusd (`largest`: the
        largest quant byte; `multiplier`: AVX2's scale pairs; int8_ir.dot_products)."""
        return token_products(self.builder, s, quants, self.data[3], self.q0s[t], largest, multiplier)


def _add_sub_block(builder, layout: KLayout, narrow, tokens: _Tokens, t: int, j: int, quants, scale, total):
    """total + scale·s, s token t's products with sub-block j started at -z·bsum_j (zero point z).

    For the types in NARROW the products go in pieces small enough that each piece's sum, started at -bias·(the
    token's quants summed over the piece), fits an int16 (Q4_K: 32 values of nibble - 8, at most 32·8·127; Q6_K: 8
    values of q - 32): then one vpdpwssd against the scale (its lo16, hi16 0) multiplies the piece and adds it to
    the total, where vpmulld and an add took three instructions. Q4_K's bias, not a zero point, is put back by
    _minimums_term. `narrow`: the type's NARROW entry, or None for the other way."""
    if narrow is None:
        start = (splat(builder, builder.mul(tokens.bsum(t, j, layout.size), ir.Constant(I32, -layout.zero)), VI32)
                 if layout.zero else _i32(builder, 0))
        return builder.add(total, builder.mul(tokens.products(t, start, quants, layout.largest), scale))
    values, at = narrow
    low16 = builder.and_(scale, _i32(builder, 0xFFFF))
    for i in range(0, len(quants), values // 4):
        piece = quants[i:i + values // 4]
        total = dpwssd(builder, total, tokens.products(t, tokens.splat_word(t, at + piece[0][1] // values), piece,
                                                        layout.largest),
                       low16)
    return total


def q4_k_pairs(builder, scales, mins):
    """Q4_K's scales times 8 and its minimums as int16 pairs (sub-blocks 2i and 2i+1): what the token's sums of 32,
    as int16 pairs too, put its pieces' bias back and make its minimums' term with (add_q4_k_pairs)."""
    return [builder.shl(p, _i32(builder, 3)) for p in _int16_pairs(builder, scales)], _int16_pairs(builder, mins)


def pairs_dot(builder, acc, pairs, word):
    """acc + Σ_i pairs[i]·word(i) by vpdpwssd: int16 pairs of values of sub-blocks 2i and 2i+1 against word(i), the
    token's sums over those sub-blocks as a pair, in every lane."""
    for i, pair in enumerate(pairs):
        acc = dpwssd(builder, acc, pair, word(i))
    return acc


def add_q4_k_pairs(builder, pairs, total, word):
    """(total + 8·Σ_j sc_j·bsum_j, Σ_j m_j·bsum_j) for one token: pairs from q4_k_pairs, word(i) the token's sums
    of 32 pair i in every lane (pairs_dot)."""
    scale_pairs, min_pairs = pairs
    return pairs_dot(builder, total, scale_pairs, word), pairs_dot(builder, _i32(builder, 0), min_pairs, word)


def _minimums_term(builder, layout: KLayout, narrow, tokens: _Tokens, t: int, scales, mins, total):
    """(total, Σ_j m_j·bsum_j) for token t; for Q4_K's pieces (total + 8·Σ_j sc_j·bsum_j, their bias put back, and
    the minimums' term) by vpdpwssd on pairs (add_q4_k_pairs)."""
    if narrow is None:
        term = _i32(builder, 0)
        for j, m in enumerate(mins):
            term = builder.add(term, builder.mul(m, splat(builder, tokens.bsum(t, j, layout.size), VI32)))
        return total, term
    return add_q4_k_pairs(builder, q4_k_pairs(builder, scales, mins), total,
                          lambda i: tokens.splat_word(t, PAIRS_OF_32 + i))


def _sums(builder, layout: KLayout, tokens: _Tokens, block):
    """A block's integer sums for each token: (Σ_j scale_j·s_j, Σ_j m_j·bsum_j or None), s_j the products of
    sub-block j with the token's quants, bsum_j the token's quants summed over sub-block j: the same integers
    ggml's arithmetic makes. Pieces (NARROW) for tiles of several tokens only: a token alone, streaming the
    weights from memory, was 5% slower with them (1B Q4_K_M: 23.6 against 24.9 tokens/s), and the integers are the
    same either way."""
    n_tokens = len(tokens.q0s)
    narrow = NARROW.get(layout.qtype) if n_tokens > 1 else None
    subs, mins = layout.sub_blocks(builder, tokens.data[0], block)
    totals, scales = [_i32(builder, 0) for _ in range(n_tokens)], []
    for j, quants, scale in subs:
        scales.append(scale)
        for t in range(n_tokens):
            totals[t] = _add_sub_block(builder, layout, narrow, tokens, t, j, quants, scale, totals[t])
    if mins is None:
        return totals, None
    return tuple(zip(*(_minimums_term(builder, layout, narrow, tokens, t, scales, mins, totals[t])
                       for t in range(n_tokens)), strict=True))


def _pairs_term(builder, tokens: _Tokens, t: int, pairs, size: int):
    """Σ_j values_j·bsum_j for token t (pairs_dot) on the values' int16 pairs (2i, 2i+1) against the token's sums
    of 16 or 32 (the values' sub-blocks' `size`) as pairs."""
    at = PAIRS_OF_16 if size == 16 else PAIRS_OF_32
    return pairs_dot(builder, _i32(builder, 0), pairs, lambda i: tokens.splat_word(t, at + i))


def _rounds(builder, layout: KLayout, tokens: _Tokens, block, totals, multipliers):
    """totals + Σ_j scale_j·s_j for each token, with the sub-blocks taken in a loop of layout.rounds rounds: the
    multipliers (KLayout.multipliers) wait in a small array, the sums in stack slots that LLVM keeps in registers."""
    scales = cgutils.alloca_once(builder, VI32, size=len(multipliers))
    for j, multiplier in enumerate(multipliers):
        builder.store(multiplier, builder.gep(scales, [ir.Constant(I64, j)]))
    sums = [cgutils.alloca_once_value(builder, total) for total in totals]
    with cgutils.for_range(builder, ir.Constant(I64, layout.rounds)) as loop:
        for j, quants in layout.round(builder, tokens.data[0], block, loop.index):
            multiplier = builder.load(builder.gep(scales, [j]))
            for t, at in enumerate(sums):
                builder.store(tokens.products(t, builder.load(at), quants, layout.largest, multiplier), at)
    return [builder.load(at) for at in sums]


def _scaled_sums(builder, layout: KLayout, tokens: _Tokens, block):
    """_sums where the products of a sub-block are multiplied by its scale as they widen to int32 (SCALED_SUMS):
    Σ_j scale_j·s_j - zero·Σ_j scale_j·bsum_j, and Σ_j m_j·bsum_j where the type has minimums. The zero point's
    term comes first, so that no scale outlives its products."""
    n_tokens, data = len(tokens.q0s), tokens.data[0]
    totals = [_i32(builder, 0) for _ in range(n_tokens)]
    if layout.zero:
        pairs = layout.scale_pairs(builder, data, block)
        shift = _i32(builder, layout.zero.bit_length() - 1)     # the zero points are powers of two
        totals = [builder.sub(total, builder.shl(_pairs_term(builder, tokens, t, pairs, layout.size), shift))
                  for t, total in enumerate(totals)]
    if n_tokens > 1:  # the rounds (ROUNDS)
        multipliers, mins = layout.multipliers(builder, data, block)
        totals = _rounds(builder, layout, tokens, block, totals, multipliers)
    else:  # a token alone: the block unrolled, each scale made where it is used (all made first, Q5_K's spilled)
        (total,), (subs, mins) = totals, layout.sub_blocks(builder, data, block)
        for j, quants, scale in subs:
            total = tokens.products(0, total, quants, layout.largest, layout.multiplier(builder, data, block, j, scale))
        totals = [total]
    pairs = layout.min_pairs(builder, data, block, mins)  # after the products: made before, they outlived them
    if pairs is None:
        return totals, None
    return totals, [_pairs_term(builder, tokens, t, pairs, layout.size) for t in range(n_tokens)]


def _block_into_row(builder, acc, total, d, dx, minimums):
    """acc + (total·d - minimums·dmin)·dx as explicit fused multiply-adds: the same operations in the 4-token and
    the 1-token loop, so a token's sum is the same to the last bit alone and in a batch (a sequence's logits must
    not depend on its neighbours; with fast-math flags LLVM chose how to fuse per loop)."""
    fma = builder.module.declare_intrinsic(f"llvm.fma.v{ROWS}f32", fnty=ir.FunctionType(VF32, [VF32] * 3))
    if minimums is None:
        return builder.call(fma, [builder.fmul(total, d), dx, acc])
    term, dmin = minimums
    scaled = builder.call(fma, [builder.fneg(total), d, builder.fmul(term, dmin)])  # minimums·dmin - total·d
    return builder.call(fma, [builder.fneg(scaled), dx, acc])


def _tokens(builder, layout: KLayout, data, g_, nb_, t0_, n_tokens: int, yo_, ys_) -> None:
    """Tokens t0 .. t0 + n_tokens - 1 of the group at byte g_: one float accumulator each, over the nb blocks."""
    accs = [cgutils.alloca_once_value(builder, ir.Constant(VF32, [0.0] * ROWS)) for _ in range(n_tokens)]
    tokens = [builder.add(t0_, ir.Constant(I64, t)) for t in range(n_tokens)]
    with cgutils.for_range(builder, nb_) as loop:
        b = loop.index
        block = builder.add(g_, builder.mul(b, ir.Constant(I64, layout.group_block)))
        if n_tokens == 1:
            prefetch_ahead(builder, data[0], block, layout.group_block)
        ats = [builder.add(builder.mul(t, nb_), b) for t in tokens]                # token t's block b
        q0s = [builder.mul(at, ir.Constant(I64, 256)) for at in ats]
        b0s = [builder.mul(at, ir.Constant(I64, Q8K_WORDS)) for at in ats]

        d = layout.header(builder, data[0], block, layout.d_at)             # the block's bytes in order
        dmin = None if layout.dmin_at is None else layout.header(builder, data[0], block, layout.dmin_at)
        scaled = SCALED_SUMS and (n_tokens > 1 or layout.qtype != Q3_K)
        totals, minimums = (_scaled_sums if scaled else _sums)(builder, layout, _Tokens(builder, data, q0s, b0s), block)
        for t, acc in enumerate(accs):
            dx = splat(builder, load_at(builder, data[4], ats[t], F32, 4), VF32)
            builder.store(_block_into_row(builder, builder.load(acc), builder.sitofp(totals[t], VF32), d, dx,
                                          None if minimums is None else (builder.sitofp(minimums[t], VF32), dmin)),
                          acc)
    for t, acc in zip(tokens, accs, strict=True):
        out = builder.add(yo_, builder.mul(t, ys_))
        builder.store(builder.load(acc), builder.bitcast(builder.gep(data[7], [out]), VF32.as_pointer()), align=4)


tile_q2_K, tile_q3_K, tile_q4_K, tile_q5_K, tile_q6_K, tile_iq4_xs = (_tile(t) for t in K_FORMATS)
