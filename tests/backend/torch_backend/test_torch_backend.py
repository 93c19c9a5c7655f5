"""The torch backend's devices, buffers, zero-copy views, dequantization cache, registry entry and scheduler use."""

import numpy as np
import pytest

pytest.importorskip("torch.cuda")  # see test_torch_ops.py for why not "torch"

import torch  # noqa: E402

import pyggml as gg  # noqa: E402
from pyggml import ops  # noqa: E402
from pyggml.alloc import alloc_ctx_tensors_from_buft  # noqa: E402
from pyggml.backend import (BufferUsage, DeviceType, Status, init_by_name, load_all, registry, tensor_alloc,  # noqa: E402
                            tensor_copy, tensor_get, tensor_memset, tensor_set)
from pyggml.backend import torch as torch_backend  # noqa: E402
from pyggml.backend.torch.backend import OFFLOAD_MIN_BATCH, TorchDevice  # noqa: E402
from pyggml.core.context import Context  # noqa: E402
from pyggml.core.graph import Graph  # noqa: E402
from pyggml.core.tensor import Op  # noqa: E402
from pyggml.core.types import GGMLType as G  # noqa: E402
from pyggml.errors import BackendError, BufferUseError, LayoutError, UnsupportedOpError  # noqa: E402
from pyggml.sched import Scheduler  # noqa: E402


@pytest.fixture
def backend():
    b = init_by_name("TORCH_CPU")
    yield b
    b.free()


