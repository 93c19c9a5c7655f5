"""The torch backend's asynchronous stream and events, on TORCH_CPU's worker thread (the paths CUDA takes too)."""

import gc
import threading

import numpy as np
import pytest

pytest.importorskip("torch.cuda")  # see test_torch_ops.py for why not "torch"

from pyggml import ops  # noqa: E402
from pyggml.backend import init_by_name, tensor_alloc, tensor_copy_async, tensor_get_async, tensor_set_async  # noqa: E402
from pyggml.backend.torch.stream import HostMarker, WorkerStream  # noqa: E402
from pyggml.core.context import Context  # noqa: E402
from pyggml.core.graph import Graph  # noqa: E402
from pyggml.core.types import GGMLType as G  # noqa: E402
from pyggml.errors import OutOfBoundsError  # noqa: E402


@pytest.fixture
def backend():
    b = init_by_name("TORCH_CPU")
    yield b
    b.free()


def small_graph(backend, n=64):
    """y = silu(x) * 2 + x, all in one buffer of the backend."""
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor(G.F32, (n,), "x")
    y = ops.add(ctx, ops.scale(ctx, ops.silu(ctx, x), 2.0), x)
    graph = Graph().build_forward_expand(y)
    buf = backend.alloc_buffer(16 * n * 4)
    for i, t in enumerate(graph.leafs + graph.nodes):
        tensor_alloc(buf, t, buf.base + i * 4 * n)
    return x, y, graph


def expected(x):
    return x / (1 + np.exp(-x)) * 2 + x


def gate(stream):
    """Hold the stream until the returned event is set (a long kernel, on demand; 5 s at most, so no test hangs)."""
    release = threading.Event()
    stream.submit(lambda: release.wait(5))
    return release


# ----- ordering ------------------------------------------------------------------------------------
def test_set_compute_get_then_synchronize_gives_the_right_data(backend):
    x, y, graph = small_graph(backend)
    values = np.linspace(-3, 3, 64, dtype=np.float32)
    release = gate(backend.stream)
    tensor_set_async(backend, x, values)
    backend.graph_compute_async(graph)
    out = tensor_get_async(backend, y, out=np.zeros(64, np.float32))
    assert not out.any()                                # nothing landed yet: the stream is held
    release.set()
    backend.synchronize()
    np.testing.assert_allclose(out, expected(values), rtol=1e-6)


def test_set_async_stages_the_data_so_the_caller_may_reuse_it(backend):
    x, y, graph = small_graph(backend)
    values = np.ones(64, np.float32)
    release = gate(backend.stream)
    tensor_set_async(backend, x, values)
    values[:] = 5                                       # overwritten before the copy ran
    release.set()
    out = tensor_get_async(backend, x)
    backend.synchronize()
    assert (out == 1).all()


def test_an_error_on_the_worker_surfaces_at_synchronize_and_skips_later_work(backend):
    ctx = Context(no_alloc=True)
    table = ctx.new_tensor(G.F32, (4, 3), "table")
    ids = ctx.new_tensor(G.I32, (2,), "ids")
    rows = ops.get_rows(ctx, table, ids)
    graph = Graph().build_forward_expand(rows)
    buf = backend.alloc_buffer(256)
    for i, t in enumerate((table, ids, rows)):
        tensor_alloc(buf, t, buf.base + 64 * i)
    tensor_set_async(backend, ids, np.array([0, 7], np.int32))   # row 7 of 3
    backend.graph_compute_async(graph)                           # queued: returns at once
    out = tensor_get_async(backend, rows, out=np.zeros((2, 4), np.float32))
    with pytest.raises(OutOfBoundsError, match="must lie in \\[0, 3\\), got \\[0, 7\\]"):
        backend.synchronize()
    assert not out.any()                                         # the read after the error was skipped
    tensor_set_async(backend, ids, np.array([2, 1], np.int32))
    tensor_set_async(backend, table, np.arange(12, dtype=np.float32))
    backend.graph_compute_async(graph)
    out = tensor_get_async(backend, rows)
    backend.synchronize()                                        # the error was reported once; the stream works
    np.testing.assert_array_equal(out, [[8, 9, 10, 11], [4, 5, 6, 7]])


