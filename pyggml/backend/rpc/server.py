"""The RPC server: any pyggml devices, served over ggml's RPC protocol to ggml or pyggml clients.

Like ggml's rpc_serve_client, each connection is a session with its own buffers (freed when it
ends) and its own last graph (for GRAPH_RECOMPUTE); unlike ggml, sessions run in parallel, one
thread each, and nothing a client sends is trusted. Every descriptor is validated up front as a
tensor ggml could have built, every graph node's op, sources and op_params are checked, a graph's
work is bounded by the bytes of the buffers it touches (validate.py), payloads stream into their
destination, and memory, connections, message times and compute times are limited (limits.py).
A request that fails a check closes that client's connection, with the reason logged, while the
server keeps serving everyone else. ggml aborts the whole server process on some of these
(out-of-buffer tensors in deserialize_tensor, a failed compute); pyggml only drops the one connection.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from pyggml.backend.base import Buffer, Device, Status, computed_nodes
from pyggml.backend.rpc import protocol as P
from pyggml.backend.rpc.limits import Limits, default_buffer_memory, warn_if_exposed
from pyggml.backend.rpc.validate import Refused, check_layout, check_node, node_work
from pyggml.core import types as T
from pyggml.core.graph import Graph
from pyggml.core.tensor import MAX_SRC, VIEW_OPS, Op, Tensor, TensorFlag
from pyggml.errors import AllocationError, GGMLError, ParameterError, RPCError

log = logging.getLogger("pyggml.rpc.server")

_KNOWN_FLAGS = sum(int(f) for f in TensorFlag)
CHUNK = 1 << 20  # payloads stream through a buffer of this size
DISCONNECT_POLL = 0.05  # seconds between checks, during a compute, that its client is still there

__all__ = ["Limits", "RPCServer", "Refused", "Session"]


class RPCServer:
    """Serves `devices` on host:port (port 0: any free port, see `address`), within `limits`.

    `start()` runs the accept loop in a background thread, `serve_forever()` in the caller's.
    Thread-safety: one thread per connection (at most limits.max_connections); a lock per device
    serializes computes, and the memory accounting has its own lock.
    """

    def __init__(self, devices: list[Device], host: str = "127.0.0.1", port: int = 0, cache_dir: str | None = None,
                 limits: Limits | None = None, n_threads: int | None = None):
        if not devices:
            raise RPCError("RPC server: at least one device is needed")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ParameterError(f"RPC server: port must be 0 (any free port) to 65535, got {port!r}")
        if n_threads is not None and (isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1):
            raise ParameterError(f"RPC server: n_threads must be a positive integer or None, got {n_threads!r}")
        self.devices = list(devices)
        self.limits = limits or Limits()
        self.backends = [dev.init_backend() for dev in self.devices]
        self._abort_setters = []
        for dev, backend in zip(self.devices, self.backends, strict=True):  # as ggml: where the device's reg offers it
            reg = dev.reg
            set_n_threads = reg.get_proc_address("set_n_threads") if reg is not None else None
            if n_threads and set_n_threads is not None:
                set_n_threads(backend, n_threads)
            set_abort = reg.get_proc_address("set_abort_callback") if reg is not None else None
            if set_abort is None:
                log.warning("device %s offers no abort callback: its computes cannot be stopped on disconnect or "
                            "timeout (only the up-front work bound applies)", dev.name)
            self._abort_setters.append(set_abort)
        self.memory_limits = [self._limit(self.limits.max_buffer_memory, dev) for dev in self.devices]
        self.connection_memory_limits = [self._limit(self.limits.max_connection_memory, dev) for dev in self.devices]
        self._allocated = [0] * len(self.devices)
        self._device_locks = [threading.Lock() for _ in self.devices]
        self.cache_dir = Path(cache_dir) if cache_dir else None
        if self.cache_dir:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._handles = itertools.count(1)
        warn_if_exposed(host)
        self._listener = socket.create_server((host, port))
        self.address = self._listener.getsockname()[:2]
        self._closed = threading.Event()
        self._sessions: set[Session] = set()
        self._lock = threading.Lock()

    @staticmethod
    def _limit(value: int | None, dev: Device) -> int:
        return default_buffer_memory(dev.memory()[0]) if value is None else value

    @property
    def endpoint(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

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
            with self._lock:
                full = len(self._sessions) >= self.limits.max_connections
                if not full:
                    session = Session(self, sock, peer)
                    self._sessions.add(session)
            if full:
                log.warning("RPC client %s refused: %d connections are open, the limit (max_connections)", peer,
                            self.limits.max_connections)
                sock.close()
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=session.run, name=f"rpc-session-{peer}", daemon=True).start()

    def forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)

    # ----- memory accounting ----------------------------------------------------------------------
    def reserve(self, session: Session, device: int, size: int) -> str | None:
        """Count `size` bytes against the device's and the session's limits; the reason when over either."""
        with self._lock:
            if self._allocated[device] + size > self.memory_limits[device]:
                return (f"all clients would hold {self._allocated[device] + size} bytes on device {device}, over "
                        f"max_buffer_memory={self.memory_limits[device]}")
            if session.allocated[device] + size > self.connection_memory_limits[device]:
                return (f"this client would hold {session.allocated[device] + size} bytes on device {device}, over "
                        f"max_connection_memory={self.connection_memory_limits[device]}")
            self._allocated[device] += size
            session.allocated[device] += size
        return None

    def release(self, session: Session, device: int, size: int) -> None:
        """Uncount `size` bytes (negative: count bytes a buffer type added by rounding up, whatever the limits)."""
        with self._lock:
            self._allocated[device] -= size
            session.allocated[device] -= size

    # ----- computes -------------------------------------------------------------------------------
    def compute(self, session: Session, device: int, graph: Graph) -> None:
        """Run graph on the device, one compute at a time, aborting it when its client goes or time runs out."""
        timeout = self.limits.compute_timeout
        lock = self._device_locks[device]
        if not lock.acquire(timeout=2 * timeout if timeout else -1):
            raise Refused(f"device {device} stayed busy for {2 * timeout} s")
        try:
            backend, set_abort = self.backends[device], self._abort_setters[device]
            watch = ComputeWatch(self, session, timeout)
            if set_abort is not None:
                set_abort(backend, watch)
            try:
                status = backend.graph_compute(graph)
            finally:
                if set_abort is not None:
                    set_abort(backend, None)
        finally:
            lock.release()
        if status == Status.ABORTED:
            raise Refused(f"graph compute on {self.devices[device].name} aborted: {watch.reason}")
        if status != Status.SUCCESS:
            raise Refused(f"graph compute on {self.devices[device].name} returned {status!r}")

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


class ComputeWatch:
    """The abort callback of one compute: True once its time is up, its client has gone or the server closes."""

    def __init__(self, server: RPCServer, session: Session, timeout: float):
        now = time.monotonic()
        self.server, self.session = server, session
        self.deadline = now + timeout if timeout else None
        self.next_poll = now + DISCONNECT_POLL
        self.reason = ""

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline:
            self.reason = f"it ran past compute_timeout={self.server.limits.compute_timeout} s"
        elif self.server.closed:
            self.reason = "the server is closing"
        elif now >= self.next_poll:
            self.next_poll = now + DISCONNECT_POLL
            if self.session.peer_gone():
                self.reason = "its client disconnected"
        return bool(self.reason)


class Session:
    """One client connection: its buffers by handle, its last graph per device, and the command loop."""

    def __init__(self, server: RPCServer, sock: socket.socket, peer):
        self.server = server
        self.sock = sock
        self.peer = peer
        self.buffers: dict[int, Buffer] = {}
        self.buffer_devices: dict[int, int] = {}
        self.allocated = [0] * len(server.devices)
        self.graphs: dict[int, Graph] = {}
        self.deadline: float | None = None  # when the message being received must be complete

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def peer_gone(self) -> bool:
        """True when the client closed or reset its end (what it sent but we have not read yet stays queued)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
            return bool(readable) and not self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except (OSError, ValueError):
            return True

    def run(self) -> None:
        try:
            self._hello()
            while self._serve_one():
                pass
        except Refused as e:
            log.warning("RPC client %s refused: %s; closing its connection", self.peer, e)
        except (OSError, GGMLError) as e:
            log.warning("RPC client %s: %s: %s; closing its connection", self.peer, type(e).__name__, e)
        except Exception:  # a thread boundary: whatever a request triggered, only this connection ends
            log.exception("RPC client %s: request failed; closing its connection", self.peer)
        finally:
            self.graphs.clear()
            for handle in list(self.buffers):
                self._drop_buffer(handle)
            self.sock.close()
            self.server.forget(self)

    # ----- framing --------------------------------------------------------------------------------
    def _recv_cmd(self) -> int | None:
        self.sock.settimeout(None)  # a client may stay idle between requests
        raw = self.sock.recv(1)
        if not raw:
            return None
        self.deadline = time.monotonic() + self.server.limits.request_timeout  # for the size field
        return raw[0]

    def _recv(self, size: int) -> bytearray:
        return P.recv_exact(self.sock, size, self.deadline)

    def _recv_into(self, view: memoryview) -> None:
        P.recv_into_exact(self.sock, view, self.deadline)

    def _recv_size(self, what: P.Cmd, limit: int) -> int:
        """The request's size field, refused above what the command can carry; starts the message's deadline."""
        (size,) = P.U64.unpack(self._recv(8))
        if size > limit:
            raise Refused(f"{what.name} request of {size} bytes exceeds what it can carry ({limit} bytes)")
        self.deadline = self.server.limits.message_deadline(time.monotonic(), size)
        return size

    def _discard(self, size: int) -> None:
        """Read and drop `size` bytes (extra bytes after a graph, ignored as in ggml)."""
        scratch = memoryview(bytearray(min(size, CHUNK)))
        while size:
            n = min(size, len(scratch))
            self._recv_into(scratch[:n])
            size -= n

    def _hello(self) -> None:
        cmd = self._recv_cmd()
        if cmd != P.Cmd.HELLO:
            raise Refused(f"first command is {cmd}, expected HELLO ({int(P.Cmd.HELLO)})")
        if self._recv_size(P.Cmd.HELLO, P.HELLO_REQ.size) != P.HELLO_REQ.size:
            raise Refused(f"HELLO request is not {P.HELLO_REQ.size} bytes")
        self._recv(P.HELLO_REQ.size)
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
        handler, fixed = _HANDLERS[cmd]
        if fixed is None:  # variable size: the handler streams the payload itself
            handler(self, self._recv_size(cmd, self._size_limit(cmd)))
            return True
        if self._recv_size(cmd, fixed) != fixed:
            raise Refused(f"{cmd.name} request is not {fixed} bytes")
        request = self._recv(fixed)
        self.sock.settimeout(self.server.limits.request_timeout)  # each reply (or 1 MiB of it) must go in time
        reply = handler(self, request)
        if reply is not None:
            P.send_reply(self.sock, reply)
        return True

    def _size_limit(self, cmd: P.Cmd) -> int:
        if cmd == P.Cmd.GRAPH_COMPUTE:
            return self.server.limits.graph_message_size()
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
        """A local tensor for an rpc_tensor (deserialize_tensor), validated as one ggml could have made.

        An unknown buffer handle means no buffer (as in ggml); then `data` must be 0.
        """
        try:
            type_ = T.as_type(wire.type)
            T.blck_size(type_)
            op = Op(wire.op)
            t = Tensor(type_, wire.ne, wire.nb, op=op, name=wire.name)
        except (GGMLError, ValueError, KeyError) as e:
            raise Refused(f"tensor {wire.name!r}: bad type {wire.type}, op {wire.op} or shape {wire.ne}: {e}") from None
        t.op_params = [int(w) for w in wire.op_params]
        t.flags = TensorFlag(wire.flags & _KNOWN_FLAGS)
        buf = self.buffers.get(wire.buffer)
        check_layout(t, wire.view_src != 0 or op in VIEW_OPS, buf.size if buf is not None else None)
        if buf is not None:
            base = buf.base or 0
            if not (base <= wire.data and wire.data + t.nbytes <= base + buf.size):
                raise Refused(f"tensor {wire.name!r}: {t.nbytes} bytes at 0x{wire.data:x} lie outside buffer "
                              f"0x{wire.buffer:x} [0x{base:x}, 0x{base + buf.size:x})")
            t.buffer, t.data = buf, wire.data
        elif wire.data:
            raise Refused(f"tensor {wire.name!r} has data 0x{wire.data:x} but no buffer of this connection")
        return t

    def _bound_tensor(self, raw, offset: int = 0) -> Tensor:
        wire = P.WireTensor.unpack(raw, offset)
        t = self._tensor(wire)
        if t.buffer is None:
            raise Refused(f"tensor {wire.name!r} is in no buffer of this connection (handle 0x{wire.buffer:x})")
        return t

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
        """A new buffer, or ggml's answer to a failed allocation (a null handle) when over a limit or memory."""
        index, size = P.ALLOC_BUFFER_REQ.unpack(request)
        dev = self.server.devices[self._device(index)]
        refusal = self.server.reserve(self, index, size)
        if refusal is None and size > dev.memory()[0]:
            self.server.release(self, index, size)
            refusal = f"{size} bytes requested, {dev.memory()[0]} free"
        if refusal is not None:
            log.info("RPC client %s: alloc_buffer of %d bytes on %s refused: %s", self.peer, size, dev.name, refusal)
            return P.PAIR_U64.pack(0, 0)
        try:
            buf = dev.buffer_type.alloc_buffer(size)
        except (AllocationError, MemoryError) as e:
            self.server.release(self, index, size)
            log.info("RPC client %s: alloc_buffer of %d bytes on %s failed: %s", self.peer, size, dev.name, e)
            return P.PAIR_U64.pack(0, 0)
        self.server.release(self, index, size - buf.size)  # count what the buffer holds (it may round up)
        handle = self.server.new_handle()
        self.buffers[handle] = buf
        self.buffer_devices[handle] = index
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
        self._buffer(handle)
        self._drop_buffer(handle)
        return b""

    def _drop_buffer(self, handle: int) -> None:
        buf = self.buffers.pop(handle)
        self.server.release(self, self.buffer_devices.pop(handle), buf.size)
        buf.free()

    def buffer_clear(self, request) -> bytes:
        handle, value = P.BUFFER_CLEAR_REQ.unpack(request)
        self._buffer(handle).clear(value)
        return b""

    def set_tensor(self, size: int) -> None:
        """| rpc_tensor | offset | data |: the data streams into the tensor (and the cache) as it arrives."""
        if size < P.SET_TENSOR_HEAD.size:
            raise Refused(f"SET_TENSOR request of {size} bytes is shorter than its header")
        head = self._recv(P.SET_TENSOR_HEAD.size)
        t = self._bound_tensor(head)
        (offset,) = P.U64.unpack_from(head, P.TENSOR.size)
        n = size - P.SET_TENSOR_HEAD.size
        self._check_region(t, offset, n)
        cache = CacheWriter(self.server.cache_dir) if self.server.cache_dir and n > P.HASH_THRESHOLD else None
        try:
            chunk = memoryview(bytearray(min(n, CHUNK)))
            done = 0
            while done < n:
                k = min(len(chunk), n - done)
                self._recv_into(chunk[:k])
                t.buffer.set_tensor(t, chunk[:k], offset + done, k)
                if cache is not None:
                    cache.write(chunk[:k])
                done += k
            if cache is not None:
                cache.commit()
        finally:
            if cache is not None:
                cache.discard()

    def set_tensor_hash(self, request) -> bytes:
        wire_raw, offset, digest = P.TENSOR_OFFSET_U64.unpack(request)
        path = self.server.cache_dir / f"{digest:016x}" if self.server.cache_dir else None
        if path is None or not path.is_file():
            return P.U8.pack(0)
        t = self._bound_tensor(wire_raw)
        size = path.stat().st_size
        self._check_region(t, offset, size)
        chunk = memoryview(bytearray(min(size, CHUNK)))
        with path.open("rb") as f:
            done = 0
            while done < size:
                k = f.readinto(chunk[:min(len(chunk), size - done)])
                if not k:
                    raise Refused(f"cache file {path} shrank while being read")
                t.buffer.set_tensor(t, chunk[:k], offset + done, k)
                done += k
        return P.U8.pack(1)

    def get_tensor(self, request) -> None:
        """The reply streams from the tensor in chunks (no copy of the whole region)."""
        wire_raw, offset, size = P.TENSOR_OFFSET_U64.unpack(request)
        t = self._bound_tensor(wire_raw)
        self._check_region(t, offset, size)
        self.sock.sendall(P.U64.pack(size))
        chunk = memoryview(bytearray(min(size, CHUNK)))
        done = 0
        while done < size:
            k = min(len(chunk), size - done)
            t.buffer.get_tensor(t, chunk[:k], offset + done, k)
            self.sock.sendall(chunk[:k])
            done += k

    def copy_tensor(self, request) -> bytes:
        src = self._bound_tensor(request, 0)
        dst = self._bound_tensor(request, P.TENSOR.size)
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

    def graph_compute(self, size: int) -> None:
        """| device u32 | n_nodes u32 | ids u64[n_nodes] | n_tensors u32 | rpc_tensor[n_tensors] |, read piece by piece
        (each count checked against max_graph_tensors and the announced size before its part is read)."""
        limit = self.server.limits.max_graph_tensors
        if size < 8:
            raise Refused(f"GRAPH_COMPUTE request of {size} bytes is shorter than its 8-byte header")
        device, n_nodes = struct.unpack("<II", self._recv(8))
        self._device(device)
        if n_nodes > limit or size < 12 + 8 * n_nodes:
            raise Refused(f"GRAPH_COMPUTE of {size} bytes announces {n_nodes} nodes (limit {limit})")
        nodes = struct.unpack(f"<{n_nodes}Q", self._recv(8 * n_nodes))
        (n_tensors,) = struct.unpack("<I", self._recv(4))
        need = 12 + 8 * n_nodes + n_tensors * P.TENSOR.size
        if n_tensors > limit or size < need:
            raise Refused(f"GRAPH_COMPUTE of {size} bytes announces {n_tensors} tensors (limit {limit}, "
                          f"{need} bytes needed)")
        raw = bytearray()
        for first in range(0, n_tensors, 1024):  # grows with what arrives, not with what was announced
            part = self._recv(min(1024, n_tensors - first) * P.TENSOR.size)
            raw += part
        self._discard(size - need)
        graph = self._graph(device, nodes, raw, n_tensors)
        self.graphs[device] = graph
        self.server.compute(self, device, graph)

    def graph_recompute(self, request) -> None:
        device = self._device(P.DEVICE.unpack(request)[0])
        if device not in self.graphs:
            raise Refused(f"GRAPH_RECOMPUTE on device {device} before any GRAPH_COMPUTE")
        self.server.compute(self, device, self.graphs[device])

    def _graph(self, device: int, node_ids, raw: bytearray, n_tensors: int) -> Graph:
        """Tensors for every node and what it reaches (create_node), each validated; then the nodes and the work."""
        ids = np.frombuffer(raw, dtype="<u8").reshape(n_tensors, P.TENSOR.size // 8)[:, 0].tolist()
        by_id = {tid: i for i, tid in reversed(list(enumerate(ids)))}  # ggml keeps the first of duplicate ids
        made: dict[int, Tensor] = {}
        todo: list[int] = []

        def make(tid: int, why: str) -> Tensor:
            t = made.get(tid)
            if t is None:
                i = by_id.get(tid)
                if i is None:
                    raise Refused(f"graph references tensor id 0x{tid:x} ({why}) that the message does not contain")
                wire = P.WireTensor.unpack(raw, i * P.TENSOR.size)
                t = made[tid] = self._tensor(wire)
                if t.buffer is None and not t.is_empty:
                    raise Refused(f"graph tensor {wire.name!r} ({why}) is in no buffer of this connection")
                todo.append(tid)
            return t

        nodes = [make(nid, f"node {i}") for i, nid in enumerate(node_ids)]
        while todo:
            tid = todo.pop()
            w, t = P.WireTensor.unpack(raw, by_id[tid] * P.TENSOR.size), made[tid]
            for i, sid in enumerate(w.src):
                t.src[i] = make(sid, f"src[{i}] of {w.name!r}") if sid else None
            if w.view_src:
                t.view_src = make(w.view_src, f"view_src of {w.name!r}")
                t.view_offs = w.view_offs
        graph = Graph(size=max(len(nodes), 1))
        graph.nodes = nodes
        self._check_graph(device, graph, made.values())
        return graph

    def _check_graph(self, device: int, graph: Graph, tensors) -> None:
        """Every computed node as ggml's builder would make it; the graph's work within its buffers' budget."""
        supports_op = self.server.backends[device].supports_op
        work = 0
        for node in computed_nodes(graph):
            check_node(node, supports_op)
            work += node_work(node)
        touched = sum({id(t.buffer): t.buffer.size for t in tensors if t.buffer is not None}.values())
        limits = self.server.limits
        budget = limits.work_per_byte * touched + limits.base_work
        if work > budget:
            raise Refused(f"graph of {len(graph.nodes)} nodes would do about {work} element operations, over its "
                          f"budget of {budget} (work_per_byte={limits.work_per_byte} x {touched} bytes of buffers "
                          f"+ base_work={limits.base_work})")


class CacheWriter:
    """A SET_TENSOR payload copied into the tensor cache as it arrives: hashed on the way, renamed when complete."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = cache_dir
        fd, name = tempfile.mkstemp(dir=cache_dir, prefix=".incoming-")
        self.file, self.path = os.fdopen(fd, "wb"), Path(name)
        self.hash = P.FNV_OFFSET

    def write(self, data: memoryview) -> None:
        self.hash = P.fnv1a_64(data, self.hash)
        self.file.write(data)

    def commit(self) -> None:
        self.file.close()
        self.path.replace(self.cache_dir / f"{self.hash:016x}")

    def discard(self) -> None:
        if not self.file.closed:
            self.file.close()
        self.path.unlink(missing_ok=True)


_HANDLERS = {  # command -> (handler, request size; None: the handler reads a payload of the announced size)
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
