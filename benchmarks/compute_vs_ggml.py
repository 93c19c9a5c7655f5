"""Compute the ggml graph fixtures with pyggml's CPU backend and with ggml 0.15.3 itself (the peer), same inputs.

For each graph of tests/data/graphs/: random weights and inputs (I32 positions and row indices valid, soft_max masks
causal), pyggml computes (weights via alloc_ctx_tensors on lg.preallocated, compute memory via GraphAllocator,
backend.graph_compute) and so does ggml's CPU backend, both with the same thread count. The outputs must agree
(NMSE against ggml, test-backend-ops' 2e-3 for llm-style subgraphs); the table gives median times over the timed
runs, which alternate the two sides so that both see the same machine load, after one warm-up, and the ratio
pyggml/ggml. A graph one side cannot compute is listed with the reason. The load average at the start of every
timed run is recorded (the table gives each graph's highest per core) and results taken above load 1.0 per core
are marked noisy; the output ends with what the two sides do differently.
A timed run is "set the graph inputs, compute", as in llama.cpp: the allocators reuse an input's memory once
its last consumer has run, so a second compute without new inputs would read garbage (ggml aborts on the
token ids of GET_ROWS).

    .venv/bin/python -m benchmarks.compute_vs_ggml [--runs 5] [--threads 2] [--quick] [graph names...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import pyggml as gg
from pyggml.core import types as T
from pyggml.core.tensor import Op, TensorFlag

from tests.support.fixture_data import GRAPH_NAMES, GRAPHS  # the tests' graph fixtures
from benchmarks.peer_run import RunLog, RunStart, differences

REPO = Path(__file__).resolve().parents[1]


NMSE_MAX = 2e-3


@dataclass
class Row:
    name: str
    n_nodes: int = 0
    ggml_s: float | None = None
    pyggml_s: float | None = None
    nmse: float | None = None
    problems: list[str] = field(default_factory=list)
    starts: list[RunStart] = field(default_factory=list)  # the machine as each timed run began

    @property
    def noisy(self) -> bool:
        return any(s.noisy for s in self.starts)


# ----- inputs ---------------------------------------------------------------------------------------

def consumers(graph) -> dict[int, list[tuple]]:
    """id(tensor) -> [(consumer node, src slot)], to give each input values its consumers accept."""
    out: dict[int, list[tuple]] = {}
    for n in graph.nodes:
        for slot, s in enumerate(n.src):
            if s is not None:
                out.setdefault(id(s), []).append((n, slot))
    return out


def random_values(t, uses, rng) -> np.ndarray:
    """Values in t's stored form: indices within the rows they pick, positions 0.., causal masks, and uniform
    floats scaled by 1/sqrt(fan-in) where t is a matrix multiplied by activations."""
    shape = tuple(reversed(t.ne))
    ops = {(n.op, slot) for n, slot in uses}
    if t.type == T.GGMLType.I32:
        rows = next((n.src[0].ne[1] for n, slot in uses if n.op == Op.GET_ROWS and slot == 1), None)
        if rows is not None:
            return rng.integers(0, rows, size=shape, dtype=np.int32)
        return np.broadcast_to(np.arange(t.ne[0], dtype=np.int32), shape).copy()  # ROPE positions
    if (Op.SOFT_MAX, 1) in ops:
        n_kv, n_q = t.ne[0], t.ne[1]
        kv, q = np.arange(n_kv)[None, :], np.arange(n_q)[:, None]
        mask = np.where(kv <= q + (n_kv - n_q), 0.0, -np.inf).astype(np.float32)
        return T.encode(t.type, np.broadcast_to(mask, shape))
    scale = 1 / np.sqrt(t.ne[0]) if (Op.MUL_MAT, 0) in ops else 1.0
    return T.encode(t.type, rng.uniform(-1, 1, size=shape).astype(np.float32) * scale)


def input_leafs(lg) -> list:
    """The leafs that live in the compute buffer (the graph's inputs), as opposed to preallocated weights."""
    pre = {id(t) for t in lg.preallocated}
    return [t for t in lg.graph.leafs if t.view_src is None and id(t) not in pre]


def values_for(lg, tensors, rng) -> dict:
    uses = consumers(lg.graph)
    return {t: random_values(t, uses.get(id(t), []), rng) for t in tensors}


def outputs_of(graph) -> list:
    outs = [t for t in graph.nodes if t.flags & TensorFlag.OUTPUT]
    return outs or [graph.nodes[-1]]


def as_float(t, stored: np.ndarray) -> np.ndarray:
    return T.to_float(t.type, stored).astype(np.float64).ravel()


def nmse(tested: np.ndarray, reference: np.ndarray) -> float:
    """test-backend-ops' nmse(a, b) = sum((a - b)^2) / sum(a^2), with a the backend under test (here pyggml)
    and b the CPU reference (here ggml)."""
    return float(np.sum((tested - reference) ** 2) / max(np.sum(tested ** 2), np.finfo(np.float64).tiny))


def seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ----- the two sides: each a context that yields (compute, get) -------------------------------------

@contextmanager
def ggml_side(lg, weights, inputs, threads: int):
    """ggml's CPU backend through the peer: weights in a ggml buffer, the rest planned by ggml's gallocr."""
    from tests.support.ggml_peer import GGMLPeer

    with GGMLPeer(n_threads=threads) as peer, peer.prepare(lg.graph, weights, preallocated=lg.preallocated) as p:
        def compute():
            p.set_inputs(inputs)
            p.run()

        yield compute, p.get


@contextmanager
def pyggml_side(lg, weights, inputs, threads: int):
    """pyggml's CPU backend: weights via alloc_ctx_tensors, compute memory via GraphAllocator."""
    import pyggml.alloc as galloc
    import pyggml.backend as gb

    backend = gb.init_by_name("CPU")
    gb.reg_by_name("CPU").get_proc_address("set_n_threads")(backend, threads)
    weights_buffer = allocator = None
    try:
        weights_buffer = galloc.alloc_ctx_tensors(lg.preallocated, backend)
        allocator = galloc.GraphAllocator(backend.default_buffer_type)
        if not allocator.alloc_graph(lg.graph):
            raise gg.errors.AllocationError("GraphAllocator.alloc_graph returned False")
        for t, v in weights.items():
            gb.tensor_set(t, v)

        def compute():
            for t, v in inputs.items():
                gb.tensor_set(t, v)
            status = backend.graph_compute(lg.graph)
            if status != gb.Status.SUCCESS:
                raise gg.errors.BackendError(f"graph_compute returned {status!r}")

        yield compute, gb.tensor_get
    finally:
        if allocator is not None:
            allocator.free()
        if weights_buffer is not None:
            weights_buffer.free()
        backend.free()


SIDES = {"ggml": ggml_side, "pyggml": pyggml_side}


def bench(name: str, threads: int, runs: int, seed: int = 0, graphs: Path = GRAPHS, log: RunLog | None = None) -> Row:
    """Set up both sides, compute once each (warm-up; these outputs are compared), then time `runs`
    rounds that alternate the sides, so that both see the same machine load (recorded in `log`)."""
    row, log = Row(name), log if log is not None else RunLog()
    path = graphs / f"{name}.json"
    if not path.exists():
        row.problems.append(f"no graph file {path}")
        return row
    lg = gg.load_graph_json(path)
    row.n_nodes = lg.graph.n_nodes
    rng = np.random.default_rng(seed)
    weights, inputs = values_for(lg, lg.preallocated, rng), values_for(lg, input_leafs(lg), rng)
    outputs = outputs_of(lg.graph)
    computes, results, times = {}, {}, {}
    with ExitStack() as stack:
        for who, make_side in SIDES.items():
            try:  # report, never fake: a missing piece is a row note, not a crash
                compute, get = stack.enter_context(make_side(lg, weights, inputs, threads))
                compute()
                results[who] = [as_float(t, get(t)) for t in outputs]
                computes[who], times[who] = compute, []
            except Exception as e:
                row.problems.append(f"{who}: {type(e).__name__}: {e}")
        for _ in range(runs):
            for who, compute in computes.items():
                row.starts.append(log.start(f"{name} {who}", echo=False))
                times[who].append(seconds(compute))
    row.ggml_s, row.pyggml_s = (statistics.median(times[w]) if times.get(w) else None for w in SIDES)
    if len(results) == 2:
        row.nmse = max(nmse(got, want) for want, got in zip(results["ggml"], results["pyggml"], strict=True))
        if not all(np.isfinite(w).all() for w in results["ggml"]):
            row.problems.append("ggml's outputs are not all finite: the comparison means little")
        if not row.nmse <= NMSE_MAX:
            row.problems.append(f"outputs disagree: NMSE {row.nmse:.3g} > {NMSE_MAX:g}")
    return row


def print_table(rows: list[Row], threads: int, runs: int) -> None:
    def ms(s):
        return "-" if s is None else f"{s * 1e3:.1f}"

    print(f"median of {runs} alternating runs after 1 warm-up, {threads} threads each; "
          f"NMSE = max over outputs, pyggml vs ggml; load = highest 1-minute load per core as a timed run began")
    header = (f"{'graph':<27} {'nodes':>6} {'ggml ms':>10} {'pyggml ms':>10} {'pyggml/ggml':>12} {'NMSE':>10} "
              f"{'load':>6}  ok")
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = "-" if r.ggml_s is None or r.pyggml_s is None else f"{r.pyggml_s / r.ggml_s:.1f}x"
        err = "-" if r.nmse is None else f"{r.nmse:.2e}"
        load = f"{max(s.load_per_core for s in r.starts):.2f}" if r.starts else "-"
        print(f"{r.name:<27} {r.n_nodes:>6} {ms(r.ggml_s):>10} {ms(r.pyggml_s):>10} {ratio:>12} {err:>10} "
              f"{load:>6}  {'no' if r.problems else 'yes'}{' (noisy)' if r.noisy else ''}")
    for r in rows:
        for p in r.problems:
            print(f"  {r.name}: {p}")


def sides_differences(threads: int) -> str:
    return differences([
        ("kernels", "NumPy (BLAS) and Numba", "ggml's C kernels"),
        ("threads", f"{threads} (BLAS limited to {threads})", f"{threads} (ggml's threadpool)"),
        ("compute memory", "GraphAllocator, planner 'best'", "ggml_gallocr"),
        ("weights, inputs", "same types and values", "same types and values"),
        ("graph", "the graph file's nodes", "the same nodes, rebuilt with ggml's ops"),
    ], ("pyggml", "ggml 0.15.3"))


def main(argv=None) -> int:
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")  # a ggml abort would otherwise fork gdb
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("graphs", nargs="*", default=GRAPH_NAMES, help=f"graph names (default: {' '.join(GRAPH_NAMES)})")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per side after one warm-up (>= 5 advised)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="a smoke test: mlp_chain and gpt2_small_decode, 2 runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.graphs, args.runs = ["mlp_chain", "gpt2_small_decode"], 2
    log = RunLog()
    print(log.header(), flush=True)
    rows = []
    for name in args.graphs:
        rows.append(bench(name, args.threads, args.runs, log=log))
        print(f"... {name} done", file=sys.stderr, flush=True)
    print_table(rows, args.threads, args.runs)
    print(sides_differences(args.threads))
    print(log.summary())
    return 1 if any(r.problems for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