def test_two_threads_each_with_its_own_backend():
    errors = []

    def worker(seed):
        try:
            b = init_by_name("TORCH_CPU")
            x, y, graph = small_graph(b)
            rng = np.random.default_rng(seed)
            for _ in range(100):
                values = rng.uniform(-4, 4, 64).astype(np.float32)
                tensor_set_async(b, x, values)
                b.graph_compute_async(graph)
                out = tensor_get_async(b, y)
                b.synchronize()
                np.testing.assert_allclose(out, expected(values), rtol=1e-5)
            b.free()
        except BaseException as e:  # reported on the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_free_ends_the_stream():
    b = init_by_name("TORCH_CPU")
    stream = b.stream
    assert stream.running
    b.free()
    assert not stream.running


# ----- events ----------------------------------------------------------------------------------------
def test_event_wait_orders_two_backends(backend):
    other = init_by_name("TORCH_CPU")
    x, y, graph = small_graph(backend)
    values = np.linspace(-1, 1, 64, dtype=np.float32)
    event = backend.device.event_new()
    release = gate(backend.stream)
    tensor_set_async(backend, x, values)
    backend.graph_compute_async(graph)
    backend.event_record(event)
    assert not event.marker.query()
    other.event_wait(event)                              # other's stream now waits for backend's
    out = tensor_get_async(other, y)
    reader = threading.Thread(target=other.synchronize)
    reader.start()
    reader.join(0.05)
    assert reader.is_alive()                             # still waiting for the event
    release.set()
    reader.join()
    event.synchronize()
    assert event.marker.query()
    np.testing.assert_allclose(out, expected(values), rtol=1e-6)
    event.free()
    other.free()


def test_a_fresh_event_is_already_reached(backend):
    event = backend.device.event_new()
    event.synchronize()
    backend.event_wait(event)
    backend.synchronize()


def test_cpy_tensor_async_waits_for_the_source_backend(backend):
    other = init_by_name("TORCH_CPU")
    x, y, graph = small_graph(backend)
    ctx = Context(no_alloc=True)
    dst = ctx.new_tensor(G.F32, (64,), "dst")
    tensor_alloc(buf := other.alloc_buffer(256), dst, buf.base)
    values = np.linspace(-2, 2, 64, dtype=np.float32)
    release = gate(backend.stream)
    tensor_set_async(backend, x, values)
    backend.graph_compute_async(graph)
    tensor_copy_async(backend, other, y, dst)            # queued on other, after backend's queued work
    out = tensor_get_async(other, dst)
    release.set()
    other.synchronize()
    np.testing.assert_allclose(out, expected(values), rtol=1e-6)
    other.free()


def test_markers_run_even_after_an_error():
    stream = WorkerStream("test")
    marker = HostMarker()

    def fail():
        raise ValueError("boom")

    stream.submit(fail)
    stream.record(marker)
    marker.synchronize()                                 # would hang if the error skipped the marker
    with pytest.raises(ValueError, match="boom"):
        stream.synchronize()
    stream.synchronize()                                 # reported once
    stream.close()


def test_a_backend_dropped_without_free_ends_its_stream():
    b = init_by_name("TORCH_CPU")
    stream = b.stream
    del b
    gc.collect()
    stream._thread.join(5)
    assert not stream.running


def test_a_wait_targets_the_record_made_before_it(backend):
    """record, wait, record again (the scheduler's per-copy events): the wait must not move to the second record,
    which sits behind it in the same queue (that would never finish)."""
    event = backend.device.event_new()
    release = gate(backend.stream)
    backend.event_record(event)
    backend.event_wait(event)
    backend.event_record(event)
    assert not event.marker.query()
    release.set()
    waiter = threading.Thread(target=backend.synchronize)
    waiter.start()
    waiter.join(5)
    assert not waiter.is_alive() and event.marker.query()
