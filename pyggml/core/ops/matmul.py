"""Matrix products: mul_mat, mul_mat_id (mixture of experts) and out_prod, with ggml's shapes and broadcasting."""

from __future__ import annotations

from enum import IntEnum

from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType

__all__ = ["Prec", "OpHint", "mul_mat", "mul_mat_set_prec", "mul_mat_set_hint", "mul_mat_id", "out_prod"]


class Prec(IntEnum):
    """ggml_prec: stored in op_params so backends may pick a more precise accumulator."""
    DEFAULT = 0
    F32 = 10


class OpHint(IntEnum):
    """ggml_op_hint (mul_mat op_params word 1)."""
    NONE = 0
    SRC0_IS_HADAMARD = 1


def _check_broadcast(op: str, a: Tensor, b: Tensor) -> None:
    """b's dims 2 and 3 must be whole multiples of a's: a's matrices are reused for consecutive b matrices."""
    check_shape(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, op,
                f"b.ne[2:4]={b.ne[2:4]} must be multiples of a.ne[2:4]={a.ne[2:4]}", a, b)
    check_shape(not a.is_transposed, op, "a must not be transposed (nb[0] > nb[1])", a)


def mul_mat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a·bᵀ per matrix: result F32 [a.ne1, b.ne1, b.ne2, b.ne3] (rows of a dotted with rows of b)."""
    check_shape(a.ne[0] == b.ne[0], "mul_mat", f"a.ne[0]={a.ne[0]} != b.ne[0]={b.ne[0]}", a, b)
    _check_broadcast("mul_mat", a, b)
    return new_result(ctx, Op.MUL_MAT, GGMLType.F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), srcs=(a, b))


def _check_op(t: Tensor, op: Op, fn: str) -> None:
    check_shape(t.op == op, fn, f"expects a {op.name} result, got op {t.op.name}", t)


def mul_mat_set_prec(t: Tensor, prec: Prec) -> None:
    _check_op(t, Op.MUL_MAT, "mul_mat_set_prec")
    t.set_op_params_i32(0, int(prec))


def mul_mat_set_hint(t: Tensor, hint: OpHint) -> None:
    _check_op(t, Op.MUL_MAT, "mul_mat_set_hint")
    t.set_op_params_i32(1, int(hint))


def mul_mat_id(ctx: Context, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Per token t and slot e: as_[:, :, ids[e, t]] · b[:, e % b.ne1, t] -> F32 [as_.ne1, ids.ne0, b.ne2, 1].

    as_ is [cols, rows, n_expert]; b is [cols, n_expert_used or 1, n_tokens]; ids is I32 [n_expert_used, n_tokens].
    """
    op = "mul_mat_id"
    check_shape(not as_.is_transposed, op, "as must not be transposed", as_)
    check_type(ids.type == GGMLType.I32, op, "ids must be I32", ids)
    check_shape(as_.ne[3] == 1, op, "as must be 3-D (one matrix per expert)", as_)
    check_shape(b.ne[3] == 1, op, "b must be 3-D", b)
    check_shape(ids.ne[2] == 1 and ids.ne[3] == 1, op, "ids must be 2-D", ids)
    check_shape(ids.ne[1] == b.ne[2], op, f"ids.ne[1]={ids.ne[1]} must equal b.ne[2]={b.ne[2]} (one list per token)",
                ids, b)
    check_shape(as_.ne[0] == b.ne[0], op, f"as.ne[0]={as_.ne[0]} != b.ne[0]={b.ne[0]}", as_, b)
    check_shape(ids.ne[0] % b.ne[1] == 0, op, f"ids.ne[0]={ids.ne[0]} must be a multiple of b.ne[1]={b.ne[1]}",
                ids, b)
    return new_result(ctx, Op.MUL_MAT_ID, GGMLType.F32, (as_.ne[1], ids.ne[0], b.ne[2], 1), srcs=(as_, b, ids))


def out_prod(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Sum of outer products of columns: result F32 [a.ne0, b.ne0, b.ne2, b.ne3] = a·bᵀ over dim 1."""
    check_shape(a.ne[1] == b.ne[1], "out_prod", f"a.ne[1]={a.ne[1]} != b.ne[1]={b.ne[1]}", a, b)
    _check_broadcast("out_prod", a, b)
    return new_result(ctx, Op.OUT_PROD, GGMLType.F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]), srcs=(a, b))
