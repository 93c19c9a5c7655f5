"""Scalar conversions Numba lacks on the CPU: IEEE half and bfloat16 bits to float32.

Numba has no CPU float16 type; these intrinsics emit LLVM's own conversions (`fpext half` becomes one
`vcvtph2ps` on F16C machines), so a block's fp16 scale costs an instruction instead of a bit-twiddling routine.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def f16_to_f32(typingctx, bits):
    """float32 value of the IEEE half whose bits are `bits` (any integer type; the low 16 bits are used)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], ir.IntType(16)) if bits.bitwidth > 16 else args[0]
        return builder.fpext(builder.bitcast(low, ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def bf16_to_f32(typingctx, bits):
    """float32 value of the bfloat16 whose bits are `bits` (the float32's upper half)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif bits.bitwidth < 32:
            value = builder.zext(value, ir.IntType(32))
        return builder.bitcast(builder.shl(value, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return types.float32(bits), codegen
