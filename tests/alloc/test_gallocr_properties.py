"""Property tests: on random small graphs (element-wise ops, cont, views, reshapes, permutes, INPUT/OUTPUT
flags, several buffer types with small max_size and alignment), every plan verifies, "best" is never larger
than "ggml", and computing with the planned memory (poisoning every tensor as soon as it dies) gives
bit-identical outputs to computing with every tensor in memory of its own. A second graph with a mutated
edge on the same allocator is re-planned or reused exactly when that is safe."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyggml as gg
from pyggml import Context, Graph
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors, compute_poisoned
from pyggml.backend import tensor_get, tensor_set
from pyggml.backend.cpu.buffer import CpuBufferType
from tests.support.alloc_programs import SHAPE, build, programs


class SmallCpuBufferType(CpuBufferType):
    """Host memory with a small max_size and a chosen alignment, so that plans need several chunks."""

    def __init__(self, max_size: int, alignment: int):
        super().__init__()
        self.name = f"CPU_small_{max_size}_{alignment}"
        self.max_size, self.alignment = max_size, alignment


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


def reference(spec, cpu, data) -> list[bytes]:
    """Outputs with every tensor in memory of its own (an allocating context)."""
    ctx = Context(no_alloc=False)
    inputs, outputs, _ = build(spec, ctx)
    for t, values in zip(inputs, data, strict=True):
        t.numpy()[...] = values
    cpu.graph_compute(_graph(outputs))
    return [_flat_bytes(t.numpy()) for t in outputs]


def _flat_bytes(values: np.ndarray) -> bytes:
    """The values in logical (C) order, as bytes: NaN payloads and signed zeros compare exactly."""
    return np.ascontiguousarray(values).reshape(-1).tobytes()


def _graph(outputs) -> Graph:
    graph = Graph()
    for t in outputs:
        graph.build_forward_expand(t)
    return graph


def planned(spec, cpu, data, galloc, ids=None) -> list[bytes] | None:
    """Outputs computed in the allocator's memory, each tensor poisoned when its lifetime ends; the weights
    live in a buffer of their own, allocated first, which the graph allocator must leave alone."""
    weights = Context(no_alloc=True)
    inputs, outputs, _ = build(spec, Context(no_alloc=True), weights)
    alloc_ctx_tensors(weights, cpu)
    graph = _graph(outputs)
    if ids is not None:
        node_ids, leaf_ids = ids(graph)
        assert galloc.reserve_n(graph, node_ids, leaf_ids)
    if not galloc.alloc_graph(graph):
        return None
    for t, values in zip(inputs, data, strict=True):
        if t.buffer is not None:  # inputs that no output depends on are not in the graph
            tensor_set(t, values)
    compute_poisoned(cpu, galloc, graph)
    return [_flat_bytes(tensor_get(t)) for t in outputs]


def input_data(spec, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n_inputs = sum(step[0] in ("input", "const", "weight") for step in spec)
    return [rng.integers(-8, 8, SHAPE[::-1]).astype(np.float32) for _ in range(n_inputs)]


bufts = st.lists(st.tuples(st.sampled_from([48, 64, 100, 2**64 - 1]), st.sampled_from([4, 8, 32, 64])),
                 min_size=1, max_size=3)


@given(spec=programs(), buft_specs=bufts, data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_planned_memory_computes_bit_identically(cpu, spec, buft_specs, data, seed):
    types = [SmallCpuBufferType(m, a) for m, a in buft_specs]
    if len(types) > 1 and data.draw(st.booleans()):
        types.append(types[0])  # the same buffer type twice shares one allocator and one buffer
    values = input_data(spec, seed)
    expected = reference(spec, cpu, values)

    drawn = []

    def ids(graph):  # drawn once: both planners see the same buffer ids
        if not drawn:
            pick = st.integers(0, len(types) - 1)
            drawn.extend(([data.draw(pick) for _ in graph.nodes], [data.draw(pick) for _ in graph.leafs]))
        return drawn

    sizes = {}
    for planner in ("ggml", "best"):
        galloc = GraphAllocator(types, planner=planner, debug=True)  # debug: every plan is verified
        assert planned(spec, cpu, values, galloc, ids) == expected
        sizes[planner] = galloc.plan.size
        assert galloc.plan.size <= galloc.plan.ggml_size
    assert sizes["best"] <= sizes["ggml"]


def _mutated(spec, data) -> list[tuple]:
    """The spec with one binary op reading another operand of the same shape (same counts, other edges)."""
    binaries = [k for k, step in enumerate(spec) if step[0] == "binary"]
    if not binaries:
        return spec
    k = data.draw(st.sampled_from(binaries))
    values = build(spec[:k], Context(no_alloc=True))[2]
    a = values[spec[k][2]]
    partners = [j for j, b in enumerate(values) if b.ne == a.ne]
    return spec[:k] + [spec[k][:3] + (data.draw(st.sampled_from(partners)),)] + spec[k + 1:]


@given(spec=programs(), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_reusing_an_allocator_for_another_graph_is_safe(cpu, spec, data, seed):
    other = _mutated(spec, data)
    values = input_data(spec, seed)
    galloc = GraphAllocator(cpu.default_buffer_type, debug=True)
    assert planned(spec, cpu, values, galloc) == reference(spec, cpu, values)
    assert planned(other, cpu, values, galloc) == reference(other, cpu, values)
