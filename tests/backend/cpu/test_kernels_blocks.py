"""The compiled block-format kernels (pyggml.backend.cpu.jit) against gguf's NumPy dequantization.

Weights are random blocks (random quants, finite scales with some exactly zero); every product is
checked against the float64 product of gguf's dequantized values, within test-backend-ops' NMSE of
5e-4 and, since activations stay float32 here, much closer (float32 summation only).
"""

import numpy as np
import pytest
from tests.support.blocks import BLOCK_TYPES, random_rows, reference_values
from tests.support.opcheck import nmse

from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.jit.mul_mat import dequantize_rows
from pyggml.backend.cpu.jit.quants import BLOCKS
from pyggml.backend.cpu.kernels import mul_mat
from pyggml.backend.cpu.kernels._blocks import THREADS_MAX, set_threads
from pyggml.core import ops
from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G

TYPES = (G.F16, G.BF16, *BLOCK_TYPES)


def _weight(ctx, type_, ne0, ne1, planes=(1, 1), seed=0):
    rng = np.random.default_rng(seed)
    n = ne1 * planes[0] * planes[1]
    raw = random_rows(type_, n, ne0, rng)
    w = ctx.new_tensor(type_, (ne0, ne1, *planes))
    host_ndarray(w).reshape(n, -1)[...] = raw.view(host_ndarray(w).dtype)
    return w, reference_values(type_, raw, ne0).astype(np.float64).reshape(*planes[::-1], ne1, ne0)


