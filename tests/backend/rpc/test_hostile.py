"""Hostile clients against `pyggml rpc-server` (a subprocess on loopback, so that its RSS can be read from /proc).

Each finding of the hardening review is replayed with requests written from the protocol: computes that
never end (zero strides), memory amplification from small requests, missing limits, op parameters guarded
only by exceptions, and an exposed --host. After each, the server is alive, a well-behaved client can
allocate, set, get and compute, and the server's RSS is within 64 MB of where it started. A seeded fuzz
of 2,000 random messages after HELLO ends the module.
"""

import logging
import random
import socket
import struct
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pyggml.backend.rpc import limits as rpc_limits
from pyggml.backend.rpc import protocol as P
from pyggml.core.tensor import Op, TensorFlag
from tests.support.raw_client import RawClient, wire

COMPUTE = int(TensorFlag.COMPUTE)
MB = 1 << 20
RSS_SLACK = 64 * MB
COMPUTE_TIMEOUT = 1.0  # below the long graph's time on a quiet machine with compiled kernels (about 1.5-3 s)
REQUEST_TIMEOUT = 1.0
MAX_CONNECTIONS = 16
FLAGS = ["--compute-timeout", str(COMPUTE_TIMEOUT), "--request-timeout", str(REQUEST_TIMEOUT),
         "--max-connections", str(MAX_CONNECTIONS), "--max-buffer-memory", "320M", "--max-connection-memory", "160M"]


