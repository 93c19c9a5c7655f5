"""Faults on both sides: a server killed mid-compute, silent or garbage servers, and clients sending oversized
or inconsistent requests to pyggml's server, which must drop only that client and keep serving the others."""

import contextlib
import socket
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyggml as gg
from pyggml import ops
from pyggml.backend import rpc, tensor_get, tensor_set
from pyggml.backend.cpu import CPU_REG
from pyggml.backend.rpc import protocol as P
from pyggml.errors import RPCError
from tests.support.raw_client import RawClient, wire

F32 = gg.GGMLType.F32


@pytest.fixture(scope="module")
def server():
    with rpc.RPCServer([CPU_REG.device(0)], limits=rpc.Limits(request_timeout=2.0)) as s:
        s.start()
        yield s


@pytest.fixture(scope="module")
def bystander(server):
    """A well-behaved client connected through all the fault tests: its data must survive them."""
    conn = rpc.Connection(server.endpoint, timeout=10)
    dev = rpc.RPCDevice(conn, 0, "bystander")
    ctx = gg.Context(no_alloc=True)
    t = ctx.new_tensor(F32, (256,), name="kept")
    buf = gg.alloc.alloc_ctx_tensors(ctx, dev.init_backend())
    tensor_set(t, np.arange(256, dtype=np.float32))
    yield t
    buf.free()
    conn.close()


def bad_requests():  # noqa: C901
    """(name, function(raw client) that misbehaves); every one must make the server close that connection."""
    def unknown_cmd(c):
        c.send(99)

    def second_hello(c):
        c.send(P.Cmd.HELLO, bytes(24))

    def wrong_fixed_size(c):
        c.send(P.Cmd.ALLOC_BUFFER, bytes(8))

    def oversized_set_tensor(c):
        c.send(P.Cmd.SET_TENSOR, declared=1 << 60)

    def oversized_graph(c):
        c.send(P.Cmd.GRAPH_COMPUTE, declared=1 << 40)

    def unknown_buffer(c):
        c.send(P.Cmd.GET_TENSOR, P.TENSOR_OFFSET_U64.pack(wire(ptr=0xDEAD, data=64).pack(), 0, 64))

    def tensor_past_buffer_end(c):
        ptr, base = c.alloc(256)
        c.send(P.Cmd.GET_TENSOR, P.TENSOR_OFFSET_U64.pack(wire(ptr, base + 240).pack(), 0, 64))

    def read_past_tensor(c):
        ptr, base = c.alloc(4096)
        c.send(P.Cmd.GET_TENSOR, P.TENSOR_OFFSET_U64.pack(wire(ptr, base).pack(), 32, 64))

    def bad_type(c):
        ptr, base = c.alloc(256)
        c.send(P.Cmd.SET_TENSOR, P.SET_TENSOR_HEAD.pack(wire(ptr, base, type_=200).pack(), 0) + bytes(4))

    def graph_unknown_src(c):
        ptr, base = c.alloc(256)
        node = wire(ptr, base, op=int(gg.Op.ADD), src=(77, 78), tid=5)
        c.send(P.Cmd.GRAPH_COMPUTE, P.WireGraph(0, [5], [node]).pack())

    def graph_data_without_buffer(c):
        c.send(P.Cmd.GRAPH_COMPUTE, P.WireGraph(0, [5], [wire(0, 0x1000, op=int(gg.Op.SQR), tid=5)]).pack())

    def graph_bad_device(c):
        c.send(P.Cmd.GRAPH_COMPUTE, P.WireGraph(7, [], []).pack())

    def graph_counts_lie(c):
        c.send(P.Cmd.GRAPH_COMPUTE, struct.pack("<II", 0, 1 << 30) + bytes(16))

    def copy_overflows_dst(c):
        ptr, base = c.alloc(256)
        src, dst = wire(ptr, base, ne=(64, 1, 1, 1)), wire(ptr, base + 128, ne=(16, 1, 1, 1), tid=2)
        c.send(P.Cmd.COPY_TENSOR, P.COPY_TENSOR_REQ.pack(src.pack(), dst.pack()))

    def free_unknown(c):
        c.send(P.Cmd.FREE_BUFFER, P.U64.pack(12345678))

    def recompute_first(c):
        c.send(P.Cmd.GRAPH_RECOMPUTE, P.DEVICE.pack(0))

    def stalls_mid_request(c):
        c.send(P.Cmd.GET_TENSOR, bytes(10), declared=P.TENSOR_OFFSET_U64.size)  # the rest never comes

    return [f for f in locals().values() if callable(f)]


