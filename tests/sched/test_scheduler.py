"""The FAKE-GPU + CPU scenarios of `ggml_backend_sched` (op offload, splits, copies), with ggml 0.15.3's numbers."""

import numpy as np
import pytest

import pyggml as gg
from pyggml import Context, GGMLType, Graph, Op, ops
from pyggml.backend import BufferUsage, Status, tensor_get, tensor_set
from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.errors import SchedulerError
from pyggml.sched import Scheduler

from tests.support.fake_gpu import FakeDevice

RNG = np.random.default_rng(0)
X = RNG.uniform(-1, 1, (8, 64)).astype(np.float32)
W1 = RNG.uniform(-1, 1, (128, 64)).astype(np.float32)
W2 = RNG.uniform(-1, 1, (64, 128)).astype(np.float32)


def expected():
    r1 = np.maximum(X @ W1.T, 0)
    return np.maximum(r1 @ W2.T, 0)


def setup(w1_on, w2_on, fake_ops=(Op.MUL_MAT, Op.UNARY), offload=(), parallel=False):
    """x (2048 B input) -> y1 = W1 x (4096 B) -> r1 = relu -> y2 = W2 r1 (2048 B) -> r2 = relu."""
    fake = FakeDevice(ops=fake_ops, offload=offload).init_backend()
    cpu = gg.backend.init_by_name("CPU")
    weights = {}
    for name, arr, where in (("W1", W1, w1_on), ("W2", W2, w2_on)):
        ctx = Context(no_alloc=True)
        w = ctx.new_tensor_2d(GGMLType.F32, arr.shape[1], arr.shape[0], name)
        buft = (fake if where == "FAKE" else cpu).default_buffer_type
        buf = alloc_ctx_tensors_from_buft(ctx, buft)
        buf.usage = BufferUsage.WEIGHTS
        tensor_set(w, arr)
        weights[name] = (w, buf)
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_2d(GGMLType.F32, 64, 8, "x").set_input()
    y1 = ops.mul_mat(ctx, weights["W1"][0], x).set_name("y1")
    r1 = ops.relu(ctx, y1).set_name("r1")
    y2 = ops.mul_mat(ctx, weights["W2"][0], r1).set_name("y2")
    r2 = ops.relu(ctx, y2).set_name("r2").set_output()
    g = Graph().build_forward_expand(r2)
    sched = Scheduler([fake, cpu], parallel=parallel)
    return sched, g, dict(x=x, y1=y1, r1=r1, y2=y2, r2=r2), (fake, cpu), weights


def run(sched, g, t):
    assert sched.alloc_graph(g)
    tensor_set(t["x"], X)
    assert sched.graph_compute(g) == Status.SUCCESS
    np.testing.assert_allclose(tensor_get(t["r2"]), expected(), rtol=1e-5, atol=3e-5)


def assigned(sched, t):
    return {k: sched.get_tensor_backend(v).name for k, v in t.items() if k != "x"}


def test_s1_weights_split_between_fake_and_cpu():
    sched, g, t, (fake, cpu), _ = setup("FAKE", "CPU")
    run(sched, g, t)
    assert assigned(sched, t) == dict(y1="FAKE", r1="FAKE", y2="CPU", r2="CPU")
    assert sched.n_splits == 2
    assert [c.name for c in sched.graph.nodes if "#" in c.name] == ["FAKE#x#0", "CPU#r1#0"]
    assert g.nodes[0].src[1].name == "FAKE#x#0"  # the sources point at the copies while allocated
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (6144, 6144)


def test_s2_both_weights_on_fake():
    sched, g, t, (fake, cpu), _ = setup("FAKE", "FAKE")
    run(sched, g, t)
    assert set(assigned(sched, t).values()) == {"FAKE"} and sched.n_splits == 1
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (6144, 2048)


def test_s3_both_weights_on_cpu_without_offload():
    sched, g, t, (fake, cpu), _ = setup("CPU", "CPU")
    run(sched, g, t)
    assert set(assigned(sched, t).values()) == {"CPU"} and sched.n_splits == 1
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (0, 6144)


def test_s4_offload_copies_weights_and_forces_a_split_for_the_second():
    sched, g, t, (fake, cpu), _ = setup("CPU", "CPU", offload=(Op.MUL_MAT,))
    run(sched, g, t)
    assert set(assigned(sched, t).values()) == {"FAKE"} and sched.n_splits == 2
    assert {c.name for c in sched.graph.nodes if "#" in c.name} == {"FAKE#x#0", "FAKE#W1#0", "FAKE#W2#0"}
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (38912, 2048)


def test_s5_user_pin_gives_three_splits():
    sched, g, t, (fake, cpu), _ = setup("FAKE", "FAKE")
    sched.set_tensor_backend(t["r1"], cpu)
    run(sched, g, t)
    assert assigned(sched, t) == dict(y1="FAKE", r1="CPU", y2="FAKE", r2="FAKE") and sched.n_splits == 3
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (6144, 4096)


