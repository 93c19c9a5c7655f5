"""Attention building blocks: causal masks, softmax with mask/ALiBi/sinks, rotary embeddings, flash attention."""

from __future__ import annotations

import math
from enum import IntEnum

import numpy as np

from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result
from pyggml.core.ops.matmul import Prec
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType

__all__ = [
    "RopeType", "diag_mask_inf", "diag_mask_inf_inplace", "diag_mask_zero", "diag_mask_zero_inplace",
    "soft_max", "soft_max_inplace", "soft_max_ext", "soft_max_ext_inplace", "soft_max_add_sinks",
    "soft_max_ext_back", "soft_max_ext_back_inplace",
    "rope", "rope_inplace", "rope_ext", "rope_ext_inplace", "rope_multi", "rope_multi_inplace", "rope_ext_back",
    "rope_multi_back", "rope_yarn_corr_dims",
    "flash_attn_ext", "flash_attn_ext_set_prec", "flash_attn_ext_get_prec", "flash_attn_ext_add_sinks",
]


class RopeType(IntEnum):
    """ggml's rope modes (GGML_ROPE_TYPE_*): NORMAL rotates adjacent pairs, NEOX pairs (i, i + n_dims/2)."""
    NORMAL = 0
    NEOX = 2
    MROPE = 8
    VISION = 24
    IMROPE = 40


# ----- causal masks -------------------------------------------------------------------------------

def _diag_mask(ctx: Context, op: Op, a: Tensor, n_past: int, inplace: bool) -> Tensor:
    return new_result(ctx, op, a.type, a.ne, srcs=(a,), params=(int(n_past),), inplace_of=a if inplace else None)


