"""Shape inference, op_params layout and input checks of the attention ops (ggml 0.15.3's rules)."""

import struct

import pytest

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op
from pyggml.core.types import GGMLType
from pyggml.errors import ShapeError, GGMLTypeError

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32


def f32_word(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


@pytest.fixture
def ctx():
    return Context(no_alloc=True)


@pytest.mark.parametrize("fn, op", [(ops.diag_mask_inf, Op.DIAG_MASK_INF), (ops.diag_mask_zero, Op.DIAG_MASK_ZERO)])
def test_diag_mask(ctx, fn, op):
    a = ctx.new_tensor(F32, (8, 4, 2), name="kq")
    out = fn(ctx, a, 3)
    assert (out.op, out.ne, out.op_params[0], out.src[0], out.view_src) == (op, a.ne, 3, a, None)
    inplace = getattr(ops, fn.__name__ + "_inplace")(ctx, a, 3)
    assert inplace.view_src is a and inplace.name == "kq (view)" and inplace.op == op


def test_soft_max_ext_params_and_srcs(ctx):
    a = ctx.new_tensor(F32, (16, 4, 6, 2), name="kq")
    mask = ctx.new_tensor(F16, (16, 8, 3, 1), name="mask")
    out = ops.soft_max_ext(ctx, a, mask, 0.125, 8.0)
    assert (out.op, out.ne, out.type, out.src[:3]) == (Op.SOFT_MAX, a.ne, F32, [a, mask, None])
    assert out.op_params[:3] == [f32_word(0.125), f32_word(8.0), 0]
    assert ops.soft_max(ctx, a).op_params[:2] == [f32_word(1.0), 0]
    assert ops.soft_max_ext_inplace(ctx, a, None, 1.0, 0.0).view_src is a


@pytest.mark.parametrize("a_ne, mask, why", [
    ((16, 4), (F32, (15, 4)), "mask.ne\\[0\\]=15 != a.ne\\[0\\]=16"),
    ((16, 4), (F32, (16, 3)), "mask.ne\\[1\\]=3 < a.ne\\[1\\]=4"),
    ((16, 4, 6), (F32, (16, 4, 4)), "multiples of mask"),
    ((16, 4, 6, 3), (F32, (16, 4, 1, 2)), "multiples of mask"),
])
def test_soft_max_rejects_bad_masks(ctx, a_ne, mask, why):
    a = ctx.new_tensor(F32, a_ne, name="kq")
    with pytest.raises(ShapeError, match=f"soft_max: .*{why}"):
        ops.soft_max_ext(ctx, a, ctx.new_tensor(*mask, name="mask"), 1.0, 0.0)


def test_soft_max_rejects_types_layouts_and_alibi_without_mask(ctx):
    a = ctx.new_tensor(F32, (16, 4), name="kq")
    with pytest.raises(GGMLTypeError, match="soft_max: mask must be F16 or F32"):
        ops.soft_max_ext(ctx, a, ctx.new_tensor(I32, (16, 4)), 1.0, 0.0)
    with pytest.raises(ShapeError, match="soft_max: a must be contiguous"):
        ops.soft_max(ctx, ops.transpose(ctx, a))
    with pytest.raises(ShapeError, match="soft_max: mask must be contiguous"):
        ops.soft_max_ext(ctx, ctx.new_tensor(F32, (4, 16)), ops.transpose(ctx, a), 1.0, 0.0)
    with pytest.raises(ShapeError, match="ALiBi"):
        ops.soft_max_ext(ctx, a, None, 1.0, 8.0)


def test_soft_max_add_sinks(ctx):
    a = ctx.new_tensor(F32, (16, 4, 6))
    out = ops.soft_max(ctx, a)
    sinks = ctx.new_tensor(F32, (6,))
    ops.soft_max_add_sinks(out, sinks)
    assert out.src[2] is sinks
    with pytest.raises(ShapeError, match="already set"):
        ops.soft_max_add_sinks(out, sinks)
    ops.soft_max_add_sinks(out, None)
    assert out.src[2] is None
    with pytest.raises(ShapeError, match="n_head=6"):
        ops.soft_max_add_sinks(out, ctx.new_tensor(F32, (5,)))
    with pytest.raises(GGMLTypeError, match="sinks must be F32"):
        ops.soft_max_add_sinks(out, ctx.new_tensor(F16, (6,)))
    with pytest.raises(ShapeError, match="SOFT_MAX"):
        ops.soft_max_add_sinks(a, sinks)


def test_rope_ext_op_params_layout(ctx):
    a = ctx.new_tensor(F32, (64, 8, 5), name="q")
    pos = ctx.new_tensor(I32, (5,))
    ff = ctx.new_tensor(F32, (32,))
    out = ops.rope_ext(ctx, a, pos, ff, 64, ops.RopeType.NEOX, 4096, 10000.0, 0.5, 1.0, 0.9, 32.0, 1.0)
    assert (out.op, out.ne, out.src[:3]) == (Op.ROPE, a.ne, [a, pos, ff])
    floats = [f32_word(x) for x in (10000.0, 0.5, 1.0, 0.9, 32.0, 1.0)]
    assert out.op_params == [0, 64, 2, 0, 4096, *floats, 0, 0, 0, 0, 0]
    plain = ops.rope(ctx, a, pos, 64, 0)
    assert plain.op_params[:11] == [0, 64, 0, 0, 0, f32_word(10000.0), f32_word(1.0), 0, f32_word(1.0), 0, 0]
    assert ops.rope_inplace(ctx, a, pos, 64, 0).view_src is a


def test_rope_rejects(ctx):
    a = ctx.new_tensor(F32, (64, 8, 5), name="q")
    pos = ctx.new_tensor(I32, (5,), name="pos")
    with pytest.raises(ShapeError, match="mode & 1"):
        ops.rope(ctx, a, pos, 64, 1)
    with pytest.raises(GGMLTypeError, match="positions must be I32"):
        ops.rope(ctx, a, ctx.new_tensor(F32, (5,)), 64, 0)
    with pytest.raises(ShapeError, match="positions must be a vector"):
        ops.rope(ctx, a, ctx.new_tensor(I32, (5, 2)), 64, 0)
    with pytest.raises(ShapeError, match="need 1 position"):
        ops.rope(ctx, a, ctx.new_tensor(I32, (4,)), 64, 0)
    with pytest.raises(ShapeError, match="need 4 position"):
        ops.rope_ext(ctx, a, pos, None, 64, ops.RopeType.MROPE, 0, 1e4, 1, 0, 1, 0, 0)
    with pytest.raises(GGMLTypeError, match="freq_factors must be F32"):
        ops.rope_ext(ctx, a, pos, ctx.new_tensor(F16, (32,)), 64, 0, 0, 1e4, 1, 0, 1, 0, 0)
    with pytest.raises(ShapeError, match="n_dims/2=32"):
        ops.rope_ext(ctx, a, pos, ctx.new_tensor(F32, (16,)), 64, 0, 0, 1e4, 1, 0, 1, 0, 0)


def test_rope_yarn_corr_dims_values():
    # ggml: floor/ceil of n_dims*log(n_ctx_orig/(beta*2pi))/(2 log base), clamped to [0, n_dims-1]
    assert ops.rope_yarn_corr_dims(128, 4096, 10000.0, 32.0, 1.0) == (20.0, 46.0)
    assert ops.rope_yarn_corr_dims(64, 0, 10000.0, 32.0, 1.0)[0] == 0.0


def test_flash_attn_ext_shape_params_prec_sinks(ctx):
    q = ctx.new_tensor(F32, (64, 7, 8, 1), name="q")
    k = ctx.new_tensor(F16, (64, 32, 2, 1), name="k")
    v = ctx.new_tensor(F16, (48, 32, 2, 1), name="v")
    mask = ctx.new_tensor(F16, (32, 8), name="mask")
    out = ops.flash_attn_ext(ctx, q, k, v, mask, 0.125, 0.0, 30.0)
    assert (out.op, out.type, out.ne, out.src[:5]) == (Op.FLASH_ATTN_EXT, F32, [48, 8, 7, 1], [q, k, v, mask, None])
    assert out.op_params[:4] == [f32_word(0.125), 0, f32_word(30.0), 0]
    ops.flash_attn_ext_set_prec(out, ops.Prec.F32)
    assert out.op_params[3] == 10 and ops.flash_attn_ext_get_prec(out) == ops.Prec.F32
    sinks = ctx.new_tensor(F32, (8,))
    ops.flash_attn_ext_add_sinks(out, sinks)
    assert out.src[4] is sinks
    with pytest.raises(ShapeError, match="already set"):
        ops.flash_attn_ext_add_sinks(out, sinks)
    with pytest.raises(ShapeError, match="FLASH_ATTN_EXT"):
        ops.flash_attn_ext_set_prec(q, ops.Prec.F32)


@pytest.mark.parametrize("k_ne, v_ne, mask, bias, err, why", [
    ((32, 16, 2), (32, 16, 2), None, 0.0, ShapeError, "k.ne\\[0\\]=32 != q.ne\\[0\\]=64"),
    ((64, 16, 3), (64, 16, 3), None, 0.0, ShapeError, "multiples of k"),
    ((64, 16, 2, 2), (64, 16, 2, 2), None, 0.0, ShapeError, "multiples of k"),
    ((64, 16, 2), (64, 16, 2), (F32, (16, 4)), 0.0, GGMLTypeError, "mask must be F16"),
    ((64, 16, 2), (64, 16, 2), (F16, (16, 4, 3)), 0.0, ShapeError, "multiples of mask"),
    ((64, 16, 2), (64, 16, 2), None, 8.0, ShapeError, "ALiBi"),
])
def test_flash_attn_ext_rejects(ctx, k_ne, v_ne, mask, bias, err, why):
    q = ctx.new_tensor(F32, (64, 4, 4), name="q")
    k, v = ctx.new_tensor(F16, k_ne, name="k"), ctx.new_tensor(F16, v_ne, name="v")
    m = ctx.new_tensor(*mask, name="mask") if mask else None
    with pytest.raises(err, match=f"flash_attn_ext: .*{why}"):
        ops.flash_attn_ext(ctx, q, k, v, m, 1.0, bias, 0.0)


def test_rope_multi_params(ctx):
    a = ctx.new_tensor(F32, (32, 4, 5), name="q")
    pos = ctx.new_tensor(I32, (20,))
    out = ops.rope_multi(ctx, a, pos, None, 32, (4, 6, 6, 0), ops.RopeType.MROPE, 2048, 1e6, 1.0, 0.0, 1.0, 32.0, 1.0)
    assert (out.op, out.op_params[1:5], out.op_params[11:15]) == (Op.ROPE, [32, 8, 0, 2048], [4, 6, 6, 0])
    assert ops.rope_multi_inplace(ctx, a, pos, None, 32, (4, 6, 6, 0), 8, 0, 1e4, 1, 0, 1, 0, 0).view_src is a
    with pytest.raises(ShapeError, match="rope_multi: sections must be 4 ints"):
        ops.rope_multi(ctx, a, pos, None, 32, (4, 6), 8, 0, 1e4, 1, 0, 1, 0, 0)
    with pytest.raises(ShapeError, match="need 4 position"):
        ops.rope_multi(ctx, a, ctx.new_tensor(I32, (5,)), None, 32, (4, 6, 6, 0), 8, 0, 1e4, 1, 0, 1, 0, 0)


def test_flash_attn_ext_more_rejections(ctx):
    q = ctx.new_tensor(F32, (64, 4, 4, 2), name="q")
    k1 = ctx.new_tensor(F16, (64, 16, 2, 1), name="k")
    with pytest.raises(ShapeError, match="flash_attn_ext: q, k and v must have the same ne\\[3\\]"):
        ops.flash_attn_ext(ctx, q, k1, ctx.new_tensor(F16, (64, 16, 2, 1)), None, 1.0, 0.0, 0.0)
    q1 = ctx.new_tensor(F32, (64, 4, 4), name="q1")
    k, v = ctx.new_tensor(F16, (64, 16, 2), name="k2"), ctx.new_tensor(F16, (64, 16, 2), name="v2")
    with pytest.raises(ShapeError, match="mask must be contiguous"):
        ops.flash_attn_ext(ctx, q1, k, v, ops.transpose(ctx, ctx.new_tensor(F16, (4, 16))), 1.0, 0.0, 0.0)
    out = ops.flash_attn_ext(ctx, q1, k, v, None, 1.0, 0.0, 0.0)
    with pytest.raises(ShapeError, match="n_head=4"):
        ops.flash_attn_ext_add_sinks(out, ctx.new_tensor(F32, (2,)))
    with pytest.raises(GGMLTypeError, match="sinks must be F32"):
        ops.flash_attn_ext_add_sinks(out, ctx.new_tensor(F16, (4,)))
    ops.flash_attn_ext_add_sinks(out, None)
    assert out.src[4] is None


def test_backward_builders(ctx):
    dy, y = ctx.new_tensor(F32, (8, 3), name="dy"), ctx.new_tensor(F32, (8, 3), name="y")
    back = ops.soft_max_ext_back(ctx, dy, y, 0.5, 0.0)
    assert (back.op, back.src[:2], back.op_params[:2]) == (Op.SOFT_MAX_BACK, [dy, y], [f32_word(0.5), 0])
    assert ops.soft_max_ext_back_inplace(ctx, dy, y, 1.0, 0.0).view_src is dy
    a, pos = ctx.new_tensor(F32, (16, 2, 3)), ctx.new_tensor(I32, (3,))
    rb = ops.rope_ext_back(ctx, a, pos, None, 16, 2, 0, 1e4, 1, 0, 1, 0, 0)
    assert rb.op == Op.ROPE_BACK and rb.op_params == ops.rope_ext(ctx, a, pos, None, 16, 2, 0, 1e4, 1, 0, 1, 0,
                                                                  0).op_params
    mb = ops.rope_multi_back(ctx, a, ctx.new_tensor(I32, (12,)), None, 16, (2, 3, 3, 0), 8, 0, 1e4, 1, 0, 1, 0, 0)
    assert mb.op == Op.ROPE_BACK and mb.op_params[11:15] == [2, 3, 3, 0]
