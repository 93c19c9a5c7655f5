"""TensorAllocator: ggml_tallocr's offsets and its overflow error (`ggml_tallocr_alloc`, measured on ggml 0.15.3)."""

import pytest

import pyggml as gg
from pyggml import Context, GGMLType
from pyggml.alloc import TensorAllocator
from pyggml.errors import OutOfBufferSpace


@pytest.fixture(scope="module")
def buft():
    return gg.backend.init_by_name("CPU").default_buffer_type


def test_offsets_are_cumulative_padded_sizes(buft):
    buffer = buft.alloc_buffer(256)
    talloc = TensorAllocator(buffer)
    ctx = Context(no_alloc=True)
    tensors = [ctx.new_tensor_1d(GGMLType.F32, n, f"t{i}") for i, n in enumerate((3, 10, 1, 8))]
    for t in tensors:
        assert talloc.alloc(t) == gg.Status.SUCCESS
    assert [t.data - buffer.base for t in tensors] == [0, 32, 96, 128]
    assert all(t.buffer is buffer for t in tensors)
    assert talloc.offset == 160


def test_overflow_names_the_tensor_and_changes_nothing(buft):
    buffer = buft.alloc_buffer(256)
    talloc = TensorAllocator(buffer)
    ctx = Context(no_alloc=True)
    for n in (3, 10, 1, 8):
        talloc.alloc(ctx.new_tensor_1d(GGMLType.F32, n))
    t4 = ctx.new_tensor_1d(GGMLType.F32, 40, "t4")
    with pytest.raises(OutOfBufferSpace, match=r"tensor 't4': needed 160, available 96"):
        talloc.alloc(t4)
    assert t4.data is None and t4.buffer is None and talloc.offset == 160


def test_zero_size_buffer_has_no_room(buft):
    buffer = buft.alloc_buffer(0)
    assert buffer.size == 0 and buffer.base is None
    t = Context(no_alloc=True).new_tensor_1d(GGMLType.F32, 1, "one")
    with pytest.raises(OutOfBufferSpace, match="needed 32, available 0"):
        TensorAllocator(buffer).alloc(t)
