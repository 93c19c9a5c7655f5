"""Integer tile products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL and MXFP4 weights repacked 16 rows at a time, against
activations quantized to Q8_0, written as LLVM vector IR around AVX-512 VNNI's vpdpbusd (as ggml's repacked kernels).

One vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four products into
one of 16 int32 lanes: 64 multiply-adds in one instruction, where a float32 FMA does 16. The repacked
layout (jit/repack.py) makes lane r row r of a 16-row group, so the four bytes each lane takes are four
quants of row r, and the activation side is four consecutive values of one token, the same in every
lane (a broadcast). A block (32 values) is then 8 vpdpbusd into an int32 accumulator, one conversion
to float and one multiply-add with the 16 rows' scales times the token's scale. The weights' bytes are
the unsigned side: Q4_0's and Q4_1's nibbles (0..15) as they are, Q5_0's and Q5_1's with their fifth
bit put back (0..31), Q8_0's quants plus 128, IQ4_NL's and MXFP4's code book values plus 128 (a vpshufb lookup).
So the sum starts at offset·Σq, exactly: Q4_0's value is nibble - 8 (Σ(n - 8)q = Σnq - 8Σq), Q5_0's 5 bits - 16,
Q8_0's, IQ4_NL's and MXFP4's byte - 128; Q4_1 and Q5_1 add their minimum as m·s, s being Q8_1's fp16 d·Σq (what
ggml multiplies them with). MXFP4's scale is an E8M0 exponent byte per row, not an fp16 d: 16 bytes widened to
the float32 2^(e - 128) (ggml's GGML_E8M0_TO_FP32_HALF, its code book holding the E2M1 values doubled), as
ggml_vec_dot_mxfp4_q8_0 multiplies it with the token's Q8_0 scale.

`tile_<type>` is an intrinsic (w, g, nb, xq, xd, xs, xm, n, y, yo, ys): for the group of 16 rows whose
blocks start at byte g of w and tokens 0 .. n-1, y[yo + t·ys + r] = Σ over the blocks of row r, the tokens
taken four at a time (their four accumulators and the block's quant vectors stay in registers), then one
at a time. xq: the tokens' quants (int8 as uint8, nb·32 a token), xd: their scales (float32, nb a token),
xs: Σq per block (int32), xm: s per block (float32). All arrays C-contiguous.

Where this says 16 rows and 64-byte vectors, a CPU with AVX2 alone has groups of 8 rows and vectors of 32 bytes
(ROWS, VECTOR_BYTES; ir/int8_ir.py): the same code at the width of its registers.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backend.cpu.jit.ir.block_ir import F32, FAST, I32, I64, I8, splat
from pyggml.backend.cpu.jit.ir.int8_ir import LANES, dot_products, table_lookup
from pyggml.backend.cpu.jit.prefetch import prefetch_pointer
from pyggml.backend.cpu.jit.quants import KVALUES_IQ4NL, KVALUES_MXFP4
from pyggml.core.types import GGMLType

ROWS = LANES                            # rows of a group: the int32 lanes of a register (16, or 8 on AVX2)
VECTOR_BYTES = 4 * ROWS                 # a quant vector: four bytes of each row of the group
TOKENS = 4                              # tokens a tile takes at once
# A token alone (generation) streams the weights from memory, and its tile asks for them this many bytes ahead of
# the block it multiplies: the hardware's prefetchers stop at each 4 KiB page (the weights' pages), and the
# products alone kept too few lines in flight. Intel Xeon, 2 threads, alternating pairs: a 1B Q4_K_M file's steps
# 21.5 -> 24.2 tokens/s, an 8B's 4.1 -> 4.6; 2 KiB and 3 KiB ahead gained less, 6 and 8 KiB lost (17-18 tokens/s).
# With AVX2's 8-row groups (AMD EPYC Zen 3, 2 threads, ten 2048 x 8192 matrices from memory, three alternating
# rounds, medians) 16 KiB ahead: Q4_K 15.0 -> 16.7 GB/s, Q6_K 14.4 -> 17.3 (8 to 64 KiB alike, 0 KiB 12 GB/s); a 1B
# Q4_K_M file's step products 50.7-87.7 -> 49.8-52.7 ms in three alternating pairs.
PREFETCH_AHEAD = 4096 if ROWS == 16 else 16384
VF32 = ir.VectorType(F32, ROWS)
VI32 = ir.VectorType(I32, ROWS)
VI8 = ir.VectorType(I8, 4 * ROWS)
VF16 = ir.VectorType(ir.HalfType(), ROWS)

# per ggml type: block bytes, the fields before the quants as (offset, bytes): fp16 d (and m), Q5's qh, MXFP4's
# E8M0 byte (jit/repack.py lays the groups out from these), and the quants' zero point (offset·Σq starts each sum)
FORMATS = {int(GGMLType.Q4_0): (18, ((0, 2),), -8), int(GGMLType.Q4_1): (20, ((0, 2), (2, 2)), 0),
           int(GGMLType.Q5_0): (22, ((0, 2), (2, 4)), -16), int(GGMLType.Q5_1): (24, ((0, 2), (2, 2), (4, 4)), 0),
           int(GGMLType.Q8_0): (34, ((0, 2),), -128), int(GGMLType.IQ4_NL): (18, ((0, 2),), -128),
           int(GGMLType.MXFP4): (17, ((0, 1),), -128)}
IQ4_NL, MXFP4 = int(GGMLType.IQ4_NL), int(GGMLType.MXFP4)
CODE_BOOKS = {IQ4_NL: KVALUES_IQ4NL, MXFP4: KVALUES_MXFP4}  # the types whose nibbles index a table of values
VI8x16 = ir.VectorType(I8, ROWS)


def code_book_values(builder, nibbles, code_book=KVALUES_IQ4NL):
    """A 16-value code book (IQ4_NL's and IQ4_XS's, MXFP4's) looked up for 64 nibbles (vpshufb on the table in each
    128-bit lane), as unsigned bytes: the value + 128 (so the sums start at -128·Σq)."""
    table = ir.Constant(VI8, [(int(v) + 128) & 0xFF for v in code_book] * (VECTOR_BYTES // 16))
    return table_lookup(builder, table, nibbles)


def e8m0_half_scales(builder, exponents):
    """16 E8M0 bytes as the float32 2^(e - 128) (ggml_e8m0_to_fp32_half): bits (e - 1) << 23, or for e < 2 the
    subnormal bits 0x00200000 << e."""
    e = builder.zext(exponents, VI32)
    one, two = ir.Constant(VI32, [1] * ROWS), ir.Constant(VI32, [2] * ROWS)
    normal = builder.shl(builder.sub(e, one), ir.Constant(VI32, [23] * ROWS))
    subnormal = builder.shl(ir.Constant(VI32, [0x00200000] * ROWS), e)
    small = builder.icmp_unsigned("<", e, two)
    return builder.bitcast(builder.select(small, subnormal, normal), VF32)


def prefetch_ahead(builder, data, block, nbytes: int) -> None:
    """Ask for the cache lines of [block, block + nbytes) of data PREFETCH_AHEAD bytes on."""
    for line in range(0, nbytes, 64):
        prefetch_pointer(builder, builder.gep(data, [builder.add(block, ir.Constant(I64, PREFETCH_AHEAD + line))]))


def typed(arrays, integers) -> bool:
    """Whether a tile intrinsic's arguments are what its code reads: C-contiguous arrays of the given dtypes
    ((argument, dtype) pairs) and integer offsets and counts."""
    return (all(isinstance(a, types.Array) and a.dtype == dt and a.layout == "C" for a, dt in arrays)
            and all(isinstance(i, types.Integer) for i in integers))


def load_at(builder, base, offset, vtype, align=1):
    return builder.load(builder.bitcast(builder.gep(base, [offset]), vtype.as_pointer()), align=align)


def token_products(builder, acc, quants, xq, q0, largest: int, multiplier=None):
    """acc + the products of quant vectors [(vector, first value k: an int, or an i64 value)] with one token's int8
    values from element q0 of xq: each vector against values k .. k+3, the same four in every lane
    (int8_ir.dot_products; `largest`: the largest quant byte; `multiplier`: AVX2's scale pairs)."""
    fours = [load_at(builder, xq, builder.add(q0, ir.Constant(I64, k) if isinstance(k, int) else k), I32)
             for _, k in quants]
    return dot_products(builder, acc, [(vector, builder.bitcast(splat(builder, four, VI32), VI8))
                                       for (vector, _), four in zip(quants, fours, strict=True)], largest,
                        multiplier)


class Layout:
    """How a type's 16-row group block lies (jit/repack.py), from its FORMATS entry: the fp16 fields of 16 rows
    each (`headers`: d, then m for Q4_1 and Q5_1, whose sums add m·s, s being Q8_1's d·Σq as in ggml), then
    for Q5 the rows' 32 fifth bits (`high_bits`: one vector of 16 uint32), then the quant vectors, 64 bytes
    each (16 rows x 4 bytes). 4-bit quants: each vector holds two (low nibbles: values k, high: k + 16);
    Q8_0: one (bytes stored + 128, so unsigned). Integer sums start at `offset`·Σq (the quants' zero point
    moved to the activations' side)."""

    def __init__(self, qtype: int):
        block_bytes, fields, self.offset = FORMATS[qtype]
        self.code_book = CODE_BOOKS.get(qtype)
        # the largest unsigned quant byte (int8_ir.dot_products): Q8_0's and the code books' + 128, 5 or 4 bits
        self.largest = 255 if self.offset == -128 else 31 if any(size == 4 for _, size in fields) else 15
        self.e8m0 = fields[0][1] == 1
        self.group_block = ROWS * block_bytes
        self.headers = sum(size == 2 for _, size in fields)
        self.high_bits = any(size == 4 for _, size in fields)
        self.quants_at = ROWS * sum(size for _, size in fields)
        self.nibbles = block_bytes * ROWS - self.quants_at == 16 * ROWS
        self.vectors = 4 if self.nibbles else 8

    def scales(self, builder, data, block):
        """The 16 rows' block scales as <16 x float>: fp16 d, or MXFP4's E8M0 exponent read halved."""
        if self.e8m0:
            return e8m0_half_scales(builder, load_at(builder, data, block, VI8x16))
        return builder.fpext(load_at(builder, data, block, VF16), VF32)

    def values(self, builder, data, block):
        """[(<64 x i8> unsigned quants of the 16 rows, the first value index k they multiply)]."""
        packed = [load_at(builder, data, builder.add(block, ir.Constant(I64, self.quants_at + VECTOR_BYTES * m)), VI8)
                  for m in range(self.vectors)]
        if not self.nibbles:
            return [(p, 4 * m) for m, p in enumerate(packed)]
        low_mask, shift = ir.Constant(VI8, [15] * 4 * ROWS), ir.Constant(VI8, [4] * 4 * ROWS)
        out = ([(builder.and_(p, low_mask), 4 * m) for m, p in enumerate(packed)]
               + [(builder.lshr(p, shift), 16 + 4 * m) for m, p in enumerate(packed)])
        if self.high_bits:
            bits = load_at(builder, data, builder.add(block, ir.Constant(I64, 2 * ROWS * self.headers)), VI32)
            out = [(builder.or_(v, _fifth_bits(builder, bits, k)), k) for v, k in out]
        if self.code_book is not None:
            out = [(code_book_values(builder, v, self.code_book), k) for v, k in out]
        return out


def _fifth_bits(builder, bits, k):
    """Bits k .. k+3 of each lane's uint32 as 16 in bytes 0 .. 3 (a multiply spreads four bits a byte apart)."""
    four = builder.and_(builder.lshr(bits, splat(builder, ir.Constant(I32, k), VI32)),
                        splat(builder, ir.Constant(I32, 15), VI32))
    spread = builder.and_(builder.mul(four, splat(builder, ir.Constant(I32, 0x00204081), VI32)),
                          splat(builder, ir.Constant(I32, 0x01010101), VI32))
    return builder.bitcast(builder.shl(spread, splat(builder, ir.Constant(I32, 4), VI32)), VI8)


def _tile(qtype: int):
    layout = Layout(qtype)

    def typer(typingctx, w, g, nb, xq, xd, xs, xm, n, y, yo, ys):
        arrays = ((w, types.uint8), (xq, types.uint8), (xd, types.float32), (xs, types.int32), (xm, types.float32),
                  (y, types.float32))
        if not typed(arrays, (g, nb, n, yo, ys)):
            return None

        def codegen(context, builder, signature, args):
            data = {i: context.make_array(signature.args[i])(context, builder, args[i]).data
                    for i in (0, 3, 4, 5, 6, 8)}
            g_, nb_, n_, yo_, ys_ = (context.cast(builder, args[i], signature.args[i], types.uintp)
                                     for i in (1, 2, 7, 9, 10))
            full = builder.mul(builder.udiv(n_, ir.Constant(I64, TOKENS)), ir.Constant(I64, TOKENS))
            with cgutils.for_range_slice(builder, ir.Constant(I64, 0), full, ir.Constant(I64, TOKENS)) as (t0, _):
                _tokens(builder, layout, data, g_, nb_, t0, TOKENS, yo_, ys_)
            with cgutils.for_range_slice(builder, full, n_, ir.Constant(I64, 1)) as (t0, _):
                _tokens(builder, layout, data, g_, nb_, t0, 1, yo_, ys_)
            return context.get_dummy_value()

        return types.none(w, g, nb, xq, xd, xs, xm, n, y, yo, ys), codegen

    return intrinsic(typer)


def _tokens(builder, layout: Layout, data, g_, nb_, t0_, n_tokens: int, yo_, ys_) -> None:
    """Tokens t0 .. t0 + n_tokens - 1 of the group at byte g_: one accumulator each, over the nb blocks."""
    accs = [cgutils.alloca_once_value(builder, ir.Constant(VF32, [0.0] * ROWS)) for _ in range(n_tokens)]
    tokens = [builder.add(t0_, ir.Constant(I64, t)) for t in range(n_tokens)]
    with cgutils.for_range(builder, nb_) as loop:
        b = loop.index
        block = builder.add(g_, builder.mul(b, ir.Constant(I64, layout.group_block)))
        if n_tokens == 1:
            prefetch_ahead(builder, data[0], block, layout.group_block)
        scales = layout.scales(builder, data[0], block)
        if layout.headers == 2:
            at_m = builder.add(block, ir.Constant(I64, 2 * ROWS))
            mins = builder.fpext(load_at(builder, data[0], at_m, VF16), VF32)
        quants = layout.values(builder, data[0], block)
        for t, acc in zip(tokens, accs, strict=True):
            at = builder.add(builder.mul(t, nb_), b)                  # token t's block b
            q0 = builder.mul(at, ir.Constant(I64, 32))
            sum_q = load_at(builder, data[5], at, I32, 4)
            total = splat(builder, builder.mul(sum_q, ir.Constant(I32, layout.offset)), VI32)
            total = token_products(builder, total, quants, data[3], q0, layout.largest)
            dx = load_at(builder, data[4], at, F32, 4)
            scale = builder.fmul(scales, splat(builder, dx, VF32), flags=FAST)
            block_sum = builder.fmul(builder.sitofp(total, VF32), scale, flags=FAST)
            if layout.headers == 2:
                x_sum = splat(builder, load_at(builder, data[6], at, F32, 4), VF32)
                block_sum = builder.fadd(block_sum, builder.fmul(mins, x_sum, flags=FAST), flags=FAST)
            builder.store(builder.fadd(builder.load(acc), block_sum, flags=FAST), acc)
    for t, acc in zip(tokens, accs, strict=True):
        out = builder.add(yo_, builder.mul(t, ys_))
        builder.store(builder.load(acc), builder.bitcast(builder.gep(data[8], [out]), VF32.as_pointer()), align=4)


tile_q4_0, tile_q4_1, tile_q5_0, tile_q5_1, tile_q8_0, tile_iq4_nl, tile_mxfp4 = (_tile(t) for t in FORMATS)
