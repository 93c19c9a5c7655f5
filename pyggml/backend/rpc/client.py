"""The RPC client: remote ggml devices as pyggml BufferType, Buffer, Backend, Device and the "RPC" reg.

One `Connection` per endpoint, shared by everything on it (ggml's get_socket), with a lock
around each request and its reply. Every socket operation has a timeout; any failure (timeout,
reset, a reply of the wrong size, a version mismatch) closes the socket and raises RPCError,
so the next call reconnects. The server frees a connection's buffers when it ends, so buffers
made on an earlier connection are lost: using them raises RPCError instead of touching
whatever the server now has at that handle.

Tensors are identified by `id()` (ggml uses pointers). Local buffers get fake, disjoint base
addresses (base.FAKE_ADDRESSES); `data` is translated to the server's address on the wire.
"""

from __future__ import annotations

import socket
import threading

from pyggml.backend import registry
from pyggml.backend.base import Backend, BackendReg, Buffer, BufferType, Device, DeviceType, Status
from pyggml.backend.rpc import protocol as P
from pyggml.core import types as T
from pyggml.core.graph import reachable_tensors
from pyggml.core.tensor import Op, Tensor
from pyggml.errors import BackendError, RPCError

DEFAULT_TIMEOUT = 60.0  # seconds for any one send or receive (a GET_TENSOR after a compute waits for it)


# ----------------------------------------------------------------------------------------------
# Connection
# ----------------------------------------------------------------------------------------------
def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RPCError(f"RPC endpoint {endpoint!r} is not host:port")
    return host, int(port)


