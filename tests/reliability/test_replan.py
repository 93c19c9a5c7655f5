"""One GraphAllocator fed a sequence of random graphs: the same steps with other sizes, other steps (another
topology), and repeats. Whether it re-plans or reuses its plan, every result is bit-identical to the
reference, the plan in use verifies and covers every tensor at its current size, and no byte outside a
tensor changes: a stale plan is never used."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyggml as gg
from pyggml.alloc import GraphAllocator

from tests.support.graph_strategies import dims, programs, steps
from tests.support.guarded_compute import GuardedBufferType, planned, reference


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


def variants(program):
    """The next graphs for one allocator: same steps with new dims, new steps with the same dims, or a repeat."""
    base_dims, base_steps = program
    return st.lists(st.one_of(st.tuples(dims, st.just(base_steps)), st.tuples(st.just(base_dims), steps),
                              st.just(program)), min_size=1, max_size=4)


@given(program=programs, data=st.data(), planner=st.sampled_from(["ggml", "best"]),
       alignment=st.sampled_from([8, 16, 64, 128]), seed=st.integers(0, 2**31))
def test_one_allocator_over_changing_graphs_never_uses_a_stale_plan(cpu, program, data, planner, alignment, seed):
    galloc = GraphAllocator(GuardedBufferType(alignment, 2**64 - 1), planner=planner)
    for p in [program, *data.draw(variants(program))]:
        outputs, guard = planned(p, cpu, seed, galloc)
        assert guard == []
        assert outputs == reference(p, cpu, seed)
    galloc.free()


@given(program=programs, new_dims=dims, seed=st.integers(0, 2**31))
def test_reserved_worst_case_is_reused_without_growth_for_smaller_graphs(cpu, program, new_dims, seed):
    """Plan the larger of two sizes first (llama.cpp's worst-case pattern), then the smaller one."""
    big = (tuple(max(a, b) for a, b in zip(program[0], new_dims, strict=True)), program[1])
    small = (tuple(min(a, b) for a, b in zip(program[0], new_dims, strict=True)), program[1])
    galloc = GraphAllocator(GuardedBufferType(16, 2**64 - 1))
    planned(big, cpu, seed, galloc)
    outputs, guard = planned(small, cpu, seed, galloc)
    assert guard == [] and outputs == reference(small, cpu, seed)
    assert galloc.get_buffer_size(0) >= galloc.plan.size  # whatever was reused, the buffer holds the plan


def test_a_grown_output_leaf_is_re_planned(cpu):
    """Regression: a graph whose only tensor is an output leaf grew, and needs_realloc (which, like ggml,
    checked leafs only as sources of nodes) reused the smaller plan; alloc_graph then raised OutOfBoundsError."""
    galloc = GraphAllocator(GuardedBufferType(8, 2**64 - 1), planner="ggml")
    for program in (((1, 1, 1), []), ((1, 3, 1), [])):
        outputs, guard = planned(program, cpu, 0, galloc)
        assert outputs == reference(program, cpu, 0) and guard == []


def test_empty_tensors_take_empty_arrays(cpu):
    """Regression: tensor_set of a zero-element typed array (found as a soft_max mask [0, 2] after a GLU halved a
    row of 1) raised TypeError from memoryview.cast; ggml's tensor_set of 0 bytes does nothing."""
    ctx = gg.Context(no_alloc=True)
    empty = ctx.new_tensor_2d(gg.GGMLType.F32, 0, 2, "empty")
    ctx.new_tensor_1d(gg.GGMLType.F32, 4, "not_empty")  # a context of empty tensors only gets no buffer
    gg.alloc.alloc_ctx_tensors(ctx, cpu)
    gg.backend.tensor_set(empty, np.zeros((2, 0), np.float32))
    assert gg.backend.tensor_get(empty).shape == (2, 0)


def test_empty_permuted_tensors_read_back(cpu):
    """Regression: an empty tensor permuted to ne [2, 0] has ggml n_dims 1, and numpy()/tensor_get reshaped its
    0 elements to shape (2,) (ValueError); the 0-element dim is now kept: shape (0, 2)."""
    ctx = gg.Context(no_alloc=True)
    transposed = gg.ops.permute(ctx, ctx.new_tensor_2d(gg.GGMLType.F32, 0, 2, "empty"), 1, 0, 2, 3)
    ctx.new_tensor_1d(gg.GGMLType.F32, 4, "not_empty")
    gg.alloc.alloc_ctx_tensors(ctx, cpu)
    assert gg.backend.tensor_get(transposed).shape == transposed.numpy().shape == (0, 2)
