"""llama.cpp's tests/test-alloc.cpp cases with their bounds, on a buffer type with small
max_size and alignment; ggml's measured numbers are asserted exactly where the notes give them."""

import pytest

from pyggml import Context, GGMLType, Graph
from pyggml.core import ops
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors_from_buft
from pyggml.alloc.gallocr import INPLACE_OPS
from pyggml.core.tensor import MAX_SRC, Tensor, TensorFlag
from tests.support.alloc_test_buft import DummyBufferType

SIZE_MAX = 2**64 - 1
PLANNERS = ["ggml", "best"]


def new_input(ctx: Context, nbytes: int) -> Tensor:
    return ctx.new_tensor_1d(GGMLType.F32, nbytes // 4).set_input()


def name_all(ctx: Context, prefix: str = "x") -> None:
    for i, t in enumerate(ctx.tensors):
        t.set_name(f"{prefix}{i}")


def allocate(out: Tensor, buft: DummyBufferType, planner: str) -> tuple[Graph, GraphAllocator]:
    out.set_output()
    graph = Graph().build_forward_expand(out)
    galloc = GraphAllocator(buft, planner=planner, debug=True)
    assert galloc.alloc_graph(graph)
    return graph, galloc


def check_all_allocated(graph: Graph) -> None:
    for t in graph.nodes:
        assert t.buffer is not None and t.data is not None, t.name


def check_max_size(ctx: Context) -> None:
    for t in ctx.tensors:
        offset = t.data - (t.buffer.base or 0)
        assert offset >= 0 and offset + t.nbytes <= t.buffer.buft.max_size, t.name


def _root(t: Tensor) -> Tensor:
    return t.view_src if t.view_src is not None else t


def _can_reuse_memory(graph: Graph, current_i: int, current: Tensor, other: Tensor) -> bool:
    """test-alloc's rule: `other` is dead from node current_i on (the current node may read it in place)."""
    if other.flags & TensorFlag.OUTPUT:
        return False
    for t in graph.nodes[current_i:]:
        for s in range(MAX_SRC):
            if t is current and t.op in INPLACE_OPS:
                continue
            src = t.src[s]
            if src is other or (src is not None and src.view_src is other):
                return False
    return True


def check_no_overlap(graph: Graph) -> None:
    for i, t in enumerate(graph.nodes):
        for o in graph.nodes[:i]:
            if _root(t) is _root(o) or t.buffer is not o.buffer:
                continue
            if t.data < o.data + o.nbytes and o.data < t.data + t.nbytes:
                assert _can_reuse_memory(graph, i, t, o), (t.name, o.name)


def check_graph(graph: Graph, ctx: Context, max_size: bool = True) -> None:
    check_all_allocated(graph)
    check_no_overlap(graph)
    if max_size:
        check_max_size(ctx)


@pytest.mark.parametrize("planner", PLANNERS)
def test_max_size_too_many_tensors(planner):
    buft, ctx = DummyBufferType(16), Context(no_alloc=True)
    x = [new_input(ctx, 8) for _ in range(3)]
    x.append(ops.mul(ctx, x[0], x[1]))
    x.append(ops.add(ctx, x[1], x[2]))
    x.append(ops.add(ctx, x[3], x[0]))
    x.append(ops.add(ctx, x[4], x[5]))
    name_all(ctx)
    graph, galloc = allocate(x[6], buft, planner)
    check_graph(graph, ctx)
    assert buft.allocated_total() <= 16 + 16
    if planner == "ggml":
        assert galloc.plan.chunk_sizes == [[16, 8]] and buft.allocated_total() == 24  # as ggml 0.15.3


@pytest.mark.parametrize("planner", PLANNERS)
def test_max_size_tensor_too_large(planner):
    buft, ctx = DummyBufferType(32), Context(no_alloc=True)
    x0, x1 = new_input(ctx, 16), new_input(ctx, 8)
    x2 = ops.concat(ctx, x0, x1, 0)
    name_all(ctx)
    graph, _ = allocate(x2, buft, planner)
    check_graph(graph, ctx)
    assert buft.allocated_total() <= 32 + 24


@pytest.mark.parametrize("planner", PLANNERS)
def test_tensor_larger_than_max_size(planner):
    buft, ctx = DummyBufferType(16), Context(no_alloc=True)
    x1 = ops.scale(ctx, new_input(ctx, 24), 2.0)
    name_all(ctx)
    graph, galloc = allocate(x1, buft, planner)
    check_graph(graph, ctx, max_size=False)
    assert buft.allocated_total() == 24
    assert galloc.plan.chunk_sizes == [[24]]  # ggml 0.15.3: one 24-byte chunk


@pytest.mark.parametrize("planner", PLANNERS)
def test_not_enough_chunks(planner):
    buft, ctx = DummyBufferType(8), Context(no_alloc=True)
    x = [new_input(ctx, 8) for _ in range(17)]
    acc = x[0]
    for i in range(16):
        acc = ops.add(ctx, acc, x[i + 1])
    name_all(ctx)
    graph, galloc = allocate(acc, buft, planner)
    check_graph(graph, ctx, max_size=False)
    assert buft.allocated_total() > 16 * 8
    assert galloc.plan.chunk_sizes == [[8] * 15 + [16]] and buft.allocated_total() == 136  # as ggml 0.15.3


@pytest.mark.parametrize("planner", PLANNERS)
def test_fill_leftover_space(planner):
    buft, ctx = DummyBufferType(16), Context(no_alloc=True)
    x1 = ops.pad(ctx, new_input(ctx, 8), 2, 0, 0, 0)
    x3 = ops.mean(ctx, x1)
    name_all(ctx)
    graph, _ = allocate(x3, buft, planner)
    check_graph(graph, ctx)
    assert buft.allocated_total() <= 12 + 16


@pytest.mark.parametrize("planner", PLANNERS)
def test_view_inplace(planner):
    buft, ctx = DummyBufferType(32), Context(no_alloc=True)
    x0 = ctx.new_tensor_1d(GGMLType.F32, 4).set_input()
    x3 = ops.view_1d(ctx, ops.permute(ctx, ops.reshape_2d(ctx, x0, 2, 2), 1, 0, 2, 3), 2, 4)
    x4 = ctx.new_tensor_1d(GGMLType.F32, 2).set_input()
    x5 = ops.add(ctx, x3, x4)
    name_all(ctx)
    graph, _ = allocate(x5, buft, planner)
    check_graph(graph, ctx)
    assert buft.allocated_total() <= 24


@pytest.mark.parametrize("planner", PLANNERS)
def test_reuse_and_free(planner):
    buft, ctx = DummyBufferType(40), Context(no_alloc=True)
    x0, x1, x2 = new_input(ctx, 24), new_input(ctx, 8), new_input(ctx, 8)
    x3 = ops.add(ctx, x1, x2)
    x4 = ops.pad(ctx, x0, 2, 0, 0, 0)
    x5 = ops.scale(ctx, x4, 2.0)
    x6 = ops.add(ctx, x4, x5)
    x7 = ops.view_1d(ctx, x6, 2, 8)
    x8 = ops.add(ctx, x3, x7)
    name_all(ctx)
    graph, _ = allocate(x8, buft, planner)
    check_graph(graph, ctx)
    assert buft.allocated_total() <= 40 + 32 + 32


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("max_size", [32, SIZE_MAX])
def test_merge_free_block(planner, max_size):
    buft, ctx = DummyBufferType(max_size), Context(no_alloc=True)
    x0, x1, x2 = new_input(ctx, 16), new_input(ctx, 16), new_input(ctx, 16)
    x3, x4 = ops.mean(ctx, x0), ops.mean(ctx, x1)
    x5 = ops.pad(ctx, x2, 2, 0, 0, 0)
    x6 = ops.add(ctx, x3, x4)
    x7 = ops.pad(ctx, x6, 5, 0, 0, 0)
    x8 = ops.add(ctx, x5, x7)
    name_all(ctx)
    graph, _ = allocate(x8, buft, planner)
    check_graph(graph, ctx)
    assert buft.allocated_total() <= 32 + 32 + 24


@pytest.mark.parametrize("planner", PLANNERS)
def test_prefer_already_allocated_memory(planner):
    buft, ctx = DummyBufferType(32, alignment=4), Context(no_alloc=True)
    x0 = new_input(ctx, 24)
    x1 = ops.mean(ctx, x0)
    x2 = ops.mean(ctx, x1)
    name_all(ctx)
    graph, _ = allocate(x2, buft, planner)
    check_graph(graph, ctx, max_size=False)
    assert buft.allocated_total() <= 28
    assert x2.data == x0.data  # the freed 24-byte block is reused


@pytest.mark.parametrize("planner", PLANNERS)
def test_multiple_buffer_types(planner):
    buft_a, buft_b = DummyBufferType(32), DummyBufferType(SIZE_MAX)
    ctx_a, ctx_b, ctx = Context(no_alloc=True), Context(no_alloc=True), Context(no_alloc=True)
    a = [new_input(ctx_a, 16), new_input(ctx_a, 16)]
    name_all(ctx_a, "a")
    b = [new_input(ctx_b, 24), new_input(ctx_b, 4)]
    name_all(ctx_b, "b")
    x = [new_input(ctx, 16)]
    x.append(ops.mul(ctx, x[0], a[0]))
    x.append(ops.pad(ctx, x[1], 2, 0, 0, 0))
    x.append(ops.mul(ctx, x[2], b[0]))
    x.append(ops.mean(ctx, x[3]))
    x.append(ops.add(ctx, x[4], b[1]))
    x.append(ops.pad(ctx, x[5], 3, 0, 0, 0))
    x.append(ops.add(ctx, x[6], a[1]))
    x.append(ops.scale(ctx, x[7], 2.0))
    name_all(ctx, "x")
    alloc_ctx_tensors_from_buft(ctx_a, buft_a)
    alloc_ctx_tensors_from_buft(ctx_b, buft_b)
    x[8].set_output()
    graph = Graph().build_forward_expand(x[8])
    assert graph.n_leafs == 5 and graph.n_nodes == 8
    leaf_ids = [1 if t.name.startswith("b") else 0 for t in graph.leafs]
    node_ids = [1 if t.name in ("x3", "x4", "x5", "x6") else 0 for t in graph.nodes]
    galloc = GraphAllocator([buft_a, buft_b], planner=planner, debug=True)
    assert galloc.reserve_n(graph, node_ids, leaf_ids)
    assert galloc.alloc_graph(graph)
    check_graph(graph, ctx)
    assert buft_a.allocated_total() <= 32 + 32 + 24
    assert buft_b.allocated_total() <= 32 + 24


@pytest.mark.parametrize("planner", PLANNERS)
def test_buffer_size_zero(planner):
    buft_a, buft_b = DummyBufferType(SIZE_MAX), DummyBufferType(SIZE_MAX)
    ctx = Context(no_alloc=True)
    x1 = ops.scale(ctx, new_input(ctx, 16), 2.0).set_output()
    graph = Graph().build_forward_expand(x1)
    galloc = GraphAllocator([buft_a, buft_b], planner=planner)
    assert galloc.reserve_n(graph, [0], [0])
    assert galloc.alloc_graph(graph)
    check_all_allocated(graph)
    assert buft_a.allocated_total() == 16
    assert buft_b.allocated_total() == 0
    assert (galloc.get_buffer_size(0), galloc.get_buffer_size(1)) == (16, 0)


@pytest.mark.parametrize("planner", PLANNERS)
def test_reallocation(planner):
    buft = DummyBufferType(32, alignment=4)
    ctx = Context(no_alloc=True)
    x0, x1 = new_input(ctx, 24), new_input(ctx, 16)
    x3 = ops.add(ctx, ops.view_1d(ctx, x0, 4, 0), x1)
    name_all(ctx)
    graph, galloc = allocate(x3, buft, planner)
    check_all_allocated(graph)
    assert buft.allocated_total() == 40
    first_chunks = galloc.plan.chunk_sizes[0]

    ctx = Context(no_alloc=True)
    y2 = ops.add(ctx, new_input(ctx, 20), new_input(ctx, 20)).set_output()
    graph = Graph().build_forward_expand(y2)
    assert galloc.alloc_graph(graph)
    check_all_allocated(graph)
    assert buft.allocated_total() == 40
    # one chunk grew (16 -> 20) while the total stayed 40: every chunk was re-created with the new sizes
    assert first_chunks == [24, 16] and galloc.plan.chunk_sizes[0] == [20, 20]
    assert [b.size for b in buft.buffers if not b.is_freed] == [20, 20]