def diag_mask_inf(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Set a[.., j, i] = -inf where i > n_past + j (row j may see columns up to n_past + j)."""
    return _diag_mask(ctx, Op.DIAG_MASK_INF, a, n_past, False)


def diag_mask_inf_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return _diag_mask(ctx, Op.DIAG_MASK_INF, a, n_past, True)


def diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Like diag_mask_inf with 0 instead of -inf."""
    return _diag_mask(ctx, Op.DIAG_MASK_ZERO, a, n_past, False)


def diag_mask_zero_inplace(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    return _diag_mask(ctx, Op.DIAG_MASK_ZERO, a, n_past, True)


# ----- softmax ------------------------------------------------------------------------------------

def _soft_max(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float, inplace: bool) -> Tensor:
    op = "soft_max"
    check_shape(a.is_contiguous, op, "a must be contiguous", a)
    if mask is not None:
        check_type(mask.type in (GGMLType.F16, GGMLType.F32), op, "mask must be F16 or F32", mask)
        check_shape(mask.is_contiguous, op, "mask must be contiguous", mask)
        check_shape(mask.ne[0] == a.ne[0], op, f"mask.ne[0]={mask.ne[0]} != a.ne[0]={a.ne[0]}", a, mask)
        check_shape(mask.ne[1] >= a.ne[1], op, f"mask.ne[1]={mask.ne[1]} < a.ne[1]={a.ne[1]}", a, mask)
        check_shape(a.ne[2] % mask.ne[2] == 0 and a.ne[3] % mask.ne[3] == 0, op,
                    f"a.ne[2:4]={a.ne[2:4]} must be multiples of mask.ne[2:4]={mask.ne[2:4]}", a, mask)
    check_shape(max_bias <= 0.0 or mask is not None, op, f"max_bias={max_bias} > 0 (ALiBi) needs a mask", a)
    return new_result(ctx, Op.SOFT_MAX, a.type, a.ne, srcs=(a, mask), params=(float(scale), float(max_bias)),
                      inplace_of=a if inplace else None)


def soft_max(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, False)


def soft_max_inplace(ctx: Context, a: Tensor) -> Tensor:
    return _soft_max(ctx, a, None, 1.0, 0.0, True)


def soft_max_ext(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    """softmax(a*scale + slope*mask) over rows; mask rows are shared by all heads (dims 2, 3 broadcast)."""
    return _soft_max(ctx, a, mask, scale, max_bias, False)


def soft_max_ext_inplace(ctx: Context, a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    return _soft_max(ctx, a, mask, scale, max_bias, True)


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Attach per-head sink logits (F32 [n_head]) that join every row's softmax denominator; None detaches."""
    if sinks is None:
        a.src[2] = None
        return
    op = "soft_max_add_sinks"
    check_shape(a.op == Op.SOFT_MAX, op, f"expects a SOFT_MAX result, got op {a.op.name}", a)
    check_shape(a.src[2] is None, op, "sinks are already set", a)
    check_shape(a.src[0].ne[2] == sinks.ne[0], op, f"sinks.ne[0]={sinks.ne[0]} != n_head={a.src[0].ne[2]}", a, sinks)
    check_type(sinks.type == GGMLType.F32, op, "sinks must be F32", sinks)
    a.src[2] = sinks


def _soft_max_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float, inplace: bool) -> Tensor:
    return new_result(ctx, Op.SOFT_MAX_BACK, a.type, a.ne, srcs=(a, b), params=(float(scale), float(max_bias)),
                      inplace_of=a if inplace else None)


def soft_max_ext_back(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    """Gradient of soft_max_ext: a is the output's gradient dy, b the softmax output y."""
    return _soft_max_back(ctx, a, b, scale, max_bias, False)


def soft_max_ext_back_inplace(ctx: Context, a: Tensor, b: Tensor, scale: float, max_bias: float) -> Tensor:
    return _soft_max_back(ctx, a, b, scale, max_bias, True)


# ----- rotary position embedding -------------------------------------------------------------------

def _rope(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int, n_ctx_orig: int,
          freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float, beta_fast: float,
          beta_slow: float, inplace: bool, sections=None) -> Tensor:
    op = "rope"
    check_shape(mode & 1 == 0, op, f"mode={mode}: mode & 1 is no longer supported", a)
    check_shape(pos.n_dims == 1, op, "positions must be a vector", pos)
    check_type(pos.type == GGMLType.I32, op, "positions must be I32", pos)
    per_token = 4 if mode & RopeType.MROPE else 1
    check_shape(a.ne[2] * per_token == pos.ne[0], op,
                f"need {per_token} position(s) per a.ne[2]={a.ne[2]} tokens, got {pos.ne[0]}", a, pos)
    if freq_factors is not None:
        check_type(freq_factors.type == GGMLType.F32, op, "freq_factors must be F32", freq_factors)
        check_shape(freq_factors.ne[0] >= n_dims // 2, op, f"freq_factors needs >= n_dims/2={n_dims // 2} values",
                    freq_factors)
    params = (0, int(n_dims), int(mode), 0, int(n_ctx_orig), float(freq_base), float(freq_scale), float(ext_factor),
              float(attn_factor), float(beta_fast), float(beta_slow),
              *(sections if mode & RopeType.MROPE and sections is not None else (0, 0, 0, 0)))
    return new_result(ctx, Op.ROPE, a.type, a.ne, srcs=(a, pos, freq_factors), params=params,
                      inplace_of=a if inplace else None)


def rope(ctx: Context, a: Tensor, pos: Tensor, n_dims: int, mode: int) -> Tensor:
    """Rotate the first n_dims of every row of a [head_dim, n_head, n_tokens, ..] by position pos[token]."""
    return _rope(ctx, a, pos, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, False)


def rope_inplace(ctx: Context, a: Tensor, pos: Tensor, n_dims: int, mode: int) -> Tensor:
    return _rope(ctx, a, pos, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, True)


def rope_ext(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int,
             n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
             beta_fast: float, beta_slow: float) -> Tensor:
    """rope with per-frequency divisors (freq_factors) and YaRN context extension (ext_factor, beta_*)."""
    return _rope(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False)


def rope_ext_inplace(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int,
                     n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                     beta_fast: float, beta_slow: float) -> Tensor:
    return _rope(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, True)


def rope_multi(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, sections,
               mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
               beta_fast: float, beta_slow: float) -> Tensor:
    """Multi-axis rope (M-RoPE, Qwen2-VL): pos holds 4 streams (t, h, w, e) of a.ne[2] positions each and
    `sections` (4 ints) says how many dim pairs each stream rotates."""
    _check_sections(a, sections)
    return _rope(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, False, tuple(int(x) for x in sections))


def rope_multi_inplace(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, sections,
                       mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                       attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    _check_sections(a, sections)
    return _rope(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, True, tuple(int(x) for x in sections))


def rope_ext_back(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, mode: int,
                  n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float, attn_factor: float,
                  beta_fast: float, beta_slow: float) -> Tensor:
    """Gradient of rope_ext: the inverse rotation (ROPE_BACK with rope_ext's op_params)."""
    t = rope_ext(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow)
    t.op = Op.ROPE_BACK
    return t


def rope_multi_back(ctx: Context, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, sections,
                    mode: int, n_ctx_orig: int, freq_base: float, freq_scale: float, ext_factor: float,
                    attn_factor: float, beta_fast: float, beta_slow: float) -> Tensor:
    """Gradient of rope_multi (ROPE_BACK with rope_multi's op_params)."""
    t = rope_multi(ctx, a, pos, freq_factors, n_dims, sections, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                   attn_factor, beta_fast, beta_slow)
    t.op = Op.ROPE_BACK
    return t


def _check_sections(a: Tensor, sections) -> None:
    check_shape(len(sections) == 4, "rope_multi", f"sections must be 4 ints, got {list(sections)}", a)


def _yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> np.float32:
    """The dimension whose wavelength makes n_rot turns over n_ctx_orig positions, in ggml's float32 steps
    (n_ctx_orig = 0 gives -inf, as in C)."""
    f = np.float32
    with np.errstate(divide="ignore"):
        ratio = f(n_ctx_orig) / (f(n_rot) * f(2) * f(math.pi))
        return f(n_dims) * f(np.log(np.float64(ratio))) / (f(2) * f(np.log(np.float64(f(base)))))


def rope_yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                        beta_slow: float) -> tuple[float, float]:
    """YaRN's ramp ends (ggml_rope_yarn_corr_dims): dims below start keep extrapolated angles, above end
    interpolated ones."""
    start = np.floor(_yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, freq_base))
    end = np.ceil(_yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, freq_base))
    return float(max(np.float32(0), start)), float(min(np.float32(n_dims - 1), end))


# ----- flash attention ------------------------------------------------------------------------------

def flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float, logit_softcap: float) -> Tensor:
    """softmax(q·kᵀ*scale + mask)·v per head; result F32 [v.ne0, q.ne2 (heads), q.ne1 (tokens), q.ne3].

    q is [d_k, n_tokens, n_head, ne3], k [d_k, n_kv, n_head_kv, ne3], v [d_v, n_kv, n_head_kv, ne3];
    n_head must be a multiple of n_head_kv (grouped-query attention).
    """
    op = "flash_attn_ext"
    check_shape(k.ne[0] == q.ne[0], op, f"k.ne[0]={k.ne[0]} != q.ne[0]={q.ne[0]}", q, k)
    check_shape(q.ne[2] % k.ne[2] == 0 and q.ne[3] % k.ne[3] == 0, op,
                f"q.ne[2:4]={q.ne[2:4]} must be multiples of k.ne[2:4]={k.ne[2:4]}", q, k)
    check_shape(q.ne[3] == k.ne[3] == v.ne[3], op, "q, k and v must have the same ne[3]", q, k, v)
    if mask is not None:
        check_type(mask.type == GGMLType.F16, op, "mask must be F16", mask)
        check_shape(mask.is_contiguous, op, "mask must be contiguous", mask)
        check_shape(q.ne[2] % mask.ne[2] == 0 and q.ne[3] % mask.ne[3] == 0, op,
                    f"q.ne[2:4]={q.ne[2:4]} must be multiples of mask.ne[2:4]={mask.ne[2:4]}", q, mask)
    check_shape(max_bias <= 0.0 or mask is not None, op, f"max_bias={max_bias} > 0 (ALiBi) needs a mask", q)
    return new_result(ctx, Op.FLASH_ATTN_EXT, GGMLType.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]),
                      srcs=(q, k, v, mask), params=(float(scale), float(max_bias), float(logit_softcap)))


