"""Shape inference and input checks of mul_mat, mul_mat_id and out_prod (ggml 0.15.3's rules)."""

import pytest
from hypothesis import given, strategies as st

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op
from pyggml.core.types import GGMLType
from pyggml.errors import ShapeError, GGMLTypeError

F32, I32 = GGMLType.F32, GGMLType.I32
dim = st.integers(1, 5)


@given(k=dim, m=dim, n=dim, a2=dim, a3=dim, r2=dim, r3=dim)
def test_mul_mat_shape_and_broadcast(k, m, n, a2, a3, r2, r3):
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(GGMLType.F16, (k, m, a2, a3))
    b = ctx.new_tensor(F32, (k, n, a2 * r2, a3 * r3))
    out = ops.mul_mat(ctx, a, b)
    assert (out.type, out.ne, out.op, out.src[:2]) == (F32, [m, n, a2 * r2, a3 * r3], Op.MUL_MAT, [a, b])
    assert out.is_contiguous and out.name == "" and out.op_params == [0] * 16


@pytest.mark.parametrize("ne_a, ne_b, why", [
    ((8, 4), (6, 4), "a.ne\\[0\\]=8 != b.ne\\[0\\]=6"),
    ((8, 4, 2), (8, 4, 3), "multiples"),
    ((8, 4, 1, 2), (8, 4, 1, 3), "multiples"),
])
def test_mul_mat_rejects_bad_shapes(ne_a, ne_b, why):
    ctx = Context(no_alloc=True)
    a, b = ctx.new_tensor(F32, ne_a, name="a"), ctx.new_tensor(F32, ne_b, name="b")
    with pytest.raises(ShapeError, match=f"mul_mat: .*{why}.*'a'"):
        ops.mul_mat(ctx, a, b)
    assert len(ctx) == 2  # nothing half-built


def test_mul_mat_rejects_transposed_a():
    ctx = Context(no_alloc=True)
    a = ops.transpose(ctx, ctx.new_tensor(F32, (4, 4), name="a"))
    with pytest.raises(ShapeError, match="transposed"):
        ops.mul_mat(ctx, a, ctx.new_tensor(F32, (4, 2)))


def test_mul_mat_prec_and_hint_words():
    ctx = Context(no_alloc=True)
    out = ops.mul_mat(ctx, ctx.new_tensor(F32, (4, 3)), ctx.new_tensor(F32, (4, 2)))
    ops.mul_mat_set_prec(out, ops.Prec.F32)
    ops.mul_mat_set_hint(out, ops.OpHint.SRC0_IS_HADAMARD)
    assert out.op_params[:2] == [10, 1]
    with pytest.raises(ShapeError, match="MUL_MAT"):
        ops.mul_mat_set_prec(ctx.new_tensor(F32, (4,)), ops.Prec.F32)


def test_mul_mat_id_shape():
    ctx = Context(no_alloc=True)
    as_ = ctx.new_tensor(GGMLType.Q4_0, (64, 10, 8))
    b = ctx.new_tensor(F32, (64, 1, 5))
    ids = ctx.new_tensor(I32, (2, 5))
    out = ops.mul_mat_id(ctx, as_, b, ids)
    assert (out.type, out.ne, out.op, out.src[:3]) == (F32, [10, 2, 5, 1], Op.MUL_MAT_ID, [as_, b, ids])


@pytest.mark.parametrize("ne_as, ne_b, ne_ids, ids_type, err, why", [
    ((8, 4, 3), (8, 2, 5), (2, 5), F32, GGMLTypeError, "ids must be I32"),
    ((8, 4, 3, 2), (8, 2, 5), (2, 5), I32, ShapeError, "as must be 3-D"),
    ((8, 4, 3), (8, 2, 5, 2), (2, 5), I32, ShapeError, "b must be 3-D"),
    ((8, 4, 3), (8, 2, 5), (2, 5, 2), I32, ShapeError, "ids must be 2-D"),
    ((8, 4, 3), (8, 2, 5), (2, 4), I32, ShapeError, "one list per token"),
    ((8, 4, 3), (6, 2, 5), (2, 5), I32, ShapeError, "as.ne\\[0\\]=8 != b.ne\\[0\\]=6"),
    ((8, 4, 3), (8, 2, 5), (3, 5), I32, ShapeError, "multiple of b.ne\\[1\\]=2"),
])
def test_mul_mat_id_rejects(ne_as, ne_b, ne_ids, ids_type, err, why):
    ctx = Context(no_alloc=True)
    args = (ctx.new_tensor(F32, ne_as), ctx.new_tensor(F32, ne_b), ctx.new_tensor(ids_type, ne_ids))
    with pytest.raises(err, match=f"mul_mat_id: .*{why}"):
        ops.mul_mat_id(ctx, *args)


def test_out_prod_shape_and_errors():
    ctx = Context(no_alloc=True)
    a, b = ctx.new_tensor(F32, (6, 4, 2)), ctx.new_tensor(F32, (5, 4, 6, 3))
    out = ops.out_prod(ctx, a, b)
    assert (out.type, out.ne, out.op) == (F32, [6, 5, 6, 3], Op.OUT_PROD)
    with pytest.raises(ShapeError, match="out_prod: a.ne\\[1\\]=4 != b.ne\\[1\\]=3"):
        ops.out_prod(ctx, a, ctx.new_tensor(F32, (5, 3, 2)))
    with pytest.raises(ShapeError, match="out_prod: .*multiples"):
        ops.out_prod(ctx, a, ctx.new_tensor(F32, (5, 4, 3)))


def test_transposed_src0_is_rejected_by_mul_mat_id_and_out_prod():
    ctx = Context(no_alloc=True)
    as_t = ops.transpose(ctx, ctx.new_tensor(F32, (8, 8, 2), name="as"))
    with pytest.raises(ShapeError, match="mul_mat_id: as must not be transposed"):
        ops.mul_mat_id(ctx, as_t, ctx.new_tensor(F32, (8, 1, 3)), ctx.new_tensor(I32, (1, 3)))
    with pytest.raises(ShapeError, match="out_prod: a must not be transposed"):
        ops.out_prod(ctx, ops.transpose(ctx, ctx.new_tensor(F32, (4, 4), name="a")), ctx.new_tensor(F32, (5, 4)))
