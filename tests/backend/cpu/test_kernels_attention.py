"""CPU kernels for diag_mask, soft_max, rope and flash_attn_ext against float64 NumPy references."""

import numpy as np
import pytest
from tests.support.opcases_attention import CASES, _causal_mask
from tests.support.opcheck import check, fill_random, nmse, values

from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Op, host_ndarray
from pyggml.core.types import GGMLType

F32, F16 = GGMLType.F32, GGMLType.F16


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)


def _compute(out):
    for node in Graph().build_forward_expand(out).nodes:
        kernels.compute(node)


@pytest.mark.parametrize("inplace, plain", [(ops.soft_max_inplace, ops.soft_max),
                                            (lambda c, a: ops.diag_mask_inf_inplace(c, a, 1),
                                             lambda c, a: ops.diag_mask_inf(c, a, 1))])
def test_inplace_variants_write_into_a(inplace, plain):
    ctx = Context()
    a = ctx.new_tensor(F32, (8, 4, 2), name="a")
    fill_random(a, np.random.default_rng(0))
    expected = plain(ctx, a)
    _compute(expected)
    out = inplace(ctx, a)
    _compute(out)
    assert out.view_src is a
    assert np.array_equal(host_ndarray(a), host_ndarray(expected))


def test_rope_inplace_matches_rope():
    ctx = Context()
    a = ctx.new_tensor(F32, (16, 2, 3), name="a")
    pos = ctx.new_tensor(GGMLType.I32, (3,), name="pos")
    fill_random(a, np.random.default_rng(0))
    host_ndarray(pos)[...] = [5, 0, 17]
    expected = ops.rope(ctx, a, pos, 16, ops.RopeType.NEOX)
    _compute(expected)
    _compute(ops.rope_inplace(ctx, a, pos, 16, ops.RopeType.NEOX))
    assert np.array_equal(host_ndarray(a), host_ndarray(expected))


def test_flash_attn_matches_soft_max_path():
    """flash_attn_ext equals mul_mat + soft_max_ext + mul_mat, the unfused graph ggml builds without FA."""
    ctx = Context()
    d, n_kv, n_tok, n_head = 16, 12, 4, 2
    q = ctx.new_tensor(F32, (d, n_tok, n_head), name="q")
    k = ctx.new_tensor(F32, (d, n_kv, n_head), name="k")
    v = ctx.new_tensor(F32, (d, n_kv, n_head), name="v")
    mask = _causal_mask(ctx, F16, n_kv, n_tok)
    rng = np.random.default_rng(2)
    for t in (q, k, v):
        fill_random(t, rng)
    fa = ops.flash_attn_ext(ctx, q, k, v, mask, 0.25, 0.0, 0.0)
    kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, k, q), mask, 0.25, 0.0)
    vt = ctx.new_tensor(F32, (n_kv, d, n_head), name="vt")
    host_ndarray(vt)[...] = host_ndarray(v).swapaxes(-1, -2)
    kqv = ops.mul_mat(ctx, vt, kq)                       # [d, n_tok, n_head]
    _compute(fa)
    _compute(kqv)
    assert nmse(values(kqv).transpose(0, 2, 1, 3), values(fa)) < 1e-10


def test_flash_attn_fully_masked_row_is_zero():
    ctx = Context()
    q = ctx.new_tensor(F32, (8, 2, 1), name="q")
    k = ctx.new_tensor(F32, (8, 4, 1), name="k")
    v = ctx.new_tensor(F32, (8, 4, 1), name="v")
    mask = ctx.new_tensor(F16, (4, 2), name="mask")
    host_ndarray(mask)[...] = np.array([[0, 0, -np.inf, -np.inf], [-np.inf] * 4], dtype=np.float16)
    for t in (q, k, v):
        fill_random(t, np.random.default_rng(0))
    out = ops.flash_attn_ext(ctx, q, k, v, mask, 1.0, 0.0, 0.0)
    _compute(out)
    res = host_ndarray(out)
    assert np.all(res[0, 1] == 0) and np.all(np.isfinite(res)) and np.any(res[0, 0] != 0)


