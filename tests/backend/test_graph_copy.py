"""graph_copy and compare_graph_backend on a small graph with a view, across CPU and a non-host backend."""

import numpy as np
import pytest
from tests.support.minimal_backend import MinimalBufferType, minimal_device

from pyggml.alloc import alloc_ctx_tensors
from pyggml.backend import cpu
from pyggml.backend.graph_copy import compare_graph_backend, graph_copy
from pyggml.backend.multi_buffer import is_multi_buffer
from pyggml.backend.tensor_io import tensor_get, tensor_set
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import VIEW_OPS
from pyggml.errors import GraphError


def build(backend):
    """t = transpose(reshape(a + b, 4x2)); y = cont(t) * 3 (a scale); a = 0..7, b = 1."""
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor("f32", (8,), "a").set_input()
    b = ctx.new_tensor("f32", (8,), "b").set_input()
    s = ops.add(ctx, a, b)
    t = ops.transpose(ctx, ops.reshape_2d(ctx, s, 4, 2))
    y = ops.scale(ctx, ops.cont(ctx, t), 3.0)
    g = Graph().build_forward_expand(y)
    if backend is not None:
        alloc_ctx_tensors(ctx, backend)
        tensor_set(a, np.arange(8, dtype=np.float32))
        tensor_set(b, np.ones(8, np.float32))
    return g


def test_copy_has_the_same_nodes_layouts_and_data():
    b1, b2 = cpu.init(), cpu.init()
    g = build(b1)
    b1.graph_compute(g)
    copy = graph_copy(b2, g)
    assert copy.graph.n_nodes == g.n_nodes and copy.graph.n_leafs == 0
    for n1, n2 in zip(g.nodes, copy.graph.nodes, strict=True):
        assert n2 is not n1 and n2.name == n1.name and n2.op == n1.op and n2.same_layout(n1)
        assert n2.op_params == n1.op_params and n2.flags == n1.flags
        assert n2.buffer is copy.buffer and n2.buffer is not n1.buffer
        np.testing.assert_array_equal(tensor_get(n2), tensor_get(n1))
    views = [n for n in copy.graph.nodes if n.view_src is not None]
    assert views and all(v.view_src.buffer is copy.buffer for v in views)
    assert all(v in copy.ctx_unallocated.tensors for v in views)
    assert not any(t.view_src is not None for t in copy.ctx_allocated)
    a2 = copy.graph.nodes[0].src[0]
    assert a2.name == "a" and tensor_get(a2).tolist() == list(range(8))
    copy.free()
    assert copy.buffer.is_freed


def test_copy_to_a_non_host_backend():
    g = build(cpu.init())
    remote = minimal_device().init_backend()
    copy = graph_copy(remote, g)
    a2 = copy.graph.nodes[0].src[0]
    assert copy.buffer.buft is remote.default_buffer_type
    assert bytes(copy.buffer.mem[a2.data - copy.buffer.base:][:32]) == np.arange(8, dtype=np.float32).tobytes()
    assert all((t.data - copy.buffer.base) % 16 == 0 for t in copy.ctx_allocated)


def test_an_unallocated_graph_is_refused_and_nothing_is_allocated():
    remote = minimal_device().init_backend()
    with pytest.raises(GraphError, match="graph must be allocated: tensor 'node_0' has no data"):
        graph_copy(remote, build(None))
    assert remote.default_buffer_type.allocated == []


def test_compare_node_by_node():
    b1, b2 = cpu.init(), cpu.init()
    g = build(b1)
    seen = []

    def callback(i, t1, t2):
        seen.append((i, t1.op))
        np.testing.assert_array_equal(tensor_get(t1), tensor_get(t2))
        return True

    assert compare_graph_backend(b1, b2, g, callback)
    assert [i for i, _ in seen] == [i for i, n in enumerate(g.nodes) if n.op not in VIEW_OPS]
    np.testing.assert_array_equal(tensor_get(g.nodes[-1]), (np.arange(8) + 1).reshape(2, 4).T * 3)


def test_compare_stops_when_the_callback_says_so():
    b1, b2 = cpu.init(), cpu.init()
    g = build(b1)
    seen = []
    assert compare_graph_backend(b1, b2, g, lambda i, t1, t2: seen.append(i) or False)
    assert seen == [0]


def test_compare_on_test_nodes_runs_whole_graphs():
    b1, b2 = cpu.init(), cpu.init()
    g = build(b1)
    y = g.nodes[-1]
    seen = []
    assert compare_graph_backend(b1, b2, g, lambda i, t1, t2: seen.append((i, tensor_get(t2).copy())), [y])
    assert len(seen) == 1 and seen[0][0] == g.n_nodes - 1
    np.testing.assert_array_equal(seen[0][1], tensor_get(y))
    stranger = Context(no_alloc=True).new_tensor("f32", (1,), "stranger")
    with pytest.raises(GraphError, match="none of the 1 test nodes"):
        compare_graph_backend(b1, b2, g, lambda *a: True, [stranger])


def test_compare_is_false_when_the_copy_cannot_be_allocated():
    class Full(MinimalBufferType):
        def _alloc_buffer(self, size):
            raise MemoryError("device full")

    dev = minimal_device()
    dev.buft = Full(dev)
    assert compare_graph_backend(cpu.init(), dev.init_backend(), build(cpu.init()), lambda *a: True) is False


def test_copy_splits_by_max_size_into_a_multi_buffer():
    class Small(MinimalBufferType):
        max_size = 40

    dev = minimal_device()
    dev.buft = Small(dev)
    g = build(cpu.init())  # a, b, s (32 bytes each), then the 32-byte cont and scale results
    copy = graph_copy(dev.init_backend(), g)
    assert is_multi_buffer(copy.buffer)
    assert [b.size for b in copy.buffer.buffers] == [32] * len(copy.ctx_allocated.tensors)
    owners = {id(t.buffer) for t in copy.ctx_allocated}
    assert owners == {id(b) for b in copy.buffer.buffers}
    for n1, n2 in zip(g.nodes, copy.graph.nodes, strict=True):
        assert tensor_get(n2).tobytes() == tensor_get(n1).tobytes()
    copy.free()
    assert all(b.is_freed for b in copy.buffer.buffers)