@pytest.mark.parametrize("misbehave", bad_requests(), ids=lambda f: f.__name__)
def test_bad_request_closes_only_that_connection(server, bystander, misbehave):
    c = RawClient(server.endpoint)
    misbehave(c)
    assert c.closed_by_server()
    c.close()
    np.testing.assert_array_equal(tensor_get(bystander), np.arange(256, dtype=np.float32))


def test_no_hello_first_is_refused(server, bystander):
    c = RawClient(server.endpoint, hello=False)
    c.send(P.Cmd.DEVICE_COUNT)
    assert c.closed_by_server()
    c = RawClient(server.endpoint, hello=False)
    c.send(P.Cmd.HELLO, bytes(20))  # a HELLO of another protocol version's size
    assert c.closed_by_server()


def test_absurd_allocation_is_answered_not_fatal(server):
    c = RawClient(server.endpoint)
    assert P.PAIR_U64.unpack(c.request(P.Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(0, 1 << 62), True)) == (0, 0)
    assert P.DEVICE.unpack(c.request(P.Cmd.DEVICE_COUNT, b"", True)) == (1,)
    c.close()


def test_graph_recompute_reruns_the_stored_graph(server):
    c = RawClient(server.endpoint)
    ptr, base = c.alloc(256)
    a, y = wire(ptr, base, tid=1), wire(ptr, base + 64, op=int(gg.Op.SQR), src=(1,), tid=2)
    y.flags = int(gg.core.tensor.TensorFlag.COMPUTE)
    c.send(P.Cmd.SET_TENSOR, P.SET_TENSOR_HEAD.pack(a.pack(), 0) + np.full(16, 3, np.float32).tobytes())
    c.send(P.Cmd.GRAPH_COMPUTE, P.WireGraph(0, [2], [a, y]).pack())
    get = P.TENSOR_OFFSET_U64.pack(y.pack(), 0, 64)
    assert np.frombuffer(c.request(P.Cmd.GET_TENSOR, get, True), np.float32).tolist() == [9.0] * 16
    c.send(P.Cmd.SET_TENSOR, P.SET_TENSOR_HEAD.pack(a.pack(), 0) + np.full(16, 5, np.float32).tobytes())
    c.send(P.Cmd.GRAPH_RECOMPUTE, P.DEVICE.pack(0))
    assert np.frombuffer(c.request(P.Cmd.GET_TENSOR, get, True), np.float32).tolist() == [25.0] * 16
    c.close()


def test_concurrent_clients(server):
    errors = []

    def work(seed):
        try:
            conn = rpc.Connection(server.endpoint, timeout=10)
            dev = rpc.RPCDevice(conn, 0, f"c{seed}")
            ctx = gg.Context(no_alloc=True)
            a = ctx.new_tensor(F32, (128, 64), name="a")
            y = ops.sqr(ctx, a)
            graph = gg.Graph().build_forward_expand(y)
            backend = dev.init_backend()
            buf = gg.alloc.alloc_ctx_tensors(ctx, backend)
            for i in range(5):
                x = np.random.default_rng(seed * 10 + i).standard_normal((64, 128)).astype(np.float32)
                tensor_set(a, x)
                backend.graph_compute(graph)
                np.testing.assert_array_equal(tensor_get(y), x * x)
            buf.free()
            conn.close()
        except Exception as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors


# ----- the client side ----------------------------------------------------------------------------
class FakeServer:
    """Accepts connections and answers HELLO with `reply` bytes (None: never answers)."""

    def __init__(self, reply):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.reply = reply
        self.conns = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(sock)
            sock.recv(1 + 8 + 24)
            if self.reply is not None:
                sock.sendall(self.reply)

    def close(self):
        self.listener.close()
        for s in self.conns:
            s.close()


