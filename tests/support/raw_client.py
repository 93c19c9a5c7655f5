"""A hand-driven RPC client for the fault and hostile-client tests: it sends whatever bytes a test wants."""

from __future__ import annotations

import socket
import struct

from pyggml.backend.rpc import protocol as P


class RawClient:
    def __init__(self, endpoint, hello=True, timeout=5.0):
        host, port = endpoint.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        if hello:
            assert self.request(P.Cmd.HELLO, bytes(24), reply=True)[:3] == bytes([4, 0, 1])

    def send(self, cmd, payload=b"", declared=None):
        self.sock.sendall(struct.pack("<BQ", cmd, len(payload) if declared is None else declared) + payload)

    def request(self, cmd, payload=b"", reply=False):
        self.send(cmd, payload)
        if reply:
            (size,) = struct.unpack("<Q", P.recv_exact(self.sock, 8))
            return bytes(P.recv_exact(self.sock, size))
        return None

    def closed_by_server(self) -> bool:
        """Drain what the server sends; True once it closes, False if it is still open after the timeout."""
        try:
            while self.sock.recv(1 << 16):
                pass
            return True
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def alloc(self, size):
        """(handle, base); handle 0 when the server refused the allocation."""
        ptr, got = P.PAIR_U64.unpack(self.request(P.Cmd.ALLOC_BUFFER, P.ALLOC_BUFFER_REQ.pack(0, size), True))
        if not ptr:
            return 0, 0
        base = P.U64.unpack(self.request(P.Cmd.BUFFER_GET_BASE, P.U64.pack(ptr), True))[0]
        return ptr, base

    def close(self):
        self.sock.close()


def wire(ptr=0, data=0, ne=(16, 1, 1, 1), type_=0, tid=1, src=(), op=0, view_src=0, nb=None, op_params=(), flags=0):
    """An rpc_tensor: F32 and contiguous unless told otherwise."""
    ne = list(ne)
    if nb is None:
        size = 4 if type_ == 0 else 2
        nb = [size, size * ne[0], size * ne[0] * ne[1], size * ne[0] * ne[1] * ne[2]]
    params = list(op_params) + [0] * (16 - len(op_params))
    return P.WireTensor(id=tid, type=type_, buffer=ptr, ne=ne, nb=list(nb), op=op, op_params=params, flags=flags,
                        src=list(src) + [0] * (10 - len(src)), view_src=view_src, view_offs=0, data=data,
                        name=f"t{tid}")
