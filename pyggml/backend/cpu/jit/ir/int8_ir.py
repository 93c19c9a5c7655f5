"""The integer multiply-adds of the tile products (vnni_ir.py, vnni_k_ir.py), on the instructions this CPU has.

The tiles' vectors have LANES int32 lanes, one per row of an interleaved group: `dot_products` adds four u8·s8
products into each lane, `dpwssd` two int16·int16 products, `table_lookup` looks nibbles up in a 16-byte table.
With AVX-512 VNNI a group is 16 rows (a zmm register) and each is one instruction (vpdpbusd, vpdpwssds, vpshufb).
With AVX2 alone (AMD Zen 2 and 3, Intel's client cores before AVX-512 or AVX-VNNI) a group is 8 rows (a ymm
register), and a product goes as ggml's AVX2 kernels multiply: vpmaddubsw (u8·s8 pairs into int16, saturating),
then vpmaddwd against ones (int16 pairs into int32). The saturation never acts where the unsigned bytes stay
below 128 (|a·b + c·d| <= 127·128·2 < 2^15): the 2 .. 6-bit quants. Bytes that may reach 255 (Q8_0's quants +
128, a code book's values + 128) go as their low 7 bits and their high bit apart, each pair of products then
within an int16: the same integers as vpdpbusd in every case. Measured on AMD Zen 3 (one thread, 2048 x 2048 from
cache), 8-row groups against 16-row ones whose every vector took two ymm registers: Q4_K 64 tokens 82 -> 218
GOPS, Q6_K 64 -> 150-160, one token Q4_K 20 -> 50 GB/s, Q6_K 10-18 -> 37-47 GB/s (16 lanes left too few of the
16 registers: 323 of a Q4_K block's 943 instructions went to and from the stack).
"""

from __future__ import annotations

import functools

from llvmlite import ir

from pyggml.backend.cpu.jit.ir.block_ir import I32, I8

I16 = ir.IntType(16)
AVX512_VNNI, AVX2 = "avx512vnni", "avx2"


@functools.cache
def int8_instructions() -> str | None:
    """Which instructions multiply int8 on this CPU, as LLVM sees it: AVX512_VNNI, AVX2, or None (no tiles)."""
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features()
    if all(features.get(f, False) for f in ("avx512f", "avx512bw", "avx512vnni")):
        return AVX512_VNNI
    if all(features.get(f, False) for f in ("avx2", "fma", "f16c")):
        return AVX2
    return None


# int32 lanes of the tiles' vectors, the rows of an interleaved group: a zmm register's 16 with AVX-512 VNNI, a
# ymm register's 8 with AVX2 (as ggml's AVX2 repacked kernels take 8 rows)
LANES = 16 if int8_instructions() in (AVX512_VNNI, None) else 8
VI32 = ir.VectorType(I32, LANES)
VI8 = ir.VectorType(I8, 4 * LANES)
VI16 = ir.VectorType(I16, 2 * LANES)


def _call(builder, name: str, result, *args):
    fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(result, [a.type for a in args]))
    return builder.call(fn, list(args))


def dot_products(builder, acc, pairs, largest: int = 255, multiplier=None):
    """acc + Σ over pairs (unsigned VI8, signed VI8) of the sums of four u8·s8 products per int32 lane
    (one vpdpbusd a pair). `largest`: the largest unsigned byte the pairs hold. On AVX2 the int16 pair sums of
    as many vpmaddubsw as stay within an int16 (|s| <= 128: 32767 // (2·128·largest) of them, 8 for nibbles) are
    added before one vpmaddwd makes them int32, as ggml's AVX2 kernels add them; bytes above 127 go as two
    pairs, their low 7 bits and their high bit, one vpmaddwd each. `multiplier` (AVX2 only: `both_halves`):
    each lane's sums times its int16 scale, by those vpmaddwd themselves (ggml's mul_sum with the scales), where
    a sum times a scale otherwise takes a vpmulld of its own."""
    if int8_instructions() == AVX512_VNNI:
        assert multiplier is None, "a sub-block's scale multiplies int32 sums on AVX-512 VNNI"
        for unsigned, signed in pairs:
            acc = _call(builder, "llvm.x86.avx512.vpdpbusd.512", VI32, acc, unsigned, signed)
        return acc
    if largest > 127:
        low, high = ir.Constant(VI8, [0x7F] * 4 * LANES), ir.Constant(VI8, [0x80] * 4 * LANES)
        pairs = [(builder.and_(u, mask), s) for u, s in pairs for mask in (low, high)]
        largest = 128
    group = max(1, 32767 // (2 * 128 * largest))
    ones = ir.Constant(VI16, [1] * 2 * LANES) if multiplier is None else builder.bitcast(multiplier, VI16)
    for first in range(0, len(pairs), group):
        total = None
        for unsigned, signed in pairs[first:first + group]:
            pair_sums = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", VI16, unsigned, signed)
            total = pair_sums if total is None else builder.add(total, pair_sums)
        acc = builder.add(acc, _call(builder, "llvm.x86.avx2.pmadd.wd", VI32, total, ones))
    return acc


def both_halves(builder, scale):
    """An int32 lane's scale (-32768 .. 32767) in both its int16 halves: what `dot_products` multiplies by."""
    low = builder.and_(scale, ir.Constant(scale.type, [0xFFFF] * LANES))
    return builder.or_(low, builder.shl(scale, ir.Constant(scale.type, [16] * LANES)))


def dpwssd(builder, acc, a, b):
    """acc + the sums of two int16·int16 products per int32 lane (vpdpwssds: its saturation never acts on these
    sums, and LLVM splits the plain vpdpwssd into vpmaddwd and vpaddd, two instructions)."""
    a, b = builder.bitcast(a, VI16), builder.bitcast(b, VI16)
    if int8_instructions() == AVX512_VNNI:
        return _call(builder, "llvm.x86.avx512.vpdpwssds.512", VI32, acc, a, b)
    return builder.add(acc, _call(builder, "llvm.x86.avx2.pmadd.wd", VI32, a, b))


def table_lookup(builder, table, indices):
    """table's byte at each index (0 .. 15) of a vector (vpshufb: the table repeated in each 128-bit lane)."""
    if int8_instructions() == AVX512_VNNI:
        return _call(builder, "llvm.x86.avx512.pshuf.b.512", VI8, table, indices)
    return _call(builder, "llvm.x86.avx2.pshuf.b", VI8, table, indices)
