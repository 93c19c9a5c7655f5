"""The NumPy CPU backend shell: buffer types, zero-copy host buffers, device, reg, compute, plans, abort."""

import mmap
import os

import numpy as np
import pytest

from pyggml.alloc import alloc_ctx_tensors
from pyggml.backend import cpu, registry
from pyggml.backend.base import SIZE_MAX, DeviceCaps, DeviceType, Status
from pyggml.backend.cpu import kernels
from pyggml.backend.tensor_io import tensor_alloc, tensor_get, tensor_set
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import Op, Tensor, TensorFlag
from pyggml.errors import BackendError, BufferUseError, BufferFreedError, UnsupportedOpError

DEVICE = cpu.CPU_REG.device(0)


@pytest.fixture
def backend():
    return cpu.init()


def small_graph(backend):
    """y = (a + b) * b over 8 floats, allocated in one CPU buffer; a = 0..7, b = 2."""
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor("f32", (8,), "a").set_input()
    b = ctx.new_tensor("f32", (8,), "b").set_input()
    s = ops.add(ctx, a, b)
    y = ops.mul(ctx, s, b)
    g = Graph().build_forward_expand(y)
    buf = alloc_ctx_tensors(ctx, backend)
    tensor_set(a, np.arange(8, dtype=np.float32))
    tensor_set(b, np.full(8, 2, np.float32))
    tensor_set(s, np.full(8, -1, np.float32))
    tensor_set(y, np.full(8, -1, np.float32))
    return g, buf, s, y


EXPECTED = (np.arange(8) + 2) * 2


# ----- buffer types and buffers ------------------------------------------------------------------
def test_cpu_buffer_type():
    buft = DEVICE.buffer_type
    assert (buft.name, buft.alignment, buft.is_host, buft.max_size) == ("CPU", 32, True, SIZE_MAX)
    assert buft.device is DEVICE and buft.alloc_size(Tensor("f32", (3,))) == 12
    buf = buft.alloc_buffer(100)
    assert buf.base % 32 == 0 and buf.base == buf.host_array.ctypes.data and buf.host_array.nbytes == 100
    buf.clear(3)
    assert (buf.host_array == 3).all()
    t = Tensor("f32", (4,), name="t")
    tensor_alloc(buf, t, buf.base + 32)
    t.numpy()[:] = 1.5  # kernels write through the zero-copy view
    assert tensor_get(t).tolist() == [1.5] * 4
    buf.free()
    with pytest.raises(BufferFreedError):
        t.numpy()


def test_mapped_file_is_zero_copy_and_read_only(tmp_path):
    path = tmp_path / "weights.bin"
    values = np.arange(64, dtype=np.float32)
    path.write_bytes(b"HEAD" * 8 + values.tobytes())
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    buf = DEVICE.buffer_from_host_ptr(mm, os.path.getsize(path), 1 << 20)
    assert buf.name == "CPU_Mapped" and buf.size == 32 + 256 and buf.is_host and buf.read_only
    assert buf.base == np.frombuffer(mm, np.uint8).ctypes.data  # the mapping itself, not a copy
    w = Tensor("f32", (16, 4), name="w")
    tensor_alloc(buf, w, buf.base + 32)
    np.testing.assert_array_equal(tensor_get(w), values.reshape(4, 16))
    assert not w.numpy().flags.writeable
    with pytest.raises(BufferUseError, match="read-only; tensor 'w' cannot be written"):
        tensor_set(w, np.zeros((4, 16), np.float32))
    buf.free()
    del w
    mm.close()


def test_writable_mapping_sees_writes(tmp_path):
    path = tmp_path / "kv.bin"
    path.write_bytes(bytes(64))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0)
    buf = DEVICE.buffer_from_host_ptr(mm, 64)
    t = Tensor("i32", (4,), name="t")
    tensor_alloc(buf, t, buf.base + 16)
    tensor_set(t, np.array([1, 2, 3, 4], np.int32))
    assert np.frombuffer(mm, np.int32)[4:8].tolist() == [1, 2, 3, 4]
    buf.free()
    del t
    mm.close()


@pytest.mark.parametrize("make", [bytearray, lambda n: np.zeros(n, np.uint8), bytes])
def test_buffer_from_bytes_like_objects(make):
    obj = make(64)
    buf = DEVICE.buffer_from_host_ptr(obj, 48)
    assert buf.size == 48 and buf.base == np.frombuffer(obj, np.uint8).ctypes.data
    assert buf.read_only == isinstance(obj, bytes)
    if not buf.read_only:
        t = Tensor("i8", (4,), name="t")
        tensor_alloc(buf, t, buf.base + 8)
        tensor_set(t, np.array([9, 8, 7, 6], np.int8))
        assert bytes(obj[8:12]) == bytes([9, 8, 7, 6])


