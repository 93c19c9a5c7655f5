import numpy as np
import pytest

from pyggml import Context, GGMLType
from pyggml.errors import GGMLError, ShapeError, UnsupportedTypeError


def test_creation_order_and_lookup():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_1d(GGMLType.F32, 4, "a")
    b = ctx.new_tensor_2d(GGMLType.F16, 4, 2, "b")
    c = ctx.new_tensor_4d(GGMLType.I32, 1, 2, 3, 4, "c")
    assert list(ctx) == [a, b, c] and len(ctx) == 3 and ctx.get_tensor("b") is b and ctx.get_tensor("z") is None
    assert all(t.data is None for t in ctx)
    d = ctx.dup_tensor(b)
    assert d.type == GGMLType.F16 and d.ne == b.ne and d.data is None
    v = ctx.view_tensor(c)
    assert v.view_src is c and v.nb == c.nb and v.name == "c (view)"


def test_allocating_context_gives_zeroed_aligned_memory():
    ctx = Context(no_alloc=False)
    t = ctx.new_tensor_3d(GGMLType.F32, 5, 3, 2)
    assert t.data % 32 == 0 and not t.numpy().any() and t.numpy().shape == (2, 3, 5)
    v = ctx.view_tensor(t)
    assert v.data == t.data


def test_tensor_from_numpy_infers_types_and_converts():
    ctx = Context(no_alloc=False)
    assert ctx.tensor_from_numpy(np.zeros(3, np.int32)).type == GGMLType.I32
    h = ctx.tensor_from_numpy(np.array([1.5, 2.0], np.float32), type_=GGMLType.F16)
    assert h.type == GGMLType.F16 and h.numpy().tolist() == [1.5, 2.0]
    q = ctx.tensor_from_numpy(np.ones((2, 32), np.float32), type_=GGMLType.Q8_0)
    assert q.numpy().shape == (2, 34)
    with pytest.raises(UnsupportedTypeError, match="no ggml type"):
        ctx.tensor_from_numpy(np.zeros(2, np.complex64))
    with pytest.raises(ShapeError):
        ctx.tensor_from_numpy(np.zeros((1, 1, 1, 1, 1)))


def test_full_context_raises():
    ctx = Context(no_alloc=True, max_tensors=1)
    ctx.new_tensor_1d(GGMLType.F32, 1)
    with pytest.raises(GGMLError, match="at most 1"):
        ctx.new_tensor_1d(GGMLType.F32, 1)
