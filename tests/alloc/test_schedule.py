"""Memory-aware node orders (`pyggml.alloc.schedule`) and GraphAllocator(reorder=True): dependencies and
side-effect chains, extended in-place reuse, and the lower bounds on the graph fixtures and random wide DAGs."""

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

import pyggml as gg
from pyggml import Context, GGMLType
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors, alloc_ctx_tensors_from_buft, schedule
from pyggml.backend import tensor_get, tensor_set
from pyggml.cli.plan import AddressOnlyBufferType
from pyggml.core import ops
from pyggml.core.graph_json import load_graph_json

DATA = Path(__file__).resolve().parents[1] / "data"
from tests.support.graph_strategies import build_wide_dag  # noqa: E402

GGML_LOAD = {"mlp_chain": 262144, "gpt2_small_prefill": 104499200, "gpt2_small_decode": 1605632,
             "llama_like_block_stack": 15991808, "whisper_tiny_encoder_like": 63216000, "wide_dag": 19730432}


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


def _planned(graph, alignment=32, reorder=True):
    galloc = GraphAllocator(AddressOnlyBufferType("CPU", alignment), reorder=reorder)
    galloc.reserve(graph)
    galloc.plan.verify()
    return galloc.plan


@pytest.mark.parametrize("name", sorted(GGML_LOAD))
def test_reordered_plan_is_never_above_ggml_load_on_the_graph_fixtures(name):
    lg = load_graph_json(DATA / "graphs" / f"{name}.json")
    alloc_ctx_tensors_from_buft(lg.preallocated, AddressOnlyBufferType("CPU", lg.doc.get("alignment", 32)))
    plan = _planned(lg.graph, lg.doc.get("alignment", 32))
    assert plan.ggml_order_lower_bound == GGML_LOAD[name]
    assert plan.lower_bound <= plan.size <= GGML_LOAD[name]
    if name == "wide_dag":
        assert plan.size <= 0.9 * GGML_LOAD[name]


def test_random_wide_dags_need_at_least_a_tenth_less_than_ggml_load():
    ratios = []
    for seed in range(12):
        plan = _planned(build_wide_dag(seed, 200, Context(no_alloc=True)).graph())
        assert plan.size <= plan.ggml_order_lower_bound
        ratios.append(plan.size / plan.ggml_order_lower_bound)
    assert np.mean(ratios) <= 0.9, ratios


def test_without_reorder_the_order_and_ggml_load_are_kept():
    graph = build_wide_dag(0, 100, Context(no_alloc=True)).graph()
    nodes = list(graph.nodes)
    plan = _planned(graph, reorder=False)
    assert graph.nodes == nodes and plan.ggml_order_lower_bound == plan.lower_bound


def test_writes_into_shared_memory_keep_their_order_with_its_readers(cpu):
    """cpy into a view of a cache and a later read of that cache have no data edge, only the original order."""
    ctx = Context(no_alloc=True)
    cache = ctx.new_tensor_2d(GGMLType.F32, 8, 4, name="cache")
    alloc_ctx_tensors(ctx, cpu)
    tensor_set(cache, np.arange(32, dtype=np.float32).reshape(4, 8))
    x = ctx.new_tensor_2d(GGMLType.F32, 8, 2, name="x")
    x.set_input()
    big = ops.scale(ctx, ctx.new_tensor_2d(GGMLType.F32, 8, 64, name="y"), 2.0)
    written = ops.cpy(ctx, ops.neg(ctx, x), ops.view_2d(ctx, cache, 8, 2, cache.nb[1], 0))
    cached = ops.cont(ctx, ops.view_2d(ctx, cache, 8, 2, cache.nb[1], 0))
    read = ops.sum_rows(ctx, ops.add(ctx, cached, ops.neg(ctx, x)))
    out = ops.add(ctx, ops.sum_rows(ctx, big), ops.sum(ctx, read))
    graph = gg.Graph()
    graph.build_forward_expand(written)
    graph.build_forward_expand(out)
    out.set_output()
    nodes = list(graph.nodes)
    before = schedule.dependencies(nodes)
    touching = [i for i, t in enumerate(nodes) if t.view_src is cache or any(
        s is not None and (s is cache or s.view_src is cache) for s in t.src)]
    assert nodes.index(written) in touching
    for a, b in pairwise(touching):
        assert a in before[b]
    for order in schedule.candidate_orders(nodes, lambda t: t.nbytes):
        assert schedule.is_topological(order, before)

    galloc = GraphAllocator(cpu.default_buffer_type, reorder=True)
    assert galloc.alloc_graph(graph)
    tensor_set(x, np.ones((2, 8), np.float32))
    tensor_set(big.src[0], np.ones((64, 8), np.float32))
    cpu.graph_compute(graph)
    # rows 0-1 of the cache hold -1 after the copy: the read sums (-1 - 1) * 16 = -32; big's rows sum to 16
    assert np.array_equal(tensor_get(out), np.full((64, 1), -16.0, np.float32))


def test_elementwise_ops_reuse_a_dying_source_only_when_reordering():
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_2d(GGMLType.F32, 16, 4, name="x")
    x.set_input()
    h = ops.scale(ctx, x, 2.0)
    s = ops.sin(ctx, h)
    s.set_output()
    graph = gg.Graph().build_forward_expand(s)
    assert _planned(graph, reorder=False).get(s).inplace_parent is None
    assert _planned(graph, reorder=True).get(s).inplace_parent is h


def test_reserving_the_2000_node_graph_again_plans_the_same():
    """A second reserve of the same graph keeps the first one's buffer (its planning time: benchmarks/planning.py,
    about 50 ms on a quiet machine)."""
    lg = load_graph_json(DATA / "graphs" / "wide_dag.json")
    buft = AddressOnlyBufferType("CPU", 32)
    alloc_ctx_tensors_from_buft(lg.preallocated, buft)
    galloc = GraphAllocator(buft)
    assert galloc.reserve(lg.graph)
    size = galloc.get_buffer_size(0)
    assert size > 0
    galloc.reserve(lg.graph)
    assert galloc.get_buffer_size(0) == size
