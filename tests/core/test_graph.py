import pytest

from pyggml import Context, EvalOrder, GGMLType, Graph, Op, Tensor, TensorFlag
from pyggml.errors import GraphError, GraphSizeError


def node(ctx, op, *srcs, name=""):
    t = ctx.dup_tensor(srcs[0], name)
    t.op = op
    for i, s in enumerate(srcs):
        t.src[i] = s
    return t


def test_post_order_dfs_src0_first_and_leafs_vs_nodes():
    ctx = Context(no_alloc=True)
    w2, w1, x = (ctx.new_tensor_1d(GGMLType.F32, 4, n) for n in ("w2", "w1", "x"))
    h = node(ctx, Op.MUL, w1, x, name="h")
    p = ctx.new_tensor_1d(GGMLType.F32, 4, "p").set_param()
    y = node(ctx, Op.ADD, w2, h, name="y")
    z = node(ctx, Op.ADD, y, p, name="z")
    g = Graph().build_forward_expand(z)
    assert [t.name for t in g.leafs] == ["w2", "w1", "x"]  # order of first discovery
    assert [t.name for t in g.nodes] == ["h", "y", "p", "z"]  # a PARAM tensor is a node
    assert all(t.flags & TensorFlag.COMPUTE for t in (h, y, z)) and not p.flags & TensorFlag.COMPUTE
    g.build_forward_expand(z)  # expanding again adds nothing
    assert g.n_nodes == 4 and g.n_leafs == 3


def test_right_to_left_order_and_unnamed_tensors():
    ctx = Context(no_alloc=True)
    a, b = ctx.new_tensor_1d(GGMLType.F32, 2), ctx.new_tensor_1d(GGMLType.F32, 2)
    c = node(ctx, Op.SUB, a, b)
    g = Graph(order=EvalOrder.RIGHT_TO_LEFT).build_forward_expand(c)
    assert g.leafs == [b, a] and [t.name for t in g.leafs] == ["leaf_0", "leaf_1"] and c.name == "node_0"


def test_deep_chains_do_not_hit_the_recursion_limit():
    ctx = Context(no_alloc=True)
    t = ctx.new_tensor_1d(GGMLType.F32, 1)
    for _ in range(5000):
        t = node(ctx, Op.SQR, t)
    g = Graph(size=6000).build_forward_expand(t)
    assert g.n_nodes == 5000 and g.nodes[-1] is t


def test_graph_size_is_enforced_and_views_slice_nodes():
    ctx = Context(no_alloc=True)
    t = ctx.new_tensor_1d(GGMLType.F32, 1)
    for _ in range(3):
        t = node(ctx, Op.SQR, t)
    with pytest.raises(GraphSizeError, match="2 nodes"):
        Graph(size=2).build_forward_expand(t)
    g = Graph().build_forward_expand(t)
    v = g.view(1, 3)
    assert v.nodes == g.nodes[1:3] and v.n_leafs == 0 and g.node(-1) is t
    with pytest.raises(GraphError):
        g.view(2, 5)


def test_views_are_nodes_when_they_have_an_op():
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_2d(GGMLType.F32, 4, 2)
    r = ctx.add(Tensor(GGMLType.F32, (8,), view_src=a, op=Op.RESHAPE))
    r.src[0] = a
    plain_view = ctx.view_tensor(a)
    g = Graph().build_forward_expand(node(ctx, Op.ADD, r, ctx.view_tensor(plain_view)))
    assert r in g.nodes and a in g.leafs
