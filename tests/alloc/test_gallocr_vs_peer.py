"""planner="ggml" against ggml 0.15.3 itself (the ctypes peer of tests/peer): on random small graphs, the
same offset for every tensor ggml's gallocr places, and the same compute buffer size."""

import pytest
from hypothesis import given

pytest.importorskip("ggml", reason="ggml-python (the ggml peer) is not installed")

import pyggml as gg  # noqa: E402
from pyggml import Context, Graph  # noqa: E402
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors  # noqa: E402
from tests.support.alloc_programs import build, programs
from tests.support.ggml_peer import GGMLPeer  # noqa: E402

pytestmark = pytest.mark.peer


@pytest.fixture(scope="module")
def peer():
    with GGMLPeer(n_threads=1) as p:
        yield p


@given(spec=programs())
def test_ggml_planner_matches_ggml(peer, spec):
    cpu = gg.backend.init_by_name("CPU")
    weights = Context(no_alloc=True)
    _, outputs, _ = build(spec, Context(no_alloc=True), weights)
    graph = Graph()
    for t in outputs:
        graph.build_forward_expand(t)
    offsets, size = peer.plan(graph, preallocated=weights.tensors)  # before ours: the peer mirrors data-less twins
    alloc_ctx_tensors(weights, cpu)
    galloc = GraphAllocator(cpu.default_buffer_type, planner="ggml")
    assert galloc.reserve(graph)
    for t, offset in offsets.items():
        assert galloc.plan.placement(t) == (0, 0, offset), t.name
    assert len(galloc.plan.tensors) == len(offsets)
    assert galloc.get_buffer_size(0) == size
