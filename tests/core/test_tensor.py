import numpy as np
import pytest

from pyggml import Context, GGMLType, Op, Tensor, TensorFlag, UnaryOp
from pyggml.core.tensor import host_ndarray
from pyggml.errors import NotAllocatedError, ShapeError


def test_strides_and_nbytes_follow_ggml():
    t = Tensor(GGMLType.F32, (3, 4, 5))
    assert t.ne == [3, 4, 5, 1] and t.nb == [4, 12, 48, 240]
    assert t.nbytes == 240 and t.nelements == 60 and t.nrows == 20 and t.n_dims == 3
    q = Tensor(GGMLType.Q4_0, (64, 2))
    assert q.nb == [18, 36, 72, 72] and q.nbytes == 72
    # a transposed view: nbytes spans first to last byte
    v = Tensor(GGMLType.F32, (4, 3), [12, 4, 48, 48], view_src=t)
    assert v.nbytes == 4 + 3 * 12 + 2 * 4 and v.is_transposed and not v.is_contiguous
    assert Tensor(GGMLType.F32, (0, 5)).nbytes == 0


def test_block_types_need_whole_blocks_and_dims_are_checked():
    with pytest.raises(ShapeError, match="block size 32"):
        Tensor(GGMLType.Q8_0, (33,))
    with pytest.raises(ShapeError, match="non-negative"):
        Tensor(GGMLType.F32, (-1,))
    with pytest.raises(ShapeError, match="up to 4"):
        Tensor(GGMLType.F32, (1, 2, 3, 4, 5))


def test_views_of_views_collapse_to_the_root():
    root = Tensor(GGMLType.F32, (16,), name="root")
    v1 = Tensor(GGMLType.F32, (8,), view_src=root, view_offs=16)
    v2 = Tensor(GGMLType.F32, (4,), view_src=v1, view_offs=8)
    assert v2.view_src is root and v2.view_offs == 24 and v2.is_view
    with pytest.raises(ShapeError, match="exceeds"):
        Tensor(GGMLType.F32, (8,), view_src=v1, view_offs=40)


def test_set_output_protects_the_view_root():
    root = Tensor(GGMLType.F32, (4,))
    v = Tensor(GGMLType.F32, (4,), view_src=root)
    v.set_output()
    assert v.flags & TensorFlag.OUTPUT and root.flags & TensorFlag.OUTPUT
    x = Tensor(GGMLType.F32, (4,)).set_input()
    assert x.is_input and not x.is_output


def test_contiguity_predicates():
    t = Tensor(GGMLType.F32, (4, 3, 2))
    assert t.is_contiguous and t.is_contiguous_n(1) and not t.is_permuted
    p = Tensor(GGMLType.F32, (3, 4, 2), [16, 4, 48, 96], view_src=t)  # dims 0 and 1 swapped
    assert p.is_permuted and not p.is_contiguous and not p.is_contiguous_rows
    rows = Tensor(GGMLType.F32, (2, 3), [4, 16, 48, 48], view_src=t)  # every row padded
    assert not rows.is_contiguous and rows.is_contiguous_n(1) and rows.is_contiguous_rows
    assert Tensor(GGMLType.F32, (4,)).same_layout(Tensor(GGMLType.F32, (4,)))
    assert Tensor(GGMLType.F32, (2, 1)).can_repeat(Tensor(GGMLType.F32, (4, 3)))
    assert not Tensor(GGMLType.F32, (3,)).can_repeat(Tensor(GGMLType.F32, (4,)))


def test_op_params_are_raw_int32_words_with_bitcast_floats():
    t = Tensor(GGMLType.F32, (4,), op=Op.UNARY)
    t.set_op_params([int(UnaryOp.GELU), 1.5])
    assert t.op_params[0] == 8 and t.op_params[1] == 0x3FC00000 and t.op_params_f32(1) == 1.5
    assert t.unary_op == UnaryOp.GELU and len(t.op_params) == 16
    t.set_op_params_i32(2, 2 ** 32 - 1)  # wraps like a C int32
    assert t.op_params_i32(2) == -1


def test_names_are_cut_like_ggml_and_repr_is_readable():
    t = Tensor(GGMLType.F32, (2, 3), name="x" * 100)
    assert len(t.name) == 63
    t.set_name("weights").set_input()
    assert repr(t) == "Tensor('weights', f32, [2x3], INPUT)"


def test_host_views_are_zero_copy_and_checked():
    ctx = Context(no_alloc=False)
    a = ctx.tensor_from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), name="a")
    assert a.ne == [4, 3, 1, 1]
    view = a.numpy()
    view[1, 2] = 100
    assert host_ndarray(a)[0, 0, 1, 2] == 100 and a.numpy().ctypes.data == a.data
    tv = Tensor(GGMLType.F32, (3, 4), [16, 4, 48, 48], view_src=a)  # transposed view sees the same bytes
    assert tv.numpy()[2, 1] == 100 and tv.numpy().base is not None
    with pytest.raises(NotAllocatedError, match="has no memory"):
        Context(no_alloc=True).new_tensor(GGMLType.F32, (4,)).numpy()


def test_host_views_are_shared_by_layout_within_their_memory():
    """A tensor rebuilt with the same address and layout (the next step's graph) reuses the view."""
    ctx = Context(no_alloc=False)
    a = ctx.new_tensor(GGMLType.F32, (4, 3), name="a")
    same = Tensor(GGMLType.F32, (4, 3), view_src=a)
    other = Tensor(GGMLType.F32, (3, 4), [16, 4, 48, 48], view_src=a)
    assert host_ndarray(same) is host_ndarray(a)
    assert host_ndarray(other) is not host_ndarray(a) and host_ndarray(other).shape == (1, 1, 4, 3)
    a.nb[1] = 32  # a changed layout is a new key: the view must follow it
    a.ne[1] = 1
    assert host_ndarray(a).strides == (48, 48, 32, 4) and host_ndarray(a).shape == (1, 1, 1, 4)
