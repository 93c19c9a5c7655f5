"""float32 bit patterns, IEEE half and bfloat16 bits widened to float32, and an exp that vectorises, for
compiled kernels.

The conversions are LLVM intrinsics Numba lacks on the CPU: `fpext half` becomes one `vcvtph2ps` on F16C machines,
so a block's fp16 scale costs an instruction instead of a bit-twiddling routine.

`expf` is what ggml's CPU softmax uses too in spirit (ggml_v_expf): exp(x) = 2^n * exp(r) with n = round(x /
ln 2) and r = x - n ln 2 split in two constants, exp(r) by a degree-6 polynomial, 2^n put into the
exponent bits. Written without calls or branches that LLVM cannot turn into selects, so a loop over it
becomes vector code, where libm's expf stays one scalar call per value (8x slower on a softmax row).
Accuracy: within 3 ulp of the exact exp over the float32 range; exactly 0 below -87.3
(where exp leaves the normal range), +inf above 88.7, NaN for NaN.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from pyggml.backend.cpu.jit import jit


@intrinsic
def float_bits(typingctx, x):
    """The bit pattern of a float32 as a uint32 (a register move)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def _int_of_width(builder, value, numba_type, width: int):
    """An integer value of Numba type numba_type as an LLVM integer of `width` bits: its low bits, or
    zero-extended."""
    if numba_type.bitwidth > width:
        return builder.trunc(value, ir.IntType(width))
    if numba_type.bitwidth < width:
        return builder.zext(value, ir.IntType(width))
    return value


@intrinsic
def bits_float(typingctx, x):
    """The float32 whose bit pattern is the low 32 bits of the integer x."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(_int_of_width(builder, args[0], x, 32), ir.FloatType())

    return types.float32(x), codegen


@intrinsic
def f16_to_f32(typingctx, bits):
    """float32 value of the IEEE half whose bits are `bits` (any integer type; the low 16 bits are used)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        half = builder.bitcast(_int_of_width(builder, args[0], bits, 16), ir.HalfType())
        return builder.fpext(half, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def bf16_to_f32(typingctx, bits):
    """float32 value of the bfloat16 whose bits are `bits` (the float32's upper half)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = _int_of_width(builder, args[0], bits, 32)
        return builder.bitcast(builder.shl(value, ir.Constant(ir.IntType(32), 16)), ir.FloatType())

    return types.float32(bits), codegen


@jit(inline="always")
def e8m0_half_to_f32(e):
    """Half the float32 value of an E8M0 exponent byte (2^(e - 128)), as ggml's GGML_E8M0_TO_FP32_HALF: MXFP4's
    scale, halved because its code book holds the E2M1 values doubled. e < 2 gives the subnormals 2^-128 and
    2^-127; 255 (E8M0's NaN) is read as 2^127, as ggml reads it."""
    e32 = np.uint32(e)
    if e32 < np.uint32(2):
        return bits_float(np.uint32(0x00200000) << e32)
    return bits_float((e32 - np.uint32(1)) << np.uint32(23))


LOG2E = np.float32(1.44269504088896341)
LN2_HI = np.float32(0.693359375)           # ln 2 in 10 significant bits: n * LN2_HI is exact
LN2_LO = np.float32(-2.12194440e-4)        # ln 2 - LN2_HI
ROUNDER = np.float32(12582912.0)           # 1.5 * 2^23: adding and subtracting it rounds to an integer
EXP_MAX = np.float32(88.72283)             # above: +inf
EXP_MIN = np.float32(-87.33654)            # below: 0 (2^n would leave the normal exponents)


@jit
def expf(x: np.float32) -> np.float32:
    """exp(x) in float32 (see the module docstring)."""
    # below EXP_MIN the result is replaced by 0: compute on 0 instead, since a clamped EXP_MIN would make
    # p·2^n subnormal, and subnormal arithmetic costs a microcode assist (a softmax row with a causal
    # mask, or GELU's tail, ran 4-15x slower)
    clamped = min(x if x >= EXP_MIN else np.float32(0), EXP_MAX)
    n = (clamped * LOG2E + ROUNDER) - ROUNDER
    r = (clamped - n * LN2_HI) - n * LN2_LO
    p = np.float32(1) + r * (np.float32(1) + r * (np.float32(0.5) + r * (np.float32(1 / 6) + r * (
        np.float32(1 / 24) + r * (np.float32(1 / 120) + r * np.float32(1 / 720))))))
    k = np.int32(n)
    half = k >> 1  # 2^n as 2^half * 2^(k - half): both stay normal at k = 128 and k = -126
    y = p * bits_float((half + 127) << 23) * bits_float((k - half + 127) << 23)
    if x < EXP_MIN:
        y = np.float32(0)
    if x > EXP_MAX:
        y = np.float32(np.inf)
    if x != x:
        y = x
    return y
