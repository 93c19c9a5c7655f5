"""Op graphs for the conv family (im2col, convolutions, pooling, upscale, pad_reflect_1d, roll, arange,
timestep_embedding), with float64 NumPy references written from the definitions."""

from __future__ import annotations

import itertools
import math

import numpy as np
from tests.support.opcheck import OpCase, values

from pyggml.core import ops
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType

F32, F16 = GGMLType.F32, GGMLType.F16
CONV_TOL = 5e-4   # the composite convolutions end in mul_mat (and conv_1d goes through an F16 im2col)


def _out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def ref_conv2d(x, w, s, p, d):
    """x (N, IC, H, W), w (OC, IC, KH, KW), s/p/d as (x, y) pairs -> (N, OC, OH, OW)."""
    kh, kw = w.shape[2:]
    oh, ow = _out_size(x.shape[2], kh, s[1], p[1], d[1]), _out_size(x.shape[3], kw, s[0], p[0], d[0])
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for n, o, y, z in itertools.product(range(x.shape[0]), range(w.shape[0]), range(oh), range(ow)):
        for c, i, j in itertools.product(range(x.shape[1]), range(kh), range(kw)):
            iy, ix = y * s[1] + i * d[1] - p[1], z * s[0] + j * d[0] - p[0]
            if 0 <= iy < x.shape[2] and 0 <= ix < x.shape[3]:
                out[n, o, y, z] += w[o, c, i, j] * x[n, c, iy, ix]
    return out


def ref_im2col_2d(x, kh, kw, s, p, d):
    """(N, IC, H, W) -> (N, OH, OW, IC*KH*KW) by the definition, one output element at a time."""
    oh, ow = _out_size(x.shape[2], kh, s[1], p[1], d[1]), _out_size(x.shape[3], kw, s[0], p[0], d[0])
    out = np.zeros((x.shape[0], oh, ow, x.shape[1], kh, kw))
    for n, y, z, c, i, j in itertools.product(*(range(v) for v in out.shape)):
        iy, ix = y * s[1] + i * d[1] - p[1], z * s[0] + j * d[0] - p[0]
        if 0 <= iy < x.shape[2] and 0 <= ix < x.shape[3]:
            out[n, y, z, c, i, j] = x[n, c, iy, ix]
    return out.reshape(*out.shape[:3], -1)


def im2col_case(name, ne_k, ne_x, s, p, d, is_2d, dst_type, channels_outer=False):
    def build(ctx):
        k = ctx.new_tensor(F16, ne_k, name="kernel")
        if channels_outer:  # x [W, H, C, N] as a permuted view of an [W, C, H, N] tensor
            x = ops.permute(ctx, ctx.new_tensor(F32, (ne_x[0], ne_x[2], ne_x[1], ne_x[3]), name="x"), 0, 2, 1, 3)
        else:
            x = ctx.new_tensor(F32, ne_x, name="x")
        return ops.im2col(ctx, k, x, s[0], s[1], p[0], p[1], d[0], d[1], is_2d, dst_type)

    def ref(out):
        x = values(out.src[1])
        if is_2d:
            return ref_im2col_2d(x, ne_k[1], ne_k[0], s, p, d)
        res = ref_im2col_2d(x[0][:, :, None, :], 1, ne_k[0], (s[0], 1), (p[0], 0), (d[0], 1))  # (N, 1, OL, IC*K)
        return res.transpose(1, 0, 2, 3)
    return OpCase(name, build, 1e-7 if dst_type == F32 else 1e-6, ref)


def conv_2d_case(name, ne_k, ne_x, s, p, d, k_type=F32, fn=ops.conv_2d):
    def build(ctx):
        k = ctx.new_tensor(k_type, ne_k, name="kernel")
        return fn(ctx, k, ctx.new_tensor(F32, ne_x, name="x"), s[0], s[1], p[0], p[1], d[0], d[1])

    def ref(out):
        k = values(next(t for t in _leaves(out) if t.name == "kernel"))
        x = values(next(t for t in _leaves(out) if t.name == "x"))
        return ref_conv2d(x, k, s, p, d)
    return OpCase(name, build, CONV_TOL, ref)


