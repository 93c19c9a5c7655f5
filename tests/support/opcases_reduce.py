"""Op graphs for reductions and orderings, with NumPy / plain-Python references."""

from __future__ import annotations

import numpy as np
from tests.support.opcheck import ROW_LAYOUTS, OpCase, new_input, stored_as, values

from pyggml.core import ops
from pyggml.core.ops import SortOrder
from pyggml.core.tensor import host_ndarray
from pyggml.core.types import GGMLType as G

SHAPES = [(16, 5, 3, 2), (33, 1, 1, 1), (1, 7, 2, 1)]


def x_case(name, build_op, ref_fn, type_=G.F32, ne=(16, 5, 3, 2), layout="cont", tol=1e-7):
    def build(ctx):
        return build_op(ctx, new_input(ctx, type_, ne, layout, "x"))

    return OpCase(f"{name}_{type_.name}_{'x'.join(map(str, ne))}_{layout}", build, tol,
                  lambda out: stored_as(out, ref_fn(values(out.src[0]))))


def argmax_last(x):
    """Index of each row's maximum, the last one on ties (ggml_vec_argmax_f32)."""
    return np.array([max(np.flatnonzero(row == row.max())) for row in x[0, 0]]).reshape(1, 1, 1, -1)


def argsort_rows(x, descending):
    rows = x.reshape(-1, x.shape[-1])
    order = [sorted(range(len(r)), key=lambda i, r=r: -r[i] if descending else r[i]) for r in rows]
    return np.array(order).reshape(x.shape)


def top_k_ggml_order(x, k):
    """The k largest, best first, with the first two swapped (ggml's way of saying order is unspecified)."""
    best = argsort_rows(x, True)[..., :k].copy()
    if k > 1:
        best[..., [0, 1]] = best[..., [1, 0]]
    return best


def count_equal_case(ne):
    def build(ctx):
        rng = np.random.default_rng(7)
        a, b = ctx.new_tensor(G.I32, ne, name="a"), ctx.new_tensor(G.I32, ne, name="b")
        host_ndarray(a)[...] = rng.integers(0, 3, host_ndarray(a).shape)
        host_ndarray(b)[...] = rng.integers(0, 3, host_ndarray(b).shape)
        return ops.count_equal(ctx, a, b)

    return OpCase(f"count_equal_I32_{'x'.join(map(str, ne))}", build, 0.0,
                  lambda out: np.array([np.sum(values(out.src[0]) == values(out.src[1]))]).reshape(1, 1, 1, 1))


def layout_cases(layouts):
    return [
        *(x_case("sum", ops.sum, lambda x: np.sum(x).reshape(1, 1, 1, 1), t, ne, lay)
          for t in (G.F32, G.F16, G.BF16) for ne in SHAPES for lay in layouts),
        *(x_case("sum_rows", ops.sum_rows, lambda x: x.sum(-1, keepdims=True), ne=ne, layout=lay)
          for ne in SHAPES for lay in layouts),
        *(x_case("mean", ops.mean, lambda x: x.mean(-1, keepdims=True), ne=ne, layout=lay)
          for ne in SHAPES for lay in layouts),
        *(x_case("cumsum", ops.cumsum, lambda x: np.cumsum(x, -1), ne=ne, layout=lay) for ne in SHAPES
          for lay in layouts),
        *(x_case("argmax", ops.argmax, argmax_last, ne=ne, layout=lay, tol=0.0)
          for ne in [(40, 6), (3, 1), (1, 5)] for lay in layouts),
    ]


CASES = [
    *layout_cases(ROW_LAYOUTS),
    *(x_case(f"argsort_{order.name.lower()}", lambda ctx, x, o=order: ops.argsort(ctx, x, o),
             lambda x, o=order: argsort_rows(x, o == SortOrder.DESC), ne=ne, layout=lay, tol=0.0)
      for order in SortOrder for ne in SHAPES for lay in ("cont", "pad")),
    *(x_case(f"top_k_{k}", lambda ctx, x, k=k: ops.top_k(ctx, x, k), lambda x, k=k: top_k_ggml_order(x, k),
             ne=(20, 3, 2), layout=lay, tol=0.0) for k in (1, 2, 5, 20) for lay in ("cont", "pad")),
    OpCase("argsort_top_k", lambda ctx: ops.argsort_top_k(ctx, ctx.new_tensor(G.F32, (20, 3), name="x"), 4), 0.0,
           lambda out: argsort_rows(values(out.view_src.src[0]), True)[..., :4]),
    count_equal_case((10, 4)),
]

# Cases ggml 0.15.3's CPU backend cannot be compared on: inputs whose elements are strided (ggml's kernels
# GGML_ASSERT on them or read them as if packed), and count_equal over 3-D (ggml's row indexing is only right
# for matrices). pyggml computes them; they are checked against the NumPy reference only, and the ggml peer
# harness (which reads CASES) leaves them out.
EXTRA_CASES = [*layout_cases(("perm",)), count_equal_case((10, 4, 3))]