@pytest.mark.parametrize("reply, match", [
    (b"\x07" * 64, "malformed reply"),  # garbage: the size field is nonsense
    (P.U64.pack(28) + P.HELLO_RSP.pack(3, 0, 0, bytes(24)), "protocol 3.0.0"),  # another major version
    (P.U64.pack(28) + P.HELLO_RSP.pack(4, 9, 0, bytes(24)), "protocol 4.9.0"),  # a newer minor version
    (P.U64.pack(28) + b"\x04", "closed"),  # a truncated reply, then the server hangs up
])
def test_bad_server_replies_raise(reply, match):
    fake = FakeServer(reply)
    if match == "closed":
        threading.Timer(0.2, fake.close).start()
    conn = rpc.Connection(fake.endpoint, timeout=5)
    with pytest.raises(RPCError, match=match):
        conn.ensure()
    assert not conn.connected
    fake.close()


def test_silent_server_times_out():
    fake = FakeServer(None)
    conn = rpc.Connection(fake.endpoint, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(RPCError, match="timed out"):
        conn.ensure()
    assert time.monotonic() - start < 3
    fake.close()


def test_nothing_listening_raises():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RPCError, match="cannot connect"):
        rpc.Connection(f"127.0.0.1:{port}", timeout=1).ensure()
    with pytest.raises(RPCError, match="host:port"):
        rpc.Connection("nohost")


def test_server_killed_mid_compute_then_reconnect():
    from tests.support.ggml_rpc import pyggml_server

    with pyggml_server() as proc_server:
        conn = rpc.Connection(proc_server.endpoint, timeout=5)
        dev = rpc.RPCDevice(conn, 0, "victim")
        ctx = gg.Context(no_alloc=True)
        a = ctx.new_tensor(F32, (1024, 1024), name="a")
        y = a
        for _ in range(30):
            y = ops.mul_mat(ctx, a, y)  # ~2 s of matmuls on the server
        graph = gg.Graph().build_forward_expand(y)
        backend = dev.init_backend()
        buf = gg.alloc.alloc_ctx_tensors(ctx, backend)
        tensor_set(a, np.eye(1024, dtype=np.float32))
        backend.graph_compute(graph)  # GRAPH_COMPUTE has no reply: the server is now computing
        proc_server.proc.kill()
        start = time.monotonic()
        with pytest.raises(RPCError, match="GET_TENSOR failed"):
            tensor_get(y)
        assert time.monotonic() - start < 5
        assert not conn.connected
        port = proc_server.port
    with rpc.RPCServer([CPU_REG.device(0)], port=port) as fresh:  # the same endpoint comes back
        fresh.start()
        assert dev.memory()[1] > 0  # the connection reconnects by itself
        with pytest.raises(RPCError, match="lost"):
            tensor_get(a)  # the old buffer died with the old server
        buf.free()  # freeing a lost buffer only forgets it
        conn.close()


@settings(max_examples=40, deadline=None)
@given(cmd=st.integers(0, 20), payload=st.binary(max_size=700), declared_extra=st.sampled_from([0, 0, 1, 1 << 33]))
def test_random_requests_never_hurt_the_server(server, bystander, cmd, payload, declared_extra):
    """Fuzz: any command byte with any payload (and a lying size) is answered or refused, never fatal."""
    c = RawClient(server.endpoint)
    c.sock.settimeout(0.5)
    with contextlib.suppress(OSError):  # the server may have hung up already
        c.send(cmd, payload, declared=len(payload) + declared_extra)
        c.sock.shutdown(socket.SHUT_WR)
        c.closed_by_server()
    c.close()
    np.testing.assert_array_equal(tensor_get(bystander), np.arange(256, dtype=np.float32))
    assert P.DEVICE.unpack(RawClient(server.endpoint).request(P.Cmd.DEVICE_COUNT, b"", True)) == (1,)


def test_rpc_server_cli(capsys):
    from pyggml.cli.main import main

    assert main(["rpc-server", "--backend", "NO_SUCH_DEVICE", "--port", "0"]) == 2
    assert "NO_SUCH_DEVICE" in capsys.readouterr().err


def test_server_binds_loopback_by_default(server):
    assert server.address[0] == "127.0.0.1"


def test_server_sets_n_threads_like_ggml():
    with rpc.RPCServer([CPU_REG.device(0)], n_threads=3) as s:
        assert s.backends[0].n_threads == 3
