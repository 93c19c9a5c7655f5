"""Threads: the guarantees of docs/thread-safety.md, each exercised for ITERATIONS rounds per thread (hundreds in
CI, thousands with PYGGML_LONG=1): no lost update, no wrong result, no deadlock (every wait has a timeout)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pyggml import Context, GGMLType, Graph, ops
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors, alloc_ctx_tensors_from_buft
from pyggml.backend import (Status, init_by_name, registry, tensor_copy_async, tensor_get, tensor_get_async,
                            tensor_set, tensor_set_async)
from pyggml.sched import Scheduler

from tests.support.fake_gpu import FakeDevice  # noqa: E402

LONG = bool(os.environ.get("PYGGML_LONG"))
ITERATIONS = 3000 if LONG else 150
THREADS = 4
TIMEOUT_S = 600 if LONG else 120


def run_threads(work, n=THREADS):
    """Run work(i) on n threads at once; any exception or a thread still running after TIMEOUT_S fails the test."""
    start = threading.Barrier(n, timeout=TIMEOUT_S)

    def body(i):
        start.wait()
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return [f.result(timeout=TIMEOUT_S) for f in [pool.submit(body, i) for i in range(n)]]


def mlp(ctx, n=32):
    """x -> silu(w x) + x: a little of everything a real compute does (mul_mat, unary, add)."""
    x = ctx.new_tensor_1d(GGMLType.F32, n, "x").set_input()
    w = ctx.new_tensor_2d(GGMLType.F32, n, n, "w")
    y = ops.add(ctx, ops.silu(ctx, ops.mul_mat(ctx, w, x)), x).set_output()
    return x, w, y


def expected(x, w):
    h = w @ x
    return h / (1 + np.exp(-h)) + x


def check(got, x, w):
    np.testing.assert_allclose(got, expected(x, w), rtol=1e-5, atol=1e-5)


def test_one_cpu_backend_per_thread_computes_repeatedly():
    def work(k):
        backend, ctx = init_by_name("CPU"), Context(no_alloc=True)
        x, w, y = mlp(ctx)
        weights = np.random.default_rng(k).standard_normal((32, 32)).astype(np.float32) / 8
        graph = Graph().build_forward_expand(y)
        galloc = GraphAllocator(backend.default_buffer_type)  # w is a leaf of the compute buffer: never freed
        assert galloc.alloc_graph(graph)
        tensor_set(w, weights)
        for i in range(ITERATIONS):
            values = np.full(32, (k * ITERATIONS + i) % 97 / 50 - 1, np.float32)
            tensor_set(x, values)
            assert backend.graph_compute(graph) == Status.SUCCESS
            check(tensor_get(y), values, weights)
        return ITERATIONS

    assert sum(run_threads(work)) == THREADS * ITERATIONS


def test_cpu_backends_share_the_dequant_cache_safely():
    """F16 weights go through the CPU kernels' process-wide cache of F32 copies; threads with their own weights
    (some freed and re-created each round, so entries are added, hit and dropped concurrently) all compute right."""
    def work(k):
        backend = init_by_name("CPU")
        weights = (np.random.default_rng(k).standard_normal((32, 32)) / 8).astype(np.float16)
        for i in range(ITERATIONS // 2):
            ctx = Context(no_alloc=True)
            x = ctx.new_tensor_1d(GGMLType.F32, 32, "x")
            w = ctx.new_tensor_2d(GGMLType.F16, 32, 32, "w")
            y = ops.mul_mat(ctx, w, x)
            buffer = alloc_ctx_tensors(ctx, backend)
            tensor_set(w, weights)
            values = np.full(32, i % 5 - 2, np.float32)
            tensor_set(x, values)
            assert backend.graph_compute(Graph().build_forward_expand(y)) == Status.SUCCESS
            np.testing.assert_allclose(tensor_get(y), weights.astype(np.float32) @ values, rtol=1e-5, atol=1e-5)
            buffer.free()

    run_threads(work)


def test_one_shared_cpu_backend_serializes_computes_of_separate_graphs():
    backend = init_by_name("CPU")

    def work(k):
        ctx = Context(no_alloc=True)
        x, w, y = mlp(ctx)
        alloc_ctx_tensors(ctx, backend)
        weights = np.eye(32, dtype=np.float32) * (k + 1)
        tensor_set(w, weights)
        graph = Graph().build_forward_expand(y)
        for i in range(ITERATIONS):
            values = np.linspace(-1, 1, 32, dtype=np.float32) * (i % 7)
            tensor_set(x, values)
            assert backend.graph_compute(graph) == Status.SUCCESS
            check(tensor_get(y), values, weights)

    run_threads(work)


def test_concurrent_tensor_set_on_disjoint_tensors_of_one_buffer_loses_nothing():
    ctx = Context(no_alloc=True)
    tensors = [ctx.new_tensor_1d(GGMLType.F32, 257, f"t{i}") for i in range(THREADS * 2)]
    alloc_ctx_tensors(ctx, init_by_name("CPU"))

    def work(k):
        mine = tensors[2 * k:2 * k + 2]
        for i in range(ITERATIONS):
            for j, t in enumerate(mine):
                tensor_set(t, np.full(257, k * 1e6 + i * 10 + j, np.float32))
            for j, t in enumerate(mine):
                assert (tensor_get(t) == np.float32(k * 1e6 + i * 10 + j)).all()

    run_threads(work)
    for k in range(THREADS):
        for j in range(2):
            assert (tensor_get(tensors[2 * k + j]) == np.float32(k * 1e6 + (ITERATIONS - 1) * 10 + j)).all()


def test_one_scheduler_per_thread_with_the_fake_gpu():
    def work(k):
        fake, cpu = FakeDevice().init_backend(), init_by_name("CPU")
        wctx = Context(no_alloc=True)
        w = wctx.new_tensor_2d(GGMLType.F32, 32, 32, "w")
        alloc_ctx_tensors_from_buft(wctx, fake.default_buffer_type)
        weights = np.random.default_rng(k).standard_normal((32, 32)).astype(np.float32) / 8
        tensor_set(w, weights)
        sched = Scheduler([fake, cpu], parallel=bool(k % 2))
        for i in range(ITERATIONS // 3):  # a new graph each round, as a decode loop builds one per token
            ctx = Context(no_alloc=True)
            x = ctx.new_tensor_1d(GGMLType.F32, 32, "x").set_input()
            y = ops.add(ctx, ops.silu(ctx, ops.mul_mat(ctx, w, x)), x).set_output()
            graph = Graph().build_forward_expand(y)
            sched.reset()
            assert sched.alloc_graph(graph)
            values = np.full(32, i % 11 / 5 - 1, np.float32)
            tensor_set(x, values)
            assert sched.graph_compute(graph) == Status.SUCCESS
            check(tensor_get(y), values, weights)
        sched.free()

    run_threads(work)


def test_registry_lookups_and_backend_creation_from_many_threads():
    names = [d.name for d in registry.devices()]

    def work(k):
        for _ in range(ITERATIONS):
            assert registry.device_by_name("cpu").name == "CPU"
            assert [d.name for d in registry.devices()] == names
            init_by_name("CPU").free()

    run_threads(work)


# ----- the torch backend's asynchronous worker-thread stream (TORCH_CPU) ----------------------------

@pytest.fixture
def torch_cpu():
    pytest.importorskip("torch.cuda")  # as the torch backend's own tests do
    import pyggml.backend.torch  # noqa: F401 - registers TORCH_CPU
    return lambda: init_by_name("TORCH_CPU")


def test_torch_async_set_compute_get_per_thread(torch_cpu):
    def work(k):
        backend = torch_cpu()
        ctx = Context(no_alloc=True)
        x, w, y = mlp(ctx)
        alloc_ctx_tensors_from_buft(ctx, backend.default_buffer_type)
        weights = np.random.default_rng(k).standard_normal((32, 32)).astype(np.float32) / 8
        tensor_set(w, weights)
        graph = Graph().build_forward_expand(y)
        for i in range(ITERATIONS):
            values = np.full(32, i % 13 / 6 - 1, np.float32)
            tensor_set_async(backend, x, values)
            backend.graph_compute_async(graph)
            out = tensor_get_async(backend, y, out=np.zeros(32, np.float32))
            backend.synchronize()
            check(out, values, weights)
        backend.free()

    run_threads(work)


def test_torch_events_order_a_producer_and_a_consumer_stream(torch_cpu):
    """Producer computes y = f(x) and records an event; the consumer's stream waits for it, copies y and
    computes z = f(y): every round's z matches, although the host never waits between the two streams."""
    producer, consumer = torch_cpu(), torch_cpu()
    pctx, cctx = Context(no_alloc=True), Context(no_alloc=True)
    x, w1, y = mlp(pctx)
    y_in, w2, z = mlp(cctx)
    alloc_ctx_tensors_from_buft(pctx, producer.default_buffer_type)
    alloc_ctx_tensors_from_buft(cctx, consumer.default_buffer_type)
    weights = np.eye(32, dtype=np.float32) / 2
    tensor_set(w1, weights)
    tensor_set(w2, weights)
    g1, g2 = Graph().build_forward_expand(y), Graph().build_forward_expand(z)
    event = producer.device.event_new()
    for i in range(ITERATIONS):
        values = np.full(32, i % 9 / 4 - 1, np.float32)
        tensor_set_async(producer, x, values)
        producer.graph_compute_async(g1)
        producer.event_record(event)
        consumer.event_wait(event)
        tensor_copy_async(producer, consumer, y, y_in)
        consumer.graph_compute_async(g2)
        out = tensor_get_async(consumer, z, out=np.zeros(32, np.float32))
        consumer.synchronize()
        check(out, expected(values, weights), weights)
    event.synchronize()
    event.free()
    producer.free()
    consumer.free()
