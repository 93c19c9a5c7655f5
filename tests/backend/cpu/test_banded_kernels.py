"""The CPU kernels that a vision encoder's non-product work runs through, against NumPy: F32 -> F16 copies of
permuted views (compiled, in bands of rows), the two-pass F16-table GELU, and F32 binary ops and row norms split
into bands over the threads once they hold SPLIT_VALUES values (the cases here are that large: one band per thread)."""

import functools

import numpy as np
import pytest

from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.jit import norm as jit_norm
from pyggml.backend.cpu.jit.f16 import f32_to_f16_rows
from pyggml.backend.cpu.jit.gelu import gelu_table_rows
from pyggml.backend.cpu.jit.softmax import soft_max_rows
from pyggml.backend.cpu.kernels.attention import alibi_slopes
from pyggml.backend.cpu.kernels._common import SPLIT_VALUES, flat_rows
from pyggml.backend.cpu.kernels.unary import f16_table, gelu, gelu_tanh
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G

SPECIAL = np.float32([0, -0.0, 1e-9, 3e-6, -6.1e-5, 65504, 65520, -70000, 1e30, np.inf, -np.inf, np.nan, 9.99, 10,
                      -10, -10.01, 12.5])


def values(shape, seed=0, nan=True) -> np.ndarray:
    """Normal values with the edge cases of F16 rounding and of GELU's cut-offs spread among them (NaN too unless
    `nan` is False: the NumPy GELU's test for values >= 10 skips its copy when the array holds a NaN)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 4
    flat = x.reshape(-1)
    flat[:: max(1, flat.size // 97)][: SPECIAL.size] = SPECIAL if nan else np.nan_to_num(SPECIAL, nan=1.0)
    return x


def bound_call(node):
    """The node's pre-bound call, asserted not to be its NumPy kernel."""
    kernel = kernels.KERNELS[node.op]
    call = kernels.bound(node, kernel)
    assert not (isinstance(call, functools.partial) and call.func is kernel.fn), "not bound"
    return call