# ----- device and reg ----------------------------------------------------------------------------
def test_device():
    assert DEVICE.name == "CPU" and DEVICE.type == DeviceType.CPU and DEVICE.reg is cpu.CPU_REG
    with open("/proc/cpuinfo") as f:
        models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    if models:
        assert DEVICE.description == models[0]
    free, total = DEVICE.memory()
    assert total == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") and free == total
    props = DEVICE.props()
    assert props.caps == DeviceCaps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False)
    assert DEVICE.host_buffer_type is None and DEVICE.event_new() is None
    assert DEVICE.supports_buft(DEVICE.buffer_type)
    assert not DEVICE.supports_buft(type("Remote", (cpu.CpuBufferType,), {"is_host": False})())


def test_reg_and_proc_addresses(backend):
    reg = cpu.CPU_REG
    assert reg.name == "CPU" and reg.device_count == 1
    assert reg.get_proc_address("set_n_threads") is reg.get_proc_address("ggml_backend_set_n_threads")
    reg.get_proc_address("set_n_threads")(backend, 2)
    assert backend.n_threads == 2
    with pytest.raises(BackendError, match="positive"):
        cpu.set_n_threads(backend, 0)
    fake = registry.device_by_name("CPU").init_backend()
    fake.guid = bytes(16)
    assert not cpu.is_cpu(fake) and cpu.is_cpu(backend)
    with pytest.raises(BackendError, match="is not a CPU backend"):
        cpu.set_abort_callback(object(), None)
    assert ("NUMPY", np.__version__) in reg.get_proc_address("get_features")()
    assert reg.get_proc_address("no_such_function") is None


def test_backend_identity(backend):
    assert backend.name == "CPU" and backend.guid.hex() == "aa67c74396e6a38ae3afea9236bcfc89"
    assert backend.default_buffer_type is DEVICE.buffer_type and backend.n_threads == 4


# ----- compute -----------------------------------------------------------------------------------
def test_graph_compute(backend):
    g, _, _, y = small_graph(backend)
    assert backend.graph_compute(g) == Status.SUCCESS
    np.testing.assert_array_equal(tensor_get(y), EXPECTED)


def test_supports_op_is_the_kernels_truth(backend):
    g, *_ = small_graph(backend)
    assert all(backend.supports_op(n) for n in g.nodes)
    assert not backend.supports_op(Tensor("f32", (4,), op=Op.WIN_PART))
    assert backend.supports_op(Tensor("f32", (4,), op=Op.RESHAPE))


def test_nodes_without_compute_flag_are_skipped(backend):
    g, _, s, y = small_graph(backend)
    s.flags &= ~TensorFlag.COMPUTE
    backend.graph_compute(g)
    assert tensor_get(s).tolist() == [-1] * 8
    np.testing.assert_array_equal(tensor_get(y), [-2] * 8)  # y = s * b read s as it was


def test_abort_callback_stops_after_the_current_node(backend):
    g, _, s, y = small_graph(backend)
    calls = []
    cpu.CPU_REG.get_proc_address("set_abort_callback")(backend, lambda: calls.append(1) or True)
    assert backend.graph_compute(g) == Status.ABORTED
    assert calls == [1]
    np.testing.assert_array_equal(tensor_get(s), np.arange(8) + 2)
    assert tensor_get(y).tolist() == [-1] * 8


def test_freed_buffer_fails_before_anything_runs(backend):
    g, buf, s, y = small_graph(backend)
    other = Context(no_alloc=True)
    c = other.new_tensor("f32", (8,), "c")
    dead = alloc_ctx_tensors(other, backend)
    z = ops.add(Context(no_alloc=True), y, c)
    g.build_forward_expand(z)
    z_buf = backend.alloc_buffer(32)
    tensor_alloc(z_buf, z, z_buf.base)
    dead.free()
    with pytest.raises(BufferFreedError, match="'c'"):
        backend.graph_compute(g)
    assert tensor_get(s).tolist() == [-1] * 8


def test_unsupported_op_fails_before_anything_runs(backend):
    g, buf, s, y = small_graph(backend)
    odd = Tensor("f32", (8,), op=Op.WIN_PART, name="odd")
    odd.src[0] = y
    odd_buf = backend.alloc_buffer(32)
    tensor_alloc(odd_buf, odd, odd_buf.base)
    g.build_forward_expand(odd)
    with pytest.raises(UnsupportedOpError, match="WIN_PART.*'odd'"):
        backend.graph_compute(g)
    assert tensor_get(s).tolist() == [-1] * 8


