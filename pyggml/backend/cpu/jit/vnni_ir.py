"""Integer tile products of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights repacked 16 rows at a time, against activations
quantized to Q8_0, written as LLVM vector IR around AVX-512 VNNI's vpdpbusd (as ggml's repacked kernels).

One vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four products into
one of 16 int32 lanes: 64 multiply-adds in one instruction, where a float32 FMA does 16. The repacked
layout (repack.py) makes lane r row r of a 16-row group, so the four bytes each lane takes are four
quants of row r, and the activation side is four consecutive values of one token, the same in every
lane (a broadcast). A block (32 values) is then 8 vpdpbusd into an int32 accumulator, one conversion
to float and one multiply-add with the 16 rows' scales times the token's scale. The weights' bytes are
the unsigned side: Q4_0's and Q4_1's nibbles (0..15) as they are, Q5_0's and Q5_1's with their fifth
bit put back (0..31), Q8_0's quants plus 128. So the sum starts at offset·Σq, exactly: Q4_0's value is
nibble - 8 (Σ(n - 8)q = Σnq - 8Σq), Q5_0's 5 bits - 16, Q8_0's byte - 128; Q4_1 and Q5_1 add their
minimum as m·s, s being Q8_1's fp16 d·Σq (what ggml multiplies them with).

`tile_<type>_16x<T>` is an intrinsic (w, g, nb, xq, xd, xs, xm, t0, y, yo, ys): for the group of 16 rows
whose blocks start at byte g of w and tokens t0 .. t0+T-1, y[yo + t·ys + r] = Σ over the blocks of row
r. xq: the tokens' quants (int8 as uint8, nb·32 a token), xd: their scales (float32, nb a token), xs:
Σq per block (int32), xm: s per block (float32). All arrays C-contiguous.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

F32 = ir.FloatType()
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
ROWS = 16                               # rows of a group: the int32 lanes of a zmm register
VF32 = ir.VectorType(F32, ROWS)
VI32 = ir.VectorType(I32, ROWS)
VI8 = ir.VectorType(I8, 4 * ROWS)
VF16 = ir.VectorType(ir.HalfType(), ROWS)
FAST = ("fast",)


def _dpbusd(builder, acc, unsigned, signed):
    """acc + the sums of four u8·s8 products per int32 lane (vpdpbusd)."""
    fn = builder.module.declare_intrinsic("llvm.x86.avx512.vpdpbusd.512", fnty=ir.FunctionType(VI32, [VI32, VI8, VI8]))
    return builder.call(fn, [acc, unsigned, signed])


def _splat(builder, value, vtype):
    one = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vtype, ir.Undefined), ir.Constant(VI32, [0] * vtype.count))


def _load(builder, base, offset, vtype, align=1):
    return builder.load(builder.bitcast(builder.gep(base, [offset]), vtype.as_pointer()), align=align)


class Layout:
    """How a type's 16-row group block lies (repack.py): `headers` fp16 fields of 16 rows each (d, then m),
    then for Q5_0 the rows' 32 fifth bits (`high_bits`: one vector of 16 uint32), then the quant vectors,
    64 bytes each (16 rows x 4 bytes). `nibbles`: each vector holds two (low nibbles: values k, high:
    k + 16); else one (bytes stored + 128, so unsigned). Integer sums start at `offset`·Σq (the quants'
    zero point moved to the activations' side); `with_min` adds m·s (Q8_1's s = d·Σq, as ggml)."""

    def __init__(self, block_bytes: int, headers: int, nibbles: bool, offset: int, high_bits: bool = False):
        self.group_block = ROWS * block_bytes
        self.headers, self.nibbles, self.offset, self.high_bits = headers, nibbles, offset, high_bits
        self.quants_at = 2 * ROWS * headers + (4 * ROWS if high_bits else 0)
        self.vectors = 4 if nibbles else 8

    def values(self, builder, data, block):
        """[(<64 x i8> unsigned quants of the 16 rows, the first value index k they multiply)]."""
        packed = [_load(builder, data, builder.add(block, ir.Constant(I64, self.quants_at + 64 * m)), VI8)
                  for m in range(self.vectors)]
        if not self.nibbles:
            return [(p, 4 * m) for m, p in enumerate(packed)]
        low_mask, shift = ir.Constant(VI8, [15] * 4 * ROWS), ir.Constant(VI8, [4] * 4 * ROWS)
        out = ([(builder.and_(p, low_mask), 4 * m) for m, p in enumerate(packed)]
               + [(builder.lshr(p, shift), 16 + 4 * m) for m, p in enumerate(packed)])
        if self.high_bits:
            bits = _load(builder, data, builder.add(block, ir.Constant(I64, 2 * ROWS * self.headers)), VI32)
            out = [(builder.or_(v, _fifth_bits(builder, bits, k)), k) for v, k in out]
        return out


def _fifth_bits(builder, bits, k):
    """Bits k .. k+3 of each lane's uint32 as 16 in bytes 0 .. 3 (a multiply spreads four bits a byte apart)."""
    four = builder.and_(builder.lshr(bits, _splat(builder, ir.Constant(I32, k), VI32)),
                        _splat(builder, ir.Constant(I32, 15), VI32))
    spread = builder.and_(builder.mul(four, _splat(builder, ir.Constant(I32, 0x00204081), VI32)),
                          _splat(builder, ir.Constant(I32, 0x01010101), VI32))
    return builder.bitcast(builder.shl(spread, _splat(builder, ir.Constant(I32, 4), VI32)), VI8)


