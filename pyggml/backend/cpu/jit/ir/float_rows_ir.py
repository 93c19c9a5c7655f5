"""Dots of a float32 or F16 row with one or two float32 columns, in one fixed order of sums, written as LLVM IR.

A step of several sequences multiplies each column of a KV cache or F32/F16 weight as that token alone would only
if the column's sum is made in the same order whether it goes alone or beside others (jit/mul_mat.py's
_float_rows_times_columns; tests/backend/cpu/test_kernels_mul_mat.py). Left to LLVM's vectoriser, the order was
whatever vector width and interleave it chose for the loop, which differed between one column and four on AVX2
(16 registers) though not on AVX-512. Here the order is written out: element j goes into lane j mod 32 (two
<16 x float> fused multiply-add chains per column), the 32 lanes are added in a fixed tree, then the k mod 32
last elements in turn: the same bits for a column alone, in a pair, and on any x86 vector width.

`row_dots_<n>(a, row, x, xo, k)` -> n float32: Σ_j a[row + j]·x[xo_i + j] for j < k, for each of the n column
offsets xo (a UniTuple); a: float32, or F16 bits as uint16; x: float32; both C-contiguous.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backend.cpu.jit.ir.block_ir import F32, I64, LANES, VF32, lanes_sum

CHAINS = 2                               # <16 x float> accumulators a column: lanes 0 .. 31
STEP = LANES * CHAINS
VI16 = ir.VectorType(ir.IntType(16), LANES)
VF16 = ir.VectorType(ir.HalfType(), LANES)


def _row_dots(columns: int):
    def typer(typingctx, a, row, x, xo, k):
        if not (isinstance(a, types.Array) and a.dtype in (types.float32, types.uint16) and a.layout == "C"
                and isinstance(x, types.Array) and x.dtype == types.float32 and x.layout == "C"
                and isinstance(xo, types.UniTuple) and xo.count == columns and isinstance(xo.dtype, types.Integer)
                and isinstance(row, types.Integer) and isinstance(k, types.Integer)):
            return None
        f16 = a.dtype == types.uint16

        def codegen(context, builder, signature, args):
            a_data = context.make_array(signature.args[0])(context, builder, args[0]).data
            x_data = context.make_array(signature.args[2])(context, builder, args[2]).data
            row_, k_ = (context.cast(builder, args[i], signature.args[i], types.uintp) for i in (1, 4))
            xos = [context.cast(builder, builder.extract_value(args[3], i), xo.dtype, types.uintp)
                   for i in range(columns)]
            a_row = builder.gep(a_data, [row_])
            x_rows = [builder.gep(x_data, [o]) for o in xos]
            fma = builder.module.declare_intrinsic("llvm.fma.v16f32", fnty=ir.FunctionType(VF32, [VF32] * 3))

            def values(j, chain):
                p = builder.gep(a_row, [builder.add(j, ir.Constant(I64, LANES * chain))])
                if f16:
                    return builder.fpext(builder.bitcast(builder.load(builder.bitcast(p, VI16.as_pointer()), align=2),
                                                         VF16), VF32)
                return builder.load(builder.bitcast(p, VF32.as_pointer()), align=4)

            accs = [[cgutils.alloca_once_value(builder, ir.Constant(VF32, [0.0] * LANES)) for _ in range(CHAINS)]
                    for _ in range(columns)]
            full = builder.mul(builder.udiv(k_, ir.Constant(I64, STEP)), ir.Constant(I64, STEP))
            with cgutils.for_range_slice(builder, ir.Constant(I64, 0), full, ir.Constant(I64, STEP)) as (j, _):
                for chain in range(CHAINS):
                    v = values(j, chain)
                    for c in range(columns):
                        xp = builder.gep(x_rows[c], [builder.add(j, ir.Constant(I64, LANES * chain))])
                        xv = builder.load(builder.bitcast(xp, VF32.as_pointer()), align=4)
                        acc = accs[c][chain]
                        builder.store(builder.call(fma, [v, xv, builder.load(acc)]), acc)
            tails = [cgutils.alloca_once_value(builder, ir.Constant(F32, 0.0)) for _ in range(columns)]
            with cgutils.for_range_slice(builder, full, k_, ir.Constant(I64, 1)) as (j, _):
                value = builder.load(builder.gep(a_row, [j]))
                value = builder.fpext(builder.bitcast(value, ir.HalfType()), F32) if f16 else value
                for c in range(columns):
                    product = builder.fmul(value, builder.load(builder.gep(x_rows[c], [j])))
                    builder.store(builder.fadd(builder.load(tails[c]), product), tails[c])
            sums = []
            for c in range(columns):
                lanes = builder.fadd(builder.load(accs[c][0]), builder.load(accs[c][1]))
                sums.append(builder.fadd(lanes_sum(builder, lanes, flags=()), builder.load(tails[c])))
            return context.make_tuple(builder, signature.return_type, sums)

        return types.UniTuple(types.float32, columns)(a, row, x, xo, k), codegen

    return intrinsic(typer)


row_dots_1, row_dots_2 = _row_dots(1), _row_dots(2)
