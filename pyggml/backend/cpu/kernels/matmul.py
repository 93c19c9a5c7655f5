"""MUL_MAT, MUL_MAT_ID and OUT_PROD on the CPU: src0 as float32 (dequantized), then one BLAS matmul per op.

ggml converts src1 to src0's vec_dot type (F16, Q8_0, Q8_K) before its dot products; here both sides
are float32, which is at least as accurate (within ggml's 5e-4 NMSE for these ops).
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._common import FLOAT_TYPES, as_f32, blas_threads, repacked_values, view
from pyggml.backend.cpu.kernels._dequant_cache import DEQUANT_CACHE, dequantizable
from pyggml.core import types as T
from pyggml.core.tensor import Op, Tensor
from pyggml.errors import OutOfBoundsError


def src0_f32(t: Tensor) -> np.ndarray:
    """src0's values as float32, shape ne[::-1]: a view for F32 and repacked weights, else a (cached) dequantized copy."""
    if t.type == T.GGMLType.F32:
        return view(t)
    repacked = repacked_values(t)
    return repacked if repacked is not None else DEQUANT_CACHE.get(t)


def _blasable(m: np.ndarray) -> np.ndarray:
    """A stack of matrices whose rows are contiguous, so np.matmul hands them to BLAS (copy only if not)."""
    return m if m.strides[-1] == m.itemsize else np.ascontiguousarray(m)


def _out_view(dst: Tensor, shape) -> np.ndarray:
    """dst's memory reshaped without copying (raises rather than silently writing into a copy)."""
    return np.reshape(view(dst), shape, copy=False)


def _supports_product(dst: Tensor) -> bool:
    a, b = dst.src[0], dst.src[1]
    return dst.type == T.GGMLType.F32 and b.type in FLOAT_TYPES and dequantizable(a.type)


def _broadcast_split(dst: Tensor, wa: np.ndarray, wb: np.ndarray):
    """Split dims 3, 2 into (a3, r3, a2, r2) so that a's matrix i2 // r2, i3 // r3 broadcasts onto b's i2, i3."""
    a, b = dst.src[0], dst.src[1]
    split = (a.ne[3], b.ne[3] // a.ne[3], a.ne[2], b.ne[2] // a.ne[2])
    a_split = (split[0], 1, split[2], 1)
    return wa.reshape(*a_split, *wa.shape[2:]), wb.reshape(*split, *wb.shape[2:]), split


SMALL_BATCH = 32            # below this many rows of b a product is memory-bound, and ...
SMALL_MATRIX = 256 * 1024  # ... below this many elements of a, threads only add synchronisation


@kernel(Op.MUL_MAT, supports=_supports_product)
def mul_mat(dst: Tensor) -> None:
    """dst[.., i1, i0] = b[.., i1, :]·a[.., i0, :], one BLAS call per matrix pair."""
    a, b = dst.src[0], dst.src[1]
    wa, wb, split = _broadcast_split(dst, _blasable(src0_f32(a)), _blasable(as_f32(b)))
    out = _out_view(dst, (*split, b.ne[1], a.ne[1]))
    if b.nrows < SMALL_BATCH and a.ne[0] * a.ne[1] < SMALL_MATRIX:
        with blas_threads(1):
            np.matmul(wb, wa.swapaxes(-1, -2), out=out)
    else:
        np.matmul(wb, wa.swapaxes(-1, -2), out=out)


@kernel(Op.OUT_PROD, supports=_supports_product)
def out_prod(dst: Tensor) -> None:
    """dst[.., i1, i0] = sum_k a[.., k, i0]·b[.., k, i1], with mul_mat's broadcasting of a over dims 2, 3."""
    a, b = dst.src[0], dst.src[1]
    wa, wb, split = _broadcast_split(dst, src0_f32(a), as_f32(b))
    np.matmul(wb.swapaxes(-1, -2), wa, out=_out_view(dst, (*split, b.ne[0], a.ne[0])))


def _supports_mul_mat_id(dst: Tensor) -> bool:
    return _supports_product(dst) and dst.src[2].type == T.GGMLType.I32


@kernel(Op.MUL_MAT_ID, supports=_supports_mul_mat_id)
def mul_mat_id(dst: Tensor) -> None:
    """dst[t, e, :] = as[ids[t, e]] · b[t, e % b.ne1, :]: one gathered matmul per expert actually used."""
    as_, b, ids = dst.src[0], dst.src[1], dst.src[2]
    experts = src0_f32(as_)[0]                  # (n_expert, rows, k)
    rows = as_f32(b)[0]                          # (n_tokens, n_b, k)
    chosen = view(ids)[0, 0]                     # (n_tokens, n_used)
    out = view(dst)[0]                           # (n_tokens, n_used, rows)
    n_expert = as_.ne[2]
    if chosen.size and (chosen.min() < 0 or chosen.max() >= n_expert):
        raise OutOfBoundsError(f"mul_mat_id {dst.name!r}: ids {ids.name!r} hold experts outside [0, {n_expert})")
    slot_of_b = np.arange(ids.ne[0]) % b.ne[1]
    for expert in np.unique(chosen):
        tok, slot = np.nonzero(chosen == expert)
        out[tok, slot] = rows[tok, slot_of_b[slot]] @ experts[expert].T