def test_every_type_has_a_dequantizer():
    assert set(TYPES) <= set(BLOCKS)


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_dequantize_row_equals_gguf_bit_for_bit(type_):
    rng = np.random.default_rng(1)
    ne0 = 2 * T.blck_size(type_) if T.blck_size(type_) > 1 else 64
    raw = random_rows(type_, 5, ne0, rng)
    out = np.empty((5, ne0), np.float32)
    rows = (np.arange(5) * raw.shape[1]).astype(np.uint64)
    dequantize_rows(int(type_), raw.reshape(-1), rows, ne0 // T.blck_size(type_), out)
    np.testing.assert_array_equal(out, reference_values(type_, raw, ne0))


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("ncols", [1, 3, 37])  # registers (<= VEC_COLUMNS) and tiles + BLAS
def test_mul_mat_on_blocks_matches_float64(type_, ncols):
    ctx = Context()
    ne0 = 512 if T.blck_size(type_) > 1 else 96
    w, ref_w = _weight(ctx, type_, ne0, 67)  # an odd row count: bands and tiles end mid-way
    x = ctx.new_tensor(G.F32, (ne0, ncols))
    host_ndarray(x)[...] = np.random.default_rng(2).standard_normal((1, 1, ncols, ne0))
    y = ops.mul_mat(ctx, w, x)
    kernels.compute(y)
    expected = host_ndarray(x)[0, 0].astype(np.float64) @ ref_w[0, 0].T
    assert nmse(expected, host_ndarray(y)[0, 0]) < 1e-10


@pytest.mark.parametrize("type_", (G.Q4_K, G.Q8_0, G.F16), ids=lambda t: t.name)
@pytest.mark.parametrize("ncols", [1, 40])
def test_mul_mat_broadcasts_over_planes_and_reads_strided_src1(type_, ncols):
    """a has 2x1 planes, b 4x3 (ggml's broadcasting of a over dims 2 and 3); b is a permuted view."""
    ctx = Context()
    ne0 = 256
    w, ref_w = _weight(ctx, type_, ne0, 9, planes=(2, 1))
    xb = ctx.new_tensor(G.F32, (ne0, 4, ncols, 3))  # permuted below into (ne0, ncols, 4, 3)
    host_ndarray(xb)[...] = np.random.default_rng(3).standard_normal(host_ndarray(xb).shape)
    x = ops.permute(ctx, xb, 0, 2, 1, 3)
    y = ops.mul_mat(ctx, w, x)
    kernels.compute(y)
    xv = host_ndarray(x).astype(np.float64)                    # (3, 4, ncols, ne0)
    expected = xv @ np.repeat(ref_w, 2, axis=1).swapaxes(-1, -2)  # a's plane i2 // 2 for b's i2
    assert nmse(expected, host_ndarray(y)) < 1e-10


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_get_rows_on_blocks_equals_gguf(type_):
    ctx = Context()
    ne0 = 256
    w, ref_w = _weight(ctx, type_, ne0, 11, planes=(2, 1))
    ids = ctx.new_tensor(G.I32, (5, 2))
    host_ndarray(ids)[...] = [[[[10, 0, 3, 3, 7], [1, 2, 10, 0, 5]]]]
    y = ops.get_rows(ctx, w, ids)
    kernels.compute(y)
    expected = np.stack([ref_w[0, p][host_ndarray(ids)[0, 0, p]] for p in range(2)])
    np.testing.assert_array_equal(host_ndarray(y)[0], expected.astype(np.float32))


def test_zero_scales_give_zero_products():
    ctx = Context()
    w = ctx.new_tensor(G.Q4_K, (256, 3))
    host_ndarray(w)[...] = 0x77  # quants and scale bits set, but d and dmin ...
    host_ndarray(w)[..., :4] = 0  # ... zero
    x = ctx.new_tensor(G.F32, (256, 1))
    host_ndarray(x)[...] = 1.0
    y = ops.mul_mat(ctx, w, x)
    kernels.compute(y)
    assert not host_ndarray(y).any()


def test_block_weights_are_read_in_place_not_cached():
    """No float32 copy of a block-format weight is made for a product (the memory stays the file's)."""
    mul_mat.DEQUANT_CACHE.clear()
    ctx = Context()
    w, _ = _weight(ctx, G.Q8_0, 64, 4)
    x = ctx.new_tensor(G.F32, (64, 1))
    host_ndarray(x)[...] = 1.0
    kernels.compute(ops.mul_mat(ctx, w, x))
    assert mul_mat.DEQUANT_CACHE.nbytes == 0


@pytest.mark.parametrize("type_", (G.Q4_0, G.Q6_K, G.F16), ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens", [1, 9])  # an expert sees 1-2 rows (registers), or more (tiles + BLAS)
def test_mul_mat_id_on_blocks_matches_float64(type_, n_tokens):
    ctx = Context()
    ne0, n_expert, n_used = 256, 4, 2
    w, ref_w = _weight(ctx, type_, ne0, 6, planes=(n_expert, 1))
    rng = np.random.default_rng(5)
    b = ctx.new_tensor(G.F32, (ne0, 1, n_tokens))
    host_ndarray(b)[...] = rng.standard_normal(host_ndarray(b).shape)
    ids = ctx.new_tensor(G.I32, (n_used, n_tokens))
    chosen = np.stack([rng.choice(n_expert, n_used, replace=False) for _ in range(n_tokens)])
    host_ndarray(ids)[0, 0] = chosen
    y = ops.mul_mat_id(ctx, w, b, ids)
    kernels.compute(y)
    x = host_ndarray(b)[0, :, 0].astype(np.float64)             # (n_tokens, ne0)
    expected = np.einsum("tk,turk->tur", x, ref_w[0][chosen])
    assert nmse(expected, host_ndarray(y)[0]) < 1e-10


@pytest.mark.parametrize("type_", (G.Q8_0, G.Q6_K, G.Q3_K), ids=lambda t: t.name)
@pytest.mark.parametrize("n_threads", [1, 2])
def test_large_matrix_vector_products_on_threads(type_, n_threads):
    """The rows are split in bands over Numba's threads, as many as set (one: all bands on it)."""
    ctx = Context()
    ne0, ne1 = 512, 601
    w, ref_w = _weight(ctx, type_, ne0, ne1)
    x = ctx.new_tensor(G.F32, (ne0, 2))
    host_ndarray(x)[...] = np.random.default_rng(6).standard_normal((1, 1, 2, ne0))
    y = ops.mul_mat(ctx, w, x)
    set_threads(n_threads)
    try:
        kernels.compute(y)
    finally:
        set_threads(THREADS_MAX)
    expected = host_ndarray(x)[0, 0].astype(np.float64) @ ref_w[0, 0].T
    assert nmse(expected, host_ndarray(y)[0, 0]) < 1e-10


@pytest.mark.parametrize("type_", (G.Q8_0, G.Q4_K, G.F16, G.F32), ids=lambda t: t.name)
@pytest.mark.parametrize("a_planes, b_shape", [
    (1, (3, 1)),   # three columns, one plane
    (2, (1, 6)),   # one column in each of 6 planes, 3 sharing each plane of a: folded into columns
    (3, (1, 9)),   # the same with 3 planes of a (9 query heads over 3 KV heads)
    (1, (1, 5)),   # 5 planes over one: more than VEC_COLUMNS, not folded
])
def test_bound_generation_products_read_b_in_place(type_, a_planes, b_shape):
    """The pre-bound call a graph plan makes for a few columns (compiled, also on an F32 matrix such as the KV
    cache) equals the float64 product, and reads b where it is: new values in b, new products."""
    ctx = Context()
    ne0 = 256 if T.blck_size(type_) > 1 else 96
    if type_ == G.F32:
        w = ctx.new_tensor(G.F32, (ne0, 37, a_planes))
        host_ndarray(w)[...] = np.random.default_rng(7).standard_normal(host_ndarray(w).shape)
        ref_w = host_ndarray(w).astype(np.float64)
    else:
        w, ref_w = _weight(ctx, type_, ne0, 37, planes=(a_planes, 1))
    x = ctx.new_tensor(G.F32, (ne0, *b_shape))
    y = ops.mul_mat(ctx, w, x)
    kernel = kernels.KERNELS[y.op]
    call = kernels.bound(y, kernel)
    assert getattr(call, "func", None) is not kernel.fn
    for seed in (8, 9):
        host_ndarray(x)[...] = np.random.default_rng(seed).standard_normal(host_ndarray(x).shape)
        call()
        r2 = b_shape[1] // a_planes
        expected = host_ndarray(x).astype(np.float64) @ np.repeat(ref_w, r2, axis=1).swapaxes(-1, -2)
        assert nmse(expected, host_ndarray(y)) < 1e-10


HEAD_DIM, N_HEAD_KV, N_HEAD, KV_SIZE, N_KV = 64, 2, 4, 96, 80


def _kv_inputs(ncols: int, seed: int = 11):
    """Queries (ncols, n_head, head_dim) and softmax rows (n_head, ncols, n_kv) for _kv_cache_products."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((ncols, N_HEAD, HEAD_DIM)).astype(np.float32),
            rng.random((N_HEAD, ncols, N_KV)).astype(np.float32))


def _kv_cache_products(queries: np.ndarray, weights: np.ndarray):
    """Attention's two products against an F16 KV cache laid out as llama.cpp's (and built as arch/blocks.py
    builds them): K·Q over a strided view of the key cache (a KV head's rows inside rows of all heads) and
    V·softmax over a view of the transposed value cache, 4 query heads on 2 KV heads, q permuted.
    Returns (kq, kqv, kq in float64, kqv in float64), each (n_head, ncols, rows)."""
    ctx, rng = Context(), np.random.default_rng(10)
    cache_k = ctx.new_tensor(G.F16, (HEAD_DIM * N_HEAD_KV, KV_SIZE))
    cache_v = ctx.new_tensor(G.F16, (KV_SIZE, HEAD_DIM * N_HEAD_KV))   # transposed: a channel's cells in a row
    for cache in (cache_k, cache_v):
        host_ndarray(cache)[...] = rng.standard_normal(host_ndarray(cache).shape).astype(np.float16)
    k = ops.view_3d(ctx, cache_k, HEAD_DIM, N_KV, N_HEAD_KV, cache_k.nb[1], HEAD_DIM * 2, 0)
    v = ops.view_3d(ctx, cache_v, N_KV, HEAD_DIM, N_HEAD_KV, cache_v.nb[1], cache_v.nb[1] * HEAD_DIM, 0)
    q = ctx.new_tensor(G.F32, (HEAD_DIM, N_HEAD, len(queries)))
    p = ctx.new_tensor(G.F32, (N_KV, len(queries), N_HEAD))
    host_ndarray(q)[0] = queries
    host_ndarray(p)[0] = weights
    kq = ops.mul_mat(ctx, k, ops.permute(ctx, q, 0, 2, 1, 3))
    kqv = ops.mul_mat(ctx, v, p)
    kernels.compute(kq)
    kernels.compute(kqv)
    keys = host_ndarray(cache_k)[0, 0].astype(np.float64).reshape(KV_SIZE, N_HEAD_KV, HEAD_DIM)[:N_KV]
    values = host_ndarray(cache_v)[0, 0].astype(np.float64).reshape(N_HEAD_KV, HEAD_DIM, KV_SIZE)[..., :N_KV]
    group = N_HEAD // N_HEAD_KV
    kq_ref = np.stack([queries[:, h].astype(np.float64) @ keys[:, h // group].T for h in range(N_HEAD)])
    kqv_ref = np.stack([weights[h].astype(np.float64) @ values[h // group].T for h in range(N_HEAD)])
    return host_ndarray(kq)[0].copy(), host_ndarray(kqv)[0].copy(), kq_ref, kqv_ref


@pytest.mark.parametrize("ncols", [5, 8, 16, 17, 40])
@pytest.mark.parametrize("path", ["chosen", "tiles"])
def test_kv_cache_products_on_views_match_float64(monkeypatch, ncols, path):
    """Both ways of multiplying many query columns by the F16 KV cache read its views right: what mul_mat chooses
    (column groups of the matrix-vector kernel up to GROUPED_COLUMNS, then tiles) and dequantized tiles with
    sgemm forced at every count."""
    if path == "tiles":
        monkeypatch.setattr(mul_mat, "GROUPED_COLUMNS", mul_mat.VEC_COLUMNS)
    kq, kqv, kq_ref, kqv_ref = _kv_cache_products(*_kv_inputs(ncols))
    assert nmse(kq_ref, kq) < 1e-12 and nmse(kqv_ref, kqv) < 1e-12


def _each_column_alone(ncols: int) -> list[bool]:
    """For each product, whether every query column of an ncols step equals that column multiplied alone."""
    queries, weights = _kv_inputs(ncols)
    together = _kv_cache_products(queries, weights)[:2]
    alone = [_kv_cache_products(queries[c:c + 1], weights[:, c:c + 1])[:2] for c in range(ncols)]
    return [all(np.array_equal(t[:, c:c + 1], a[i]) for c, a in enumerate(alone)) for i, t in enumerate(together)]


@pytest.mark.parametrize("ncols", [2, 5, 8, 16])
def test_kv_cache_products_of_several_sequences_equal_each_alone_bit_for_bit(ncols):
    """A step of several sequences' next tokens (up to GROUPED_COLUMNS query columns) gives each column exactly
    the products of that token decoded alone: the matrix-vector kernel sums every column in one order."""
    assert _each_column_alone(ncols) == [True, True]


def test_kv_cache_products_through_tiles_differ_from_alone_in_rounding_only(monkeypatch):
    """Why a step of 5-16 columns does not take the tiles: sgemm sums in another order than the single column's
    kernel, so its products differ from the token alone by float32 rounding (both match float64 above). The model
    quantizes activations to Q8 before its next integer product, where such a difference can flip a quant: on
    Gemma 3 270M that moved a batched sequence's logits 0.9 from its logits decoded alone (tests/models/test_batch.py),
    as much as a random 1e-6 relative change of these products does to a sequence decoded alone."""
    monkeypatch.setattr(mul_mat, "GROUPED_COLUMNS", mul_mat.VEC_COLUMNS)
    assert _each_column_alone(8) == [False, False]


def test_query_heads_of_one_kv_head_are_taken_as_one_planes_columns():
    """Runs of b's planes over one matrix of a become the columns of one plane, as views of x and y (the float
    rows kernel then reads each KV row once for all of them); planes that alternate, or a y whose
    planes cannot be viewed as one, stay."""
    x, y = np.zeros((4, 3, 8), np.float32), np.zeros((4, 3, 5), np.float32)
    planes, mx, my = mul_mat._columns_by_matrix(np.array([0, 0, 64, 64], np.uint64), x, y)
    assert planes.tolist() == [0, 64] and mx.shape == (2, 6, 8) and my.shape == (2, 6, 5)
    assert np.shares_memory(mx, x) and np.shares_memory(my, y)
    alternating = np.array([0, 64, 0, 64], np.uint64)
    assert mul_mat._columns_by_matrix(alternating, x, y)[0] is alternating
    apart = np.zeros((4, 4, 5), np.float32)[:, :3]  # a plane's 3 columns, then a gap before the next plane
    assert mul_mat._columns_by_matrix(np.array([0, 0, 64, 64], np.uint64), x, apart)[2] is apart
