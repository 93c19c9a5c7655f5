"""GraphAllocator on small graphs with ggml 0.15.3's measured layouts and sizes (`ggml_gallocr_reserve_n`,
`ggml_gallocr_alloc_graph`), its re-planning rules, and its safety additions (topology fingerprint, reserve_n_size,
errors)."""

import logging

import numpy as np
import pytest

import pyggml as gg
from pyggml import Context, GGMLType, Graph
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors
from pyggml.backend import tensor_get, tensor_set
from pyggml.core import ops
from pyggml.errors import AllocationError, BufferIdError
from tests.support.alloc_test_buft import DummyBufferType

N = 1000  # 4000-byte f32 tensors, as in the notes


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


def vec(ctx: Context, n: int = N, name: str = "", input_: bool = True):
    t = ctx.new_tensor_1d(GGMLType.F32, n, name)
    return t.set_input() if input_ else t


def offsets(galloc: GraphAllocator, *tensors) -> list[int | None]:
    return [None if galloc.plan.placement(t) is None else galloc.plan.placement(t)[2] for t in tensors]


def planned(cpu, *outs, planner: str = "ggml") -> GraphAllocator:
    graph = Graph()
    for out in outs:
        graph.build_forward_expand(out)
    galloc = GraphAllocator(cpu.default_buffer_type, planner=planner, debug=True)
    assert galloc.reserve(graph)
    return galloc


# ----- layouts and sizes on CPU (alignment 32) -----------------------------------------------


def test_chain_runs_in_place_on_its_input(cpu):
    ctx = Context(no_alloc=True)
    x, b = vec(ctx, name="x"), vec(ctx, name="b")
    h1 = ops.add(ctx, x, b)
    h2 = ops.relu(ctx, h1)
    h3 = ops.add(ctx, h2, b)
    h4 = ops.relu(ctx, h3)
    galloc = planned(cpu, h4)
    assert offsets(galloc, x, b, h1, h2, h3, h4) == [0, 4000, 0, 0, 0, 0]
    assert galloc.get_buffer_size(0) == 8000
    assert [p.tensor for p in galloc.plan.tensors if p.inplace_parent is x] == [h1]


def test_output_input_is_not_overwritten(cpu):
    ctx = Context(no_alloc=True)
    x, b = vec(ctx, name="x").set_output(), vec(ctx, name="b")
    h4 = ops.relu(ctx, ops.add(ctx, ops.relu(ctx, ops.add(ctx, x, b)), b))
    galloc = planned(cpu, h4)
    assert offsets(galloc, h4) == [8000]
    assert galloc.get_buffer_size(0) == 12000


def test_diamond(cpu):
    ctx = Context(no_alloc=True)
    x = vec(ctx, name="x")
    a, b = ops.scale(ctx, x, 2.0), ops.sqr(ctx, x)
    c = ops.add(ctx, a, b)
    galloc = planned(cpu, c)
    assert offsets(galloc, x, a, b, c) == [0, 4000, 0, 4000]
    assert galloc.get_buffer_size(0) == 8000


def test_diamond_with_cont_branches(cpu):
    ctx = Context(no_alloc=True)
    x = vec(ctx, name="x")
    a, b = ops.cont(ctx, x), ops.cont(ctx, x)
    c = ops.add(ctx, a, b)
    galloc = planned(cpu, c)
    assert offsets(galloc, a, b, c) == [4000, 8000, 4000]
    assert galloc.get_buffer_size(0) == 12000


def test_mul_mat_chain_with_preallocated_weights(cpu):
    wctx, ctx = Context(no_alloc=True), Context(no_alloc=True)
    w1 = wctx.new_tensor_2d(GGMLType.F32, 512, 1024, "w1")
    w2 = wctx.new_tensor_2d(GGMLType.F32, 1024, 512, "w2")
    weights = alloc_ctx_tensors(wctx, cpu)
    weights.usage = gg.BufferUsage.WEIGHTS
    x = vec(ctx, 512, "x")
    y1 = ops.mul_mat(ctx, w1, x)
    r1 = ops.relu(ctx, y1)
    y2 = ops.mul_mat(ctx, w2, r1)
    r2 = ops.relu(ctx, y2)
    galloc = planned(cpu, r2)
    assert offsets(galloc, x, y1, r1, y2, r2, w1) == [0, 2048, 2048, 0, 0, None]
    assert galloc.get_buffer_size(0) == 6144


