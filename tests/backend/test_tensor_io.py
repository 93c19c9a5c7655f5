"""The public tensor-data wrappers: every check raises before a byte moves, and the data paths are right."""

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.support.minimal_backend import minimal_device

from pyggml.backend import cpu
from pyggml.backend.base import Status
from pyggml.backend.multi_buffer import multi_buffer
from pyggml.backend.tensor_io import (host_bytes, tensor_alloc, tensor_copy, tensor_copy_async, tensor_get,
                                      tensor_get_2d, tensor_get_async, tensor_memset, tensor_set, tensor_set_2d,
                                      tensor_set_async, view_init)
from pyggml.core.context import Context
from pyggml.core.tensor import Tensor
from pyggml.errors import (AllocationError, BufferUseError, BufferFreedError, LayoutError, NotAllocatedError,
                           OutOfBoundsError, GGMLTypeError)

CPU_BUFT = cpu.CPU_REG.device(0).buffer_type


def placed(buf, type_, ne, offset=0, name="t"):
    t = Tensor(type_, ne, name=name)
    tensor_alloc(buf, t, (buf.base or 0) + offset)
    return t


@pytest.fixture
def buf():
    b = CPU_BUFT.alloc_buffer(1024)
    b.clear(0)
    return b


# ----- tensor_alloc / view_init ----------------------------------------------------------------
def test_tensor_alloc_binds_buffer_and_address(buf):
    t = placed(buf, "f32", (4, 2), offset=64)
    assert t.buffer is buf and t.data == buf.base + 64
    assert t.numpy().shape == (2, 4)


def test_tensor_alloc_refusals_leave_the_tensor_untouched(buf):
    t = Tensor("f32", (16,), name="w")
    for addr, match in ((buf.base - 1, "offset -1"), (buf.base + 1024 - 63, "64 bytes.*offset 961")):
        with pytest.raises(OutOfBoundsError, match=match):
            tensor_alloc(buf, t, addr)
        assert t.buffer is None and t.data is None
    tensor_alloc(buf, t, buf.base)
    with pytest.raises(AllocationError, match="already allocated"):
        tensor_alloc(buf, t, buf.base)
    view = Tensor("f32", (4,), view_src=t, name="v")
    with pytest.raises(AllocationError, match="is a view of 'w'; use view_init"):
        tensor_alloc(buf, view, buf.base)


def test_tensor_alloc_in_freed_or_multi_buffer_is_refused(buf):
    other = CPU_BUFT.alloc_buffer(64)
    multi = multi_buffer([other])
    with pytest.raises(AllocationError, match="no base address"):
        tensor_alloc(multi, Tensor("f32", (4,), name="x"), 0)
    buf.free()
    with pytest.raises(BufferFreedError):
        tensor_alloc(buf, Tensor("f32", (4,)), 0)


def test_tensor_alloc_rolls_back_when_init_tensor_fails(buf):
    class Failing(type(buf)):
        def _init_tensor(self, t):
            raise AllocationError("no extras left")

    failing = Failing(CPU_BUFT, buf.host_array)
    t = Tensor("f32", (4,))
    with pytest.raises(AllocationError, match="no extras"):
        tensor_alloc(failing, t, failing.base)
    assert t.buffer is None and t.data is None


def test_view_init(buf):
    root = placed(buf, "f32", (8,), offset=32, name="root")
    view = Tensor("f32", (4,), view_src=root, view_offs=16, name="view")
    assert view_init(view) == Status.SUCCESS
    assert view.buffer is buf and view.data == root.data + 16
    with pytest.raises(AllocationError, match="already has buffer"):
        view_init(view)
    with pytest.raises(AllocationError, match="is not a view"):
        view_init(Tensor("f32", (4,), name="plain"))
    loose = Tensor("f32", (4,), view_src=Tensor("f32", (8,), name="unplaced"), name="loose")
    with pytest.raises(NotAllocatedError, match="'loose' of 'unplaced'"):
        view_init(loose)


# ----- set / get -------------------------------------------------------------------------------
@pytest.mark.parametrize("type_,dtype", [("f32", np.float32), ("f16", np.float16), ("i32", np.int32),
                                         ("i8", np.int8), ("f64", np.float64)])
def test_set_get_round_trip_is_typed_and_shaped(buf, type_, dtype):
    t = placed(buf, type_, (3, 2, 2))
    x = np.arange(12, dtype=dtype).reshape(2, 2, 3)
    tensor_set(t, x)
    got = tensor_get(t)
    assert got.dtype == dtype and got.shape == (2, 2, 3)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(t.numpy(), x)


