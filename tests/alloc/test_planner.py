"""Offset planners: ggml's dynamic allocator (golden behaviours of ggml 0.15.3) and the offline planners."""

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from pyggml.alloc import planner
from pyggml.alloc.planner import DynAllocator, Interval, PlanResult, plan_offsets, verify_offsets
from pyggml.errors import AllocationError

from tests.support.fixture_data import IN_PLACE_LOWER_BOUNDS, PLANNING, graph_path, planning_paths

# gallocr's allocations on the graph fixtures as intervals (in-place chains merged, one per dyn alloc,
# in allocation order, named by the tensor that allocated), written by replaying ggml 0.15.3's
# gallocr rules (`ggml_gallocr_allocate_node`, `ggml_gallocr_free_node`, in-place reuse) over graphs/*.json.
GRAPH_LIFETIMES = Path(__file__).parent / "data" / "graph_lifetimes"
UNBOUNDED = 2**64 // 2 - 1


# --- DynAllocator: ggml_dyn_tallocr (best fit, merging, chunks) ---------------------------------------------------


def test_equal_holes_tie_goes_to_the_later_block():
    dyn = DynAllocator(alignment=32)
    addrs = [dyn.alloc(4000) for _ in range(4)]
    assert [a[1] for a in addrs] == [0, 4000, 8000, 12000]
    dyn.free(*addrs[0], 4000)
    dyn.free(*addrs[2], 4000)
    assert dyn.alloc(4000) == (0, 8000)


def test_smallest_fitting_hole_wins_over_an_earlier_bigger_one():
    dyn = DynAllocator(alignment=32)
    big, _, small, _ = dyn.alloc(8000), dyn.alloc(4000), dyn.alloc(4000), dyn.alloc(4000)
    dyn.free(*big, 8000)
    dyn.free(*small, 4000)
    assert dyn.alloc(4000) == (0, 12000)
    assert dyn.total_size == 20000


def test_hole_is_used_before_the_tail_mul_mat_chain():
    # measured on ggml 0.15.3 (graph G3 of tests/peer/test_ggml_peer.py): x 2048, y1 4096, then y2 2048 goes into
    # x's hole: 6144 in total.
    dyn = DynAllocator(alignment=32)
    x, y1 = dyn.alloc(2048), dyn.alloc(4096)
    dyn.free(*x, 2048)
    assert (x, y1, dyn.alloc(2048)) == ((0, 0), (0, 2048), (0, 0))
    assert dyn.total_size == 6144


def test_sizes_are_padded_and_offsets_aligned():
    dyn = DynAllocator(alignment=64)
    assert [dyn.alloc(4) for _ in range(3)] == [(0, 0), (0, 64), (0, 128)]
    assert dyn.total_size == 192


def test_chunks_fill_to_max_size():
    dyn = DynAllocator(alignment=8, max_size=16)
    assert [dyn.alloc(8) for _ in range(3)] == [(0, 0), (0, 8), (1, 0)]
    assert dyn.chunk_sizes == [16, 8]


def test_tensor_larger_than_max_size_gets_its_own_chunk():
    dyn = DynAllocator(alignment=8, max_size=16)
    assert dyn.alloc(24) == (0, 0)
    assert dyn.chunk_sizes == [24]


def test_sixteenth_chunk_is_unbounded():
    dyn = DynAllocator(alignment=8, max_size=8)
    addrs = [dyn.alloc(8) for _ in range(17)]
    assert addrs[:15] == [(c, 0) for c in range(15)]
    assert addrs[15:] == [(15, 0), (15, 8)]
    assert dyn.chunk_sizes == [8] * 15 + [16]
    assert dyn.total_size == 136
    assert dyn.free_blocks(15) == [(16, UNBOUNDED - 16)]


def test_tail_that_needs_no_growth_beats_one_that_grows():
    # llama.cpp PR #16788: chunk 1's tail already covers 60 bytes, chunk 0's would have to grow.
    dyn = DynAllocator(alignment=1, max_size=100)
    assert dyn.alloc(60) == (0, 0)
    second = dyn.alloc(60)
    assert second == (1, 0)
    dyn.free(*second, 60)
    assert dyn.free_blocks(1) == [(0, 100)]
    assert dyn.alloc(30) == (1, 0)
    assert dyn.chunk_sizes == [60, 60]


def test_tail_needing_least_growth_wins():
    dyn = DynAllocator(alignment=1, max_size=100)
    assert dyn.alloc(60) == (0, 0)        # chunk 0: tail [60, 100) at its high-water mark
    x = dyn.alloc(50)                     # too big for chunk 0's tail: chunk 1
    dyn.free(*x, 50)                      # chunk 1: tail [0, 100), high-water mark 50
    assert dyn.alloc(45) == (1, 0)        # chunk 1 needs no growth (reuse 5)
    # 30 bytes: chunk 0 would grow by 30, chunk 1 (tail at 45, mark 50) only by 25.
    assert dyn.alloc(30) == (1, 45)
    assert dyn.chunk_sizes == [60, 75]


