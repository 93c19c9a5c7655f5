"""F32 products in the summation orders of ggml's CPU backend on AVX-512, as LLVM vector IR.

tinyBLAS sums each dot product of a k-value row pair in 16 lanes: lane l takes the values k = l mod 16, one fused
multiply-add per 16 values, in order of k; then adds the lanes as _mm512_reduce_add_ps does (lane i + lane i+8,
then + 4, + 2, + 1). Its blocking changes which dots share registers, not any dot's order, so this kernel's tile
of 4 rows by up to 4 columns (16 accumulators of <16 x float>) gives ggml's values bit for bit. No fast-math
flags: every fma and add rounds where ggml's do.

Where tinyBLAS does not apply, ggml_vec_dot_f32 sums a dot in 4 x 16 lanes over each 64 values (vector j of a
64-value step into accumulator j), adds accumulators 2 and 3 into 0 and 1, 1 into 0, sums the lanes as above, and
adds the last n mod 64 products to that float one by one (a multiply, then an add: not fused). ggml_vec_dot_f16
(F16 values widened to float32) is the same but for those last products, added to the sum in float64.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backend.cpu.jit.ir.block_ir import F32, I64, LANES, VF32, lanes_sum

F64 = ir.DoubleType()
TILE_ROWS = 4  # rows of a per tile (tinyBLAS's RM)


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
                    builder.store(lanes_sum(builder, builder.load(acc[c][r])), dst)
            return context.get_dummy_value()

        return types.none(a, b, out, i, j), codegen

    return intrinsic(typer)


TILE_COLUMNS = 4
tile_4x4, tile_4x1 = _tile(TILE_COLUMNS), _tile(1)
VEC_DOT_ACCUMULATORS = 4  # ggml_vec_dot_f32's GGML_F32_ARR on AVX-512 (a step of 64 values)


def _vec_dots(rows: int, tail_f64: bool):
    """An intrinsic (a, i, b, j, out): out[j, i + r] = ggml_vec_dot_f32's dot of a[i + r] and b[j] for r < rows
    (2-D float32 arrays with contiguous rows of the same length), or ggml_vec_dot_f16's with tail_f64. The rows'
    dots run side by side (4 accumulators each), sharing b's loads."""

    def typer(typingctx, a, i, b, j, out):
        if not all(isinstance(t, types.Array) and t.dtype == types.float32 and t.ndim == 2 for t in (a, b, out)):
            return None
        return types.none(a, i, b, j, out), codegen

    def codegen(context, builder, signature, args):
        i_, j_ = (context.cast(builder, args[n], signature.args[n], types.intp) for n in (1, 3))
        pa, lda, offa = _rows(context, builder, signature.args[0], args[0], i_)
        pb, _, offb = _rows(context, builder, signature.args[2], args[2], j_)
        po, _, offo = _rows(context, builder, signature.args[4], args[4], j_)
        pb = builder.gep(pb, [offb])
        pas = [builder.gep(pa, [builder.add(offa, builder.mul(ir.Constant(I64, r), lda))]) for r in range(rows)]
        k = cgutils.unpack_tuple(builder, context.make_array(signature.args[0])(context, builder, args[0]).shape,
                                 2)[1]
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(VF32, [VF32] * 3), "llvm.fma.v16f32")
        step = LANES * VEC_DOT_ACCUMULATORS
        acc = [[cgutils.alloca_once_value(builder, ir.Constant(VF32, [0.0] * LANES))
                for _ in range(VEC_DOT_ACCUMULATORS)] for _ in range(rows)]

        def load(p, offset):
            return builder.load(builder.bitcast(builder.gep(p, [offset]), VF32.as_pointer()), align=4)

        steps = builder.sdiv(k, ir.Constant(I64, step))
        with cgutils.for_range(builder, steps) as loop:
            at = builder.mul(loop.index, ir.Constant(I64, step))
            for v in range(VEC_DOT_ACCUMULATORS):
                offset = builder.add(at, ir.Constant(I64, v * LANES))
                bv = load(pb, offset)
                for r in range(rows):
                    builder.store(builder.call(fma, [load(pas[r], offset), bv, builder.load(acc[r][v])]), acc[r][v])
        totals = []
        for r in range(rows):
            s0 = builder.fadd(builder.load(acc[r][0]), builder.load(acc[r][2]))
            s1 = builder.fadd(builder.load(acc[r][1]), builder.load(acc[r][3]))
            vectors = lanes_sum(builder, builder.fadd(s0, s1))
            totals.append(cgutils.alloca_once_value(builder, builder.fpext(vectors, F64) if tail_f64 else vectors))
        done = builder.mul(steps, ir.Constant(I64, step))
        with cgutils.for_range(builder, builder.sub(k, done)) as loop:
            at = builder.add(done, loop.index)
            y = builder.load(builder.gep(pb, [at]))
            for r in range(rows):
                product = builder.fmul(builder.load(builder.gep(pas[r], [at])), y)
                builder.store(builder.fadd(builder.load(totals[r]), builder.fpext(product, F64) if tail_f64
                                           else product), totals[r])
        for r in range(rows):
            total = builder.load(totals[r])
            dst = builder.gep(po, [builder.add(builder.add(offo, i_), ir.Constant(I64, r))])
            builder.store(builder.fptrunc(total, F32) if tail_f64 else total, dst)
        return context.get_dummy_value()

    return intrinsic(typer)


VEC_DOT_ROWS = 4  # dots side by side
vec_dots_f32, vec_dot_f32 = _vec_dots(VEC_DOT_ROWS, False), _vec_dots(1, False)
vec_dots_f16, vec_dot_f16 = _vec_dots(VEC_DOT_ROWS, True), _vec_dots(1, True)
