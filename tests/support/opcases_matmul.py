"""Op graphs for mul_mat, mul_mat_id and out_prod, with float64 NumPy references (ggml's 5e-4 NMSE)."""

from __future__ import annotations

import numpy as np
from tests.support.opcheck import OpCase, values

from pyggml.backend.cpu.kernels._dequant_cache import dequantizable
from pyggml.core import ops
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType, blck_size

TOL = 5e-4
QUANT_TYPES = [t for t in GGMLType if blck_size(t) > 1 and dequantizable(t)]
SRC0_TYPES = [GGMLType.F32, GGMLType.F16, GGMLType.BF16, *QUANT_TYPES]


def _repeat_to(x: np.ndarray, shape) -> np.ndarray:
    """ggml's broadcast of src0 over dims 2, 3: each matrix serves a run of consecutive ones."""
    return np.repeat(np.repeat(x, shape[0] // x.shape[0], axis=0), shape[1] // x.shape[1], axis=1)


def ref_mul_mat(out):
    a, b = values(out.src[0]), values(out.src[1])
    return np.einsum("xyik,xyjk->xyji", _repeat_to(a, b.shape[:2]), b)


def ref_out_prod(out):
    a, b = values(out.src[0]), values(out.src[1])
    return np.einsum("xyki,xykj->xyji", _repeat_to(a, b.shape[:2]), b)


def ref_mul_mat_id(out):
    experts, b, ids = values(out.src[0])[0], values(out.src[1])[0], host_ndarray(out.src[2])[0, 0]
    n_tok, n_used = ids.shape
    res = np.zeros((n_tok, n_used, experts.shape[1]))
    for t in range(n_tok):
        for e in range(n_used):
            res[t, e] = experts[ids[t, e]] @ b[t, e % b.shape[1]]
    return res[None]


def mul_mat_case(name, a_type, ne_a, ne_b, b_type=GGMLType.F32, b_axes=None):
    """b_axes: make b a permuted view (ggml.permute axes) of a tensor laid out in the inverse order."""
    def build(ctx):
        a = ctx.new_tensor(a_type, ne_a, name="a")
        if b_axes is None:
            b = ctx.new_tensor(b_type, ne_b, name="b")
        else:
            base_ne = [0] * 4
            for i, axis in enumerate(b_axes):
                base_ne[i] = (list(ne_b) + [1] * 4)[axis]
            b = ops.permute(ctx, ctx.new_tensor(b_type, base_ne, name="b_base"), *b_axes)
        return ops.mul_mat(ctx, a, b)
    return OpCase(name, build, TOL, ref_mul_mat)


def out_prod_case(name, a_type, ne_a, ne_b):
    def build(ctx):
        return ops.out_prod(ctx, ctx.new_tensor(a_type, ne_a, name="a"), ctx.new_tensor(GGMLType.F32, ne_b, name="b"))
    return OpCase(name, build, TOL, ref_out_prod)


def mul_mat_id_case(name, a_type, k, rows, n_expert, n_used, n_b, n_tok, seed=0):
    def build(ctx):
        as_ = ctx.new_tensor(a_type, (k, rows, n_expert), name="as")
        b = ctx.new_tensor(GGMLType.F32, (k, n_b, n_tok), name="b")
        ids = ctx.new_tensor(GGMLType.I32, (n_used, n_tok), name="ids")
        rng = np.random.default_rng(seed)
        host_ndarray(ids)[0, 0] = [rng.permutation(n_expert)[:n_used] for _ in range(n_tok)]
        return ops.mul_mat_id(ctx, as_, b, ids)
    return OpCase(name, build, TOL, ref_mul_mat_id)


CASES = [
    mul_mat_case("mul_mat_f32_2d", GGMLType.F32, (64, 16), (64, 8)),
    mul_mat_case("mul_mat_f32_vec", GGMLType.F32, (64, 16), (64, 1)),
    mul_mat_case("mul_mat_f32_grouped_columns", GGMLType.F32, (96, 40), (96, 16)),  # in place, 4 columns a pass
    mul_mat_case("mul_mat_f32_sgemm", GGMLType.F32, (96, 40), (96, 17)),            # one more: BLAS
    mul_mat_case("mul_mat_f32_bcast2", GGMLType.F32, (32, 12, 2, 1), (32, 5, 6, 2)),
    mul_mat_case("mul_mat_f32_bcast3", GGMLType.F32, (32, 7, 1, 2), (32, 3, 3, 4)),
    mul_mat_case("mul_mat_f32_permuted_b", GGMLType.F32, (32, 9, 2), (32, 5, 4), b_axes=(0, 2, 1, 3)),
    mul_mat_case("mul_mat_f16_f16", GGMLType.F16, (64, 10, 2), (64, 3, 2), b_type=GGMLType.F16),
    *[mul_mat_case(f"mul_mat_{t.name.lower()}", t, (256, 8, 2), (256, 3, 4)) for t in SRC0_TYPES[1:]],
    mul_mat_id_case("mul_mat_id_f32", GGMLType.F32, 32, 16, 6, 2, 2, 5),
    mul_mat_id_case("mul_mat_id_f32_bcast_b", GGMLType.F32, 32, 16, 4, 3, 1, 7),
    mul_mat_id_case("mul_mat_id_q4_0", GGMLType.Q4_0, 64, 8, 4, 2, 2, 3),
    # experts used by up to 16 rows (one kernel call for all, 4 rows a plane) next to experts used by more (a call
    # each): 14, 12, 18, 15, 19 and 18 rows
    mul_mat_id_case("mul_mat_id_q8_0_few_and_many_rows", GGMLType.Q8_0, 64, 16, 6, 2, 1, 48),
    mul_mat_id_case("mul_mat_id_mxfp4", GGMLType.MXFP4, 64, 8, 4, 2, 2, 5),  # compiled MXFP4 decoding
    out_prod_case("out_prod_f32", GGMLType.F32, (16, 8), (10, 8)),
    out_prod_case("out_prod_f32_bcast", GGMLType.F32, (16, 8, 2, 1), (10, 8, 4, 3)),
    out_prod_case("out_prod_q8_0", GGMLType.Q8_0, (32, 8), (6, 8)),
]
