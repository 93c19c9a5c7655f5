"""Layout op builders: copies, views (ggml's names, strides, offsets in op_params), repeats, concat, pad,
get_rows / set_rows (src order, result types) and every input check."""

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op, host_ndarray
from pyggml.core.types import GGMLType as G
from pyggml.errors import ShapeError, GGMLTypeError


@pytest.fixture
def ctx():
    return Context(no_alloc=True)


@pytest.fixture
def a(ctx):
    return ctx.new_tensor(G.F32, (6, 4, 3, 2), name="a")


def test_cpy_is_a_view_of_b(ctx, a):
    b = ctx.new_tensor(G.F16, (24, 6), name="b")
    out = ops.cpy(ctx, a, b)
    assert (out.op, out.type, out.ne, out.view_src, out.src[:2]) == (Op.CPY, G.F16, b.ne, b, [a, b])
    assert out.name == "b (copy of a)"
    assert ops.cpy(ctx, a, ctx.new_tensor(G.F32, (144,))).name == "a (copy)"
    with pytest.raises(ShapeError, match="cpy: a and b must have the same number of elements"):
        ops.cpy(ctx, a, ctx.new_tensor(G.F32, (143,)))


def test_cast_refers_to_itself(ctx, a):
    out = ops.cast(ctx, a, G.BF16)
    assert (out.op, out.type, out.ne, out.src[0], out.src[1], out.name) == (Op.CPY, G.BF16, a.ne, a, out, "a (copy)")


def test_cont(ctx, a):
    out = ops.cont(ctx, ops.transpose(ctx, a))
    assert (out.op, out.ne, out.name, out.is_contiguous) == (Op.CONT, [4, 6, 3, 2], "a (transposed) (cont)", True)
    assert ops.cont_1d(ctx, a, 144).ne == [144, 1, 1, 1]
    assert ops.cont_2d(ctx, a, 12, 12).ne == [12, 12, 1, 1]
    assert ops.cont_3d(ctx, a, 2, 3, 24).ne == [2, 3, 24, 1]
    with pytest.raises(ShapeError, match=r"cont: cannot hold its 144 elements in ne=\[10, 10, 1, 1\]"):
        ops.cont_2d(ctx, a, 10, 10)


def test_reshape(ctx, a):
    out = ops.reshape_2d(ctx, a, 24, 6)
    assert (out.op, out.ne, out.nb, out.view_src, out.name) == (Op.RESHAPE, [24, 6, 1, 1], [4, 96, 576, 576], a,
                                                                 "a (reshaped)")
    assert ops.reshape(ctx, a, ctx.new_tensor(G.I8, (12, 12))).ne == [12, 12, 1, 1]
    assert ops.reshape_1d(ctx, a, 144).ne[0] == 144 and ops.reshape_3d(ctx, a, 2, 3, 24).ne == [2, 3, 24, 1]
    assert ops.reshape_4d(ctx, a, 3, 2, 4, 6).ne == [3, 2, 4, 6]
    with pytest.raises(ShapeError, match="reshape: a must be contiguous"):
        ops.reshape_1d(ctx, ops.transpose(ctx, a), 144)
    with pytest.raises(ShapeError, match="reshape: cannot view its 144 elements"):
        ops.reshape_2d(ctx, a, 10, 10)


def test_views_of_views_collapse_to_the_root(ctx, a):
    v = ops.view_2d(ctx, a, 6, 4, a.nb[1], a.nb[2])
    vv = ops.view_1d(ctx, v, 3, 8)
    assert (vv.view_src, vv.view_offs, vv.src[0], vv.name) == (a, a.nb[2] + 8, v, "a (view) (view)")


