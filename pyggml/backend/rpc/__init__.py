"""ggml's RPC backend: use remote ggml devices from pyggml, and serve pyggml devices to ggml.

`add_server("host:port")` registers a server's devices (named RPC0, RPC1, ... as in ggml) in the
"RPC" reg and the backend registry; `RPCServer(devices, host, port).start()` (or
`pyggml rpc-server`) serves local devices over the same protocol (ggml 0.15.3, protocol 4.0.1),
validating every request and within `Limits` (docs/rpc.md: running it safely).
"""

import importlib

_HOMES = {"Limits": "limits", "PROTO_MAJOR": "protocol", "PROTO_MINOR": "protocol", "PROTO_PATCH": "protocol",
          "RPCServer": "server", **dict.fromkeys(("RPC_REG", "Connection", "RPCBackend", "RPCBuffer", "RPCBufferType",
                                                  "RPCDevice", "RPCReg", "add_server", "connection"), "client")}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    """The package's names, each imported from its module when first asked for: a command that only reads the
    limits' defaults (every `pyggml` command builds rpc-server's options) does not load the client and server."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value
