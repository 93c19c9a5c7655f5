"""CPU kernels of the conv family against float64 NumPy references written from the definitions."""

import numpy as np
import pytest
from tests.support.opcases_conv import CASES, conv_transpose_2d_case, im2col_case
from tests.support.opcheck import check, fill_random

from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType

F32 = GGMLType.F32


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)


def test_im2col_reads_a_permuted_image():
    """ggml 0.15.3's CPU im2col assumes each [W, H] plane is packed (it ignores nb[1]); pyggml follows the strides."""
    check(im2col_case("im2col_2d_permuted_input", (3, 2, 3, 2), (6, 5, 3, 2), (1, 2), (1, 1), (1, 1), True, F32,
                      channels_outer=True))


def test_conv_transpose_2d_computes_every_batch():
    """ggml 0.15.3's CPU kernel fills only batch 0 (other batches stay zero); pyggml computes them all."""
    check(conv_transpose_2d_case("conv_transpose_2d_batched", 2, 3, 3, 2, 3, 3, 2, 1))


def test_conv_2d_dw_direct_channels_innermost_layout():
    """A CWHN (channels-innermost) input gives a CWHN result with the same values as the WHCN one."""
    ctx = Context()
    k = ctx.new_tensor(F32, (3, 3, 1, 4), name="kernel")
    whcn = ctx.new_tensor(F32, (6, 5, 4, 2), name="x")
    cwhn_base = ctx.new_tensor(F32, (4, 6, 5, 2), name="x_cwhn")
    rng = np.random.default_rng(0)
    fill_random(k, rng)
    fill_random(whcn, rng)
    host_ndarray(cwhn_base)[...] = host_ndarray(whcn).transpose(0, 2, 3, 1)
    cwhn = ops.permute(ctx, cwhn_base, 2, 0, 1, 3)
    a = ops.conv_2d_dw_direct(ctx, k, whcn, 1, 1, 1, 1, 1, 1)
    b = ops.conv_2d_dw_direct(ctx, k, cwhn, 1, 1, 1, 1, 1, 1)
    assert b.nb[2] == 4 and b.nb[0] == 16 and a.is_contiguous
    for node in Graph().build_forward_expand(a).nodes + Graph().build_forward_expand(b).nodes:
        kernels.compute(node)
    np.testing.assert_allclose(host_ndarray(a), host_ndarray(b), rtol=1e-6, atol=1e-6)


def test_upscale_antialias_is_unsupported():
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor(F32, (4, 4))
    assert kernels.supports(ops.interpolate(ctx, x, 8, 8, 1, 1, ops.ScaleMode.BICUBIC))
    assert not kernels.supports(
        ops.interpolate(ctx, x, 2, 2, 1, 1, ops.ScaleMode.BILINEAR | ops.ScaleFlag.ANTIALIAS))
    assert kernels.supports(ops.upscale(ctx, x, 2, ops.ScaleMode.BILINEAR))
