"""Normalisation kernels, F32, with ggml's arithmetic order: sums in float64 (ggml_float), the mean and
scale rounded to float32, then one float32 multiply per element."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import norm as jit_norm
from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._common import banded, overlap, rows_2d, view
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType as G


def all_f32(t: Tensor) -> bool:
    return t.type == t.src[0].type == G.F32


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def row_sum(x: np.ndarray, axis=-1) -> np.ndarray:
    return x.sum(axis=axis, keepdims=True, dtype=np.float64)


def bound_rows(compiled):
    """bind for a compiled row normaliser(x, out, eps): rows that reshape to 2-D without a copy, in bands over the
    threads."""

    def bind(dst: Tensor):
        x, out = rows_2d(view(dst.src[0])), rows_2d(view(dst))
        if x is None or out is None or overlap(out, x):
            return None
        eps = np.float32(dst.op_params_f32(0))
        return banded(x.shape[0], x.size, lambda lo, hi: compiled(x[lo:hi], out[lo:hi], eps))

    return bind


@kernel(Op.NORM, supports=all_f32, bind=bound_rows(jit_norm.norm_rows))
def norm(dst: Tensor) -> None:
    x = view(dst.src[0])
    n = x.shape[-1]
    mean = _f32(row_sum(x)) / np.float32(n)
    centred = x - mean
    variance = _f32(row_sum(centred * centred) / n)
    np.multiply(centred, np.float32(1) / np.sqrt(variance + np.float32(dst.op_params_f32(0))), out=view(dst))


@kernel(Op.RMS_NORM, supports=all_f32, bind=bound_rows(jit_norm.rms_norm_rows))
def rms_norm(dst: Tensor) -> None:
    x = view(dst.src[0])
    mean = _f32(row_sum(x * x) / x.shape[-1])
    np.multiply(x, np.float32(1) / np.sqrt(mean + np.float32(dst.op_params_f32(0))), out=view(dst))


@kernel(Op.L2_NORM, supports=all_f32)
def l2_norm(dst: Tensor) -> None:
    x = view(dst.src[0])
    norm2 = np.sqrt(_f32(row_sum(x * x)))
    np.multiply(x, np.float32(1) / np.maximum(norm2, np.float32(dst.op_params_f32(0))), out=view(dst))


@kernel(Op.GROUP_NORM, supports=all_f32)
def group_norm(dst: Tensor) -> None:
    """Channels (ne[2]) split into groups of ceil(ne2 / n_groups); each group normalised over all its elements."""
    x, out = view(dst.src[0]), view(dst)
    n_channels, n_groups = dst.ne[2], dst.op_params[0]
    per_group = -(-n_channels // n_groups)
    eps = np.float32(dst.op_params_f32(1))
    for start in range(0, n_channels, per_group):  # one step per group: a short loop over a small dim
        xs = x[:, start: start + per_group]
        n = xs.shape[1] * xs.shape[2] * xs.shape[3]
        mean = _f32(row_sum(xs, axis=(1, 2, 3)) / n)
        centred = xs - mean
        variance = _f32(row_sum(centred * centred, axis=(1, 2, 3)) / n)
        np.multiply(centred, np.float32(1) / np.sqrt(variance + eps), out=out[:, start: start + per_group])
