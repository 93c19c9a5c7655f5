"""Putting a fixture graph's data in place: weights spread over buffer types, inputs set, outputs found.

Shared by the scheduler's real-graph tests and benchmarks/sched_split.py.
"""

from __future__ import annotations

from pyggml import Context, TensorFlag
from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.backend import BufferUsage, tensor_set


def outputs(lg):
    """The values a user reads: OUTPUT tensors, else the graph's sinks."""
    outs = [t for t in lg.graph.nodes if t.flags & TensorFlag.OUTPUT and t.view_src is None]
    consumed = {id(s) for t in lg.graph.nodes for s in t.srcs}
    return outs or [t for t in lg.graph.nodes if id(t) not in consumed and t.view_src is None]


def load_weights(lg, values, bufts):
    """Each preallocated tensor goes to bufts[i % len(bufts)], in WEIGHTS buffers, with the given values."""
    buffers = []
    for k, buft in enumerate(bufts):
        ctx = Context(no_alloc=True)
        for i, t in enumerate(lg.preallocated):
            if i % len(bufts) == k:
                ctx.add(t)
        buf = alloc_ctx_tensors_from_buft(ctx, buft)
        if buf is not None:
            buf.usage = BufferUsage.WEIGHTS
            buffers.append(buf)
    ids = lg.ids()
    for t in lg.preallocated:
        tensor_set(t, values[ids[id(t)]])
    return buffers


def set_inputs(lg, values):
    """Inputs are consumed: the planner may reuse their memory after their last use, so set them per compute."""
    for tid, v in values.items():
        t = lg.tensors[tid]
        if t.is_input:
            tensor_set(t, v)
