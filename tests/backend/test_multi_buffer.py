"""Multi-buffers: the children's total size, no base, and free/clear/usage reaching every child."""

import pytest

from pyggml.backend import cpu
from pyggml.backend.base import BufferUsage
from pyggml.backend.multi_buffer import is_multi_buffer, multi_buffer
from pyggml.errors import BufferUseError, BufferFreedError

CPU_BUFT = cpu.CPU_REG.device(0).buffer_type


@pytest.fixture
def children():
    return [CPU_BUFT.alloc_buffer(n) for n in (64, 64, 160, 64)]


def test_size_buft_and_base(children):
    multi = multi_buffer(children)
    assert multi.size == 352 and multi.buft is CPU_BUFT and multi.base is None
    assert is_multi_buffer(multi) and not is_multi_buffer(children[0])


def test_usage_propagates_to_children(children):
    multi = multi_buffer(children)
    multi.usage = BufferUsage.WEIGHTS
    assert [c.usage for c in children] == [BufferUsage.WEIGHTS] * 4
    children[0].usage = BufferUsage.COMPUTE  # a child's own usage stays its own
    assert multi.usage == BufferUsage.WEIGHTS


def test_clear_and_free_reach_every_child(children):
    multi = multi_buffer(children)
    multi.clear(7)
    assert all((c.host_array == 7).all() for c in children)
    multi.free()
    assert all(c.is_freed for c in children)
    with pytest.raises(BufferFreedError):
        multi.clear(0)


def test_an_empty_list_is_refused():
    with pytest.raises(BufferUseError, match="at least one buffer"):
        multi_buffer([])
