"""Computing a random program two ways: every tensor in memory of its own (the reference), and in a graph
allocator's planned memory with NaN poisoning of dead tensors and guard bytes after every tensor."""

from __future__ import annotations

import numpy as np

from pyggml import Context
from pyggml.alloc import compute_poisoned
from pyggml.backend import tensor_get, tensor_set
from pyggml.backend.cpu.buffer import CpuBufferType

from tests.support.graph_strategies import build, fill

GUARD = 24  # slack bytes after every tensor, big enough to catch a row written one step too far
GUARD_BYTE = 0xA5


class GuardedBufferType(CpuBufferType):
    """Host memory whose tensors get GUARD bytes of slack: a write past a tensor's end lands in it."""

    def __init__(self, alignment: int, max_size: int):
        super().__init__()
        self.name = f"CPU_guarded_{alignment}_{max_size}"
        self.alignment, self.max_size = alignment, max_size

    def _alloc_size(self, t) -> int:
        return t.nbytes + GUARD


def flat_bytes(values: np.ndarray) -> bytes:
    return np.ascontiguousarray(values).reshape(-1).tobytes()


def reference(program, cpu, seed, builder=build) -> list[bytes]:
    prog = builder(program, Context(no_alloc=False))
    fill(prog, seed, lambda t, v: t.numpy().__setitem__(..., v))
    cpu.graph_compute(prog.graph())
    return [flat_bytes(t.numpy()) for t in prog.outputs]


def _roots(graph):
    seen = {}
    for t in graph.leafs + graph.nodes + [s for n in graph.nodes for s in n.srcs]:
        if t.view_src is None and t.buffer is not None:
            seen[id(t)] = t
    return seen.values()


def guard_untouched(graph) -> list[str]:
    """Every byte of every buffer the graph uses that lies outside all tensors' data must still be GUARD_BYTE."""
    covered: dict[int, tuple] = {}
    for t in _roots(graph):
        buf = t.buffer
        mask = covered.setdefault(id(buf), (buf, np.zeros(buf.size, bool)))[1]
        start = t.data - buf.base
        mask[start:start + t.nbytes] = True
    bad = []
    for buf, mask in covered.values():
        changed = np.flatnonzero((buf.host_array != GUARD_BYTE) & ~mask)
        if changed.size:
            bad.append(f"{buf.name}: {changed.size} bytes outside tensors changed, first at {changed[0]}")
    return bad


def planned(program, cpu, seed, galloc, ids=None, builder=build):
    """Outputs computed in the allocator's memory with poisoning, and the guard-byte report."""
    prog = builder(program, Context(no_alloc=True))
    graph = prog.graph()
    if ids is not None:  # (node buffer ids, leaf buffer ids)
        assert galloc.reserve_n(graph, *ids)
    assert galloc.alloc_graph(graph)
    galloc.plan.verify()
    for buf in {id(t.buffer): t.buffer for t in _roots(graph)}.values():
        buf.clear(GUARD_BYTE)
    fill(prog, seed, lambda t, v: tensor_set(t, v) if t.buffer is not None else None)
    compute_poisoned(cpu, galloc, graph)
    return [flat_bytes(tensor_get(t)) for t in prog.outputs], guard_untouched(graph)
