"""`pyggml rpc-server`: serve pyggml devices to ggml (llama.cpp's rpc-server) and pyggml RPC clients."""

from __future__ import annotations

import logging

from pyggml import backend
from pyggml.errors import BackendError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("rpc-server", help="serve local devices over ggml's RPC protocol")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only)")
    p.add_argument("--port", "-p", type=int, default=50052, help="TCP port (default 50052, as ggml; 0 = any free)")
    p.add_argument("--backend", "-d", action="append",
                   help="device to serve, e.g. CPU, TORCH_CPU, CUDA0 (repeat for several; default CPU)")
    p.add_argument("--threads", "-t", type=int, default=None, help="compute threads (where the device supports it)")
    p.add_argument("--cache", "-c", help="directory for the tensor cache (SET_TENSOR_HASH); off by default")
    p.set_defaults(run=run)


def run(args) -> int:
    from pyggml.backend.rpc import RPCServer

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    devices = []
    for name in args.backend or ["CPU"]:
        dev = backend.device_by_name(name)
        if dev is None:  # a plugin's device (TORCH_CPU, CUDA0): load them only then (importing torch is slow)
            backend.load_all()
            dev = backend.device_by_name(name)
        if dev is None:
            known = ", ".join(d.name for d in backend.devices())
            raise BackendError(f"no device named {name!r}; registered devices: {known}")
        devices.append(dev)
    with RPCServer(devices, args.host, args.port, cache_dir=args.cache, n_threads=args.threads) as server:
        print(f"pyggml RPC server v4.0.1 listening on {server.endpoint}", flush=True)
        for dev in devices:
            free, total = dev.memory()
            print(f"  {dev.name}: {dev.description} ({total >> 20} MiB, {free >> 20} MiB free)", flush=True)
        if args.cache:
            print(f"  local cache: {args.cache}", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0
