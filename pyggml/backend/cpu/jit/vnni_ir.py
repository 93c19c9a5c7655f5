"""Integer tile products of Q4_0, Q4_1 and Q8_0 weights repacked 16 rows at a time, against activations
quantized to Q8_0, written as LLVM vector IR around AVX-512 VNNI's vpdpbusd (as ggml's repacked kernels).

One vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four products into
one of 16 int32 lanes: 64 multiply-adds in one instruction, where a float32 FMA does 16. The repacked
layout (repack.py) makes lane r row r of a 16-row group, so the four bytes each lane takes are four
quants of row r, and the activation side is four consecutive values of one token, the same in every
lane (a broadcast). A block (32 values) is then 8 vpdpbusd into an int32 accumulator, one conversion
to float and one multiply-add with the 16 rows' scales times the token's scale. The weights' bytes are
the unsigned side: Q4_0's and Q4_1's nibbles (0..15) as they are, Q8_0's quants plus 128. So the sum
starts at offset·Σq, exactly: Q4_0's value is nibble - 8 (Σ(n - 8)q = Σnq - 8Σq), Q8_0's is byte - 128,
and Q4_1 adds its minimum as m·dx·Σq in float.

`tile_<type>_16x<T>` is an intrinsic (w, g, nb, xq, xd, xs, t0, y, yo, ys): for the group of 16 rows
whose blocks start at byte g of w and tokens t0 .. t0+T-1, y[yo + t·ys + r] = Σ over the blocks of row
r. xq: the tokens' quants (int8 as uint8, nb·32 a token), xd: their scales (float32, nb a token), xs:
Σq per block (int32, nb a token). All arrays C-contiguous.
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
    then the quant vectors, 64 bytes each (16 rows x 4 bytes). `nibbles`: each vector holds two (low
    nibbles: values k, high: k + 16); else one (bytes stored + 128, so unsigned). Integer sums start at
    `offset`·Σq (the quants' zero point moved to the activations' side); `with_min` adds m·dx·Σq."""

    def __init__(self, block_bytes: int, headers: int, nibbles: bool, offset: int):
        self.group_block = ROWS * block_bytes
        self.headers, self.nibbles, self.offset = headers, nibbles, offset
        self.vectors = 4 if nibbles else 8

    def values(self, builder, data, block):
        """[(<64 x i8> unsigned quants of the 16 rows, the first value index k they multiply)]."""
        packed = [_load(builder, data, builder.add(block, ir.Constant(I64, 2 * ROWS * self.headers + 64 * m)), VI8)
                  for m in range(self.vectors)]
        if not self.nibbles:
            return [(p, 4 * m) for m, p in enumerate(packed)]
        low_mask, shift = ir.Constant(VI8, [15] * 4 * ROWS), ir.Constant(VI8, [4] * 4 * ROWS)
        return ([(builder.and_(p, low_mask), 4 * m) for m, p in enumerate(packed)]
                + [(builder.lshr(p, shift), 16 + 4 * m) for m, p in enumerate(packed)])


LAYOUTS = {"q4_0": Layout(18, 1, True, -8), "q4_1": Layout(20, 2, True, 0), "q8_0": Layout(34, 1, False, -128)}


def _tile(layout: Layout, n_tokens: int):
    def typer(typingctx, w, g, nb, xq, xd, xs, t0, y, yo, ys):
        arrays = ((w, types.uint8), (xq, types.uint8), (xd, types.float32), (xs, types.int32), (y, types.float32))
        if not all(isinstance(a, types.Array) and a.dtype == dt and a.layout == "C" for a, dt in arrays):
            return None
        if not all(isinstance(n, types.Integer) for n in (g, nb, t0, yo, ys)):
            return None

        def codegen(context, builder, signature, args):
            data = {i: context.make_array(signature.args[i])(context, builder, args[i]).data for i in (0, 3, 4, 5, 7)}
            g_, nb_, t0_, yo_, ys_ = (context.cast(builder, args[i], signature.args[i], types.uintp)
                                      for i in (1, 2, 6, 8, 9))
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
                        x_sum = _splat(builder, builder.fmul(dx, builder.sitofp(sum_q, F32), flags=FAST), VF32)
                        block_sum = builder.fadd(block_sum, builder.fmul(mins, x_sum, flags=FAST), flags=FAST)
                    builder.store(builder.fadd(builder.load(acc), block_sum, flags=FAST), acc)
            for t, acc in zip(tokens, accs):
                out = builder.add(yo_, builder.mul(builder.sub(t, t0_), ys_))
                builder.store(builder.load(acc), builder.bitcast(builder.gep(data[7], [out]), VF32.as_pointer()),
                              align=4)
            return context.get_dummy_value()

        return types.none(w, g, nb, xq, xd, xs, t0, y, yo, ys), codegen

    return intrinsic(typer)


TOKENS = 4  # tokens per tile: 4 accumulators and the 8 quant vectors stay in registers
tile_q4_0_16x4 = _tile(LAYOUTS["q4_0"], TOKENS)
tile_q4_0_16x1 = _tile(LAYOUTS["q4_0"], 1)
tile_q4_1_16x4 = _tile(LAYOUTS["q4_1"], TOKENS)
tile_q4_1_16x1 = _tile(LAYOUTS["q4_1"], 1)
tile_q8_0_16x4 = _tile(LAYOUTS["q8_0"], TOKENS)
tile_q8_0_16x1 = _tile(LAYOUTS["q8_0"], 1)
