"""CPU kernels for norm, rms_norm, l2_norm, group_norm against float64 definitions (NMSE 1e-7)."""

import numpy as np
import pytest
from tests.support.opcases_norm import CASES, EXTRA_CASES
from tests.support.opcheck import check, compute

from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G


@pytest.mark.parametrize("case", CASES + EXTRA_CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)


def test_rms_norm_follows_ggml_float_order():
    """mean = (float)(sum_double(x*x) / n); scale = 1/sqrtf(mean + eps); y = x * scale, all float32."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (3, 257)).astype(np.float32)
    ctx = Context()
    out = compute(ops.rms_norm(ctx, ctx.tensor_from_numpy(x), 1e-5))
    mean = ((x * x).astype(np.float64).sum(-1, keepdims=True) / 257).astype(np.float32)
    expected = x * (np.float32(1) / np.sqrt(mean + np.float32(1e-5)))
    np.testing.assert_array_equal(host_ndarray(out)[0, 0], expected)


@pytest.mark.parametrize("name", ["norm", "rms_norm", "l2_norm"])
def test_only_f32_is_supported(name):
    ctx = Context(no_alloc=True)
    assert not kernels.supports(getattr(ops, name)(ctx, ctx.new_tensor(G.F16, (8, 2)), 1e-6))
