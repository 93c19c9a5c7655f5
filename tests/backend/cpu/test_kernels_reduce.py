"""CPU kernels for reductions and orderings (sums at NMSE 1e-7; indices and counts exact)."""

import numpy as np
import pytest
from tests.support.opcases_reduce import CASES, EXTRA_CASES
from tests.support.opcheck import check, compute

from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G


@pytest.mark.parametrize("case", CASES + EXTRA_CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)



def test_argmax_picks_the_last_of_equal_maxima():
    ctx = Context()
    x = ctx.tensor_from_numpy(np.array([[1, 3, 3, 0], [5, 5, 5, 5]], np.float32))
    assert host_ndarray(compute(ops.argmax(ctx, x))).ravel().tolist() == [2, 3]


def test_top_k_returns_the_k_largest():
    ctx = Context()
    x = ctx.tensor_from_numpy(np.array([0.1, 0.9, -0.5, 0.7, 0.3], np.float32))
    got = host_ndarray(compute(ops.top_k(ctx, x, 3))).ravel()
    assert sorted(got.tolist()) == [1, 3, 4] and got.tolist() == [3, 1, 4]


def test_sum_accumulates_in_double():
    """1 + 1e-8 * n summed in float32 would lose every small term; ggml's ggml_float keeps them."""
    ctx = Context()
    vals = np.full(4096, 1e-8, np.float32)
    vals[0] = 1.0
    got = host_ndarray(compute(ops.sum(ctx, ctx.tensor_from_numpy(vals)))).item()
    assert got == np.float32(1.0 + 4095e-8)


@pytest.mark.parametrize("build", [
    lambda ctx: ops.sum_rows(ctx, ctx.new_tensor(G.F16, (4, 2))),
    lambda ctx: ops.argmax(ctx, ctx.new_tensor(G.I32, (4, 2))),
    lambda ctx: ops.argsort(ctx, ctx.new_tensor(G.F16, (4, 2)), ops.SortOrder.ASC),
    lambda ctx: ops.count_equal(ctx, ctx.new_tensor(G.F32, (4, 2)), ctx.new_tensor(G.F32, (4, 2))),
    lambda ctx: ops.mean(ctx, ctx.new_tensor(G.BF16, (4, 2))),
])
def test_unsupported_types_are_refused(build):
    assert not kernels.supports(build(Context(no_alloc=True)))
