"""GraphAllocator(reorder=True) on random graphs: the chosen order respects every data dependency and
side-effect chain, computing in it (in planned memory, dead tensors poisoned) is bit-identical to
computing the graph as built, and the plan is never larger than ggml's LOAD for the original order."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

import pyggml as gg
from pyggml import Context
from pyggml.alloc import GraphAllocator, schedule

from tests.support.graph_strategies import build, build_wide_dag, programs
from tests.support.guarded_compute import GuardedBufferType, planned, reference

UNBOUNDED = 2**64 - 1


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


def _check_order(program, builder, galloc):
    """Plan a fresh build and check that the allocator's order is a valid one for the original order."""
    graph = builder(program, Context(no_alloc=True)).graph()
    original = list(graph.nodes)
    galloc.reserve(graph)
    position = {id(t): i for i, t in enumerate(original)}
    order = [position[id(t)] for t in graph.nodes]
    assert schedule.is_topological(order, schedule.dependencies(original))
    plan = galloc.plan
    plan.verify()
    return plan


@pytest.mark.long
@given(program=programs, alignment=st.sampled_from([8, 64]), max_size=st.sampled_from([256, UNBOUNDED]),
       seed=st.integers(0, 2**31))
def test_reordered_compute_is_bit_identical_and_never_above_ggml_load(cpu, program, alignment, max_size, seed):
    plan = _check_order(program, build, GraphAllocator(GuardedBufferType(alignment, max_size), reorder=True))
    if max_size == UNBOUNDED:
        assert plan.size <= plan.ggml_order_lower_bound
    assert plan.lower_bound <= plan.ggml_order_lower_bound
    outputs, guard = planned(program, cpu, seed, GraphAllocator(GuardedBufferType(alignment, max_size), reorder=True))
    assert guard == []
    assert outputs == reference(program, cpu, seed)


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # products of products grow past F16 in gelu
@pytest.mark.parametrize("seed", [0, 1])
def test_reordered_wide_dag_computes_bit_identical(cpu, seed):
    galloc = GraphAllocator(GuardedBufferType(32, UNBOUNDED), reorder=True)
    plan = _check_order(seed, lambda s, ctx: build_wide_dag(s, 120, ctx), galloc)
    assert plan.size <= plan.ggml_order_lower_bound
    galloc = GraphAllocator(GuardedBufferType(32, UNBOUNDED), reorder=True)
    builder = lambda s, ctx: build_wide_dag(s, 120, ctx)  # noqa: E731
    outputs, guard = planned(seed, cpu, seed, galloc, builder=builder)
    assert guard == []
    assert outputs == reference(seed, cpu, seed, builder=builder)
