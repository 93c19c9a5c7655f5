"""The RPC server: any pyggml devices, served over ggml's RPC protocol to ggml or pyggml clients.

Like ggml's rpc_serve_client, each connection is a session with its own buffers (freed when it
ends) and its own last graph (for GRAPH_RECOMPUTE); unlike ggml, sessions run in parallel, one
thread each, and nothing a client sends is trusted: sizes, handles, addresses, types, ops and
graph references are checked, and a request that fails a check closes that client's connection
(ggml's answer to a bad request) while the server keeps serving everyone else. ggml aborts the
whole server process on some of these (out-of-buffer tensors in deserialize_tensor, a failed
compute); pyggml only drops the one connection.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from pathlib import Path

from pyggml.backend.base import Buffer, Device
from pyggml.backend.rpc import protocol as P
from pyggml.core import types as T
from pyggml.core.graph import Graph
from pyggml.core.tensor import MAX_SRC, Op, Tensor, TensorFlag
from pyggml.errors import AllocationError, GGMLError, RPCError

log = logging.getLogger("pyggml.rpc.server")

DEFAULT_MAX_GRAPH_BYTES = 64 * 1024 * 1024  # a GRAPH_COMPUTE message above this is refused (~220k tensors)
DEFAULT_REQUEST_TIMEOUT = 60.0  # seconds to receive the rest of a request once its command byte arrived
_KNOWN_FLAGS = sum(int(f) for f in TensorFlag)


class Refused(RPCError):
    """A request failed a check; the session closes the connection."""


class RPCServer:
    """Serves `devices` on host:port (port 0: any free port, see `address`).

    `start()` runs the accept loop in a background thread, `serve_forever()` in the caller's.
    Thread-safety: one thread per connection; the backends' compute locks serialize computes
    on one device.
    """

    def __init__(self, devices: list[Device], host: str = "127.0.0.1", port: int = 0, cache_dir: str | None = None,
                 max_graph_bytes: int = DEFAULT_MAX_GRAPH_BYTES, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 n_threads: int | None = None):
        if not devices:
            raise RPCError("RPC server: at least one device is needed")
        self.devices = list(devices)
        self.backends = [dev.init_backend() for dev in self.devices]
        for dev, backend in zip(self.devices, self.backends):  # as ggml: where the device's reg offers it
            set_n_threads = dev.reg.get_proc_address("set_n_threads") if dev.reg is not None else None
            if n_threads and set_n_threads is not None:
                set_n_threads(backend, n_threads)
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if self.cache_dir:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.max_graph_bytes = max_graph_bytes
        self.request_timeout = request_timeout
        self._handles = itertools.count(1)
        self._listener = socket.create_server((host, port))
        self.address = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def new_handle(self) -> int:
        return next(self._handles)

    def start(self) -> RPCServer:
        threading.Thread(target=self.serve_forever, name=f"rpc-accept-{self.endpoint}", daemon=True).start()
        return self

    def serve_forever(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except OSError:
                break  # closed
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            session = Session(self, sock, peer)
            with self._lock:
                self._sessions.add(session)
            threading.Thread(target=session.run, name=f"rpc-session-{peer}", daemon=True).start()

    def forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)

    def close(self) -> None:
        """Stop accepting and drop every connection (their buffers are freed by their sessions)."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            sessions = list(self._sessions)
        for s in sessions:
            s.shutdown()

    def __enter__(self) -> RPCServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session:
    """One client connection: its buffers by handle, its last graph per device, and the command loop."""

    def __init__(self, server: RPCServer, sock: socket.socket, peer):
        self.server = server
        self.sock = sock
        self.peer = peer
        self.buffers: dict[int, Buffer] = {}
        self.graphs: dict[int, Graph] = {}

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def run(self) -> None:
        try:
            self._hello()
            while self._serve_one():
                pass
        except (OSError, GGMLError) as e:
            log.warning("RPC client %s: %s: %s; closing its connection", self.peer, type(e).__name__, e)
        except Exception:  # a thread boundary: whatever a request triggered, only this connection ends
            log.exception("RPC client %s: request failed; closing its connection", self.peer)
        finally:
            for buf in self.buffers.values():
                buf.free()
            self.buffers.clear()
            self.sock.close()
            self.server.forget(self)

    # ----- framing --------------------------------------------------------------------------------
    def _recv_cmd(self) -> int | None:
        self.sock.settimeout(None)  # a client may stay idle between requests
        raw = self.sock.recv(1)
        self.sock.settimeout(self.server.request_timeout)
        return raw[0] if raw else None

    def _recv_fixed(self, what: P.Cmd, size: int) -> bytearray:
        got = P.recv_size(self.sock)
        if got != size:
            raise Refused(f"{what.name} request of {got} bytes, expected {size}")
        return P.recv_exact(self.sock, size)

    def _recv_bounded(self, what: P.Cmd, limit: int) -> bytearray:
        got = P.recv_size(self.sock)
        if got > limit:
            raise Refused(f"{what.name} request of {got} bytes exceeds the limit of {limit} bytes")
        return P.recv_exact(self.sock, got)

    def _hello(self) -> None:
        cmd = self._recv_cmd()
        if cmd != P.Cmd.HELLO:
            raise Refused(f"first command is {cmd}, expected HELLO ({int(P.Cmd.HELLO)})")
        self._recv_fixed(P.Cmd.HELLO, P.HELLO_REQ.size)
        P.send_reply(self.sock, P.HELLO_RSP.pack(P.PROTO_MAJOR, P.PROTO_MINOR, P.PROTO_PATCH,
                                                 bytes(P.CONN_CAPS_SIZE)))

    def _serve_one(self) -> bool:
        cmd = self._recv_cmd()
        if cmd is None:
            return False
        try:
            cmd = P.Cmd(cmd)
        except ValueError:
            raise Refused(f"unknown command {cmd}") from None
        if cmd == P.Cmd.HELLO:
            raise Refused("HELLO after the handshake")
        handler, request_size = _HANDLERS[cmd]
        if request_size is None:
            limit = self.server.max_graph_bytes if cmd == P.Cmd.GRAPH_COMPUTE else self._set_tensor_limit()
            request = self._recv_bounded(cmd, limit)
        else:
            request = self._recv_fixed(cmd, request_size)
        reply = handler(self, request)
        if reply is not None:
            P.send_reply(self.sock, reply)
        return True

    def _set_tensor_limit(self) -> int:
        return P.SET_TENSOR_HEAD.size + max((b.size for b in self.buffers.values()), default=0)

    # ----- lookups --------------------------------------------------------------------------------
    def _device(self, index: int) -> int:
        if index >= len(self.server.devices):
            raise Refused(f"device {index} does not exist (the server has {len(self.server.devices)})")
        return index

    def _buffer(self, handle: int) -> Buffer:
        buf = self.buffers.get(handle)
        if buf is None:
            raise Refused(f"buffer handle 0x{handle:x} is not a buffer of this connection")
        return buf

    def _tensor(self, wire: P.WireTensor) -> Tensor:
        """A local tensor for an rpc_tensor (deserialize_tensor); an unknown buffer handle means no buffer."""
        try:
            type_ = T.as_type(wire.type)
            T.blck_size(type_)
            op = Op(wire.op)
        except (GGMLError, ValueError, KeyError) as e:
            raise Refused(f"tensor {wire.name!r}: bad type {wire.type} or op {wire.op}: {e}") from None
        t = Tensor(type_, wire.ne, wire.nb, op=op, name=wire.name)
        t.op_params = [int(w) for w in wire.op_params]
        t.flags = TensorFlag(wire.flags & _KNOWN_FLAGS)
        buf = self.buffers.get(wire.buffer)
        if buf is not None:
            base = buf.base or 0
            if not (base <= wire.data and wire.data + t.nbytes <= base + buf.size):
                raise Refused(f"tensor {wire.name!r}: {t.nbytes} bytes at 0x{wire.data:x} lie outside buffer "
                              f"0x{wire.buffer:x} [0x{base:x}, 0x{base + buf.size:x})")
            t.buffer, t.data = buf, wire.data
        elif wire.data:
            raise Refused(f"tensor {wire.name!r} has data 0x{wire.data:x} but no buffer of this connection")
        return t

    def _bound_tensor(self, raw, offset: int = 0) -> tuple[Tensor, P.WireTensor]:
        wire = P.WireTensor.unpack(raw, offset)
        t = self._tensor(wire)
        if t.buffer is None:
            raise Refused(f"tensor {wire.name!r} is in no buffer of this connection (handle 0x{wire.buffer:x})")
        return t, wire

    @staticmethod
    def _check_region(t: Tensor, offset: int, size: int) -> None:
        """ggml's sanitize: data+offset inside the buffer and size within what is left of it."""
        buf = t.buffer
        p0 = buf.base or 0
        p1 = p0 + buf.size
        start = t.data + offset
        if not p0 <= start < p1 or size > p1 - start or offset + size > t.nbytes:
            raise Refused(f"tensor {t.name!r} ({t.nbytes} bytes at 0x{t.data:x}): region offset {offset} size {size} "
                          f"is outside the tensor or its buffer [0x{p0:x}, 0x{p1:x})")

    # ----- commands ---------------------------------------------------------------------------------
    def device_count(self, request) -> bytes:
        return P.DEVICE.pack(len(self.server.devices))

    def alloc_buffer(self, request) -> bytes:
        index, size = P.ALLOC_BUFFER_REQ.unpack(request)
        dev = self.server.devices[self._device(index)]
        free, _total = dev.memory()
        try:
            if size > free:
                raise AllocationError(f"{size} bytes requested, {free} free")
            buf = dev.buffer_type.alloc_buffer(size)
        except (AllocationError, MemoryError) as e:
            log.info("RPC client %s: alloc_buffer of %d bytes on %s failed: %s", self.peer, size, dev.name, e)
            return P.PAIR_U64.pack(0, 0)
        handle = self.server.new_handle()
        self.buffers[handle] = buf
        return P.PAIR_U64.pack(handle, buf.size)

    def get_alignment(self, request) -> bytes:
        dev = self.server.devices[self._device(P.DEVICE.unpack(request)[0])]
        return P.U64.pack(dev.buffer_type.alignment)

    def get_max_size(self, request) -> bytes:
        dev = self.server.devices[self._device(P.DEVICE.unpack(request)[0])]
        return P.U64.pack(min(dev.buffer_type.max_size, 2**64 - 1))

    def get_device_memory(self, request) -> bytes:
        dev = self.server.devices[self._device(P.DEVICE.unpack(request)[0])]
        return P.PAIR_U64.pack(*dev.memory())

    def buffer_get_base(self, request) -> bytes:
        return P.U64.pack(self._buffer(P.U64.unpack(request)[0]).base or 0)

    def free_buffer(self, request) -> bytes:
        handle = P.U64.unpack(request)[0]
        self._buffer(handle).free()
        del self.buffers[handle]
        return b""

    def buffer_clear(self, request) -> bytes:
        handle, value = P.BUFFER_CLEAR_REQ.unpack(request)
        self._buffer(handle).clear(value)
        return b""

    def set_tensor(self, request) -> None:
        if len(request) < P.SET_TENSOR_HEAD.size:
            raise Refused(f"SET_TENSOR request of {len(request)} bytes is shorter than its header")
        t, _ = self._bound_tensor(request)
        (offset,) = P.U64.unpack_from(request, P.TENSOR.size)
        data = memoryview(request)[P.SET_TENSOR_HEAD.size:]
        self._check_region(t, offset, len(data))
        if self.server.cache_dir and len(data) > P.HASH_THRESHOLD:
            (self.server.cache_dir / f"{P.fnv1a_64(data):016x}").write_bytes(data)
        if len(data):
            t.buffer.set_tensor(t, data, offset, len(data))

    def set_tensor_hash(self, request) -> bytes:
        wire_raw, offset, digest = P.TENSOR_OFFSET_U64.unpack(request)
        path = self.server.cache_dir / f"{digest:016x}" if self.server.cache_dir else None
        if path is None or not path.is_file():
            return P.U8.pack(0)
        t, _ = self._bound_tensor(wire_raw)
        size = path.stat().st_size
        self._check_region(t, offset, size)
        data = path.read_bytes()
        if len(data) != size:
            raise Refused(f"cache file {path} changed size while being read")
        t.buffer.set_tensor(t, memoryview(data), offset, size)
        return P.U8.pack(1)

    def get_tensor(self, request) -> bytes:
        wire_raw, offset, size = P.TENSOR_OFFSET_U64.unpack(request)
        t, _ = self._bound_tensor(wire_raw)
        self._check_region(t, offset, size)
        out = bytearray(size)
        if size:
            t.buffer.get_tensor(t, memoryview(out), offset, size)
        return out

    def copy_tensor(self, request) -> bytes:
        src, _ = self._bound_tensor(request, 0)
        dst, _ = self._bound_tensor(request, P.TENSOR.size)
        dst_end = (dst.buffer.base or 0) + dst.buffer.size
        if dst.data + src.nbytes > dst_end:
            raise Refused(f"COPY_TENSOR of {src.nbytes} bytes into {dst.name!r} at 0x{dst.data:x} runs past its "
                          f"buffer's end 0x{dst_end:x}")
        return P.U8.pack(int(dst.buffer.cpy_tensor(src, dst)))

    def init_tensor(self, request) -> bytes:
        t = self._tensor(P.WireTensor.unpack(request))
        if t.buffer is not None:
            t.buffer.init_tensor(t)
        return b""

    def get_alloc_size(self, request) -> bytes:
        index, blob = P.GET_ALLOC_SIZE_REQ.unpack(request)
        self._device(index)
        t = self._tensor(P.WireTensor.unpack(blob))
        for i in range(MAX_SRC):
            wire = P.WireTensor.unpack(blob, (1 + i) * P.TENSOR.size)
            if wire.id:
                t.src[i] = self._tensor(wire)
        buft = t.buffer.buft if t.buffer is not None else self.server.devices[index].buffer_type
        return P.U64.pack(buft.alloc_size(t))

    def graph_compute(self, request) -> None:
        wire = P.WireGraph.unpack(bytes(request))
        self._device(wire.device)
        graph = self._graph(wire)
        self.graphs[wire.device] = graph
        self._compute(wire.device, graph)

    def graph_recompute(self, request) -> None:
        device = self._device(P.DEVICE.unpack(request)[0])
        if device not in self.graphs:
            raise Refused(f"GRAPH_RECOMPUTE on device {device} before any GRAPH_COMPUTE")
        self._compute(device, self.graphs[device])

    def _compute(self, device: int, graph: Graph) -> None:
        status = self.server.backends[device].graph_compute(graph)
        if status != 0:
            raise Refused(f"graph compute on {self.server.devices[device].name} returned {status!r}")

    def _graph(self, wire: P.WireGraph) -> Graph:
        """Tensors for every node and what it reaches (create_node); an id not in the message is refused."""
        by_id: dict[int, P.WireTensor] = {}
        for w in wire.tensors:
            by_id.setdefault(w.id, w)  # ggml keeps the first of duplicate ids
        made: dict[int, Tensor] = {}

        def make(tid: int, why: str) -> Tensor:
            t = made.get(tid)
            if t is None:
                w = by_id.get(tid)
                if w is None:
                    raise Refused(f"graph references tensor id 0x{tid:x} ({why}) that the message does not contain")
                t = made[tid] = self._tensor(w)
                todo.append(tid)
            return t

        todo: list[int] = []
        nodes = [make(nid, f"node {i}") for i, nid in enumerate(wire.nodes)]
        while todo:
            tid = todo.pop()
            w, t = by_id[tid], made[tid]
            for i, sid in enumerate(w.src):
                t.src[i] = make(sid, f"src[{i}] of {w.name!r}") if sid else None
            if w.view_src:
                t.view_src = make(w.view_src, f"view_src of {w.name!r}")
                t.view_offs = w.view_offs
        graph = Graph(size=max(len(nodes), 1))
        graph.nodes = nodes
        return graph


