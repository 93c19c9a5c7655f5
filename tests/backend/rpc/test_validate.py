"""The RPC server's up-front checks accept every graph pyggml's op builders make (ggml's shape rules) and refuse
descriptors ggml could not have made."""


import pytest

from pyggml import ops
from pyggml.backend.cpu import CPU_REG
from pyggml.backend.rpc.validate import Refused, check_layout, check_node, is_dense, node_work
from pyggml.core.context import Context
from pyggml.core.graph import Graph
from pyggml.core.tensor import VIEW_OPS, Op, Tensor
from pyggml.core.types import GGMLType
from tests.support.all_opcases import all_cases

def op_cases():
    return all_cases()


@pytest.mark.parametrize("case", op_cases(), ids=lambda c: c.name)
def test_every_op_case_passes_the_checks(case):
    """Every node of every CPU op case, as the server would see it (no buffers): layout and node checks pass."""
    graph = Graph().build_forward_expand(case.build(Context(no_alloc=False)))  # some cases fill inputs
    supports = CPU_REG.device(0).supports_op
    for t in [*graph.leafs, *graph.nodes]:
        check_layout(t, t.view_src is not None or t.op in VIEW_OPS, None)
    for node in graph.nodes:
        if node.op not in VIEW_OPS and node.op != Op.NONE and supports(node):
            check_node(node, supports)
            assert node_work(node) >= node.nelements


def test_dense_layouts():
    t = Tensor(GGMLType.F32, [8, 4, 3, 1])
    assert is_dense(t)
    t.nb = [t.nb[0], t.nb[1], 0, t.nb[3]]
    assert not is_dense(t)
    ctx = Context(no_alloc=True)
    k, x = ctx.new_tensor(GGMLType.F32, [3, 3, 1, 8]), ctx.new_tensor(GGMLType.F32, [8, 6, 6, 1])
    cwhn = ops.permute(ctx, x, 2, 0, 1, 3)  # channels innermost: ggml's conv_2d_dw_direct keeps that layout
    y = ops.conv_2d_dw_direct(ctx, k, cwhn, 1, 1, 1, 1, 1, 1)
    assert y.view_src is None and y.nb != [4, 24, 144, 1152] and is_dense(y)
    check_node(y, lambda t: True)


def test_zero_strides_are_refused():
    t = Tensor(GGMLType.F32, [1 << 30, 1 << 30, 1, 1], [0, 0, 0, 0])
    with pytest.raises(Refused, match="not a view"):
        check_layout(t, False, 4096)
    with pytest.raises(Refused, match="could hold"):
        check_layout(t, True, 4096)
    check_layout(Tensor(GGMLType.F32, [16, 4, 1, 1], [0, 0, 0, 0]), True, 4096)  # a small broadcast view is fine