def placed(buffer, *tensors):
    """Place tensors one after another (32-byte aligned) in buffer."""
    offset = 0
    for t in tensors:
        tensor_alloc(buffer, t, buffer.base + offset)
        offset += -(-t.nbytes // 32) * 32
    return tensors


# ----- registry and device ----------------------------------------------------------------------
def test_importing_registers_the_torch_reg_and_its_cpu_device():
    reg = registry.reg_by_name("torch")
    assert reg is torch_backend.TORCH_REG and reg.device(0).name == "TORCH_CPU"
    assert [d.name for d in reg.devices[1:]] == [f"CUDA{i}" for i in range(torch.cuda.device_count())]
    assert registry.device_by_name("torch_cpu") is reg.device(0)
    assert torch_backend.score() == 1 and torch_backend.init() is reg
    assert reg in load_all() or reg in registry.backends()  # the entry point resolves to the same reg


def test_device_props_and_caps():
    dev = registry.device_by_name("TORCH_CPU")
    props = dev.props()
    assert props.type == DeviceType.CPU and props.caps.async_ and props.caps.events
    assert props.caps.buffer_from_host_ptr and not props.caps.host_buffer
    free, total = dev.memory()
    assert 0 < free <= total
    assert registry.init_best().name == "CPU" or registry.init_best().device.type == DeviceType.GPU


def test_proc_addresses():
    reg = torch_backend.TORCH_REG
    assert reg.get_proc_address("ggml_backend_get_features")()[0] == ("TORCH", torch.__version__)
    assert reg.get_proc_address("to_torch") is torch_backend.to_torch
    assert reg.get_proc_address("set_n_threads") is None


def test_supports_buft_is_honest(backend):
    cpu = init_by_name("CPU")
    assert backend.supports_buft(backend.default_buffer_type)
    assert not backend.supports_buft(cpu.default_buffer_type)
    assert not cpu.supports_buft(backend.default_buffer_type)
    assert not backend.default_buffer_type.is_host


def test_offload_op_only_for_big_batches_on_gpus():
    dev = TorchDevice(torch.device("cpu"))
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(G.F32, (64, 64))
    big, small = (ops.mul_mat(ctx, w, ctx.new_tensor(G.F32, (64, n))) for n in (OFFLOAD_MIN_BATCH, 8))
    rows = ops.get_rows(ctx, w, ctx.new_tensor(G.I32, (64,)))
    assert not dev.offload_op(big)  # TORCH_CPU never asks for work
    dev.type = DeviceType.GPU       # the rule a CUDA device applies
    assert dev.offload_op(big) and not dev.offload_op(small) and not dev.offload_op(rows)


# ----- buffers and tensor data ------------------------------------------------------------------------
def test_buffer_is_a_torch_storage_with_aligned_base(backend):
    buf = backend.alloc_buffer(1000)
    assert buf.storage.dtype == torch.uint8 and buf.storage.numel() == 1000
    assert buf.base == buf.storage.data_ptr() and buf.base % backend.alignment == 0
    assert backend.alloc_buffer(0).base is None
    buf.clear(7)
    assert torch.all(buf.storage == 7)
    buf.free()
    with pytest.raises(gg.errors.BufferFreedError):
        buf.clear(0)


def test_set_get_memset_and_copies(backend):
    ctx = Context(no_alloc=True)
    a, b = ctx.new_tensor(G.F32, (5, 3), "a"), ctx.new_tensor(G.F32, (5, 3), "b")
    buf = backend.alloc_buffer(256)
    placed(buf, a, b)
    values = np.arange(15, dtype=np.float32).reshape(3, 5)
    tensor_set(a, values)
    np.testing.assert_array_equal(tensor_get(a), values)
    tensor_copy(a, b)                                    # torch -> torch: the buffer's cpy_tensor
    np.testing.assert_array_equal(tensor_get(b), values)
    tensor_memset(b, 0, 4, 8)
    assert tensor_get(b).reshape(-1)[1:3].tolist() == [0, 0]
    host = Context().tensor_from_numpy(values * 2, name="host")
    tensor_copy(host, a)                                  # host -> torch
    np.testing.assert_array_equal(tensor_get(a), values * 2)
    h = Context(no_alloc=True).new_tensor(G.F32, (5, 3), "h")
    placed(init_by_name("CPU").alloc_buffer(64), h)
    tensor_copy(a, h)                                     # torch -> host
    np.testing.assert_array_equal(h.numpy(), values * 2)


def test_buffer_from_host_ptr_is_zero_copy_and_read_only_stays_read_only():
    dev = registry.device_by_name("TORCH_CPU")
    memory = bytearray(np.arange(8, dtype=np.float32).tobytes())
    buf = dev.buffer_from_host_ptr(memory)
    t = Context(no_alloc=True).new_tensor(G.F32, (8,), "t")
    tensor_alloc(buf, t, buf.base)
    memory[0:4] = np.float32(42).tobytes()
    assert tensor_get(t)[0] == 42
    ro = dev.buffer_from_host_ptr(bytes(32))
    t2 = Context(no_alloc=True).new_tensor(G.F32, (8,), "t2")
    tensor_alloc(ro, t2, ro.base)
    with pytest.raises(BufferUseError, match="read-only"):
        tensor_set(t2, np.ones(8, np.float32))


# ----- zero-copy views and interop -----------------------------------------------------------------
def test_to_torch_views_share_memory_and_keep_strides(backend):
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(G.F16, (4, 3, 2), "a")
    tensor_alloc(buf := backend.alloc_buffer(a.nbytes), a, buf.base)
    tensor_set(a, np.arange(24, dtype=np.float16).reshape(2, 3, 4))
    view = torch_backend.to_torch(a)
    assert view.dtype == torch.float16 and view.shape == (1, 2, 3, 4) and view.data_ptr() == a.data
    perm = ops.permute(ctx, a, 1, 0, 2, 3)
    gg.backend.view_init(perm)
    pv = torch_backend.to_torch(perm)
    assert [s * 2 for s in pv.stride()] == perm.nb[::-1] and pv.data_ptr() == a.data
    view[0, 0, 0, 0] = 100                              # writes through torch are ggml-visible
    assert tensor_get(a)[0, 0, 0] == 100


def test_to_torch_of_host_tensors_goes_through_dlpack_without_copying():
    ctx = Context()
    t = ctx.tensor_from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3), name="t")
    bf = ctx.new_tensor(G.BF16, (4,), "bf")
    tt = torch_backend.to_torch(t)
    t.numpy()[1, 2] = -1
    assert tt[0, 0, 1, 2] == -1 and tt.data_ptr() == t.data
    assert torch_backend.to_torch(bf).dtype == torch.bfloat16


def test_misaligned_views_are_refused(backend):
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor(G.I8, (16,), "a")
    tensor_alloc(buf := backend.alloc_buffer(64), a, buf.base)
    odd = ops.view_1d(ctx, a, 2, 1)
    gg.backend.view_init(odd)
    odd.type, odd.nb = G.F16, [2, 4, 4, 4]  # an F16 view at an odd byte: torch cannot view it
    with pytest.raises(LayoutError, match="not aligned"):
        torch_backend.to_torch(odd)


