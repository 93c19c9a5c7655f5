"""The compiled (Numba) kernels of cpu.jit against the NumPy kernels they stand in for, on random inputs and
edge shapes: each case is computed once through the pre-bound compiled call and once by the NumPy kernel."""

import functools

import numpy as np
import pytest
from tests.support.opcheck import fill_random

from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.jit import glu as jit_glu
from pyggml.backend.cpu.jit.f16 import f16_bits, f16_bits_small, f16_to_f32_values, f32_to_f16
from pyggml.backend.cpu.jit.floatbits import expf
from pyggml.backend.cpu.jit import jit
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import GluOp, UnaryOp, host_ndarray
from pyggml.core.types import GGMLType as G
from pyggml.errors import OutOfBoundsError

NEOX, NORMAL = 2, 0


def compiled_and_numpy(build, seed=0, ulps=0, rel=0.0):
    """Build a node, fill its inputs, run its bound call and its NumPy kernel; assert the call is compiled
    (not the NumPy kernel) and the two outputs agree within `ulps` float32 ulps, or within `rel` times the
    largest output (sums in another order), or exactly (NaN where NaN)."""
    ctx = Context()
    node = build(ctx)
    rng = np.random.default_rng(seed)
    for s in node.srcs:
        if s.view_src is None and (s.type in (G.F32, G.F16, G.Q8_0, G.Q4_0)) and not host_ndarray(s).any():
            fill_random(s, rng)
    kernel = kernels.KERNELS[node.op]
    call = kernels.bound(node, kernel)
    assert not (isinstance(call, functools.partial) and call.func is kernel.fn), "not bound to a compiled call"
    inputs = [(host_ndarray(s), host_ndarray(s).copy()) for s in node.srcs]
    with np.errstate(all="ignore"):
        call()
        got = host_ndarray(node).astype(np.float32)  # F16 outputs widened
        for memory, before in inputs:  # the same inputs again for an in-place node
            memory[...] = before
        kernel.fn(node)
        want = host_ndarray(node).astype(np.float32)
    if rel:
        np.testing.assert_allclose(got, want, rtol=0, atol=rel * np.abs(want).max())
    elif ulps:
        np.testing.assert_array_max_ulp(got, want, maxulp=ulps)
    else:
        np.testing.assert_array_equal(got, want)
    return node


def test_f16_rounding_matches_numpy_on_every_half_and_the_midpoints():
    halves = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = halves[np.isfinite(halves)]
    x = np.concatenate([halves, np.nextafter(finite, np.float32(np.inf)), np.nextafter(finite, np.float32(-np.inf)),
                        (finite[:-1] / 2 + finite[1:] / 2), np.float32([1e-9, 70000, -1e30, 2.98e-8, 2.99e-8])])
    out = np.empty(x.size, np.uint16)
    f32_to_f16(x, out)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(out[~nan], want[~nan]) and np.isnan(out[nan].view(np.float16)).all()


def test_f16_to_f32_values_widens_every_half_as_numpy():
    bits = np.arange(1 << 16, dtype=np.uint16)
    out = np.empty(bits.size, np.float32)
    f16_to_f32_values(bits, out)
    want = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(out[~nan].view(np.uint32), want[~nan].view(np.uint32)) and np.isnan(out[nan]).all()


@jit
def _f16_bits_small_all(x, out):
    for i in range(x.shape[0]):
        out[i] = f16_bits_small(x[i])


@jit
def _f16_bits_all(x, out):
    for i in range(x.shape[0]):
        out[i] = f16_bits(x[i])


