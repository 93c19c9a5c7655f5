"""The real-model graphs of tests/data/graphs split across two backends give the single-backend results."""

import numpy as np
import pytest

import pyggml as gg
from pyggml import Op
from pyggml.alloc import GraphAllocator
from pyggml.backend import Status, tensor_get
from pyggml.sched import Scheduler

from tests.support.fake_gpu import FakeDevice
from tests.support.fixture_data import graph_path
from tests.support.graph_fixtures import load_weights, outputs, set_inputs

CASES = [("FAKE", "mlp_chain", False), ("FAKE", "mlp_chain", True), ("FAKE", "gpt2_small_decode", False),
         ("FAKE", "gpt2_small_decode", True), ("FAKE", "llama_like_block_stack", True),
         ("FAKE", "whisper_tiny_encoder_like", False), ("TORCH_CPU", "mlp_chain", True),
         ("TORCH_CPU", "gpt2_small_decode", False), ("TORCH_CPU", "gpt2_small_decode", True),
         ("TORCH_CPU", "whisper_tiny_encoder_like", True)]
FAKE_OPS = (Op.MUL_MAT, Op.ADD, Op.MUL, Op.CPY, Op.CONT, Op.SOFT_MAX, Op.NORM, Op.RMS_NORM, Op.GET_ROWS)


def nmse(a, b):
    return float(np.sum((a.astype(np.float64) - b) ** 2) / max(np.sum(np.asarray(b, np.float64) ** 2), 1e-30))


def single_backend(name, values):
    lg = gg.load_graph_json(graph_path(name))
    cpu = gg.backend.init_by_name("CPU")
    load_weights(lg, values, [cpu.default_buffer_type])
    galloc = GraphAllocator(cpu.default_buffer_type)
    assert galloc.alloc_graph(lg.graph)
    set_inputs(lg, values)
    assert cpu.graph_compute(lg.graph) == Status.SUCCESS
    return [tensor_get(t).copy() for t in outputs(lg)]


def second_backend(kind):
    """FAKE lacks UNARY, ROPE, IM2COL... (those run on the CPU); TORCH_CPU is a real second backend."""
    if kind == "FAKE":
        return FakeDevice(ops=FAKE_OPS).init_backend(), 1e-7
    pytest.importorskip("torch")
    import pyggml.backend.torch  # noqa: F401 - registers TORCH_CPU
    return gg.backend.init_by_name("TORCH_CPU"), 5e-4  # another BLAS: ggml's matmul tolerance


@pytest.mark.parametrize("kind, name, parallel", CASES)
def test_split_across_two_backends_matches_single_backend(kind, name, parallel):
    values = gg.load_graph_json(graph_path(name)).random_values(seed=1)
    reference = single_backend(name, values)

    lg = gg.load_graph_json(graph_path(name))
    fake, tol = second_backend(kind)
    cpu = gg.backend.init_by_name("CPU")
    load_weights(lg, values, [fake.default_buffer_type, cpu.default_buffer_type])
    sched = Scheduler([fake, cpu], graph_size=4096, parallel=parallel)
    for _ in range(2):  # repeated computes of the same graph
        sched.reset()
        assert sched.alloc_graph(lg.graph)
        set_inputs(lg, values)
        assert sched.graph_compute(lg.graph) == Status.SUCCESS
        got = [tensor_get(t) for t in outputs(lg)]
        for a, b in zip(got, reference, strict=True):
            assert nmse(a, b) <= tol
    assert sched.n_splits > 1 and sched.get_buffer_size(fake) > 0
