"""The interface defaults of base.py, checked on minimal subclasses that override only what is required."""

import threading

import numpy as np
import pytest
from tests.support.minimal_backend import MinimalBackend, MinimalBufferType, minimal_device

from pyggml.backend.base import (API_VERSION, SIZE_MAX, BufferUsage, DeviceCaps, DeviceProps, DeviceType, Event, Status,
                                 computed_nodes)
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Op, Tensor, TensorFlag
from pyggml.errors import AllocationError, BackendError, BufferUseError, BufferFreedError


@pytest.fixture
def dev():
    return minimal_device()


# ----- enums and props -----------------------------------------------------------------------
def test_enum_values_match_ggml():
    assert [int(u) for u in BufferUsage] == [0, 1, 2]
    assert [int(t) for t in DeviceType] == [0, 1, 2, 3]
    assert (Status.SUCCESS, Status.FAILED, Status.ALLOC_FAILED, Status.ABORTED) == (0, -1, -2, 1)


def test_device_props_default_caps_are_all_false(dev):
    props = dev.props()
    assert props == DeviceProps("MIN0", "a minimal device", 100, 200, DeviceType.GPU, None, DeviceCaps())
    assert not any(vars(props.caps).values())


# ----- buffer type -----------------------------------------------------------------------------
def test_buffer_type_defaults(dev):
    buft = dev.buffer_type
    t = Tensor("f32", (10, 3))
    assert buft.max_size == SIZE_MAX
    assert buft.alloc_size(t) == t.nbytes == 120
    assert buft.is_host is False
    assert buft.device is dev


def test_zero_size_alloc_is_a_dummy_buffer_without_calling_the_backend(dev):
    buft = dev.buffer_type
    buf = buft.alloc_buffer(0)
    assert buft.allocated == []
    assert buf.size == 0 and buf.base is None and buf.buft is buft
    buf.clear(7)  # a no-op on a size-0 buffer
    buf.free()


def test_alloc_size_smaller_than_nbytes_is_refused():
    class Bad(MinimalBufferType):
        def _alloc_size(self, t):
            return t.nbytes - 1

    with pytest.raises(BackendError, match="less than its 40 bytes"):
        Bad().alloc_size(Tensor("f32", (10,), name="x"))


def test_negative_size_and_memory_errors_become_allocation_errors():
    class Oom(MinimalBufferType):
        def _alloc_buffer(self, size):
            raise MemoryError("no room")

    with pytest.raises(AllocationError, match="-1 bytes"):
        MinimalBufferType().alloc_buffer(-1)
    with pytest.raises(AllocationError, match="1000 bytes: no room"):
        Oom().alloc_buffer(1000)


# ----- buffer ----------------------------------------------------------------------------------
def test_buffer_defaults(dev):
    buf = dev.buffer_type.alloc_buffer(64)
    t = Tensor("f32", (4,), name="t")
    assert buf.usage == BufferUsage.ANY and buf.name == "MIN" and buf.size == 64
    assert buf.alignment == 16 and buf.max_size == SIZE_MAX and buf.is_host is False
    assert buf.init_tensor(t) == Status.SUCCESS
    assert buf.cpy_tensor(t, t) is False
    buf.reset()
    with pytest.raises(BackendError, match="memset not implemented by backend buffer MIN"):
        buf.memset_tensor(t, 0, 0, 16)


def test_non_host_buffers_get_disjoint_aligned_fake_addresses(dev):
    a, b = dev.buffer_type.alloc_buffer(5000), dev.buffer_type.alloc_buffer(10)
    assert a.base % 4096 == 0 and b.base % 4096 == 0
    assert a.base == a.base  # stable
    lo, hi = sorted([(a.base, a.base + a.size), (b.base, b.base + b.size)])
    assert lo[1] <= hi[0]


def test_use_after_free_and_double_free_raise(dev):
    buf = dev.buffer_type.alloc_buffer(32)
    buf.free()
    assert buf.is_freed and buf.size == 32  # metadata stays readable
    for call in (lambda: buf.base, lambda: buf.clear(0), buf.free, buf.reset,
                 lambda: buf.set_tensor(Tensor("f32", (1,)), memoryview(b"abcd"), 0, 4)):
        with pytest.raises(BufferFreedError, match="MIN"):
            call()


def test_read_only_buffer_refuses_writes(dev):
    buf = dev.buffer_type.alloc_buffer(32)
    buf.read_only = True
    with pytest.raises(BufferUseError, match="read-only"):
        buf.clear(1)
    assert bytes(buf.mem) == bytes(32)


def test_set_tensor_2d_default_loops_over_rows(dev):
    buf = dev.buffer_type.alloc_buffer(64)
    t = Tensor("i8", (64,), name="t")
    t.buffer, t.data = buf, buf.base
    data = memoryview(bytes(range(12)))
    buf.set_tensor_2d(t, data, 1, 2, 3, 10, 4)  # rows of 2 bytes from data[0], [4], [8] to 1, 11, 21
    assert bytes(buf.mem[:24]) == bytes([0, 0, 1] + [0] * 8 + [4, 5] + [0] * 8 + [8, 9, 0])
    out = bytearray(12)
    buf.get_tensor_2d(t, memoryview(out), 1, 2, 3, 10, 4)
    assert out == bytes([0, 1, 0, 0, 4, 5, 0, 0, 8, 9, 0, 0])


