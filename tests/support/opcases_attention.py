"""Op graphs for diag_mask_*, soft_max(_ext), rope(_ext) and flash_attn_ext, with float64 NumPy references."""

from __future__ import annotations

import math

import numpy as np
from tests.support.opcheck import OpCase, values

from pyggml.core import ops
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType, encode

F32, F16 = GGMLType.F32, GGMLType.F16


def _slopes(n_head, max_bias):
    if max_bias <= 0:
        return np.ones(n_head)
    n2 = 2 ** math.floor(math.log2(n_head))
    h = np.arange(n_head)
    return np.where(h < n2, 2.0 ** (-max_bias / n2 * (h + 1)), 2.0 ** (-max_bias / 2 / n2 * (2 * (h - n2) + 1)))


def _mask_for(mask, shape):
    """The mask (m3, m2, rows, cols) as seen by every (i3, i2) of shape: index modulo the mask's dims."""
    i3 = np.arange(shape[0]) % mask.shape[0]
    i2 = np.arange(shape[1]) % mask.shape[1]
    return mask[i3][:, i2][:, :, : shape[2], : shape[3]]


def ref_softmax(w, mask, max_bias, sinks):
    """Row softmax of w (ne3, head, rows, cols) + slope*mask, with sink logits joining the denominator."""
    if mask is not None:
        w = w + _slopes(w.shape[1], max_bias)[None, :, None, None] * _mask_for(values(mask), w.shape)
    peak = w.max(axis=-1, keepdims=True)
    sink = values(sinks).reshape(1, -1, 1, 1) if sinks is not None else None
    if sink is not None:
        peak = np.maximum(peak, sink)
    e = np.exp(w - peak)
    return e / (e.sum(axis=-1, keepdims=True) + (np.exp(sink - peak) if sink is not None else 0))


def _causal_mask(ctx, type_, n_kv, n_rows, ne2=1, ne3=1, n_past=None, seed=1):
    """A mask with -inf above a random diagonal and random finite values elsewhere."""
    m = ctx.new_tensor(type_, (n_kv, n_rows, ne2, ne3), name="mask")
    rng = np.random.default_rng(seed)
    vals = rng.uniform(-1, 1, (ne3, ne2, n_rows, n_kv))
    n_past = n_kv - n_rows if n_past is None else n_past
    vals[..., np.arange(n_kv)[None, :] > n_past + np.arange(n_rows)[:, None]] = -np.inf
    host_ndarray(m)[...] = encode(type_, vals.astype(np.float32))
    return m


# ----- diag_mask ----------------------------------------------------------------------------------

def diag_mask_case(name, fn, value, ne, n_past):
    def ref(out):
        a = values(out.src[0]).copy()
        a[..., np.arange(ne[0])[None, :] > n_past + np.arange(ne[1])[:, None]] = value
        return a
    return OpCase(name, lambda ctx: fn(ctx, ctx.new_tensor(F32, ne, name="a"), n_past), reference=ref)


# ----- soft_max -----------------------------------------------------------------------------------

def soft_max_case(name, ne, mask_type=None, mask_ne23=(1, 1), mask_rows_extra=0, scale=1.0, max_bias=0.0,
                  sinks=False):
    def build(ctx):
        a = ctx.new_tensor(F32, ne, name="a")
        mask = None
        if mask_type is not None:
            mask = _causal_mask(ctx, mask_type, ne[0], ne[1] + mask_rows_extra, *mask_ne23)
        out = ops.soft_max_ext(ctx, a, mask, scale, max_bias)
        if sinks:
            ops.soft_max_add_sinks(out, ctx.new_tensor(F32, (ne[2],), name="sinks"))
        return out

    def ref(out):
        return ref_softmax(values(out.src[0]) * np.float32(scale), out.src[1], max_bias, out.src[2])
    return OpCase(name, build, 1e-6, ref)


def soft_max_back_case(name, ne, scale):
    def build(ctx):
        y = ctx.new_tensor(F32, ne, name="y")
        rng = np.random.default_rng(7)
        logits = rng.uniform(-2, 2, host_ndarray(y).shape)
        host_ndarray(y)[...] = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
        return ops.soft_max_ext_back(ctx, ctx.new_tensor(F32, ne, name="dy"), y, scale, 0.0)

    def ref(out):
        dy, y = values(out.src[0]), values(out.src[1])
        return scale * y * (dy - (y * dy).sum(axis=-1, keepdims=True))
    return OpCase(name, build, reference=ref)