def test_block_types_read_as_raw_rows(buf):
    t = placed(buf, "q8_0", (64, 2))  # 2 blocks of 34 bytes per row
    raw = np.arange(136, dtype=np.uint8)
    tensor_set(t, raw)
    got = tensor_get(t)
    assert got.dtype == np.uint8 and got.shape == (2, 68)
    np.testing.assert_array_equal(got.reshape(-1), raw)
    with pytest.raises(GGMLTypeError, match="block type|q8_0|Q8_0"):
        tensor_set(t, np.zeros(34, np.float32))


def test_bytes_like_sources_and_partial_writes(buf):
    t = placed(buf, "f32", (4,))
    tensor_set(t, np.array([1, 2, 3, 4], np.float32).tobytes())
    tensor_set(t, bytearray(np.float32(9).tobytes()), offset=8)
    tensor_set(t, memoryview(np.float32([7, 8]).tobytes()), offset=4, size=4)
    np.testing.assert_array_equal(tensor_get(t), [1, 7, 9, 4])
    part = tensor_get(t, offset=4, size=8)
    assert part.dtype == np.uint8 and part.view(np.float32).tolist() == [7, 9]


def test_out_of_bounds_and_size_errors_write_nothing(buf):
    t = placed(buf, "f32", (4,), offset=32)
    neighbour = placed(buf, "f32", (4,), offset=48, name="n")
    tensor_set(neighbour, np.ones(4, np.float32))
    before = buf.host_array.copy()
    with pytest.raises(OutOfBoundsError, match="8 bytes at offset 12 is out of bounds of tensor 't' \\(16 bytes\\)"):
        tensor_set(t, np.zeros(2, np.float32), offset=12)
    with pytest.raises(OutOfBoundsError, match="data has 20 bytes but tensor 't' has 16"):
        tensor_set(t, np.zeros(5, np.float32))
    with pytest.raises(OutOfBoundsError, match="data has 12 bytes but tensor 't' has 16"):
        tensor_set(t, np.zeros(3, np.float32))
    with pytest.raises(OutOfBoundsError, match="size 16 is larger than the 8 bytes"):
        tensor_set(t, np.zeros(2, np.float32), offset=0, size=16)
    with pytest.raises(OutOfBoundsError, match="at offset -4"):
        tensor_set(t, np.zeros(1, np.float32), offset=-4)
    with pytest.raises(OutOfBoundsError, match="tensor_get: 12 bytes at offset 8"):
        tensor_get(t, offset=8, size=12)
    np.testing.assert_array_equal(buf.host_array, before)


def test_wrong_dtype_is_refused(buf):
    t = placed(buf, "f32", (4,))
    with pytest.raises(GGMLTypeError, match="'t' is f32 \\(float32\\), got an array of float64"):
        tensor_set(t, np.zeros(4))
    with pytest.raises(GGMLTypeError, match="got an array of int32"):
        tensor_get(t, out=np.zeros(4, np.int32))
    with pytest.raises(GGMLTypeError, match="buffer-protocol"):
        tensor_set(t, [1.0, 2.0, 3.0, 4.0])


def test_unallocated_and_freed_tensors_are_refused(buf):
    with pytest.raises(NotAllocatedError, match="'lonely' has no buffer"):
        tensor_set(Tensor("f32", (4,), name="lonely"), np.zeros(4, np.float32))
    with pytest.raises(NotAllocatedError, match="has no buffer"):
        tensor_get(Tensor("f32", (4,)))
    half = Tensor("f32", (4,), name="half")
    half.buffer = buf  # bound but never given an address
    with pytest.raises(NotAllocatedError, match="'half' is not allocated"):
        tensor_set(half, np.zeros(4, np.float32))
    t = placed(buf, "f32", (4,))
    buf.free()
    with pytest.raises(BufferFreedError, match="used after free"):
        tensor_get(t)
    with pytest.raises(BufferFreedError):
        tensor_set(t, np.zeros(4, np.float32))


def test_size_zero_returns_before_the_data_checks(buf):
    half = Tensor("f32", (4,), name="half")
    half.buffer = buf
    tensor_set(half, b"", size=0)
    tensor_memset(Tensor("f32", (4,)), 1, offset=0, size=0)  # memset checks nothing when size is 0
    assert tensor_get(half, offset=0, size=0).size == 0