def test_branch_free_f16_rounding_equals_f16_bits_below_65504():
    """Every 7th float32 below 65504 of either sign, every midpoint between halves, and NaN."""
    positive = np.arange(0, 0x477FE000, 7, dtype=np.uint32).view(np.float32)
    halves = np.arange(0x7BFF, dtype=np.uint16).view(np.float16).astype(np.float64)
    midpoints = ((halves[:-1] + halves[1:]) / 2).astype(np.float32)
    for x in (positive, -positive, midpoints, -midpoints):
        got, want = np.empty(x.size, np.uint32), np.empty(x.size, np.uint16)
        _f16_bits_small_all(x, got)
        _f16_bits_all(x, want)  # f32_to_f16 takes f16_bits_small itself below 65504
        assert np.array_equal(got, want)
    got = np.empty(1, np.uint32)
    _f16_bits_small_all(np.float32([np.nan]), got)
    assert np.isnan(np.uint16(got[0]).view(np.float16))


@jit
def _expf_all(x, out):
    for i in range(x.shape[0]):
        out[i] = expf(x[i])


def test_expf_within_3_ulp_and_exact_at_the_edges():
    x = np.concatenate([np.linspace(-90, 90, 400_001, dtype=np.float32),
                        np.float32([-np.inf, np.inf, np.nan, 0.0, -0.0, 88.72, 88.73, -87.33, -87.34])])
    out = np.empty_like(x)
    _expf_all(x, out)
    exact = np.exp(x.astype(np.float64))
    normal = (exact > np.finfo(np.float32).tiny) & (exact < np.finfo(np.float32).max)
    ulp = np.abs(out[normal] - exact[normal]) / np.spacing(exact[normal].astype(np.float32))
    assert ulp.max() <= 3
    assert out[x < -87.34].max() == 0 and np.isinf(out[x > 88.73]).all()
    assert np.isnan(out[np.isnan(x)]).all() and (out[x == 0] == 1).all()


@pytest.mark.parametrize("op", ["rms_norm", "norm"])
@pytest.mark.parametrize("ne", [(640, 3), (1, 4), (17, 2, 3), (256, 4, 1, 2)])
def test_norms(op, ne):
    compiled_and_numpy(lambda ctx: getattr(ops, op)(ctx, ctx.new_tensor(G.F32, ne), 1e-6), ulps=2)


def test_rms_norm_in_place():
    compiled_and_numpy(lambda ctx: ops.rms_norm_inplace(ctx, ctx.new_tensor(G.F32, (33, 5)), 1e-5), ulps=2)


def _soft_max(ne, mask_ne=None, max_bias=0.0, sinks=False, mask_values=None, mask_type=G.F32):
    def build(ctx):
        a = ctx.new_tensor(G.F32, ne)
        mask = ctx.new_tensor(mask_type, mask_ne) if mask_ne else None
        if mask_values is not None:
            host_ndarray(mask)[...] = mask_values
        node = ops.soft_max_ext(ctx, a, mask, 0.7, max_bias)
        if sinks:
            ops.soft_max_add_sinks(node, ctx.new_tensor(G.F32, (ne[2],)))
        return node
    return build


@pytest.mark.parametrize("case", [
    dict(ne=(768, 1, 4)), dict(ne=(17, 3, 2), mask_ne=(17, 5)), dict(ne=(33, 2, 4, 2), mask_ne=(33, 2, 2, 1)),
    dict(ne=(16, 2, 8), mask_ne=(16, 2), max_bias=8.0), dict(ne=(9, 3, 3), mask_ne=(9, 3), sinks=True),
    dict(ne=(40, 3, 2), mask_ne=(40, 4), mask_type=G.F16), dict(ne=(1, 1, 1))], ids=str)
def test_soft_max(case):
    compiled_and_numpy(_soft_max(**case), ulps=8)


def test_soft_max_causal_mask_and_fully_masked_rows():
    mask = np.triu(np.full((4, 6), -np.inf, np.float32), 2)
    mask[3] = -np.inf  # a row with every key hidden: NaN in both kernels, as in ggml
    compiled_and_numpy(_soft_max((6, 4, 2), (6, 4), mask_values=mask), ulps=8)