# ----- rope ---------------------------------------------------------------------------------------

def _ref_corr_dims(n_dims, n_ctx_orig, base, beta_fast, beta_slow):
    def corr_dim(n_rot):
        return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(corr_dim(beta_fast))), min(n_dims - 1.0, math.ceil(corr_dim(beta_slow)))


def rope_case(name, ne, n_dims, mode, type_=F32, freq_factors=False, n_ctx_orig=0, freq_base=10000.0,
              freq_scale=1.0, ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, max_pos=100, seed=3,
              fused_view=False, back=False):
    def build(ctx):
        if fused_view:  # a = the middle third of each row of a fused [3*ne0, ..] projection, as llama.cpp's qkv
            fused = ctx.new_tensor(type_, (3 * ne[0], *ne[1:]), name="qkv")
            a = ops.view_3d(ctx, fused, ne[0], ne[1], ne[2], fused.nb[1], fused.nb[2], ne[0] * fused.nb[0])
        else:
            a = ctx.new_tensor(type_, ne, name="a")
        pos = ctx.new_tensor(GGMLType.I32, (ne[2],), name="pos")
        host_ndarray(pos)[...] = np.random.default_rng(seed).integers(0, max_pos, ne[2])
        ff = None
        if freq_factors:
            ff = ctx.new_tensor(F32, (n_dims // 2,), name="freq_factors")
            host_ndarray(ff)[...] = np.random.default_rng(seed).uniform(0.9, 1.1, n_dims // 2)
        fn = ops.rope_ext_back if back else ops.rope_ext
        return fn(ctx, a, pos, ff, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                  beta_fast, beta_slow)

    def ref(out):
        x = values(out.src[0])
        pos = host_ndarray(out.src[1]).reshape(-1).astype(np.float64)
        i = np.arange(n_dims // 2)
        ff = values(out.src[2]).reshape(-1)[: n_dims // 2] if out.src[2] is not None else 1.0
        extrap = pos[:, None] * freq_base ** (-2.0 * i / n_dims) / ff
        theta, mscale = freq_scale * extrap, attn_factor
        if ext_factor != 0:
            low, high = _ref_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
            mix = (1 - np.clip((i - low) / max(0.001, high - low), 0, 1)) * ext_factor
            theta = theta * (1 - mix) + extrap * mix
            mscale *= 1 + 0.1 * math.log(1 / freq_scale)
        c, s = (np.cos(theta) * mscale)[None, :, None, :], (np.sin(theta) * mscale)[None, :, None, :]
        s = -s if back else s
        res = x.copy()
        if mode == ops.RopeType.NORMAL:
            x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
            res[..., 0:n_dims:2], res[..., 1:n_dims:2] = x0 * c - x1 * s, x0 * s + x1 * c
        else:
            h = n_dims // 2
            x0, x1 = x[..., :h], x[..., h:n_dims]
            res[..., :h], res[..., h:n_dims] = x0 * c - x1 * s, x0 * s + x1 * c
        return res
    return OpCase(name, build, 1e-7 if type_ == F32 else 1e-6, ref)


def rope_long_positions_case(name, ne, n_dims, freq_base, max_pos, seed=5):
    """Positions up to max_pos: angles must be built as ggml builds them (theta *= theta_scale, float32), since a
    float64 angle differs by ~1e-6 NMSE there. The reference runs that recurrence one pair at a time."""
    def build(ctx):
        a = ctx.new_tensor(F32, ne, name="a")
        pos = ctx.new_tensor(GGMLType.I32, (ne[2],), name="pos")
        host_ndarray(pos)[...] = np.random.default_rng(seed).integers(0, max_pos, ne[2])
        return ops.rope_ext(ctx, a, pos, None, n_dims, ops.RopeType.NEOX, 0, freq_base, 1.0, 0.0, 1.0, 0.0, 0.0)

    def ref(out):
        x = values(out.src[0])
        theta_scale = np.float32(freq_base ** float(np.float32(-2.0) / np.float32(n_dims)))
        theta = np.zeros((ne[2], n_dims // 2))
        for t, p in enumerate(host_ndarray(out.src[1]).reshape(-1)):
            angle = np.float32(p)
            for i in range(n_dims // 2):
                theta[t, i] = angle
                angle = np.float32(angle * theta_scale)
        c, s = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
        h = n_dims // 2
        res = x.copy()
        res[..., :h], res[..., h:n_dims] = x[..., :h] * c - x[..., h:n_dims] * s, x[..., :h] * s + x[..., h:n_dims] * c
        return res
    return OpCase(name, build, 1e-7, ref)


def _ref_stream_and_exponent(mode, sections, pair):
    """Which position stream drives a pair and the exponent of its frequency, read off ggml's rules."""
    sect_dims = sum(sections)
    sector = pair % sect_dims
    s0, s1, s2 = sections[:3]
    if mode == ops.RopeType.IMROPE:
        if sector % 3 == 1 and sector < 3 * s1:
            return 1, pair
        if sector % 3 == 2 and sector < 3 * s2:
            return 2, pair
        if sector % 3 == 0 and sector < 3 * s0:
            return 0, pair
        return 3, pair
    starts = [0, s0, s0 + s1, s0 + s1 + s2]
    stream = 0 if sector < s0 else 1 if sector < s0 + s1 else 2 if sector < s0 + s1 + s2 else 3
    return stream, (sector - starts[stream] if mode == ops.RopeType.VISION else pair)


def rope_multi_case(name, ne, n_dims, sections, mode, freq_base=10000.0, seed=4):
    def build(ctx):
        a = ctx.new_tensor(F32, ne, name="a")
        pos = ctx.new_tensor(GGMLType.I32, (4 * ne[2],), name="pos")
        host_ndarray(pos)[...] = np.random.default_rng(seed).integers(0, 50, 4 * ne[2])
        return ops.rope_multi(ctx, a, pos, None, n_dims, sections, mode, 0, freq_base, 1.0, 0.0, 1.0, 0.0, 0.0)

    def ref(out):
        x = values(out.src[0])
        pos = host_ndarray(out.src[1]).reshape(4, -1).astype(np.float64)
        vision = mode == ops.RopeType.VISION
        n_pairs = n_dims if vision else n_dims // 2
        theta = np.zeros((pos.shape[1], n_pairs))
        for i in range(n_pairs):
            stream, k = _ref_stream_and_exponent(mode, sections, i)
            theta[:, i] = pos[stream] * freq_base ** (-2.0 * k / n_dims)
        c, s = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
        lo, hi = (slice(0, n_dims), slice(n_dims, 2 * n_dims)) if vision else \
            (slice(0, n_dims // 2), slice(n_dims // 2, n_dims))
        res = x.copy()
        res[..., lo], res[..., hi] = x[..., lo] * c - x[..., hi] * s, x[..., lo] * s + x[..., hi] * c
        return res
    return OpCase(name, build, 1e-7, ref)


# ----- flash_attn_ext ---------------------------------------------------------------------------------

def flash_attn_case(name, d_k, d_v, n_head, n_head_kv, n_kv, n_tok, ne3=1, kv_type=F32, mask=True, mask_ne23=(1, 1),
                    scale=0.125, max_bias=0.0, softcap=0.0, sinks=False, permuted_q=False):
    def build(ctx):
        if permuted_q:  # the usual layout: q projected as [d_k, head, token] then permuted
            q = ops.permute(ctx, ctx.new_tensor(F32, (d_k, n_head, n_tok, ne3), name="q_base"), 0, 2, 1, 3)
        else:
            q = ctx.new_tensor(F32, (d_k, n_tok, n_head, ne3), name="q")
        k = ctx.new_tensor(kv_type, (d_k, n_kv, n_head_kv, ne3), name="k")
        v = ctx.new_tensor(kv_type, (d_v, n_kv, n_head_kv, ne3), name="v")
        m = _causal_mask(ctx, F16, n_kv, n_tok, *mask_ne23) if mask else None
        out = ops.flash_attn_ext(ctx, q, k, v, m, scale, max_bias, softcap)
        if sinks:
            ops.flash_attn_ext_add_sinks(out, ctx.new_tensor(F32, (n_head,), name="sinks"))
        return out

    def ref(out):
        q, k, v = (values(out.src[i]) for i in range(3))
        k = np.repeat(k, n_head // n_head_kv, axis=1)
        v = np.repeat(v, n_head // n_head_kv, axis=1)
        s = np.einsum("xhtd,xhkd->xhtk", q, k) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        return np.einsum("xhtk,xhkd->xthd", ref_softmax(s, out.src[3], max_bias, out.src[4]), v)
    return OpCase(name, build, 5e-4, ref)


CASES = [
    diag_mask_case("diag_mask_inf", ops.diag_mask_inf, -np.inf, (10, 6, 3, 2), 2),
    diag_mask_case("diag_mask_inf_np0", ops.diag_mask_inf, -np.inf, (7, 7, 2), 0),
    diag_mask_case("diag_mask_zero", ops.diag_mask_zero, 0.0, (10, 6, 3), 3),
    soft_max_case("soft_max", (32, 8, 3, 2)),
    soft_max_case("soft_max_ext_f32_mask", (32, 8, 4, 2), F32, scale=0.5),
    soft_max_case("soft_max_ext_f16_mask_extra_rows", (32, 7, 4), F16, mask_rows_extra=3, scale=0.3),
    soft_max_case("soft_max_ext_mask_bcast_heads", (16, 5, 6, 2), F32, mask_ne23=(3, 2)),
    soft_max_case("soft_max_ext_alibi", (16, 5, 6), F16, scale=0.7, max_bias=8.0),
    soft_max_case("soft_max_ext_sinks", (16, 5, 4, 2), F32, sinks=True),
    soft_max_back_case("soft_max_ext_back", (16, 5, 3, 2), 0.5),
    rope_case("rope_back_neox_yarn", (64, 2, 5), 64, ops.RopeType.NEOX, n_ctx_orig=512, freq_scale=0.25,
              ext_factor=1.0, back=True),
    rope_case("rope_normal", (64, 4, 5), 64, ops.RopeType.NORMAL),
    rope_case("rope_neox", (64, 4, 5), 64, ops.RopeType.NEOX),
    rope_case("rope_partial_dims", (64, 3, 6, 2), 32, ops.RopeType.NEOX),
    rope_case("rope_freq_factors", (32, 2, 5), 32, ops.RopeType.NORMAL, freq_factors=True),
    rope_case("rope_yarn", (64, 2, 7), 64, ops.RopeType.NEOX, n_ctx_orig=512, freq_scale=0.25, ext_factor=1.0,
              attn_factor=0.9, max_pos=2000),
    rope_case("rope_yarn_normal_ff", (32, 2, 5), 24, ops.RopeType.NORMAL, freq_factors=True, n_ctx_orig=256,
              freq_base=500000.0, freq_scale=0.5, ext_factor=0.5),
    rope_multi_case("rope_mrope", (32, 2, 5), 16, (2, 3, 3, 0), ops.RopeType.MROPE),
    rope_multi_case("rope_mrope_e_stream", (24, 2, 4), 24, (3, 3, 3, 3), ops.RopeType.MROPE),
    rope_multi_case("rope_imrope", (32, 3, 4), 32, (6, 5, 5, 0), ops.RopeType.IMROPE),
    rope_multi_case("rope_vision", (32, 2, 5), 16, (8, 8, 0, 0), ops.RopeType.VISION),
    rope_case("rope_strided_view", (32, 3, 4), 32, ops.RopeType.NEOX, fused_view=True),
    rope_long_positions_case("rope_long_positions", (128, 2, 6), 128, 1e6, 120000),
    rope_case("rope_f16", (32, 2, 4), 32, ops.RopeType.NEOX, type_=F16),
    flash_attn_case("flash_attn", 32, 32, 4, 4, 16, 5),
    flash_attn_case("flash_attn_gqa_dv", 32, 16, 8, 2, 24, 3, permuted_q=True),
    flash_attn_case("flash_attn_f16_kv", 64, 64, 4, 2, 32, 7, kv_type=F16),
    flash_attn_case("flash_attn_q8_0_kv", 64, 64, 4, 2, 32, 3, kv_type=GGMLType.Q8_0),
    flash_attn_case("flash_attn_nomask_ne3", 16, 16, 2, 1, 8, 4, ne3=2, mask=False),
    flash_attn_case("flash_attn_alibi_softcap", 32, 32, 6, 3, 16, 4, mask_ne23=(2, 1), max_bias=8.0, softcap=30.0),
    flash_attn_case("flash_attn_sinks", 16, 16, 4, 4, 8, 3, sinks=True),
]
