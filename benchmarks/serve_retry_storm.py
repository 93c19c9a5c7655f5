"""A retry storm against `pyggml serve`: one accepted stream's speed alone and while clients that are refused
(429: every slot busy, no queue) re-send at once, in alternating rounds (medians and their ratio). The refusal
happens before the chat template is rendered and the prompt tokenized, so the storm should cost the stream
little (the target: at most 20 % slower).

    python -m benchmarks.serve_retry_storm [--model FILE.gguf] [--rounds 3] [--tokens 48] [--flood 8]

Bounded: loopback only, `rounds` x 2 streams of `tokens` tokens, the flood lasting as long as its stream.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.serve_vs_llamacpp import free_port

REPO = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "system", "content": "You are a helpful assistant. " * 40},
            {"role": "user", "content": "Write a long story about the sea. " * 20}]


async def stream_speed(client: httpx.AsyncClient, tokens: int) -> float:
    """Output tokens per second of one stream, first token to last."""
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True, "temperature": 0,
            "stream": True}
    stamps = []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"the measured stream was refused: {r.status_code}")
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


async def warm_up(url: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await stream_speed(client, 4)


async def flood(client: httpx.AsyncClient, stop: asyncio.Event, counts: dict) -> None:
    """Re-send a long chat request as soon as it is refused, until told to stop."""
    while not stop.is_set():
        r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 8})
        counts[r.status_code] = counts.get(r.status_code, 0) + 1


async def one_round(url: str, tokens: int, n_flood: int) -> tuple[float, float, dict]:
    limits = httpx.Limits(max_connections=n_flood + 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        alone = await stream_speed(client, tokens)
        stop, counts = asyncio.Event(), {}
        measured = asyncio.create_task(stream_speed(client, tokens))
        await asyncio.sleep(0.05)  # the stream holds the slot before the storm starts
        storm = [asyncio.create_task(flood(client, stop, counts)) for _ in range(n_flood)]
        stormy = await measured
        stop.set()
        await asyncio.gather(*storm)
    return alone, stormy, counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="GGUF file (default: pyggml serve's default model)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--flood", type=int, default=8, help="clients re-sending refused requests")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    port = free_port()
    cmd = [sys.executable, "-m", "pyggml.cli.main", "serve", "--port", str(port), "--parallel", "1",
           "--max-queue", "0", "--whisper-model", "none", "--ctx", "1024"]
    cmd += ["--model", args.model] if args.model else []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(REPO))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        asyncio.run(warm_up(url))
        alone, stormy, refused = [], [], 0
        for i in range(args.rounds):
            a, s, counts = asyncio.run(one_round(url, args.tokens, args.flood))
            alone.append(a)
            stormy.append(s)
            refused += counts.get(429, 0)
            print(f"round {i}: alone {a:.1f} tok/s, during the storm {s:.1f} tok/s ({counts})", flush=True)
        ratio = statistics.median(stormy) / statistics.median(alone)
        print(f"median alone {statistics.median(alone):.1f} tok/s, during the storm {statistics.median(stormy):.1f} "
              f"tok/s: {ratio:.2f}x ({refused} requests refused); load {Path('/proc/loadavg').read_text().split()[:3]}")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
