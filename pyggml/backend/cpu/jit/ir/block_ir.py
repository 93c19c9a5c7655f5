"""Row dots of the 32-value block types (Q4_0, Q4_1, Q5_0, Q8_0) with float32 values, written as LLVM vector IR.

Written in Python, these loops keep one float sum per block: LLVM vectorises the 32 products of a block,
then must add the 16 lanes together before the block's scale multiplies them, and that horizontal sum cost
more than the products. Here (llvmlite's IR builder inside a Numba intrinsic, no C) a block's 32 quants are
two <16 x float> vectors, multiplied with the two <16 x float> halves of x's block, scaled by the block's d
as a vector and added into one <16 x float> accumulator per row, which is summed once at the row's end.
Q4_1's minimum adds m·(x's two halves) into the same accumulator. Measured on 2 threads (Zen 5):
Q4_0 1536x576 30 -> 20 us, Q4_1 47 -> 29 us. The sums come in another order than ggml's (per lane
across blocks, then across lanes): the same values to float32 rounding (relative 2e-7 on these rows).

Each intrinsic reads `nb` blocks starting at byte s of src (uint8, C-contiguous) and the values
x[xo:] (float32, C-contiguous), as vec_dot.py's functions do.
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
LANES = 16
VF32 = ir.VectorType(F32, LANES)
VI8 = ir.VectorType(I8, LANES)
VI32 = ir.VectorType(I32, LANES)
FAST = ("fast",)


def splat(builder, value, vtype=VF32):
    """A vector of `vtype` with value in every lane."""
    one = builder.insert_element(ir.Constant(vtype, ir.Undefined), value, ir.Constant(I32, 0))
    lanes = ir.Constant(ir.VectorType(I32, vtype.count), [0] * vtype.count)
    return builder.shuffle_vector(one, ir.Constant(vtype, ir.Undefined), lanes)


def lanes_sum(builder, v, flags=FAST):
    """The sum of a <16 x float>'s lanes, halving the vector four times (flags=(): in exactly that order)."""
    width = LANES
    while width > 1:
        width //= 2
        low = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, width), list(range(width))))
        high = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, width), list(range(width, 2 * width))))
        v = builder.fadd(low, high, flags=flags)
    return builder.extract_element(v, ir.Constant(I32, 0))


def _at(builder, p, offset, vtype):
    """The (unaligned) value of type vtype at byte p + offset."""
    ptr = builder.gep(p, [ir.Constant(I64, offset)]) if offset else p
    return builder.load(builder.bitcast(ptr, vtype.as_pointer()), align=1)


def _f16_at(builder, p, offset):
    return builder.fpext(_at(builder, p, offset, ir.HalfType()), F32)


def _nibbles(builder, p, offset):
    """The low and high nibbles of the 16 bytes at p + offset, as <16 x i8> (values 0..15)."""
    q = _at(builder, p, offset, VI8)
    return builder.and_(q, ir.Constant(VI8, [15] * LANES)), builder.lshr(q, ir.Constant(VI8, [4] * LANES))


def _q4_0(builder, p):
    low, high = _nibbles(builder, p, 2)
    eight = ir.Constant(VF32, [8.0] * LANES)
    return (builder.fsub(builder.uitofp(low, VF32), eight, flags=FAST),
            builder.fsub(builder.uitofp(high, VF32), eight, flags=FAST))


def _q4_1(builder, p):
    low, high = _nibbles(builder, p, 4)
    return builder.uitofp(low, VF32), builder.uitofp(high, VF32)


def _q5_0(builder, p):
    """Nibbles with their fifth bit from qh (bit j for value j, bit j + 16 for value j + 16), minus 16."""
    low, high = _nibbles(builder, p, 6)
    qh = splat(builder, _at(builder, p, 2, I32), VI32)
    out = []
    for nibble, first_bit in ((low, 0), (high, LANES)):
        bit = builder.and_(builder.lshr(qh, ir.Constant(VI32, list(range(first_bit, first_bit + LANES)))),
                           ir.Constant(VI32, [1] * LANES))
        fifth = builder.trunc(builder.shl(bit, ir.Constant(VI32, [4] * LANES)), VI8)
        value = builder.uitofp(builder.or_(nibble, fifth), VF32)
        out.append(builder.fsub(value, ir.Constant(VF32, [16.0] * LANES), flags=FAST))
    return out


def _q8_0(builder, p):
    return builder.sitofp(_at(builder, p, 2, VI8), VF32), builder.sitofp(_at(builder, p, 2 + LANES, VI8), VF32)


def _row_dot(block_bytes: int, quants, with_min: bool):
    """An intrinsic (src, s, x, xo, nb) -> float32: Σ over nb blocks of d·(q·x) (+ m·Σx with_min), where a
    block of block_bytes starts with its fp16 d (then its fp16 m with_min) and quants(builder, p) gives its
    32 values as two <16 x float>."""

    def typer(typingctx, src, s, x, xo, nb):
        if not (isinstance(src, types.Array) and src.dtype == types.uint8 and src.layout == "C"
                and isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C"
                and all(isinstance(n, types.Integer) for n in (s, xo, nb))):
            return None

        def codegen(context, builder, signature, args):
            src_a = context.make_array(signature.args[0])(context, builder, args[0])
            x_a = context.make_array(signature.args[2])(context, builder, args[2])
            s_, xo_, nb_ = (context.cast(builder, args[i], signature.args[i], types.uintp) for i in (1, 3, 4))
            row = builder.gep(src_a.data, [s_])
            xs = builder.gep(x_a.data, [xo_])
            acc = cgutils.alloca_once_value(builder, ir.Constant(VF32, [0.0] * LANES))
            with cgutils.for_range(builder, nb_) as loop:
                p = builder.gep(row, [builder.mul(loop.index, ir.Constant(I64, block_bytes))])
                v0, v1 = quants(builder, p)
                xb = builder.gep(xs, [builder.mul(loop.index, ir.Constant(I64, 2 * LANES))])
                x0 = builder.load(builder.bitcast(xb, VF32.as_pointer()), align=4)
                x1 = builder.load(builder.bitcast(builder.gep(xb, [ir.Constant(I64, LANES)]), VF32.as_pointer()),
                                  align=4)
                products = builder.fadd(builder.fmul(v0, x0, flags=FAST), builder.fmul(v1, x1, flags=FAST),
                                        flags=FAST)
                block = builder.fmul(splat(builder, _f16_at(builder, p, 0)), products, flags=FAST)
                if with_min:
                    sums = builder.fadd(x0, x1, flags=FAST)
                    block = builder.fadd(block, builder.fmul(splat(builder, _f16_at(builder, p, 2)), sums,
                                                             flags=FAST), flags=FAST)
                builder.store(builder.fadd(builder.load(acc), block, flags=FAST), acc)
            return lanes_sum(builder, builder.load(acc))

        return types.float32(src, s, x, xo, nb), codegen

    return intrinsic(typer)


row_dot_q4_0 = _row_dot(18, _q4_0, False)
row_dot_q4_1 = _row_dot(20, _q4_1, True)
row_dot_q5_0 = _row_dot(22, _q5_0, False)
row_dot_q8_0 = _row_dot(34, _q8_0, False)
