"""CPU kernels for mul_mat, mul_mat_id, out_prod against float64 NumPy references, plus the dequant cache."""

import numpy as np
import pytest
from tests.support.opcases_matmul import CASES, QUANT_TYPES, mul_mat_case
from tests.support.opcheck import check, fill_random

from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.backend import BufferUsage, cpu
from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.jit.mul_mat import mul_mat_float_columns
from pyggml.backend.cpu.kernels._dequant_cache import DequantCache
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType
from pyggml.errors import OutOfBoundsError


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)


def test_mul_mat_with_strided_rows_of_b():
    """b = a transposed view (ggml's CPU kernel asserts contiguous rows of b; pyggml copies them to BLAS)."""
    check(mul_mat_case("mul_mat_transposed_b", GGMLType.F16, (32, 9, 2), (32, 5, 4), b_axes=(1, 0, 2, 3)))


@pytest.mark.parametrize("a_type", [GGMLType.F32, GGMLType.F16, GGMLType.Q4_0], ids=lambda t: t.name)
def test_up_to_16_columns_each_give_their_product_alone_to_the_bit(a_type):
    """A step of several sequences' tokens multiplies each column of a weight as that token alone would: the same
    sums in the same order, so batched decoding reproduces single-sequence logits (tests/models/test_batch.py)."""
    rng = np.random.default_rng(0)
    weights, ctx = Context(no_alloc=True), Context()
    a = weights.new_tensor(a_type, (128, 24))
    # F32 is read in place for weights only
    alloc_ctx_tensors_from_buft(weights, cpu.CPU_REG.device(0).buffer_type).usage = BufferUsage.WEIGHTS
    fill_random(a, rng)
    x = rng.uniform(-1, 1, (16, 128)).astype(np.float32)

    def product(columns: np.ndarray) -> np.ndarray:
        b = ctx.new_tensor(GGMLType.F32, (128, len(columns)))
        host_ndarray(b)[0, 0] = columns
        out = ops.mul_mat(ctx, a, b)
        kernels.compute(out)
        return host_ndarray(out)[0, 0].copy()

    alone = np.concatenate([product(x[c:c + 1]) for c in range(16)])
    for n in (2, 5, 8, 16):
        np.testing.assert_array_equal(product(x[:n]), alone[:n])


@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["F32", "F16"])
@pytest.mark.parametrize("columns", [1, 4])
def test_float_rows_far_apart_give_the_contiguous_rows_result(dtype, columns):
    """Rows far apart (a KV cache's heads within its cells) are prefetched ahead, up to past the end of the array:
    the same sums, to the bit, as the same rows back to back, and the float64 products to float32 rounding."""
    rng = np.random.default_rng(3)
    heads, cells, k = 3, 40, 48
    cache = rng.uniform(-1, 1, (cells, heads * k)).astype(dtype)  # cell-major: a head's rows are heads·k apart
    x = rng.uniform(-1, 1, (heads, columns, k)).astype(np.float32)
    strided, contiguous = (np.empty((heads, columns, cells), np.float32) for _ in range(2))
    values = cache.view(np.uint16) if dtype == np.float16 else cache
    mul_mat_float_columns(values.reshape(-1), np.arange(heads, dtype=np.uint64) * k, heads * k, cells, k, x,
                          strided, 3)
    apart = np.ascontiguousarray(values.reshape(cells, heads, k).transpose(1, 0, 2))
    mul_mat_float_columns(apart.reshape(-1), np.arange(heads, dtype=np.uint64) * cells * k, k, cells, k, x,
                          contiguous, 3)
    assert np.array_equal(strided.view(np.uint32), contiguous.view(np.uint32))
    reference = np.einsum("hck,nhk->hcn", x.astype(np.float64), cache.reshape(cells, heads, k).astype(np.float64))
    np.testing.assert_allclose(strided, reference, rtol=1e-5, atol=1e-5)


def test_quant_types_covered():
    assert {GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q8_0, GGMLType.IQ4_NL} <= set(QUANT_TYPES)


def test_supports_tells_the_truth():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(GGMLType.I32, (8, 4))
    b = ctx.new_tensor(GGMLType.F32, (8, 2))
    assert not kernels.supports(ops.mul_mat(ctx, a, b))
    q4k = ctx.new_tensor(GGMLType.Q4_K, (256, 4))
    assert kernels.supports(ops.mul_mat(ctx, q4k, ctx.new_tensor(GGMLType.F32, (256, 2))))


def test_mul_mat_id_rejects_bad_expert_ids():
    ctx = Context()
    as_ = ctx.new_tensor(GGMLType.F32, (4, 3, 2))
    b = ctx.new_tensor(GGMLType.F32, (4, 1, 2))
    ids = ctx.new_tensor(GGMLType.I32, (1, 2))
    host_ndarray(ids)[...] = 5
    with pytest.raises(OutOfBoundsError, match="outside"):
        kernels.compute(ops.mul_mat_id(ctx, as_, b, ids))


def test_dequant_cache_reuses_and_sees_writes():
    ctx = Context()
    w = ctx.new_tensor(GGMLType.Q8_0, (32, 4))
    host_ndarray(w)[...] = np.random.default_rng(0).integers(0, 256, host_ndarray(w).shape, dtype=np.uint8) & 0xBF
    cache = DequantCache()
    first = cache.get(w)
    assert cache.get(w) is first and cache.hits == 1
    host_ndarray(w)[0, 0, 0, 5] ^= 1  # one quant changes: the copy must not be reused
    second = cache.get(w)
    assert cache.misses == 2 and not np.array_equal(first, second)


def test_dequant_cache_budget_evicts_oldest():
    ctx = Context()
    ts = [ctx.new_tensor(GGMLType.F16, (64, 4)) for _ in range(3)]
    for i, t in enumerate(ts):
        host_ndarray(t)[...] = i
    entry_bytes = 64 * 4 * (4 + 2)  # float32 values and the F16 elements they were made from
    cache = DequantCache(budget_bytes=2 * entry_bytes)
    for t in ts:
        cache.get(t)
    assert cache.nbytes == 2 * entry_bytes
    cache.get(ts[0])
    assert cache.misses == 4



def test_dequant_cache_keeps_one_entry_per_address():
    """A growing view (a KV cache read one token longer each step) replaces its entry instead of piling up."""
    ctx = Context()
    cache_tensor = ctx.new_tensor(GGMLType.F16, (16, 8), name="k_cache")
    host_ndarray(cache_tensor)[...] = 1
    cache = DequantCache()
    for n_kv in range(1, 9):
        cache.get(ops.view_2d(ctx, cache_tensor, 16, n_kv, cache_tensor.nb[1], 0))
    assert cache.nbytes == 16 * 8 * (4 + 2) and cache.misses == 8


def test_dequant_cache_converts_only_changed_elements_of_f16():
    """A KV cache gaining a token: the entry is updated in place, and equals a fresh conversion."""
    ctx = Context()
    k = ctx.new_tensor(GGMLType.F16, (16, 8), name="k_cache")
    raw = host_ndarray(k)[0, 0]
    raw[...] = np.random.default_rng(1).standard_normal(raw.shape)
    cache = DequantCache()
    first = cache.get(k)
    raw[3] = 7.5               # a token's row
    raw[:, 5] = -0.0           # a column (a transposed V cache), including a sign-only change
    second = cache.get(k)
    assert second is first and cache.hits == 1 and cache.misses == 1
    np.testing.assert_array_equal(second[0, 0], raw.astype(np.float32))
    assert np.signbit(second[0, 0, :, 5]).all() and not second.flags.writeable
