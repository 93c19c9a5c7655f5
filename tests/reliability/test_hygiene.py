"""Resource hygiene: thousands of reserve/alloc/compute/free cycles and model load/unload cycles leave no memory
growth (tracemalloc, and RSS from /proc/self/status), no open file descriptors and no threads behind."""

from __future__ import annotations

import gc
import os
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from pyggml import Context, GGMLType, Graph, ops
from pyggml.alloc import GraphAllocator
from pyggml.backend import Status, init_by_name, tensor_get, tensor_set
from pyggml.models import load_model

from tests.support.tiny_models import write_llama  # noqa: E402

LONG = bool(os.environ.get("PYGGML_LONG"))
ALLOC_CYCLES = 10_000 if LONG else 300
MODEL_CYCLES = 1_000 if LONG else 50
WARMUP = 20
TRACED_GROWTH_LIMIT = 256 << 10  # bytes of Python objects still alive after all cycles but not after warm-up
RSS_GROWTH_LIMIT = 48 << 20


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def soak(cycle, n: int) -> dict:
    """Run cycle(i) n times; the growth of traced memory, RSS, fds and threads from after WARMUP cycles to the end."""
    for i in range(WARMUP):
        cycle(i)
    gc.collect()
    tracemalloc.start()
    before = (tracemalloc.get_traced_memory()[0], rss(), open_fds(), threading.active_count())
    try:
        for i in range(WARMUP, n):
            cycle(i)
        gc.collect()
        after = (tracemalloc.get_traced_memory()[0], rss(), open_fds(), threading.active_count())
    finally:
        tracemalloc.stop()
    changes = (b - a for a, b in zip(before, after, strict=True))
    return dict(zip(("traced", "rss", "fds", "threads"), changes, strict=True))


def assert_clean(growth: dict) -> None:
    assert growth["traced"] < TRACED_GROWTH_LIMIT, growth
    assert growth["rss"] < RSS_GROWTH_LIMIT, growth
    assert growth["fds"] <= 0 and growth["threads"] <= 0, growth


def test_reserve_alloc_compute_free_cycles_leave_nothing_behind():
    backend = init_by_name("CPU")

    def cycle(i):
        n = 64 + i % 5 * 16  # sizes change, so buffers are re-planned and re-allocated
        ctx = Context(no_alloc=True)
        x = ctx.new_tensor_2d(GGMLType.F32, n, 4, "x").set_input()
        y = ops.soft_max(ctx, ops.scale(ctx, ops.relu(ctx, x), 0.5)).set_output()
        graph = Graph().build_forward_expand(y)
        galloc = GraphAllocator(backend.default_buffer_type, planner="ggml" if i % 2 else "best")
        assert galloc.reserve(graph) and galloc.alloc_graph(graph)
        tensor_set(x, np.ones((4, n), np.float32))
        assert backend.graph_compute(graph) == Status.SUCCESS
        assert np.allclose(tensor_get(y), 1 / n)
        galloc.free()

    assert_clean(soak(cycle, ALLOC_CYCLES))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_llama(tmp_path_factory.mktemp("hygiene") / "tiny.gguf", n_embd=32, n_ff=48, n_vocab=48, n_layer=1)


def test_model_load_unload_cycles_leave_nothing_behind(tiny_llama):
    first = []

    def cycle(i):
        model = load_model(tiny_llama, n_ctx=16, n_batch=4)
        logits = model.decode([1, 5, 7])
        if not first:
            first.append(logits)
        np.testing.assert_array_equal(logits, first[0])  # every load computes the same
        del model

    assert_clean(soak(cycle, MODEL_CYCLES))


def test_dequant_cache_forgets_freed_buffers():
    """Regression: the CPU backend's F32 copies of F16/quantized matrices were keyed by address only, so every
    unloaded model left its copies in the 2 GiB cache (about 2 KB per load of the tiny model, 2 GiB in a long
    run of real ones); an entry now goes with its buffer."""
    from pyggml.alloc import alloc_ctx_tensors
    from pyggml.backend.cpu.kernels._dequant_cache import DequantCache

    cache = DequantCache()
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor_2d(GGMLType.F16, 8, 8, "w")
    buffer = alloc_ctx_tensors(ctx, init_by_name("CPU"))
    tensor_set(w, np.ones((8, 8), np.float16))
    assert cache.get(w).sum() == 64 and cache.nbytes == 64 * (4 + 2)  # float32 copy + the F16 elements
    buffer.free()
    ctx2 = Context(no_alloc=True)
    other = ctx2.new_tensor_2d(GGMLType.F16, 4, 4, "other")
    alloc_ctx_tensors(ctx2, init_by_name("CPU"))
    tensor_set(other, np.ones((4, 4), np.float16))
    assert cache.get(other).sum() == 16 and cache.nbytes == 16 * (4 + 2)  # the freed buffer's copy is gone
