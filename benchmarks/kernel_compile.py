"""What a first run compiles, kernel by kernel: `pyggml generate` (one token) in a fresh process with an empty kernel
cache, each outermost compile timed by its wall time and by the compiling thread's CPU time (what a loaded machine
distorts least), medians over the rounds, with the load average before each round.

    python -m benchmarks.kernel_compile                        # the default chat model, 3 rounds
    python -m benchmarks.kernel_compile --model FILE.gguf --rounds 5
    python -m benchmarks.kernel_compile --rounds 1             # a quick check that it works

Target (issue "first contact"): compiling <= 8 s of a cold first token's 15 s (benchmarks/first_token.py times those).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.first_token import PROMPT, default_model, load_average

REPO = Path(__file__).resolve().parents[1]


def kernel_name(dispatcher) -> str:
    """module.function, with the ggml type of a kernel made per type (PerType's closure constant)."""
    fn = getattr(dispatcher, "py_func", dispatcher)
    cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ()), strict=True))
    name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__name__}"
    return f"{name}[{cells['qtype']}]" if "qtype" in cells else name


def child(model: str | None, out_path: str) -> None:
    """One cold `pyggml generate`, its outermost compiles written to out_path as JSON."""
    from numba.core import event

    compiles, local = [], threading.local()

    class Timer(event.Listener):
        def on_start(self, ev) -> None:
            local.depth = getattr(local, "depth", 0) + 1
            if local.depth == 1:
                local.start = (time.perf_counter(), time.thread_time())

        def on_end(self, ev) -> None:
            local.depth -= 1
            if local.depth == 0:
                wall, cpu = time.perf_counter() - local.start[0], time.thread_time() - local.start[1]
                compiles.append({"kernel": kernel_name(ev.data["dispatcher"]), "wall_s": wall, "cpu_s": cpu})

    event.register("numba:compile", Timer())
    from pyggml.cli.main import main
    start = time.process_time()
    with contextlib.suppress(SystemExit):
        main(["generate", PROMPT, "-n", "1", *(["--model", model] if model else [])])
    Path(out_path).write_text(json.dumps({"compiles": compiles, "process_cpu_s": time.process_time() - start}))


def cold_round(model: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="pyggml-compile-") as tmp:
        out = Path(tmp) / "compiles.json"
        env = {**os.environ, "NUMBA_CACHE_DIR": str(Path(tmp) / "cache"), "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-m", "benchmarks.kernel_compile", "--child", str(out),
                               *(["--model", model] if model else [])], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=900)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"pyggml generate failed:\n{done.stderr}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: the default chat model)")
    p.add_argument("--rounds", type=int, default=3, help="cold runs, each with an empty cache (default 3)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.model, args.child)
        return 0
    model = args.model or default_model()
    print(f"model: {model or 'pyggml generate default'}; {os.cpu_count()} cores")
    rounds = []
    for i in range(args.rounds):
        load = load_average()
        run = cold_round(model)
        rounds.append(run)
        wall, cpu = (sum(c[key] for c in run["compiles"]) for key in ("wall_s", "cpu_s"))
        print(f"round {i + 1}: {len(run['compiles'])} compiles, {wall:.2f} s wall, {cpu:.2f} s CPU (process CPU "
              f"{run['process_cpu_s']:.2f} s; load average {load:.2f})", flush=True)
    per_kernel: dict[str, list[tuple[float, float]]] = {}
    for run in rounds:
        for c in run["compiles"]:
            per_kernel.setdefault(c["kernel"], []).append((c["wall_s"], c["cpu_s"]))
    print(f"\n{'kernel':48s} {'compiles':>8s} {'wall s':>8s} {'CPU s':>8s}  (medians a round)")
    for name, times in sorted(per_kernel.items(), key=lambda kv: -sum(t[1] for t in kv[1])):
        n = len(times) / len(rounds)
        print(f"{name:48s} {n:8.1f} {statistics.median(t[0] for t in times) * n:8.2f} "
              f"{statistics.median(t[1] for t in times) * n:8.2f}")
    totals = [(sum(c["wall_s"] for c in r["compiles"]), sum(c["cpu_s"] for c in r["compiles"])) for r in rounds]
    print(f"\ncompiling, median of {len(rounds)}: {statistics.median(t[0] for t in totals):.2f} s wall, "
          f"{statistics.median(t[1] for t in totals):.2f} s CPU (goal: <= 8 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