# ----- dequantization cache ------------------------------------------------------------------------
def quantized_matmul(backend, w_values):
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor(G.Q8_0, (64, 4), "w")
    x = ctx.new_tensor(G.F32, (64, 2), "x")
    y = ops.mul_mat(ctx, w, x)
    wbuf = alloc_ctx_tensors_from_buft(_only(ctx, w), backend.default_buffer_type)
    wbuf.usage = BufferUsage.WEIGHTS
    tensor_set(w, gg.core.types.from_float(G.Q8_0, w_values))
    buf = backend.alloc_buffer(4096)
    placed(buf, x, y)
    tensor_set(x, np.ones((2, 64), np.float32))
    return w, x, y, wbuf


def _only(ctx, t):
    only = Context(no_alloc=True)
    only.tensors = [t]
    return only


def test_quantized_weights_are_dequantized_once_until_written(backend):
    w_values = np.tile(np.linspace(-0.5, 1, 64, dtype=np.float32), (4, 1)) * np.arange(1, 5)[:, None]
    w, x, y, wbuf = quantized_matmul(backend, w_values)
    stored = gg.core.types.to_float(G.Q8_0, gg.core.types.from_float(G.Q8_0, w_values))  # what the bytes hold
    graph = Graph().build_forward_expand(y)
    backend.graph_compute(graph)
    first = wbuf.dequantized(w)
    backend.graph_compute(graph)
    assert wbuf.dequantized(w) is first                 # cached: the buffer was not written
    np.testing.assert_allclose(tensor_get(y), np.tile(stored.sum(1), (2, 1)), rtol=1e-5)  # rows 16, 32, 48, 64
    tensor_set(w, gg.core.types.from_float(G.Q8_0, w_values * 0 + 0.5))
    backend.graph_compute(graph)
    assert wbuf.dequantized(w) is not first             # the write invalidated it
    np.testing.assert_allclose(tensor_get(y), np.full((2, 4), 32.0), rtol=1e-2)


# ----- compute errors ------------------------------------------------------------------------------
def test_unsupported_node_raises_before_anything_is_queued(backend):
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor(G.F32, (8, 3), "x")
    y = ops.roll(ctx, x, 1, 0, 0, 0)
    placed(backend.alloc_buffer(256), x, y)
    with pytest.raises(UnsupportedOpError, match="ROLL"):
        backend.graph_compute(Graph().build_forward_expand(y))
    backend.synchronize()


def test_tensors_outside_torch_buffers_are_refused(backend):
    ctx = Context()
    y = ops.relu(ctx, ctx.new_tensor(G.F32, (4,), "x"))
    with pytest.raises(BackendError, match="not in a TORCH_CPU buffer"):
        backend.graph_compute(Graph().build_forward_expand(y))


# ----- under the scheduler -------------------------------------------------------------------------
def test_scheduler_splits_between_torch_and_cpu(backend):
    rng = np.random.default_rng(0)
    x_val, w1, w2 = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((8, 64), (128, 64), (64, 128)))
    cpu = init_by_name("CPU")
    weights = []
    for arr, b in ((w1, backend), (w2, cpu)):
        ctx = Context(no_alloc=True)
        w = ctx.new_tensor_2d(G.F32, arr.shape[1], arr.shape[0], "w")
        alloc_ctx_tensors_from_buft(ctx, b.default_buffer_type).usage = BufferUsage.WEIGHTS
        tensor_set(w, arr)
        weights.append(w)
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_2d(G.F32, 64, 8, "x").set_input()
    r1 = ops.relu(ctx, ops.mul_mat(ctx, weights[0], x))
    out = ops.relu(ctx, ops.mul_mat(ctx, weights[1], r1)).set_output()
    graph = Graph().build_forward_expand(out)
    sched = Scheduler([backend, cpu], parallel=True)   # parallel: the events path (4 copies)
    assert sched.alloc_graph(graph)
    assert sched.n_splits == 2
    assert sched.get_tensor_backend(r1) is backend and sched.get_tensor_backend(out) is cpu
    for scale in (1.0, -2.0, 0.5):
        tensor_set(x, x_val * scale)
        assert sched.graph_compute(graph) == Status.SUCCESS
        expected = np.maximum(np.maximum(x_val * scale @ w1.T, 0) @ w2.T, 0)
        np.testing.assert_allclose(tensor_get(out), expected, rtol=1e-5, atol=3e-5)
    sched.free()
    assert Op.MUL_MAT in {n.op for n in graph.nodes}