def test_no_in_place_through_a_view_parent(cpu):
    ctx = Context(no_alloc=True)
    x = vec(ctx, name="x")
    c = ops.scale(ctx, x, 2.0)
    v = ops.reshape_2d(ctx, c, 100, 10)
    r = ops.relu(ctx, v)
    s = ops.add(ctx, r, ops.reshape_2d(ctx, x, 100, 10))
    galloc = planned(cpu, s)
    assert offsets(galloc, c, v, r, s) == [4000, None, 8000, 8000]
    assert galloc.get_buffer_size(0) == 12000


def test_input_is_overwritten_in_place(cpu):
    ctx = Context(no_alloc=True)
    x = vec(ctx, 8, "x")
    r = ops.relu(ctx, x)
    graph = Graph().build_forward_expand(r)
    galloc = GraphAllocator(cpu.default_buffer_type, planner="ggml")
    assert galloc.alloc_graph(graph)
    assert r.data == x.data and galloc.get_buffer_size(0) == 32
    tensor_set(x, np.array([-1, 2, -3, 4, -5, 6, -7, 8], np.float32))
    cpu.graph_compute(graph)
    assert tensor_get(x)[:4].tolist() == [0, 2, 0, 4]


def test_add_of_a_tensor_with_itself_is_not_in_place(cpu):
    ctx = Context(no_alloc=True)
    x, y = vec(ctx, name="x", input_=False), vec(ctx, name="y", input_=False)
    a = ops.add(ctx, x, x)
    b = ops.mul(ctx, a, y)
    galloc = planned(cpu, b)
    assert offsets(galloc, x, y, a, b) == [0, 4000, 8000, 8000]
    assert galloc.get_buffer_size(0) == 12000


def test_cont_chain_alternates(cpu):
    ctx = Context(no_alloc=True)
    x = vec(ctx, name="x", input_=False)
    a = ops.cont(ctx, x)
    b = ops.cont(ctx, a)
    c = ops.cont(ctx, b)
    galloc = planned(cpu, c)
    assert offsets(galloc, x, a, b, c) == [0, 4000, 0, 4000]
    assert galloc.get_buffer_size(0) == 8000


def test_soft_max_of_scale_in_place(cpu):
    ctx = Context(no_alloc=True)
    x = vec(ctx, name="x")
    s = ops.soft_max(ctx, ops.scale(ctx, x, 0.5))
    galloc = planned(cpu, s)
    assert set(offsets(galloc, x, s)) == {0}
    assert galloc.get_buffer_size(0) == 4000


# ----- best fit over holes ---------------------------------------------------------------------------


def _two_holes(cpu, second_hole_elems: int):
    """Leafs x0..x3 placed back to back; concat(x0, x2) frees two holes; cont(x1) then picks one."""
    ctx = Context(no_alloc=True)
    x0, x1 = vec(ctx, input_=False), vec(ctx, input_=False)
    x2, x3 = vec(ctx, second_hole_elems, input_=False), vec(ctx, input_=False)
    graph = Graph()
    for t in (x0, x1, x2, x3):
        graph.build_forward_expand(t)
    n1 = ops.cont(ctx, x1)
    graph.build_forward_expand(ops.concat(ctx, x0, x2, 0))
    graph.build_forward_expand(n1)
    galloc = GraphAllocator(cpu.default_buffer_type, planner="ggml", debug=True)
    assert galloc.reserve(graph)
    return galloc, n1


def test_best_fit_ties_go_to_the_later_hole(cpu):
    galloc, n1 = _two_holes(cpu, N)
    assert offsets(galloc, n1) == [8000]


def test_best_fit_prefers_the_smaller_hole(cpu):
    galloc, n1 = _two_holes(cpu, 2 * N)
    assert offsets(galloc, n1) == [0]


# ----- reserve_n_size, growth, several buffers -----------------------------------------------


def _softmax_graph():
    ctx = Context(no_alloc=True)
    return Graph().build_forward_expand(ops.soft_max(ctx, ops.scale(ctx, vec(ctx), 0.5)))


@pytest.mark.parametrize("planner", ["ggml", "best"])
def test_reserve_n_size_then_alloc_graph_allocates(cpu, planner):
    galloc = GraphAllocator(cpu.default_buffer_type, planner=planner)
    graph = _softmax_graph()
    assert galloc.reserve_n_size(graph) == [4000]
    assert galloc.get_buffer_size(0) == 0
    assert galloc.alloc_graph(graph)  # ggml 0.15.3 dereferences a NULL buffer here
    assert galloc.get_buffer_size(0) == 4000
    assert all(t.data is not None for t in graph.nodes)


def _cont_chain(n: int, k: int) -> Graph:
    ctx = Context(no_alloc=True)
    t = vec(ctx, n, input_=False)
    for _ in range(k):
        t = ops.cont(ctx, t)
    return Graph().build_forward_expand(t)


