"""Q4_K and Q6_K prompt products on AMX (Intel's tile unit: one TDPBSSD multiplies a 16 x 32 tile of signed bytes
by a 32 x 16 one into 16 x 16 int32 sums, 8192 products where a vpdpbusd makes 64).

A tile of 16 tokens and a 16-row group of weights, block by block: each sub-block's products come out of the tile
unit as one row of 16 int32 per token, the 16 rows in the lanes as in the VNNI tiles (ir/vnni_k_ir.py), and go
through the same integer steps from there, then the same fused multiply-adds into each token's float sums, so
every output is the VNNI tiles' to the last bit:
- Q4_K (8 sub-blocks of 32): the weights unpacked to nibble - 8 (signed, TDPBSSD), so a sub-block's sums are
  already Σ (nibble - 8)·a, an int16: one vpdpwssd multiplies each by its scale, then the bias is put back and
  the minimums' term made on pairs, as the VNNI tiles do;
- Q6_K (16 sub-blocks of 16): the weights unpacked to their 6 bits (unsigned, TDPBSUD), the sums times the scale
  by vpmulld, the zero point -32·Σ_k sc_k·bsum_k by vpdpwssd on pairs of scales and of the sums of 16.
The row group's quants are unpacked beforehand (jit/repack.py's `unpack_group`: per block and sub-block, the
interleaved layout's vectors as bytes), the tokens' quants laid out per 16 tokens (per block and 32 values, the
16 tokens' 32 bytes in turn).

Tiles (tile_config): four for the sums (16 tokens x 16 int32) taken in turn, two for the activations (16 tokens x
a sub-block's bytes), two for the weights (a sub-block's values / 4 rows of 64 bytes). The next block's products
are issued between the tokens' vector steps, into the other of two buffers of sums. A process must be granted
the tile data state first (`amx_usable`).

`tile_amx_q4_K` and `tile_amx_q6_K` are intrinsics (w, g, nb, wu, xa, xs, xw, t0, y, yo, ys, sums, config): the
group at byte g of w (its scales, minimums, fp16 d and dmin) with its unpacked quants wu (nb·4096 bytes), the
tokens t0 .. t0 + 15 (t0 a multiple of 16) of xa (their quants laid out as above), xs (their Q8_K scales) and xw
(the WORDS of their Q8_K blocks' words), the last two per 16 tokens and block, token after token (jit/repack.py's
tiles_of_tokens); y[yo + t·ys + r] = token t's row r. sums: 8192 int32 of scratch for the tile unit's sums;
config: tile_config(qtype).
"""

from __future__ import annotations

import ctypes
import functools
import os

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pyggml.backend.cpu.jit.ir.block_ir import F32, I32, I64, splat
from pyggml.backend.cpu.jit.ir.vnni_ir import ROWS, VF32, VI32, load_at, typed
from pyggml.backend.cpu.jit.ir.vnni_k_ir import (PAIRS_OF_16, PAIRS_OF_32, Q4_K, Q6_K, KLayout, _block_into_row, _i32,
                                                 _int16_pairs, _q6_k_scale, add_q4_k_pairs, dpwssd, pairs_dot,
                                                 q4_k_pairs)

TOKENS = 16                                   # tokens a tile takes: the tile unit's 16 rows
I8 = ir.IntType(8)
P8 = I8.as_pointer()
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 0x1023, 18


SUMS, ACTIVATIONS, WEIGHTS = (0, 1, 2, 3), (4, 5), (6, 7)   # the tile registers of each operand, taken in turn
SUB_BLOCKS = {Q4_K: 8, Q6_K: 16}                           # a block's sub-blocks: 32 values each, or 16
WORDS = {Q4_K: (PAIRS_OF_32, 4), Q6_K: (PAIRS_OF_16, 8)}   # the Q8_K words the vector steps read: first, how many