class Connection:
    """One socket to an RPC server, HELLO-negotiated; reconnects on the next call after a failure.

    `generation` counts successful connects: server-side state (buffers) belongs to one generation.
    `bytes_sent` / `bytes_received` count wire bytes, for benchmarks and the cache test.
    Thread-safety: calls are serialized by a lock (one request/reply at a time, as on ggml's socket).
    """

    def __init__(self, endpoint: str, timeout: float = DEFAULT_TIMEOUT):
        self.endpoint = endpoint
        self.host, self.port = parse_endpoint(endpoint)
        self.timeout = timeout
        self.generation = 0
        self.bytes_sent = self.bytes_received = 0
        self.server_version: tuple[int, int, int] | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.RLock()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def ensure(self) -> int:
        """Connect (and HELLO) if not connected; returns the current generation."""
        with self._lock:
            if self._sock is None:
                self._connect()
            return self.generation

    def _connect(self) -> None:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as e:
            raise RPCError(f"RPC {self.endpoint}: cannot connect: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        reply = self._exchange(P.Cmd.HELLO, [P.HELLO_REQ.pack(bytes(P.CONN_CAPS_SIZE))], P.HELLO_RSP.size)
        major, minor, patch, _caps = P.HELLO_RSP.unpack(reply)
        if major != P.PROTO_MAJOR or minor > P.PROTO_MINOR:
            self.close()
            raise RPCError(f"RPC {self.endpoint}: server speaks protocol {major}.{minor}.{patch}, this client "
                           f"{P.PROTO_MAJOR}.{P.PROTO_MINOR}.{P.PROTO_PATCH} (same major, minor <= ours needed)")
        self.server_version = (major, minor, patch)
        self.generation += 1

    def call(self, cmd: P.Cmd, parts=(), reply_size: int | None = None, out: memoryview | None = None,
             generation: int | None = None) -> bytes | None:
        """Send one request; with reply_size, wait for a reply of exactly that size (into `out` if given).

        With `generation`, refuse (RPCError) when the connection is no longer the one it names.
        """
        with self._lock:
            if generation is not None and (self._sock is None or generation != self.generation):
                raise RPCError(f"RPC {self.endpoint}: the connection this object was made on was lost; "
                               f"its server-side state is gone ({cmd.name} refused)")
            self.ensure()
            return self._exchange(cmd, parts, reply_size, out)

    def _exchange(self, cmd: P.Cmd, parts, reply_size: int | None, out: memoryview | None = None):
        try:
            self.bytes_sent += P.send_request(self._sock, cmd, *parts)
            if reply_size is None:
                return None
            size = P.recv_size(self._sock)
            if size != reply_size:
                raise RPCError(f"malformed reply: {size} bytes, expected {reply_size}")
            self.bytes_received += 8 + size
            if out is None:
                return bytes(P.recv_exact(self._sock, size))
            got = 0
            while got < size:
                n = self._sock.recv_into(out[got:], size - got)
                if n == 0:
                    raise ConnectionError(f"server closed the connection after {got} of {size} reply bytes")
                got += n
            return None
        except (OSError, RPCError) as e:  # socket.timeout and ConnectionError are OSErrors
            self.close()
            raise RPCError(f"RPC {self.endpoint}: {cmd.name} failed ({type(e).__name__}: {e}); "
                           f"connection closed, the next call reconnects") from e


_connections: dict[str, Connection] = {}
_connections_lock = threading.Lock()


def connection(endpoint: str, timeout: float | None = None) -> Connection:
    """The shared connection to an endpoint (created on first use; `timeout` updates it)."""
    with _connections_lock:
        conn = _connections.get(endpoint)
        if conn is None:
            conn = _connections[endpoint] = Connection(endpoint, DEFAULT_TIMEOUT if timeout is None else timeout)
        elif timeout is not None:
            conn.timeout = timeout
        return conn


# ----------------------------------------------------------------------------------------------
# Serialization of local tensors
# ----------------------------------------------------------------------------------------------
def _owning_buffer(t: Tensor):
    return t.buffer if t.buffer is not None else (t.view_src.buffer if t.view_src is not None else None)


def serialize_tensor(t: Tensor | None) -> P.WireTensor | None:
    """rpc_tensor for t (None for None): buffer handle and server address only when t lives in an RPC buffer."""
    if t is None:
        return None
    buf = _owning_buffer(t)
    remote = isinstance(buf, RPCBuffer) and t.data is not None
    return P.WireTensor(
        id=id(t), type=int(t.type), buffer=buf.remote_ptr if remote else 0, ne=list(t.ne), nb=list(t.nb),
        op=int(t.op), op_params=[int(w) for w in t.op_params], flags=int(t.flags),
        src=[0 if s is None else id(s) for s in t.src], view_src=0 if t.view_src is None else id(t.view_src),
        view_offs=t.view_offs, data=buf.remote_address(t) if remote else 0, name=t.name)


def _packed(t: Tensor | None) -> bytes:
    return P.NULL_TENSOR if t is None else serialize_tensor(t).pack()


def serialize_graph(device: int, nodes: list[Tensor]) -> P.WireGraph:
    """ggml's serialize_graph: the node ids, and every tensor reachable from them through src/view_src once."""
    return P.WireGraph(device, [id(n) for n in nodes], [serialize_tensor(t) for t in reachable_tensors(nodes)])


def _needs_server_size(t: Tensor) -> bool:
    """ggml asks the server for quantized roots whose rows are not a multiple of 512 (CUDA pads them)."""
    return T.is_quantized(t.type) and t.ne[0] % 512 != 0 and t.view_src is None


# ----------------------------------------------------------------------------------------------
# Buffer type and buffer
# ----------------------------------------------------------------------------------------------
class RPCBufferType(BufferType):
    """The default buffer type of one remote device; alignment and max size are asked once, at creation."""

    def __init__(self, device: RPCDevice):
        super().__init__(device)
        self.conn = device.conn
        self.device_index = device.index
        self.name = f"RPC{device.index}[{device.endpoint}]"
        req = P.DEVICE.pack(device.index)
        self.alignment = P.U64.unpack(self.conn.call(P.Cmd.GET_ALIGNMENT, [req], P.U64.size))[0]
        self.max_size = P.U64.unpack(self.conn.call(P.Cmd.GET_MAX_SIZE, [req], P.U64.size))[0]

    def _alloc_buffer(self, size: int) -> Buffer | None:
        generation = self.conn.ensure()
        reply = self.conn.call(P.Cmd.ALLOC_BUFFER, [P.ALLOC_BUFFER_REQ.pack(self.device_index, size)],
                               P.PAIR_U64.size, generation=generation)
        remote_ptr, remote_size = P.PAIR_U64.unpack(reply)
        return RPCBuffer(self, remote_ptr, remote_size, generation) if remote_ptr else None

    def _alloc_size(self, t: Tensor) -> int:
        if not (_needs_server_size(t) or t.op in (Op.FLASH_ATTN_EXT, Op.MUL_MAT_ID)):
            return t.nbytes
        srcs = b"".join(_packed(s) for s in t.src)
        reply = self.conn.call(P.Cmd.GET_ALLOC_SIZE, [P.GET_ALLOC_SIZE_REQ.pack(self.device_index,
                                                                                _packed(t) + srcs)], P.U64.size)
        return P.U64.unpack(reply)[0]


class RPCBuffer(Buffer):
    """A buffer in the server's memory, named by the server's handle (remote_ptr)."""

    def __init__(self, buft: RPCBufferType, remote_ptr: int, size: int, generation: int):
        super().__init__(buft, size)
        self.conn = buft.conn
        self.remote_ptr = remote_ptr
        self.generation = generation
        self._remote_base: int | None = None

    def _call(self, cmd: P.Cmd, parts, reply_size: int | None = None, out: memoryview | None = None):
        return self.conn.call(cmd, parts, reply_size, out, generation=self.generation)

    @property
    def remote_base(self) -> int:
        """The buffer's address in the server (BUFFER_GET_BASE, asked once)."""
        if self._remote_base is None:
            reply = self._call(P.Cmd.BUFFER_GET_BASE, [P.U64.pack(self.remote_ptr)], P.U64.size)
            self._remote_base = P.U64.unpack(reply)[0]
        return self._remote_base

    def remote_address(self, t: Tensor) -> int:
        return self.remote_base + self.offset_of(t)

    def _free(self) -> None:
        if self.conn.connected and self.conn.generation == self.generation:
            self._call(P.Cmd.FREE_BUFFER, [P.U64.pack(self.remote_ptr)], 0)

    def _init_tensor(self, t: Tensor) -> Status:
        if _needs_server_size(t):
            self._call(P.Cmd.INIT_TENSOR, [_packed(t)], 0)
        return Status.SUCCESS

    def _set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        wire = _packed(t)
        if size > P.HASH_THRESHOLD:
            req = P.TENSOR_OFFSET_U64.pack(wire, offset, P.fnv1a_64(data[:size]))
            if P.U8.unpack(self._call(P.Cmd.SET_TENSOR_HASH, [req], P.U8.size))[0]:
                return  # the server had these bytes in its cache
        self._call(P.Cmd.SET_TENSOR, [P.SET_TENSOR_HEAD.pack(wire, offset), data[:size]])

    def _get_tensor(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        self._call(P.Cmd.GET_TENSOR, [P.TENSOR_OFFSET_U64.pack(_packed(t), offset, size)], size, out[:size])

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        """A server-side copy when src is in an RPC buffer of the same live connection (ggml: same socket)."""
        src_buf = _owning_buffer(src)
        if not isinstance(src_buf, RPCBuffer) or src_buf.conn is not self.conn or src_buf.generation != self.generation:
            return False
        reply = self._call(P.Cmd.COPY_TENSOR, [P.COPY_TENSOR_REQ.pack(_packed(src), _packed(dst))], P.U8.size)
        return bool(P.U8.unpack(reply)[0])

    def _clear(self, value: int) -> None:
        self._call(P.Cmd.BUFFER_CLEAR, [P.BUFFER_CLEAR_REQ.pack(self.remote_ptr, value & 0xFF)], 0)


# ----------------------------------------------------------------------------------------------
# Backend, device, reg
# ----------------------------------------------------------------------------------------------
class RPCBackend(Backend):
    """Computes on the server: GRAPH_COMPUTE has no reply, so a failure shows at the next call, as in ggml.

    ggml sends GRAPH_RECOMPUTE when the graph's uid is the device's last one; pyggml graphs have no
    uid, so the test is on the serialized graph itself: byte for byte the one the server stored last.
    """

    guid = P.RPC_GUID

    def __init__(self, device: RPCDevice):
        self.name = f"RPC{device.index}[{device.endpoint}]"
        super().__init__(device)

    def _graph_compute(self, graph) -> Status:
        if not graph.nodes:
            return Status.SUCCESS
        conn = self.device.conn
        generation = conn.ensure()
        for node in graph.nodes:
            for t in (node, *node.srcs):
                buf = _owning_buffer(t)
                if not isinstance(buf, RPCBuffer) or buf.conn is not conn or buf.generation != generation:
                    raise BackendError(f"backend {self.name}: tensor {t.name!r} (used by node {node.name!r}) is in "
                                       f"{buf!r}, not in a live buffer of {conn.endpoint}")
        payload = serialize_graph(self.device.index, graph.nodes).pack()
        if self.device.last_graph == (generation, payload):  # the server still holds exactly this graph
            conn.call(P.Cmd.GRAPH_RECOMPUTE, [P.DEVICE.pack(self.device.index)], generation=generation)
        else:
            conn.call(P.Cmd.GRAPH_COMPUTE, [payload], generation=generation)
            self.device.last_graph = (generation, payload)
        return Status.SUCCESS


class RPCDevice(Device):
    """Device `index` of the server at `endpoint`; named RPC<n> in the order devices were added, as in ggml."""

    type = DeviceType.GPU  # ggml reports every RPC device as a GPU

    def __init__(self, conn: Connection, index: int, name: str):
        super().__init__()
        self.conn = conn
        self.endpoint = conn.endpoint
        self.index = index
        self.name = name
        self.description = conn.endpoint
        self._buft: RPCBufferType | None = None
        self.last_graph: tuple[int, bytes] | None = None  # (generation, message) the server stored last

    def memory(self) -> tuple[int, int]:
        reply = self.conn.call(P.Cmd.GET_DEVICE_MEMORY, [P.DEVICE.pack(self.index)], P.PAIR_U64.size)
        return P.PAIR_U64.unpack(reply)

    def init_backend(self, params: str | None = None) -> RPCBackend:
        return RPCBackend(self)

    @property
    def buffer_type(self) -> RPCBufferType:
        if self._buft is None:
            self._buft = RPCBufferType(self)
        return self._buft

    def supports_op(self, t: Tensor) -> bool:
        return True  # ggml's RPC device does not ask the server either

    def supports_buft(self, buft: BufferType) -> bool:
        return isinstance(buft, RPCBufferType) and buft.conn is self.conn and buft.device_index == self.index


class RPCReg(BackendReg):
    """The "RPC" registry entry; it starts empty and gains devices through add_server."""

    name = "RPC"

    def __init__(self):
        super().__init__([])
        self._lock = threading.Lock()
        self._servers: dict[str, list[RPCDevice]] = {}
        self._next_id = 0  # device names RPC<n> count up for the life of the process, as in ggml

    @property
    def endpoints(self) -> list[str]:
        return list(self._servers)

    def add_server(self, endpoint: str, timeout: float | None = None) -> list[RPCDevice]:
        """Connect to endpoint, ask its device count and register its devices (once per endpoint)."""
        with self._lock:
            if endpoint in self._servers:
                return self._servers[endpoint]
            conn = connection(endpoint, timeout)
            (count,) = P.DEVICE.unpack(conn.call(P.Cmd.DEVICE_COUNT, [], P.DEVICE.size))
            if count == 0:
                raise RPCError(f"RPC {endpoint}: the server has no devices")
            devices = [RPCDevice(conn, i, f"RPC{self._next_id + i}") for i in range(count)]
            self._next_id += count
            for dev in devices:
                dev.reg = self
                self.devices.append(dev)
            self._servers[endpoint] = devices
        registry.register_backend(self)
        for dev in devices:
            registry.register_device(dev)
        return devices

    def remove_server(self, endpoint: str) -> None:
        """Forget a server (e.g. one that went away): its devices leave this reg and the registry; the socket closes."""
        with self._lock:
            gone = self._servers.pop(endpoint, [])
            self.devices = [d for d in self.devices if d not in gone]
        registry.unregister_backend(self)  # the registry has no per-device removal: drop the reg, re-add the rest
        if self.devices:
            registry.register_backend(self)
        with _connections_lock:
            conn = _connections.pop(endpoint, None)
        if conn is not None:
            conn.close()

    def _proc_addresses(self) -> dict:
        return {"rpc_add_server": self.add_server, "rpc_remove_server": self.remove_server}


RPC_REG = RPCReg()


def add_server(endpoint: str, timeout: float | None = None) -> list[RPCDevice]:
    """ggml_backend_rpc_add_server: the devices of the server at host:port, registered as RPC<n>."""
    return RPC_REG.add_server(endpoint, timeout)
