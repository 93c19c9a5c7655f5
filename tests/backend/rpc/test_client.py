"""pyggml's RPC client against ggml's own RPC server and pyggml's: every buffer and tensor call, the
registry entry, graph compute of the op cases (equal to the local CPU backend by ggml's NMSE), the cache."""


import numpy as np
import pytest

import pyggml as gg
from pyggml import ops
from pyggml.backend import BufferUsage, DeviceType, Status, graph_copy, rpc, tensor_get, tensor_set
from pyggml.backend.rpc import protocol as P
from pyggml.core.tensor import Tensor
from pyggml.errors import RPCError
from tests.support import opcheck
from tests.support.all_opcases import all_cases

F32 = gg.GGMLType.F32


def alloc(dev, *tensors):
    """One buffer of dev holding the tensors, placed at aligned offsets."""
    align = dev.buffer_type.alignment
    offsets, size = [], 0
    for t in tensors:
        offsets.append(size)
        size += -(-t.nbytes // align) * align
    buf = dev.buffer_type.alloc_buffer(size)
    for t, off in zip(tensors, offsets, strict=True):
        gg.backend.tensor_alloc(buf, t, buf.base + off)
    return buf


def test_registry_entry_and_device(device, endpoint):
    assert device in rpc.RPC_REG.devices and gg.backend.device_by_name(device.name) is device
    assert rpc.RPC_REG.get_proc_address("rpc_add_server") is not None
    assert rpc.add_server(endpoint) == [device]  # once per endpoint, as ggml
    assert device.type == DeviceType.GPU and device.description == endpoint
    free, total = device.memory()
    assert 0 < free <= total
    buft = device.buffer_type
    assert buft.alignment == 32 and buft.max_size == 2**64 - 1  # ggml's and pyggml's CPU buffer types
    assert device.supports_buft(buft) and not device.supports_buft(gg.backend.cpu.CPU_REG.device(0).buffer_type)
    backend = device.init_backend()
    assert backend.guid == P.RPC_GUID and backend.name == f"RPC0[{endpoint}]"
    assert rpc.connection(endpoint).server_version == (4, 0, 1)


def test_buffer_and_tensor_calls(device):
    ctx = gg.Context(no_alloc=True)
    a = ctx.new_tensor(F32, (8, 4), name="a")
    b = ctx.new_tensor(F32, (8, 4), name="b")
    buf = alloc(device, a, b)
    assert buf.size >= 2 * a.nbytes and buf.base is not None
    assert buf.remote_base % 32 == 0
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    tensor_set(a, x)
    np.testing.assert_array_equal(tensor_get(a), x)
    tensor_set(a, np.full(3, -1, np.float32), offset=8)  # a partial write at a byte offset
    assert tensor_get(a, 4, 20).view(np.float32).tolist() == [1, -1, -1, -1, 5]
    assert buf.cpy_tensor(a, b)  # COPY_TENSOR: same server
    np.testing.assert_array_equal(tensor_get(b), tensor_get(a))
    buf.clear(0)
    assert not tensor_get(a).any() and not tensor_get(b).any()
    buf.usage = BufferUsage.WEIGHTS
    buf.free()
    with pytest.raises(gg.errors.BufferFreedError):
        tensor_get(a)


def test_quantized_tensor_asks_the_server(device):
    """ggml's client asks GET_ALLOC_SIZE and INIT_TENSOR for quantized rows not a multiple of 512."""
    ctx = gg.Context(no_alloc=True)
    q = ctx.new_tensor(gg.GGMLType.Q4_0, (64, 3), name="q")
    assert device.buffer_type.alloc_size(q) == q.nbytes  # the CPU servers add no padding
    buf = alloc(device, q)
    raw = np.random.default_rng(0).integers(0, 256, q.nbytes, dtype=np.uint8)
    tensor_set(q, raw)
    np.testing.assert_array_equal(tensor_get(q, 0, q.nbytes), raw)
    buf.free()


def test_alloc_failure_gives_allocation_error(device):
    with pytest.raises(gg.errors.AllocationError):
        device.buffer_type.alloc_buffer(1 << 60)
    assert device.memory()[1] > 0  # the connection survives a refused allocation


def test_graph_compute_small(device):
    ctx = gg.Context(no_alloc=True)
    w = ctx.new_tensor(F32, (64, 32), name="w")
    x = ctx.new_tensor(F32, (64, 8), name="x")
    y = ops.soft_max(ctx, ops.relu(ctx, ops.mul_mat(ctx, w, x)))
    graph = gg.Graph().build_forward_expand(y)
    backend = device.init_backend()
    buf = gg.alloc.alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(1)
    W, X = rng.standard_normal((32, 64), np.float32), rng.standard_normal((8, 64), np.float32)
    tensor_set(w, W)
    tensor_set(x, X)
    assert backend.graph_compute(graph) == Status.SUCCESS
    z = np.maximum(X @ W.T, 0)
    expected = np.exp(z - z.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    assert opcheck.nmse(expected, tensor_get(y)) < 1e-10
    buf.free()


def test_graph_with_a_local_tensor_is_refused(device):
    ctx = gg.Context(no_alloc=False)  # host memory, not the server's
    a = ctx.new_tensor(F32, (4,), name="host_a")
    graph = gg.Graph().build_forward_expand(ops.relu(ctx, a))
    with pytest.raises(gg.errors.BackendError, match="not in a live buffer"):
        device.init_backend().graph_compute(graph)


def representative_cases():
    """Every third op case of every family: matmul (plain and quantized), norms, attention (soft_max, rope,
    flash_attn_ext), unary/glu, elementwise, reduce, layout (views, cpy, get_rows, set_rows) and conv."""
    return all_cases(step=3)


def _compare_with_local(backend, case):
    out, graph = opcheck.prepare(case, 0)
    copy = graph_copy(backend, graph)  # inputs travel with SET_TENSOR
    try:
        assert backend.graph_compute(copy.graph) == Status.SUCCESS
        remote_out = copy.graph.nodes[graph.nodes.index(out)]
        raw = tensor_get(remote_out, 0, remote_out.nbytes)
    finally:
        copy.free()
    expected = opcheck.values(opcheck.compute(out, graph))
    host = gg.Context().add(Tensor(out.type, out.ne, out.nb))
    arena = host.memory_owner()
    start = host.data - arena.base
    arena.host_array[start:start + len(raw)] = raw  # the raw bytes, strides included
    actual = opcheck.values(host)
    inf = np.isinf(expected)
    assert np.array_equal(inf, np.isinf(actual)) and np.array_equal(expected[inf], actual[inf])
    return opcheck.nmse(expected[~inf], actual[~inf])


@pytest.mark.parametrize("case", representative_cases(), ids=lambda c: c.name)
def test_op_cases_on_pyggml_server_equal_local(pyggml_server, case):
    (dev,) = rpc.add_server(pyggml_server.endpoint, timeout=20.0)
    assert _compare_with_local(dev.init_backend(), case) == 0.0  # same kernels, same bits


def test_op_cases_on_ggml_server_within_nmse(ggml_endpoint):
    """One batch: ggml's server computes each case; a case ggml's CPU cannot run would abort it (then it is
    reported, and the server restarted is not needed: the check stops)."""
    (dev,) = rpc.add_server(ggml_endpoint, timeout=20.0)
    backend = dev.init_backend()
    supported = ggml_supported(representative_cases())
    assert len(supported) >= 40
    failures = []
    for case in supported:
        err = _compare_with_local(backend, case)
        if not err <= case.tol:
            failures.append(f"{case.name}: NMSE {err:.3g} > {case.tol:g}")
    assert not failures, failures


def ggml_supported(cases):
    """The cases whose every node ggml's CPU backend supports (asked in-process, without computing)."""
    from tests.support.ggml_peer import GGMLPeer, PreparedGraph
    from pyggml.errors import UnsupportedOpError

    kept = []
    with GGMLPeer(1) as peer:
        for case in cases:
            _, graph = opcheck.prepare(case, 0)
            try:
                PreparedGraph(peer, graph).close()
            except UnsupportedOpError:
                continue
            kept.append(case)
    return kept


def test_set_tensor_by_hash_uses_the_server_cache(device, endpoint):
    """Above 10 MiB the client offers the FNV-1a hash first; the second identical upload sends no data."""
    conn = rpc.connection(endpoint)
    ctx = gg.Context(no_alloc=True)
    n = (P.HASH_THRESHOLD // 4) + 1024
    t = ctx.new_tensor(F32, (n,), name="big")
    buf = alloc(device, t)
    data = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    before = conn.bytes_sent
    tensor_set(t, data)
    first = conn.bytes_sent - before
    assert first > t.nbytes  # cache miss: hash request, then the data
    buf.clear(0)
    before = conn.bytes_sent
    tensor_set(t, data)
    second = conn.bytes_sent - before
    assert second < 1024  # cache hit: only SET_TENSOR_HASH travelled
    np.testing.assert_array_equal(tensor_get(t), data)
    buf.free()


def test_reconnect_forgets_server_state(pyggml_server):
    conn = rpc.Connection(pyggml_server.endpoint, timeout=5.0)
    conn.ensure()
    gen = conn.generation
    conn.close()
    assert conn.ensure() == gen + 1  # reconnects
    with pytest.raises(RPCError, match="lost"):
        conn.call(P.Cmd.BUFFER_GET_BASE, [P.U64.pack(1)], P.U64.size, generation=gen)
    conn.close()


def test_remove_server(pyggml_server):
    from pyggml.backend import registry

    with rpc.RPCServer([gg.backend.cpu.CPU_REG.device(0)]) as extra:
        extra.start()
        (dev,) = rpc.add_server(extra.endpoint)
        assert dev in registry.devices() and extra.endpoint in rpc.RPC_REG.endpoints
        others = [d for d in rpc.RPC_REG.devices if d is not dev]
        rpc.RPC_REG.remove_server(extra.endpoint)
        assert dev not in registry.devices() and dev not in rpc.RPC_REG.devices
        assert all(d in registry.devices() for d in others)
        (again,) = rpc.add_server(extra.endpoint)
        assert again is not dev and again.name != dev.name  # names are never reused
        rpc.RPC_REG.remove_server(extra.endpoint)


def test_same_graph_again_is_a_recompute(device, endpoint):
    ctx = gg.Context(no_alloc=True)
    a = ctx.new_tensor(F32, (16,), name="a")
    y = ops.sqr(ctx, a)
    graph = gg.Graph().build_forward_expand(y)
    backend = device.init_backend()
    buf = gg.alloc.alloc_ctx_tensors(ctx, backend)
    conn = rpc.connection(endpoint)
    sent = []
    for value in (3.0, 5.0):
        tensor_set(a, np.full(16, value, np.float32))
        before = conn.bytes_sent
        backend.graph_compute(graph)
        sent.append(conn.bytes_sent - before)
        assert tensor_get(y).tolist() == [value * value] * 16
    assert sent[0] > 2 * P.TENSOR.size and sent[1] == 9 + P.DEVICE.size  # GRAPH_RECOMPUTE: 13 bytes
    buf.free()