@pytest.mark.parametrize("max_bias", [0.0, 8.0])
def test_soft_max_skips_masked_tails_only_where_they_are_minus_inf(max_bias):
    """A causal mask's -inf tail is 0 after the softmax and skipped, exactly; a NaN or +inf score inside
    the tail still makes the whole row NaN (x·scale - inf), as ggml computes it."""
    mask = np.triu(np.full((4, 8), -np.inf, np.float32), 1)
    values = np.random.default_rng(5).standard_normal((3, 4, 8)).astype(np.float32)
    values[1, 0, 5] = np.nan
    values[2, 1, 7] = np.inf

    def build(ctx):
        a, m = ctx.new_tensor(G.F32, (8, 4, 3)), ctx.new_tensor(G.F32, (8, 4))
        host_ndarray(a)[...] = values.reshape(host_ndarray(a).shape)
        host_ndarray(m)[...] = mask.reshape(host_ndarray(m).shape)
        return ops.soft_max_ext(ctx, a, m, 0.7, max_bias)

    out = host_ndarray(compiled_and_numpy(build, ulps=8)).reshape(3, 4, 8)
    assert np.isnan(out[1, 0]).all() and np.isnan(out[2, 1]).all()
    assert (out[0, 0, 1:] == 0).all() and out[0, 0, 0] == 1 and (out[0, 2, 3:] == 0).all()


