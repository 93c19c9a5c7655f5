"""Conformance on the real ggml graphs of tests/data/graphs: planner="ggml" gives ggml 0.15.3's offset for every
placed tensor and its buffer size; planner="best" is never larger, verifies, and stays within 1% of the
in-place lower bound that FORMAT.md lists."""

import pytest

import pyggml as gg
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors
from pyggml.alloc.gallocr import INPLACE_OPS
from pyggml.core.tensor import Op

from tests.support.fixture_data import GRAPH_NAMES, IN_PLACE_LOWER_BOUNDS, graph_path


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


@pytest.fixture(scope="module")
def load(cpu):
    """Load a graph file and give its preallocated tensors (weights, KV cache) memory first, as ggml had it."""
    def load_graph(name: str):
        lg = gg.load_graph_json(graph_path(name))
        alloc_ctx_tensors(lg.preallocated, cpu)
        return lg

    return load_graph


def test_inplace_op_list_matches_the_dumps(load):
    lg = load("mlp_chain")
    assert {Op[name] for name in lg.doc["inplace_ops"]} == INPLACE_OPS


@pytest.mark.parametrize("name", GRAPH_NAMES)
def test_ggml_planner_reproduces_every_offset(name, load, cpu):
    lg = load(name)
    galloc = GraphAllocator(cpu.default_buffer_type, planner="ggml")
    assert galloc.reserve(lg.graph)
    plan = galloc.plan
    got = {}
    for tid, t in lg.tensors.items():
        p = plan.placement(t)
        got[tid] = None if p is None else (p[0], p[2])
        assert p is None or p[1] == 0, f"{tid} is in chunk {p[1]}"
    wrong = {tid: (got[tid], want) for tid, want in lg.expected.placement.items() if got[tid] != want}
    assert not wrong, f"{len(wrong)} tensors differ from ggml, e.g. {next(iter(wrong.items()))}"
    assert galloc.get_buffer_size(0) == lg.expected.compute_buffer_size
    assert plan.ggml_size == lg.expected.compute_buffer_size
    assert plan.lower_bound == IN_PLACE_LOWER_BOUNDS[name]
    plan.verify()


@pytest.mark.parametrize("name", GRAPH_NAMES)
def test_best_planner_is_never_larger_and_near_the_lower_bound(name, load, cpu):
    lg = load(name)
    galloc = GraphAllocator(cpu.default_buffer_type)
    assert galloc.alloc_graph(lg.graph)
    plan = galloc.plan
    plan.verify()
    assert plan.ggml_size == lg.expected.compute_buffer_size
    assert plan.lower_bound == IN_PLACE_LOWER_BOUNDS[name]
    assert plan.size <= plan.ggml_size
    assert plan.size <= 1.01 * plan.lower_bound
    assert plan.buffers[0].planner == ("ggml" if plan.ggml_size == plan.lower_bound else "best")
    assert galloc.get_buffer_size(0) == plan.size
    # every placed tensor got its planned address in the compute buffer
    for p in plan.tensors:
        assert p.tensor.data - p.tensor.buffer.base == p.offset
