"""Reductions along rows and over whole tensors; sums accumulate in float64 as ggml's ggml_float does."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._common import FLOAT_TYPES, as_f32, store, view
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType as G


def src_f32(t: Tensor) -> bool:
    return t.src[0].type == G.F32


@kernel(Op.SUM, supports=lambda t: t.src[0].type in FLOAT_TYPES and t.type == t.src[0].type)
def sum_all(dst: Tensor) -> None:
    store(dst, np.float32(as_f32(dst.src[0]).sum(dtype=np.float64)))


@kernel(Op.SUM_ROWS, supports=lambda t: src_f32(t) and t.type == G.F32)
def sum_rows(dst: Tensor) -> None:
    np.copyto(view(dst), view(dst.src[0]).sum(axis=-1, keepdims=True, dtype=np.float64), casting="unsafe")


@kernel(Op.MEAN, supports=lambda t: src_f32(t) and t.type == G.F32)
def mean(dst: Tensor) -> None:
    """The row sum rounded to float, then divided in float (ggml's order)."""
    sums = view(dst.src[0]).sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):  # empty rows give NaN (0/0), as in ggml
        np.divide(sums, np.float32(dst.src[0].ne[0]), out=view(dst))


@kernel(Op.CUMSUM, supports=lambda t: src_f32(t) and t.type == G.F32)
def cumsum(dst: Tensor) -> None:
    np.cumsum(view(dst.src[0]), axis=-1, dtype=np.float32, out=view(dst))


@kernel(Op.ARGMAX, supports=lambda t: src_f32(t) and t.type == G.I32)
def argmax(dst: Tensor) -> None:
    """Index of the maximum of each row; on ties the last one wins, as in ggml_vec_argmax_f32."""
    rows = view(dst.src[0])[0, 0]
    view(dst)[0, 0, 0, :] = rows.shape[-1] - 1 - np.argmax(rows[:, ::-1], axis=-1)


@kernel(Op.COUNT_EQUAL, supports=lambda t: t.src[0].type == t.src[1].type == G.I32 and t.type == G.I64)
def count_equal(dst: Tensor) -> None:
    view(dst)[...] = np.count_nonzero(view(dst.src[0]) == view(dst.src[1]))


@kernel(Op.ARGSORT, supports=lambda t: src_f32(t) and t.type == G.I32)
def argsort(dst: Tensor) -> None:
    """op_params[0]: 0 ascending, 1 descending. Ties come in unspecified order, as with ggml's std::sort."""
    x = view(dst.src[0])
    view(dst)[...] = np.argsort(-x if dst.op_params[0] else x, axis=-1)


@kernel(Op.TOP_K, supports=lambda t: src_f32(t) and t.type == G.I32)
def top_k(dst: Tensor) -> None:
    """The k largest, best first, then the first two swapped: ggml does this to stress that order is not part
    of top_k's contract."""
    k = dst.ne[0]
    neg = -view(dst.src[0])
    best = np.argpartition(neg, k - 1, axis=-1)[..., :k]
    order = np.take_along_axis(best, np.argsort(np.take_along_axis(neg, best, -1), axis=-1), -1)
    if k > 1:
        order[..., [0, 1]] = order[..., [1, 0]]
    view(dst)[...] = order