def rss(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@pytest.fixture(scope="module")
def server():
    """`pyggml rpc-server` with small limits; .baseline is its RSS after some well-behaved work."""
    from tests.support.ggml_rpc import pyggml_server

    with pyggml_server(*FLAGS) as s:
        for _ in range(3):
            healthy(s.endpoint)
        s.baseline = rss(s.proc.pid)
        yield s


def healthy(endpoint: str) -> float:
    """A well-behaved client: allocate, set, compute y = x*x, get, free. Returns the seconds it took."""
    start = time.monotonic()
    c = RawClient(endpoint, timeout=COMPUTE_TIMEOUT * 3)
    ptr, base = c.alloc(4096)
    assert ptr, "a 4 KiB buffer was refused"
    x = wire(ptr, base, tid=1)
    y = wire(ptr, base + 64, op=int(Op.SQR), src=(1,), tid=2, flags=COMPUTE)
    c.send(P.Cmd.SET_TENSOR, P.SET_TENSOR_HEAD.pack(x.pack(), 0) + np.arange(16, dtype=np.float32).tobytes())
    c.send(P.Cmd.GRAPH_COMPUTE, P.WireGraph(0, [2], [x, y]).pack())
    got = np.frombuffer(c.request(P.Cmd.GET_TENSOR, P.TENSOR_OFFSET_U64.pack(y.pack(), 0, 64), True), np.float32)
    np.testing.assert_array_equal(got, np.arange(16, dtype=np.float32) ** 2)
    c.request(P.Cmd.FREE_BUFFER, P.U64.pack(ptr), True)
    c.close()
    return time.monotonic() - start


def eventually(attempt, within: float = 10.0):
    """attempt()'s first true result, tried until `within` seconds have passed: what a server does when it sees a
    client go happens soon, not at a fixed time (a busy host once outran such fixed sleeps)."""
    deadline = time.monotonic() + within
    while not (result := attempt()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return result


def connect_or_none(endpoint: str):
    try:
        return RawClient(endpoint, timeout=3)
    except (ConnectionError, AssertionError, struct.error, OSError):
        return None


def check_unharmed(server, legit: int = 0) -> None:
    """Alive, serving a well-behaved client, and RSS within 64 MB of the start (plus what clients legitimately hold)."""
    assert server.proc.poll() is None, "the server died"
    healthy(server.endpoint)
    deadline = time.monotonic() + 3  # sessions free their buffers as their threads end
    while rss(server.proc.pid) > server.baseline + RSS_SLACK + legit and time.monotonic() < deadline:
        time.sleep(0.05)
    grown = rss(server.proc.pid) - server.baseline
    assert grown <= RSS_SLACK + legit, f"server RSS grew by {grown / MB:.1f} MB"


def refused(server, send, timeout: float = 5.0) -> float:
    """Open a connection, let `send(client)` misbehave; the server must close it. Returns the seconds it took."""
    c = RawClient(server.endpoint, timeout=timeout)
    start = time.monotonic()
    send(c)
    assert c.closed_by_server(), "the server kept the connection open"
    c.close()
    return time.monotonic() - start


def graph(*tensors, nodes=None) -> bytes:
    return P.WireGraph(0, list(nodes or [tensors[-1].id]), list(tensors)).pack()


# ----- 1. computes that never end -------------------------------------------------------------------
ZERO = (0, 0, 0, 0)
HUGE = (1 << 30, 1 << 30, 1, 1)


@pytest.mark.parametrize("src_view, dst_view", [(False, False), (True, False), (True, True)])
def test_zero_stride_scale_is_refused_up_front(server, src_view, dst_view):
    def send(c):
        ptr, base = c.alloc(4096)
        root = wire(ptr, base, tid=9)
        x = wire(ptr, base, ne=HUGE, nb=ZERO, tid=1, view_src=9 if src_view else 0)
        y = wire(ptr, base + 64, ne=HUGE, nb=ZERO, op=int(Op.SCALE), src=(1,), tid=2, flags=COMPUTE,
                 view_src=9 if dst_view else 0, op_params=[0x3F800000])
        c.send(P.Cmd.GRAPH_COMPUTE, graph(root, x, y))

    assert refused(server, send) < COMPUTE_TIMEOUT
    check_unharmed(server)


def long_graph(ptr, base, n_nodes):
    """n SQR nodes over 1M floats, ping-ponging between two tensors: seconds of legitimate work."""
    n = 1 << 20
    tensors = [wire(ptr, base, ne=(n, 1, 1, 1), tid=1)]
    for i in range(n_nodes):
        tensors.append(wire(ptr, base + 4 * n * ((i + 1) % 2), ne=(n, 1, 1, 1), op=int(Op.SQR),
                            src=(tensors[-1].id,), tid=100 + i, flags=COMPUTE))
    return graph(*tensors, nodes=[t.id for t in tensors[1:]])


def test_long_compute_is_aborted_at_the_timeout_and_the_device_is_freed(server):
    c = RawClient(server.endpoint, timeout=COMPUTE_TIMEOUT * 4)
    ptr, base = c.alloc(8 * MB)
    start = time.monotonic()
    c.send(P.Cmd.GRAPH_COMPUTE, long_graph(ptr, base, 10000))
    other = []
    bystander = threading.Thread(target=lambda: other.append(healthy(server.endpoint)))
    time.sleep(0.2)
    bystander.start()  # waits for the device, then computes once the long graph is aborted
    assert c.closed_by_server()
    aborted_after = time.monotonic() - start
    bystander.join(COMPUTE_TIMEOUT * 3)
    assert other, "the other client's compute never ran"
    assert COMPUTE_TIMEOUT * 0.9 < aborted_after < COMPUTE_TIMEOUT + 3, aborted_after
    c.close()
    check_unharmed(server)


def test_compute_stops_when_its_client_disconnects(server):
    c = RawClient(server.endpoint)
    ptr, base = c.alloc(8 * MB)
    c.send(P.Cmd.GRAPH_COMPUTE, long_graph(ptr, base, 10000))
    time.sleep(0.3)
    c.close()  # mid-compute
    assert healthy(server.endpoint) < COMPUTE_TIMEOUT * 0.7  # the device came back well before the timeout
    check_unharmed(server)


# ----- 2. memory amplification --------------------------------------------------------------------
def test_zero_stride_f16_to_f32_copy_is_refused(server):
    def send(c):
        ptr, base = c.alloc(4096)
        x = wire(ptr, base, ne=(1 << 14, 1 << 14, 1, 1), nb=ZERO, type_=1, tid=1, view_src=9)
        root = wire(ptr, base, tid=9)
        dst = wire(ptr, base + 1024, ne=(1 << 14, 1 << 14, 1, 1), nb=ZERO, tid=3, view_src=9)
        y = wire(ptr, base + 1024, ne=(1 << 14, 1 << 14, 1, 1), nb=ZERO, op=int(Op.CPY), src=(1, 3), tid=2,
                 flags=COMPUTE, view_src=3)
        c.send(P.Cmd.GRAPH_COMPUTE, graph(root, x, dst, y))

    refused(server, send)
    check_unharmed(server)


@pytest.mark.parametrize("out_ne", [(4, 4, 1, 1), None], ids=["small-dst", "dst-as-the-pads-say"])
def test_conv_2d_dw_huge_padding_is_refused(server, out_ne):
    pad = 1 << 24

    def send(c):
        ptr, base = c.alloc(4096)
        k = wire(ptr, base, ne=(3, 3, 1, 1), tid=1)
        x = wire(ptr, base + 64, ne=(4, 4, 1, 1), tid=2)
        ow = 4 + 2 * pad - 2
        y = wire(ptr, base + 256, ne=out_ne or (ow, ow, 1, 1), op=int(Op.CONV_2D_DW), src=(1, 2), tid=3,
                 flags=COMPUTE, op_params=[1, 1, pad, pad, 1, 1])
        c.send(P.Cmd.GRAPH_COMPUTE, graph(k, x, y))

    refused(server, send)
    check_unharmed(server)


def test_announced_graph_sizes_reserve_nothing(server):
    refused(server, lambda c: c.send(P.Cmd.GRAPH_COMPUTE, struct.pack("<II", 0, 0), declared=64 * MB))
    held = []
    for _ in range(8):  # within the cap, but the rest never comes
        c = RawClient(server.endpoint)
        c.send(P.Cmd.GRAPH_COMPUTE, struct.pack("<II", 0, 1000), declared=16 * MB)
        held.append(c)
    time.sleep(0.3)
    check_unharmed(server)
    for c in held:
        c.close()


def test_set_tensor_header_reserves_nothing(server):
    held = []
    for _ in range(2):  # a legitimate 100 MB buffer each, then a SET_TENSOR announcing all of it
        c = RawClient(server.endpoint)
        ptr, base = c.alloc(100 * MB)
        assert ptr
        t = wire(ptr, base, ne=(25 * MB, 1, 1, 1))
        c.send(P.Cmd.SET_TENSOR, P.SET_TENSOR_HEAD.pack(t.pack(), 0) + bytes(1024),
               declared=P.SET_TENSOR_HEAD.size + 100 * MB)
        held.append(c)
    time.sleep(0.3)
    check_unharmed(server)  # the buffers are untouched memory: no allowance needed
    for c in held:
        c.close()


def test_maximal_graph_message_stays_bounded(server):
    """65,536 tensors (the default cap), all reachable: the server holds them while it validates, then lets go."""
    n = rpc_limits.Limits().max_graph_tensors
    c = RawClient(server.endpoint, timeout=30)
    ptr, base = c.alloc(4096)
    Path(f"/proc/{server.proc.pid}/clear_refs").write_text("5")  # reset the peak RSS
    tensors = [wire(ptr, base, tid=i + 1) for i in range(n)]
    c.send(P.Cmd.GRAPH_COMPUTE, graph(*tensors, nodes=[t.id for t in tensors]))
    assert c.request(P.Cmd.DEVICE_COUNT, b"", True) == P.DEVICE.pack(1)  # the graph was accepted (no compute)
    peak = rss(server.proc.pid, "VmHWM") - server.baseline
    c.close()
    message = len(tensors) * (P.TENSOR.size + 8)
    assert peak < 8 * message, f"peak RSS grew by {peak / MB:.0f} MB for a {message / MB:.0f} MB message"
    check_unharmed(server)
    refused(server, lambda c: c.send(P.Cmd.GRAPH_COMPUTE, struct.pack("<II", 0, n + 1), declared=12 + 8 * (n + 1)))


# ----- 3. limits ------------------------------------------------------------------------------------------
def test_buffer_memory_limits(server):
    a, b, c = (RawClient(server.endpoint) for _ in range(3))
    assert a.alloc(100 * MB)[0]
    assert a.alloc(100 * MB) == (0, 0)  # over the 160M per-connection limit: a null buffer, as a failed alloc
    assert b.alloc(100 * MB)[0] and b.alloc(50 * MB)[0]
    assert c.alloc(100 * MB) == (0, 0)  # over the 320M total
    assert c.alloc(1 << 62) == (0, 0)
    a.close()
    assert eventually(lambda: c.alloc(100 * MB)[0])  # a's memory came back (once the server has seen a go)
    b.close()
    c.close()
    check_unharmed(server)


def test_connection_limit_refuses_clearly(server):
    time.sleep(0.3)  # earlier tests' sessions wind down
    held = [RawClient(server.endpoint) for _ in range(MAX_CONNECTIONS)]
    with pytest.raises((ConnectionError, AssertionError, struct.error, OSError)):
        RawClient(server.endpoint, timeout=3)
    held.pop().close()
    extra = eventually(lambda: connect_or_none(server.endpoint))  # room again (once the server has seen it go)
    assert extra.request(P.Cmd.DEVICE_COUNT, b"", True) == P.DEVICE.pack(1)
    for c in [*held, extra]:
        c.close()
    time.sleep(0.2)
    check_unharmed(server)


def test_slow_client_is_dropped_mid_message(server):
    """One byte every 0.1 s: each byte arrives in time, the message does not; others are served meanwhile."""
    c = RawClient(server.endpoint, timeout=10)
    c.send(P.Cmd.GET_TENSOR, b"", declared=P.TENSOR_OFFSET_U64.size)
    start = time.monotonic()
    dropped = None
    for _ in range(100):
        try:
            c.sock.sendall(b"\0")
        except OSError:
            dropped = time.monotonic() - start
            break
        if c.sock in __import__("select").select([c.sock], [], [], 0.1)[0]:
            assert c.closed_by_server()
            dropped = time.monotonic() - start
            break
    assert dropped is not None and dropped < REQUEST_TIMEOUT + 2, dropped
    c.close()
    check_unharmed(server)


def test_client_that_never_reads_its_reply_is_dropped(server):
    """A 64 MB GET_TENSOR whose reply is never read: the server's send times out instead of blocking for good."""
    c = RawClient(server.endpoint, timeout=10)
    ptr, base = c.alloc(64 * MB)
    t = wire(ptr, base, ne=(16 * MB, 1, 1, 1))
    c.send(P.Cmd.GET_TENSOR, P.TENSOR_OFFSET_U64.pack(t.pack(), 0, 64 * MB))
    time.sleep(REQUEST_TIMEOUT + 1)
    healthy(server.endpoint)  # served meanwhile
    assert c.closed_by_server()  # what was sent drains, then the end of the connection
    c.close()
    check_unharmed(server)


# ----- 4. op parameters checked up front ---------------------------------------------------------------
def bad_nodes():
    a = dict(ne=(4, 4, 4, 1))
    return {
        "group_norm_0_groups": [wire(tid=1, **a), wire(tid=2, op=int(Op.GROUP_NORM), src=(1,), op_params=[0], **a)],
        "group_norm_more_groups_than_channels": [
            wire(tid=1, **a), wire(tid=2, op=int(Op.GROUP_NORM), src=(1,), op_params=[5], **a)],
        "mul_mat_missing_src1": [wire(tid=1, **a), wire(tid=2, op=int(Op.MUL_MAT), src=(1,), **a)],
        "add_shape_mismatch": [wire(tid=1, **a), wire(tid=3, ne=(3, 1, 1, 1)),
                               wire(tid=2, op=int(Op.ADD), src=(1, 3), **a)],
        "conv_2d_zero_stride": [wire(tid=1, ne=(3, 3, 4, 1)), wire(tid=3, **a),
                                wire(tid=2, op=int(Op.CONV_2D), src=(1, 3), ne=(2, 2, 1, 1), op_params=[0, 1])],
        "pool_2d_kernel_0": [wire(tid=1, **a), wire(tid=2, op=int(Op.POOL_2D), src=(1,), op_params=[0, 0, 0, 1, 1],
                                                    ne=(5, 5, 4, 1))],
        "unserved_op": [wire(tid=1, **a), wire(tid=2, op=int(Op.WIN_PART), src=(1,), **a)],
        "unknown_op": [wire(tid=1, **a), wire(tid=2, op=250, src=(1,), **a)],
        "wrong_output_shape": [wire(tid=1, **a), wire(tid=2, op=int(Op.SQR), src=(1,), ne=(64, 1, 1, 1))],
        "non_view_bad_strides": [wire(tid=1, nb=(4, 4, 4, 4), **a), wire(tid=2, op=int(Op.SQR), src=(1,), **a)],
    }


@pytest.mark.parametrize("name", sorted(bad_nodes()))
def test_bad_node_is_refused_before_compute(server, name):
    def send(c):
        ptr, base = c.alloc(4096)
        tensors = bad_nodes()[name]
        for i, t in enumerate(tensors):
            t.buffer, t.data, t.flags = ptr, base + 512 * i, COMPUTE if t is tensors[-1] else 0
        c.send(P.Cmd.GRAPH_COMPUTE, graph(*tensors))

    refused(server, send)
    check_unharmed(server)


# ----- 5. --host ------------------------------------------------------------------------------------------
def test_non_loopback_host_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="pyggml.rpc.server"):
        assert not rpc_limits.warn_if_exposed("127.0.0.1")
        assert not rpc_limits.warn_if_exposed("::1")
        assert not caplog.records
        assert rpc_limits.warn_if_exposed("0.0.0.0")
    assert "no authentication" in caplog.text and "0.0.0.0" in caplog.text


def test_cli_limit_flags():
    from pyggml.cli.main import build_parser
    from pyggml.cli.rpc_server import limits_from

    args = build_parser().parse_args(["rpc-server", "--max-buffer-memory", "8G", "--max-connection-memory", "512M",
                                      "--compute-timeout", "0", "--max-connections", "4", "--work-per-byte", "100"])
    limits = limits_from(args)
    assert (limits.max_buffer_memory, limits.max_connection_memory) == (8 << 30, 512 << 20)
    assert (limits.compute_timeout, limits.max_connections, limits.work_per_byte) == (0, 4, 100)
    defaults = limits_from(build_parser().parse_args(["rpc-server"]))
    assert defaults == rpc_limits.Limits() and defaults.max_connections == 64
    assert rpc_limits.default_buffer_memory(10 << 30) == 9 << 30
    assert rpc_limits.default_buffer_memory(1 << 20) == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rpc-server", "--max-buffer-memory", "lots"])


# ----- fuzz ------------------------------------------------------------------------------------------------
INTERESTING = [0, 1, 2, 3, 4, 16, 31, 32, 255, 256, 4096, (1 << 16) - 1, 1 << 24, (1 << 31) - 1, 1 << 31,
               (1 << 32) - 1]
FUZZ_MESSAGES = 2000
PER_CONNECTION = 10


def i32(v: int) -> int:
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def fuzz_tensor(rng: random.Random, ptr: int, base: int, tid: int, ids) -> P.WireTensor:
    """A plausible rpc_tensor with some fields pushed to the edges."""
    ne = [rng.choice([1, 1, 2, 4, 16]) for _ in range(4)]
    t = wire(ptr if rng.random() < 0.9 else rng.getrandbits(64), base + rng.choice([0, 0, 64, 4032, 4096, 1 << 40]),
             ne=ne, type_=rng.choice([0, 0, 0, 1, 2, 8, 24, 26, 39, 200]), tid=tid,
             op=rng.choice([0, 0, rng.randrange(96), 250]), view_src=rng.choice([0, 0, 0, *ids]),
             src=[rng.choice(ids) if ids and rng.random() < 0.5 else 0 for _ in range(rng.randrange(4))],
             op_params=[i32(rng.choice(INTERESTING)) if rng.random() < 0.3 else rng.randrange(-4, 8)
                        for _ in range(16)],
             flags=rng.choice([0, COMPUTE, COMPUTE | 1, rng.getrandbits(31)]))
    for field in ("ne", "nb"):
        if rng.random() < 0.2:
            getattr(t, field)[rng.randrange(4)] = rng.choice(INTERESTING)
    return t


def fuzz_message(rng: random.Random, ptr: int, base: int) -> tuple[int, bytes, int]:
    """(cmd, payload, declared size): a protocol message with random parts."""
    ids = list(range(1, rng.randrange(2, 6)))
    tensors = [fuzz_tensor(rng, ptr, base, tid, ids) for tid in ids]
    t = tensors[0].pack()
    offset, size = rng.choice([0, 0, 4, 64, 1 << 32]), rng.choice([0, 4, 64, 4096, 1 << 40])
    kind = rng.randrange(10)
    if kind == 0:
        cmd, payload = rng.randrange(256), rng.randbytes(rng.randrange(700))
    elif kind == 1:
        cmd, payload = P.Cmd.SET_TENSOR, P.SET_TENSOR_HEAD.pack(t, offset) + rng.randbytes(rng.randrange(300))
    elif kind == 2:
        cmd, payload = rng.choice([P.Cmd.GET_TENSOR, P.Cmd.SET_TENSOR_HASH]), P.TENSOR_OFFSET_U64.pack(t, offset, size)
    elif kind == 3:
        cmd, payload = P.Cmd.COPY_TENSOR, P.COPY_TENSOR_REQ.pack(t, tensors[-1].pack())
    elif kind == 4:
        cmd, payload = P.Cmd.INIT_TENSOR, t
    elif kind == 5:
        srcs = b"".join(x.pack() for x in tensors[1:]) + P.NULL_TENSOR * (11 - len(tensors))
        cmd, payload = P.Cmd.GET_ALLOC_SIZE, struct.pack("<I", rng.choice([0, 0, 1])) + t + srcs
    elif kind in (6, 7):
        nodes = [rng.choice(ids) if rng.random() < 0.95 else rng.getrandbits(64) for _ in range(rng.randrange(1, 4))]
        cmd, payload = P.Cmd.GRAPH_COMPUTE, P.WireGraph(rng.choice([0, 0, 0, 1]), nodes, tensors).pack()
    elif kind == 8:
        cmd, payload = P.Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(rng.choice([0, 0, 1]), rng.choice(
            [0, 1, 4096, MB, 1 << 40, (1 << 64) - 1]))
    else:
        cmd = rng.choice([P.Cmd.BUFFER_CLEAR, P.Cmd.FREE_BUFFER, P.Cmd.BUFFER_GET_BASE, P.Cmd.GRAPH_RECOMPUTE,
                          P.Cmd.GET_DEVICE_MEMORY, P.Cmd.DEVICE_COUNT, P.Cmd.GET_MAX_SIZE, P.Cmd.HELLO])
        payload = rng.choice([P.U64.pack(ptr), P.BUFFER_CLEAR_REQ.pack(ptr, 7), P.DEVICE.pack(0), b"",
                              rng.randbytes(8)])
    declared = len(payload) + rng.choice([0] * 8 + [-1, 1, 1 << 33, -len(payload)])
    return int(cmd), payload, declared


def test_seeded_fuzz_after_hello(server):
    rng = random.Random(20260316)
    sent = 0
    while sent < FUZZ_MESSAGES:
        c = RawClient(server.endpoint, timeout=COMPUTE_TIMEOUT + 2)
        ptr, base = c.alloc(4096)
        try:
            for _ in range(PER_CONNECTION):
                cmd, payload, declared = fuzz_message(rng, ptr, base)
                c.send(cmd, payload, declared=max(declared, 0))
                sent += 1
            c.sock.shutdown(socket.SHUT_WR)  # the server sees the end of whatever it still waits for
        except OSError:
            pass  # the server already hung up on an earlier message
        assert c.closed_by_server()
        c.close()
        assert server.proc.poll() is None, f"the server died after fuzz message {sent}"
        healthy(server.endpoint)
        if sent % 200 == 0:
            check_unharmed(server)
    check_unharmed(server)