def test_buffers_grow_and_never_shrink(cpu):
    galloc = GraphAllocator(cpu.default_buffer_type)
    sizes = []
    for n, k in [(1000, 3), (1000, 3), (2000, 3), (500, 3), (500, 5), (4000, 2)]:
        assert galloc.alloc_graph(_cont_chain(n, k))
        sizes.append(galloc.get_buffer_size(0))
    assert sizes == [8000, 8000, 16000, 16000, 16000, 32000]


def test_reserve_big_then_alloc_small_keeps_the_buffer(cpu):
    galloc = GraphAllocator(cpu.default_buffer_type)
    assert galloc.reserve(_cont_chain(4000, 2))
    assert galloc.alloc_graph(_cont_chain(500, 3))
    assert galloc.get_buffer_size(0) == 32000


def test_shared_buffer_type_needs_reserve_n(cpu):
    buft = cpu.default_buffer_type
    galloc = GraphAllocator([buft, buft])
    graph = _cont_chain(1000, 3)
    assert not galloc.alloc_graph(graph)  # several buffers never re-plan on their own
    assert galloc.reserve_n(graph, [0, 1, 1], [0])
    assert galloc.alloc_graph(graph)
    assert (galloc.get_buffer_size(0), galloc.get_buffer_size(1)) == (8000, 0)
    fresh = _cont_chain(1000, 3)  # the tensors of `graph` have memory now, so a plan of it places nothing
    assert galloc.reserve_n_size(fresh, [0, 1, 1], [0]) == [8000, 8000]  # not deduplicated, as in ggml


def test_a_rebuilt_graph_of_the_same_shape_reuses_the_plan(cpu, caplog):
    galloc = GraphAllocator(cpu.default_buffer_type)
    first = _cont_chain(1000, 3)
    assert galloc.alloc_graph(first)
    rebuilt = _cont_chain(1000, 3)
    with caplog.at_level(logging.DEBUG, logger="pyggml.alloc"):
        assert galloc.alloc_graph(rebuilt)
    assert "re-planning" not in caplog.text
    # the plan now describes the rebuilt graph's tensors, at the same places
    assert [galloc.plan.placement(t) for t in rebuilt.nodes] == [(0, 0, 4000), (0, 0, 0), (0, 0, 4000)]
    assert galloc.plan.placement(first.nodes[0]) is None


# ----- topology changes (ggml silently reuses stale offsets) ----------------------------------------


def _topology_graph(variant: str):
    ctx = Context(no_alloc=True)
    x, y = vec(ctx, name="x"), vec(ctx, name="y")
    n1, n2 = ops.cont(ctx, x), ops.cont(ctx, y)
    n3 = ops.add(ctx, n1, n2) if variant == "A" else ops.add(ctx, n2, x)
    return x, y, n3, Graph().build_forward_expand(n1).build_forward_expand(n3)


def test_topology_change_is_replanned_with_one_buffer(cpu):
    galloc = GraphAllocator(cpu.default_buffer_type, planner="ggml")
    x, y, n3, graph = _topology_graph("A")
    assert galloc.alloc_graph(graph)
    assert offsets(galloc, x, y, *graph.nodes) == [0, 4000, 8000, 0, 8000]
    x, y, n3, graph = _topology_graph("B")
    assert galloc.alloc_graph(graph)
    tensor_set(x, np.full(N, 1.0, np.float32))
    tensor_set(y, np.full(N, 10.0, np.float32))
    cpu.graph_compute(graph)
    assert tensor_get(n3)[0] == 11.0  # ggml 0.15.3 gives 20.0 (n2 overwrote x)


def test_topology_change_is_refused_with_several_buffers(cpu):
    galloc = GraphAllocator([cpu.default_buffer_type, DummyBufferType()])
    *_, graph = _topology_graph("A")
    assert galloc.reserve_n(graph, [0, 0, 0], [0, 0])
    *_, rebuilt = _topology_graph("A")
    assert galloc.needs_realloc(rebuilt) is None
    *_, graph = _topology_graph("B")
    assert "topology" in galloc.needs_realloc(graph)
    assert not galloc.alloc_graph(graph)
    assert all(t.data is None for t in graph.nodes)


# ----- an OUTPUT view keeps its root alive -----------------------------------------------------------


