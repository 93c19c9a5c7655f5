"""Shape inference, op_params layout and input checks of the conv-family op builders (ggml 0.15.3's rules)."""

import struct

import pytest
from hypothesis import given, strategies as st

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op
from pyggml.core.types import GGMLType
from pyggml.errors import ShapeError, GGMLTypeError

F32, F16 = GGMLType.F32, GGMLType.F16


def f32_word(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


@pytest.fixture
def ctx():
    return Context(no_alloc=True)


@given(w=st.integers(3, 12), h=st.integers(3, 12), k=st.integers(1, 3), s=st.integers(1, 3), p=st.integers(0, 2),
       d=st.integers(1, 2))
def test_im2col_2d_shape(w, h, k, s, p, d):
    ctx = Context(no_alloc=True)
    kernel = ctx.new_tensor(F16, (k, k, 3, 5))
    x = ctx.new_tensor(F32, (w, h, 3, 2))
    ow, oh = (int((n + 2 * p - d * (k - 1) - 1) / s) + 1 for n in (w, h))  # C division truncates toward 0
    if ow <= 0 or oh <= 0:
        with pytest.raises(ShapeError, match="too small"):
            ops.im2col(ctx, kernel, x, s, s, p, p, d, d, True, F32)
        return
    out = ops.im2col(ctx, kernel, x, s, s, p, p, d, d, True, F16)
    assert (out.op, out.type, out.ne, out.src[:2]) == (Op.IM2COL, F16, [3 * k * k, ow, oh, 2], [kernel, x])
    assert out.op_params[:8] == [s, s, p, p, d, d, 1, 0]


def test_im2col_1d_shape_and_errors(ctx):
    kernel = ctx.new_tensor(F16, (3, 2, 4), name="k")
    out = ops.im2col(ctx, kernel, ctx.new_tensor(F32, (10, 2, 5), name="x"), 2, 0, 1, 0, 1, 0, False, F32)
    assert out.ne == [6, 5, 5, 1] and out.op_params[6] == 0
    with pytest.raises(ShapeError, match="im2col: kernel channels a.ne\\[1\\]=2 != signal channels b.ne\\[1\\]=3"):
        ops.im2col(ctx, kernel, ctx.new_tensor(F32, (10, 3, 5)), 1, 0, 0, 0, 1, 0, False, F32)
    with pytest.raises(ShapeError, match="ne\\[3\\] == 1"):
        ops.im2col(ctx, kernel, ctx.new_tensor(F32, (10, 2, 5, 2)), 1, 0, 0, 0, 1, 0, False, F32)
    with pytest.raises(ShapeError, match="image channels"):
        ops.im2col(ctx, ctx.new_tensor(F16, (3, 3, 2, 4)), ctx.new_tensor(F32, (8, 8, 3)), 1, 1, 0, 0, 1, 1, True, F32)


def test_composite_convolutions_shapes(ctx):
    x = ctx.new_tensor(F32, (9, 8, 3, 2))
    c2 = ops.conv_2d(ctx, ctx.new_tensor(F32, (3, 3, 3, 5)), x, 2, 1, 1, 0, 1, 1)
    assert (c2.op, c2.ne) == (Op.CONT, [5, 6, 5, 2])
    c1 = ops.conv_1d(ctx, ctx.new_tensor(F32, (3, 2, 4)), ctx.new_tensor(F32, (10, 2, 1)), 1, 1, 1)
    assert (c1.op, c1.ne) == (Op.RESHAPE, [10, 4, 1, 1])
    assert ops.conv_1d_ph(ctx, ctx.new_tensor(F32, (3, 2, 4)), ctx.new_tensor(F32, (10, 2, 1)), 1, 1).ne == c1.ne
    dw = ops.conv_2d_dw(ctx, ctx.new_tensor(F32, (3, 3, 1, 3)), x, 1, 1, 1, 1, 1, 1)
    assert (dw.op, dw.ne) == (Op.RESHAPE, [9, 8, 3, 2])


def test_conv_2d_dw_direct(ctx):
    k = ctx.new_tensor(F32, (3, 3, 1, 4), name="k")
    out = ops.conv_2d_dw_direct(ctx, k, ctx.new_tensor(F32, (10, 9, 4, 2)), 2, 1, 1, 0, 1, 2)
    assert (out.op, out.ne, out.op_params[:6]) == (Op.CONV_2D_DW, [5, 5, 4, 2], [2, 1, 1, 0, 1, 2])
    with pytest.raises(ShapeError, match="kernel a.ne\\[2\\]=2 must be 1"):
        ops.conv_2d_dw_direct(ctx, ctx.new_tensor(F32, (3, 3, 2, 4)), ctx.new_tensor(F32, (10, 9, 4)), 1, 1, 0, 0, 1, 1)
    with pytest.raises(ShapeError, match="channels b.ne\\[2\\]=3"):
        ops.conv_2d_dw_direct(ctx, k, ctx.new_tensor(F32, (10, 9, 3)), 1, 1, 0, 0, 1, 1)


def test_conv_transpose_1d(ctx):
    k = ctx.new_tensor(F32, (3, 4, 2), name="k")
    out = ops.conv_transpose_1d(ctx, k, ctx.new_tensor(F32, (6, 2)), 2, 0, 1)
    assert (out.op, out.type, out.ne, out.op_params[:3]) == (Op.CONV_TRANSPOSE_1D, F32, [13, 4, 1, 1], [2, 0, 1])
    for b_ne, p0, d0, why in [((6, 2, 2), 0, 1, "matrix"), ((6, 3), 0, 1, "channels b.ne\\[1\\]=3"),
                              ((6, 2), 1, 1, "only p0 == 0"), ((6, 2), 0, 2, "only d0 == 1")]:
        with pytest.raises(ShapeError, match=f"conv_transpose_1d: .*{why}"):
            ops.conv_transpose_1d(ctx, k, ctx.new_tensor(F32, b_ne), 1, p0, d0)
    with pytest.raises(ShapeError, match="a.ne\\[3\\] must be 1"):
        ops.conv_transpose_1d(ctx, ctx.new_tensor(F32, (3, 4, 2, 2)), ctx.new_tensor(F32, (6, 2)), 1, 0, 1)


def test_conv_transpose_2d_p0(ctx):
    k = ctx.new_tensor(F16, (3, 2, 5, 4), name="k")
    out = ops.conv_transpose_2d_p0(ctx, k, ctx.new_tensor(F32, (6, 7, 4, 2)), 2)
    assert (out.op, out.type, out.ne, out.op_params[0]) == (Op.CONV_TRANSPOSE_2D, F32, [13, 14, 5, 2], 2)
    with pytest.raises(ShapeError, match="conv_transpose_2d_p0: kernel a.ne\\[3\\]=4 != channels b.ne\\[2\\]=3"):
        ops.conv_transpose_2d_p0(ctx, k, ctx.new_tensor(F32, (6, 7, 3)), 1)


def test_pools(ctx):
    x = ctx.new_tensor(F16, (10, 7, 3, 2), name="x")
    p1 = ops.pool_1d(ctx, x, ops.PoolOp.AVG, 3, 2, 1)
    assert (p1.op, p1.type, p1.ne, p1.op_params[:4]) == (Op.POOL_1D, F32, [5, 7, 3, 2], [1, 3, 2, 1])
    p2 = ops.pool_2d(ctx, x, ops.PoolOp.MAX, 3, 2, 2, 2, 1.0, 0.0)
    assert (p2.op, p2.ne, p2.op_params[:7]) == (Op.POOL_2D, [5, 3, 3, 2], [0, 3, 2, 2, 2, 1, 0])
    with pytest.raises(ShapeError, match="pool_1d: .*leave no output"):
        ops.pool_1d(ctx, x, ops.PoolOp.MAX, 20, 1, 0)
    with pytest.raises(ShapeError, match="pool_2d: .*leave no output"):
        ops.pool_2d(ctx, x, ops.PoolOp.MAX, 2, 9, 1, 1, 0, 0)


def test_upscale_and_interpolate(ctx):
    x = ctx.new_tensor(F32, (4, 3, 2), name="x")
    up = ops.upscale(ctx, x, 3, ops.ScaleMode.BILINEAR)
    assert (up.op, up.ne, up.op_params[0]) == (Op.UPSCALE, [12, 9, 2, 1], 1)
    mode = ops.ScaleMode.BILINEAR | ops.ScaleFlag.ALIGN_CORNERS
    assert ops.interpolate(ctx, x, 5, 2, 4, 1, mode).op_params[0] == 257
    assert ops.upscale_ext(ctx, x, 5, 2, 4, 1, 0).ne == [5, 2, 4, 1]
    with pytest.raises(ShapeError, match="scale_factor=1 must be > 1"):
        ops.upscale(ctx, x, 1, 0)
    with pytest.raises(ShapeError, match="unknown scale mode 3"):
        ops.interpolate(ctx, x, 5, 2, 4, 1, 3)
    with pytest.raises(ShapeError, match="antialias"):
        ops.interpolate(ctx, x, 5, 2, 4, 1, ops.ScaleMode.NEAREST | ops.ScaleFlag.ANTIALIAS)
    with pytest.raises(GGMLTypeError, match="interpolate: a must be F32"):
        ops.interpolate(ctx, ctx.new_tensor(F16, (4, 3)), 5, 2, 1, 1, 0)


def test_pad_reflect_1d(ctx):
    x = ctx.new_tensor(F32, (8, 3), name="x")
    out = ops.pad_reflect_1d(ctx, x, 3, 2)
    assert (out.op, out.ne, out.op_params[:2]) == (Op.PAD_REFLECT_1D, [13, 3, 1, 1], [3, 2])
    for p0, p1, why in [(-1, 0, ">= 0"), (8, 0, "< a.ne\\[0\\]=8"), (0, 9, "< a.ne\\[0\\]=8")]:
        with pytest.raises(ShapeError, match=f"pad_reflect_1d: .*{why}"):
            ops.pad_reflect_1d(ctx, x, p0, p1)
    with pytest.raises(ShapeError, match="contiguous"):
        ops.pad_reflect_1d(ctx, ops.transpose(ctx, x), 1, 1)
    with pytest.raises(GGMLTypeError, match="must be F32"):
        ops.pad_reflect_1d(ctx, ctx.new_tensor(F16, (8, 3)), 1, 1)


def test_roll(ctx):
    x = ctx.new_tensor(F32, (6, 5, 4, 3), name="x")
    out = ops.roll(ctx, x, 2, -3, 0, 1)
    assert (out.op, out.ne, out.op_params[:4]) == (Op.ROLL, x.ne, [2, -3, 0, 1])
    with pytest.raises(ShapeError, match="roll: \\|shifts\\|"):
        ops.roll(ctx, x, 6, 0, 0, 0)
    with pytest.raises(ShapeError, match="rows must be contiguous"):
        ops.roll(ctx, ops.transpose(ctx, x), 0, 0, 0, 0)


def test_arange_and_timestep_embedding(ctx):
    a = ops.arange(ctx, 0.0, 10.0, 3.0)
    assert (a.op, a.ne, a.srcs) == (Op.ARANGE, [4, 1, 1, 1], [])
    assert a.op_params[:3] == [f32_word(0.0), f32_word(10.0), f32_word(3.0)]
    with pytest.raises(ShapeError, match="arange: stop=1.0 must be > start=2.0"):
        ops.arange(ctx, 2.0, 1.0, 1.0)
    t = ctx.new_tensor(F32, (7,))
    emb = ops.timestep_embedding(ctx, t, 9, 10000)
    assert (emb.op, emb.ne, emb.op_params[:2]) == (Op.TIMESTEP_EMBEDDING, [9, 7, 1, 1], [9, 10000])


def test_conv_2d_direct(ctx):
    k = ctx.new_tensor(F16, (3, 3, 2, 5), name="k")
    out = ops.conv_2d_direct(ctx, k, ctx.new_tensor(F32, (9, 8, 2, 3)), 2, 1, 1, 0, 1, 2)
    assert (out.op, out.type, out.ne, out.op_params[:6]) == (Op.CONV_2D, F32, [5, 4, 5, 3], [2, 1, 1, 0, 1, 2])
    with pytest.raises(ShapeError, match="conv_2d_direct: kernel channels a.ne\\[2\\]=2 != image channels"):
        ops.conv_2d_direct(ctx, k, ctx.new_tensor(F32, (9, 8, 3)), 1, 1, 0, 0, 1, 1)
    with pytest.raises(ShapeError, match="too small"):
        ops.conv_2d_direct(ctx, k, ctx.new_tensor(F32, (2, 8, 2)), 1, 1, 0, 0, 1, 1)


def test_conv_shorthands(ctx):
    x = ctx.new_tensor(F32, (8, 6, 3, 1))
    assert ops.conv_2d_sk_p0(ctx, ctx.new_tensor(F32, (2, 2, 3, 4)), x).ne == [4, 3, 4, 1]
    assert ops.conv_2d_s1_ph(ctx, ctx.new_tensor(F32, (3, 3, 3, 4)), x).ne == [8, 6, 4, 1]
    dw = ops.conv_1d_dw(ctx, ctx.new_tensor(F16, (3, 1, 4)), ctx.new_tensor(F32, (10, 4)), 1, 1, 1)
    assert (dw.op, dw.ne) == (Op.RESHAPE, [10, 4, 1, 1])
    assert ops.conv_1d_dw_ph(ctx, ctx.new_tensor(F16, (3, 1, 4)), ctx.new_tensor(F32, (10, 4)), 1, 1).ne == dw.ne


def test_conv_2d_dw_direct_too_small(ctx):
    with pytest.raises(ShapeError, match="conv_2d_dw_direct: b too small"):
        ops.conv_2d_dw_direct(ctx, ctx.new_tensor(F32, (5, 5, 1, 2)), ctx.new_tensor(F32, (3, 3, 2)), 1, 1, 0, 0, 1, 1)