def test_later_chunk_with_any_fitting_hole_overrides():
    dyn = DynAllocator(alignment=1, max_size=100)
    a = dyn.alloc(20)
    dyn.alloc(20)
    dyn.alloc(20)
    dyn.free(*a, 20)                      # chunk 0: hole [0, 20), the exact fit for 20 bytes
    b = dyn.alloc(50)
    assert b == (1, 0)
    assert dyn.alloc(45) == (1, 50)
    dyn.free(*b, 50)                      # chunk 1: hole [0, 50)
    assert dyn.free_blocks(1) == [(0, 50), (95, 5)]
    assert dyn.alloc(20) == (1, 0)


def test_free_merges_with_both_neighbours():
    dyn = DynAllocator(alignment=1)
    a, b, c = dyn.alloc(10), dyn.alloc(10), dyn.alloc(10)
    dyn.free(*a, 10)
    assert dyn.free_blocks(0) == [(0, 10), (30, UNBOUNDED - 30)]
    dyn.free(*c, 10)         # extends the tail backwards
    assert dyn.free_blocks(0) == [(0, 10), (20, UNBOUNDED - 20)]
    dyn.free(*b, 10)         # extends the first block, which then swallows the tail
    assert dyn.free_blocks(0) == [(0, UNBOUNDED)]
    assert dyn.total_size == 30


def test_free_list_limit_raises():
    dyn = DynAllocator(alignment=1)
    addrs = [dyn.alloc(1) for _ in range(2 * planner.MAX_FREE_BLOCKS)]
    for addr in addrs[0:2 * (planner.MAX_FREE_BLOCKS - 1):2]:
        dyn.free(*addr, 1)
    assert len(dyn.free_blocks(0)) == planner.MAX_FREE_BLOCKS
    with pytest.raises(AllocationError, match="out of free blocks"):
        dyn.free(*addrs[2 * planner.MAX_FREE_BLOCKS - 2], 1)


def test_double_free_raises():
    dyn = DynAllocator(alignment=1)
    a = dyn.alloc(10)
    dyn.alloc(10)
    dyn.free(*a, 10)
    with pytest.raises(AllocationError, match="double free"):
        dyn.free(*a, 10)


def test_reset_forgets_everything():
    dyn = DynAllocator(alignment=8, max_size=16)
    for _ in range(3):
        dyn.alloc(8)
    dyn.reset()
    assert dyn.chunk_sizes == [] and dyn.total_size == 0
    assert dyn.alloc(8) == (0, 0)


# --- intervals, CSV, lower bound ------------------------------------------------------------------


def test_paper_example_best_is_load():
    intervals = planner.load_csv(PLANNING / "paper_example.csv")
    assert intervals[0] == Interval("t0", 0, 2, 32)
    result = plan_offsets(intervals)
    verify_offsets(intervals, result)
    assert result.lower_bound == planner.lower_bound(intervals) == 124
    assert result.height == 124


def test_lower_bound_pads_sizes():
    intervals = [Interval(0, 0, 2, 10), Interval(1, 1, 3, 10), Interval(2, 2, 4, 10)]
    assert planner.lower_bound(intervals) == 20
    assert planner.lower_bound(intervals, alignment=32) == 64


@pytest.mark.parametrize("text, message", [
    ("id,start,end,size\n", "header"),
    ("id,lower,upper,size\n0,0,4,8\n1,0,4\n", ":3: expected 4 fields"),
    ("id,lower,upper,size\n0,0,4,8\n1,0,x,8\n", ":3: bad row"),
    ("id,lower,upper,size\n0,4,4,8\n", ":2: .*end 4 must be greater than start 4"),
    ("id,lower,upper,size\n0,0,4,-1\n", ":2: .*negative"),
])
def test_load_csv_names_the_bad_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        planner.load_csv(path)


def test_unknown_planner_names_the_choices():
    with pytest.raises(ValueError, match="'ggml', 'size', 'best', 'search'"):
        plan_offsets([Interval(0, 0, 1, 8)], planner="fastest")


# --- planners ---------------------------------------------------------------------------------


def test_ggml_planner_frees_before_allocating_at_the_same_step():
    intervals = [Interval("a", 0, 1, 10), Interval("b", 1, 2, 10), Interval("c", 0, 2, 10)]
    result = plan_offsets(intervals, planner="ggml")
    assert result.offsets == {"a": 0, "c": 10, "b": 0}
    assert result.height == 20