@pytest.mark.parametrize("planner", ["ggml", "best"])
def test_output_view_keeps_its_root(cpu, planner):
    ctx = Context(no_alloc=True)
    x = vec(ctx, 16, "x")
    c = ops.scale(ctx, x, 3.0)
    v = ops.reshape_2d(ctx, c, 4, 4).set_output()
    z2 = ops.cont(ctx, ops.scale(ctx, ops.cont(ctx, v), 100.0))
    graph = Graph().build_forward_expand(z2)
    galloc = GraphAllocator(cpu.default_buffer_type, planner=planner, debug=True)
    assert galloc.alloc_graph(graph)
    assert galloc.plan.get(c).last == graph.n_nodes - 1
    tensor_set(x, np.ones(16, np.float32))
    cpu.graph_compute(graph)
    assert tensor_get(v)[0, 0] == 3.0  # 300.0 in ggml 0.15.3


# ----- chunks and errors ----------------------------------------------------------------------------


def test_alignment_pads_sizes_not_offsets():
    buft = DummyBufferType(2**64 - 1, alignment=64)
    ctx = Context(no_alloc=True)
    a, b, c = (vec(ctx, 1) for _ in range(3))
    graph = Graph().build_forward_expand(ops.add(ctx, ops.add(ctx, a, b), c))
    galloc = GraphAllocator(buft, planner="ggml")
    assert galloc.reserve(graph)
    assert offsets(galloc, a, b, c) == [0, 64, 128]
    assert galloc.get_buffer_size(0) == 192


def test_bad_buffer_ids_raise_and_change_nothing(cpu):
    galloc = GraphAllocator([cpu.default_buffer_type, DummyBufferType()])
    graph = _cont_chain(100, 3)
    assert galloc.reserve_n(graph, [0, 0, 0], [0])
    plan = galloc.plan
    with pytest.raises(BufferIdError, match="node 1 .* buffer id 2"):
        galloc.reserve_n(graph, [0, 2, 0], [0])
    with pytest.raises(BufferIdError, match="node_buffer_ids has 2 entries, but the graph has 3 nodes"):
        galloc.reserve_n(graph, [0, 0], [0])
    with pytest.raises(BufferIdError, match="leaf 0"):
        galloc.reserve_n_size(graph, [0, 0, 0], [-1])
    with pytest.raises(BufferIdError, match="buffer id 5"):
        galloc.get_buffer_size(5)
    assert galloc.plan is plan and galloc.alloc_graph(graph)


def test_unknown_planner_is_refused(cpu):
    with pytest.raises(AllocationError, match="unknown planner 'fast'"):
        GraphAllocator(cpu.default_buffer_type, planner="fast")


class FlakyBufferType(DummyBufferType):
    fail = True

    def _alloc_buffer(self, size):
        if self.fail:
            raise MemoryError("out of device memory")
        return super()._alloc_buffer(size)


def test_failed_allocation_returns_false_and_is_retried():
    buft = FlakyBufferType(2**64 - 1)
    galloc = GraphAllocator(buft)
    graph = _cont_chain(100, 3)
    assert not galloc.reserve(graph)
    assert galloc.plan is not None and galloc.get_buffer_size(0) == 0
    buft.fail = False
    assert galloc.alloc_graph(graph)
    assert galloc.get_buffer_size(0) == 800


def test_free_releases_every_buffer_once(cpu):
    buft = DummyBufferType(2**64 - 1)
    galloc = GraphAllocator([buft, buft])
    assert galloc.reserve_n(_cont_chain(100, 3), [0, 1, 0], [1])
    assert buft.allocated_total() == 800
    galloc.free()
    assert buft.allocated_total() == 0 and galloc.plan is None


def test_debug_mode_from_the_environment(cpu, monkeypatch):
    monkeypatch.setenv("PYGGML_DEBUG_ALLOC", "1")
    assert GraphAllocator(cpu.default_buffer_type).debug
    monkeypatch.setenv("PYGGML_DEBUG_ALLOC", "0")
    assert not GraphAllocator(cpu.default_buffer_type).debug


class RefusingBuffer(gg.backend.Buffer):
    """A buffer whose init_tensor fails for one tensor name."""

    def _init_tensor(self, t):
        if t.name == "refused":
            raise AllocationError(f"init_tensor refuses {t.name!r}")
        return gg.Status.SUCCESS


class RefusingBufferType(DummyBufferType):
    def _alloc_buffer(self, size):
        return RefusingBuffer(self, size)


def test_failed_alloc_graph_leaves_no_tensor_half_placed():
    ctx = Context(no_alloc=True)
    x = vec(ctx, 16, "x")
    a = ops.cont(ctx, x)
    b = ops.cont(ctx, a).set_name("refused")
    graph = Graph().build_forward_expand(b)
    galloc = GraphAllocator(RefusingBufferType(2**64 - 1))
    with pytest.raises(AllocationError, match="refuses 'refused'"):
        galloc.alloc_graph(graph)
    assert all(t.data is None and t.buffer is None for t in (x, a, b))
