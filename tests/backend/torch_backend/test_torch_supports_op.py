"""supports_op is honest: on random one-op graphs with random types, False means graph_compute raises
UnsupportedOpError (before anything runs) and True means the node computes without error."""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch.cuda")  # see test_torch_ops.py for why not "torch"

from pyggml import ops  # noqa: E402
from pyggml.backend import init_by_name, torch as torch_backend  # noqa: E402,F401 (importing registers TORCH)
from pyggml.backend.graph_copy import graph_copy  # noqa: E402
from pyggml.core import types as T  # noqa: E402
from pyggml.core.context import Context  # noqa: E402
from pyggml.core.graph import Graph  # noqa: E402
from pyggml.core.tensor import Op, host_ndarray  # noqa: E402
from pyggml.core.types import GGMLType as G  # noqa: E402
from pyggml.errors import GGMLError, UnsupportedOpError  # noqa: E402

TYPES = [G.F32, G.F16, G.BF16, G.Q8_0, G.Q4_0, G.Q4_K, G.I32]
NE = (256, 4)

ONE_INPUT = {
    "relu": ops.relu, "gelu": ops.gelu, "silu": ops.silu, "exp": ops.exp, "neg": ops.neg, "sqr": ops.sqr,
    "rms_norm": lambda ctx, a: ops.rms_norm(ctx, a, 1e-6), "norm": lambda ctx, a: ops.norm(ctx, a, 1e-5),
    "soft_max": ops.soft_max, "sum_rows": ops.sum_rows, "mean": ops.mean, "argmax": ops.argmax,
    "scale": lambda ctx, a: ops.scale(ctx, a, 0.5), "cont": lambda ctx, a: ops.cont(ctx, ops.transpose(ctx, a)),
    "argsort": lambda ctx, a: ops.argsort(ctx, a, 0), "cumsum": ops.cumsum, "swiglu": ops.swiglu,
    "roll": lambda ctx, a: ops.roll(ctx, a, 1, 0, 0, 0), "pad_reflect": lambda ctx, a: ops.pad_reflect_1d(ctx, a, 1, 1),
    "diag_mask_inf": lambda ctx, a: ops.diag_mask_inf(ctx, a, 1), "sum": ops.sum,
    "repeat": lambda ctx, a: ops.repeat_4d(ctx, a, NE[0], NE[1], 2, 1),
}
TWO_INPUTS = {
    "add": ops.add, "mul": ops.mul, "div": ops.div, "mul_mat": ops.mul_mat, "cpy": ops.cpy,
    "concat": lambda ctx, a, b: ops.concat(ctx, a, b, 1), "get_rows": None, "out_prod": None,
}


def build(ctx, name, a_type, b_type):
    a = ctx.new_tensor(a_type, NE, name="a")
    if name in ONE_INPUT:
        return ONE_INPUT[name](ctx, a)
    if name == "get_rows":
        ids = ctx.new_tensor(G.I32, (3,), name="ids")
        host_ndarray(ids)[...] = [0, 3, 1]
        return ops.get_rows(ctx, a, ids)
    if name == "out_prod":
        return ops.out_prod(ctx, a, ctx.new_tensor(b_type, (7, NE[1]), name="b"))
    return TWO_INPUTS[name](ctx, a, ctx.new_tensor(b_type, NE, name="b"))


def retyped(ctx, t, type_):
    """t's node with a result type its builder would not choose."""
    out = ctx.new_tensor(type_, t.ne, name=f"{t.name}_{type_.name}")
    out.op, out.op_params, out.src = t.op, list(t.op_params), list(t.src)
    return out


def fill(graph, rng):
    for t in graph.leafs:
        if t.op != Op.NONE or t.name == "ids":
            continue
        raw = host_ndarray(t)
        if T.is_quantized(t.type):
            raw[...] = rng.integers(0, 256, raw.shape, dtype=np.uint8) & 0xBF
        else:
            raw[...] = T.encode(t.type, rng.uniform(-1, 1, raw.shape))


@pytest.fixture(scope="module")
def backend():
    b = init_by_name("TORCH_CPU")
    yield b
    b.free()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted({**ONE_INPUT, **TWO_INPUTS})), a_type=st.sampled_from(TYPES),
       b_type=st.sampled_from(TYPES), dst_type=st.sampled_from([None] * len(TYPES) + TYPES), seed=st.integers(0, 2**16))
def test_supports_op_is_honest(backend, name, a_type, b_type, dst_type, seed):
    ctx = Context()
    try:
        out = build(ctx, name, a_type, b_type)
        if dst_type is not None and out.view_src is None:
            out = retyped(ctx, out, dst_type)
    except GGMLError:
        assume(False)                                      # the builder or the type refuses this shape
    graph = Graph().build_forward_expand(out)
    fill(graph, np.random.default_rng(seed))
    copy = graph_copy(backend, graph)
    node = copy.graph.nodes[-1]
    try:
        event(f"supports_op {backend.supports_op(node)}")
        if backend.supports_op(node):
            assert backend.graph_compute(copy.graph) == 0
        else:
            with pytest.raises(UnsupportedOpError):
                backend.graph_compute(copy.graph)
    finally:
        copy.free()