def _check_fa(t: Tensor, fn: str) -> None:
    check_shape(t.op == Op.FLASH_ATTN_EXT, fn, f"expects a FLASH_ATTN_EXT result, got op {t.op.name}", t)


def flash_attn_ext_set_prec(t: Tensor, prec: Prec) -> None:
    _check_fa(t, "flash_attn_ext_set_prec")
    t.set_op_params_i32(3, int(prec))


def flash_attn_ext_get_prec(t: Tensor) -> Prec:
    _check_fa(t, "flash_attn_ext_get_prec")
    return Prec(t.op_params_i32(3))


def flash_attn_ext_add_sinks(t: Tensor, sinks: Tensor | None) -> None:
    """Per-head sink logits (F32 [n_head]) in src[4]; None detaches."""
    if sinks is None:
        t.src[4] = None
        return
    fn = "flash_attn_ext_add_sinks"
    _check_fa(t, fn)
    check_shape(t.src[4] is None, fn, "sinks are already set", t)
    check_shape(t.src[0].ne[2] == sinks.ne[0], fn, f"sinks.ne[0]={sinks.ne[0]} != n_head={t.src[0].ne[2]}", t, sinks)
    check_type(sinks.type == GGMLType.F32, fn, "sinks must be F32", sinks)
    t.src[4] = sinks
