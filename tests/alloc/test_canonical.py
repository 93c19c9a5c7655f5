"""The canonical offset search (`pyggml.alloc.canonical`) and planner="search" on random instances:
exact against brute force on tiny instances, valid, never worse than "best", deterministic for a seed."""

import itertools
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

from pyggml.alloc import canonical, planner
from pyggml.alloc.planner import Interval, plan_offsets, verify_offsets
from tests.alloc.test_planner import interval_sets

PLANNING = Path(__file__).resolve().parents[1] / "data" / "planning"


def brute_force_height(start, end, size) -> int:
    """The optimum: every pushed-down plan is some order placing each buffer on top of the placed ones it meets."""
    best = None
    for order in itertools.permutations(range(len(size))):
        top = np.zeros(len(size), np.int64)
        for k, i in enumerate(order):
            below = [top[j] for j in order[:k] if start[j] < end[i] and start[i] < end[j]]
            top[i] = max(below, default=0) + size[i]
        best = top.max() if best is None else min(best, top.max())
    return int(best)


def _search(start, end, size, capacity):
    ranks = canonical.static_orders(start, end, size, np.zeros(len(size), np.int64))
    return canonical.solve_capacity(start, end, size, capacity, ranks, lambda: False, None)


tiny = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 6), min_size=n, max_size=n), st.lists(st.integers(1, 5), min_size=n, max_size=n),
    st.lists(st.integers(1, 9), min_size=n, max_size=n)))


@settings(max_examples=60, deadline=None)
@given(tiny)
def test_canonical_search_is_exact_on_tiny_instances(instance):
    start, length, size = (np.array(v, np.int64) for v in instance)
    end = start + length
    optimum = brute_force_height(start, end, size)
    status, offsets = _search(start, end, size, optimum)
    assert status == canonical.FOUND
    intervals = [Interval(i, int(start[i]), int(end[i]), int(size[i])) for i in range(len(size))]
    result = planner.PlanResult(dict(enumerate(offsets.tolist())), dict.fromkeys(range(len(size)), 0),
                                [int((offsets + size).max())], 0, "canonical")
    verify_offsets(intervals, result)
    assert result.height <= optimum
    assert _search(start, end, size, optimum - 1)[0] == canonical.EXHAUSTED


@settings(max_examples=40, deadline=None)
@given(interval_sets(), st.sampled_from([1, 16]), st.integers(0, 3))
def test_search_is_valid_never_worse_than_best_and_deterministic(intervals, alignment, seed):
    best = plan_offsets(intervals, alignment)
    runs = [plan_offsets(intervals, alignment, "search", seed=seed, max_iterations=2000) for _ in range(2)]
    for run in runs:
        verify_offsets(intervals, run)
        assert run.lower_bound <= run.height <= best.height
    assert runs[0].offsets == runs[1].offsets
    timed = plan_offsets(intervals, alignment, "search", budget_s=0.05, seed=seed)
    verify_offsets(intervals, timed)
    assert timed.height <= best.height


def test_search_reaches_load_on_hard_b_and_c():
    for name in ("hard_B", "hard_C"):
        intervals = planner.load_csv(PLANNING / f"{name}.csv")
        result = plan_offsets(intervals, planner="search", budget_s=20)
        verify_offsets(intervals, result)
        assert result.height == result.lower_bound, name