@pytest.mark.parametrize("build, ne, nb", [
    (lambda ctx, a: ops.view_1d(ctx, a, 5, 8), [5, 1, 1, 1], [4, 20, 20, 20]),
    (lambda ctx, a: ops.view_2d(ctx, a, 3, 4, 24, 4), [3, 4, 1, 1], [4, 24, 96, 96]),
    (lambda ctx, a: ops.view_3d(ctx, a, 3, 2, 3, 48, 96, 0), [3, 2, 3, 1], [4, 48, 96, 288]),
    (lambda ctx, a: ops.view_4d(ctx, a, 6, 4, 3, 1, 24, 96, 288, 288), [6, 4, 3, 1], [4, 24, 96, 288]),
])
def test_view_strides_follow_ggml(ctx, a, build, ne, nb):
    out = build(ctx, a)
    assert (out.op, out.ne, out.nb, out.name) == (Op.VIEW, ne, nb, "a (view)")
    assert struct.unpack("<Q", struct.pack("<2i", *out.op_params[:2]))[0] == out.view_offs


def test_view_offset_beyond_4_gib_is_split_over_two_words(ctx):
    big = ctx.new_tensor(G.I8, (1 << 33,), name="big")
    assert ops.view_1d(ctx, big, 16, (1 << 32) + 5).op_params[:2] == [5, 1]
    assert ops.view_1d(ctx, big, 16, 0xFFFFFFF0).op_params[:2] == [-16, 0]  # int32 words, bit-cast


def test_view_out_of_bounds_is_refused(ctx, a):
    with pytest.raises(ShapeError, match="exceeds the 576 bytes"):
        ops.view_1d(ctx, a, 144, 4)
    with pytest.raises(ShapeError, match="view: negative offset"):
        ops.view_1d(ctx, a, 4, -4)


@given(st.permutations([0, 1, 2, 3]))
def test_permute_matches_numpy_transpose(axes):
    ctx = Context()
    a = ctx.tensor_from_numpy(np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5), name="a")
    out = ops.permute(ctx, a, *axes)
    assert out.op == Op.PERMUTE and out.op_params[:4] == list(axes) and out.name == "a (permuted)"
    # ggml: source dim i becomes dim axes[i]; NumPy's axes run in reversed (ne3..ne0) order
    expected = np.moveaxis(host_ndarray(a), [3 - i for i in range(4)], [3 - x for x in axes])
    np.testing.assert_array_equal(host_ndarray(out), expected)


def test_permute_refuses_non_permutations(ctx, a):
    with pytest.raises(ShapeError, match=r"permute: axes \[0, 0, 2, 3\] must be a permutation"):
        ops.permute(ctx, a, 0, 0, 2, 3)
    with pytest.raises(ShapeError, match="permute"):
        ops.permute(ctx, a, 0, 1, 2, 4)


def test_transpose(ctx, a):
    out = ops.transpose(ctx, a)
    assert (out.op, out.ne, out.nb, out.name) == (Op.TRANSPOSE, [4, 6, 3, 2], [24, 4, 96, 288], "a (transposed)")


def test_repeat(ctx, a):
    out = ops.repeat(ctx, a, ctx.new_tensor(G.F16, (12, 4, 6, 2)))
    assert (out.op, out.type, out.ne, out.src[:2]) == (Op.REPEAT, G.F32, [12, 4, 6, 2], [a, None])
    assert ops.repeat_4d(ctx, a, 6, 8, 3, 4).ne == [6, 8, 3, 4]
    with pytest.raises(ShapeError, match="repeat: every dim of a must divide"):
        ops.repeat(ctx, a, ctx.new_tensor(G.F32, (9, 4, 3, 2)))
    with pytest.raises(ShapeError, match="repeat_4d"):
        ops.repeat_4d(ctx, a, 6, 4, 4, 2)


def test_repeat_back(ctx, a):
    out = ops.repeat_back(ctx, a, ctx.new_tensor(G.F32, (3, 1, 3, 1)))
    assert (out.op, out.ne) == (Op.REPEAT_BACK, [3, 1, 3, 1])
    with pytest.raises(ShapeError, match="repeat_back"):
        ops.repeat_back(ctx, a, ctx.new_tensor(G.F32, (4, 1, 1, 1)))


