"""Gemma 3 270M with its layers split across the local CPU backend and two RPC servers, through the scheduler.

As llama.cpp's `--rpc`: every layer's weights and KV cache live on one backend (the token embedding and
output head stay local), and the scheduler runs each op where its weights are, copying activations
between backends. The greedy tokens must equal a purely local run's. Reports tokens/s for both, the
wire bytes (sent and received by this client) per generated token, and the split.

    .venv/bin/python benchmarks/rpc_split.py [--servers pyggml|ggml] [-n 8] [--layers 6,6,6]

Servers are started as subprocesses on free loopback ports and killed at the end. With `--servers ggml`
they are ggml 0.15.3's own rpc-server (ggml-python's libggml-rpc.so); ggml's CPU kernels round
differently, so the tokens may (rarely) differ from pyggml's local run there.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "backend" / "rpc")]

from pyggml.backend import BufferUsage, rpc, tensor_alloc, tensor_get, tensor_set  # noqa: E402
from pyggml.backend.cpu import CPU_REG  # noqa: E402
from pyggml.models import load_model  # noqa: E402
from pyggml.sched import Scheduler  # noqa: E402

PROMPT = "The capital of France is"


def move_tensors(tensors, buffer_type, usage: BufferUsage):
    """Re-home tensors (roots) into one new buffer of buffer_type, bytes included; returns the buffer."""
    align = buffer_type.alignment
    offsets, size = [], 0
    for t in tensors:
        offsets.append(size)
        size += -(-buffer_type.alloc_size(t) // align) * align
    buf = buffer_type.alloc_buffer(size)
    buf.usage = usage
    for t, off in zip(tensors, offsets):
        raw = tensor_get(t, 0, t.nbytes)
        t.buffer = t.data = None
        tensor_alloc(buf, t, buf.base + off)
        tensor_set(t, raw)
    return buf


class ScheduledSteps:
    """Stands in for the model's graph allocator and backend: each step is allocated and run by the scheduler."""

    def __init__(self, sched: Scheduler):
        self.sched = sched

    def alloc_graph(self, graph) -> bool:
        self.sched.reset()
        return self.sched.alloc_graph(graph)

    def graph_compute(self, graph):
        return self.sched.graph_compute(graph)

    def get_buffer_size(self, i: int) -> int:
        return self.sched.get_buffer_size(i)


def split_layers(model, remote_backends, layer_counts):
    """Give the first layer_counts[0] layers to the CPU, the next ones to each remote backend in turn.

    Returns the scheduler and {backend name: layers}."""
    n_layer = model.arch.n_layer
    if sum(layer_counts) != n_layer or len(layer_counts) != 1 + len(remote_backends):
        raise SystemExit(f"--layers must give {1 + len(remote_backends)} counts summing to {n_layer}")
    placement, first = {CPU_REG.device(0).name: list(range(layer_counts[0]))}, layer_counts[0]
    for backend, count in zip(remote_backends, layer_counts[1:]):
        layers = list(range(first, first + count))
        first += count
        placement[backend.name] = layers
        weights = [t for name, t in model.weights.tensors.items()
                   if any(name.startswith(f"blk.{il}.") for il in layers)]
        move_tensors(weights, backend.default_buffer_type, BufferUsage.WEIGHTS)
        move_tensors([c for il in layers for c in (model.kv.k[il], model.kv.v[il])], backend.default_buffer_type,
                     BufferUsage.ANY)
    sched = Scheduler([*remote_backends, model.backend], graph_size=8192)
    model.galloc = model.backend = ScheduledSteps(sched)
    return sched, placement


def wire_bytes(conns) -> tuple[int, int]:
    """(sent, received) by this client over all the connections."""
    return sum(c.bytes_sent for c in conns), sum(c.bytes_received for c in conns)


def timed_tokens(model, n: int, conns=()):
    """(greedy tokens, generated tokens/s, (bytes sent, bytes received) per generated token)."""
    tokens, gen_start, bytes_start = [], None, (0, 0)
    for token in model.generate_tokens(model.tokenize(PROMPT), n=n):
        tokens.append(token)
        if gen_start is None:  # the prompt is done
            gen_start, bytes_start = time.perf_counter(), wire_bytes(conns)
    steps = max(len(tokens) - 1, 1)
    elapsed = time.perf_counter() - gen_start
    sent, received = wire_bytes(conns)
    return tokens, steps / elapsed, ((sent - bytes_start[0]) / steps, (received - bytes_start[1]) / steps)


@contextlib.contextmanager
def servers(kind: str, count: int):
    """`count` RPC servers of `kind` (pyggml or ggml) in subprocesses: yields their endpoints."""
    import ggml_rpc

    start = ggml_rpc.pyggml_server if kind == "pyggml" else ggml_rpc.ggml_server
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(start()).endpoint for _ in range(count)]


def run(kind: str, n: int, layer_counts, n_ctx: int = 64):
    local = load_model(backend="CPU", n_ctx=n_ctx, n_batch=32, repack=False, progress=False)
    local_tokens, local_tps, _ = timed_tokens(local, n)
    with servers(kind, len(layer_counts) - 1) as endpoints:
        remote = [rpc.add_server(ep, timeout=300.0)[0].init_backend() for ep in endpoints]
        model = load_model(backend="CPU", n_ctx=n_ctx, n_batch=32, repack=False, progress=False)
        sched, placement = split_layers(model, remote, layer_counts)
        conns = [rpc.connection(ep) for ep in endpoints]
        tokens, tps, per_token = timed_tokens(model, n, conns)
        nodes = Counter(sched.get_backend(i).name for i in sched.node_backend_ids if i >= 0)
        return dict(local_tokens=local_tokens, local_tps=local_tps, tokens=tokens, tps=tps,
                    bytes_per_token=per_token, n_splits=sched.n_splits, placement=placement, nodes=dict(nodes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", choices=["pyggml", "ggml"], default="pyggml")
    ap.add_argument("-n", type=int, default=8, help="tokens to generate (default 8)")
    ap.add_argument("--layers", default="6,6,6", help="layers on CPU, server 1, server 2 (default 6,6,6)")
    args = ap.parse_args()
    r = run(args.servers, args.n, [int(x) for x in args.layers.split(",")])
    print(f"local CPU      : {r['local_tps']:.3f} tokens/s  tokens {r['local_tokens']}")
    print(f"split ({args.servers} RPC): {r['tps']:.3f} tokens/s  tokens {r['tokens']}")
    print(f"same tokens    : {r['tokens'] == r['local_tokens']}")
    sent, received = r["bytes_per_token"]
    print(f"per generated token: {sent / 1024:.1f} KiB sent, {received / 1024:.1f} KiB received")
    print(f"graph splits per step: {r['n_splits']}")
    for name, layers in r["placement"].items():
        print(f"  {name}: layers {layers[0]}..{layers[-1]}" if layers else f"  {name}: no layers")
    print("  nodes per backend (last step): " + ", ".join(f"{k} {v}" for k, v in r["nodes"].items()))
    return 0 if r["tokens"] == r["local_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
