"""Random graphs over every op family (graph_strategies), planned by both planners over one or two guarded
buffer types with odd alignments and small max_size: every plan verifies, computing in the planned memory
(each tensor poisoned with NaN bytes as soon as it dies) is bit-identical to computing with every tensor in
memory of its own, and no byte outside a tensor's data changes (guard bytes after every tensor)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyggml as gg
from pyggml import Context
from pyggml.alloc import GraphAllocator

from tests.support.graph_strategies import NAMES, STEPS, build, programs
from tests.support.guarded_compute import GuardedBufferType, planned, reference


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


buft_params = st.tuples(st.sampled_from([8, 16, 64, 128]), st.sampled_from([96, 256, 1024, 2**64 - 1]))


@given(program=programs, params=st.lists(buft_params, min_size=1, max_size=2), data=st.data(),
       seed=st.integers(0, 2**31))
def test_planned_compute_is_bit_identical_and_stays_inside_tensors(cpu, program, params, data, seed):
    expected = reference(program, cpu, seed)
    types = [GuardedBufferType(a, m) for a, m in params]
    ids = None
    if len(types) > 1:  # a buffer id per node and per leaf, the same for both planners
        graph = build(program, Context(no_alloc=True)).graph()
        ids = tuple(data.draw(st.lists(st.integers(0, len(types) - 1), min_size=n, max_size=n))
                    for n in (graph.n_nodes, graph.n_leafs))
    sizes = {}
    for planner in ("ggml", "best"):
        galloc = GraphAllocator(types, planner=planner)
        outputs, guard = planned(program, cpu, seed, galloc, ids)
        assert guard == []
        assert outputs == expected
        sizes[planner] = galloc.plan.size
        galloc.free()
    assert sizes["best"] <= sizes["ggml"]


@pytest.mark.parametrize("program", [
    # soft_max_ext planned in place over its mask (ggml reuses any source): the kernel overwrote the mask first
    ((2, 1, 1), [("leaf", 0, 0), ("leaf", 0, 0), ("cpy", 0, 0), ("soft_max", 1, 3)]),
    # rope with n_dims == 0 (ggml copies the rows): the angle cache indexed an empty array
    ((1, 1, 1), [("rope", 0, 0)]),
], ids=["soft_max_in_place_over_mask", "rope_n_dims_0"])
def test_found_regressions(cpu, program):
    expected = reference(program, cpu, 0)
    for planner in ("ggml", "best"):
        outputs, guard = planned(program, cpu, 0, GraphAllocator(GuardedBufferType(8, 96), planner=planner))
        assert outputs == expected and guard == []


def test_every_op_family_is_reached():
    """Every step kind the strategy draws builds on typical dims (a guard against a strategy gone stale)."""
    rng = np.random.default_rng(0)
    reached = set()
    for kind in STEPS:
        for _ in range(40):
            a, b = (int(x) for x in rng.integers(0, 64, 2))
            step = (kind, str(rng.choice(NAMES[kind])), a, b) if kind in NAMES else (kind, a, b)
            prog = build(((4, 3, 2), [("leaf", 1, 1), ("leaf", 0, 0), step]), Context(no_alloc=True))
            if prog.skipped == 0:
                reached.add(kind)
                break
    assert reached == set(STEPS)
