"""Convolutions (im2col + mul_mat like ggml, and the direct ops), pooling, resampling and index-generating ops.

Image tensors are [W, H, C, N] in ggml order; kernels [KW, KH, IC, OC].
"""

from __future__ import annotations

import math
from enum import IntEnum, IntFlag

import numpy as np

from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result
from pyggml.core.ops.layout import cont, permute, reshape_2d, reshape_3d, reshape_4d
from pyggml.core.ops.matmul import mul_mat
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType, blck_size, type_size

__all__ = [
    "PoolOp", "ScaleMode", "ScaleFlag", "im2col", "conv_1d", "conv_1d_ph", "conv_1d_dw", "conv_1d_dw_ph",
    "conv_transpose_1d", "conv_2d", "conv_2d_sk_p0", "conv_2d_s1_ph", "conv_2d_direct", "conv_2d_dw",
    "conv_2d_dw_direct", "conv_transpose_2d_p0", "pool_1d", "pool_2d", "upscale", "upscale_ext", "interpolate",
    "arange", "timestep_embedding", "pad_reflect_1d", "roll",
]


class PoolOp(IntEnum):
    MAX = 0
    AVG = 1


class ScaleMode(IntEnum):
    NEAREST = 0
    BILINEAR = 1
    BICUBIC = 2


class ScaleFlag(IntFlag):
    ALIGN_CORNERS = 1 << 8
    ANTIALIAS = 1 << 9


def conv_output_size(ins: int, ks: int, s: int, p: int, d: int) -> int:
    """Output length of a strided, padded, dilated convolution (C integer division, as ggml)."""
    return int((ins + 2 * p - d * (ks - 1) - 1) / s) + 1


# ----- im2col and the convolutions built on it -----------------------------------------------------

def im2col(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int, is_2D: bool,
           dst_type) -> Tensor:
    """Unfold image b into patch rows for kernel a: [IC*KH*KW, OW, OH, N] (2-D) or [IC*K, OL, N] (1-D)."""
    op = "im2col"
    if is_2D:
        check_shape(a.ne[2] == b.ne[2], op, f"kernel channels a.ne[2]={a.ne[2]} != image channels b.ne[2]={b.ne[2]}",
                    a, b)
    else:
        check_shape(b.ne[1] == a.ne[1], op, f"kernel channels a.ne[1]={a.ne[1]} != signal channels b.ne[1]={b.ne[1]}",
                    a, b)
        check_shape(b.ne[3] == 1, op, "a 1-D signal b must have ne[3] == 1", b)
    oh = conv_output_size(b.ne[1], a.ne[1], s1, p1, d1) if is_2D else 0
    ow = conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    check_shape((not is_2D or oh > 0) and ow > 0, op, f"b too small compared to a (output {ow}x{oh})", a, b)
    ne = ((a.ne[2] * a.ne[1] * a.ne[0], ow, oh, b.ne[3]) if is_2D else (a.ne[1] * a.ne[0], ow, b.ne[2], 1))
    return new_result(ctx, Op.IM2COL, dst_type, ne, srcs=(a, b), params=(s0, s1, p0, p1, d0, d1, int(bool(is_2D))))


def conv_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """Kernel a [K, IC, OC] over signal b [L, IC, N] -> [OL, OC, N], as ggml: F16 im2col, then mul_mat."""
    cols = im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False, GGMLType.F16)
    res = mul_mat(ctx, reshape_2d(ctx, cols, cols.ne[0], cols.ne[2] * cols.ne[1]),
                  reshape_2d(ctx, a, a.ne[0] * a.ne[1], a.ne[2]))
    return reshape_3d(ctx, res, cols.ne[1], a.ne[2], cols.ne[2])