def test_rope_multi_needs_sections():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(F32, (16, 2, 3))
    pos = ctx.new_tensor(GGMLType.I32, (12,))
    assert not kernels.supports(ops.rope_multi(ctx, a, pos, None, 16, (0, 0, 0, 0), ops.RopeType.MROPE, 0, 1e4, 1, 0,
                                               1, 0, 0))
    assert kernels.supports(ops.rope_multi(ctx, a, pos, None, 16, (2, 3, 3, 0), ops.RopeType.MROPE, 0, 1e4, 1, 0,
                                           1, 0, 0))
    assert not kernels.supports(ops.rope_multi(ctx, a, pos, None, 16, (2, 3, 3, 0), ops.RopeType.VISION, 0, 1e4, 1,
                                               0, 1, 0, 0))  # VISION needs n_dims == ne0 / 2


def test_rope_back_undoes_rope():
    ctx = Context()
    a = ctx.new_tensor(F32, (32, 3, 4), name="a")
    pos = ctx.new_tensor(GGMLType.I32, (4,), name="pos")
    fill_random(a, np.random.default_rng(0))
    host_ndarray(pos)[...] = [3, 70, 0, 1000]
    args = (32, ops.RopeType.NEOX, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    back = ops.rope_ext_back(ctx, ops.rope_ext(ctx, a, pos, None, *args), pos, None, *args)
    _compute(back)
    assert back.op == Op.ROPE_BACK
    np.testing.assert_allclose(host_ndarray(back), host_ndarray(a), atol=1e-5)


def test_soft_max_back_with_alibi_is_unsupported():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(F32, (8, 2))
    assert not kernels.supports(ops.soft_max_ext_back(ctx, a, a, 1.0, 8.0))
    assert kernels.supports(ops.soft_max_ext_back_inplace(ctx, a, a, 1.0, 0.0))


def test_rope_angles_are_shared_read_only_and_exact():
    """Layers of a step share their angles; the cache gives the same values as computing them afresh."""
    from pyggml.backend.cpu.kernels.attention import cached_cos_sin, rope_cos_sin

    ctx = Context()
    a = ctx.new_tensor(F32, (32, 2, 3), name="a")
    pos = ctx.new_tensor(GGMLType.I32, (3,), name="pos")
    host_ndarray(pos)[...] = [7, 300, 4096]
    r1 = ops.rope_ext(ctx, a, pos, None, 32, ops.RopeType.NEOX, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    r2 = ops.rope_ext(ctx, a, pos, None, 32, ops.RopeType.NEOX, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    r3 = ops.rope_ext(ctx, a, pos, None, 32, ops.RopeType.NEOX, 4096, 1e6, 1.0, 0.0, 1.0, 32.0, 1.0)
    positions = host_ndarray(pos).reshape(1, 3)
    cos1, sin1 = cached_cos_sin(r1, positions, None)
    assert cached_cos_sin(r2, positions.copy(), None)[0] is cos1
    assert not cos1.flags.writeable and not sin1.flags.writeable
    fresh_cos, fresh_sin = rope_cos_sin(r1, positions, None)
    assert np.array_equal(cos1, fresh_cos) and np.array_equal(sin1, fresh_sin)
    assert not np.array_equal(cached_cos_sin(r3, positions, None)[0], cos1)


@pytest.mark.parametrize("kv_type", [F16, GGMLType.Q8_0])
@pytest.mark.parametrize("seen", [96, 1500])
@pytest.mark.parametrize("n_tok", [4, 32])
def test_flash_attn_over_many_keys_of_which_each_row_sees_some(kv_type, seen, n_tok):
    """4 or 32 query rows over 3000 keys, each row seeing its own `seen` of them (the sequences of one shared
    cache, or long ones): the compiled loops skip the hidden keys (and a quantized cache dequantizes only the
    keys some row sees), BLAS's products take rows that see many; either way the float64 reference."""
    ctx = Context()
    d, n_kv, n_head = 32, 3000, 2
    q = ctx.new_tensor(F32, (d, n_tok, n_head), name="q")
    k = ctx.new_tensor(kv_type, (d, n_kv, 1), name="k")
    v = ctx.new_tensor(kv_type, (d, n_kv, 1), name="v")
    rng = np.random.default_rng(4)
    for t in (q, k, v):
        fill_random(t, rng)
    own = [rng.choice(n_kv, seen, replace=False) for _ in range(n_tok)]
    hidden = np.full((n_tok, n_kv), -np.inf)
    for t, cells in enumerate(own):
        hidden[t, cells] = 0.0
    mask = ctx.new_tensor(F16, (n_kv, n_tok), name="mask")
    host_ndarray(mask)[...] = hidden.astype(np.float16)
    out = ops.flash_attn_ext(ctx, q, k, v, mask, 0.2, 0.0, 0.0)
    _compute(out)
    qs, ks, vs = values(q)[0], values(k)[0, 0], values(v)[0, 0]   # (head, tok, d), (kv, d), (kv, d)
    scores = np.einsum("htd,jd->htj", qs, ks) * 0.2 + hidden[None].astype(np.float64)
    w = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("htj,jd->thd", w / w.sum(-1, keepdims=True), vs)
    assert nmse(expected[None], host_ndarray(out).astype(np.float64)) < 1e-9


@pytest.mark.parametrize("window", [64, 100])
def test_flash_attn_of_many_rows_in_windows_reads_each_blocks_keys(window):
    """600 query rows over their own 600 keys in windows (a vision encoder's window attention; -inf outside a row's
    window, a window of 100 straddling the blocks of query rows): BLAS's products over the span of keys each block
    of rows sees, against the float64 reference."""
    ctx = Context()
    d, n, n_head = 16, 600, 2
    q, k, v = (ctx.new_tensor(t, (d, n, n_head), name=name) for t, name in ((F32, "q"), (F16, "k"), (F16, "v")))
    rng = np.random.default_rng(5)
    for t in (q, k, v):
        fill_random(t, rng)
    ids = np.arange(n) // window
    hidden = np.where(ids[:, None] == ids[None, :], 0.0, -np.inf)
    mask = ctx.new_tensor(F16, (n, n), name="mask")
    host_ndarray(mask)[...] = hidden.astype(np.float16)
    out = ops.flash_attn_ext(ctx, q, k, v, mask, 0.25, 0.0, 0.0)
    _compute(out)
    qs, ks, vs = values(q)[0], values(k)[0], values(v)[0]   # (head, token, d)
    scores = np.einsum("htd,hjd->htj", qs, ks) * 0.25 + hidden[None]
    w = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("htj,hjd->thd", w / w.sum(-1, keepdims=True), vs)
    assert nmse(expected[None], host_ndarray(out).astype(np.float64)) < 1e-9


@pytest.mark.parametrize("n_tok, n_kv", [(40, 64), (1, 1100)])
@pytest.mark.parametrize("mask_planes", [0, 1, 3])
@pytest.mark.parametrize("score_bytes", [None, 2 * 4 * 1100])
def test_flash_attn_over_planes_of_the_4th_dimension(n_tok, n_kv, mask_planes, score_bytes, monkeypatch):
    """q with 3 planes in its 4th dimension (a batch of Whisper windows: 40 encoder rows each, or one decoder row
    over 1100 audio keys), a mask with none, one or one per plane, the tasks
    taking a plane each or several (`score_bytes` lets two of the three share one): the float64 reference."""
    from pyggml.backend.cpu.kernels import attention

    if score_bytes:
        monkeypatch.setattr(attention, "ATTN_SCORE_BYTES", score_bytes)
    ctx = Context()
    d, n_head, n3 = 16, 2, 3
    q = ctx.new_tensor(F32, (d, n_tok, n_head, n3), name="q")
    k, v = (ctx.new_tensor(F32, (d, n_kv, n_head, n3), name=name) for name in ("k", "v"))
    rng = np.random.default_rng(6)
    for t in (q, k, v):
        fill_random(t, rng)
    hidden = np.zeros((max(mask_planes, 1), n_tok, n_kv))
    mask = None
    if mask_planes:
        hidden = np.where(rng.random(hidden.shape) < 0.5, -np.inf, 0.0)
        hidden[..., 0] = 0.0                                   # every row sees a key
        mask = ctx.new_tensor(F16, (n_kv, n_tok, 1, mask_planes), name="mask")
        host_ndarray(mask)[...] = hidden[:, None].astype(np.float16)
    out = ops.flash_attn_ext(ctx, q, k, v, mask, 0.25, 0.0, 0.0)
    _compute(out)
    qs, ks, vs = values(q), values(k), values(v)               # (plane, head, token, d)
    scores = np.einsum("phtd,phjd->phtj", qs, ks) * 0.25 + hidden[np.arange(n3) % hidden.shape[0], None]
    w = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("phtj,phjd->pthd", w / w.sum(-1, keepdims=True), vs)
    assert nmse(expected, host_ndarray(out).astype(np.float64)) < 1e-9