def tile_config(qtype: int) -> np.ndarray:
    """ldtilecfg's 64 bytes for a type: palette 1; the sums' tiles 16 rows x 64 bytes, the activations' 16 x (a
    sub-block's values), the weights' (its values / 4) x 64."""
    size = 256 // SUB_BLOCKS[qtype]
    config = np.zeros(64, np.uint8)
    config[0] = 1
    for tiles, (rows, colsb) in ((SUMS, (16, 64)), (ACTIVATIONS, (16, size)), (WEIGHTS, (size // 4, 64))):
        for tile in tiles:
            config[16 + 2 * tile] = colsb
            config[48 + tile] = rows
    return config


@functools.cache
def amx_usable() -> bool:
    """Whether the CPU has AMX-INT8 (as LLVM sees it) and Linux grants this process the tile data state (asked once:
    without it the first tile instruction kills the process); PYGGML_AMX=0 in the environment says no (the VNNI
    tiles alone, e.g. to compare with a peer that cannot use the unit)."""
    import llvmlite.binding as llvm

    if os.environ.get("PYGGML_AMX", "1") == "0" or not llvm.get_host_cpu_features().get("amx-int8", False):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0   # 158: arch_prctl on x86-64
    except (OSError, AttributeError):
        return False


def _call(builder, name: str, args, argtys) -> None:
    fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ir.VoidType(), argtys))
    builder.call(fn, args)


def _tile(n: int):
    return ir.Constant(I8, n)


def _amx_tile(qtype: int):
    def typer(typingctx, w, g, nb, wu, xa, xs, xw, t0, y, yo, ys, sums, config):
        arrays = ((w, types.uint8), (wu, types.uint8), (xa, types.uint8), (xs, types.float32), (xw, types.int32),
                  (y, types.float32), (sums, types.int32), (config, types.uint8))
        if not typed(arrays, (g, nb, t0, yo, ys)):
            return None

        def codegen(context, builder, signature, args):
            ptr = {i: context.make_array(signature.args[i])(context, builder, args[i]).data
                   for i in (0, 3, 4, 5, 6, 8, 11, 12)}
            g_, nb_, t0_, yo_, ys_ = (context.cast(builder, args[i], signature.args[i], types.uintp)
                                      for i in (1, 2, 7, 9, 10))
            _call(builder, "llvm.x86.ldtilecfg", [builder.bitcast(ptr[12], P8)], [P8])
            _tokens(builder, qtype, ptr, g_, nb_, t0_, yo_, ys_)
            _call(builder, "llvm.x86.tilerelease", [], [])
            return context.get_dummy_value()

        return types.none(w, g, nb, wu, xa, xs, xw, t0, y, yo, ys, sums, config), codegen

    return intrinsic(typer)


def _sub_block_sums(builder, qtype: int, ptr, nb_, t0_, b, j: int, buffer) -> None:
    """The tile unit's int32 sums of sub-block j of block b, 16 tokens x 16 rows, stored at sums + buffer + 256·j
    (int32 elements); the sums' tile is one of four in turn, so that the unit's latencies overlap. The
    activations' 16 x 32 bytes of each 32 values (a Q6_K sub-block: half of them) at xa, the weights' at wu."""
    load = [I8, P8, I64]
    c, a, w = SUMS[j % 4], ACTIVATIONS[j % 2], WEIGHTS[j % 2]
    size = 256 // SUB_BLOCKS[qtype]
    tile = builder.udiv(t0_, ir.Constant(I64, TOKENS))
    chunk = builder.add(builder.mul(builder.add(builder.mul(tile, nb_), b), ir.Constant(I64, 8)),
                        ir.Constant(I64, size * j // 32))
    at = builder.add(builder.mul(chunk, ir.Constant(I64, 512)), ir.Constant(I64, size * j % 32))
    sub = builder.add(builder.mul(b, ir.Constant(I64, SUB_BLOCKS[qtype])), ir.Constant(I64, j))
    _call(builder, "llvm.x86.tilezero", [_tile(c)], [I8])
    _call(builder, "llvm.x86.tileloadd64", [_tile(a), builder.gep(ptr[4], [at]), ir.Constant(I64, 32)], load)
    _call(builder, "llvm.x86.tileloadd64", [_tile(w), builder.gep(ptr[3], [builder.mul(sub, ir.Constant(
        I64, 16 * size))]), ir.Constant(I64, 64)], load)
    product = "llvm.x86.tdpbssd" if qtype == Q4_K else "llvm.x86.tdpbsud"   # Q4_K's nibble - 8 signed, Q6_K's q
    _call(builder, product, [_tile(c), _tile(a), _tile(w)], [I8, I8, I8])
    out = builder.gep(ptr[11], [builder.add(buffer, ir.Constant(I64, 256 * j))])
    _call(builder, "llvm.x86.tilestored64", [_tile(c), builder.bitcast(out, P8), ir.Constant(I64, 64)], load)


def _q4_k_steps(builder, layout, ptr, block):
    """Per block: (the token step: (sums of sub-block j, word i) -> (total, minimums' term), dmin)."""
    scales, mins = layout.scales_mins_k4(builder, ptr[0], block)
    low16 = [builder.and_(scale, _i32(builder, 0xFFFF)) for scale in scales]
    pairs = q4_k_pairs(builder, scales, mins)

    def step(sums, word):
        total = _i32(builder, 0)
        for j in range(8):
            total = dpwssd(builder, total, sums(j), low16[j])                # Σ (nibble - 8)·a: an int16
        return add_q4_k_pairs(builder, pairs, total, word)
    return step, layout.header(builder, ptr[0], block, layout.dmin_at)


def _q6_k_steps(builder, layout, ptr, block):
    """Q6_K: Σ_k sc_k·s_k by vpmulld (a sub-block's 16 products of 6-bit quants pass an int16), then its zero point,
    -32·Σ_k sc_k·bsum_k, by vpdpwssd on pairs of scales and of the token's sums of 16."""
    words = layout.q6_k_scale_words(builder, ptr[0], block)
    scales = [_q6_k_scale(builder, words, k) for k in range(16)]
    zero_pairs = _int16_pairs(builder, [builder.mul(s, _i32(builder, -32)) for s in scales], signed=True)

    def step(sums, word):
        total = _i32(builder, 0)
        for k in range(16):
            total = builder.add(total, builder.mul(sums(k), scales[k]))
        return pairs_dot(builder, total, zero_pairs, word), None
    return step, None


def _tokens(builder, qtype: int, ptr, g_, nb_, t0_, yo_, ys_) -> None:
    """Block by block: the next block's products on the tile unit, a sub-block after each few tokens' vector steps
    (into the other of two buffers of sums), so that the two overlap; each token's float sums kept in y itself (16
    accumulators held in registers over the blocks crowded out the rest)."""
    layout, subs = KLayout(qtype), SUB_BLOCKS[qtype]
    rows = []
    for t in range(TOKENS):
        out = builder.add(yo_, builder.mul(builder.add(t0_, ir.Constant(I64, t)), ys_))
        rows.append(builder.bitcast(builder.gep(ptr[8], [out]), VF32.as_pointer()))
        builder.store(ir.Constant(VF32, [0.0] * ROWS), rows[t], align=4)
    for j in range(subs):
        _sub_block_sums(builder, qtype, ptr, nb_, t0_, ir.Constant(I64, 0), j, ir.Constant(I64, 0))
    first = builder.mul(builder.udiv(t0_, ir.Constant(I64, TOKENS)), nb_)   # the tile's first block in xs, xw
    with cgutils.for_range(builder, nb_) as loop:
        b = loop.index
        buffer = builder.mul(builder.and_(b, ir.Constant(I64, 1)), ir.Constant(I64, 256 * subs))
        after = builder.add(b, ir.Constant(I64, 1))
        following = builder.select(builder.icmp_unsigned("<", after, nb_), after, b)
        other = builder.mul(builder.and_(after, ir.Constant(I64, 1)), ir.Constant(I64, 256 * subs))
        block = builder.add(g_, builder.mul(b, ir.Constant(I64, layout.group_block)))
        d = layout.header(builder, ptr[0], block, layout.d_at)
        step, dmin = (_q4_k_steps if qtype == Q4_K else _q6_k_steps)(builder, layout, ptr, block)
        for t in range(TOKENS):
            at = builder.add(builder.mul(builder.add(first, b), ir.Constant(I64, TOKENS)), ir.Constant(I64, t))
            words = builder.mul(at, ir.Constant(I64, WORDS[qtype][1]))

            def word(i: int, words=words):
                return splat(builder, load_at(builder, ptr[6], builder.add(words, ir.Constant(I64, i)), I32, 4), VI32)

            def sums(j: int, t=t):
                return load_at(builder, ptr[11], builder.add(buffer, ir.Constant(I64, 256 * j + 16 * t)), VI32, 4)

            total, term = step(sums, word)
            dx = splat(builder, load_at(builder, ptr[5], at, F32, 4), VF32)
            minimums = None if term is None else (builder.sitofp(term, VF32), dmin)
            builder.store(_block_into_row(builder, builder.load(rows[t], align=4), builder.sitofp(total, VF32), d, dx,
                                          minimums), rows[t], align=4)
            for j in range(t * subs // TOKENS, (t + 1) * subs // TOKENS):   # the next block's, spread over the tokens
                _sub_block_sums(builder, qtype, ptr, nb_, t0_, following, j, other)


tile_amx_q4_K, tile_amx_q6_K = _amx_tile(Q4_K), _amx_tile(Q6_K)