def _leaves(out):
    """Every tensor reachable from out through src (the composite ops' inputs)."""
    seen, stack = {}, [out]
    while stack:
        t = stack.pop()
        if id(t) not in seen:
            seen[id(t)] = t
            stack.extend(t.srcs)
            if t.view_src is not None:
                stack.append(t.view_src)
    return list(seen.values())


def _named(out, name):
    return values(next(t for t in _leaves(out) if t.name == name))


def conv_1d_case(name, k, ic, oc, length, n, s, p, d):
    def build(ctx):
        return ops.conv_1d(ctx, ctx.new_tensor(F16, (k, ic, oc), name="kernel"),  # ggml's F16 im2col needs F16
                           ctx.new_tensor(F32, (length, ic, n), name="x"), s, p, d)

    def ref(out):
        w, x = _named(out, "kernel")[0], _named(out, "x")[0]                 # (OC, IC, K), (N, IC, L)
        return ref_conv2d(x[:, :, None, :], w[:, :, None, :], (s, 1), (p, 0), (d, 1))[:, :, 0][None]
    return OpCase(name, build, CONV_TOL, ref)


def conv_1d_dw_case(name, k, c, length, s, p, d):
    def build(ctx):
        return ops.conv_1d_dw(ctx, ctx.new_tensor(F16, (k, 1, c), name="kernel"),
                              ctx.new_tensor(F32, (length, c), name="x"), s, p, d)

    def ref(out):
        w, x = _named(out, "kernel")[0, :, 0], _named(out, "x")[0, 0]      # (C, K), (C, L)
        res = ref_depthwise(x[None, :, None, :], w[:, None, :], (s, 1), (p, 0), (d, 1))  # (1, C, 1, OL)
        return res[:, :, 0][None]
    return OpCase(name, build, CONV_TOL, ref)


def ref_depthwise(x, w, s, p, d):
    """x (N, C, H, W), w (C, KH, KW): each channel convolved with its own kernel."""
    return np.concatenate([ref_conv2d(x[:, c:c + 1], w[c][None, None], s, p, d) for c in range(x.shape[1])], axis=1)


def conv_2d_dw_case(name, ne_x, kh, kw, s, p, d, direct):
    def build(ctx):
        k = ctx.new_tensor(F32 if direct else F16, (kw, kh, 1, ne_x[2]), name="kernel")  # F16 for ggml's im2col
        x = ctx.new_tensor(F32, ne_x, name="x")
        fn = ops.conv_2d_dw_direct if direct else ops.conv_2d_dw
        return fn(ctx, k, x, s[0], s[1], p[0], p[1], d[0], d[1])

    def ref(out):
        return ref_depthwise(_named(out, "x"), _named(out, "kernel")[:, 0], s, p, d)
    return OpCase(name, build, 1e-7 if direct else CONV_TOL, ref)


def conv_transpose_1d_case(name, k, oc, ic, length, s0, k_type=F32):
    def build(ctx):
        return ops.conv_transpose_1d(ctx, ctx.new_tensor(k_type, (k, oc, ic), name="kernel"),
                                     ctx.new_tensor(F32, (length, ic), name="x"), s0, 0, 1)

    def ref(out):
        w, x = values(out.src[0])[0], values(out.src[1])[0, 0]              # (IC, OC, K), (IC, L)
        if k_type == F16:
            x = x.astype(np.float16).astype(np.float64)
        res = np.zeros((oc, (length - 1) * s0 + k))
        for i, t in itertools.product(range(length), range(k)):
            res[:, i * s0 + t] += x[:, i] @ w[:, :, t]
        return res[None, None]
    return OpCase(name, build, 1e-7 if k_type == F32 else 1e-6, ref)


