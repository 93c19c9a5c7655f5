"""ggml's RPC backend: use remote ggml devices from pyggml, and serve pyggml devices to ggml.

`add_server("host:port")` registers a server's devices (named RPC0, RPC1, ... as in ggml) in the
"RPC" reg and the backend registry; `RPCServer(devices, host, port).start()` (or
`pyggml rpc-server`) serves local devices over the same protocol (ggml 0.15.3, protocol 4.0.1),
validating every request and within `Limits` (docs/rpc.md: running it safely).
"""

from pyggml.backend.rpc.client import (RPC_REG, Connection, RPCBackend, RPCBuffer, RPCBufferType, RPCDevice, RPCReg,
                                       add_server, connection)
from pyggml.backend.rpc.limits import Limits
from pyggml.backend.rpc.protocol import PROTO_MAJOR, PROTO_MINOR, PROTO_PATCH
from pyggml.backend.rpc.server import RPCServer

__all__ = ["Limits", "PROTO_MAJOR", "PROTO_MINOR", "PROTO_PATCH", "RPC_REG", "Connection", "RPCBackend", "RPCBuffer",
           "RPCBufferType", "RPCDevice", "RPCReg", "RPCServer", "add_server", "connection"]
