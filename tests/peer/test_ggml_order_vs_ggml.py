"""The CPU kernels that compute in ggml's CPU order (soft_max without a mask, norm, SiLU and SwiGLU, rope, average
pooling) give ggml's own values bit for bit: the same graph computed by pyggml and by ggml 0.15.3's CPU backend
(ggml-python), on an AVX-512 machine, where ggml takes the AVX-512 paths pyggml's order follows. (A masked
softmax row sums in float64 value by value instead: jit/softmax.py.)

The products are not compared here: ggml-python's build has no llamafile (its tinyBLAS-sized products go through
ggml_vec_dot_f32) and its compiler fuses ggml_vec_dot_f32's tail into FMAs, where llama.cpp's build (the one
pyggml follows, checked against mtmd's outputs bit for bit in tests/models/vision) does neither."""

import numpy as np
import pytest

pytest.importorskip("ggml", reason="ggml-python (the ggml peer) is not installed")

from pyggml.core import ops  # noqa: E402
from pyggml.core.context import Context  # noqa: E402
from pyggml.core.graph import Graph  # noqa: E402
from pyggml.core.ops.attention import RopeType  # noqa: E402
from pyggml.core.ops.conv import PoolOp  # noqa: E402
from pyggml.core.tensor import GluOp, UnaryOp, host_ndarray  # noqa: E402
from pyggml.core.types import GGMLType as G  # noqa: E402

from tests.support.ggml_peer import IsolatedPeer  # noqa: E402
from tests.support.opcheck import compute  # noqa: E402

pytestmark = pytest.mark.peer
ROPE_ARGS = (4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)  # n_ctx_orig, base, scale, ext, attn, beta_fast/slow


def _avx512() -> bool:
    try:
        return "avx512f" in open("/proc/cpuinfo").read()
    except OSError:
        return False


def _filled(ctx, rng, type_, ne, scale=1.0):
    t = ctx.new_tensor(type_, ne)
    host_ndarray(t)[...] = (rng.standard_normal(tuple(reversed(ne))) * scale).astype(np.float32)
    return t


def _outputs(ctx):
    """Each op of the kernels in ggml's order, on rows with a tail past their last 16 values."""
    rng = np.random.default_rng(5)
    f32 = lambda *ne, scale=1.0: _filled(ctx, rng, G.F32, ne, scale)  # noqa: E731
    rows, gate = f32(37, 6, scale=3.0), f32(37, 6)
    positions = ctx.new_tensor(G.I32, [4 * 5])
    host_ndarray(positions)[...] = np.arange(20) % 7
    heads = f32(16, 2, 5)
    return {
        "soft_max": ops.soft_max_ext(ctx, f32(37, 6, scale=4.0), None, 0.7, 0.0),
        "norm": ops.norm(ctx, rows, 1e-5),
        "silu": ops.unary(ctx, rows, UnaryOp.SILU),
        "swiglu": ops.glu_split(ctx, rows, gate, GluOp.SWIGLU),
        "rope_neox": ops.rope_ext(ctx, heads, ops.view_1d(ctx, positions, 5, 0), None, 16, RopeType.NEOX,
                                  *ROPE_ARGS),
        "rope_vision": ops.rope_multi(ctx, heads, positions, None, 8, (4, 4, 4, 4), RopeType.VISION, *ROPE_ARGS),
        "pool_avg": ops.pool_2d(ctx, f32(9, 7, 3), PoolOp.AVG, 3, 3, 2, 2, 1, 1),
    }


@pytest.mark.skipif(not _avx512(), reason="ggml's order is followed as its AVX-512 code sums")
def test_kernels_in_ggml_order_give_ggmls_values_bit_for_bit():
    ctx = Context()
    outs = _outputs(ctx)
    graph = Graph()
    for out in outs.values():
        graph.build_forward_expand(out)
    inputs = {t: host_ndarray(t).copy() for t in graph.leafs if t.view_src is None}
    with IsolatedPeer(n_threads=2) as peer:
        theirs = peer.compute(graph, inputs, list(outs.values()))
    for out in outs.values():
        compute(out)
    differing = {name: int((host_ndarray(out).reshape(-1) != np.asarray(ref).reshape(-1)).sum())
                 for (name, out), ref in zip(outs.items(), theirs, strict=True)}
    assert not any(differing.values()), f"values differing from ggml's: {differing}"
