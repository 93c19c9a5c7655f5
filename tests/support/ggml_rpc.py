"""ggml's own RPC server and client (ggml-python's libggml-rpc.so, ggml 0.15.3) for the RPC tests.

`ggml_server(...)` runs `ggml_backend_rpc_start_server` on ggml's CPU device in a subprocess on a
free loopback port; `pyggml_server(...)` runs `pyggml rpc-server` the same way. Both are context
managers that kill the process at the end. `GGMLRPC` declares the client functions with correct
ctypes signatures (ggml-python's are partly stale).
"""

from __future__ import annotations

import contextlib
import ctypes as C
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from tests.support.ggml_peer import declare, lib_dir, library

REPO = Path(__file__).resolve().parents[2]

SERVER_SCRIPT = r"""
import ctypes as C, sys
d, endpoint, cache = sys.argv[1], sys.argv[2], sys.argv[3] or None
base = C.CDLL(d + "/libggml-base.so", mode=C.RTLD_GLOBAL)
cpu = C.CDLL(d + "/libggml-cpu.so", mode=C.RTLD_GLOBAL)
rpc = C.CDLL(d + "/libggml-rpc.so", mode=C.RTLD_GLOBAL)
cpu.ggml_backend_cpu_reg.restype = C.c_void_p
base.ggml_backend_reg_dev_get.restype = C.c_void_p
base.ggml_backend_reg_dev_get.argtypes = [C.c_void_p, C.c_size_t]
dev = base.ggml_backend_reg_dev_get(cpu.ggml_backend_cpu_reg(), 0)
rpc.ggml_backend_rpc_start_server.argtypes = [C.c_char_p, C.c_char_p, C.c_size_t, C.c_size_t, C.c_void_p]
devs = (C.c_void_p * 1)(dev)
rpc.ggml_backend_rpc_start_server(endpoint.encode(), cache.encode() if cache else None, 1, 1, devs)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return  # note: ggml's server then serves (and drops) this probe connection
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


@contextlib.contextmanager
def _running(cmd: list[str], port: int):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        wait_listening(port, proc)
        yield SimpleNamespace(endpoint=f"127.0.0.1:{port}", port=port, proc=proc)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def ggml_server(cache_dir: str | None = None):
    """ggml's rpc-server on its CPU device, in a subprocess: yields .endpoint, .proc."""
    port = free_port()
    return _running([sys.executable, "-c", SERVER_SCRIPT, str(lib_dir()), f"127.0.0.1:{port}", cache_dir or ""], port)


def pyggml_server(*extra: str):
    """`pyggml rpc-server` in a subprocess: yields .endpoint, .proc."""
    port = free_port()
    return _running([sys.executable, "-m", "pyggml.cli.main", "rpc-server", "--port", str(port), *extra], port)


_P = C.c_void_p
_SIGNATURES = {
    "ggml_backend_rpc_init": (_P, [C.c_char_p, C.c_uint32]),
    "ggml_backend_rpc_get_device_memory": (None, [C.c_char_p, C.c_uint32, C.POINTER(C.c_size_t),
                                                  C.POINTER(C.c_size_t)]),
    "ggml_backend_rpc_buffer_type": (_P, [C.c_char_p, C.c_uint32]),
    "ggml_backend_buft_alloc_buffer": (_P, [_P, C.c_size_t]),
    "ggml_backend_buft_get_alignment": (C.c_size_t, [_P]),
    "ggml_backend_buft_get_max_size": (C.c_size_t, [_P]),
    "ggml_backend_buffer_get_size": (C.c_size_t, [_P]),
    "ggml_backend_buffer_clear": (None, [_P, C.c_uint8]),
    "ggml_backend_tensor_alloc": (C.c_int, [_P, _P, _P]),
    "ggml_backend_tensor_copy": (None, [_P, _P]),
    "ggml_new_tensor_1d": (_P, [_P, C.c_int, C.c_int64]),
}


def rpc_library() -> SimpleNamespace:
    """The RPC client functions plus everything tests.peer.ggml_peer declares."""
    lib = library()
    rpc = C.CDLL(str(lib_dir() / "libggml-rpc.so"), mode=C.RTLD_GLOBAL)
    return SimpleNamespace(**{**vars(lib), **declare([rpc, *lib.handles], _SIGNATURES)})