def test_s6_unsupported_unary_runs_on_cpu():
    sched, g, t, (fake, cpu), _ = setup("FAKE", "FAKE", fake_ops=(Op.MUL_MAT,))
    run(sched, g, t)
    assert assigned(sched, t) == dict(y1="FAKE", r1="CPU", y2="FAKE", r2="CPU") and sched.n_splits == 4
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (6144, 4096)


def test_parallel_copies_grow_the_buffers_and_compute_repeatedly():
    sched, g, t, (fake, cpu), _ = setup("FAKE", "CPU", parallel=True)
    assert sched.n_copies == 4
    for _ in range(3):
        run(sched, g, t)
        sched.reset()
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (12288, 26624)


def test_eval_callback_sequence_and_cancel():
    sched, g, t, _, _ = setup("FAKE", "CPU")
    seen = []

    def cb(node, ask):
        seen.append((node.name, ask))
        return node.op == Op.UNARY if ask else True

    sched.set_eval_callback(cb)
    run(sched, g, t)
    assert seen == [("y1", True), ("r1", True), ("r1", False), ("y2", True), ("r2", True), ("r2", False)]

    sched2, g2, t2, _, _ = setup("FAKE", "CPU")
    sched2.set_eval_callback(lambda node, ask: bool(ask))
    assert sched2.alloc_graph(g2)
    tensor_set(t2["x"], X)
    assert sched2.graph_compute(g2) == Status.ABORTED  # the whole compute stops, not only the split


def test_reserve_then_new_graph_keeps_sizes_and_reset_clears_assignments():
    sched, g, t, (fake, cpu), _ = setup("FAKE", "CPU")
    assert sched.reserve(g)
    assert sched.reserve_size(g) == [6144, 6144]
    sched.reset()
    assert sched.get_tensor_backend(t["y1"]) is None
    run(sched, g, t)
    assert (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (6144, 6144)


def test_splitting_the_same_graph_again_gives_the_same_plan():
    """ggml rewires the graph's sources and a second split goes wrong (8192 instead of 6144)."""
    sched, g, t, (fake, cpu), _ = setup("FAKE", "CPU")
    run(sched, g, t)
    sched.reset()
    run(sched, g, t)
    assert sched.n_splits == 2 and (sched.get_buffer_size(fake), sched.get_buffer_size(cpu)) == (6144, 6144)
    assert [c.name for c in sched.graph.nodes if "#" in c.name] == ["FAKE#x#0", "CPU#r1#0"]


def test_bad_configurations_raise():
    fake = FakeDevice().init_backend()
    cpu = gg.backend.init_by_name("CPU")
    with pytest.raises(SchedulerError, match="last backend must be a CPU"):
        Scheduler([cpu, fake])
    with pytest.raises(SchedulerError, match="1 to 16"):
        Scheduler([])
    sched = Scheduler([fake, cpu])
    with pytest.raises(SchedulerError, match="not one of"):
        sched.set_tensor_backend(Context(no_alloc=True).new_tensor_1d(GGMLType.F32, 1), FakeDevice().init_backend())


def test_preallocated_tensor_no_backend_can_use_raises():
    """A weight in FAKE memory feeding an op FAKE cannot run, with only FAKE's buffer holding it."""
    fake_dev = FakeDevice(ops=())
    fake, cpu = fake_dev.init_backend(), gg.backend.init_by_name("CPU")
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor_1d(GGMLType.F32, 4, "w")
    alloc_ctx_tensors_from_buft(ctx, fake.default_buffer_type)
    v = ops.view_1d(Context(no_alloc=True), w, 4, 0)
    r = ops.relu(Context(no_alloc=True), v)
    with pytest.raises(SchedulerError, match="pre-allocated tensor"):
        Scheduler([fake, cpu]).alloc_graph(Graph().build_forward_expand(ops.cpy(Context(no_alloc=True), r, v)))


def test_describe_names_splits_and_inputs():
    sched, g, t, _, _ = setup("FAKE", "CPU")
    run(sched, g, t)
    text = sched.describe(g)
    assert "SPLIT #0: FAKE" in text and "SPLIT #1: CPU" in text and "r1" in text


def test_a_view_pinned_away_from_its_root_still_reads_the_computed_root():
    """A VIEW pinned to FAKE while its root is computed on the CPU: ggml copies the view at the start of
    the split, before the root is computed; here views follow their roots."""
    fake, cpu = FakeDevice(ops=()).init_backend(), gg.backend.init_by_name("CPU")
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_1d(GGMLType.F32, 4, "x").set_input()
    r = ops.relu(ctx, x)
    v = ops.view_1d(ctx, r, 2, 8)
    out = ops.cont(ctx, v).set_output()
    g = Graph().build_forward_expand(out)
    sched = Scheduler([fake, cpu])
    sched.set_tensor_backend(v, fake)
    assert sched.alloc_graph(g)
    tensor_set(x, np.array([1, -2, 3, -4], np.float32))
    assert sched.graph_compute(g) == Status.SUCCESS
    assert tensor_get(out).tolist() == [3, 0] and sched.get_tensor_backend(v) is cpu