def test_get_into_out(buf):
    t = placed(buf, "f32", (3, 2))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor_set(t, x)
    out = np.empty((2, 3), np.float32)
    assert tensor_get(t, out=out) is out
    np.testing.assert_array_equal(out, x)
    raw = bytearray(24)
    tensor_get(t, out=raw)
    assert bytes(raw) == x.tobytes()
    with pytest.raises(OutOfBoundsError, match="output has 20 bytes"):
        tensor_get(t, out=bytearray(20))
    with pytest.raises(BufferUseError, match="read-only"):
        tensor_get(t, out=bytes(24))
    with pytest.raises(LayoutError, match="C-contiguous"):
        tensor_get(t, out=np.empty((3, 2), np.float32).T)


def test_strided_views_read_and_write_in_element_order(buf):
    root = placed(buf, "f32", (4, 3), name="root")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor_set(root, x)
    tr = Tensor("f32", (3, 4), nb=[16, 4, 48, 48], view_src=root, name="tr")  # the transpose
    view_init(tr)
    np.testing.assert_array_equal(tensor_get(tr), x.T)
    tensor_set(tr, x.T * 10)
    np.testing.assert_array_equal(tensor_get(root), x * 10)
    out = np.empty((4, 3), np.float32)
    np.testing.assert_array_equal(tensor_get(tr, out=out), x.T * 10)
    gappy = Tensor("f32", (2, 3), nb=[4, 16, 48, 48], view_src=root, view_offs=4, name="cols1-2")
    view_init(gappy)
    tensor_set(gappy, -np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(tensor_get(root)[:, 1:3], -np.ones((3, 2)))
    np.testing.assert_array_equal(tensor_get(root)[:, [0, 3]], (x * 10)[:, [0, 3]])


def test_memset(buf):
    t = placed(buf, "i8", (8,))
    tensor_memset(t, 5)
    tensor_memset(t, 9, offset=2, size=3)
    assert tensor_get(t).tolist() == [5, 5, 9, 9, 9, 5, 5, 5]
    with pytest.raises(OutOfBoundsError, match="not a byte"):
        tensor_memset(t, 256)
    with pytest.raises(OutOfBoundsError, match="4 bytes at offset 6"):
        tensor_memset(t, 1, offset=6, size=4)
    assert tensor_get(t).tolist() == [5, 5, 9, 9, 9, 5, 5, 5]


def test_2d_forms_check_every_row_first(buf):
    t = placed(buf, "i8", (16,))
    tensor_set_2d(t, bytes(range(1, 10)), offset=1, size=2, n_copies=3, stride_tensor=5, stride_data=3)
    assert tensor_get(t).tolist() == [0, 1, 2, 0, 0, 0, 4, 5, 0, 0, 0, 7, 8, 0, 0, 0]
    assert tensor_get_2d(t, offset=1, size=2, n_copies=3, stride_tensor=5, stride_data=2).tolist() == \
        [1, 2, 4, 5, 7, 8]
    before = tensor_get(t).copy()
    with pytest.raises(OutOfBoundsError, match="out of bounds of tensor 't'"):
        tensor_set_2d(t, bytes(30), offset=0, size=2, n_copies=4, stride_tensor=5, stride_data=2)
    with pytest.raises(OutOfBoundsError, match="data has 4 bytes, 3 rows of 2 with stride 2 need 6"):
        tensor_set_2d(t, bytes(4), offset=0, size=2, n_copies=3, stride_tensor=2, stride_data=2)
    np.testing.assert_array_equal(tensor_get(t), before)


# ----- async -----------------------------------------------------------------------------------
def test_async_forms_fall_back_to_synchronize_then_blocking_call(buf):
    calls = []

    class Tracing(cpu.CpuBackend):
        def synchronize(self):
            calls.append("sync")

    be = Tracing(cpu.CPU_REG.device(0))
    t = placed(buf, "f32", (4,))
    tensor_set_async(be, t, np.arange(4, dtype=np.float32))
    got = tensor_get_async(be, t)
    be.synchronize()
    np.testing.assert_array_equal(got, [0, 1, 2, 3])
    assert calls == ["sync", "sync", "sync"]
    with pytest.raises(OutOfBoundsError):
        tensor_set_async(be, t, np.zeros(5, np.float32))
    with pytest.raises(NotAllocatedError):
        tensor_get_async(be, Tensor("f32", (4,)))


# ----- copies ----------------------------------------------------------------------------------
def test_copy_host_to_host_and_layout_checks(buf):
    a, b = placed(buf, "f32", (4,), 0, "a"), placed(buf, "f32", (4,), 64, "b")
    tensor_set(a, np.arange(4, dtype=np.float32))
    tensor_copy(a, b)
    np.testing.assert_array_equal(tensor_get(b), [0, 1, 2, 3])
    tensor_copy(a, a)
    c = placed(buf, "f32", (2, 2), 128, "c")
    with pytest.raises(LayoutError, match="different layouts: 'a' is f32 ne=\\[4, 1, 1, 1\\].*'c'"):
        tensor_copy(a, c)
    with pytest.raises(NotAllocatedError, match="'u' is not allocated"):
        tensor_copy(a, Tensor("f32", (4,), name="u"))


def test_copy_through_non_host_buffers():
    dev = minimal_device()
    remote = dev.buffer_type.alloc_buffer(256)
    host = CPU_BUFT.alloc_buffer(256)
    h1, h2 = placed(host, "f32", (4,), 0, "h1"), placed(host, "f32", (4,), 32, "h2")
    r1, r2 = placed(remote, "f32", (4,), 0, "r1"), placed(remote, "f32", (4,), 32, "r2")
    tensor_set(h1, np.float32([1, 2, 3, 4]))
    tensor_copy(h1, r1)  # host source: tensor_set on the destination
    tensor_copy(r1, r2)  # neither host: staged through host memory
    tensor_copy(r2, h2)  # host destination: tensor_get into it
    np.testing.assert_array_equal(tensor_get(h2), [1, 2, 3, 4])
    assert bytes(remote.mem[32:48]) == np.float32([1, 2, 3, 4]).tobytes()


def test_copy_from_an_allocating_context_counts_as_host(buf):
    ctx = Context()
    src = ctx.tensor_from_numpy(np.float32([5, 6]), name="ctx")
    dst = placed(buf, "f32", (2,))
    tensor_copy(src, dst)
    assert tensor_get(dst).tolist() == [5, 6]


def test_copy_into_read_only_buffer_is_refused():
    mapped = cpu.CPU_REG.device(0).buffer_from_host_ptr(bytes(64))
    src_buf = CPU_BUFT.alloc_buffer(64)
    src, dst = placed(src_buf, "f32", (4,), 0, "s"), placed(mapped, "f32", (4,), 0, "d")
    with pytest.raises(BufferUseError, match="read-only.*'d'"):
        tensor_copy(src, dst)


def test_copy_async_prefers_the_backend_then_falls_back(buf):
    events = []

    class Tracing(cpu.CpuBackend):
        accept = False

        def cpy_tensor_async(self, src_backend, dst_backend, src, dst):
            events.append("async")
            return self.accept

        def synchronize(self):
            events.append("sync")

    be = Tracing(cpu.CPU_REG.device(0))
    a, b = placed(buf, "f32", (2,), 0, "a"), placed(buf, "f32", (2,), 32, "b")
    tensor_set(a, np.float32([3, 4]))
    tensor_copy_async(be, be, a, b)
    assert events == ["async", "sync", "sync"] and tensor_get(b).tolist() == [3, 4]
    events.clear()
    be.accept = True
    tensor_copy_async(be, be, a, b)
    assert events == ["async"]


def test_host_bytes_is_zero_copy(buf):
    t = placed(buf, "f32", (4,), 64)
    view = host_bytes(t)
    view[0:4] = np.float32(2.5).tobytes()
    assert tensor_get(t)[0] == 2.5
    assert host_bytes(placed(minimal_device().buffer_type.alloc_buffer(64), "f32", (4,))) is None


# ----- a model of the bytes --------------------------------------------------------------------
@given(ops=st.lists(st.tuples(st.integers(-4, 40), st.integers(0, 40), st.integers(0, 255)), max_size=12))
def test_writes_match_a_byte_model_and_refusals_change_nothing(ops):
    buf = CPU_BUFT.alloc_buffer(64)
    buf.clear(0)
    t = placed(buf, "i8", (32,), offset=16)
    model = bytearray(32)
    for offset, size, value in ops:
        data = bytes([value]) * size
        if offset >= 0 and offset + size <= 32:
            tensor_set(t, data, offset=offset, size=size)
            model[offset: offset + size] = data
        elif size:
            with pytest.raises(OutOfBoundsError):
                tensor_set(t, data, offset=offset, size=size)
        assert bytes(buf.host_array[16:48]) == bytes(model)
        assert not buf.host_array[:16].any() and not buf.host_array[48:].any()


def test_concurrent_writes_to_disjoint_tensors(buf):
    tensors = [placed(buf, "i32", (16,), offset=64 * i, name=f"t{i}") for i in range(8)]

    torn = []

    def writer(i):
        for k in range(50):
            tensor_set(tensors[i], np.full(16, i * 1000 + k, np.int32))
            if not (tensor_get(tensors[i]) == i * 1000 + k).all():
                torn.append((i, k))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert torn == []
    assert [int(tensor_get(t)[0]) for t in tensors] == [i * 1000 + 49 for i in range(8)]