@pytest.mark.parametrize("name", sorted(IN_PLACE_LOWER_BOUNDS))
def test_ggml_planner_reproduces_gallocr_and_best_reaches_load_on_the_graphs(name):
    graph = json.loads(graph_path(name).read_text())
    tensors = {t["id"]: t for t in graph["leafs"] + graph["nodes"]}
    intervals = planner.load_csv(GRAPH_LIFETIMES / f"{name}.csv")
    ggml = plan_offsets(intervals, alignment=graph["alignment"], planner="ggml")
    assert ggml.height == graph["compute_buffer_size"]
    assert {i: tensors[i]["offset"] for i in ggml.offsets} == ggml.offsets
    best = plan_offsets(intervals, alignment=graph["alignment"])
    verify_offsets(intervals, best)
    assert best.lower_bound == IN_PLACE_LOWER_BOUNDS[name]
    assert best.height == best.lower_bound


def test_verify_names_overlapping_intervals():
    intervals = [Interval("a", 0, 2, 10), Interval("b", 1, 3, 10)]
    clash = PlanResult({"a": 0, "b": 5}, {"a": 0, "b": 0}, [15], 20, "manual")
    with pytest.raises(AllocationError, match="'a' and 'b' are live together"):
        verify_offsets(intervals, clash)
    outside = PlanResult({"a": 0, "b": 10}, {"a": 0, "b": 0}, [15], 20, "manual")
    with pytest.raises(AllocationError, match="'b' at chunk 0 offset 10 size 10 does not fit"):
        verify_offsets(intervals, outside)
    verify_offsets(intervals, PlanResult({"a": 0, "b": 10}, {"a": 0, "b": 0}, [20], 20, "manual"))


def test_verify_checks_max_size():
    intervals = [Interval("a", 0, 2, 10), Interval("b", 1, 3, 10)]
    too_big = PlanResult({"a": 0, "b": 10}, {"a": 0, "b": 0}, [20], 20, "manual", max_size=16)
    with pytest.raises(AllocationError, match="more than max_size 16"):
        verify_offsets(intervals, too_big)


@pytest.mark.parametrize("name", [p.stem for p in planning_paths() if p.stat().st_size < 100_000])
def test_every_planner_verifies_on_the_bench(name):
    intervals = planner.load_csv(PLANNING / f"{name}.csv")
    results = {p: plan_offsets(intervals, planner=p, budget_s=0.3) for p in planner.PLANNERS}
    for result in results.values():
        verify_offsets(intervals, result)
        assert result.height >= result.lower_bound
    assert results["search"].height <= results["best"].height <= results["ggml"].height


@pytest.mark.parametrize("name", ["resnet50", "G_1", "pangu_2.6B"])
def test_best_is_within_half_a_percent_of_load_on_real_traces(name):
    intervals = planner.load_csv(PLANNING / f"{name}.csv")
    result = plan_offsets(intervals)
    verify_offsets(intervals, result)
    assert result.height <= 1.005 * result.lower_bound


def test_max_size_chunks():
    intervals = [Interval(i, i % 3, i % 3 + 2, 8 + (i % 5)) for i in range(30)]
    for name in ("ggml", "best"):
        result = plan_offsets(intervals, alignment=8, planner=name, max_size=40)
        verify_offsets(intervals, result)
        assert len(result.chunk_sizes) > 1
        assert all(size <= 40 for size in result.chunk_sizes)


def test_interval_bigger_than_max_size_gets_its_own_chunk():
    intervals = [Interval("big", 0, 2, 100), Interval("small", 0, 2, 10)]
    result = plan_offsets(intervals, max_size=50)
    verify_offsets(intervals, result)
    assert sorted(result.chunk_sizes) == [10, 100]


def test_search_improves_on_best_for_a_hard_instance():
    intervals = planner.load_csv(PLANNING / "hard_B.csv")
    best = plan_offsets(intervals)
    search = plan_offsets(intervals, planner="search", budget_s=60, max_iterations=300)
    verify_offsets(intervals, search)
    assert search.height < 0.95 * best.height


def test_search_is_deterministic_given_a_seed():
    intervals = planner.load_csv(PLANNING / "hard_F.csv")
    runs = [plan_offsets(intervals, planner="search", budget_s=60, seed=7, max_iterations=15) for _ in range(2)]
    assert runs[0].offsets == runs[1].offsets


# --- properties -------------------------------------------------------------------------------


@st.composite
def interval_sets(draw):
    n = draw(st.integers(0, 25))
    intervals = []
    for i in range(n):
        start = draw(st.integers(0, 15))
        intervals.append(Interval(i, start, start + draw(st.integers(1, 8)), draw(st.integers(0, 120))))
    return intervals


@settings(max_examples=60, deadline=None)
@given(interval_sets(), st.sampled_from([1, 8, 32]), st.sampled_from([None, 64, 200]))
def test_every_plan_verifies_and_best_beats_ggml(intervals, alignment, max_size):
    results = {name: plan_offsets(intervals, alignment, name, max_size=max_size, max_iterations=5)
               for name in planner.PLANNERS}
    for result in results.values():
        verify_offsets(intervals, result)
        assert result.height >= result.lower_bound == planner.lower_bound(intervals, alignment)
        assert all(offset % alignment == 0 for offset in result.offsets.values())
    assert results["search"].height <= results["best"].height <= results["ggml"].height
