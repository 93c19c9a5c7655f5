"""CPU kernels for DIAG_MASK_*, SOFT_MAX, ROPE and FLASH_ATTN_EXT, following ggml's float32 steps where it matters.

Softmax sums in float64 as ggml does; rope rebuilds ggml's angle cache exactly (theta *= theta_scale in
float32, one factor per pair of dims), since angles of long positions amplify any rounding difference.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from pyggml.backend.cpu.jit import launched
from pyggml.backend.cpu.jit.attention import exp_score_rows, flash_attn_rows
from pyggml.backend.cpu.jit.mul_mat import dequantize_rows
from pyggml.backend.cpu.jit.rope import rope_rows
from pyggml.backend.cpu.jit.softmax import soft_max_rows
from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._blocks import blocks_per_row, in_blocks, memory_of
from pyggml.backend.cpu.kernels._common import (Scratch, as_f32, banded, flat_rows, overlap, split_over_threads, store,
                                                view)
from pyggml.backend.cpu.kernels._dequant_cache import dequantizable
from pyggml.core.ops.attention import RopeType, rope_yarn_corr_dims
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType

F32, F16 = GGMLType.F32, GGMLType.F16


# ----- causal masks -------------------------------------------------------------------------------

def _supports_diag_mask(dst: Tensor) -> bool:
    return dst.type == F32 and dst.src[0].type == F32


def _diag_mask(dst: Tensor, value: float) -> None:
    """Copy src into dst (a no-op in place) and write value where column i > n_past + row j."""
    out = view(dst)
    np.copyto(out, view(dst.src[0]))
    n_past = dst.op_params_i32(0)
    cols, rows = dst.ne[0], dst.ne[1]
    out[:, :, np.arange(cols)[None, :] > n_past + np.arange(rows)[:, None]] = value


@kernel(Op.DIAG_MASK_INF, supports=_supports_diag_mask)
def diag_mask_inf(dst: Tensor) -> None:
    _diag_mask(dst, -np.inf)


@kernel(Op.DIAG_MASK_ZERO, supports=_supports_diag_mask)
def diag_mask_zero(dst: Tensor) -> None:
    _diag_mask(dst, 0.0)


# ----- softmax ------------------------------------------------------------------------------------

def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi's per-head slope (1 for every head when max_bias is 0), as ggml's soft_max and flash_attn compute it."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=np.float32)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = np.float32(2.0 ** (-max_bias / n_head_log2))
    m1 = np.float32(2.0 ** (-(max_bias / 2.0) / n_head_log2))
    h = np.arange(n_head)
    slopes = np.where(h < n_head_log2, np.float64(m0) ** (h + 1), np.float64(m1) ** (2 * (h - n_head_log2) + 1))
    return slopes.astype(np.float32)


def _tiled(x: np.ndarray, reps_shape) -> np.ndarray:
    """x (ne3, ne2, ..) split so that a (m3, m2, ..) tensor broadcasts over it by index modulo (ggml's mask reuse)."""
    m3, m2 = reps_shape
    return np.reshape(x, (x.shape[0] // m3, m3, x.shape[1] // m2, m2, *x.shape[2:]), copy=False)


def _exp_rows(scores: np.ndarray, mask: Tensor | None, max_bias: float, sinks: Tensor | None, sum_dtype):
    """In place: scores += slope[head]*mask (mask reused by index modulo), then exp(scores - row max).

    Returns each row's denominator (sum, plus exp(sink - max) with sinks). The row max includes the
    sink; a row that is all -inf is shifted by 0, so it exponentiates to zeros instead of NaN.
    """
    _, n_head, n_rows, n_cols = scores.shape
    if mask is not None:
        m = as_f32(mask)[:, :, :n_rows, :n_cols]
        m3, m2 = m.shape[:2]
        tiled = _tiled(scores, (m3, m2))
        if max_bias == 0.0:  # every slope is 1: no product to form
            tiled += m[None, :, None, :, :, :]
        else:
            tiled += alibi_slopes(n_head, max_bias).reshape(1, 1, n_head // m2, m2, 1, 1) * m[None, :, None, :, :, :]
    peak = scores.max(axis=-1, keepdims=True)
    sink = as_f32(sinks).reshape(1, -1, 1, 1) if sinks is not None else None
    if sink is not None:
        np.maximum(peak, sink, out=peak)
    peak[np.isneginf(peak)] = 0
    with np.errstate(invalid="ignore"):  # a row holding +inf gives NaN, as in ggml
        scores -= peak
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True, dtype=sum_dtype)
    if sink is not None:
        total += np.exp(sink - peak)
    return total


def _supports_soft_max(dst: Tensor) -> bool:
    a, mask, sinks = dst.src[0], dst.src[1], dst.src[2]
    return (dst.type == F32 and a.type == F32 and (mask is None or mask.type in (F32, F16))
            and (sinks is None or sinks.type == F32))


def _bits_or_f32(t: Tensor) -> np.ndarray:
    """t's memory as the compiled kernels read it: float32 values, or F16 as uint16 bit patterns."""
    return view(t).view(np.uint16) if t.type == F16 else view(t)


NO_MASK = np.zeros((0, 0, 0, 0), np.float32)
NEG_INF_F16_BITS = np.uint16(0xFC00)  # -inf in an F16 mask, as the compiled kernels read it
NO_SINKS = np.zeros(0, np.float32)


def _bind_soft_max(dst: Tensor):
    """The compiled soft_max (F32 or F16 mask, or none)."""
    a, mask, sinks = dst.src[0], dst.src[1], dst.src[2]
    x, out = view(a), view(dst)
    m = _bits_or_f32(mask)[:, :, : a.ne[1], : a.ne[0]] if mask is not None else NO_MASK
    sink = view(sinks).reshape(-1) if sinks is not None else NO_SINKS
    scale, slopes = np.float32(dst.op_params_f32(0)), alibi_slopes(a.ne[2], dst.op_params_f32(1))
    if overlap(out, x) or np.may_share_memory(out, m) or np.may_share_memory(out, sink):
        # planned memory may put dst over a source: read copies, so results stay those of the compiled kernel
        return lambda: soft_max_rows(x.copy(), out, scale, m.copy(), slopes, sink.copy())
    if m.shape[1] > 1 or a.ne[2] == 1:
        return functools.partial(soft_max_rows, x, out, scale, m, slopes, sink)

    def heads(lo: int, hi: int) -> None:
        """Heads [lo, hi) on this thread: a prompt's heads take equal work under a causal mask, its rows do not."""
        soft_max_rows(x[:, lo:hi], out[:, lo:hi], scale, m, slopes[lo:hi], sink[lo:hi] if sink.size else sink)
    return banded(a.ne[2], a.nelements, heads)


@kernel(Op.SOFT_MAX, supports=_supports_soft_max, bind=_bind_soft_max)
def soft_max(dst: Tensor) -> None:
    """softmax(a*scale + slope[head]*mask) over each row, with optional per-head sinks in the denominator."""
    a, mask, sinks = dst.src[0], dst.src[1], dst.src[2]
    scale, max_bias = dst.op_params_f32(0), dst.op_params_f32(1)
    scores = view(a) * np.float32(scale)  # not computed in dst: in place, dst may share the mask's memory
    total = _exp_rows(scores, mask, max_bias, sinks, np.float64)
    np.multiply(scores, (1.0 / total).astype(np.float32), out=view(dst))


@kernel(Op.SOFT_MAX_BACK, supports=lambda dst: dst.type == F32 and all(t.type == F32 for t in dst.srcs)
        and dst.op_params_f32(1) == 0.0)
def soft_max_back(dst: Tensor) -> None:
    """dx = scale * y * (dy - <y, dy>) per row, from dy (src0) and the softmax output y (src1)."""
    dy, y = as_f32(dst.src[0]), as_f32(dst.src[1])
    dot = np.einsum("...i,...i->...", y, dy, dtype=np.float64)[..., None].astype(np.float32)
    store(dst, np.float32(dst.op_params_f32(0)) * (y * (dy - dot)))


# ----- rotary position embedding -------------------------------------------------------------------

def _supports_rope(dst: Tensor) -> bool:
    a, pos, factors = dst.src[0], dst.src[1], dst.src[2]
    mode = dst.op_params_i32(2)
    sections = [dst.op_params_i32(i) for i in range(11, 15)]
    return (a.type in (F32, F16) and dst.type == a.type and pos.type == GGMLType.I32
            and mode in tuple(RopeType) and (factors is None or factors.type == F32)
            and (not mode & RopeType.MROPE or (any(x > 0 for x in sections[:3]) and sum(sections) <= a.ne[0]))
            and (mode != RopeType.VISION or 2 * dst.op_params_i32(1) == a.ne[0]))


def _yarn_ramp(low: float, high: float, n_pairs: int) -> np.ndarray:
    """rope_yarn_ramp for pair i (ggml's i0/2): 1 below `low`, 0 above `high`, linear between (float32)."""
    y = (np.arange(n_pairs, dtype=np.float32) - np.float32(low)) / np.float32(max(0.001, high - low))
    return np.float32(1) - np.minimum(np.float32(1), np.maximum(np.float32(0), y))


def _streams(mode: int, sections: list[int], n_pairs: int):
    """For each dim pair: which position stream (0 t, 1 h, 2 w, 3 e) drives it, and after how many
    theta_scale steps (ggml's mrope cache: one stream for plain rope; VISION restarts each section)."""
    pair = np.arange(n_pairs)
    if not mode & RopeType.MROPE:
        return np.zeros(n_pairs, dtype=np.int64), pair
    starts = np.concatenate([[0], np.cumsum(sections)[:3]])
    sector = pair % sum(sections)
    if mode == RopeType.IMROPE:
        in_stream = [(sector % 3 == s) & (sector < 3 * sections[s]) for s in (1, 2, 0)]
        stream = np.select(in_stream, [1, 2, 0], 3)
    else:
        stream = np.searchsorted(starts[1:], sector, side="right")
    return stream, (sector - starts[stream] if mode == RopeType.VISION else pair)


def rope_cos_sin(dst: Tensor, positions: np.ndarray, freq_factors: np.ndarray | None):
    """cos and sin (times the magnitude scale) per (token, pair), as ggml's rope cache init + rope_yarn compute them.

    positions is (n_streams, n_tokens). Angles are position * theta_scale^k built by repeated float32
    multiplication, as ggml does, since long positions amplify any rounding difference.
    """
    n_dims, mode = dst.op_params_i32(1), dst.op_params_i32(2)
    n_ctx_orig = dst.op_params_i32(4)
    freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = (
        np.float32(dst.op_params_f32(i)) for i in range(5, 11))
    n_pairs = n_dims if mode == RopeType.VISION else n_dims // 2
    if n_pairs == 0:  # ggml accepts n_dims == 0 and rotates nothing: the rows are copied as they are
        nothing = np.zeros((positions.shape[-1], 0), np.float32)
        return nothing, nothing
    theta_scale = np.float32(float(freq_base) ** float(np.float32(-2.0) / np.float32(n_dims)))
    steps = np.full((*positions.shape, n_pairs), theta_scale, dtype=np.float32)
    steps[..., 0] = positions.astype(np.float32)
    chains = np.multiply.accumulate(steps, axis=-1)        # (stream, token, k): position * theta_scale^k
    stream, k = _streams(mode, [dst.op_params_i32(i) for i in range(11, 15)], n_pairs)
    theta_extrap = chains[stream, :, k].T                  # (token, pair)
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors[:n_pairs]
    theta = freq_scale * theta_extrap
    mscale = attn_factor
    if ext_factor != 0:
        low, high = rope_yarn_corr_dims(n_dims, n_ctx_orig, float(freq_base), float(beta_fast), float(beta_slow))
        ramp_mix = _yarn_ramp(low, high, n_pairs) * ext_factor
        theta = theta * (np.float32(1) - ramp_mix) + theta_extrap * ramp_mix
        mscale = mscale * (np.float32(1) + np.float32(0.1) * np.float32(math.log(np.float32(1) / freq_scale)))
    theta64 = theta.astype(np.float64)  # cosf/sinf are correctly rounded; float64 then rounding matches them
    return np.cos(theta64).astype(np.float32) * mscale, np.sin(theta64).astype(np.float32) * mscale


_ANGLES: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
MAX_ANGLES = 64  # (params, positions) sets kept; a step has a few (one per rope base), all layers share them


def cached_cos_sin(dst: Tensor, positions: np.ndarray, freq_factors: np.ndarray | None):
    """rope_cos_sin, remembered (read-only): every layer's Q and K in a step rotate by the same angles."""
    key = (tuple(dst.op_params), positions.shape, positions.tobytes(),
           None if freq_factors is None else freq_factors.tobytes())
    angles = _ANGLES.get(key)
    if angles is None:
        # contiguous rows of pairs (rope_cos_sin's are transposed): NumPy's inner loops then run along them, ~7x faster
        angles = tuple(np.ascontiguousarray(a) for a in rope_cos_sin(dst, positions, freq_factors))
        for a in angles:
            a.flags.writeable = False
        if len(_ANGLES) >= MAX_ANGLES:
            _ANGLES.clear()
        _ANGLES[key] = angles
    return angles


def _rotated_halves(mode: int, n_dims: int):
    """The two index sets rotated together: adjacent pairs (NORMAL), i and i + n_dims/2 (NEOX, MROPE,
    IMROPE), or i and i + n_dims over the whole row (VISION)."""
    if mode == RopeType.NORMAL:
        return slice(0, n_dims, 2), slice(1, n_dims, 2)
    if mode == RopeType.VISION:
        return slice(0, n_dims), slice(n_dims, 2 * n_dims)
    return slice(0, n_dims // 2), slice(n_dims // 2, n_dims)


def _bind_rope(dst: Tensor):
    """The compiled rotation for F32 rows in the NORMAL and NEOX modes; the angles come from the cache."""
    a, pos, factors = dst.src[0], dst.src[1], dst.src[2]
    n_dims, mode = dst.op_params_i32(1), dst.op_params_i32(2)
    if a.type != F32 or mode not in (RopeType.NORMAL, RopeType.NEOX) or n_dims % 2:
        return None
    x, out = view(a), view(dst)
    if overlap(out, x):
        return None
    positions = view(pos).reshape(-1, a.ne[2])
    freq_factors = view(factors).reshape(-1) if factors is not None else None
    sign = np.float32(-1 if dst.op == Op.ROPE_BACK else 1)

    def call():
        cos, sin = cached_cos_sin(dst, positions, freq_factors)
        rope_rows(x, out, cos, sin, n_dims, mode == RopeType.NEOX, sign)

    return call


@kernel(Op.ROPE, Op.ROPE_BACK, supports=_supports_rope, bind=_bind_rope)
def rope(dst: Tensor) -> None:
    """Rotate pairs (x0, x1) of each row by the token's angles (ROPE_BACK: by minus them); dims past the
    rotated ones are copied."""
    a, pos, factors = dst.src[0], dst.src[1], dst.src[2]
    n_dims, mode = dst.op_params_i32(1), dst.op_params_i32(2)
    positions = view(pos).reshape(-1, a.ne[2])              # (1 or 4 streams, tokens)
    x, out = as_f32(a), view(dst)
    cos, sin = cached_cos_sin(dst, positions, as_f32(factors).reshape(-1) if factors is not None else None)
    if dst.op == Op.ROPE_BACK:
        sin = -sin
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, tokens, 1, pairs) against (ne3, ne2, ne1, ..)
    first, second = _rotated_halves(mode, n_dims)
    x0, x1 = x[..., first], x[..., second]
    rotated_end = 2 * n_dims if mode == RopeType.VISION else n_dims
    if rotated_end < a.ne[0]:
        out[..., rotated_end:] = view(a)[..., rotated_end:]
    if dst.type != F32 or np.may_share_memory(out, x):  # rounded once / in place: through temporaries
        rotated0, rotated1 = x0 * cos - x1 * sin, x0 * sin + x1 * cos
        out[..., first], out[..., second] = rotated0, rotated1
        return
    out0, out1 = out[..., first], out[..., second]
    np.multiply(x0, cos, out=out0)
    out0 -= x1 * sin
    np.multiply(x0, sin, out=out1)
    out1 += x1 * cos


# ----- flash attention ------------------------------------------------------------------------------

def _supports_flash_attn(dst: Tensor) -> bool:
    q, k, v, mask, sinks = dst.src[:5]
    return (dst.type == F32 and q.type in (F32, F16) and dequantizable(k.type) and dequantizable(v.type)
            and (mask is None or mask.type in (F16, F32)) and (sinks is None or sinks.type == F32))


def _grouped(x: np.ndarray, n_groups: int) -> np.ndarray:
    """(ne3, n_head, ..) -> (ne3, n_groups, n_head / n_groups, ..): consecutive heads share one K/V head."""
    return x.reshape(x.shape[0], n_groups, x.shape[1] // n_groups, *x.shape[2:])


COMPILED_ATTN_TOKENS = 8  # up to this many query rows, products in compiled loops; more: BLAS's (an encoder's 1500)
COMPILED_ATTN_KEYS = 1024  # more keys than this: BLAS's products too (a reduction per key costs more there:
                           # Whisper's cross-attention over 1500 positions, 38 -> 25 ms for 7 s of tiny.en)


def _dequantizing(t: Tensor):
    """For a quantized 3-D K or V view ([d, n_kv, n_head_kv], rows of whole blocks): (a float32 array of its
    values (1, n_head_kv, n_kv, d), a call fill(cells) that fills it with the tensor's current values of those
    cells (None: all), every head, through the type's compiled dequantizer), as ggml's flash attention reads a
    quantized cache row by row in float32. The other cells' values are left as they were: the mask hides them."""
    src, first = memory_of(t)
    j, h = np.arange(t.ne[1])[None, :], np.arange(t.ne[2])[:, None]
    rows = (first + j * t.nb[1] + h * t.nb[2]).reshape(-1).astype(np.uint64)
    values = np.empty((1, t.ne[2], t.ne[1], t.ne[0]), np.float32)
    dequantize, nb, flat = dequantize_rows[int(t.type)], blocks_per_row(t), values.reshape(-1, t.ne[0])

    def fill(cells: np.ndarray | None) -> None:
        if cells is None or cells.size == t.ne[1]:
            dequantize(src, rows, nb, flat)
            return
        at = (np.arange(t.ne[2])[:, None] * t.ne[1] + cells[None, :]).reshape(-1)
        part = np.empty((at.size, t.ne[0]), np.float32)
        dequantize(src, rows[at], nb, part)
        flat[at] = part
    return values, fill


def _key_visibility(m: np.ndarray, n_tokens: int, n_kv: int) -> np.ndarray:
    """(n_tokens, n_kv): whether some plane of the mask m lets query row t see key j (not -inf). Many sequences
    in one cache each see only their own cells."""
    rows = m[:, :, :n_tokens, :n_kv]
    hidden = NEG_INF_F16_BITS if rows.dtype == np.uint16 else np.float32(-np.inf)
    return (rows != hidden).any(axis=(0, 1))


def _few_keys_seen(visible: np.ndarray) -> bool:
    """Whether the compiled loops, which skip each key the mask hides, beat BLAS's products over every key: no
    query row sees more than COMPILED_ATTN_KEYS keys, and the rows are few (generation) or each sees a quarter of
    the keys at most (the sequences of one shared cache, each over its own cells)."""
    seen = visible.sum(axis=1)
    return bool(seen.max() <= COMPILED_ATTN_KEYS
                and (visible.shape[0] <= COMPILED_ATTN_TOKENS or 4 * seen.sum() <= visible.size))


def _bind_quantized_flash_attn(dst: Tensor):
    """flash_attn_ext over a quantized K or V (a quantized KV cache, as llama.cpp's -ctk / -ctv) for a few
    query rows (generation) or rows that each see few keys (many sequences' steps): the rows some query sees
    dequantized to float32 first, then the compiled attention."""
    q, k, v, mask, sinks = dst.src[:5]
    if ((q.ne[1] > COMPILED_ATTN_TOKENS and mask is None) or q.ne[3] != 1
            or not all(t.type in (F32, F16) or in_blocks(t) for t in (k, v))):
        return None
    parts = [_dequantizing(t) if t.type not in (F32, F16) else (_bits_or_f32(t), None) for t in (k, v)]
    fills = [fill for _, fill in parts if fill is not None]
    scale, max_bias, softcap = (dst.op_params_f32(i) for i in range(3))
    qs, out = _bits_or_f32(q), view(dst)
    m = _bits_or_f32(mask) if mask is not None else NO_MASK
    sink = view(sinks).reshape(-1) if sinks is not None else NO_SINKS
    if any(np.may_share_memory(out, x) for x in (qs, m, sink, *(a for a, fill in parts if fill is None))):
        return None  # planned memory shared with the result: the NumPy kernel
    bound = launched(functools.partial(flash_attn_rows, qs, *flat_rows(parts[0][0]), *flat_rows(parts[1][0]),
                                        np.array([k.ne[2], k.ne[1], v.ne[0]], np.int64), m, sink,
                                        alibi_slopes(q.ne[2], max_bias), out,
                                        np.float32(scale / softcap if softcap != 0.0 else scale), np.float32(softcap)))

    def call() -> None:
        cells = None  # without a mask: every key
        if mask is not None:
            visible = _key_visibility(m, q.ne[1], k.ne[1])
            if q.ne[1] > COMPILED_ATTN_TOKENS and not _few_keys_seen(visible):
                flash_attn_ext(dst)  # a prompt over its own keys: the NumPy kernel's products
                return
            cells = np.flatnonzero(visible.any(axis=0))  # the keys some row sees
        for fill in fills:
            fill(cells)
        bound()
    return call


def _bind_flash_attn(dst: Tensor):
    """The compiled attention for F32 or F16 q, K, V and mask: all of it for a few query rows over a few
    keys (generation), else BLAS products around the compiled exp rows, one K/V head at a time (a score
    matrix per head, not per layer)."""
    q, k, v, mask, sinks = dst.src[:5]
    if any(t is not None and t.type not in (F32, F16) for t in (q, mask)):
        return None
    if k.type not in (F32, F16) or v.type not in (F32, F16):
        return _bind_quantized_flash_attn(dst)
    scale, max_bias, softcap = (dst.op_params_f32(i) for i in range(3))
    pre_scale = np.float32(scale / softcap if softcap != 0.0 else scale)
    out = view(dst)
    m = _bits_or_f32(mask) if mask is not None else NO_MASK
    sink = view(sinks).reshape(-1) if sinks is not None else NO_SINKS
    slopes = alibi_slopes(q.ne[2], max_bias)
    by_heads = functools.partial(_attention_by_heads, dst, pre_scale, np.float32(softcap), m, slopes, sink)
    few_rows, few_keys = q.ne[1] <= COMPILED_ATTN_TOKENS, k.ne[1] <= COMPILED_ATTN_KEYS
    if mask is None and not (few_rows and few_keys):
        return by_heads
    qs, ks, vs = _bits_or_f32(q), _bits_or_f32(k), _bits_or_f32(v)
    kv_dims = np.array([k.ne[2], k.ne[1], v.ne[0]], np.int64)
    rest = (slopes, out, pre_scale, np.float32(softcap))
    if any(np.may_share_memory(out, x) for x in (qs, ks, vs, m, sink)):  # planned memory: read copies, same results
        def rows() -> None:
            flash_attn_rows(qs.copy(), *flat_rows(ks.copy()), *flat_rows(vs.copy()), kv_dims, m.copy(), sink.copy(),
                            *rest)
    else:
        rows = functools.partial(flash_attn_rows, qs, *flat_rows(ks), *flat_rows(vs), kv_dims, m, sink, *rest)
    compiled = launched(rows)
    if few_rows and few_keys:
        return compiled

    def by_visible_keys() -> None:
        """Many rows or keys: BLAS's products over the span of keys each block of query rows sees, unless the
        rows each see few keys scattered over wide spans (the sequences of one shared cache): the compiled loops."""
        visible = _key_visibility(m, q.ne[1], k.ne[1])
        block = _query_block(dst, masked=True)
        spans = _key_spans(visible, block)
        span_work = sum((min(q.ne[1], b + block) - b) * (j1 - j0) for b, (j0, j1) in zip(range(0, q.ne[1], block),
                                                                                          spans, strict=True))
        if _few_keys_seen(visible) and span_work > SPAN_SLACK * visible.sum():
            compiled()
        else:
            by_heads(spans=spans)
    return by_visible_keys


ATTN_SCORE_BYTES = 8 << 20  # the float32 scores of one task: query rows in blocks of this many bytes of scores, so
                            # that the exp pass and the V product read them from cache (Gemma 3's 4096 patches:
                            # 15% less CPU time than a head's whole 64 MiB score matrix)
MASKED_QUERY_ROWS = 128     # with a mask, blocks of at most this many query rows, each over the keys it sees
SPAN_SLACK = 4              # BLAS over the spans while they hold at most this many times the keys the rows see


def _score_rows(dst: Tensor) -> int:
    """Query rows whose float32 scores against every key, for the query heads of one K/V head, fill ATTN_SCORE_BYTES."""
    q, k = dst.src[0], dst.src[1]
    return ATTN_SCORE_BYTES // (4 * k.ne[1] * (q.ne[2] // k.ne[2]))


def _query_block(dst: Tensor, masked: bool) -> int:
    """Query rows per task of _attention_by_heads: blocks of even size without a mask (Whisper's 1500 rows: 750 and
    750, not 1398 and 102); with one, multiples of MASKED_QUERY_ROWS, which windows of a power of two align to."""
    q = dst.src[0]
    rows = max(1, _score_rows(dst))
    if masked:
        return min(q.ne[1], MASKED_QUERY_ROWS, rows)
    return -(-q.ne[1] // -(-q.ne[1] // rows))


def _key_spans(visible: np.ndarray, block: int) -> list[tuple[int, int]]:
    """For each block of query rows, the keys [j0, j1) from the first to the last one some row of it sees (at
    least one key: a block that sees none still yields ggml's zeros through a masked key). Qwen2.5-VL's window
    attention: each block sees its windows' keys, not all 1024 and more."""
    spans = []
    for b in range(0, visible.shape[0], block):
        seen = np.flatnonzero(visible[b:b + block].any(axis=0))
        spans.append((int(seen[0]), int(seen[-1]) + 1) if seen.size else (0, 1))
    return spans


_SCORES, _WEIGHTED = Scratch(), Scratch()  # each task's (planes, group, rows, keys) and (.., rows, d_v) float32


def _attention_by_heads(dst: Tensor, pre_scale, softcap, mask, slopes, sinks, spans=None) -> None:
    """flash_attn_ext for many query rows: per plane of q's 4th dimension, K/V head and block of query rows, scores
    by BLAS, exp rows compiled, weighted V by BLAS; the tasks shared out over the threads (split_over_threads), each
    writing its part of dst. spans: the keys each block sees (_key_spans, blocks of _query_block(dst, masked=True)
    rows); None: all. A plane a task (mask planes reused by index modulo, as ggml's): blocks of as many rows for a batch
    of Whisper windows as for one (7 windows' encoder attention together in blocks of 190 rows took 1.4x the time
    of each window's blocks of 750)."""
    q, k, v = dst.src[:3]
    n_head_kv, group, n_tokens = k.ne[2], q.ne[2] // k.ne[2], q.ne[1]
    qs, ks, vs = as_f32(q), as_f32(k), as_f32(v)        # (ne3, head, token, d)
    out = view(dst)                                     # (ne3, token, head, d_v)
    apart = any(np.may_share_memory(out, x) for x in (qs, ks, vs, mask))
    if apart:
        out = np.empty_like(out)  # planned memory over a source: written after every task has read it
    m = mask if mask.size == 0 else np.ascontiguousarray(mask[:, :, :n_tokens, :k.ne[1]])
    block = _query_block(dst, masked=spans is not None)
    n_blocks, n_planes = -(-n_tokens // block), q.ne[3]
    per_task = _planes_per_task(dst, m)
    n_tasks = -(-n_planes // per_task) * n_head_kv * n_blocks

    def task(i: int) -> None:
        i3, rest = divmod(i, n_head_kv * n_blocks)
        hk, b = divmod(rest, n_blocks)
        heads, rows = slice(hk * group, (hk + 1) * group), slice(b * block, min(n_tokens, (b + 1) * block))
        keys = slice(*spans[b]) if spans is not None else slice(None)
        first, last = i3 * per_task, min(n_planes, (i3 + 1) * per_task)
        plane = slice(first, last)
        x, y = qs[plane, heads, rows], ks[plane, hk, None, keys].swapaxes(-1, -2)
        scores = np.matmul(x, y, out=_SCORES.take((*x.shape[:3], y.shape[-1])))  # (planes, group, rows, keys)
        head_mask = m if m.size == 0 else np.ascontiguousarray(m[_mask_planes(m, first, last), :, rows, keys])
        if head_mask.size and head_mask.shape[1] > 1:
            head_mask = _heads_of(head_mask, heads, q.ne[2])
        totals = np.empty(scores.shape[:3], np.float32)
        exp_score_rows(scores, pre_scale, softcap, head_mask, slopes[heads], sinks[heads] if sinks.size else sinks,
                       totals)
        weighted = np.matmul(scores, vs[plane, hk, None, keys], out=_WEIGHTED.take((*scores.shape[:3], v.ne[0])))
        weighted /= totals[..., None]
        weighted[totals == 0] = 0  # every key masked and no sink: zeros, as in ggml
        out[plane, rows, heads] = weighted.transpose(0, 2, 1, 3)

    split_over_threads(task, n_tasks)
    if apart:
        store(dst, out)


def _planes_per_task(dst: Tensor, mask: np.ndarray) -> int:
    """Planes of q's 4th dimension that one task of _attention_by_heads takes: one, unless a plane's rows are few
    (Whisper's batched decoder steps: a row per window) and the mask has one plane or one per q plane; then as
    many as fill ATTN_SCORE_BYTES of scores."""
    q = dst.src[0]
    if mask.size and mask.shape[0] not in (1, q.ne[3]):
        return 1
    return max(1, min(q.ne[3], _score_rows(dst) // q.ne[1]))


def _mask_planes(mask: np.ndarray, first: int, last: int) -> slice:
    """The planes of the mask that q's planes [first, last) read: mask planes are reused by index modulo, as
    ggml's; a task of several planes has a mask of one plane or of one per q plane (_planes_per_task)."""
    if mask.shape[0] == 1:
        return slice(0, 1)
    if last - first == 1:
        return slice(first % mask.shape[0], first % mask.shape[0] + 1)
    return slice(first, last)


def _heads_of(mask: np.ndarray, heads: slice, n_head: int) -> np.ndarray:
    """The mask planes that heads use (mask planes are reused by head index modulo their count)."""
    return mask[:, np.arange(n_head)[heads] % mask.shape[1]]


@kernel(Op.FLASH_ATTN_EXT, supports=_supports_flash_attn, bind=_bind_flash_attn)
def flash_attn_ext(dst: Tensor) -> None:
    """softmax(softcap(q·kᵀ*scale) + slope*mask (+ sinks)) · v, written in ggml's permuted [d_v, head, token] order.

    A row whose keys are all masked (and has no sink) gives zeros, as in ggml (S == 0).
    """
    q, k, v, mask, sinks = dst.src[:5]
    scale, max_bias, softcap = (dst.op_params_f32(i) for i in range(3))
    n_head, n_kv = q.ne[2], k.ne[1]
    qs = as_f32(q)                                             # (ne3, head, token, d_k)
    ks = as_f32(k)                                             # (ne3, head_kv, kv, d_k)
    scores = np.matmul(_grouped(qs, k.ne[2]), ks[:, :, None].swapaxes(-1, -2)).reshape(
        q.ne[3], n_head, q.ne[1], n_kv)                        # (ne3, head, token, kv)
    if softcap != 0.0:
        scores *= np.float32(scale / softcap)
        np.tanh(scores, out=scores)
        scores *= np.float32(softcap)
    else:
        scores *= np.float32(scale)
    total = _exp_rows(scores, mask, max_bias, sinks, np.float32)
    weighted = np.matmul(_grouped(scores, v.ne[2]), as_f32(v)[:, :, None]).reshape(
        q.ne[3], n_head, q.ne[1], v.ne[0])                     # (ne3, head, token, d_v)
    np.divide(weighted, total, out=weighted, where=total != 0)
    store(dst, weighted.transpose(0, 2, 1, 3))