def test_concat(ctx, a):
    out = ops.concat(ctx, a, ctx.new_tensor(G.F32, (6, 4, 5, 2)), 2)
    assert (out.op, out.ne, out.op_params[0]) == (Op.CONCAT, [6, 4, 8, 2], 2)
    with pytest.raises(ShapeError, match="concat: dim=4"):
        ops.concat(ctx, a, a, 4)
    with pytest.raises(GGMLTypeError, match="concat: a and b must have the same type"):
        ops.concat(ctx, a, ctx.new_tensor(G.F16, a.ne), 0)
    with pytest.raises(ShapeError, match="concat: a and b must agree on every dim but 1"):
        ops.concat(ctx, a, ctx.new_tensor(G.F32, (6, 4, 2, 2)), 1)


def test_pad(ctx, a):
    out = ops.pad(ctx, a, 1, 2, 0, 3)
    assert (out.op, out.ne, out.op_params[:9]) == (Op.PAD, [7, 6, 3, 5], [0, 1, 0, 2, 0, 0, 0, 3, 0])
    ext = ops.pad_ext(ctx, a, 1, 2, 3, 4, 0, 0, 1, 0)
    assert ext.ne == [9, 11, 3, 3] and ext.op_params[:9] == [1, 2, 3, 4, 0, 0, 1, 0, 0]
    assert ops.pad_circular(ctx, a, 1, 0, 0, 0).op_params[8] == 1
    assert ops.pad_ext_circular(ctx, a, 1, 1, 0, 0, 0, 0, 0, 0).op_params[8] == 1
    with pytest.raises(ShapeError, match=r"pad: paddings .* must be >= 0"):
        ops.pad(ctx, a, -1, 0, 0, 0)


def test_get_rows(ctx):
    emb = ctx.new_tensor(G.Q4_0, (64, 100), name="emb")
    ids = ctx.new_tensor(G.I32, (7,), name="ids")
    out = ops.get_rows(ctx, emb, ids)
    assert (out.op, out.type, out.ne, out.src[:2]) == (Op.GET_ROWS, G.F32, [64, 7, 1, 1], [emb, ids])
    assert ops.get_rows(ctx, ctx.new_tensor(G.I32, (4, 9)), ids).type == G.I32
    with pytest.raises(GGMLTypeError, match="get_rows: ids must be I32"):
        ops.get_rows(ctx, emb, ctx.new_tensor(G.I64, (7,)))
    with pytest.raises(ShapeError, match="get_rows: ids must be shaped"):
        ops.get_rows(ctx, emb, ctx.new_tensor(G.I32, (7, 2)))


def test_set_rows(ctx):
    cache = ctx.new_tensor(G.F16, (64, 32, 4), name="cache")
    rows = ctx.new_tensor(G.F32, (64, 3, 4), name="rows")
    ids = ctx.new_tensor(G.I64, (3, 2), name="ids")
    out = ops.set_rows(ctx, cache, rows, ids)
    assert (out.op, out.type, out.view_src, out.src[:3], out.name) == (Op.SET_ROWS, G.F16, cache, [rows, ids, cache],
                                                                       "cache (view)")
    with pytest.raises(ShapeError, match="set_rows: a and b must agree on dims 0, 2 and 3"):
        ops.set_rows(ctx, cache, ctx.new_tensor(G.F32, (32, 3, 4)), ids)
    with pytest.raises(ShapeError, match=r"set_rows: c.ne\[0\] must equal b.ne\[1\]"):
        ops.set_rows(ctx, cache, rows, ctx.new_tensor(G.I64, (2, 2)))
    with pytest.raises(ShapeError, match="set_rows: c's dims 1 and 2 must divide"):
        ops.set_rows(ctx, cache, rows, ctx.new_tensor(G.I64, (3, 3)))
    with pytest.raises(GGMLTypeError, match="set_rows: b must be F32"):
        ops.set_rows(ctx, cache, ctx.new_tensor(G.F16, (64, 3, 4)), ids)
    with pytest.raises(GGMLTypeError, match="set_rows: c must be I64 or I32"):
        ops.set_rows(ctx, cache, rows, ctx.new_tensor(G.F32, (3, 2)))
    with pytest.raises(ShapeError, match="set_rows: a and b need contiguous rows"):
        ops.set_rows(ctx, cache, ops.permute(ctx, ctx.new_tensor(G.F32, (3, 64, 4)), 1, 0, 2, 3), ids)


