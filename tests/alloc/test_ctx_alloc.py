"""alloc_ctx_tensors*: ggml's packing of a context into buffers of at most max_size
(`ggml_backend_alloc_ctx_tensors_from_buft_size`, measured on ggml 0.15.3 with a buffer type of small max_size)."""

import pytest

import pyggml as gg
from pyggml import Context, GGMLType
from pyggml.alloc import alloc_ctx_tensors, alloc_ctx_tensors_from_buft, alloc_ctx_tensors_from_buft_size
from pyggml.backend import is_multi_buffer
from pyggml.core import ops
from pyggml.errors import AllocationError
from tests.support.alloc_test_buft import DummyBufferType


def _weights_ctx() -> Context:
    ctx = Context(no_alloc=True)
    for i, nbytes in enumerate((40, 40, 40, 160, 20, 4)):
        ctx.new_tensor_1d(GGMLType.F32, nbytes // 4, f"w{i}")
    return ctx


def test_ranges_split_at_max_size_into_a_multi_buffer():
    buft = DummyBufferType(max_size=100, alignment=32)
    ctx = _weights_ctx()
    assert alloc_ctx_tensors_from_buft_size(ctx, buft) == 416
    buffer = alloc_ctx_tensors_from_buft(ctx, buft)
    assert is_multi_buffer(buffer) and buffer.size == 416 and buffer.base is None
    assert [b.size for b in buffer.buffers] == [64, 64, 64, 160, 64]
    w = ctx.tensors
    assert w[4].buffer is w[5].buffer and w[5].data - w[4].data == 32
    buffer.usage = gg.BufferUsage.WEIGHTS
    assert {b.usage for b in buffer.buffers} == {gg.BufferUsage.WEIGHTS}
    buffer.free()
    assert buft.allocated_total() == 0


def test_single_range_is_a_plain_buffer_with_views_bound():
    cpu = gg.backend.init_by_name("CPU")
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_2d(GGMLType.F32, 4, 4, "a")
    v = ops.view_1d(ctx, a, 4, 16)
    buffer = alloc_ctx_tensors(ctx, cpu)
    assert not is_multi_buffer(buffer) and buffer.size == 64
    assert v.buffer is buffer and v.data == a.data + 16


def test_nothing_to_allocate_gives_none():
    buft = DummyBufferType()
    ctx = Context(no_alloc=True)
    ctx.new_tensor_1d(GGMLType.F32, 0, "empty")
    assert alloc_ctx_tensors_from_buft(ctx, buft) is None
    assert alloc_ctx_tensors_from_buft_size(ctx, buft) == 0


def test_an_allocating_context_is_refused():
    with pytest.raises(AllocationError, match="no_alloc"):
        alloc_ctx_tensors_from_buft(Context(no_alloc=False), DummyBufferType())


class FailingAfter(DummyBufferType):
    """Allocates `budget` buffers, then runs out of memory."""

    def __init__(self, budget: int, **kw):
        super().__init__(**kw)
        self.budget = budget

    def _alloc_buffer(self, size):
        if len(self.buffers) >= self.budget:
            raise MemoryError("no more device memory")
        return super()._alloc_buffer(size)


def test_failure_frees_everything_and_unbinds_the_tensors():
    buft = FailingAfter(3, max_size=100, alignment=32)
    ctx = _weights_ctx()
    with pytest.raises(AllocationError, match="failed to allocate a buffer of 160 bytes"):
        alloc_ctx_tensors_from_buft(ctx, buft)
    assert buft.allocated_total() == 0
    assert all(t.data is None and t.buffer is None for t in ctx.tensors)
