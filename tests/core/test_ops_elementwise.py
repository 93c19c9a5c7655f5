"""Element-wise op builders: ggml's result shapes, types, op_params, src slots, inplace views and input checks."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op
from pyggml.core.types import GGMLType as G
from pyggml.errors import ShapeError, GGMLTypeError


@pytest.fixture
def ctx():
    return Context(no_alloc=True)


def f32_word(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


@pytest.mark.parametrize("name, op", [("add", Op.ADD), ("sub", Op.SUB), ("mul", Op.MUL), ("div", Op.DIV)])
def test_binary_result_is_like_a(ctx, name, op):
    a, b = ctx.new_tensor(G.F16, (8, 6, 4), name="a"), ctx.new_tensor(G.F32, (4, 3, 1), name="b")
    out = getattr(ops, name)(ctx, a, b)
    assert (out.op, out.type, out.ne, out.src[:3]) == (op, G.F16, [8, 6, 4, 1], [a, b, None])
    assert out.view_src is None and out.name == ""


@pytest.mark.parametrize("name", ["add_inplace", "sub_inplace", "mul_inplace", "div_inplace", "dup_inplace",
                                  "sqr_inplace", "sqrt_inplace", "log_inplace", "sin_inplace", "cos_inplace"])
def test_inplace_forms_view_a(ctx, name):
    a = ctx.new_tensor(G.F32, (8, 2), name="a")
    out = getattr(ops, name)(ctx, a, ctx.new_tensor(G.F32, (8, 1))) if name[:3] in ("add", "sub", "mul", "div") \
        else getattr(ops, name)(ctx, a)
    assert out.view_src is a and out.view_offs == 0 and out.name == "a (view)" and out.src[0] is a


@given(st.lists(st.integers(1, 4), min_size=4, max_size=4), st.lists(st.integers(1, 3), min_size=4, max_size=4))
def test_binary_accepts_exactly_the_repeatable_shapes(small, reps):
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(G.F32, [s * r for s, r in zip(small, reps, strict=True)])
    assert ops.add(ctx, a, ctx.new_tensor(G.F32, small)).ne == a.ne
    bad = [s + 1 if a.ne[i] % (s + 1) else s for i, s in enumerate(small)]
    if bad != small:
        with pytest.raises(ShapeError, match="add: every dim of b must divide"):
            ops.add(ctx, a, ctx.new_tensor(G.F32, bad))


def test_binary_error_names_the_tensors(ctx):
    with pytest.raises(ShapeError, match=r"mul: .*'a' F32\[6, 2, 1, 1\], 'b' F32\[4, 1, 1, 1\]"):
        ops.mul(ctx, ctx.new_tensor(G.F32, (6, 2), name="a"), ctx.new_tensor(G.F32, (4,), name="b"))


def test_add1(ctx):
    a, s = ctx.new_tensor(G.F32, (5, 3), name="a"), ctx.new_tensor(G.F32, (1,), name="s")
    out = ops.add1(ctx, a, s)
    assert (out.op, out.ne, out.src[:2]) == (Op.ADD1, a.ne, [a, s])
    assert ops.add1_inplace(ctx, a, s).view_src is a
    with pytest.raises(ShapeError, match="add1: b must be a scalar"):
        ops.add1(ctx, a, ctx.new_tensor(G.F32, (2,), name="s2"))
    with pytest.raises(ShapeError, match="add1: a must be padded 1d"):
        ops.add1(ctx, ops.transpose(ctx, a), s)


def test_add_id(ctx):
    a = ctx.new_tensor(G.F32, (8, 3, 4), name="a")
    b = ctx.new_tensor(G.F32, (8, 5), name="b")
    ids = ctx.new_tensor(G.I32, (3, 4), name="ids")
    out = ops.add_id(ctx, a, b, ids)
    assert (out.op, out.ne, out.src[:3]) == (Op.ADD_ID, a.ne, [a, b, ids])
    with pytest.raises(ShapeError, match="add_id: a and b need the same ne"):
        ops.add_id(ctx, a, ctx.new_tensor(G.F32, (4, 5)), ids)
    with pytest.raises(ShapeError, match="add_id: ids must be shaped"):
        ops.add_id(ctx, a, b, ctx.new_tensor(G.I32, (4, 3)))
    with pytest.raises(GGMLTypeError, match="add_id: ids must be I32"):
        ops.add_id(ctx, a, b, ctx.new_tensor(G.I64, (3, 4)))


def test_scale_params(ctx):
    a = ctx.new_tensor(G.F32, (4, 2), name="a")
    assert ops.scale(ctx, a, 0.5).op_params[:2] == [f32_word(0.5), 0]
    out = ops.scale_bias(ctx, a, 2.0, -1.0)
    assert (out.op, out.op_params[:2]) == (Op.SCALE, [f32_word(2.0), f32_word(-1.0)])
    assert ops.scale_inplace(ctx, a, 3.0).view_src is a and ops.scale_bias_inplace(ctx, a, 1.0, 1.0).view_src is a
    with pytest.raises(ShapeError, match="scale: a must be padded 1d"):
        ops.scale(ctx, ops.transpose(ctx, a), 2.0)


def test_clamp_is_always_a_view(ctx):
    a = ctx.new_tensor(G.F32, (4,), name="a")
    out = ops.clamp(ctx, a, -1.0, 2.5)
    assert out.view_src is a and out.op == Op.CLAMP and out.op_params[:2] == [f32_word(-1.0), f32_word(2.5)]


@pytest.mark.parametrize("name, op", [("sqr", Op.SQR), ("sqrt", Op.SQRT), ("log", Op.LOG), ("sin", Op.SIN),
                                      ("cos", Op.COS), ("dup", Op.DUP)])
def test_math_ops(ctx, name, op):
    a = ctx.new_tensor(G.BF16, (3, 2))
    out = getattr(ops, name)(ctx, a)
    assert (out.op, out.type, out.ne, out.src[0]) == (op, G.BF16, a.ne, a)


def test_fill(ctx):
    a = ctx.new_tensor(G.F16, (4, 2), name="a")
    out = ops.fill(ctx, a, 1.5)
    assert (out.op, out.op_params[0], out.view_src) == (Op.FILL, f32_word(1.5), None)
    assert ops.fill_inplace(ctx, a, 0.0).view_src is a
    with pytest.raises(GGMLTypeError, match="fill: a must be F32 or F16"):
        ops.fill(ctx, ctx.new_tensor(G.BF16, (4,)), 1.0)
    with pytest.raises(ShapeError, match="fill: a must be contiguous"):
        ops.fill(ctx, ops.transpose(ctx, a), 1.0)


def test_leaky_relu(ctx):
    a = ctx.new_tensor(G.F32, (4,), name="a")
    out = ops.leaky_relu(ctx, a, 0.01)
    assert (out.op, out.op_params[0], out.view_src) == (Op.LEAKY_RELU, f32_word(0.01), None)
    assert ops.leaky_relu(ctx, a, 0.01, True).view_src is a


def test_add_cast(ctx):
    a, b = ctx.new_tensor(G.Q4_0, (64, 3), name="a"), ctx.new_tensor(G.F32, (64, 1), name="b")
    out = ops.add_cast(ctx, a, b, G.F32)
    assert (out.op, out.type, out.ne, out.src[:2], out.view_src) == (Op.ADD, G.F32, a.ne, [a, b], None)
    with pytest.raises(ShapeError, match="add_cast: b must have a's row length"):
        ops.add_cast(ctx, a, ctx.new_tensor(G.F32, (32, 1)), G.F32)
    with pytest.raises(GGMLTypeError, match="add_cast: a must be quantized, F16 or BF16"):
        ops.add_cast(ctx, ctx.new_tensor(G.F32, (64, 3), name="f"), b, G.F16)
