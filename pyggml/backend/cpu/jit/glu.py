"""Activations over float32 rows, as kernels/unary.py computes them: alone (UNARY) or gated (GLU, act(x) * gate).
GELU is ggml's F16-table GELU; GELU_ERF the exact one, through an erfc that vectorises."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import f16_bits_small
from pyggml.backend.cpu.jit.floatbits import expf

GELU, SILU, RELU, GELU_ERF = 0, 1, 2, 3  # the activations compiled here (the `kind` argument)
SQRT_2_INV = np.float32(0.70710678118654752440084436210484)


@jit(inline="always")
def gelu_erf(v: np.float32) -> np.float32:
    """0.5 v (1 + erf(v / sqrt 2)) = 0.5 v erfc(-v / sqrt 2), with Numerical Recipes' erfc (relative error
    1.2e-7): no cancellation for negative v, and a loop over it vectorises (libm's erff would not)."""
    z = abs(v) * SQRT_2_INV
    t = np.float32(1) / (np.float32(1) + np.float32(0.5) * z)
    poly = -z * z - np.float32(1.26551223) + t * (np.float32(1.00002368) + t * (np.float32(0.37409196) + t * (
        np.float32(0.09678418) + t * (np.float32(-0.18628806) + t * (np.float32(0.27886807) + t * (
            np.float32(-1.13520398) + t * (np.float32(1.48851587) + t * (np.float32(-0.82215223)
                                                                         + t * np.float32(0.17087277)))))))))
    # erfc below 1e-35 is taken as 0: the exact value would pass through subnormals, whose microcode assists
    # made whole GELU rows several times slower (the result, 0.5 v erfc, is below 1e-33 there)
    r = t * expf(max(poly, np.float32(-80))) if poly > np.float32(-80) else np.float32(0)
    return np.float32(0.5) * v * (r if v <= np.float32(0) else np.float32(2) - r)


@jit(inline="always")
def activation(v: np.float32, kind: np.intp, gelu_table: np.ndarray) -> np.float32:
    """GELU reads ggml's GELU table at v rounded to F16, except 0 at v <= -10 and v itself at v >= 10."""
    if kind == GELU:  # selects, not branches: the loop vectorises (with a gather for the table)
        act = gelu_table[f16_bits_small(v)]
        act = np.float32(0) if v <= np.float32(-10) else act
        return v if v >= np.float32(10) else act
    if kind == SILU:
        return v / (np.float32(1) + expf(-v))
    if kind == RELU:
        return v if v > np.float32(0) else np.float32(0)
    return gelu_erf(v)


@jit
def glu_rows(x: np.ndarray, gate: np.ndarray, out: np.ndarray, kind: np.intp, gelu_table: np.ndarray) -> None:
    """out = act(x) * gate for 2-D arrays of the same shape (rows may be strided, values contiguous)."""
    n = np.uintp(x.shape[1])
    for r in range(np.uintp(x.shape[0])):
        for i in range(n):
            out[r, i] = activation(x[r, i], kind, gelu_table) * gate[r, i]


@jit
def unary_rows(x: np.ndarray, out: np.ndarray, kind: np.intp, gelu_table: np.ndarray) -> None:
    """out = act(x) for 2-D arrays of the same shape (rows may be strided, values contiguous), or in place
    when out is x (a loop over one array: with two that alias, LLVM's runtime overlap check picks its scalar
    loop, 10x slower)."""
    n = np.uintp(x.shape[1])
    in_place = x.ctypes.data == out.ctypes.data
    for r in range(np.uintp(x.shape[0])):
        if in_place:
            for i in range(n):
                x[r, i] = activation(x[r, i], kind, gelu_table)
        else:
            for i in range(n):
                out[r, i] = activation(x[r, i], kind, gelu_table)
