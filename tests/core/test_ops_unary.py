"""Unary and GLU op builders: UnaryOp/GluOp in op_params, ggml's shapes and contiguity checks."""

import struct

import numpy as np
import pytest

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import GluOp, Op, UnaryOp
from pyggml.core.types import GGMLType as G
from pyggml.errors import ShapeError, GGMLTypeError


@pytest.fixture
def ctx():
    return Context(no_alloc=True)


@pytest.mark.parametrize("op", [op for op in UnaryOp if op != UnaryOp.XIELU])
def test_every_unary_op_has_a_builder(ctx, op):
    a = ctx.new_tensor(G.F16, (6, 2), name="a")
    out = getattr(ops, op.name.lower())(ctx, a)
    assert (out.op, out.op_params[0], out.type, out.ne, out.src[0]) == (Op.UNARY, op, G.F16, a.ne, a)
    assert out.unary_op == op and out.view_src is None
    inplace = getattr(ops, f"{op.name.lower()}_inplace")(ctx, a)
    assert inplace.view_src is a and inplace.unary_op == op


def test_unary_needs_contiguous_rows(ctx):
    a = ctx.new_tensor(G.F32, (6, 2), name="a")
    with pytest.raises(ShapeError, match=r"unary: a's rows must be contiguous \('a \(transposed\)'"):
        ops.relu(ctx, ops.transpose(ctx, a))
    assert ops.relu(ctx, ops.view_2d(ctx, a, 3, 2, a.nb[1], 0)).ne == [3, 2, 1, 1]  # strided rows are fine


@pytest.mark.parametrize("op", [op for op in GluOp if op != GluOp.SWIGLU_OAI])
def test_glu_forms(ctx, op):
    name = op.name.lower()
    a, b = ctx.new_tensor(G.F32, (8, 3), name="a"), ctx.new_tensor(G.F32, (8, 3), name="b")
    fused = getattr(ops, name)(ctx, a)
    assert (fused.op, fused.op_params[:2], fused.ne, fused.src[:2]) == (Op.GLU, [op, 0], [4, 3, 1, 1], [a, None])
    swapped = getattr(ops, f"{name}_swapped")(ctx, a)
    assert swapped.op_params[:2] == [op, 1] and swapped.ne == [4, 3, 1, 1]
    split = getattr(ops, f"{name}_split")(ctx, a, b)
    assert split.op_params[:2] == [op, 0] and split.ne == a.ne and split.src[:2] == [a, b]


def test_swiglu_oai_params(ctx):
    a = ctx.new_tensor(G.F32, (8, 3))
    out = ops.swiglu_oai(ctx, a, None, 1.702, 7.0)
    words = [struct.unpack("<i", struct.pack("<f", v))[0] for v in (1.702, 7.0)]
    assert out.op_params[:4] == [GluOp.SWIGLU_OAI, 0, *words] and out.ne == [4, 3, 1, 1]


def test_glu_checks(ctx):
    a = ctx.new_tensor(G.F32, (8, 3, 2), name="a")
    with pytest.raises(ShapeError, match="swiglu: a must be contiguous"):
        ops.swiglu(ctx, ops.permute(ctx, a, 0, 2, 1, 3))
    with pytest.raises(ShapeError, match="geglu: b must be contiguous"):
        ops.geglu_split(ctx, a, ops.permute(ctx, ctx.new_tensor(G.F32, (8, 2, 3)), 0, 2, 1, 3))
    with pytest.raises(ShapeError, match="reglu: a and b must have the same shape"):
        ops.reglu_split(ctx, a, ctx.new_tensor(G.F32, (8, 3)))
    with pytest.raises(GGMLTypeError, match="swiglu: a and b must have the same type"):
        ops.swiglu_split(ctx, a, ctx.new_tensor(G.F16, (8, 3, 2)))


def test_xielu_stores_ggml_coefficients(ctx):
    out = ops.xielu(ctx, ctx.new_tensor(G.F32, (4,)), 0.8, 0.6, 0.5, -1e-6)
    softplus = [float(np.log1p(np.exp(np.float32(v)))) for v in (0.8, 0.6)]
    assert (out.op, out.unary_op) == (Op.UNARY, UnaryOp.XIELU)
    expected = [0.5 + softplus[0], softplus[1], 0.5, -1e-6]
    np.testing.assert_allclose([out.op_params_f32(i) for i in range(1, 5)], expected, rtol=1e-6)
