"""CPU kernels of the element-wise family against independent NumPy references (ggml's NMSE 1e-7)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.opcases_elementwise import BINARY, CASES, EXTRA_CASES, tiled
from tests.support.opcheck import check, compute, run

from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.kernels.elementwise import split_for_repeat
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G
from pyggml.errors import OutOfBoundsError, UnsupportedOpError


@pytest.mark.parametrize("case", CASES + EXTRA_CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)



def test_add_inplace_writes_into_a():
    ctx = Context()
    a = ctx.tensor_from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), name="a")
    b = ctx.tensor_from_numpy(np.array([1, 2, 3, 4], dtype=np.float32), name="b")
    out = compute(ops.add_inplace(ctx, a, b))
    assert out.data == a.data
    np.testing.assert_array_equal(host_ndarray(a)[0, 0], np.arange(12).reshape(3, 4) + [1, 2, 3, 4])


def test_split_for_repeat_is_a_writable_view():
    big = np.zeros((2, 4, 6, 8), np.float32)[:, :, :, ::2]
    split = split_for_repeat(big, (1, 2, 3, 4))
    assert split.shape == (2, 1, 2, 2, 2, 3, 1, 4) and np.shares_memory(split, big)
    split[...] = 1
    assert big.all()


@pytest.mark.parametrize("types", [(G.F32, G.F16), (G.I32, G.I32), (G.Q4_0, G.F32), (G.F32, G.BF16)])
def test_binary_supports_tells_the_truth(types):
    ctx = Context()
    out = ops.mul(ctx, ctx.new_tensor(types[0], (32, 2)), ctx.new_tensor(types[1], (32, 2)))
    assert not kernels.supports(out)
    with pytest.raises(UnsupportedOpError, match="MUL"):
        kernels.compute(out)


def test_unsupported_types_are_refused():
    ctx = Context()
    assert not kernels.supports(ops.scale(ctx, ctx.new_tensor(G.F16, (4,)), 2.0))
    assert not kernels.supports(ops.leaky_relu(ctx, ctx.new_tensor(G.BF16, (4,)), 0.1))
    assert not kernels.supports(ops.sqrt(ctx, ctx.new_tensor(G.I32, (4,))))
    assert kernels.supports(ops.sqrt(ctx, ctx.new_tensor(G.BF16, (4,))))


def test_add_id_rejects_ids_out_of_range():
    ctx = Context()
    a = ctx.new_tensor(G.F32, (4, 2, 1), name="a")
    b = ctx.new_tensor(G.F32, (4, 3), name="bias")
    ids = ctx.new_tensor(G.I32, (2, 1), name="ids")
    host_ndarray(ids)[...] = [[3, 0]]
    with pytest.raises(OutOfBoundsError, match=r"'ids'.*\[0, 3\)"):
        compute(ops.add_id(ctx, a, b, ids))


def test_div_by_zero_gives_inf_like_c():
    ctx = Context()
    a = ctx.tensor_from_numpy(np.array([1, -1, 0], np.float32))
    b = ctx.tensor_from_numpy(np.zeros(3, np.float32))
    out = host_ndarray(compute(ops.div(ctx, a, b)))[0, 0, 0]
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2])


def test_clamp_is_a_view_of_its_input():
    ctx = Context()
    a = ctx.tensor_from_numpy(np.linspace(-2, 2, 9, dtype=np.float32), name="a")
    out = compute(ops.clamp(ctx, a, -1.0, 1.0))
    assert out.view_src is a and host_ndarray(a).max() == 1.0 and host_ndarray(a).min() == -1.0


def test_run_is_deterministic():
    assert np.array_equal(host_ndarray(run(CASES[0])), host_ndarray(run(CASES[0])))


@given(op=st.sampled_from(sorted(BINARY)), small=st.lists(st.integers(1, 3), min_size=4, max_size=4),
       reps=st.lists(st.integers(1, 3), min_size=4, max_size=4), seed=st.integers(0, 2**16))
def test_binary_broadcast_matches_tiling(op, small, reps, seed):
    """Any b whose dims divide a's is repeated into a, as np.tile does."""
    rng = np.random.default_rng(seed)
    a_np = rng.uniform(0.5, 1, [s * r for s, r in zip(small, reps, strict=True)][::-1]).astype(np.float32)
    b_np = rng.uniform(0.5, 1, small[::-1]).astype(np.float32)
    ctx = Context()
    out = compute(getattr(ops, op)(ctx, ctx.tensor_from_numpy(a_np), ctx.tensor_from_numpy(b_np)))
    np.testing.assert_allclose(host_ndarray(out), BINARY[op](a_np, tiled(b_np, a_np.shape)), rtol=1e-6)