# ----- plans -------------------------------------------------------------------------------------
def test_plan_is_looked_up_once(backend, monkeypatch):
    g, _, s, y = small_graph(backend)
    plan = backend.graph_plan_create(g)
    assert [node for node, _ in plan.steps] == g.nodes
    monkeypatch.delitem(kernels.KERNELS, Op.MUL)  # the plan keeps the kernel it found
    assert backend.graph_plan_compute(plan) == Status.SUCCESS
    assert backend.graph_plan_compute(plan) == Status.SUCCESS
    np.testing.assert_array_equal(tensor_get(y), EXPECTED)
    with pytest.raises(UnsupportedOpError, match="MUL"):
        backend.graph_compute(g)


def test_plan_binds_again_when_the_graph_is_placed_anew(backend):
    """A plan's calls hold views of the memory bound; moving the tensors to another buffer re-binds them."""
    g, old, s, y = small_graph(backend)
    plan = backend.graph_plan_create(g)
    backend.graph_plan_compute(plan)
    a, b = g.nodes[0].src[0], g.nodes[0].src[1]
    new = backend.alloc_buffer(4 * 32)
    for i, t in enumerate((a, b, s, y)):
        t.buffer = t.data = None
        tensor_alloc(new, t, new.base + 32 * i)
    tensor_set(a, np.arange(8, dtype=np.float32) + 1)
    tensor_set(b, np.full(8, 3, np.float32))
    old.free()
    assert backend.graph_plan_compute(plan) == Status.SUCCESS
    np.testing.assert_array_equal(tensor_get(y), (np.arange(8) + 4) * 3)


def test_plan_refuses_a_freed_buffer(backend):
    g, buf, *_ = small_graph(backend)
    plan = backend.graph_plan_create(g)
    buf.free()
    with pytest.raises(BufferFreedError):
        backend.graph_plan_compute(plan)


def test_plan_update_and_free(backend):
    g, _, s, y = small_graph(backend)
    plan = backend.graph_plan_create(g.view(0, 1))
    backend.graph_plan_compute(plan)
    assert tensor_get(y).tolist() == [-1] * 8
    backend.graph_plan_update(plan, g)
    backend.graph_plan_compute(plan)
    np.testing.assert_array_equal(tensor_get(y), EXPECTED)
    backend.graph_plan_free(plan)
    with pytest.raises(BackendError, match="plan that was freed"):
        backend.graph_plan_compute(plan)


def test_freed_backend_refuses_work(backend):
    g, *_ = small_graph(backend)
    backend.free()
    with pytest.raises(BackendError, match="after free"):
        backend.graph_compute(g)


def test_freed_buffer_drops_its_shared_views(backend):
    from pyggml.core.tensor import host_ndarray

    g, buf, s, y = small_graph(backend)
    host_ndarray(y)
    assert buf.host_views
    buf.free()
    assert not buf.host_views


@pytest.mark.parametrize("preset", [None, "30"])
def test_openblas_idle_workers_sleep_soon_unless_the_user_says_otherwise(preset):
    """Importing pyggml before NumPy shortens OpenBLAS's idle spin (its workers otherwise took the cores from
    the compiled kernels' threads for ~0.1 s after each prompt); a value the user set is kept."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if preset is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = preset
    code = "import os, pyggml; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (preset or "22")


def test_clearing_a_large_buffer_hands_its_pages_back_and_reads_zeros():
    """A KV cache is cleared when made: its own memory is zeroed by MADV_DONTNEED (no page touched until
    used); a buffer over borrowed memory (a mapped file, a user's array) is filled instead."""
    import sys

    from pyggml.backend.cpu.buffer import CLEAR_BY_PAGES

    cpu = registry.init_by_name("CPU")
    buf = cpu.default_buffer_type.alloc_buffer(4 * CLEAR_BY_PAGES + 123)
    memory = buf.host_array
    memory.fill(7)
    buf.clear(0)
    if sys.platform.startswith("linux"):
        assert _mincore_pages(memory) <= 2  # the partial pages at the ends at most (before anything reads it)
    assert not memory.any()
    borrowed = np.full(2 * CLEAR_BY_PAGES, 5, np.uint8)
    wrapped = cpu.device.buffer_from_host_ptr(memoryview(borrowed), borrowed.nbytes, borrowed.nbytes)
    wrapped.clear(0)
    assert not borrowed.any()
    buf.clear(3)
    assert (memory == 3).all()


def _mincore_pages(arr) -> int:
    """How many of arr's pages are resident (mincore(2))."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    start = arr.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    length = arr.ctypes.data + arr.nbytes - start
    vec = (ctypes.c_ubyte * (-(-length // mmap.PAGESIZE)))()
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0
    return sum(b & 1 for b in vec)
