"""Reduction op builders: ggml's result shapes and types, sort order in op_params, input checks."""

import pytest

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op
from pyggml.core.types import GGMLType as G
from pyggml.errors import ShapeError, GGMLTypeError


@pytest.fixture
def ctx():
    return Context(no_alloc=True)


@pytest.fixture
def a(ctx):
    return ctx.new_tensor(G.F16, (7, 5, 3, 2), name="a")


@pytest.mark.parametrize("name, op, type_, ne", [
    ("sum", Op.SUM, G.F16, [1, 1, 1, 1]),
    ("sum_rows", Op.SUM_ROWS, G.F16, [1, 5, 3, 2]),
    ("mean", Op.MEAN, G.F32, [1, 5, 3, 2]),
])
def test_sums(ctx, a, name, op, type_, ne):
    out = getattr(ops, name)(ctx, a)
    assert (out.op, out.type, out.ne, out.src[0]) == (op, type_, ne, a)


def test_cumsum(ctx):
    x = ctx.new_tensor(G.F32, (7, 5))
    assert ops.cumsum(ctx, x).ne == x.ne and ops.cumsum(ctx, x).op == Op.CUMSUM
    with pytest.raises(GGMLTypeError, match="cumsum: a must be F32"):
        ops.cumsum(ctx, ctx.new_tensor(G.F16, (7, 5), name="h"))


def test_argmax(ctx, a):
    out = ops.argmax(ctx, ctx.new_tensor(G.F32, (7, 5)))
    assert (out.op, out.type, out.ne) == (Op.ARGMAX, G.I32, [5, 1, 1, 1])
    with pytest.raises(ShapeError, match="argmax: a must be a matrix"):
        ops.argmax(ctx, a)


def test_count_equal(ctx, a):
    out = ops.count_equal(ctx, a, ctx.new_tensor(G.F16, a.ne))
    assert (out.op, out.type, out.ne) == (Op.COUNT_EQUAL, G.I64, [1, 1, 1, 1])
    with pytest.raises(ShapeError, match="count_equal: a and b must have the same shape"):
        ops.count_equal(ctx, a, ctx.new_tensor(G.F16, (7, 5)))


@pytest.mark.parametrize("order", list(ops.SortOrder))
def test_argsort(ctx, a, order):
    out = ops.argsort(ctx, a, order)
    assert (out.op, out.type, out.ne, out.op_params[0]) == (Op.ARGSORT, G.I32, a.ne, order)


def test_top_k(ctx, a):
    out = ops.top_k(ctx, a, 3)
    assert (out.op, out.type, out.ne, out.op_params[0]) == (Op.TOP_K, G.I32, [3, 5, 3, 2], 0)
    with pytest.raises(ShapeError, match="top_k: k=8 exceeds the row length"):
        ops.top_k(ctx, a, 8)


def test_argsort_top_k_is_a_view_of_a_descending_argsort(ctx, a):
    out = ops.argsort_top_k(ctx, a, 2)
    sort = out.view_src
    assert out.op == Op.VIEW and out.ne == [2, 5, 3, 2] and out.nb == sort.nb
    assert sort.op == Op.ARGSORT and sort.op_params[0] == ops.SortOrder.DESC
    with pytest.raises(ShapeError, match="argsort_top_k: k=9"):
        ops.argsort_top_k(ctx, a, 9)
