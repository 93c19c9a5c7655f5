"""The RPC server's limits: what one client, and all of them together, may make the server hold or do.

ggml's protocol has no authentication and no error replies: a request over a limit closes that
client's connection (or, for ALLOC_BUFFER, gets ggml's answer to a failed allocation, a null
buffer), and the server logs why. Every limit has a `pyggml rpc-server` flag.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass

from pyggml.errors import RPCError

log = logging.getLogger("pyggml.rpc.server")

MEMORY_MARGIN_FRACTION = 10  # the default buffer limit leaves 1/10 of the device's free memory ...
MEMORY_MARGIN_MIN = 256 << 20  # ... and at least 256 MiB


@dataclass(frozen=True)
class Limits:
    """Defaults suit a server on a trusted network; `None` memory limits mean "the device's free memory minus a
    margin" (see `default_buffer_memory`)."""

    max_connections: int = 64  # clients served at once; more are refused on accept
    max_buffer_memory: int | None = None  # bytes of buffers on one device, all clients together
    max_connection_memory: int | None = None  # bytes of buffers on one device, one client
    request_timeout: float = 60.0  # seconds for a message to arrive once its command byte came ...
    min_transfer_rate: int = 1 << 20  # ... plus its size at this many bytes per second (slow clients end)
    compute_timeout: float = 600.0  # seconds a graph compute may run before it is aborted; 0 = no limit
    max_graph_tensors: int = 65536  # node ids and tensors in one GRAPH_COMPUTE message
    work_per_byte: int = 4096  # element operations a graph may do per byte of the buffers it touches ...
    base_work: int = 1 << 28  # ... plus this many, for small graphs

    def __post_init__(self):
        for name in ("max_connections", "request_timeout", "min_transfer_rate", "max_graph_tensors"):
            if getattr(self, name) <= 0:
                raise RPCError(f"RPC server limit {name} must be positive, got {getattr(self, name)}")
        for name in ("compute_timeout", "work_per_byte", "base_work", "max_buffer_memory", "max_connection_memory"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise RPCError(f"RPC server limit {name} must be >= 0, got {value}")

    def message_deadline(self, now: float, size: int) -> float:
        """When a message of `size` bytes must have arrived in full."""
        return now + self.request_timeout + size / self.min_transfer_rate

    def graph_message_size(self) -> int:
        """The largest GRAPH_COMPUTE payload: header, max_graph_tensors node ids and tensors (296 bytes each)."""
        return 12 + self.max_graph_tensors * (8 + 296)


def default_buffer_memory(free: int) -> int:
    """The device's free memory (as it reports it) minus a margin of a tenth, at least 256 MiB."""
    return max(free - max(free // MEMORY_MARGIN_FRACTION, MEMORY_MARGIN_MIN), 0)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from '1073741824', '512M', '8G', '1.5GiB' (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise RPCError(f"cannot read {text!r} as a size (examples: 1048576, 512M, 8G)")
    return int(float(m.group(1)) * (1 << (10 * " KMGT".index(m.group(2).upper() or " "))))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_exposed(host: str) -> bool:
    """Log, as ggml's rpc-server prints, that a non-loopback address exposes an unauthenticated protocol."""
    if is_loopback(host):
        return False
    log.warning("WARNING: the RPC server binds %r, which is not a loopback address. The RPC protocol has no "
                "authentication or encryption: anyone who can reach this port can use the devices, read and write "
                "their buffers and run graphs. Never expose it to an open network; see docs/rpc.md (SSH tunnel, "
                "firewall).", host)
    return True
