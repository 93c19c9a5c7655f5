"""`pyggml rpc-server`: serve pyggml devices to ggml (llama.cpp's rpc-server) and pyggml RPC clients."""

from __future__ import annotations

import argparse
import contextlib
import logging

from pyggml import backend
from pyggml.backend.rpc.limits import Limits, parse_size
from pyggml.cli.args import port, positive_int
from pyggml.errors import BackendError, RPCError


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("rpc-server", help="serve local devices over ggml's RPC protocol")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: loopback only; any other address prints a warning: "
                        "the protocol has no authentication)")
    p.add_argument("--port", "-p", type=port, default=50052, help="TCP port (default 50052, as ggml; 0 = any free)")
    p.add_argument("--backend", "-d", action="append",
                   help="device to serve, e.g. CPU, TORCH_CPU, CUDA0 (repeat for several; default CPU)")
    p.add_argument("--threads", "-t", type=positive_int, default=None,
                   help="compute threads (where the device supports it)")
    p.add_argument("--cache", "-c", help="directory for the tensor cache (SET_TENSOR_HASH); off by default")
    d = Limits()
    g = p.add_argument_group("limits (docs/rpc.md)")
    g.add_argument("--max-connections", type=int, default=d.max_connections,
                   help=f"clients served at once; more are refused (default {d.max_connections})")
    g.add_argument("--max-buffer-memory", type=_size, default=None, metavar="BYTES",
                   help="buffer bytes per device, all clients together, e.g. 8G (default: the device's free memory "
                        "minus a tenth, at least 256 MiB)")
    g.add_argument("--max-connection-memory", type=_size, default=None, metavar="BYTES",
                   help="buffer bytes per device for one client (default: as --max-buffer-memory)")
    g.add_argument("--request-timeout", type=float, default=d.request_timeout, metavar="SECONDS",
                   help=f"time for a message to arrive, plus its size at --min-transfer-rate "
                        f"(default {d.request_timeout:g})")
    g.add_argument("--min-transfer-rate", type=_size, default=d.min_transfer_rate, metavar="BYTES",
                   help="bytes per second a long message must keep up (default 1M)")
    g.add_argument("--compute-timeout", type=float, default=d.compute_timeout, metavar="SECONDS",
                   help=f"abort a graph compute after this long; 0 = never (default {d.compute_timeout:g})")
    g.add_argument("--max-graph-tensors", type=int, default=d.max_graph_tensors,
                   help=f"node ids and tensors in one graph (default {d.max_graph_tensors})")
    g.add_argument("--work-per-byte", type=int, default=d.work_per_byte,
                   help=f"element operations a graph may do per byte of the buffers it touches "
                        f"(default {d.work_per_byte})")
    p.set_defaults(run=run)


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except RPCError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def limits_from(args) -> Limits:
    return Limits(max_connections=args.max_connections, max_buffer_memory=args.max_buffer_memory,
                  max_connection_memory=args.max_connection_memory, request_timeout=args.request_timeout,
                  min_transfer_rate=args.min_transfer_rate, compute_timeout=args.compute_timeout,
                  max_graph_tensors=args.max_graph_tensors, work_per_byte=args.work_per_byte)


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
    limits = limits_from(args)
    with RPCServer(devices, args.host, args.port, cache_dir=args.cache, limits=limits,
                   n_threads=args.threads) as server:
        print(f"pyggml RPC server v4.0.1 listening on {server.endpoint}", flush=True)
        for dev, cap, per_client in zip(devices, server.memory_limits, server.connection_memory_limits, strict=True):
            free, total = dev.memory()
            print(f"  {dev.name}: {dev.description} ({total >> 20} MiB, {free >> 20} MiB free; buffers up to "
                  f"{cap >> 20} MiB, {per_client >> 20} MiB per client)", flush=True)
        print(f"  limits: {limits.max_connections} connections, compute timeout {limits.compute_timeout:g} s, "
              f"request timeout {limits.request_timeout:g} s", flush=True)
        if args.cache:
            print(f"  local cache: {args.cache}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.serve_forever()
    return 0