def _rope(mode, n_dims, ne=(64, 4, 3), factors=False, ext=0.0, back=False):
    def build(ctx):
        x = ctx.new_tensor(G.F32, ne)
        pos = ctx.tensor_from_numpy(np.array([0, 7, 300, 100000][: ne[2]], np.int32))
        ff = ctx.tensor_from_numpy(np.linspace(1, 4, n_dims // 2).astype(np.float32)) if factors else None
        rope = ops.rope_ext_back if back else ops.rope_ext
        return rope(ctx, x, pos, ff, n_dims, mode, 4096, 10000.0, 0.5, ext, 1.0, 32.0, 1.0)
    return build


@pytest.mark.parametrize("mode", [NORMAL, NEOX])
@pytest.mark.parametrize("case", [dict(n_dims=64), dict(n_dims=32), dict(n_dims=16, factors=True),
                                  dict(n_dims=64, ext=1.0), dict(n_dims=64, back=True), dict(n_dims=0)], ids=str)
def test_rope(mode, case):
    compiled_and_numpy(_rope(mode, **case))


# GELU_ERF's erfc is evaluated in float32 here and in float64 by the NumPy kernel: compared within 1e-6 of
# the largest value rather than in ulps (where the result is near 0 for negative inputs)
@pytest.mark.parametrize("op", [GluOp.GEGLU, GluOp.SWIGLU, GluOp.REGLU, GluOp.GEGLU_ERF])
@pytest.mark.parametrize("split, swapped", [(True, False), (False, False), (False, True)])  # glu_split: never swapped
def test_glu(op, split, swapped):
    def build(ctx):
        if split:
            return ops.glu_split(ctx, ctx.new_tensor(G.F32, (2048, 3)), ctx.new_tensor(G.F32, (2048, 3)), op)
        return ops.glu(ctx, ctx.new_tensor(G.F32, (34, 3, 2)), op, swapped)
    tolerance = dict(rel=1e-6) if op == GluOp.GEGLU_ERF else dict(ulps=4)
    node = compiled_and_numpy(build, **tolerance)
    x = host_ndarray(node.src[0])
    x[..., :3] = np.float32([-12.0, 11.0, 10.0])  # the GELU table's bounds (-10 and 10) and beyond
    compiled_and_numpy(lambda ctx: node, **tolerance)


@pytest.mark.parametrize("op", [UnaryOp.GELU, UnaryOp.GELU_ERF, UnaryOp.SILU, UnaryOp.RELU])
@pytest.mark.parametrize("inplace", [False, True])
def test_unary(op, inplace):
    build = lambda ctx: ops.unary(ctx, ctx.new_tensor(G.F32, (1536, 5)), op, inplace=inplace)
    tolerance = dict(rel=1e-6) if op == UnaryOp.GELU_ERF else dict(ulps=4)
    node = compiled_and_numpy(build, **tolerance)
    x = host_ndarray(node.src[0])
    x[..., 0, :6] = np.float32([-12.0, 11.0, 10.0, -40.0, 40.0, 0.0])  # the table's bounds, exp's under/overflow
    compiled_and_numpy(lambda ctx: node, **tolerance)


def test_gelu_erf_relative_error_everywhere():
    """The float32 erfc keeps GELU_ERF's relative error small also where 1 + erf(x) nearly cancels (1e-5 at
    x = -9, where the result is 1e-18: exp's argument -x²/2 carries float32's rounding)."""
    x = np.linspace(-9, 9, 100001, dtype=np.float32)
    got = np.empty_like(x)
    jit_glu.unary_rows(x[None], got[None], jit_glu.GELU_ERF, np.zeros(0, np.float32))
    from math import erfc
    want = np.array([0.5 * v * erfc(-v / 2 ** 0.5) for v in x.astype(np.float64)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-37)


@pytest.mark.parametrize("dst_type", [G.F32, G.F16])
@pytest.mark.parametrize("ids_type", [G.I32, G.I64])
@pytest.mark.parametrize("row", [64, 1])
def test_set_rows(dst_type, ids_type, row):
    def build(ctx):
        ids = ctx.tensor_from_numpy(np.array([5, 0, 3], dtype=np.int64 if ids_type == G.I64 else np.int32))
        return ops.set_rows(ctx, ctx.new_tensor(dst_type, (row, 8)), ctx.new_tensor(G.F32, (row, 3)), ids)
    compiled_and_numpy(build)


@pytest.mark.parametrize("dst_type", [G.Q8_0, G.Q4_0], ids=str)
def test_set_rows_into_quantized_rows_is_ggmls_quantize_row(dst_type):
    """The compiled quantize_row_q8_0 / quantize_row_q4_0 (a quantized KV cache write) against the NumPy
    kernel's (gguf's reference quantizers): the same blocks, but for a quant that a tie or the last bit of the
    scale's reciprocal rounds the other way (one step of d)."""
    from pyggml.core import types as T

    ctx = Context()
    dst = ctx.new_tensor(dst_type, (64, 10))
    src = ctx.new_tensor(G.F32, (64, 4))
    host_ndarray(src)[...] = np.random.default_rng(1).normal(0, 2, (4, 64)).astype(np.float32)
    ids = ctx.tensor_from_numpy(np.array([7, 0, 3, 9], np.int64))
    node = ops.set_rows(ctx, dst, src, ids)
    call = kernels.bound(node, kernels.KERNELS[node.op])
    assert not isinstance(call, functools.partial), "not bound to a compiled call"
    call()
    got = host_ndarray(dst).reshape(10, -1).copy()
    host_ndarray(dst)[...] = 0
    kernels.KERNELS[node.op].fn(node)
    want = host_ndarray(dst).reshape(10, -1).copy()
    assert not got[[1, 2, 4, 5, 6, 8]].any()
    got_values, want_values = (T.to_float(dst_type, x).reshape(10, 64) for x in (got, want))
    step = np.repeat(np.abs(want_values).reshape(-1, 32).max(-1) / (127 if dst_type == G.Q8_0 else 8), 32)
    assert np.all(np.abs(got_values - want_values).reshape(-1) <= step * 1.001)
    assert np.mean(got_values == want_values) > 0.99


def test_set_rows_out_of_range_raises_and_writes_nothing():
    ctx = Context()
    dst = ctx.new_tensor(G.F32, (4, 3))
    node = ops.set_rows(ctx, dst, ctx.tensor_from_numpy(np.ones((2, 4), np.float32)),
                        ctx.tensor_from_numpy(np.array([1, 3], np.int32)))
    with pytest.raises(OutOfBoundsError):
        kernels.compute(node)
    assert not host_ndarray(dst).any()


@pytest.mark.parametrize("case", [
    dict(d=64, n_head=4, n_head_kv=1, n_kv=48, n_tok=1), dict(d=32, n_head=6, n_head_kv=3, n_kv=17, n_tok=5),
    dict(d=16, n_head=2, n_head_kv=2, n_kv=9, n_tok=3, kv_type=G.F16, q_type=G.F16),
    dict(d=16, n_head=4, n_head_kv=2, n_kv=8, n_tok=2, mask=False, ne3=2),
    dict(d=16, n_head=4, n_head_kv=2, n_kv=8, n_tok=2, softcap=20.0, max_bias=8.0, sinks=True),
    dict(d=64, n_head=6, n_head_kv=6, n_kv=150, n_tok=1, mask=False, permuted=True),
    dict(d=16, n_head=4, n_head_kv=2, n_kv=33, n_tok=2, kv_type=G.F16, permuted=True),
    # more query rows than COMPILED_ATTN_TOKENS: BLAS products around the compiled exp rows
    dict(d=64, n_head=6, n_head_kv=6, n_kv=40, n_tok=40, mask=False, permuted=True),
    dict(d=32, n_head=6, n_head_kv=2, n_kv=24, n_tok=20, kv_type=G.F16, q_type=G.F16),
    dict(d=16, n_head=4, n_head_kv=2, n_kv=12, n_tok=12, softcap=20.0, max_bias=8.0, sinks=True, ne3=2),
    dict(d=16, n_head=4, n_head_kv=4, n_kv=12, n_tok=12, fully_masked_row=True),
    dict(d=64, n_head=6, n_head_kv=6, n_kv=1100, n_tok=1, mask=False, kv_type=G.F16, permuted=True),
    # a quantized KV cache (llama.cpp's -ctk / -ctv): rows dequantized by the type's compiled kernel first
    dict(d=64, n_head=4, n_head_kv=2, n_kv=40, n_tok=1, kv_type=G.Q8_0),
    dict(d=32, n_head=2, n_head_kv=1, n_kv=17, n_tok=3, kv_type=G.Q4_0, sinks=True),
    dict(d=64, n_head=4, n_head_kv=4, n_kv=9, n_tok=2, kv_type=G.Q8_0, v_type=G.F16)], ids=str)
def test_flash_attn_ext(case):
    def build(ctx, d, n_head, n_head_kv, n_kv, n_tok, kv_type=G.F32, q_type=G.F32, mask=True, ne3=1,
              softcap=0.0, max_bias=0.0, sinks=False, permuted=False, fully_masked_row=False, v_type=None):
        q = ctx.new_tensor(q_type, (d, n_tok, n_head, ne3))
        if permuted:  # K and V as views of [d, head, kv] memory (a cross-attention cache): rows strided by heads
            k, v = (ops.permute(ctx, ctx.new_tensor(kv_type, (d, n_head_kv, n_kv, ne3)), 0, 2, 1, 3) for _ in "kv")
        else:
            k = ctx.new_tensor(kv_type, (d, n_kv, n_head_kv, ne3))
            v = ctx.new_tensor(v_type or kv_type, (d, n_kv, n_head_kv, ne3))
        m = None
        if mask:
            m = ctx.new_tensor(G.F16, (n_kv, n_tok))
            causal = np.triu(np.full((n_tok, n_kv), -np.inf, np.float32), n_kv - n_tok + 1)
            if fully_masked_row:
                causal[3] = -np.inf
            host_ndarray(m)[0, 0] = causal.astype(np.float16)
        out = ops.flash_attn_ext(ctx, q, k, v, m, 0.125, max_bias, softcap)
        if sinks:
            ops.flash_attn_ext_add_sinks(out, ctx.new_tensor(G.F32, (n_head,)))
        return out
    compiled_and_numpy(lambda ctx: build(ctx, **case), rel=1e-5)
