"""IEEE half precision inside compiled kernels: F16 values travel as their uint16 bit patterns.

Numba has no float16 on the CPU, so reading goes through LLVM's own conversion (floatbits.f16_to_f32: one
vcvtph2ps, and loops over it vectorise), and writing through the bit arithmetic of a round-to-nearest-even
conversion (what F16C's vcvtps2ph, NumPy's astype(float16) and ggml's CPU backend do).
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import overload

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.floatbits import f16_to_f32, float_bits

def widen(x):
    """A value as float32 inside a compiled kernel: F16 bits (uint16) converted, float32 as it is."""
    raise NotImplementedError("widen is for compiled kernels")  # pragma: no cover (Numba uses the overload)


@overload(widen)
def _widen(x):
    if isinstance(x, types.Integer):
        return lambda x: f16_to_f32(x)
    return lambda x: x


@jit
def f16_bits(x: np.float32) -> np.uint16:
    """The F16 bit pattern nearest to x (ties to even)."""
    bits = float_bits(x)
    sign = np.uint32((bits >> np.uint32(16)) & np.uint32(0x8000))
    exp = bits & np.uint32(0x7F800000)
    if exp >= np.uint32(0x47800000):                     # overflow, inf or NaN
        sig = bits & np.uint32(0x007FFFFF)
        if exp == np.uint32(0x7F800000) and sig != np.uint32(0):
            half = np.uint32(0x7C00) + (sig >> np.uint32(13))
            if half == np.uint32(0x7C00):                # a NaN whose top payload bits are 0 stays a NaN
                half += np.uint32(1)
            return np.uint16(sign + half)
        return np.uint16(sign | np.uint32(0x7C00))
    if exp <= np.uint32(0x38000000):                     # subnormal half or zero
        if exp < np.uint32(0x33000000):
            return np.uint16(sign)
        shift = np.uint32(113) - (exp >> np.uint32(23))
        sig = (np.uint32(0x00800000) + (bits & np.uint32(0x007FFFFF))) >> shift
        if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000) or (bits & np.uint32(0x7FF)) != np.uint32(0):
            sig += np.uint32(0x1000)
        return np.uint16(sign + (sig >> np.uint32(13)))
    sig = bits & np.uint32(0x007FFFFF)
    if (sig & np.uint32(0x3FFF)) != np.uint32(0x1000):
        sig += np.uint32(0x1000)
    return np.uint16(sign + ((exp - np.uint32(0x38000000)) >> np.uint32(13)) + (sig >> np.uint32(13)))


@jit(inline="always")
def f16_bits_small(x: np.float32) -> np.uint32:
    """f16_bits for |x| < 65504 (ties to even; NaN gives a quiet NaN), without branches, so that a loop over
    it vectorises (ggml's GELU table lookup: 1.6x faster). Larger |x| give some index below 65536, which
    callers replace."""
    bits = float_bits(x)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    normal = (magnitude + np.uint32(0x0FFF) + ((magnitude >> np.uint32(13)) & np.uint32(1))
              - np.uint32(0x38000000)) >> np.uint32(13)
    scaled = abs(x) * np.float32(16777216.0)  # a subnormal half's bits: |x| / 2^-24, rounded to even
    subnormal = np.uint32(np.int32((scaled + np.float32(12582912.0)) - np.float32(12582912.0)))
    half = subnormal if magnitude < np.uint32(0x38800000) else normal
    half = np.uint32(0x7E00) if x != x else half
    return (half | ((bits >> np.uint32(16)) & np.uint32(0x8000))) & np.uint32(0xFFFF)


@jit(inline="always")
def _f32_to_f16_run(x: np.ndarray, first, out: np.ndarray, out_first, n) -> None:
    """out[out_first:][:n] (uint16 bit patterns) = x[first:][:n] (float32) rounded to F16 (1-D arrays): one loop that
    vectorises over the values below 65504 in magnitude, then f16_bits for the rare others (and NaN)."""
    rare = 0
    for i in range(n):
        v = x[first + i]
        out[out_first + i] = np.uint16(f16_bits_small(v))
        rare += 0 if abs(v) < np.float32(65504) else 1
    if rare:
        for i in range(n):
            if not abs(x[first + i]) < np.float32(65504):
                out[out_first + i] = f16_bits(x[first + i])


@jit
def f32_to_f16(x: np.ndarray, out: np.ndarray) -> None:
    """out (uint16 bit patterns) = x (float32) rounded to F16, element by element (1-D, same length). NumPy's cast
    converts one value at a time (2.6 ns each: 25 ms per layer of an encoder's K and V)."""
    _f32_to_f16_run(x, np.uintp(0), out, np.uintp(0), np.uintp(x.shape[0]))


@jit
def f32_to_f16_rows(x: np.ndarray, layout: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
    """Rows [lo, hi) of a 4-D float32 array rounded to F16 into those rows of out (its contiguous copy as uint16
    bit patterns, 1-D). x is the array's memory as one 1-D array; layout holds (ne2, ne1, ne0, and the strides of
    its first three dims in elements), its rows' values contiguous. A copy to F16 of a permuted view (K and V for
    flash attention) reads it in place, split over threads by rows."""
    ne2, ne1, n = np.uintp(layout[0]), np.uintp(layout[1]), np.uintp(layout[2])
    for r in range(np.uintp(lo), np.uintp(hi)):
        plane = r // ne1
        first = ((plane // ne2) * np.uintp(layout[3]) + (plane % ne2) * np.uintp(layout[4])
                 + (r % ne1) * np.uintp(layout[5]))
        _f32_to_f16_run(x, first, out, r * n, n)


@jit
def f16_to_f32_values(x: np.ndarray, out: np.ndarray) -> None:
    """out (float32) = x (F16 bit patterns as uint16), 1-D, same length: vcvtph2ps over the loop."""
    for i in range(np.uintp(x.shape[0])):
        out[i] = f16_to_f32(x[i])
