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
