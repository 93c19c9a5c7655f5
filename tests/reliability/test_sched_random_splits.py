"""Random graphs split by the scheduler across the FAKE GPU (tests/sched/fake_gpu.py, with a random subset of
the graph's ops) and the CPU, with random user pins and pipeline parallelism on or off, give bit-identical
results to the CPU alone, over several computes of the same allocation."""

from __future__ import annotations


import numpy as np
import pytest
from hypothesis import assume, given, strategies as st

import pyggml as gg
from pyggml import Context, Op
from pyggml.backend import Status, tensor_get, tensor_set
from pyggml.errors import SchedulerError
from pyggml.sched import Scheduler

from tests.support.graph_strategies import build, fill, programs
from tests.support.guarded_compute import flat_bytes, reference

from tests.support.fake_gpu import FakeDevice  # noqa: E402 - the scheduler tests' fake accelerator


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


@given(program=programs, data=st.data(), parallel=st.booleans(), seed=st.integers(0, 2**31))
def test_random_splits_match_one_backend(cpu, program, data, parallel, seed):
    expected = reference(program, cpu, seed)
    prog = build(program, Context(no_alloc=True))
    graph = prog.graph()
    graph_ops = sorted({n.op for n in graph.nodes} - {Op.NONE}, key=int)
    fake_ops = data.draw(st.lists(st.sampled_from(graph_ops), unique=True)) if graph_ops else []
    fake = FakeDevice(ops=fake_ops).init_backend()
    sched = Scheduler([fake, cpu], parallel=parallel)
    for node in graph.nodes:  # a quarter of the nodes pinned to a backend that can run them
        if data.draw(st.integers(0, 3)) == 0:
            choices = [b for b in (fake, cpu) if b.supports_op(node)]
            sched.set_tensor_backend(node, data.draw(st.sampled_from(choices)))
    try:
        assert sched.alloc_graph(graph)
    except SchedulerError as e:  # an in-place op whose memory no backend able to run it can use: refused
        assert "writes into the memory of" in str(e)
        assume(False)
    for _ in range(2 if parallel else 1):
        fill(prog, seed, lambda t, v: tensor_set(t, v) if t.buffer is not None else None)
        assert sched.graph_compute(graph) == Status.SUCCESS
        assert [flat_bytes(tensor_get(t)) for t in prog.outputs] == expected
    sched.free()


def test_an_output_leaf_no_node_reads_goes_to_the_cpu(cpu):
    """Regression: a graph leaf that no node reads got backend id -1 and reserve_n raised BufferIdError
    ("leaf 0 has buffer id -1"; ggml asserts); it now lives on the CPU backend, the scheduler's last."""
    ctx = Context(no_alloc=True)
    leaf = ctx.new_tensor_1d(gg.GGMLType.F32, 3, "lonely").set_output()
    graph = gg.Graph().build_forward_expand(leaf)
    sched = Scheduler([FakeDevice().init_backend(), cpu])
    assert sched.alloc_graph(graph) and sched.get_tensor_backend(leaf) is cpu
    tensor_set(leaf, np.arange(3, dtype=np.float32))
    assert sched.graph_compute(graph) == Status.SUCCESS
    assert tensor_get(leaf).tolist() == [0, 1, 2]


def test_an_in_place_op_pinned_away_from_its_root(cpu):
    """x (input, CPU) += x pinned on the FAKE GPU, then x + (that view): ggml's FAKE split adds its copy of x (the
    old value) to the updated x, 3x instead of 4x; here the in-place op stays with x's memory."""
    program = ((1, 1, 1), [("inplace", "add_inplace", 0, 0), ("binary", "add", 0, 1)])
    prog = build(program, Context(no_alloc=True))
    graph = prog.graph()
    fake = FakeDevice(ops=[Op.ADD]).init_backend()
    sched = Scheduler([fake, cpu])
    sched.set_tensor_backend(graph.nodes[0], fake)
    assert sched.alloc_graph(graph)
    fill(prog, 0, lambda t, v: tensor_set(t, v) if t.buffer is not None else None)
    assert sched.graph_compute(graph) == Status.SUCCESS
    assert [flat_bytes(tensor_get(t)) for t in prog.outputs] == reference(program, cpu, 0)


def test_an_in_place_op_its_roots_backend_cannot_run(cpu):
    """cont(x) on the FAKE GPU (pinned), relu_inplace of it, which FAKE cannot run: no backend both runs the op
    and reaches its memory, so the scheduler refuses (the long profile found ggml's way gives -0.5, not -0.25)."""
    program = ((1, 1, 1), [("cont", 0, 0), ("inplace", "relu_inplace", 0, 1), ("view_1d", 0, 2),
                           ("binary", "add", 0, 3)])
    prog = build(program, Context(no_alloc=True))
    graph = prog.graph()
    sched = Scheduler([FakeDevice(ops=[Op.CONT]).init_backend(), cpu])
    sched.set_tensor_backend(graph.nodes[0], 0)
    with pytest.raises(SchedulerError, match="writes into the memory of .*no backend that can use that memory runs"):
        sched.alloc_graph(graph)