def conv_transpose_2d_case(name, kw, kh, oc, ic, w_, h, n, stride, k_type=F32):
    def build(ctx):
        return ops.conv_transpose_2d_p0(ctx, ctx.new_tensor(k_type, (kw, kh, oc, ic), name="kernel"),
                                        ctx.new_tensor(F32, (w_, h, ic, n), name="x"), stride)

    def ref(out):
        w, x = values(out.src[0]), values(out.src[1])                       # (IC, OC, KH, KW), (N, IC, H, W)
        res = np.zeros((n, oc, (h - 1) * stride + kh, (w_ - 1) * stride + kw))
        for y, z, i, j in itertools.product(range(h), range(w_), range(kh), range(kw)):
            res[:, :, y * stride + i, z * stride + j] += x[:, :, y, z] @ w[:, :, i, j]
        return res
    return OpCase(name, build, 5e-4, ref)


def pool_1d_case(name, op, ne, k, s, p):
    def ref(out):
        x = values(out.src[0])
        n_out = (ne[0] + 2 * p - k) // s + 1
        res = np.zeros(x.shape[:-1] + (n_out,))
        for o in range(n_out):
            taps = [j for j in range(o * s - p, o * s - p + k) if 0 <= j < ne[0]]
            if op == ops.PoolOp.MAX:
                res[..., o] = x[..., taps].max(axis=-1) if taps else -np.finfo(np.float32).max
            else:
                res[..., o] = x[..., taps].mean(axis=-1) if taps else 0
        return res
    return OpCase(name, lambda ctx: ops.pool_1d(ctx, ctx.new_tensor(F32, ne, name="x"), op, k, s, p), reference=ref)


def pool_2d_case(name, op, ne, k, s, p):
    def ref(out):
        x = values(out.src[0])
        oh, ow = (ne[1] + 2 * p[1] - k[1]) // s[1] + 1, (ne[0] + 2 * p[0] - k[0]) // s[0] + 1
        res = np.zeros(x.shape[:2] + (oh, ow))
        for y, z in itertools.product(range(oh), range(ow)):
            ys = [i for i in range(y * s[1] - p[1], y * s[1] - p[1] + k[1]) if 0 <= i < ne[1]]
            zs = [j for j in range(z * s[0] - p[0], z * s[0] - p[0] + k[0]) if 0 <= j < ne[0]]
            win = x[:, :, ys][:, :, :, zs]
            res[:, :, y, z] = win.max(axis=(2, 3)) if op == ops.PoolOp.MAX else win.sum(axis=(2, 3)) / (k[0] * k[1])
        return res
    return OpCase(name, lambda ctx: ops.pool_2d(ctx, ctx.new_tensor(F32, ne, name="x"), op, *k, *s, *p),
                  reference=ref)


def _nearest_index(n_out, n_in):
    return np.minimum(np.floor(np.arange(n_out) * n_in / n_out + 1e-9).astype(int), n_in - 1)


def _positions(n_out, n_in, align_corners):
    if align_corners and n_out > 1 and n_in > 1:
        return np.arange(n_out) * (n_in - 1) / (n_out - 1)
    return (np.arange(n_out) + 0.5) * n_in / n_out - 0.5


