"""Plan: placement lookups, verify() catching bad plans by name, JSON, the plot, and poisoned compute."""

import json
import re

import numpy as np
import pytest

import pyggml as gg
from pyggml import Context, GGMLType, Graph
from pyggml.alloc import GraphAllocator, Plan, compute_poisoned
from pyggml.alloc.plan import BufferPlan
from pyggml.backend import tensor_get, tensor_set
from pyggml.core import ops
from pyggml.errors import AllocationError


@pytest.fixture(scope="module")
def cpu():
    return gg.backend.init_by_name("CPU")


def diamond(cpu, planner="ggml"):
    """x -> a = scale(x), b = sqr(x) (in place on x), c = add(a, b) (in place on a), out = cont(c)."""
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor_1d(GGMLType.F32, 64, "x").set_input()
    a, b = ops.scale(ctx, x, 2.0), ops.sqr(ctx, x)
    c = ops.add(ctx, a, b)
    out = ops.cont(ctx, c)
    graph = Graph().build_forward_expand(out)
    galloc = GraphAllocator(cpu.default_buffer_type, planner=planner)
    assert galloc.alloc_graph(graph)
    return galloc, graph, (x, a, b, c, out)


def test_placement_and_lifetimes(cpu):
    galloc, graph, (x, a, b, c, out) = diamond(cpu)
    plan = galloc.plan
    assert plan.placement(x) == (0, 0, 0) and plan.placement(b) == (0, 0, 0)
    assert plan.get(b).inplace_parent is x and plan.get(c).inplace_parent is a
    assert (plan.get(x).first, plan.get(x).last) == (0, 1)  # read in place by b at step 1
    assert (plan.get(out).first, plan.get(out).last) == (3, 3)
    assert plan.placement(Context(no_alloc=True).new_tensor_1d(GGMLType.F32, 4)) is None
    assert plan.buffer_sizes == [512] and plan.lower_bound == 512 and plan.ggml_size == 512
    plan.verify()


def _with(plan: Plan, tensor, **changes) -> Plan:
    tensors = [p._replace(**changes) if p.tensor is tensor else p for p in plan.tensors]
    return Plan(tensors, plan.buffers, plan.n_steps, plan.planner)


def test_verify_names_two_live_tensors_that_share_bytes(cpu):
    galloc, graph, (x, a, b, c, out) = diamond(cpu)
    broken = _with(galloc.plan, out, offset=galloc.plan.get(c).offset)
    with pytest.raises(AllocationError, match=r"tensors '.*' .* and '.*' .* share bytes in buffer 0 chunk 0"):
        broken.verify()


def test_verify_catches_a_tensor_outside_its_chunk(cpu):
    galloc, graph, (x, a, b, c, out) = diamond(cpu)
    broken = _with(galloc.plan, out, offset=galloc.plan.buffer_sizes[0])
    with pytest.raises(AllocationError, match=re.escape(f"tensor {out.name!r} at buffer 0 chunk 0 offset 512")):
        broken.verify()
    no_chunk = Plan(galloc.plan.tensors, [BufferPlan([], 0, 0, "ggml", 0)], galloc.plan.n_steps, "ggml")
    with pytest.raises(AllocationError, match="no such chunk"):
        no_chunk.verify()


def test_to_json_round_trips_through_json(cpu):
    galloc, graph, (x, a, b, c, out) = diamond(cpu)
    doc = json.loads(json.dumps(galloc.plan.to_json()))
    assert doc["buffers"][0]["size"] == 512 and doc["buffers"][0]["lower_bound"] == 512
    entry = {t["name"]: t for t in doc["tensors"]}[b.name]
    assert entry["inplace_parent"] == x.name and entry["offset"] == 0 and entry["size"] == 256


def test_plot_writes_an_image(cpu, tmp_path):
    pytest.importorskip("matplotlib")
    galloc, *_ = diamond(cpu, planner="best")
    path = tmp_path / "plan.png"
    galloc.plan.plot(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_poisoned_compute_matches_with_a_correct_plan(cpu):
    galloc, graph, (x, a, b, c, out) = diamond(cpu)
    values = np.linspace(-2, 2, 64, dtype=np.float32)
    tensor_set(x, values)
    compute_poisoned(cpu, galloc, graph)
    assert np.array_equal(tensor_get(out), values * 2 + values * values)


def test_poisoned_compute_exposes_a_wrong_lifetime(cpu):
    galloc, graph, (x, a, b, c, out) = diamond(cpu)
    galloc._plan = _with(galloc.plan, c, last=2)  # pretend c dies before out reads it
    tensor_set(x, np.ones(64, np.float32))
    compute_poisoned(cpu, galloc, graph)
    assert np.isnan(tensor_get(out)).all()


def test_poisoned_compute_needs_the_planned_graph(cpu):
    galloc, graph, _ = diamond(cpu)
    _, other, _ = diamond(cpu)
    with pytest.raises(AllocationError, match="not in the allocator's latest plan"):
        compute_poisoned(cpu, galloc, other)
