"""Gemma 3 270M with its layers split across the local CPU backend and two RPC servers, through the scheduler.

As llama.cpp's `--rpc` (and `pyggml generate --rpc`, through pyggml.models.llm.runner): every layer's weights
and KV cache live on one backend, dealt out by the devices' free memory (the token embedding and output
head stay local), and the scheduler runs each op where its weights are, copying activations between
backends. The greedy tokens must equal a purely local run's. Reports tokens/s for both, the
wire bytes (sent and received by this client) per generated token, and the split.

    .venv/bin/python -m benchmarks.rpc_split [--servers pyggml|ggml] [-n 8] [--servers-count 2]

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

from pyggml.backend import rpc  # noqa: E402
from pyggml.models import load_model  # noqa: E402

PROMPT = "The capital of France is"


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
    from tests.support import ggml_rpc

    start = ggml_rpc.pyggml_server if kind == "pyggml" else ggml_rpc.ggml_server
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(start()).endpoint for _ in range(count)]


def run(kind: str, n: int, n_servers: int = 2, n_ctx: int = 64):
    local = load_model("gemma3-270m", backend="CPU", n_ctx=n_ctx, n_batch=32, progress=False)
    local_tokens, local_tps, _ = timed_tokens(local, n)
    with servers(kind, n_servers) as endpoints:
        remote = [rpc.add_server(ep, timeout=300.0)[0].init_backend() for ep in endpoints]
        model = load_model("gemma3-270m", backend=[*remote, "CPU"], n_ctx=n_ctx, n_batch=32, progress=False)
        sched = model.runner.sched
        conns = [rpc.connection(ep) for ep in endpoints]
        tokens, tps, per_token = timed_tokens(model, n, conns)
        nodes = Counter(sched.get_backend(i).name for i in sched.node_backend_ids if i >= 0)
        return dict(local_tokens=local_tokens, local_tps=local_tps, tokens=tokens, tps=tps,
                    bytes_per_token=per_token, n_splits=sched.n_splits, placement=model.runner.placement,
                    nodes=dict(nodes))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", choices=["pyggml", "ggml"], default="pyggml")
    ap.add_argument("-n", type=int, default=8, help="tokens to generate (default 8)")
    ap.add_argument("--servers-count", type=int, default=2, help="RPC servers to start (default 2)")
    args = ap.parse_args()
    r = run(args.servers, args.n, args.servers_count)
    print(f"local CPU      : {r['local_tps']:.3f} tokens/s  tokens {r['local_tokens']}")
    print(f"split ({args.servers} RPC): {r['tps']:.3f} tokens/s  tokens {r['tokens']}")
    print(f"same tokens    : {r['tokens'] == r['local_tokens']}")
    sent, received = r["bytes_per_token"]
    print(f"per generated token: {sent / 1024:.1f} KiB sent, {received / 1024:.1f} KiB received")
    print(f"graph splits per step: {r['n_splits']}")
    for name, layers in r["placement"]:
        print(f"  {name}: layers {layers[0]}..{layers[-1]}" if layers else f"  {name}: no layers")
    print("  nodes per backend (last step): " + ", ".join(f"{k} {v}" for k, v in r["nodes"].items()))
    return 0 if r["tokens"] == r["local_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