def test_diag(ctx):
    v = ctx.new_tensor(G.F32, (5, 1, 3))
    out = ops.diag(ctx, v)
    assert (out.op, out.ne) == (Op.DIAG, [5, 5, 3, 1])
    with pytest.raises(ShapeError, match=r"diag: a must be a row vector"):
        ops.diag(ctx, ctx.new_tensor(G.F32, (5, 2)))


# ----- set / acc ------------------------------------------------------------------------------
def test_set_and_acc_params_and_results(ctx, a):
    b = ctx.new_tensor(G.F32, (3, 2), name="b")
    out = ops.set_2d(ctx, a, b, a.nb[1], 8)
    assert (out.op, out.type, out.ne, out.view_src) == (Op.SET, G.F32, a.ne, None)
    assert list(out.op_params[:5]) == [a.nb[1], a.nb[2], a.nb[3], 8, 0]
    assert list(ops.set_1d(ctx, a, b, 4).op_params[:5]) == [a.nb[1], a.nb[2], a.nb[3], 4, 0]
    inplace = ops.acc_inplace(ctx, a, b, 2 * a.nb[1], a.nb[2], a.nb[3], 0)
    assert (inplace.op, inplace.view_src, inplace.op_params[4]) == (Op.ACC, a, 1)
    assert inplace.src[:2] == [a, b]


def test_set_inplace_writes_into_a():
    from pyggml.backend import init_by_name
    from pyggml.core.graph import Graph

    ctx = Context()
    a, b = ctx.new_tensor(G.I32, (4, 3), name="a"), ctx.new_tensor(G.I32, (2, 2), name="b")
    host_ndarray(a)[...] = np.arange(12).reshape(3, 4)
    host_ndarray(b)[...] = -1
    graph = Graph()
    graph.build_forward_expand(ops.set_2d_inplace(ctx, a, b, a.nb[1], a.nb[0]))
    init_by_name("CPU").graph_compute(graph)
    assert host_ndarray(a)[0, 0].tolist() == [[0, -1, -1, 3], [4, -1, -1, 7], [8, 9, 10, 11]]


@pytest.mark.parametrize("make, error, match", [
    (lambda c, a: ops.set_1d(c, a, c.new_tensor(G.F16, (4,)), 0), GGMLTypeError, "same type"),
    (lambda c, a: ops.acc(c, c.new_tensor(G.I32, (4,)), c.new_tensor(G.I32, (4,)), 16, 16, 16, 0), GGMLTypeError,
     "one of F32"),
    (lambda c, a: ops.set_1d(c, a, c.new_tensor(G.F32, (4,)), a.nbytes - 8), ShapeError, "past a's"),
    (lambda c, a: ops.set_2d(c, a, c.new_tensor(G.F32, (6, 30)), a.nb[1], 4), ShapeError, "past a's"),
    (lambda c, a: ops.set_1d(c, a, c.new_tensor(G.F32, (4,)), 2), ShapeError, "multiples of the element size"),
    (lambda c, a: ops.set(c, a, c.new_tensor(G.F32, (4,)), -4, 0, 0, 0), ShapeError, "must be >= 0"),
    (lambda c, a: ops.acc(c, ops.transpose(c, a), c.new_tensor(G.F32, (4,)), 16, 16, 16, 0), ShapeError,
     "contiguous"),
])
def test_set_and_acc_refuse_bad_input(ctx, a, make, error, match):
    with pytest.raises(error, match=match):
        make(ctx, a)
