"""Several backends: the layers are split by free memory and the scheduler gives the one-backend logits."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType

import pyggml as gg
from pyggml.models import load_model
from pyggml.models.llm.runner import Scheduled, SingleBackend, layer_counts

from tests.support.tiny_models import write_llama


class _Dev:
    def __init__(self, free):
        self.free = free

    def memory(self):
        return self.free, self.free


class _Backend:
    def __init__(self, free):
        self.device = _Dev(free)


def test_layer_counts_follow_free_memory():
    assert layer_counts(18, [_Backend(1), _Backend(1), _Backend(1)]) == [6, 6, 6]
    assert layer_counts(10, [_Backend(3), _Backend(1)]) == [8, 2]
    assert sum(layer_counts(7, [_Backend(5), _Backend(7), _Backend(11)])) == 7


def test_split_across_torch_cpu_and_cpu_matches_one_backend(tmp_path):
    pytest.importorskip("torch")
    import pyggml.backend.torch  # noqa: F401 - registers TORCH_CPU

    path = tmp_path / "tiny.gguf"
    write_llama(path, n_layer=4, qtype=GGMLQuantizationType.Q8_0)  # quantized: the CPU expands its layers to F32
    tokens = [1, 5, 9, 3, 7, 2]
    one = load_model(path, backend="CPU", n_ctx=32, n_batch=8, weights="f32")
    assert isinstance(one.runner, SingleBackend)
    expected = one.decode(tokens, all_logits=True)
    two = load_model(path, backend=[gg.backend.init_by_name("TORCH_CPU"), "CPU"], n_ctx=32, n_batch=8, weights="f32")
    assert isinstance(two.runner, Scheduled)
    assert [name for name, _ in two.runner.placement] == ["TORCH_CPU", "CPU"]
    assert sorted(il for _, layers in two.runner.placement for il in layers) == [0, 1, 2, 3]
    got = two.decode(tokens, all_logits=True)
    assert two.runner.sched.n_splits >= 2
    nmse = np.sum((got - expected) ** 2) / np.sum(expected ** 2)
    assert nmse < 5e-4
    assert int(np.argmax(got[-1])) == int(np.argmax(expected[-1]))
    assert two.decode([4]).shape == (one.n_vocab,)  # single-token steps after the prompt
    remote_layers = tuple(f"blk.{il}." for name, layers in two.runner.placement if name != "CPU" for il in layers)
    remote = [t for name, t in two.weights.tensors.items() if name.startswith(remote_layers)]
    assert remote and all(t.buffer.buft.name != "CPU_F32" for t in remote)
    assert two.weights.nbytes < one.weights.nbytes  # the local buffers hold only the local layers


def test_an_aborted_step_raises_and_the_next_step_is_right(tmp_path):
    """The CPU backend's abort callback stops a step: decode raises ComputeAborted instead of returning the
    logits of a half-computed graph, n_past stays, and decoding the same tokens again gives the right logits."""
    path = tmp_path / "tiny.gguf"
    write_llama(path, n_layer=2)
    model = load_model(path, backend="CPU", n_ctx=32, n_batch=8)
    expected = load_model(path, backend="CPU", n_ctx=32, n_batch=8).decode([1, 5, 9], all_logits=True)
    backend = model.backend
    gg.backend.cpu.set_abort_callback(backend, lambda: True)
    with pytest.raises(gg.errors.ComputeAborted, match="abort callback"):
        model.decode([1, 5, 9])
    assert model.n_past == 0
    gg.backend.cpu.set_abort_callback(backend, None)
    np.testing.assert_array_equal(model.decode([1, 5, 9], all_logits=True), expected)
