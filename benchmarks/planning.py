"""Offset-planning benchmark: every planner on every planning-bench instance.

Run from the repository root: ``.venv/bin/python -m benchmarks.planning [search_budget_s] [--quick]``
(default budget 5 s per instance; ``--quick`` runs one repeat of everything with a 0.5 s budget, to smoke-test).
The instances are the tests' fixtures: tests/data/planning (sources and licences in its README.md) and
tests/data/graphs.
Each section is a function that returns rows: `planning_bench_rows` (the offset planners on the
planning-bench instances, each with its wall time) and `graph_rows` (the graph allocator on the ggml graphs,
with LOAD under ggml's order and under the order `reorder=True` chooses). The load average is printed with
the figures: budgets are wall time.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from pyggml.alloc import GraphAllocator, alloc_ctx_tensors_from_buft, planner
from pyggml.cli.plan import AddressOnlyBufferType
from pyggml.core.graph_json import load_graph_json

from tests.support.fixture_data import GRAPHS, PLANNING, graph_paths, planning_paths  # the tests' fixtures

REPO_ROOT = Path(__file__).resolve().parents[1]


def timed_plan(intervals, planner_name: str, repeats: int, **options) -> tuple[planner.PlanResult, float]:
    """Plan `repeats` times (once more only while runs are fast) and return the plan and median seconds."""
    times, result = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        result = planner.plan_offsets(intervals, planner=planner_name, **options)
        times.append(time.perf_counter() - began)
        if times[-1] > 0.2:
            break
    planner.verify_offsets(intervals, result)
    return result, statistics.median(times)


def planning_bench_rows(search_budget_s: float = 5.0, repeats: int = 5) -> list[dict]:
    """One row per planning-bench CSV: LOAD, and height, ratio and time of each planner."""
    rows = []
    paths = planning_paths()
    for path in paths[:1] + [p for p in paths if p.stem.startswith("hard_")][:1]:
        planner.plan_offsets(planner.load_csv(path), planner="search", budget_s=0.5)  # compile outside the timing
    for path in paths:
        intervals = planner.load_csv(path)
        row = {"instance": path.stem, "n": len(intervals), "LOAD": planner.lower_bound(intervals)}
        for name in ("size", "ggml", "best", "search"):
            options = {"budget_s": search_budget_s} if name == "search" else {}
            result, seconds = timed_plan(intervals, name, 1 if name == "search" else repeats, **options)
            row[name] = result.height
            row[f"{name} x"] = result.height / row["LOAD"]
            row[f"{name} s"] = seconds
        rows.append(row)
    return rows


def graph_rows(repeats: int = 11) -> list[dict]:
    """One row per ggml graph file: lower bound, ggml's and best's buffer sizes and ratios, and the median
    wall time of `GraphAllocator.reserve` (planning end to end) for each planner; then, with
    `reorder=True`, LOAD of the chosen order, the reordered plan's size (x: over the lower bound in ggml's order)
    and its planning time (median of 3 at most)."""
    rows = []
    for path in graph_paths():
        lg = load_graph_json(path)
        buft = AddressOnlyBufferType("CPU", lg.doc.get("alignment", 32))
        alloc_ctx_tensors_from_buft(lg.preallocated, buft)
        row = {"graph": path.stem, "nodes": lg.graph.n_nodes, "lower bound": 0}
        for name in ("ggml", "best"):
            galloc = GraphAllocator(buft, planner=name)
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                galloc.reserve(lg.graph)
                times.append(time.perf_counter() - began)
            galloc.plan.verify()
            row["lower bound"] = galloc.plan.lower_bound
            row[name] = galloc.plan.size
            row[f"{name} x"] = galloc.plan.size / galloc.plan.lower_bound
            row[f"{name} ms"] = statistics.median(times) * 1000
        reordering = GraphAllocator(buft, reorder=True)
        times = []
        for _ in range(min(repeats, 3)):
            began = time.perf_counter()
            reordering.reserve(lg.graph)  # permutes lg.graph.nodes; the next reserve starts from that order
            times.append(time.perf_counter() - began)
        plan = reordering.plan
        plan.verify()
        row["reordered LOAD"] = plan.lower_bound
        row["reordered"] = plan.size
        row["reordered x"] = plan.size / row["lower bound"]  # the first reserve's order was ggml's
        row["reordered ms"] = statistics.median(times) * 1000
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """A plain-text table with one column per key of the first row."""
    def cell(key, value):
        if isinstance(value, float):
            return f"{value:.4f}" if key.endswith(" x") else f"{value:.1f}" if key.endswith(" ms") else f"{value:.3f}"
        return str(value)

    columns = list(rows[0])
    cells = [[cell(k, row[k]) for k in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    argv = [a for a in argv if a != "--quick"]
    budget = float(argv[0]) if argv else 0.5 if quick else 5.0
    repeats = 1 if quick else 5
    print(f"load average {os.getloadavg()[0]:.2f}; ", end="")
    print(f"planning instances ({PLANNING}); heights in bytes, x = height / LOAD, "
          f"s = median seconds; search budget {budget} s; size = greedy by size (reference)")
    rows = planning_bench_rows(budget, repeats)
    print(format_table(rows))
    hard = [row["search x"] for row in rows if row["instance"].startswith("hard_")]
    if hard:
        print(f"hard instances: mean search x = {statistics.mean(hard):.4f}")
    print()
    print(f"ggml graphs ({GRAPHS}); sizes in bytes, x = size / in-place lower bound, "
          f"ms = median wall time of GraphAllocator.reserve")
    print(format_table(graph_rows(1 if quick else 11)))
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
