"""Unary activations (Op.UNARY) and gated linear units (Op.GLU), in float32 like ggml's CPU.

ggml's CPU evaluates GELU and GELU_QUICK through a table indexed by the input rounded to F16
(GGML_GELU_FP16, GGML_GELU_QUICK_FP16); the same tables are built here, entry for entry: ggml fills them
(ggml_cpu_init) with the C library's tanhf and expf, and its compiler fuses GELU's 1 + a·x·x into one FMA.
(NumPy's float32 tanh, an ulp from glibc's tanhf on a fifth of the inputs, put 234 of the 37376 GELU entries
inside +-10 one F16 step off.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from functools import cache

import numpy as np

from pyggml.backend.cpu.jit import glu as jit_glu
from pyggml.backend.cpu.jit.gelu import gelu_table_rows
from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._common import as_f32, banded, overlap, rows_2d, split_rows, store, view
from pyggml.backend.cpu.kernels.elementwise import unary_types_ok
from pyggml.core.tensor import GluOp, Op, Tensor, UnaryOp
from pyggml.core.types import GGMLType as G

GELU_COEF_A = np.float32(0.044715)
GELU_QUICK_COEF = np.float32(-1.702)
SQRT_2_OVER_PI = np.float32(0.79788456080286535587989211986876)
SQRT_2_INV = 0.70710678118654752440084436210484


@cache
def _libm_float(name: str):
    """The C library's float32 function `name` (tanhf, expf) over an array, as ggml calls it; None where no C math
    library is found (then NumPy's float64 function rounded to float32 stands in)."""
    path = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(path), name, None) if path else None
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda x: np.array([fn(v) for v in x.ravel().tolist()], np.float32).reshape(x.shape)


def _float_fn(name: str, x: np.ndarray) -> np.ndarray:
    libm = _libm_float(name + "f")
    if libm is not None:
        return libm(x)
    with np.errstate(over="ignore"):
        return getattr(np, name)(x.astype(np.float64)).astype(np.float32)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_f32 over float32 x (the table's entries): tanhf of S·x·(1 + a·x·x), that sum one FMA (exact in
    float64, rounded once), in float32."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        fused = ((GELU_COEF_A * x).astype(np.float64) * x + 1.0).astype(np.float32)
        inner = SQRT_2_OVER_PI * x * fused
        return np.float32(0.5) * x * (np.float32(1) + _float_fn("tanh", inner))


def gelu_quick_exact(x: np.ndarray) -> np.ndarray:
    """ggml_gelu_quick_f32 over float32 x: x * (1 / (1 + expf(-1.702 x)))."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return x * (np.float32(1) / (np.float32(1) + _float_fn("exp", GELU_QUICK_COEF * x)))


@cache
def f16_table(fn) -> np.ndarray:
    """fn over every F16 bit pattern, rounded to F16 and widened back: ggml's ggml_table_*_f16."""
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return fn(x).astype(np.float16).astype(np.float32)


def by_f16_table(fn, x: np.ndarray) -> np.ndarray:
    return np.take(f16_table(fn), x.astype(np.float16).view(np.uint16))


