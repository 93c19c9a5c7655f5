"""The conditions of a benchmark against a peer (`benchmarks/*_vs_*.py`), so that a ratio is read for what it
compares: the machine's load average and CPU model at the start of every side's run, a "noisy" mark when a
run started above 1.0 load per core (another program was competing for the cores), and a table of what each
side does differently.

    log = RunLog()
    print(log.header())
    log.start("pyggml")            # prints the load when the run starts
    ...
    print(differences([("KV cache", "F32", "F16")], ("pyggml", "llama.cpp")))
    print(log.summary())
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import platform
import signal
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

NOISY_LOAD_PER_CORE = 1.0  # a 1-minute load above this many runnable tasks per core: the sides shared the CPU


def written_apart(write, *args) -> str:
    """write(*args) run in a fresh spawned process, its returned path: a side forked afterwards would inherit
    this process's peak RSS, which writing a large random-weight file would raise."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(write, *args).result()


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name as /proc/cpuinfo gives it (x86 "model name", ARM "Model"), else platform's guess."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def blas_kernel() -> str:
    """NumPy's BLAS and the kernel it runs (threadpoolctl's "architecture"), and the OPENBLAS_CORETYPE that forced
    it if one is set: a machine may pin OpenBLAS to older kernels (Haswell's AVX2 instead of AVX-512), which
    roughly halves sgemm, the prompt's products."""
    import numpy  # noqa: F401  (loads the BLAS library that threadpoolctl then finds)
    from threadpoolctl import threadpool_info

    libs = [f"{i['internal_api']} {i.get('version') or ''} kernel {i.get('architecture') or '?'}".replace("  ", " ")
            for i in threadpool_info() if i.get("user_api") == "blas"]
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return (", ".join(libs) or "no BLAS found") + (f" (forced by OPENBLAS_CORETYPE={forced})" if forced else "")


@dataclass(frozen=True)
class RunStart:
    """The machine when one side's run began."""

    side: str
    load: tuple[float, float, float]  # os.getloadavg(): 1, 5 and 15 minutes
    cores: int
    cpu: str

    @property
    def load_per_core(self) -> float:
        return self.load[0] / self.cores

    @property
    def noisy(self) -> bool:
        return self.load_per_core > NOISY_LOAD_PER_CORE

    def __str__(self) -> str:
        one, five, fifteen = self.load
        return (f"{self.side}: load {one:.2f} {five:.2f} {fifteen:.2f} ({self.load_per_core:.2f} per core)"
                f"{'  NOISY' if self.noisy else ''}")


@dataclass
class RunLog:
    """Every run start of one benchmark; `start()` before each side's run, `summary()` at the end."""

    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    cpu: str = field(default_factory=cpu_model)
    starts: list[RunStart] = field(default_factory=list)

    def header(self) -> str:
        return (f"CPU: {self.cpu}, {self.cores} cores; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
                f"; BLAS: {blas_kernel()}")

    def start(self, side: str, echo: bool = True) -> RunStart:
        """Record the load and CPU as `side`'s run begins (and print it unless echo is False)."""
        run = RunStart(side, os.getloadavg(), self.cores, self.cpu)
        self.starts.append(run)
        if echo:
            print(run, flush=True)
        return run

    @property
    def noisy(self) -> list[RunStart]:
        return [s for s in self.starts if s.noisy]

    def summary(self) -> str:
        n, noisy = len(self.starts), self.noisy
        if not noisy:
            peak = max((s.load_per_core for s in self.starts), default=0.0)
            return (f"quiet: all {n} runs started at or below load {NOISY_LOAD_PER_CORE:.1f} per core "
                    f"(highest {peak:.2f}) on {self.cpu}")
        worst = max(noisy, key=lambda s: s.load_per_core)
        return (f"NOISY: {len(noisy)} of {n} runs started above load {NOISY_LOAD_PER_CORE:.1f} per core "
                f"(worst: {worst.side} at {worst.load_per_core:.2f}); other programs shared the CPU, so the timings "
                f"and ratios are not "
                f"trustworthy: rerun on a quiet machine")


def differences(rows: list[tuple[str, str, str]], sides: tuple[str, str]) -> str:
    """A table of what the two sides do, one aspect per row; aspects where they differ are marked '*'."""
    width = max([len("what") + 2] + [len(aspect) + 2 for aspect, _, _ in rows])
    col = max([len(s) for s in sides] + [len(v) for _, a, b in rows for v in (a, b)]) + 2
    lines = ["what each side does ('*': they differ)", f"  {'what':<{width}}{sides[0]:<{col}}{sides[1]}"]
    for aspect, a, b in rows:
        lines.append(f"{'*' if a != b else ' '} {aspect:<{width}}{a:<{col}}{b}")
    return "\n".join(lines)


def exit_reason(returncode: int) -> str:
    """A process's exit status in words: a signal by name (SIGILL: the program uses instructions this CPU lacks,
    e.g. a llama.cpp built with GGML_AVX_VNNI on a CPU without AVX-VNNI), else the code."""
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        return f"killed by {signal.Signals(signum).name}" if signum else f"exit code {returncode}"
    except ValueError:
        return f"exit code {returncode}"


def run_side(cmd: list[str], side: str, threads: int, repo) -> tuple[dict, str]:
    """Run one side of a benchmark in its own process with the thread count set for every pool (OpenMP,
    OpenBLAS, MKL) and the repository on the path; (the JSON of its last stdout line, its stderr)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo)
    if done.returncode != 0:
        raise SystemExit(f"{side} side failed ({exit_reason(done.returncode)}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

