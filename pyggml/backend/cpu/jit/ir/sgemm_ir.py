"""F32 products in the summation order of llamafile's tinyBLAS (ggml's CPU backend on AVX-512), as LLVM vector IR.

tinyBLAS sums each dot product of a k-value row pair in 16 lanes: lane l takes the values k = l mod 16, one fused
multiply-add per 16 values, in order of k; then adds the lanes as _mm512_reduce_add_ps does (lane i + lane i+8,
then + 4, + 2, + 1). Its blocking changes which dots share registers, not any dot's order, so this kernel's tile
of 4 rows by up to 4 columns (16 accumulators of <16 x float>) gives ggml's values bit for bit. No fast-math
flags: every fma and add rounds where ggml's do.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

F32 = ir.FloatType()
I32 = ir.IntType(32)
I64 = ir.IntType(64)
LANES = 16
VF32 = ir.VectorType(F32, LANES)
TILE_ROWS = 4  # rows of a per tile (tinyBLAS's RM)


def reduce_add(builder, v):
    """_mm512_reduce_add_ps's order: the two halves added lane by lane, then the halves of that, down to one."""
    width = LANES
    while width > 1:
        width //= 2
        low = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, width), list(range(width))))
        high = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, width), list(range(width, 2 * width))))
        v = builder.fadd(low, high)
    return builder.extract_element(v, ir.Constant(I32, 0))


def _rows(context, builder, array_type, value, first):
    """Pointers (float*) to rows first .. of a 2-D float32 array, and its row stride in floats."""
    a = context.make_array(array_type)(context, builder, value)
    stride = builder.sdiv(cgutils.unpack_tuple(builder, a.strides, 2)[0], ir.Constant(I64, 4))
    return a.data, stride, builder.mul(first, stride)


def _tile(columns: int):
    """An intrinsic (a, b, out, i, j): out[j + c, i + r] = tinyBLAS's dot of a[i + r] and b[j + c] for r < 4,
    c < columns; a (m, k) and b (n, k) float32 with contiguous rows, k a multiple of 16."""

    def typer(typingctx, a, b, out, i, j):
        if not all(isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == 2 for t in (a, b, out)):
            return None

        def codegen(context, builder, signature, args):
            i_, j_ = (context.cast(builder, args[n], signature.args[n], types.intp) for n in (3, 4))
            pa, lda, offa = _rows(context, builder, signature.args[0], args[0], i_)
            pb, ldb, offb = _rows(context, builder, signature.args[1], args[1], j_)
            po, ldo, offo = _rows(context, builder, signature.args[2], args[2], j_)
            k = cgutils.unpack_tuple(builder, context.make_array(signature.args[0])(context, builder, args[0]).shape,
                                     2)[1]
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF32, [VF32] * 3), "llvm.fma.v16f32")
            zero = ir.Constant(VF32, [0.0] * LANES)
            acc = [[cgutils.alloca_once_value(builder, zero) for _ in range(TILE_ROWS)] for _ in range(columns)]

            def load(p, offset):
                return builder.load(builder.bitcast(builder.gep(p, [offset]), VF32.as_pointer()), align=4)

            chunks = builder.sdiv(k, ir.Constant(I64, LANES))
            with cgutils.for_range(builder, chunks) as loop:
                at = builder.mul(loop.index, ir.Constant(I64, LANES))
                av = [load(pa, builder.add(builder.add(offa, builder.mul(ir.Constant(I64, r), lda)), at))
                      for r in range(TILE_ROWS)]
                for c in range(columns):
                    bv = load(pb, builder.add(builder.add(offb, builder.mul(ir.Constant(I64, c), ldb)), at))
                    for r in range(TILE_ROWS):
                        builder.store(builder.call(fma, [av[r], bv, builder.load(acc[c][r])]), acc[c][r])
            for c in range(columns):
                row = builder.add(offo, builder.mul(ir.Constant(I64, c), ldo))
                for r in range(TILE_ROWS):
                    dst = builder.gep(po, [builder.add(builder.add(row, i_), ir.Constant(I64, r))])
                    builder.store(reduce_add(builder, builder.load(acc[c][r])), dst)
            return context.get_dummy_value()

        return types.none(a, b, out, i, j), codegen

    return intrinsic(typer)


TILE_COLUMNS = 4
tile_4x4, tile_4x1 = _tile(TILE_COLUMNS), _tile(1)
