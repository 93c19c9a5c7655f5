"""Two-backend split of a real graph under the scheduler, against the same graph on one backend.

Prints the number of splits and copies, the bytes copied per compute, and median compute
times (split / single). The second backend is TORCH_CPU when torch is installed (weights
alternate between its buffers and the CPU's), else the scheduler tests' fake GPU.

    python -m benchmarks.sched_split [graph_name] [--runs N] [--parallel]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import pyggml as gg
from pyggml.alloc import GraphAllocator
from pyggml.backend import tensor_get
from pyggml.sched import Scheduler

from tests.support.fixture_data import GRAPH_NAMES, graph_path  # the tests' graph fixtures
from tests.support.graph_fixtures import load_weights, outputs, set_inputs  # shared with the scheduler tests

REPO = Path(__file__).resolve().parents[1]


def second_backend():
    try:
        import pyggml.backend.torch  # noqa: F401 - registers TORCH_CPU

        return gg.backend.init_by_name("TORCH_CPU")
    except ImportError:
        from tests.support.fake_gpu import FakeDevice

        return FakeDevice().init_backend()


def timed(fn, runs):
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("graph", nargs="?", default="gpt2_small_prefill", choices=GRAPH_NAMES)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--parallel", action="store_true", help="pipeline parallelism (4 input copies)")
    args = ap.parse_args()
    path = graph_path(args.graph)
    values = gg.load_graph_json(path).random_values(seed=0)
    cpu = gg.backend.init_by_name("CPU")

    single = gg.load_graph_json(path)
    load_weights(single, values, [cpu.default_buffer_type])
    galloc = GraphAllocator(cpu.default_buffer_type)
    galloc.alloc_graph(single.graph)

    split = gg.load_graph_json(path)
    other = second_backend()
    load_weights(split, values, [other.default_buffer_type, cpu.default_buffer_type])
    sched = Scheduler([other, cpu], graph_size=4096, parallel=args.parallel)
    sched.alloc_graph(split.graph)

    def run(lg, compute):  # inputs are consumed: the planner may reuse their memory after their last use
        set_inputs(lg, values)
        compute(lg.graph)

    t_single = timed(lambda: run(single, cpu.graph_compute), args.runs)
    t_split = timed(lambda: run(split, sched.graph_compute), args.runs)
    a, b = tensor_get(outputs(split)[-1]), tensor_get(outputs(single)[-1])
    nmse = float(np.sum((a.astype(np.float64) - b) ** 2) / max(np.sum(b.astype(np.float64) ** 2), 1e-30))
    copies = [(t, s.backend_id) for s in sched.splits for t in s.inputs]
    copied = sum(t.nbytes for t, _ in copies)
    print(f"graph {args.graph}: {split.graph.n_nodes} nodes; backends {other.name} + CPU"
          f"{' (parallel, 4 copies)' if args.parallel else ''}")
    print(f"splits {sched.n_splits}, copies {len(copies)}, bytes copied per compute {copied} "
          f"({copied / 2**20:.2f} MiB)")
    print(f"compute buffers: {other.name} {sched.get_buffer_size(other)} B, CPU {sched.get_buffer_size(cpu)} B; "
          f"single backend {galloc.get_buffer_size(0)} B")
    print(f"median compute: split {t_split * 1e3:.1f} ms, single {t_single * 1e3:.1f} ms, "
          f"ratio {t_split / t_single:.2f}; output NMSE vs single {nmse:.2e}")


if __name__ == "__main__":
    main()
