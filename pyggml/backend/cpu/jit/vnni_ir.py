"""Integer tile products of Q4_0 weights repacked 16 rows at a time, against activations quantized to Q8_0,
written as LLVM vector IR around AVX-512 VNNI's vpdpbusd (as ggml's repacked Q4_0 kernels use it).

One vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four products into
one of 16 int32 lanes: 64 multiply-adds in one instruction, where a float32 FMA does 16. The repacked
layout (repack.py) makes lane r row r of a 16-row group, so the four bytes each lane takes are four
quants of row r, and the activation side is four consecutive values of one token, the same in every
lane (a broadcast). A block (32 values) is then 8 vpdpbusd into an int32 accumulator that starts at
-8·Σq (the nibbles are 0..15 and Q4_0's value is nibble - 8: Σ(n - 8)q = Σnq - 8Σq, exactly), one
conversion to float, and one FMA with the 16 rows' scales times the token's scale.

`tile_q4_0_16x4_q8_0(T)` is an intrinsic (w, g, nb, xq, xd, xc, t0, y, yo, ys): for the group of 16 rows
whose blocks start at byte g of w and tokens t0 .. t0+T-1, y[yo + t·ys + r] = Σ_blocks over the group's
rows r. xq: the tokens' quants (int8 as uint8, nb·32 a token), xd: their scales (float32, nb a token),
xc: -8·Σq per block (int32, nb a token). All arrays C-contiguous.
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
BLOCK_BYTES = 2 * ROWS + 16 * ROWS      # a group's block: 16 fp16 scales, then 4 vectors of 64 quant bytes
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


def _tile(n_tokens: int):
    def typer(typingctx, w, g, nb, xq, xd, xc, t0, y, yo, ys):
        arrays = ((w, types.uint8), (xq, types.uint8), (xd, types.float32), (xc, types.int32), (y, types.float32))
        if not all(isinstance(a, types.Array) and a.dtype == dt and a.layout == "C" for a, dt in arrays):
            return None
        if not all(isinstance(n, types.Integer) for n in (g, nb, t0, yo, ys)):
            return None

        def codegen(context, builder, signature, args):
            data = {i: context.make_array(signature.args[i])(context, builder, args[i]).data for i in (0, 3, 4, 5, 7)}
            g_, nb_, t0_, yo_, ys_ = (context.cast(builder, args[i], signature.args[i], types.uintp)
                                      for i in (1, 2, 6, 8, 9))
            low_mask, shift = ir.Constant(VI8, [15] * 4 * ROWS), ir.Constant(VI8, [4] * 4 * ROWS)
            accs = [cgutils.alloca_once_value(builder, ir.Constant(VF32, [0.0] * ROWS)) for _ in range(n_tokens)]
            tokens = [builder.add(t0_, ir.Constant(I64, t)) for t in range(n_tokens)]
            with cgutils.for_range(builder, nb_) as loop:
                b = loop.index
                block = builder.add(g_, builder.mul(b, ir.Constant(I64, BLOCK_BYTES)))
                scales = builder.fpext(_load(builder, data[0], block, VF16), VF32)
                packed = [_load(builder, data[0], builder.add(block, ir.Constant(I64, 2 * ROWS + 64 * m)), VI8)
                          for m in range(4)]
                nibbles = [(builder.and_(p, low_mask), builder.lshr(p, shift)) for p in packed]
                for t, acc in zip(tokens, accs):
                    at = builder.add(builder.mul(t, nb_), b)                  # token t's block b
                    q0 = builder.mul(at, ir.Constant(I64, 32))
                    total = _splat(builder, _load(builder, data[5], at, I32, 4), VI32)
                    for m, (low, high) in enumerate(nibbles):
                        for part, nib in ((0, low), (16, high)):
                            four = _load(builder, data[3], builder.add(q0, ir.Constant(I64, part + 4 * m)), I32)
                            total = _dpbusd(builder, total, nib, builder.bitcast(_splat(builder, four, VI32), VI8))
                    scale = builder.fmul(scales, _splat(builder, _load(builder, data[4], at, F32, 4), VF32), flags=FAST)
                    product = builder.fmul(builder.sitofp(total, VF32), scale, flags=FAST)
                    builder.store(builder.fadd(builder.load(acc), product, flags=FAST), acc)
            for t, acc in zip(tokens, accs):
                out = builder.add(yo_, builder.mul(builder.sub(t, t0_), ys_))
                builder.store(builder.load(acc), builder.bitcast(builder.gep(data[7], [out]), VF32.as_pointer()),
                              align=4)
            return context.get_dummy_value()

        return types.none(w, g, nb, xq, xd, xc, t0, y, yo, ys), codegen

    return intrinsic(typer)


TOKENS = 4  # tokens per tile: 4 accumulators and the 8 nibble vectors stay in registers
tile_q4_0_16x4_q8_0 = _tile(TOKENS)
tile_q4_0_16x1_q8_0 = _tile(1)