def _keys_cubic(d, a=-0.75):
    d = abs(d)
    return (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1 if d <= 1 else a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a


def _cubic_weights(n_out, n_in, align_corners):
    """(n_out, n_in) matrix of the Keys cubic filter over taps floor(q)-1 .. floor(q)+2, indices clamped."""
    m = np.zeros((n_out, n_in))
    for o, q in enumerate(_positions(n_out, n_in, align_corners)):
        for j in range(math.floor(q) - 1, math.floor(q) + 3):
            m[o, min(max(j, 0), n_in - 1)] += _keys_cubic(q - j)
    return m


def _linear_weights(n_out, n_in, align_corners):
    """(n_out, n_in) interpolation matrix of the clamped linear filter."""
    pos = _positions(n_out, n_in, align_corners)
    m = np.zeros((n_out, n_in))
    for o, q in enumerate(pos):
        lo = math.floor(q)
        frac = min(max(q - min(max(lo, 0), n_in - 1), 0.0), 1.0)
        m[o, min(max(lo, 0), n_in - 1)] += 1 - frac
        m[o, min(max(lo + 1, 0), n_in - 1)] += frac
    return m


def upscale_case(name, ne, ne_out, mode):
    def build(ctx):
        return ops.interpolate(ctx, ctx.new_tensor(F32, ne, name="x"), *ne_out, mode)

    def ref(out):
        x = values(out.src[0])
        x = x[_nearest_index(ne_out[3], ne[3])][:, _nearest_index(ne_out[2], ne[2])]
        if mode & 0xFF == ops.ScaleMode.NEAREST:
            return x[:, :, _nearest_index(ne_out[1], ne[1])][..., _nearest_index(ne_out[0], ne[0])]
        align = bool(mode & ops.ScaleFlag.ALIGN_CORNERS)
        weights = _linear_weights if mode & 0xFF == ops.ScaleMode.BILINEAR else _cubic_weights
        wy, wx = weights(ne_out[1], ne[1], align), weights(ne_out[0], ne[0], align)
        return np.einsum("yi,xj,abij->abyx", wy, wx, x)
    return OpCase(name, build, reference=ref)


def _pad_reflect_ref(out):
    x = values(out.src[0])
    p0, p1 = out.op_params[:2]
    left = x[..., 1:p0 + 1][..., ::-1]
    right = x[..., x.shape[-1] - 1 - p1:x.shape[-1] - 1][..., ::-1]
    return np.concatenate([left, x, right], axis=-1)


def _roll_ref(out):
    x = values(out.src[0])
    for axis, shift in enumerate(out.op_params[:4]):
        idx = (np.arange(x.shape[3 - axis]) - shift) % x.shape[3 - axis]
        x = np.take(x, idx, axis=3 - axis)
    return x


def _timestep_ref(out):
    dim, max_period = out.op_params[:2]
    t = values(out.src[0]).reshape(-1, 1)
    half = dim // 2
    args = t * np.exp(-math.log(max_period) * np.arange(half) / half)
    res = np.concatenate([np.cos(args), np.sin(args), np.zeros((t.shape[0], dim - 2 * half))], axis=1)
    return res[None, None]


def _timesteps(ctx, n):
    t = ctx.new_tensor(F32, (n,), name="timesteps")
    host_ndarray(t)[...] = np.random.default_rng(5).uniform(0, 1000, n)
    return t


CASES = [
    im2col_case("im2col_2d_f32", (3, 3, 2, 4), (7, 6, 2, 2), (1, 1), (1, 1), (1, 1), True, F32),
    im2col_case("im2col_2d_strided_dilated_f16", (3, 2, 3, 1), (9, 8, 3, 1), (2, 3), (2, 1), (2, 1), True, F16),
    im2col_case("im2col_1d", (3, 2, 5), (10, 2, 3), (2, 0), (1, 0), (2, 0), False, F32),
    conv_2d_case("conv_2d", (3, 3, 2, 4), (7, 6, 2, 2), (1, 1), (1, 1), (1, 1)),
    conv_2d_case("conv_2d_strided_f16_kernel", (3, 2, 3, 2), (9, 8, 3, 1), (2, 2), (1, 0), (1, 2), k_type=F16),
    conv_2d_case("conv_2d_direct", (3, 3, 2, 4), (7, 6, 2, 2), (1, 1), (1, 1), (1, 1), fn=ops.conv_2d_direct),
    conv_2d_case("conv_2d_direct_f16_kernel", (3, 2, 3, 2), (9, 8, 3, 1), (2, 2), (1, 0), (1, 2), k_type=F16,
                 fn=ops.conv_2d_direct),
    conv_2d_case("conv_2d_sk_p0", (2, 2, 3, 2), (8, 6, 3, 1), (2, 2), (0, 0), (1, 1),
                 fn=lambda ctx, k, x, *_: ops.conv_2d_sk_p0(ctx, k, x)),
    conv_2d_case("conv_2d_s1_ph", (3, 3, 2, 2), (6, 5, 2, 1), (1, 1), (1, 1), (1, 1),
                 fn=lambda ctx, k, x, *_: ops.conv_2d_s1_ph(ctx, k, x)),
    conv_1d_dw_case("conv_1d_dw", 3, 4, 10, 1, 1, 1),
    conv_1d_case("conv_1d", 3, 2, 4, 10, 1, 1, 1, 1),  # N = 1: ggml's final reshape mixes batches for N > 1
    conv_1d_case("conv_1d_strided_dilated", 3, 3, 2, 12, 1, 2, 0, 2),
    conv_2d_dw_case("conv_2d_dw", (7, 6, 3, 2), 3, 3, (1, 1), (1, 1), (1, 1), direct=False),
    conv_2d_dw_case("conv_2d_dw_direct", (7, 6, 3, 2), 3, 3, (1, 1), (1, 1), (1, 1), direct=True),
    conv_2d_dw_case("conv_2d_dw_direct_strided", (9, 8, 2, 1), 3, 2, (2, 1), (0, 1), (1, 2), direct=True),
    conv_transpose_1d_case("conv_transpose_1d", 3, 2, 4, 6, 1),
    conv_transpose_1d_case("conv_transpose_1d_s2_f16", 4, 3, 2, 5, 2, k_type=F16),
    conv_transpose_2d_case("conv_transpose_2d", 3, 3, 2, 3, 4, 5, 1, 2),
    conv_transpose_2d_case("conv_transpose_2d_f16", 2, 3, 3, 2, 3, 3, 1, 1, k_type=F16),
    pool_1d_case("pool_1d_max", ops.PoolOp.MAX, (10, 3, 2), 3, 2, 1),
    pool_1d_case("pool_1d_avg", ops.PoolOp.AVG, (10, 3, 2), 3, 2, 1),
    pool_2d_case("pool_2d_max", ops.PoolOp.MAX, (8, 7, 3, 2), (3, 2), (2, 2), (1, 1)),
    pool_2d_case("pool_2d_avg", ops.PoolOp.AVG, (8, 7, 3, 2), (2, 3), (2, 1), (1, 1)),
    upscale_case("upscale_nearest_x2", (4, 3, 2, 1), (8, 6, 2, 1), ops.ScaleMode.NEAREST),
    upscale_case("interpolate_nearest_all_dims", (5, 4, 3, 2), (7, 3, 6, 4), ops.ScaleMode.NEAREST),
    upscale_case("interpolate_bilinear", (5, 4, 2, 1), (8, 7, 2, 1), ops.ScaleMode.BILINEAR),
    upscale_case("interpolate_bilinear_down", (9, 7, 2, 1), (4, 3, 2, 1), ops.ScaleMode.BILINEAR),
    upscale_case("interpolate_bilinear_align_corners", (5, 4, 2, 1), (8, 7, 2, 1),
                 ops.ScaleMode.BILINEAR | ops.ScaleFlag.ALIGN_CORNERS),
    upscale_case("interpolate_bicubic", (5, 4, 2, 1), (9, 7, 2, 1), ops.ScaleMode.BICUBIC),
    upscale_case("interpolate_bicubic_down_align_corners", (9, 7, 2, 1), (4, 5, 2, 1),
                 ops.ScaleMode.BICUBIC | ops.ScaleFlag.ALIGN_CORNERS),
    OpCase("pad_reflect_1d", lambda ctx: ops.pad_reflect_1d(ctx, ctx.new_tensor(F32, (8, 3, 2), name="x"), 3, 2),
           reference=_pad_reflect_ref),
    OpCase("roll", lambda ctx: ops.roll(ctx, ctx.new_tensor(F32, (6, 5, 4, 3), name="x"), 2, -3, 1, -2),
           reference=_roll_ref),
    OpCase("arange", lambda ctx: ops.arange(ctx, -2.5, 7.0, 0.75),
           reference=lambda out: np.arange(-2.5, 7.0, 0.75)[None, None, None]),
    OpCase("timestep_embedding", lambda ctx: ops.timestep_embedding(ctx, _timesteps(ctx, 5), 16, 10000),
           reference=_timestep_ref),
    OpCase("timestep_embedding_odd_dim", lambda ctx: ops.timestep_embedding(ctx, _timesteps(ctx, 3), 9, 100),
           reference=_timestep_ref),
]