def f16_bits(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x.astype(np.float16).view(np.uint16)


def numpy_gelu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # values beyond F16's range (the cut-offs replace them)
        return gelu(x)


def test_f32_to_f16_rows_rounds_each_row_of_a_strided_view_as_numpy():
    x = values((3, 40, 5, 64)).transpose(0, 2, 1, 3)  # (ne3, ne2, ne1, ne0): rows strided, values contiguous
    flat, strides = flat_rows(x)
    layout = np.array([*x.shape[1:], *strides], np.int64)
    out = np.zeros(x.size, np.uint16)
    n_rows = x.shape[0] * x.shape[1] * x.shape[2]
    f32_to_f16_rows(flat, layout, out, 0, 7)  # bands, as the threads take them
    f32_to_f16_rows(flat, layout, out, 7, n_rows)
    np.testing.assert_array_equal(out.reshape(x.shape), f16_bits(x))


@pytest.mark.parametrize("shape", [(64, 12, 512), (64, 3, 8)], ids=["banded", "small"])
def test_cast_of_a_permuted_view_to_f16_is_compiled_and_rounds_as_numpy(shape):
    """Flash attention's K: [head_dim, n_head, n_pos] permuted to [head_dim, n_pos, n_head], cast to F16."""
    ctx = Context()
    x = values(shape[::-1])
    out = ops.cast(ctx, ops.permute(ctx, ctx.tensor_from_numpy(x), 0, 2, 1, 3), G.F16)
    bound_call(out)()
    np.testing.assert_array_equal(host_ndarray(out)[0].view(np.uint16), f16_bits(x.transpose(1, 0, 2)))


@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
def test_gelu_table_rows_match_the_numpy_gelu(in_place):
    x = values((300, 1000), nan=False)
    want = numpy_gelu(x)
    x[7, 3] = want[7, 3] = np.nan  # GELU(NaN) is NaN (ggml reads its table there)
    out = x if in_place else np.empty_like(x)
    gelu_table_rows(x, out, f16_table(gelu_tanh))
    np.testing.assert_array_equal(out, want)


def test_gelu_node_in_bands_matches_the_numpy_gelu():
    ctx = Context()
    x = values((SPLIT_VALUES // 1000 + 7, 1000), nan=False)
    out = ops.gelu(ctx, ctx.tensor_from_numpy(x))
    bound_call(out)()
    np.testing.assert_array_equal(host_ndarray(out)[0, 0], numpy_gelu(x))


@pytest.mark.parametrize("op, ufunc", [(ops.add, np.add), (ops.mul, np.multiply), (ops.sub, np.subtract)])
@pytest.mark.parametrize("b_rows", [1, 400], ids=["bias", "same_shape"])
def test_binary_ops_in_bands_match_numpy(op, ufunc, b_rows):
    ctx = Context()
    a, b = values((400, 768), 1), values((b_rows, 768), 2)
    out = op(ctx, ctx.tensor_from_numpy(a), ctx.tensor_from_numpy(b))
    assert out.nelements >= SPLIT_VALUES
    with np.errstate(all="ignore"):
        bound_call(out)()
        want = ufunc(a, b)
    np.testing.assert_array_equal(host_ndarray(out)[0, 0], want)


def test_in_place_add_in_bands_matches_numpy():
    """A residual added in place (ggml_add_inplace: dst is src0's memory)."""
    ctx = Context()
    a, b = values((400, 768), 1), values((400, 768), 2)
    ta = ctx.tensor_from_numpy(a)
    out = ops.add_inplace(ctx, ta, ctx.tensor_from_numpy(b))
    with np.errstate(all="ignore"):
        want = a + b
        bound_call(out)()
    np.testing.assert_array_equal(host_ndarray(ta)[0, 0], want)


@pytest.mark.parametrize("op, rows", [(ops.norm, jit_norm.norm_rows), (ops.rms_norm, jit_norm.rms_norm_rows)])
def test_row_norms_in_bands_are_those_of_the_whole(op, rows):
    ctx = Context()
    x = np.random.default_rng(3).standard_normal((400, 768)).astype(np.float32)
    out = op(ctx, ctx.tensor_from_numpy(x), 1e-6)
    bound_call(out)()
    want = np.empty_like(x)
    rows(x, want, np.float32(1e-6))
    np.testing.assert_array_equal(host_ndarray(out)[0, 0], want)


@pytest.mark.parametrize("max_bias, with_sinks", [(0.0, False), (8.0, True)])
def test_soft_max_in_bands_of_heads_is_that_of_the_whole(max_bias, with_sinks):
    """A prompt's soft_max (heads x rows x keys, causal F16 mask) shared out by heads: each head's slope and sink
    go with it, and every value is the whole call's."""
    ctx = Context()
    heads, rows, keys = 8, 192, 256
    x = np.random.default_rng(4).standard_normal((heads, rows, keys)).astype(np.float32) * 3
    assert x.size >= SPLIT_VALUES
    causal = np.where(np.arange(keys)[None, :] <= np.arange(rows)[:, None] + keys - rows, 0, -np.inf)
    mask = ctx.new_tensor_2d(G.F16, keys, rows)
    host_ndarray(mask)[...] = causal.astype(np.float16)
    out = ops.soft_max_ext(ctx, ctx.tensor_from_numpy(x), mask, 0.125, max_bias)
    sinks = np.random.default_rng(5).standard_normal(heads).astype(np.float32)
    if with_sinks:
        ops.soft_max_add_sinks(out, ctx.tensor_from_numpy(sinks))
    bound_call(out)()
    want = np.empty_like(x)
    soft_max_rows(x[None], want[None], np.float32(0.125), f16_bits(causal.astype(np.float32))[None, None],
                  alibi_slopes(heads, max_bias), sinks if with_sinks else np.zeros(0, np.float32))
    np.testing.assert_array_equal(host_ndarray(out)[0], want)