def conv_1d_ph(ctx: Context, a: Tensor, b: Tensor, s: int, d: int) -> Tensor:
    """conv_1d with half padding (same length for stride 1)."""
    return conv_1d(ctx, a, b, s, a.ne[0] // 2, d)


def conv_1d_dw(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """Depthwise 1-D: kernel a [K, 1, C] per channel of b [L, C] -> [OL, C] (F16 im2col + mul_mat, as ggml)."""
    cols = im2col(ctx, a, reshape_4d(ctx, b, b.ne[0], 1, b.ne[1], b.ne[2]), s0, 0, p0, 0, d0, 0, False, GGMLType.F16)
    res = mul_mat(ctx, cols, a)
    return reshape_3d(ctx, res, res.ne[0], res.ne[2], 1)


def conv_1d_dw_ph(ctx: Context, a: Tensor, b: Tensor, s0: int, d0: int) -> Tensor:
    return conv_1d_dw(ctx, a, b, s0, a.ne[0] // 2, d0)


def conv_2d(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """Kernel a [KW, KH, IC, OC] over image b [W, H, IC, N] -> [OW, OH, OC, N]: im2col (a's type) + mul_mat."""
    cols = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, a.type)
    res = mul_mat(ctx, reshape_2d(ctx, cols, cols.ne[0], cols.ne[3] * cols.ne[2] * cols.ne[1]),
                  reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3]))
    res = reshape_4d(ctx, res, cols.ne[1], cols.ne[2], cols.ne[3], a.ne[3])
    return cont(ctx, permute(ctx, res, 0, 1, 3, 2))


def conv_2d_sk_p0(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Stride = kernel size, no padding: non-overlapping patches."""
    return conv_2d(ctx, a, b, a.ne[0], a.ne[1], 0, 0, 1, 1)


def conv_2d_s1_ph(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Stride 1, half padding: same size output for odd kernels."""
    return conv_2d(ctx, a, b, 1, 1, a.ne[0] // 2, a.ne[1] // 2, 1, 1)


def conv_2d_direct(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int,
                   d1: int) -> Tensor:
    """Kernel a [KW, KH, IC, OC] over b [W, H, IC, N] as one CONV_2D op -> [OW, OH, OC, N] of b's type."""
    op = "conv_2d_direct"
    check_shape(a.ne[2] == b.ne[2], op, f"kernel channels a.ne[2]={a.ne[2]} != image channels b.ne[2]={b.ne[2]}",
                a, b)
    ne = (conv_output_size(b.ne[0], a.ne[0], s0, p0, d0), conv_output_size(b.ne[1], a.ne[1], s1, p1, d1),
          a.ne[3], b.ne[3])
    check_shape(ne[0] > 0 and ne[1] > 0, op, f"b too small compared to a (output {ne[0]}x{ne[1]})", a, b)
    return new_result(ctx, Op.CONV_2D, b.type, ne, srcs=(a, b), params=(s0, s1, p0, p1, d0, d1))


def conv_2d_dw(ctx: Context, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int) -> Tensor:
    """Depthwise: kernel a [KW, KH, 1, C] applied per channel of b [W, H, C, N] -> [OW, OH, C, N] (im2col + mul_mat)."""
    new_a = reshape_4d(ctx, a, a.ne[0], a.ne[1], 1, a.ne[2] * a.ne[3])
    cols = im2col(ctx, new_a, reshape_4d(ctx, b, b.ne[0], b.ne[1], 1, b.ne[2] * b.ne[3]),
                  s0, s1, p0, p1, d0, d1, True, GGMLType.F16)
    new_b = reshape_4d(ctx, cols, cols.ne[0], cols.ne[2] * cols.ne[1], b.ne[2], b.ne[3])
    new_a = reshape_4d(ctx, new_a, new_a.ne[0] * new_a.ne[1], new_a.ne[2], new_a.ne[3], 1)
    res = mul_mat(ctx, new_a, new_b)
    return reshape_4d(ctx, res, cols.ne[1], cols.ne[2], b.ne[2], b.ne[3])


def conv_2d_dw_direct(ctx: Context, a: Tensor, b: Tensor, stride0: int, stride1: int, pad0: int, pad1: int,
                      dilation0: int, dilation1: int) -> Tensor:
    """Depthwise convolution as one op (CONV_2D_DW); a channels-innermost b gives a channels-innermost result."""
    op = "conv_2d_dw_direct"
    check_shape(a.ne[2] == 1, op, f"kernel a.ne[2]={a.ne[2]} must be 1", a)
    check_shape(a.ne[3] == b.ne[2], op, f"kernel a.ne[3]={a.ne[3]} != channels b.ne[2]={b.ne[2]}", a, b)
    ne = (conv_output_size(b.ne[0], a.ne[0], stride0, pad0, dilation0),
          conv_output_size(b.ne[1], a.ne[1], stride1, pad1, dilation1), b.ne[2], b.ne[3])
    check_shape(ne[0] > 0 and ne[1] > 0, op, f"b too small compared to a (output {ne[0]}x{ne[1]})", a, b)
    channels_innermost = b.nb[0] > b.nb[2] and b.nb[1] > b.nb[0] and b.nb[2] == type_size(b.type)
    check_shape(not channels_innermost or blck_size(b.type) == 1, op, "channels-innermost b must not be blocked", b)
    res = new_result(ctx, Op.CONV_2D_DW, b.type, ne, srcs=(a, b),
                     params=(stride0, stride1, pad0, pad1, dilation0, dilation1))
    if channels_innermost:
        ts = type_size(res.type)
        res.nb[0] = res.ne[2] * ts
        res.nb[1] = res.ne[0] * res.nb[0]
        res.nb[2] = ts
    return res


def conv_transpose_1d(ctx: Context, a: Tensor, b: Tensor, s0: int, p0: int, d0: int) -> Tensor:
    """Transposed 1-D convolution: kernel a [K, OC, IC], signal b [L, IC] -> [(L-1)*s0 + K, OC] (p0 = 0, d0 = 1)."""
    op = "conv_transpose_1d"
    check_shape(b.ne[2] == 1 and b.ne[3] == 1, op, "b must be a matrix", b)
    check_shape(a.ne[2] == b.ne[1], op, f"kernel a.ne[2]={a.ne[2]} != channels b.ne[1]={b.ne[1]}", a, b)
    check_shape(a.ne[3] == 1, op, "kernel a.ne[3] must be 1", a)
    check_shape(p0 == 0, op, f"p0={p0}: only p0 == 0 is supported", a)
    check_shape(d0 == 1, op, f"d0={d0}: only d0 == 1 is supported", a)
    ne = ((b.ne[0] - 1) * s0 + a.ne[0], a.ne[1], b.ne[2], 1)
    return new_result(ctx, Op.CONV_TRANSPOSE_1D, GGMLType.F32, ne, srcs=(a, b), params=(s0, p0, d0))


def conv_transpose_2d_p0(ctx: Context, a: Tensor, b: Tensor, stride: int) -> Tensor:
    """Transposed 2-D convolution: kernel a [KW, KH, OC, IC], image b [W, H, IC, N] -> [OW, OH, OC, N]."""
    check_shape(a.ne[3] == b.ne[2], "conv_transpose_2d_p0", f"kernel a.ne[3]={a.ne[3]} != channels b.ne[2]={b.ne[2]}",
                a, b)
    ne = ((b.ne[0] - 1) * stride + a.ne[0], (b.ne[1] - 1) * stride + a.ne[1], a.ne[2], b.ne[3])
    return new_result(ctx, Op.CONV_TRANSPOSE_2D, GGMLType.F32, ne, srcs=(a, b), params=(stride,))


# ----- pooling ------------------------------------------------------------------------------------

def _pool_output_size(ins: int, ks: int, s: int, p: float) -> int:
    return int((ins + 2 * p - ks) / s) + 1


def pool_1d(ctx: Context, a: Tensor, op: PoolOp, k0: int, s0: int, p0: int) -> Tensor:
    """Max or average over windows of k0 along dim 0 (average over the in-range elements only)."""
    ne = (_pool_output_size(a.ne[0], k0, s0, p0), a.ne[1], a.ne[2], a.ne[3])
    check_shape(ne[0] > 0, "pool_1d", f"k0={k0}, s0={s0}, p0={p0} leave no output", a)
    return new_result(ctx, Op.POOL_1D, GGMLType.F32, ne, srcs=(a,), params=(int(op), k0, s0, p0))


def pool_2d(ctx: Context, a: Tensor, op: PoolOp, k0: int, k1: int, s0: int, s1: int, p0: float,
            p1: float) -> Tensor:
    """Max or average over k0 x k1 windows (average divides by k0*k1, padding included, as ggml's CPU does)."""
    ne = (_pool_output_size(a.ne[0], k0, s0, p0), _pool_output_size(a.ne[1], k1, s1, p1), a.ne[2], a.ne[3])
    check_shape(ne[0] > 0 and ne[1] > 0, "pool_2d",
                f"kernel {k0}x{k1}, stride {s0}x{s1}, pad {p0}x{p1} leave no output", a)
    return new_result(ctx, Op.POOL_2D, GGMLType.F32, ne, srcs=(a,),
                      params=(int(op), k0, k1, s0, s1, int(p0), int(p1)))


# ----- resampling, padding, shifting ---------------------------------------------------------------

def interpolate(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: int) -> Tensor:
    """Resample F32 a to [ne0, ne1, ne2, ne3]; mode is a ScaleMode, optionally | ScaleFlag bits."""
    op = "interpolate"
    check_shape((mode & 0xFF) < len(ScaleMode), op, f"unknown scale mode {mode & 0xFF}", a)
    check_shape(not (mode & ScaleFlag.ANTIALIAS) or (mode & 0xFF) == ScaleMode.BILINEAR, op,
                "antialias is only implemented for bilinear", a)
    check_type(a.type == GGMLType.F32, op, "a must be F32", a)
    return new_result(ctx, Op.UPSCALE, a.type, (ne0, ne1, ne2, ne3), srcs=(a,), params=(int(mode),))


def upscale(ctx: Context, a: Tensor, scale_factor: int, mode: int) -> Tensor:
    """Multiply ne0 and ne1 by an integer scale_factor > 1."""
    check_shape(scale_factor > 1, "upscale", f"scale_factor={scale_factor} must be > 1", a)
    return interpolate(ctx, a, a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3], mode)


def upscale_ext(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, mode: int) -> Tensor:
    """Deprecated in ggml in favour of interpolate; kept for graphs ported from C."""
    return interpolate(ctx, a, ne0, ne1, ne2, ne3, mode)


def pad_reflect_1d(ctx: Context, a: Tensor, p0: int, p1: int) -> Tensor:
    """Pad dim 0 by mirroring (edge not repeated): p0 values on the left, p1 on the right."""
    op = "pad_reflect_1d"
    check_shape(p0 >= 0 and p1 >= 0, op, f"padding p0={p0}, p1={p1} must be >= 0", a)
    check_shape(p0 < a.ne[0] and p1 < a.ne[0], op, f"padding p0={p0}, p1={p1} must be < a.ne[0]={a.ne[0]}", a)
    check_shape(a.is_contiguous, op, "a must be contiguous", a)
    check_type(a.type == GGMLType.F32, op, "a must be F32", a)
    return new_result(ctx, Op.PAD_REFLECT_1D, a.type, (a.ne[0] + p0 + p1, a.ne[1], a.ne[2], a.ne[3]), srcs=(a,),
                      params=(p0, p1))


def roll(ctx: Context, a: Tensor, shift0: int, shift1: int, shift2: int, shift3: int) -> Tensor:
    """Circular shift along every dim: result[i] = a[i - shift] (modulo each dim)."""
    op = "roll"
    check_shape(a.nb[0] == type_size(a.type), op, "a's rows must be contiguous", a)
    shifts = (shift0, shift1, shift2, shift3)
    check_shape(all(abs(s) < n for s, n in zip(shifts, a.ne, strict=False)), op,
                f"|shifts| {list(shifts)} must be < ne {a.ne}", a)
    return new_result(ctx, Op.ROLL, a.type, a.ne, srcs=(a,), params=shifts)


# ----- generated values -------------------------------------------------------------------------------

def arange(ctx: Context, start: float, stop: float, step: float) -> Tensor:
    """F32 [ceil((stop - start) / step)] holding start + step*i (computed in float32, as ggml)."""
    check_shape(stop > start, "arange", f"stop={stop} must be > start={start}")
    steps = int(math.ceil(np.float32((np.float32(stop) - np.float32(start)) / np.float32(step))))
    return new_result(ctx, Op.ARANGE, GGMLType.F32, (steps,), params=(float(start), float(stop), float(step)))


def timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int) -> Tensor:
    """Sinusoidal embeddings of F32 timesteps [n]: F32 [dim, n] with cos in the first half, sin in the second."""
    return new_result(ctx, Op.TIMESTEP_EMBEDDING, GGMLType.F32, (dim, timesteps.ne[0]), srcs=(timesteps,),
                      params=(dim, max_period))
