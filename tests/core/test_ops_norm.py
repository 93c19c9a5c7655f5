"""Norm op builders: shape like a, eps (and n_groups) in ggml's op_params layout, inplace views."""

import struct

import pytest

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op
from pyggml.core.types import GGMLType as G


def f32_word(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


@pytest.mark.parametrize("name, op", [("norm", Op.NORM), ("rms_norm", Op.RMS_NORM), ("l2_norm", Op.L2_NORM)])
def test_row_norms(name, op):
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(G.F32, (16, 3), name="a")
    out = getattr(ops, name)(ctx, a, 1e-5)
    assert (out.op, out.ne, out.type, out.op_params[:2], out.src[0]) == (op, a.ne, G.F32, [f32_word(1e-5), 0], a)
    assert getattr(ops, f"{name}_inplace")(ctx, a, 1e-5).view_src is a


def test_group_norm_params():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(G.F32, (4, 4, 6), name="a")
    out = ops.group_norm(ctx, a, 3, 1e-6)
    assert (out.op, out.op_params[:2]) == (Op.GROUP_NORM, [3, f32_word(1e-6)])
    assert ops.group_norm_inplace(ctx, a, 3, 1e-6).view_src is a