_HANDLERS = {
    P.Cmd.DEVICE_COUNT: (Session.device_count, 0),
    P.Cmd.ALLOC_BUFFER: (Session.alloc_buffer, P.ALLOC_BUFFER_REQ.size),
    P.Cmd.GET_ALIGNMENT: (Session.get_alignment, P.DEVICE.size),
    P.Cmd.GET_MAX_SIZE: (Session.get_max_size, P.DEVICE.size),
    P.Cmd.GET_DEVICE_MEMORY: (Session.get_device_memory, P.DEVICE.size),
    P.Cmd.BUFFER_GET_BASE: (Session.buffer_get_base, P.U64.size),
    P.Cmd.FREE_BUFFER: (Session.free_buffer, P.U64.size),
    P.Cmd.BUFFER_CLEAR: (Session.buffer_clear, P.BUFFER_CLEAR_REQ.size),
    P.Cmd.SET_TENSOR: (Session.set_tensor, None),
    P.Cmd.SET_TENSOR_HASH: (Session.set_tensor_hash, P.TENSOR_OFFSET_U64.size),
    P.Cmd.GET_TENSOR: (Session.get_tensor, P.TENSOR_OFFSET_U64.size),
    P.Cmd.COPY_TENSOR: (Session.copy_tensor, P.COPY_TENSOR_REQ.size),
    P.Cmd.INIT_TENSOR: (Session.init_tensor, P.TENSOR.size),
    P.Cmd.GET_ALLOC_SIZE: (Session.get_alloc_size, P.GET_ALLOC_SIZE_REQ.size),
    P.Cmd.GRAPH_COMPUTE: (Session.graph_compute, None),
    P.Cmd.GRAPH_RECOMPUTE: (Session.graph_recompute, P.DEVICE.size),
}
