"""ggml's RPC wire format (ggml-rpc.cpp, protocol 4.0.1): commands, packed structs, framing, FNV-1a.

A request is | cmd (1 byte) | size (8 bytes, little endian) | payload |; a reply (for the
commands that have one) is | size (8 bytes) | payload |. Every struct is `#pragma pack(1)`,
so `struct` formats with "<" reproduce them byte for byte. Tensors travel as `rpc_tensor`
(296 bytes) whose `id`, `buffer`, `src` and `view_src` are opaque 64-bit handles chosen by
the sender (ggml uses pointers) and whose `data` is an address in the server's memory.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from pyggml.core.tensor import MAX_DIMS, MAX_NAME, MAX_OP_PARAMS, MAX_SRC
from pyggml.errors import RPCError

PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH = 4, 0, 1
CONN_CAPS_SIZE = 24  # transport capabilities in HELLO (RDMA); pyggml offers none: all zero
HASH_THRESHOLD = 10 * 1024 * 1024  # payloads above this go through SET_TENSOR_HASH first (both sides)
RPC_GUID = bytes([0x99, 0x68, 0x5B, 0x6C, 0xD2, 0x83, 0x3D, 0x24, 0x25, 0x36, 0x72, 0xE1, 0x5B, 0x0E, 0x14, 0x03])


class Cmd(IntEnum):
    ALLOC_BUFFER = 0
    GET_ALIGNMENT = 1
    GET_MAX_SIZE = 2
    BUFFER_GET_BASE = 3
    FREE_BUFFER = 4
    BUFFER_CLEAR = 5
    SET_TENSOR = 6
    SET_TENSOR_HASH = 7
    GET_TENSOR = 8
    COPY_TENSOR = 9
    GRAPH_COMPUTE = 10
    GET_DEVICE_MEMORY = 11
    INIT_TENSOR = 12
    GET_ALLOC_SIZE = 13
    HELLO = 14
    DEVICE_COUNT = 15
    GRAPH_RECOMPUTE = 16


# ----------------------------------------------------------------------------------------------
# rpc_tensor
# ----------------------------------------------------------------------------------------------
TENSOR = struct.Struct(f"<QIQ{MAX_DIMS}I{MAX_DIMS}II{MAX_OP_PARAMS}ii{MAX_SRC}QQQQ{MAX_NAME}s4x")
assert TENSOR.size == 296


@dataclass
class WireTensor:
    """One rpc_tensor. ne/nb are uint32 on the wire (ggml truncates larger values; so does pack)."""

    id: int
    type: int
    buffer: int
    ne: list[int]
    nb: list[int]
    op: int
    op_params: list[int]
    flags: int
    src: list[int]
    view_src: int
    view_offs: int
    data: int
    name: str = ""

    def pack(self) -> bytes:
        u32 = 0xFFFFFFFF
        return TENSOR.pack(self.id, self.type, self.buffer, *(n & u32 for n in self.ne), *(n & u32 for n in self.nb),
                           self.op, *self.op_params, self.flags, *self.src, self.view_src, self.view_offs, self.data,
                           self.name.encode("utf-8")[: MAX_NAME - 1])

    @classmethod
    def unpack(cls, raw, offset: int = 0) -> WireTensor:
        f = TENSOR.unpack_from(raw, offset)
        d, p, s = 3 + 2 * MAX_DIMS, 4 + 2 * MAX_DIMS + MAX_OP_PARAMS, 5 + 2 * MAX_DIMS + MAX_OP_PARAMS
        return cls(id=f[0], type=f[1], buffer=f[2], ne=list(f[3:3 + MAX_DIMS]), nb=list(f[3 + MAX_DIMS:d]), op=f[d],
                   op_params=list(f[d + 1:p]), flags=f[p], src=list(f[s:s + MAX_SRC]), view_src=f[s + MAX_SRC],
                   view_offs=f[s + MAX_SRC + 1], data=f[s + MAX_SRC + 2],
                   name=f[s + MAX_SRC + 3].split(b"\0", 1)[0].decode("utf-8", "replace"))


NULL_TENSOR = bytes(TENSOR.size)

# ----------------------------------------------------------------------------------------------
# Message structs (rpc_msg_*), named after ggml's
# ----------------------------------------------------------------------------------------------
HELLO_REQ = struct.Struct(f"<{CONN_CAPS_SIZE}s")
HELLO_RSP = struct.Struct(f"<BBBx{CONN_CAPS_SIZE}s")
DEVICE = struct.Struct("<I")  # get_alignment / get_max_size / get_device_memory / graph_recompute requests
U64 = struct.Struct("<Q")  # single-value replies and buffer handles
U8 = struct.Struct("<B")  # set_tensor_hash / copy_tensor results
ALLOC_BUFFER_REQ = struct.Struct("<IQ")
PAIR_U64 = struct.Struct("<QQ")  # alloc_buffer reply (remote_ptr, remote_size); device memory (free, total)
BUFFER_CLEAR_REQ = struct.Struct("<QB")
TENSOR_OFFSET_U64 = struct.Struct(f"<{TENSOR.size}sQQ")  # set_tensor_hash (offset, hash); get_tensor (offset, size)
SET_TENSOR_HEAD = struct.Struct(f"<{TENSOR.size}sQ")  # followed by the data
COPY_TENSOR_REQ = struct.Struct(f"<{TENSOR.size}s{TENSOR.size}s")
GET_ALLOC_SIZE_REQ = struct.Struct(f"<I{TENSOR.size * (1 + MAX_SRC)}s")


@dataclass
class WireGraph:
    """| device u32 | n_nodes u32 | node ids u64[n_nodes] | n_tensors u32 | rpc_tensor[n_tensors] |"""

    device: int
    nodes: list[int]
    tensors: list[WireTensor] = field(default_factory=list)

    def pack(self) -> bytes:
        n = len(self.nodes)
        return b"".join([struct.pack(f"<II{n}QI", self.device, n, *self.nodes, len(self.tensors)),
                         *(t.pack() for t in self.tensors)])

    @classmethod
    def unpack(cls, raw: bytes) -> WireGraph:
        """Parse, refusing (RPCError) a message shorter than its counts say; extra bytes are ignored, as in ggml."""
        if len(raw) < 8:
            raise RPCError(f"graph message of {len(raw)} bytes is shorter than its 8-byte header")
        device, n_nodes = struct.unpack_from("<II", raw)
        head = 8 + 8 * n_nodes + 4
        if len(raw) < head:
            raise RPCError(f"graph message of {len(raw)} bytes cannot hold its {n_nodes} node ids")
        nodes = list(struct.unpack_from(f"<{n_nodes}Q", raw, 8))
        (n_tensors,) = struct.unpack_from("<I", raw, head - 4)
        if len(raw) < head + n_tensors * TENSOR.size:
            raise RPCError(f"graph message of {len(raw)} bytes cannot hold its {n_tensors} tensors")
        return cls(device, nodes, [WireTensor.unpack(raw, head + i * TENSOR.size) for i in range(n_tensors)])


# ----------------------------------------------------------------------------------------------
# Framing over a socket whose timeout is set (every recv/send then raises socket.timeout)
# ----------------------------------------------------------------------------------------------
def recv_into_exact(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    """Fill view from the socket; a peer that closes first raises ConnectionError, one slower than `deadline`
    (a time.monotonic() instant) raises TimeoutError, whatever the pace of its bytes."""
    got, size = 0, len(view)
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out (message deadline) after {got} of {size} bytes")
            sock.settimeout(left)
        try:
            n = sock.recv_into(view[got:], min(size - got, 1 << 24))
        except TimeoutError:
            raise TimeoutError(f"timed out after {got} of {size} bytes") from None
        if n == 0:
            raise ConnectionError(f"peer closed the connection after {got} of {size} bytes")
        got += n


def recv_exact(sock: socket.socket, size: int, deadline: float | None = None) -> bytearray:
    """Exactly `size` bytes (the caller bounds `size`: the buffer is allocated before they arrive)."""
    buf = bytearray(size)
    recv_into_exact(sock, memoryview(buf), deadline)
    return buf


def send_request(sock: socket.socket, cmd: Cmd, *parts) -> int:
    """Send | cmd | size | payload parts |; returns the bytes written."""
    size = sum(len(memoryview(p).cast("B")) for p in parts)
    sock.sendall(struct.pack("<BQ", int(cmd), size))
    for p in parts:
        sock.sendall(p)
    return 9 + size


def send_reply(sock: socket.socket, *parts) -> None:
    size = sum(len(memoryview(p).cast("B")) for p in parts)
    sock.sendall(U64.pack(size))
    for p in parts:
        sock.sendall(p)


def recv_size(sock: socket.socket) -> int:
    return U64.unpack(recv_exact(sock, 8))[0]


# ----------------------------------------------------------------------------------------------
# FNV-1a (64-bit), vectorised
# ----------------------------------------------------------------------------------------------
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_CHUNK = 1 << 20
_M64 = (1 << 64) - 1


def _prime_powers(n: int) -> np.ndarray:
    """P^1 .. P^n modulo 2^64 (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        return np.cumprod(np.full(n, FNV_PRIME, dtype=np.uint64))


_POWERS = None


def fnv1a_64(data, h: int = FNV_OFFSET) -> int:
    """ggml's fnv_hash: h = (h ^ byte) * P for every byte, from the FNV offset basis, modulo 2^64.

    `h` continues a hash: fnv1a_64(b, fnv1a_64(a)) == fnv1a_64(a + b), so data can be hashed as it arrives.

    XOR with a byte changes only the low byte of h, and the low byte of the product depends only
    on the low byte of its factors. So the low bytes form a small automaton, solved bit by bit
    with prefix XORs (bit k of x*P is x_k XOR a function of the lower bits, P being odd); with
    the low bytes known, h_n = h_0 P^n + sum_i d_i P^(n-i) with d_i = (l_i ^ b_i) - l_i is linear.
    """
    global _POWERS
    if _POWERS is None:
        _POWERS = _prime_powers(_CHUNK)[::-1].copy()  # index i of a full chunk: P^(CHUNK - i)
    raw = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    for start in range(0, raw.size, _CHUNK):
        b = raw[start:start + _CHUNK]
        low = _low_bytes(h & 0xFF, b)
        d = ((low ^ b).astype(np.int16) - low).astype(np.int64).astype(np.uint64)
        m = b.size
        with np.errstate(over="ignore"):
            tail = int(np.dot(d, _POWERS[_CHUNK - m:]))
        h = (h * pow(FNV_PRIME, m, 1 << 64) + tail) & _M64
    return h


def _low_bytes(l0: int, b: np.ndarray) -> np.ndarray:
    """l_i (the low byte of h before byte i) for every i, given l_0 and the bytes b (uint8: products wrap mod 256)."""
    low = np.zeros(b.size, dtype=np.uint8)
    low[0] = l0
    p8 = np.uint8(FNV_PRIME & 0xFF)
    for k in range(8):
        x_lo = (low ^ b) & np.uint8((1 << k) - 1)
        flip = ((x_lo * p8) ^ b) >> np.uint8(k) & np.uint8(1)  # bit k of l_{i+1} = bit k of l_i ^ flip_i
        bits = np.bitwise_xor.accumulate(flip[:-1]) ^ np.uint8((l0 >> k) & 1)
        low[1:] |= bits << np.uint8(k)
    return low
