"""Normalisations along rows (norm, rms_norm, l2_norm) and over channel groups (group_norm).

op_params: [eps] (f32) for norm, rms_norm, l2_norm; [n_groups (i32), eps (f32)] for group_norm.
"""

from __future__ import annotations

from pyggml.core.context import Context
from pyggml.core.ops.elementwise import same_as
from pyggml.core.tensor import Op, Tensor

__all__ = ["norm", "norm_inplace", "rms_norm", "rms_norm_inplace", "group_norm", "group_norm_inplace",
           "l2_norm", "l2_norm_inplace"]


def norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) per row."""
    return same_as(ctx, Op.NORM, a, (a,), (float(eps),))


def norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return same_as(ctx, Op.NORM, a, (a,), (float(eps),), inplace=True)


def rms_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) per row."""
    return same_as(ctx, Op.RMS_NORM, a, (a,), (float(eps),))


def rms_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return same_as(ctx, Op.RMS_NORM, a, (a,), (float(eps),), inplace=True)


def group_norm(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    """norm over groups of ne[2] channels (each group spans all of ne[0] x ne[1])."""
    return same_as(ctx, Op.GROUP_NORM, a, (a,), (int(n_groups), float(eps)))


def group_norm_inplace(ctx: Context, a: Tensor, n_groups: int, eps: float) -> Tensor:
    return same_as(ctx, Op.GROUP_NORM, a, (a,), (int(n_groups), float(eps)), inplace=True)


def l2_norm(ctx: Context, a: Tensor, eps: float) -> Tensor:
    """x / max(||x||, eps) per row."""
    return same_as(ctx, Op.L2_NORM, a, (a,), (float(eps),))


def l2_norm_inplace(ctx: Context, a: Tensor, eps: float) -> Tensor:
    return same_as(ctx, Op.L2_NORM, a, (a,), (float(eps),), inplace=True)
