"""Where pyggml's load to first token goes, stage by stage: what generate_vs_llamacpp's "load to first token"
is made of, to see which stage a change moved.

Each round is a fresh process (the file's pages stay in the page cache; the kernel cache warm) that loads the model
as that benchmark does (n_ctx, n_batch, --threads) and decodes one token, timing each stage: the file's parse
(metadata, vocabulary), the tokenizer, the kernels' load from their cache, the weights (the repack into the
interleaved layout: load_weights less the tokenizer and the kernels, which load inside it while the weights'
fresh memory is made resident on another thread), the reserve of the compute buffers, the first decode. Per
stage: wall seconds, the process's CPU seconds in user and kernel mode (kernel time at load is mostly first
writes of fresh memory, which on a virtual machine vary with the host; a thread making memory resident counts in
the stage it overlaps) and its minor / major page faults; medians over the rounds, with the load average at each
round's start (above 1.0 per core: noisy).

    python -m benchmarks.load_stages --model 1b-q4_k_m.gguf --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ("parse", "tokenizer", "kernels", "weights", "reserve", "first decode")


def _usage() -> tuple[float, float, float, int, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime, r.ru_stime, r.ru_minflt, r.ru_majflt


def _timed(record: dict, stage: str, fn):
    """fn, adding its wall and CPU seconds and page faults to record[stage] (the stages run one after another)."""
    def timed(*args, **kwargs):
        before = _usage()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = [b - a for a, b in zip(before, _usage(), strict=True)]
            record[stage] = [x + y for x, y in zip(record.get(stage, [0] * 5), spent, strict=True)]
    return timed


def run_round(args) -> dict:
    """One load to first token in this process: {stage: [wall s, user s, sys s, minor faults, major faults]}."""
    from pyggml.backend.cpu.backend import set_n_threads
    from pyggml.models.gguf import gguf_file
    from pyggml.models.llm import model

    record: dict = {}
    gguf_file.GGUFFile.open = _timed(record, "parse", gguf_file.GGUFFile.open)
    for stage, name in (("tokenizer", "load_tokenizer"), ("kernels", "load_kernels"), ("weights", "load_weights")):
        setattr(model, name, _timed(record, stage, getattr(model, name)))
    model.Model.set_n_seq_max = _timed(record, "reserve", model.Model.set_n_seq_max)
    start = _usage()
    m = model.load_model(args.model, n_ctx=args.ctx, n_batch=args.batch)
    # the tokenizer and the kernels load inside load_weights (while the weights' memory is made resident on
    # another thread): the weights stage is what is left of it
    record["weights"] = [w - t - k for w, t, k in zip(record["weights"], record["tokenizer"], record["kernels"],
                                                      strict=True)]
    set_n_threads(m.backend, args.threads)
    _timed(record, "first decode", m.decode)(m.tokenize("The")[:1])
    record["total"] = [b - a for a, b in zip(start, _usage(), strict=True)]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--round", action="store_true", help=argparse.SUPPRESS)  # a child: one round, JSON out
    args = parser.parse_args()
    if args.round:
        print(json.dumps(run_round(args)))
        return
    cores = os.cpu_count() or 1
    rounds = []
    for i in range(args.rounds):
        load = os.getloadavg()[0]
        print(f"round {i + 1}: load {load:.2f} ({load / cores:.2f} per core){'  NOISY' if load > cores else ''}")
        done = subprocess.run([sys.executable, "-m", "benchmarks.load_stages", *sys.argv[1:], "--round"], cwd=REPO,
                              capture_output=True, text=True, check=True)
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{Path(args.model).name}, n_ctx {args.ctx}, batch {args.batch}, {args.threads} threads; "
          f"medians of {len(rounds)} rounds")
    print(f"{'stage':14}{'wall s':>9}{'user s':>9}{'sys s':>9}{'minflt':>10}{'majflt':>8}")
    for stage in (*STAGES, "total"):
        values = [statistics.median(r[stage][k] for r in rounds if stage in r) for k in range(5)]
        print(f"{stage:14}{values[0]:9.3f}{values[1]:9.3f}{values[2]:9.3f}{values[3]:10.0f}{values[4]:8.0f}")


if __name__ == "__main__":
    main()