def gelu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: the table, except 0 below -10 and x above 10."""
    y = by_f16_table(gelu_tanh, x)
    if x.size and x.max() >= 10:  # the extremes are rare: test before a masked pass over every value
        np.copyto(y, x, where=x >= 10)
    if x.size and x.min() <= -10:
        np.copyto(y, np.float32(0), where=x <= -10)
    return y


def gelu_quick(x: np.ndarray) -> np.ndarray:
    return by_f16_table(gelu_quick_exact, x)


def erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function to a relative 1.2e-7 (Numerical Recipes' Chebyshev fit), in float64.

    NumPy has no erf; this keeps 1 + erf(x) = erfc(-x) accurate relative to itself for every x.
    """
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    r = t * np.exp(poly)
    return np.where(x >= 0, r, 2.0 - r)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """0.5 x (1 + erf(x / sqrt 2))."""
    return (0.5 * x * erfc(-x * SQRT_2_INV)).astype(np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    """x / (1 + exp(-x)), computed in one temporary array."""
    with np.errstate(over="ignore"):
        y = np.negative(x)
        np.exp(y, out=y)
        y += np.float32(1)
        return np.divide(x, y, out=y)


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """1 / (1 + exp(-x)) in float32's steps (negate, exp, + 1, 1 / that), into `out` when given."""
    out = np.negative(x, out=out)
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += np.float32(1)
    return np.divide(np.float32(1), out, out=out)


def hardsigmoid(x: np.ndarray) -> np.ndarray:
    return np.minimum(np.float32(1), np.maximum(np.float32(0), (x + np.float32(3)) / np.float32(6)))


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C roundf (halves away from zero), unlike np.round's halves to even."""
    r = np.trunc(x)
    return np.where(np.abs(x - r) >= 0.5, r + np.sign(x), r)


def softplus(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log(np.float32(1) + np.exp(np.minimum(x, 20))))


def _exp(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.exp(x)


def _expm1(x: np.ndarray) -> np.ndarray:
    """ggml computes expf(x) - 1, not expm1f."""
    with np.errstate(over="ignore"):
        return np.exp(x) - np.float32(1)


UNARY_FUNCS = {
    UnaryOp.ABS: np.abs,
    UnaryOp.SGN: np.sign,
    UnaryOp.NEG: np.negative,
    UnaryOp.STEP: lambda x: (x > 0).astype(np.float32),
    UnaryOp.TANH: np.tanh,
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    UnaryOp.RELU: lambda x: np.where(x > 0, x, np.float32(0)),
    UnaryOp.SIGMOID: sigmoid,
    UnaryOp.GELU: gelu,
    UnaryOp.GELU_ERF: gelu_erf,
    UnaryOp.GELU_QUICK: gelu_quick,
    UnaryOp.SILU: silu,
    UnaryOp.HARDSWISH: lambda x: x * hardsigmoid(x),
    UnaryOp.HARDSIGMOID: hardsigmoid,
    UnaryOp.EXP: _exp,
    UnaryOp.EXPM1: _expm1,
    UnaryOp.SOFTPLUS: softplus,
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: round_half_away,
    UnaryOp.TRUNC: np.trunc,
}


def xielu(x: np.ndarray, alpha_n: float, alpha_p: float, beta: float, eps: float) -> np.ndarray:
    """ggml's op_xielu with the coefficients its builder stored."""
    alpha_n, alpha_p, beta, eps = (np.float32(v) for v in (alpha_n, alpha_p, beta, eps))
    negative = (np.expm1(np.minimum(x, eps)) - x) * alpha_n + beta * x
    return np.where(x > 0, alpha_p * x * x + beta * x, negative)


# Implemented in ggml's ops.cpp for F32 -> F32 and F16 -> F16 only (the rest use the generic unary template).
F32_F16_ONLY = frozenset({UnaryOp.GELU, UnaryOp.GELU_ERF, UnaryOp.GELU_QUICK, UnaryOp.SILU})


def _unary_supported(t: Tensor) -> bool:
    if t.op_params[0] not in UNARY_FUNCS and t.op_params[0] != UnaryOp.XIELU:
        return False
    if t.op_params[0] in F32_F16_ONLY:
        return t.type == t.src[0].type and t.type in (G.F32, G.F16)
    return unary_types_ok(t)


NO_TABLE = np.zeros(1, np.float32)


def gelu_table_for(kind: int) -> np.ndarray:
    """The GELU table the compiled activations read for GELU, a stand-in for the others: making the table (65536
    calls of tanhf) took 0.05 s of a SwiGLU model's first step."""
    return f16_table(gelu_tanh) if kind == jit_glu.GELU else NO_TABLE


COMPILED_UNARY = {UnaryOp.GELU: jit_glu.GELU, UnaryOp.SILU: jit_glu.SILU, UnaryOp.RELU: jit_glu.RELU,
                  UnaryOp.GELU_ERF: jit_glu.GELU_ERF}


BOUND_NUMPY_UNARY = {UnaryOp.SIGMOID: sigmoid, UnaryOp.TANH: np.tanh}  # fn(x, out)


def _bind_unary(dst: Tensor):
    """The compiled GELU / GELU_ERF / SILU / RELU for F32; SIGMOID and TANH as NumPy's in place on views bound
    once (an LSTM step's gates: a few hundred values, where looking up the views took 4x the function)."""
    kind = COMPILED_UNARY.get(dst.unary_op)
    numpy_fn = BOUND_NUMPY_UNARY.get(dst.unary_op)
    if (kind is None and numpy_fn is None) or dst.type != G.F32 or dst.src[0].type != G.F32:
        return None
    x, out = rows_2d(view(dst.src[0])), rows_2d(view(dst))
    if x is None or out is None or x.shape != out.shape:
        return None
    if numpy_fn is not None:
        if overlap(out, x):
            return None
        return functools.partial(numpy_fn, x, out)
    if kind == jit_glu.GELU and not overlap(out, x):  # the two-pass GELU (in place too)
        table = gelu_table_for(kind)
        return banded(x.shape[0], x.size, lambda lo, hi: gelu_table_rows(x[lo:hi], out[lo:hi], table))
    table, copy = gelu_table_for(kind), overlap(out, x)  # planned memory partly over the input: read a copy

    def call() -> None:
        xs = x.copy() if copy else x
        split_rows(x.shape[0], x.size, lambda lo, hi: jit_glu.unary_rows(xs[lo:hi], out[lo:hi], kind, table))
    return call


@kernel(Op.UNARY, supports=_unary_supported, bind=_bind_unary)
def unary(dst: Tensor) -> None:
    x = as_f32(dst.src[0])
    if dst.unary_op == UnaryOp.XIELU:
        store(dst, xielu(x, *(dst.op_params_f32(i) for i in range(1, 5))))
    else:
        store(dst, UNARY_FUNCS[dst.unary_op](x))


def _swiglu_oai(x: np.ndarray, g: np.ndarray, alpha: float, limit: float) -> np.ndarray:
    x = np.minimum(x, np.float32(limit))
    g = np.clip(g, np.float32(-limit), np.float32(limit))
    with np.errstate(over="ignore"):
        return x / (np.float32(1) + np.exp(np.float32(alpha) * -x)) * (g + np.float32(1))


GLU_ACTIVATIONS = {
    GluOp.REGLU: UNARY_FUNCS[UnaryOp.RELU],
    GluOp.GEGLU: gelu,
    GluOp.SWIGLU: silu,
    GluOp.GEGLU_ERF: gelu_erf,
    GluOp.GEGLU_QUICK: gelu_quick,
}


def _glu_supported(t: Tensor) -> bool:
    if t.src[1] is not None and t.src[1].type != t.src[0].type:
        return False
    if t.op_params[0] == GluOp.SWIGLU_OAI:
        return t.type == t.src[0].type == G.F32
    return t.op_params[0] in GLU_ACTIVATIONS and t.type == t.src[0].type and t.type in (G.F32, G.F16)


def glu_operands(dst: Tensor, values):
    """(x, gate) of a GLU node: src0 and src1, or the two halves of src0's rows (swapped if asked).

    `values(t)` reads a source as float32 in any array library that slices like NumPy (the torch
    backend shares this).
    """
    a = values(dst.src[0])
    if dst.src[1] is not None:
        return a, values(dst.src[1])
    n = dst.ne[0]
    x, g = a[..., :n], a[..., n: 2 * n]
    return (g, x) if dst.op_params[1] else (x, g)


COMPILED_GLU = {GluOp.GEGLU: jit_glu.GELU, GluOp.SWIGLU: jit_glu.SILU, GluOp.REGLU: jit_glu.RELU,
                GluOp.GEGLU_ERF: jit_glu.GELU_ERF}


def _bind_glu(dst: Tensor):
    """The compiled GEGLU / GEGLU_ERF / SWIGLU / REGLU for F32 (split or not, swapped or not)."""
    kind = COMPILED_GLU.get(dst.glu_op)
    if kind is None or dst.type != G.F32:
        return None
    x, g = (rows_2d(v) for v in glu_operands(dst, view))
    out = rows_2d(view(dst))
    if x is None or g is None or out is None:
        return None
    table = gelu_table_for(kind)
    copy = np.may_share_memory(out, x) or np.may_share_memory(out, g)  # planned memory: read copies, same results

    def call() -> None:
        xs, gs = (x.copy(), g.copy()) if copy else (x, g)
        split_rows(x.shape[0], x.size, lambda lo, hi: jit_glu.glu_rows(xs[lo:hi], gs[lo:hi], out[lo:hi], kind, table))
    return call


@kernel(Op.GLU, supports=_glu_supported, bind=_bind_glu)
def glu(dst: Tensor) -> None:
    """act(x) * gate, with x and gate the two halves of src0's rows or src0 and src1."""
    x, g = glu_operands(dst, as_f32)
    if dst.glu_op == GluOp.SWIGLU_OAI:
        store(dst, _swiglu_oai(x, g, dst.op_params_f32(2), dst.op_params_f32(3)))
    elif dst.type == G.F32:  # straight into dst's memory (GLU is never in place, so no source is overwritten)
        np.multiply(GLU_ACTIVATIONS[dst.glu_op](x), g, out=view(dst))
    else:
        store(dst, GLU_ACTIVATIONS[dst.glu_op](x) * g)
