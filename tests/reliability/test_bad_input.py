"""Bad API input, one row per case of docs/errors.md: each raises its specific exception, with a message that
names what was wrong, and leaves every buffer's bytes, the allocator's plan, the tensors' bindings and the
registry as they were."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import pyggml as gg
from pyggml import Context, GGMLType, Graph, ops
from pyggml import errors as E
from pyggml.alloc import GraphAllocator, alloc_ctx_tensors
from pyggml.backend import registry, tensor_alloc, tensor_get, tensor_set
from pyggml.backend.cpu.backend import set_n_threads
from pyggml.sched import Scheduler

from tests.support.fake_gpu import FakeDevice  # noqa: E402


@pytest.fixture
def w():
    """A world to damage: weights x, y with data in a CPU buffer, a planned and allocated graph, a scheduler."""
    cpu = gg.backend.init_by_name("CPU")
    wctx = Context(no_alloc=True)
    x, y = wctx.new_tensor_2d(GGMLType.F32, 4, 3, "x"), wctx.new_tensor_2d(GGMLType.F32, 3, 3, "y")
    idx = wctx.new_tensor_1d(GGMLType.I32, 4, "idx")
    weights = alloc_ctx_tensors(wctx, cpu)
    for t in (x, y, idx):
        tensor_set(t, np.arange(t.nelements, dtype=np.float32 if t.type == GGMLType.F32 else np.int32)
                   .reshape(tuple(reversed(t.ne[:t.n_dims]))))
    gctx = Context(no_alloc=True)
    inp = gctx.new_tensor_2d(GGMLType.F32, 4, 3, "inp").set_input()
    out = ops.relu(gctx, ops.add(gctx, inp, x)).set_output()
    graph = Graph().build_forward_expand(out)
    galloc = GraphAllocator(cpu.default_buffer_type)
    assert galloc.alloc_graph(graph)
    freed = cpu.default_buffer_type.alloc_buffer(64)
    freed.free()
    fake = FakeDevice().init_backend()
    return SimpleNamespace(cpu=cpu, fake=fake, ctx=Context(no_alloc=True), x=x, y=y, idx=idx, weights=weights,
                           inp=inp, out=out, graph=graph, galloc=galloc, freed=freed,
                           sched=Scheduler([fake, cpu], graph_size=4))


def snapshot(w) -> tuple:
    buffers = [w.weights, w.inp.buffer]
    return ([bytes(b.host_array) for b in buffers], w.galloc.plan, w.galloc.plan.to_json(),
            w.galloc.get_buffer_size(0), [(t.buffer, t.data) for t in (w.x, w.y, w.idx, w.inp, w.out)],
            [d.name for d in registry.devices()], [b.name for b in registry.backends()], w.sched.is_alloc)


def _unallocated_graph(w):
    t = w.ctx.new_tensor_1d(GGMLType.F32, 4, "nowhere")
    return Graph().build_forward_expand(ops.relu(w.ctx, t))


def _unsupported_graph(w):
    """SQRT of I32: the CPU backend has no kernel for it (ggml's CPU kernels assert F32)."""
    return Graph().build_forward_expand(ops.sqrt(w.ctx, w.idx))


def _freed_graph(w):
    t = w.ctx.new_tensor_1d(GGMLType.F32, 4, "in_freed")
    t.buffer, t.data = w.freed, 1 << 20  # bound to a buffer that was freed since
    return Graph().build_forward_expand(ops.relu(w.ctx, t))


def _overflow(w):
    g = Graph(size=2)
    g.build_forward_expand(ops.relu(w.ctx, ops.relu(w.ctx, ops.relu(w.ctx, w.x))))


def _big_graph(w):
    t = w.x
    for _ in range(9):  # 9 nodes and a leaf: more than twice graph_size 4
        t = ops.relu(w.ctx, t)
    return Graph().build_forward_expand(t)


ROWS = [  # (id, call, exception, message fragment): the same rows as docs/errors.md
    ("add_shapes", lambda w: ops.add(w.ctx, w.x, w.y), E.ShapeError, "every dim of b must divide"),
    ("mul_mat_shapes", lambda w: ops.mul_mat(w.ctx, w.x, w.y), E.ShapeError, "a.ne[0]=4 != b.ne[0]=3"),
    ("get_rows_ids_shape", lambda w: ops.get_rows(w.ctx, w.x, w.y), E.ShapeError, "ids must be shaped"),
    ("rope_positions_type", lambda w: ops.rope(w.ctx, ops.reshape_3d(w.ctx, w.x, 4, 1, 3),
                                               w.ctx.new_tensor_1d(GGMLType.F32, 3), 4, 0),
     E.GGMLTypeError, "positions must be"),
    ("concat_shapes", lambda w: ops.concat(w.ctx, w.x, w.y, 1), E.ShapeError, "must agree on every dim but 1"),
    ("glu_split_shapes", lambda w: ops.swiglu_split(w.ctx, w.x, w.y), E.ShapeError, "same shape"),
    ("soft_max_mask", lambda w: ops.soft_max_ext(w.ctx, w.x, w.y, 1.0, 0.0), E.ShapeError, "mask.ne[0]=3"),
    ("norm_type", lambda w: w.cpu.graph_compute(Graph().build_forward_expand(ops.rms_norm(w.ctx, w.idx, 1e-5))),
     E.UnsupportedOpError, "no kernel for RMS_NORM -> I32"),
    ("unary_strided_rows", lambda w: ops.relu(w.ctx, ops.transpose(w.ctx, w.x)), E.ShapeError, "contiguous"),
    ("reduce_type", lambda w: ops.cumsum(w.ctx, w.idx), E.GGMLTypeError, "cumsum: a must be F32"),
    ("reduce_shape", lambda w: ops.argmax(w.ctx, ops.reshape_3d(w.ctx, w.x, 2, 2, 3)), E.ShapeError,
     "argmax: a must be a matrix"),
    ("reshape_count", lambda w: ops.reshape_2d(w.ctx, w.x, 5, 2), E.ShapeError, "12 elements"),
    ("view_past_end", lambda w: ops.view_1d(w.ctx, w.x, 12, 4), E.ShapeError, "exceeds the 48 bytes"),
    ("cpy_count", lambda w: ops.cpy(w.ctx, w.x, w.y), E.ShapeError, "same number of elements"),
    ("permute_axes", lambda w: ops.permute(w.ctx, w.x, 0, 0, 1, 2), E.ShapeError, "permutation"),
    ("unknown_type", lambda w: w.ctx.new_tensor(99, [3]), E.UnsupportedTypeError, "unknown ggml type 99"),
    ("negative_ne", lambda w: w.ctx.new_tensor(GGMLType.F32, [-3]), E.ShapeError, "non-negative"),
    ("set_past_end", lambda w: tensor_set(w.x, np.zeros(12, np.float32), offset=8), E.OutOfBoundsError,
     "at offset 8 is out of bounds of tensor 'x'"),
    ("set_wrong_size", lambda w: tensor_set(w.x, np.zeros(13, np.float32)), E.OutOfBoundsError, "has 48"),
    ("set_wrong_dtype", lambda w: tensor_set(w.x, np.zeros(12, np.float64)), E.GGMLTypeError, "float64"),
    ("get_unallocated", lambda w: tensor_get(w.ctx.new_tensor_1d(GGMLType.F32, 2, "u")), E.NotAllocatedError,
     "'u' has no buffer"),
    ("alloc_twice", lambda w: tensor_alloc(w.weights, w.x, w.weights.base), E.AllocationError,
     "'x' is already allocated"),
    ("alloc_outside", lambda w: tensor_alloc(w.weights, w.ctx.new_tensor_1d(GGMLType.F32, 64, "z"),
                                             w.weights.base + 16), E.OutOfBoundsError, "does not fit buffer"),
    ("alloc_negative_size", lambda w: w.cpu.default_buffer_type.alloc_buffer(-1), E.AllocationError, "-1 bytes"),
    ("graph_overflow", _overflow, E.GraphSizeError, "graph is full"),
    ("compute_unallocated", lambda w: w.cpu.graph_compute(_unallocated_graph(w)), E.NotAllocatedError,
     "'nowhere' has no memory"),
    ("compute_unsupported_op", lambda w: w.cpu.graph_compute(_unsupported_graph(w)), E.UnsupportedOpError,
     "no kernel for SQRT"),
    ("compute_in_freed_buffer", lambda w: w.cpu.graph_compute(_freed_graph(w)), E.BufferFreedError,
     "'in_freed'"),
    ("buffer_double_free", lambda w: w.freed.free(), E.BufferFreedError, "used after free()"),
    ("buffer_use_after_free", lambda w: w.freed.clear(0), E.BufferFreedError, "used after free()"),
    ("backend_use_after_free", lambda w: (w.fake.free(), w.fake.graph_compute(w.graph)), E.BackendError,
     "used after free()"),
    ("unknown_planner", lambda w: GraphAllocator(w.cpu.default_buffer_type, planner="magic"), E.AllocationError,
     "unknown planner 'magic'"),
    ("no_buffer_types", lambda w: GraphAllocator([]), E.AllocationError, "at least one buffer type"),
    ("buffer_id_out_of_range", lambda w: w.galloc.reserve_n(w.graph, [3] * w.graph.n_nodes, None),
     E.BufferIdError, "has buffer id 3"),
    ("buffer_ids_wrong_length", lambda w: w.galloc.reserve_n(w.graph, [0], None), E.BufferIdError,
     "node_buffer_ids has 1 entries"),
    ("buffer_size_id", lambda w: w.galloc.get_buffer_size(2), E.BufferIdError, "buffer id 2"),
    ("sched_no_backends", lambda w: Scheduler([]), E.SchedulerError, "got 0"),
    ("sched_cpu_not_last", lambda w: Scheduler([w.cpu, w.fake]), E.SchedulerError, "last backend must be a CPU"),
    ("sched_bufts_count", lambda w: Scheduler([w.fake, w.cpu], bufts=[w.cpu.default_buffer_type]),
     E.SchedulerError, "1 buffer types for 2 backends"),
    ("sched_buft_unsupported", lambda w: Scheduler([w.fake, w.cpu], bufts=[w.cpu.default_buffer_type] * 2),
     E.SchedulerError, "FAKE does not support buffer type CPU"),
    ("sched_graph_too_big", lambda w: w.sched.alloc_graph(_big_graph(w)), E.SchedulerError, "graph_size 4"),
    ("sched_backend_index", lambda w: w.sched.set_tensor_backend(w.out, 7), E.SchedulerError, "index 7"),
    ("registry_unknown_device", lambda w: gg.backend.init_by_name("NOPE"), E.BackendError, "no device named"),
    ("registry_device_index", lambda w: registry.backends()[0].device(5), E.BackendError, "device index 5"),
    ("n_threads", lambda w: set_n_threads(w.cpu, 0), E.BackendError, "must be positive"),
    ("events_unsupported", lambda w: w.cpu.event_record(None), E.BackendError, "does not support events"),
]


@pytest.mark.parametrize("call, error, fragment", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_raises_and_changes_nothing(w, call, error, fragment):
    registry.load_all()  # a failed lookup discovers plug-in backends once; that is not a change the call made
    before = snapshot(w)
    with pytest.raises(error) as e:
        call(w)
    assert fragment in str(e.value)
    after = snapshot(w)
    assert after[0] == before[0], "buffer bytes changed"
    assert after[1] is before[1] and after[2:] == before[2:], "plan, bindings or registry changed"


def test_the_table_in_docs_lists_every_row():
    table = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    missing = [r[0] for r in ROWS if f"`{r[0]}`" not in table]
    assert missing == []


def test_sched_alloc_twice_is_refused_and_keeps_the_allocation(w):
    """alloc_graph twice without reset: the first allocation stays (its is_alloc state is the point)."""
    assert w.sched.alloc_graph(w.graph)
    with pytest.raises(E.SchedulerError, match="alloc_graph called twice"):
        w.sched.alloc_graph(w.graph)
    assert w.sched.is_alloc