LAYOUTS = {"q4_0": Layout(18, 1, True, -8), "q4_1": Layout(20, 2, True, 0), "q5_0": Layout(22, 1, True, -16, True),
           "q5_1": Layout(24, 2, True, 0, True), "q8_0": Layout(34, 1, False, -128)}


def _tile(layout: Layout, n_tokens: int):
    def typer(typingctx, w, g, nb, xq, xd, xs, xm, t0, y, yo, ys):
        arrays = ((w, types.uint8), (xq, types.uint8), (xd, types.float32), (xs, types.int32), (xm, types.float32),
                  (y, types.float32))
        if not all(isinstance(a, types.Array) and a.dtype == dt and a.layout == "C" for a, dt in arrays):
            return None
        if not all(isinstance(n, types.Integer) for n in (g, nb, t0, yo, ys)):
            return None

        def codegen(context, builder, signature, args):
            data = {i: context.make_array(signature.args[i])(context, builder, args[i]).data
                    for i in (0, 3, 4, 5, 6, 8)}
            g_, nb_, t0_, yo_, ys_ = (context.cast(builder, args[i], signature.args[i], types.uintp)
                                      for i in (1, 2, 7, 9, 10))
            accs = [cgutils.alloca_once_value(builder, ir.Constant(VF32, [0.0] * ROWS)) for _ in range(n_tokens)]
            tokens = [builder.add(t0_, ir.Constant(I64, t)) for t in range(n_tokens)]
            with cgutils.for_range(builder, nb_) as loop:
                b = loop.index
                block = builder.add(g_, builder.mul(b, ir.Constant(I64, layout.group_block)))
                scales = builder.fpext(_load(builder, data[0], block, VF16), VF32)
                if layout.headers == 2:
                    mins = builder.fpext(_load(builder, data[0], builder.add(block, ir.Constant(I64, 2 * ROWS)), VF16),
                                         VF32)
                quants = layout.values(builder, data[0], block)
                for t, acc in zip(tokens, accs):
                    at = builder.add(builder.mul(t, nb_), b)                  # token t's block b
                    q0 = builder.mul(at, ir.Constant(I64, 32))
                    sum_q = _load(builder, data[5], at, I32, 4)
                    total = _splat(builder, builder.mul(sum_q, ir.Constant(I32, layout.offset)), VI32)
                    for vector, k in quants:
                        four = _load(builder, data[3], builder.add(q0, ir.Constant(I64, k)), I32)
                        total = _dpbusd(builder, total, vector, builder.bitcast(_splat(builder, four, VI32), VI8))
                    dx = _load(builder, data[4], at, F32, 4)
                    scale = builder.fmul(scales, _splat(builder, dx, VF32), flags=FAST)
                    block_sum = builder.fmul(builder.sitofp(total, VF32), scale, flags=FAST)
                    if layout.headers == 2:
                        x_sum = _splat(builder, _load(builder, data[6], at, F32, 4), VF32)
                        block_sum = builder.fadd(block_sum, builder.fmul(mins, x_sum, flags=FAST), flags=FAST)
                    builder.store(builder.fadd(builder.load(acc), block_sum, flags=FAST), acc)
            for t, acc in zip(tokens, accs):
                out = builder.add(yo_, builder.mul(builder.sub(t, t0_), ys_))
                builder.store(builder.load(acc), builder.bitcast(builder.gep(data[8], [out]), VF32.as_pointer()),
                              align=4)
            return context.get_dummy_value()

        return types.none(w, g, nb, xq, xd, xs, xm, t0, y, yo, ys), codegen

    return intrinsic(typer)


TOKENS = 4  # tokens per tile: 4 accumulators and the 8 quant vectors stay in registers
tile_q4_0_16x4 = _tile(LAYOUTS["q4_0"], TOKENS)
tile_q4_0_16x1 = _tile(LAYOUTS["q4_0"], 1)
tile_q4_1_16x4 = _tile(LAYOUTS["q4_1"], TOKENS)
tile_q4_1_16x1 = _tile(LAYOUTS["q4_1"], 1)
tile_q5_0_16x4 = _tile(LAYOUTS["q5_0"], TOKENS)
tile_q5_0_16x1 = _tile(LAYOUTS["q5_0"], 1)
tile_q5_1_16x4 = _tile(LAYOUTS["q5_1"], TOKENS)
tile_q5_1_16x1 = _tile(LAYOUTS["q5_1"], 1)
tile_q8_0_16x4 = _tile(LAYOUTS["q8_0"], TOKENS)
tile_q8_0_16x1 = _tile(LAYOUTS["q8_0"], 1)