# ----- backend ---------------------------------------------------------------------------------
def test_backend_defaults(dev):
    be = dev.init_backend()
    t = Tensor("f32", (4,))
    assert be.device is dev and be.default_buffer_type is dev.buffer_type
    assert be.alignment == 16 and be.max_size == SIZE_MAX
    assert be.alloc_buffer(32).buft is dev.buffer_type
    assert be.supports_op(Tensor("f32", (4,), op=Op.ADD)) and not be.supports_op(t)
    assert be.supports_buft(dev.buffer_type) and be.offload_op(t) is False
    assert be.cpy_tensor_async(be, be, t, t) is False
    be.synchronize()
    for call in (lambda: be.graph_plan_create(Graph()), lambda: be.graph_plan_compute(None),
                 lambda: be.graph_plan_update(None, Graph()), lambda: be.graph_plan_free(None)):
        with pytest.raises(BackendError, match="does not support graph plans"):
            call()
    for call in (lambda: be.event_record(Event(dev)), lambda: be.event_wait(Event(dev))):
        with pytest.raises(BackendError, match="does not support events"):
            call()


def test_graph_compute_is_async_then_synchronize(dev):
    calls = []

    class Tracing(MinimalBackend):
        def _graph_compute(self, graph):
            calls.append("compute")
            return Status.SUCCESS

        def synchronize(self):
            calls.append("sync")

    assert Tracing(dev).graph_compute(Graph()) == Status.SUCCESS
    assert calls == ["compute", "sync"]


def test_graph_compute_refuses_freed_buffers_before_computing(dev):
    be = dev.init_backend()
    buf = dev.buffer_type.alloc_buffer(64)
    a = Tensor("f32", (4,), name="a")
    a.buffer, a.data = buf, buf.base
    node = Tensor("f32", (4,), op=Op.ADD, name="sum")
    node.src[0] = node.src[1] = a
    g = Graph().build_forward_expand(node)
    buf.free()
    with pytest.raises(BufferFreedError, match="'a'.*'sum'"):
        be.graph_compute(g)
    assert be.computed == []


def test_backend_guid_must_be_16_bytes_and_free_is_final(dev):
    class BadGuid(MinimalBackend):
        guid = b"short"

    with pytest.raises(BackendError, match="16 bytes"):
        BadGuid(dev)
    be = dev.init_backend()
    be.free()
    with pytest.raises(BackendError, match="after free"):
        be.graph_compute(Graph())


def test_concurrent_computes_on_one_backend_are_serialized(dev):
    inside, overlaps = [0], []

    class Slow(MinimalBackend):
        def _graph_compute(self, graph):
            inside[0] += 1
            overlaps.append(inside[0])
            threading.Event().wait(0.01)
            inside[0] -= 1
            return Status.SUCCESS

    be = Slow(dev)
    threads = [threading.Thread(target=be.graph_compute, args=(Graph(),)) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert overlaps == [1, 1, 1, 1]


def test_computed_nodes_skip_views_none_empty_and_unflagged():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor("f32", (4,), "a")
    add = Tensor("f32", (4,), op=Op.ADD, name="add")
    add.src[0] = add.src[1] = a
    view = Tensor("f32", (4,), op=Op.RESHAPE, view_src=add, name="view")
    view.src[0] = add
    empty = Tensor("f32", (0,), op=Op.ADD, name="empty")
    empty.src[0] = empty.src[1] = view
    g = Graph().build_forward_expand(empty)
    late = Tensor("f32", (4,), op=Op.ADD, name="late")
    g.add_node(late)  # added without the COMPUTE flag
    assert [n.name for n in g.nodes] == ["add", "view", "empty", "late"]
    assert not late.flags & TensorFlag.COMPUTE
    assert computed_nodes(g) == [add]


# ----- device, events, reg ---------------------------------------------------------------------
def test_device_defaults(dev):
    assert dev.host_buffer_type is None
    assert dev.offload_op(Tensor("f32", (1,))) is False
    assert dev.event_new() is None
    dev.event_free(None)
    with pytest.raises(BackendError, match="does not support events"):
        Event(dev).synchronize()
    with pytest.raises(BackendError, match="cannot create buffers from host memory"):
        dev.buffer_from_host_ptr(bytearray(8), 8, 8)


def test_buffer_from_host_ptr_checks_the_size_against_the_object(dev):
    with pytest.raises(BufferUseError, match="16 bytes over an object of 8 bytes"):
        dev.buffer_from_host_ptr(np.zeros(2, np.float32), 16)


def test_reg_defaults(dev):
    reg = dev.reg
    assert reg.api_version == API_VERSION == 2
    assert reg.device_count == 1 and reg.device(0) is dev
    with pytest.raises(BackendError, match="device index 1 out of range"):
        reg.device(1)
    assert reg.get_proc_address("ggml_backend_set_n_threads") is None


def test_buffer_from_host_ptr_needs_a_contiguous_buffer(dev):
    with pytest.raises(BufferUseError, match="C-contiguous buffer-protocol object, got ndarray"):
        dev.buffer_from_host_ptr(np.zeros((4, 4), np.float32).T)
    with pytest.raises(BufferUseError, match="got list"):
        dev.buffer_from_host_ptr([1, 2])


def test_a_buffer_type_returning_nothing_is_an_allocation_error():
    class Null(MinimalBufferType):
        def _alloc_buffer(self, size):
            return None

    with pytest.raises(AllocationError, match="failed to allocate a buffer of 8 bytes"):
        Null().alloc_buffer(8)
