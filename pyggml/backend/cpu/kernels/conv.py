"""CPU kernels for IM2COL, the direct and transposed convolutions, pooling, UPSCALE, PAD_REFLECT_1D, ROLL,
ARANGE and TIMESTEP_EMBEDDING.

Windows are gathered with NumPy indexing or strided window views; where a result is a sum of shifted
copies (transposed convolution, depthwise convolution) the loop runs over the few kernel taps only.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._common import as_f32, rows_2d, store, view
from pyggml.core.ops.conv import PoolOp, ScaleFlag, ScaleMode
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType

F32, F16, BF16 = GGMLType.F32, GGMLType.F16, GGMLType.BF16
FLOATS = (F32, F16, BF16)
FLT_MAX = np.finfo(np.float32).max


def _src_in(*types):
    """supports(): every non-empty source of dst is one of `types` and dst is F32."""
    return lambda dst: dst.type == F32 and all(s.type in types for s in dst.srcs)


# ----- im2col ---------------------------------------------------------------------------------------

def _patches(image: np.ndarray, kh: int, kw: int, s: tuple, p: tuple, d: tuple, oh: int, ow: int) -> np.ndarray:
    """(N, IC, H, W) -> (N, OH, OW, IC*KH*KW): the input under each kernel placement, zeros outside the image.

    s, p, d are (x, y) pairs: stride, padding and dilation.
    """
    padded = np.pad(image, ((0, 0), (0, 0), (p[1], p[1]), (p[0], p[0])))
    rows = (np.arange(oh) * s[1])[:, None] + np.arange(kh) * d[1]      # (OH, KH) in padded coordinates
    cols = (np.arange(ow) * s[0])[:, None] + np.arange(kw) * d[0]      # (OW, KW)
    gathered = padded[:, :, rows[:, None, :, None], cols[None, :, None, :]]   # (N, IC, OH, OW, KH, KW)
    return gathered.transpose(0, 2, 3, 1, 4, 5).reshape(image.shape[0], oh, ow, -1)


def _windows_1d(signal: np.ndarray, kw: int, s: int, p: int, d: int, ow: int) -> np.ndarray:
    """(N, IC, L) -> (N, OW, IC, KW): the strided windows of _patches with one row, as a view of the padded
    signal (fancy indexing gathered each value: a batch of 7 Whisper windows' second convolution 115 -> 52 ms)."""
    padded = np.pad(signal, ((0, 0), (0, 0), (p, p))) if p else signal
    windows = sliding_window_view(padded, (kw - 1) * d + 1, axis=2)[:, :, ::s][:, :, :ow, ::d]   # (N, IC, OW, KW)
    return windows.transpose(0, 2, 1, 3)


@kernel(Op.IM2COL, supports=lambda dst: dst.type in (F32, F16) and dst.src[1].type in FLOATS)
def im2col(dst: Tensor) -> None:
    """dst[n, oh, ow, (ic, kh, kw)] = b[n, ic, oh*s1 + kh*d1 - p1, ow*s0 + kw*d0 - p0], zero outside b."""
    a, b = dst.src[0], dst.src[1]
    s0, s1, p0, p1, d0, d1, is_2d = (dst.op_params_i32(i) for i in range(7))
    if is_2d:
        cols = _patches(as_f32(b), a.ne[1], a.ne[0], (s0, s1), (p0, p1), (d0, d1), dst.ne[2], dst.ne[1])
    else:
        windows = _windows_1d(as_f32(b)[0], a.ne[0], s0, p0, d0, dst.ne[1])   # from (N, IC, L)
        out = rows_2d(view(dst))
        if dst.type == F32 and out is not None and not np.may_share_memory(out, windows):
            out = out.reshape(windows.shape)
            if windows.shape[3] > windows.shape[2]:   # long kernels over few channels (an STFT): in one copy
                np.copyto(out, windows)
                return
            for k in range(windows.shape[3]):   # copied once, into place, a kernel tap at a time (inner runs of
                np.copyto(out[..., k], windows[..., k])   # channels, not of KW values: Whisper's 7 windows 45 -> 26 ms)
            return
        cols = windows.reshape(windows.shape[0], windows.shape[1], -1)
    store(dst, cols.reshape(view(dst).shape))


# ----- direct and transposed convolutions ------------------------------------------------------------

def _like_kernel(x: np.ndarray, kernel_: Tensor) -> np.ndarray:
    """With an F16 kernel ggml rounds the input to F16 before its dot products; do the same."""
    return x.astype(np.float16).astype(np.float32) if kernel_.type == F16 else x


@kernel(Op.CONV_2D, supports=lambda dst: dst.type in FLOATS and dst.src[0].type in (F32, F16)
        and dst.src[1].type in FLOATS)
def conv_2d(dst: Tensor) -> None:
    """dst[n, oc, oy, ox] = sum over (ic, ky, kx) of a[oc, ic, ky, kx] * b[n, ic, ..]: patches x kernel in one GEMM."""
    a, b = dst.src[0], dst.src[1]
    s0, s1, p0, p1, d0, d1 = (dst.op_params_i32(i) for i in range(6))
    cols = _patches(as_f32(b), a.ne[1], a.ne[0], (s0, s1), (p0, p1), (d0, d1), dst.ne[1], dst.ne[0])
    weights = as_f32(a).reshape(a.ne[3], -1)                       # (OC, IC*KH*KW)
    store(dst, (_like_kernel(cols, a) @ weights.T).transpose(0, 3, 1, 2))


@kernel(Op.CONV_2D_DW, supports=_src_in(F32))
def conv_2d_dw(dst: Tensor) -> None:
    """dst[n, c, oy, ox] = sum_{ky, kx} a[c, ky, kx] * b[n, c, oy*sy + ky*dy - py, ox*sx + kx*dx - px]."""
    a, b = dst.src[0], dst.src[1]
    sx, sy, px, py, dx, dy = (dst.op_params_i32(i) for i in range(6))
    taps = as_f32(a)[:, 0]                                         # (C, KH, KW)
    padded = np.pad(as_f32(b), ((0, 0), (0, 0), (py, py), (px, px)))
    oh, ow = dst.ne[1], dst.ne[0]
    acc = np.zeros(view(dst).shape, dtype=np.float32)
    for ky in range(a.ne[1]):
        for kx in range(a.ne[0]):
            window = padded[:, :, ky * dy: ky * dy + (oh - 1) * sy + 1: sy, kx * dx: kx * dx + (ow - 1) * sx + 1: sx]
            acc += taps[:, ky, kx][None, :, None, None] * window
    store(dst, acc)


@kernel(Op.CONV_TRANSPOSE_1D, supports=lambda dst: dst.type == F32 and dst.src[0].type in (F32, F16)
        and dst.src[1].type == F32)
def conv_transpose_1d(dst: Tensor) -> None:
    """dst[oc, l*s0 + k] += sum_ic a[ic, oc, k] * b[ic, l]: one matmul, then one shifted add per kernel tap."""
    a, b = dst.src[0], dst.src[1]
    s0 = dst.op_params_i32(0)
    length, n_out, taps = b.ne[0], a.ne[1], a.ne[0]
    signal = _like_kernel(as_f32(b)[0, 0], a)                      # (IC, L)
    contrib = (signal.T @ as_f32(a)[0].reshape(a.ne[2], n_out * taps)).reshape(length, n_out, taps)
    out = view(dst)[0, 0]                                          # (OC, OL)
    out[...] = 0
    for k in range(taps):
        out[:, k: k + (length - 1) * s0 + 1: s0] += contrib[:, :, k].T


@kernel(Op.CONV_TRANSPOSE_2D, supports=lambda dst: dst.type == F32 and dst.src[0].type in (F32, F16)
        and dst.src[1].type == F32)
def conv_transpose_2d(dst: Tensor) -> None:
    """dst[n, oc, h*s + kh, w*s + kw] += sum_ic a[ic, oc, kh, kw] * b[n, ic, h, w], batched over n."""
    a, b = dst.src[0], dst.src[1]
    stride = dst.op_params_i32(0)
    kh, kw, n_out, n_in = a.ne[1], a.ne[0], a.ne[2], a.ne[3]
    h, w = b.ne[1], b.ne[0]
    image = _like_kernel(as_f32(b), a).transpose(0, 2, 3, 1)       # (N, H, W, IC)
    kernel_ = as_f32(a).reshape(n_in, n_out * kh * kw)
    contrib = (image @ kernel_).reshape(b.ne[3], h, w, n_out, kh, kw)
    out = view(dst)                                                # (N, OC, OH, OW)
    out[...] = 0
    for y in range(kh):
        for x in range(kw):
            out[:, :, y: y + (h - 1) * stride + 1: stride, x: x + (w - 1) * stride + 1: stride] += \
                contrib[..., y, x].transpose(0, 3, 1, 2)


# ----- pooling --------------------------------------------------------------------------------------

def _windows(x: np.ndarray, k: int, s: int, p: int, n_out: int, axis: int, fill: float) -> np.ndarray:
    """Windows of k along axis, stride s, x padded by p on the left with `fill` (and enough on the right)."""
    right = max(0, (n_out - 1) * s + k - p - x.shape[axis])
    pad = [(0, 0)] * x.ndim
    pad[axis] = (p, right)
    padded = np.pad(x, pad, constant_values=fill)
    win = sliding_window_view(padded, k, axis=axis)
    index = [slice(None)] * win.ndim
    index[axis] = slice(0, (n_out - 1) * s + 1, s)
    return win[tuple(index)]


def _in_range_count(n_in: int, k: int, s: int, p: int, n_out: int) -> np.ndarray:
    """How many taps of each output window fall inside [0, n_in)."""
    start = np.arange(n_out) * s - p
    return np.clip(start + k, 0, n_in) - np.clip(start, 0, n_in)


@kernel(Op.POOL_1D, supports=_src_in(F32, F16))
def pool_1d(dst: Tensor) -> None:
    """Max (-FLT_MAX if no tap is in range) or mean over the in-range taps of each window along dim 0."""
    src = dst.src[0]
    op, k, s, p = (dst.op_params_i32(i) for i in range(4))
    x = as_f32(src)
    n_out = dst.ne[0]
    if op == PoolOp.MAX:
        store(dst, _windows(x, k, s, p, n_out, 3, -FLT_MAX).max(axis=-1))
    else:
        count = _in_range_count(src.ne[0], k, s, p, n_out)
        sums = _windows(x, k, s, p, n_out, 3, 0.0).sum(axis=-1)
        store(dst, np.where(count > 0, sums / np.maximum(count, 1), 0.0))


@kernel(Op.POOL_2D, supports=_src_in(F32, F16))
def pool_2d(dst: Tensor) -> None:
    """Max, or sum / (k0*k1) (padding counted, as ggml's CPU kernel), over each k1 x k0 window."""
    op, k0, k1, s0, s1, p0, p1 = (dst.op_params_i32(i) for i in range(7))
    fill = -FLT_MAX if op == PoolOp.MAX else 0.0
    win = _windows(as_f32(dst.src[0]), k1, s1, p1, dst.ne[1], 2, fill)       # (.., OH, W, KH)
    win = _windows(win, k0, s0, p0, dst.ne[0], 3, fill)                     # (.., OH, OW, KH, KW)
    if op == PoolOp.MAX:
        store(dst, win.max(axis=(-2, -1)))
    else:
        store(dst, win.sum(axis=(-2, -1), dtype=np.float32) / np.float32(k0 * k1))


# ----- resampling -----------------------------------------------------------------------------------

def _supports_upscale(dst: Tensor) -> bool:
    mode = dst.op_params_i32(0)
    return dst.type == F32 and dst.src[0].type == F32 and not mode & ScaleFlag.ANTIALIAS and (mode & 0xFF) in _TAPS


def _nearest(n_out: int, n_in: int) -> np.ndarray:
    """ggml's nearest source index: (int)(i / (float)(n_out / n_in)), in float32."""
    scale = np.float32(n_out) / np.float32(n_in)
    return np.minimum((np.arange(n_out, dtype=np.float32) / scale).astype(np.int64), n_in - 1)


def _source_positions(n_out: int, n_in: int, align_corners: bool) -> np.ndarray:
    """Where each output sample sits in source coordinates (pixel centres, or corners aligned), in float32."""
    scale, offset = np.float32(n_out) / np.float32(n_in), np.float32(0.5)
    if align_corners:
        offset = np.float32(0)
        if n_out > 1 and n_in > 1:
            scale = np.float32(n_out - 1) / np.float32(n_in - 1)
    return (np.arange(n_out, dtype=np.float32) + offset) / scale - offset


def _linear_taps(pos: np.ndarray, n_in: int):
    """Two clamped source indices and weights per output (ggml's bilinear: the fraction is clamped to [0, 1])."""
    lo = np.floor(pos).astype(np.int64)
    hi = np.clip(lo + 1, 0, n_in - 1)
    lo = np.clip(lo, 0, n_in - 1)
    frac = np.clip(pos - lo.astype(np.float32), np.float32(0), np.float32(1))
    return np.stack([lo, hi], axis=1), np.stack([np.float32(1) - frac, frac], axis=1)


def _cubic_taps(pos: np.ndarray, n_in: int):
    """Four clamped source indices and Keys-cubic weights (a = -0.75, as ggml and PyTorch) per output."""
    a = np.float32(-0.75)
    base = np.floor(pos)
    t = (pos - base)[:, None]
    near = np.concatenate([t, np.float32(1) - t], axis=1)                 # |distance| < 1
    far = np.concatenate([t + np.float32(1), np.float32(2) - t], axis=1)  # 1 <= |distance| < 2
    w_near = ((a + 2) * near - (a + 3)) * near * near + 1
    w_far = ((a * far - 5 * a) * far + 8 * a) * far - 4 * a
    weights = np.stack([w_far[:, 0], w_near[:, 0], w_near[:, 1], w_far[:, 1]], axis=1)
    index = np.clip(base.astype(np.int64)[:, None] + np.arange(-1, 3), 0, n_in - 1)
    return index, weights.astype(np.float32)


_TAPS = {ScaleMode.NEAREST: None, ScaleMode.BILINEAR: _linear_taps, ScaleMode.BICUBIC: _cubic_taps}


@kernel(Op.UPSCALE, supports=_supports_upscale)
def upscale(dst: Tensor) -> None:
    """Nearest, bilinear or bicubic (optionally align-corners) resampling of dims 0, 1; nearest for dims 2, 3."""
    src = dst.src[0]
    mode = dst.op_params_i32(0)
    x = as_f32(src)[_nearest(dst.ne[3], src.ne[3])][:, _nearest(dst.ne[2], src.ne[2])]
    taps = _TAPS[mode & 0xFF]
    if taps is None:
        store(dst, x[:, :, _nearest(dst.ne[1], src.ne[1])][..., _nearest(dst.ne[0], src.ne[0])])
        return
    align = bool(mode & ScaleFlag.ALIGN_CORNERS)
    iy, wy = taps(_source_positions(dst.ne[1], src.ne[1], align), src.ne[1])
    ix, wx = taps(_source_positions(dst.ne[0], src.ne[0], align), src.ne[0])
    store(dst, np.einsum("abyixj,yi,xj->abyx", x[:, :, iy][..., ix], wy, wx))


# ----- padding, shifting, generated values ------------------------------------------------------------

@kernel(Op.PAD_REFLECT_1D, supports=_src_in(F32))
def pad_reflect_1d(dst: Tensor) -> None:
    p0, p1 = dst.op_params_i32(0), dst.op_params_i32(1)
    store(dst, np.pad(view(dst.src[0]), ((0, 0), (0, 0), (0, 0), (p0, p1)), mode="reflect"))


@kernel(Op.ROLL, supports=_src_in(F32))
def roll(dst: Tensor) -> None:
    shifts = [dst.op_params_i32(i) for i in range(4)]
    store(dst, np.roll(view(dst.src[0]), shifts[::-1], axis=(0, 1, 2, 3)))


@kernel(Op.ARANGE, supports=lambda dst: dst.type == F32)
def arange(dst: Tensor) -> None:
    start, step = np.float32(dst.op_params_f32(0)), np.float32(dst.op_params_f32(2))
    store(dst, start + step * np.arange(dst.ne[0], dtype=np.float32))


@kernel(Op.TIMESTEP_EMBEDDING, supports=_src_in(F32))
def timestep_embedding(dst: Tensor) -> None:
    """[cos(t*f_j) for j < half] + [sin(t*f_j)] (+ a 0 for odd dim), f_j = exp(-log(max_period)*j/half)."""
    dim, max_period = dst.op_params_i32(0), dst.op_params_i32(1)
    half = dim // 2
    j = np.arange(half, dtype=np.float32)
    freq = np.exp(((np.float32(-math.log(max_period)) * j) / np.float32(half)).astype(np.float64)).astype(np.float32)
    args = (as_f32(dst.src[0]).reshape(-1, 1) * freq).astype(np.float64)      # (n, half)
    out = view(dst)[0, 0]                                                     # (n, dim)
    out[:, :half] = np.cos(args)
    out[:, half: 2 * half] = np.sin(args)
    out[:, 2 * half:] = 0
