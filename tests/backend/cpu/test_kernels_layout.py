"""CPU kernels for copies, repeats, concat, pad, get_rows, set_rows and diag against NumPy references."""

import numpy as np
import pytest
from tests.support.opcases_layout import CASES, EXTRA_CASES
from tests.support.opcheck import check, compute

from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G
from pyggml.errors import OutOfBoundsError


@pytest.mark.parametrize("case", CASES + EXTRA_CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)



def test_cpy_to_q8_0_is_within_one_quantum_per_block():
    """ggml's criterion for quantizing copies: each value at most one quantum (block amax / 127) off."""
    x = np.random.default_rng(1).uniform(-1, 1, (4, 64)).astype(np.float32)
    ctx = Context()
    out = compute(ops.cpy(ctx, ctx.tensor_from_numpy(x), ctx.new_tensor(G.Q8_0, (64, 4))))
    back = T.to_float(G.Q8_0, host_ndarray(out)[0, 0]).reshape(4, 2, 32)
    quantum = np.abs(x.reshape(4, 2, 32)).max(-1, keepdims=True) / 127
    assert np.all(np.abs(back - x.reshape(4, 2, 32)) <= quantum * 1.001)


def test_cpy_f32_to_i32_truncates_toward_zero():
    ctx = Context()
    x = ctx.tensor_from_numpy(np.array([-2.7, -0.5, 0.5, 2.7, 99.99], np.float32))
    out = compute(ops.cpy(ctx, x, ctx.new_tensor(G.I32, (5,))))
    assert host_ndarray(out).ravel().tolist() == [-2, 0, 0, 2, 99]


def test_cpy_writes_into_the_destination_view():
    ctx = Context()
    base = ctx.new_tensor(G.F32, (4, 3), name="base")
    row = ops.view_1d(ctx, base, 4, base.nb[1])
    compute(ops.cpy(ctx, ctx.tensor_from_numpy(np.ones(4, np.float32)), row))
    np.testing.assert_array_equal(host_ndarray(base)[0, 0], [[0] * 4, [1] * 4, [0] * 4])


def test_set_rows_with_duplicate_ids_keeps_the_last_write():
    ctx = Context()
    dst = ctx.new_tensor(G.F32, (2, 3), name="dst")
    src = ctx.tensor_from_numpy(np.array([[1, 1], [2, 2]], np.float32))
    ids = ctx.tensor_from_numpy(np.array([1, 1], np.int64))
    compute(ops.set_rows(ctx, dst, src, ids))
    np.testing.assert_array_equal(host_ndarray(dst)[0, 0], [[0, 0], [2, 2], [0, 0]])


@pytest.mark.parametrize("op", ["get_rows", "set_rows"])
def test_row_ids_out_of_range_are_refused(op):
    ctx = Context()
    table = ctx.new_tensor(G.F32, (4, 3), name="table")
    ids = ctx.tensor_from_numpy(np.array([0, 3], np.int32 if op == "get_rows" else np.int64), name="ids")
    out = (ops.get_rows(ctx, table, ids) if op == "get_rows"
           else ops.set_rows(ctx, table, ctx.new_tensor(G.F32, (4, 2)), ids))
    with pytest.raises(OutOfBoundsError, match=r"'ids'.*\[0, 3\).*got \[0, 3\]"):
        compute(out)


@pytest.mark.parametrize("src, dst, ok", [
    (G.F32, G.Q4_K, False),  # gguf.quants cannot quantize K types
    (G.F32, G.IQ4_NL, False),
    (G.Q4_K, G.F32, True),
    (G.Q4_K, G.F16, False),
    (G.I32, G.F16, False),
    (G.F16, G.BF16, True),
    (G.F32, G.Q5_1, True),
])
def test_copy_supports_tells_the_truth(src, dst, ok):
    ctx = Context(no_alloc=True)
    out = ops.cpy(ctx, ctx.new_tensor(src, (256, 2)), ctx.new_tensor(dst, (256, 2)))
    assert kernels.supports(out) is ok


def test_views_need_no_kernel():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(G.F32, (64, 4))
    assert all(kernels.supports(v) for v in (ops.transpose(ctx, a), ops.reshape_1d(ctx, a, 256),
                                             ops.view_2d(ctx, a, 32, 2, a.nb[1], 0), ops.permute(ctx, a, 1, 0, 2, 3)))
