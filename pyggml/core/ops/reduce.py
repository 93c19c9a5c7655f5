"""Reductions and orderings along rows: sum, sum_rows, mean, cumsum, argmax, count_equal, argsort, top_k."""

from __future__ import annotations

from enum import IntEnum

from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result
from pyggml.core.ops.layout import view_4d
from pyggml.core.tensor import Op, Tensor

__all__ = ["SortOrder", "sum", "sum_rows", "mean", "cumsum", "argmax", "count_equal", "argsort", "argsort_top_k",
           "top_k"]

INT32_MAX = 2**31 - 1


class SortOrder(IntEnum):
    """ggml_sort_order."""

    ASC = 0
    DESC = 1


def sum(ctx: Context, a: Tensor) -> Tensor:  # noqa: A001 - ggml's name
    """All elements summed into one, of a's type."""
    return new_result(ctx, Op.SUM, a.type, [1], (a,))


def sum_rows(ctx: Context, a: Tensor) -> Tensor:
    return new_result(ctx, Op.SUM_ROWS, a.type, [1, *a.ne[1:]], (a,))


def mean(ctx: Context, a: Tensor) -> Tensor:
    return new_result(ctx, Op.MEAN, T.GGMLType.F32, [1, *a.ne[1:]], (a,))


def cumsum(ctx: Context, a: Tensor) -> Tensor:
    """Running sum along each row."""
    check_type(a.type == T.GGMLType.F32, "cumsum", "a must be F32", a)
    return new_result(ctx, Op.CUMSUM, a.type, a.ne, (a,))


def argmax(ctx: Context, a: Tensor) -> Tensor:
    """Index of the largest element of each row of a matrix (I32)."""
    check_shape(a.ne[2] == 1 and a.ne[3] == 1, "argmax", "a must be a matrix", a)
    check_shape(a.ne[0] <= INT32_MAX, "argmax", "rows longer than INT32_MAX", a)
    return new_result(ctx, Op.ARGMAX, T.GGMLType.I32, [a.ne[1]], (a,))


def count_equal(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """How many elements of a and b are equal (one I64)."""
    check_shape(a.same_shape(b), "count_equal", "a and b must have the same shape", a, b)
    return new_result(ctx, Op.COUNT_EQUAL, T.GGMLType.I64, [1], (a, b))


def argsort(ctx: Context, a: Tensor, order: SortOrder) -> Tensor:
    """For each row, the indices that sort it (I32)."""
    check_shape(a.ne[0] <= INT32_MAX, "argsort", "rows longer than INT32_MAX", a)
    return new_result(ctx, Op.ARGSORT, T.GGMLType.I32, a.ne, (a,), (int(SortOrder(order)),))


def argsort_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """The first k columns of a descending argsort (a view)."""
    check_shape(a.ne[0] >= k, "argsort_top_k", f"k={k} exceeds the row length", a)
    t = argsort(ctx, a, SortOrder.DESC)
    return view_4d(ctx, t, k, t.ne[1], t.ne[2], t.ne[3], t.nb[1], t.nb[2], t.nb[3], 0)


def top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """Indices of the k largest elements of each row (I32); their order is unspecified, as in ggml."""
    check_shape(a.ne[0] >= k, "top_k", f"k={k} exceeds the row length", a)
    return new_result(ctx, Op.TOP_K, T.GGMLType.I32, [k, *a.ne[1:]], (a,))
