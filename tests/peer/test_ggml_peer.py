"""The peer itself: struct layout, hand-built graphs against NumPy and ggml 0.15.3's planned offsets, and the graph
files' recorded gallocr offsets (the peer must reproduce them exactly)."""

import ctypes

import numpy as np
import pytest

pytest.importorskip("ggml", reason="ggml-python (the ggml peer) is not installed")

import pyggml as gg  # noqa: E402
from pyggml.core.tensor import Op, Tensor, UnaryOp  # noqa: E402
from pyggml.errors import BackendError, LayoutError, NotAllocatedError, UnsupportedOpError  # noqa: E402

from tests.support.ggml_peer import GGMLPeer, GGMLTensorStruct, IsolatedPeer, PeerCrashed, ggml_version, library  # noqa: E402

pytestmark = pytest.mark.peer

F32 = gg.GGMLType.F32
N = 1000  # 4000-byte f32 tensors: the small graphs whose plans tests/alloc checks


@pytest.fixture(scope="module")
def peer():
    with GGMLPeer(n_threads=2) as p:
        yield p


def node(ctx, op, *srcs, ne=None, type_=F32, params=(), name=""):
    """A tensor computed by op from srcs, built by hand (no op builder involved)."""
    t = ctx.add(Tensor(type_, ne or srcs[0].ne, op=op, name=name))
    for i, s in enumerate(srcs):
        t.src[i] = s
    t.set_op_params(params)
    return t


def unary(ctx, u, a, name=""):
    return node(ctx, Op.UNARY, a, params=[int(u)], name=name)


def inputs(ctx, *names, ne=(N,)):
    return [ctx.new_tensor(F32, ne, name=n).set_input() for n in names]


def graph_of(out):
    out.set_output()
    return gg.Graph().build_forward_expand(out)


def named_offsets(offsets):
    return {t.name: o for t, o in offsets.items()}


def test_struct_layout_matches_the_library():
    lib = library()
    assert ggml_version() == "0.15.3"
    assert ctypes.sizeof(GGMLTensorStruct) == 336
    assert lib.ggml_tensor_overhead() == ctypes.sizeof(GGMLTensorStruct) + 32  # + struct ggml_object


def test_chain_runs_in_place_and_matches_numpy(peer):
    ctx = gg.Context(no_alloc=True)
    x, b = inputs(ctx, "x", "b")
    h1 = node(ctx, Op.ADD, x, b, name="h1")
    h2 = unary(ctx, UnaryOp.RELU, h1, name="h2")
    h3 = node(ctx, Op.ADD, h2, b, name="h3")
    h4 = unary(ctx, UnaryOp.RELU, h3, name="h4")
    g = graph_of(h4)
    offsets, size = peer.plan(g)
    assert named_offsets(offsets) == {"x": 0, "b": 4000, "h1": 0, "h2": 0, "h3": 0, "h4": 0}
    assert size == 8000
    rng = np.random.default_rng(0)
    xv, bv = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
    (out,) = peer.compute(g, {x: xv, b: bv}, [h4])
    assert out.shape == (1, 1, 1, N)
    np.testing.assert_array_equal(out.ravel(), np.maximum(np.maximum(xv + bv, 0) + bv, 0))


def test_diamond_reuses_the_last_consumer(peer):
    ctx = gg.Context(no_alloc=True)
    (x,) = inputs(ctx, "x")
    a = node(ctx, Op.SCALE, x, params=[2.0, 0.0], name="a")
    b = node(ctx, Op.SQR, x, name="b")
    c = node(ctx, Op.ADD, a, b, name="c")
    g = graph_of(c)
    offsets, size = peer.plan(g)
    assert named_offsets(offsets) == {"x": 0, "a": 4000, "b": 0, "c": 4000} and size == 8000
    xv = np.linspace(-3, 3, N, dtype=np.float32)
    (out,) = peer.compute(g, {x: xv}, [c])
    np.testing.assert_allclose(out.ravel(), 2 * xv + xv * xv, rtol=1e-6)


def test_view_parent_is_not_reused_in_place(peer):
    ctx = gg.Context(no_alloc=True)
    (x,) = inputs(ctx, "x")
    c = node(ctx, Op.SCALE, x, params=[3.0, 0.0], name="c")
    v = ctx.add(Tensor(F32, (10, 100), view_src=c, name="v"))
    v.op, v.src[0] = Op.RESHAPE, c
    r = unary(ctx, UnaryOp.RELU, v, name="r")
    xr = ctx.add(Tensor(F32, (10, 100), view_src=x, name="xr"))
    xr.op, xr.src[0] = Op.RESHAPE, x
    s = node(ctx, Op.ADD, r, xr, name="s")
    g = graph_of(s)
    offsets, size = peer.plan(g)
    assert named_offsets(offsets) == {"x": 0, "c": 4000, "r": 8000, "s": 8000} and size == 12000
    xv = np.linspace(-1, 1, N, dtype=np.float32)
    (out,) = peer.compute(g, {x: xv}, [s])
    np.testing.assert_allclose(out.reshape(100, 10), (np.maximum(3 * xv, 0) + xv).reshape(100, 10), rtol=1e-6)


def test_mul_mat_with_preallocated_weights(peer):
    ctx = gg.Context(no_alloc=True)
    w = ctx.new_tensor(F32, (64, 32), name="w")
    (x,) = inputs(ctx, "x", ne=(64, 8))
    y = node(ctx, Op.MUL_MAT, w, x, ne=(32, 8), name="y")
    g = graph_of(y)
    offsets, _ = peer.plan(g, preallocated=[w])
    assert set(named_offsets(offsets)) == {"x", "y"}
    rng = np.random.default_rng(1)
    wv, xv = rng.standard_normal((32, 64), dtype=np.float32), rng.standard_normal((8, 64), dtype=np.float32)
    (out,) = peer.compute(g, {w: wv, x: xv}, [y], preallocated=[w])
    np.testing.assert_allclose(out.reshape(8, 32), xv @ wv.T, rtol=1e-4, atol=1e-4)


def test_quantized_weights_are_quantized_like_gguf(peer):
    ctx = gg.Context(no_alloc=True)
    w = ctx.new_tensor(gg.GGMLType.Q8_0, (64, 16), name="wq")
    (x,) = inputs(ctx, "x", ne=(64, 4))
    y = node(ctx, Op.MUL_MAT, w, x, ne=(16, 4), name="y")
    g = graph_of(y)
    rng = np.random.default_rng(2)
    wv, xv = rng.standard_normal((16, 64), dtype=np.float32), rng.standard_normal((4, 64), dtype=np.float32)
    with peer.prepare(g, {w: wv, x: xv}) as p:
        p.run()
        raw = p.get(w)
        out = p.get(y)
    assert raw.dtype == np.uint8 and raw.size == 16 * 68  # 2 blocks of 34 bytes per row
    wq = gg.core.types.to_float(gg.GGMLType.Q8_0, raw).reshape(16, 64)
    assert np.abs(wq - wv).max() < 0.05
    # ggml quantizes x to Q8_0 too (vec_dot_type), so compare loosely
    np.testing.assert_allclose(out.reshape(4, 16), xv @ wq.T, rtol=0.05, atol=0.05)


def test_prepared_graph_runs_repeatedly_and_inputs_persist(peer):
    """y = x * b runs in place on x (ggml reuses an input that is not OUTPUT), so a rerun sees the new x."""
    ctx = gg.Context(no_alloc=True)
    x, b = inputs(ctx, "x", "b")
    y = node(ctx, Op.MUL, x, b, name="y")
    g = graph_of(y)
    ones = np.ones(N, np.float32)
    with peer.prepare(g, {x: ones, b: 3 * ones}) as p:
        p.run()
        np.testing.assert_array_equal(p.get(y).ravel(), 3 * ones)
        p.run()
        np.testing.assert_array_equal(p.get(y).ravel(), 9 * ones)
        p.set_inputs({x: ones, b: 2 * ones})
        p.run()
        np.testing.assert_array_equal(p.get(y).ravel(), 2 * ones)


def test_unsupported_op_is_refused_not_aborted(peer):
    ctx = gg.Context(no_alloc=True)
    w = ctx.new_tensor(F32, (64, 32), name="w")
    x = ctx.new_tensor(gg.GGMLType.F16, (64, 8), name="x")
    y = node(ctx, Op.MUL_MAT, w, x, ne=(32, 8), name="y")
    with pytest.raises(UnsupportedOpError, match="MUL_MAT.*'y'"):
        peer.plan(graph_of(y))


def test_bad_inputs_name_the_tensor(peer):
    ctx = gg.Context(no_alloc=True)
    (x,) = inputs(ctx, "x", ne=(10, 10))
    t = ctx.add(Tensor(F32, (10, 10), nb=(40, 4, 400, 400), view_src=x, name="xt"))
    t.op, t.src[0] = Op.TRANSPOSE, x
    y = node(ctx, Op.CONT, t, name="y")
    g = graph_of(y)
    with pytest.raises(LayoutError, match="'x': 3 values for 100"):
        peer.compute(g, {x: np.zeros(3)}, [y])
    with peer.prepare(g, {x: np.ones(100)}) as p:
        with pytest.raises(LayoutError, match="'xt' is not contiguous"):
            p.set_inputs({x: np.full(100, 7.0), t: np.zeros(100)})
        np.testing.assert_array_equal(p.get(x).ravel(), np.ones(100))  # nothing half-written
    with pytest.raises(LayoutError, match="'xt' is not contiguous"):
        peer.compute(g, {t: np.zeros(100)}, [y])
    stray = ctx.new_tensor(F32, (4,), name="stray")
    with peer.prepare(g) as p, pytest.raises(Exception, match="'stray' is not part"):
        p.get(stray)
    xv = np.arange(100, dtype=np.float32).reshape(10, 10)
    (out,) = peer.compute(g, {x: xv}, [y])
    np.testing.assert_array_equal(out.reshape(10, 10), xv.T)


def test_close_frees_everything_and_refuses_reuse():
    peer = GGMLPeer(n_threads=1)
    ctx = gg.Context(no_alloc=True)
    (x,) = inputs(ctx, "x")
    y = unary(ctx, UnaryOp.NEG, x, name="y")
    p = peer.prepare(graph_of(y), {x: np.ones(N)})
    peer.close()
    with pytest.raises(NotAllocatedError):
        p.get(y)
    with pytest.raises(BackendError, match="closed"):
        peer.prepare(gg.Graph().build_forward_expand(y))
    peer.close()  # idempotent


def test_graph_files_get_ggml_recorded_offsets(peer, graph_files):
    for path in graph_files:
        lg = gg.load_graph_json(path)
        offsets, size = peer.plan(lg.graph, preallocated=lg.preallocated)
        ids = lg.ids()
        got = {ids[id(t)]: off for t, off in offsets.items()}
        want = {tid: place[1] for tid, place in lg.expected.placement.items() if place is not None}
        assert got == want, path.name
        assert size == lg.expected.compute_buffer_size, path.name


def test_isolated_peer_survives_a_ggml_abort():
    ctx = gg.Context(no_alloc=True)
    (x,) = inputs(ctx, "x", ne=(4,))
    (b,) = inputs(ctx, "b", ne=(3,))
    bad = node(ctx, Op.ADD, x, b, name="bad")  # b cannot repeat to x: ggml asserts
    good = node(ctx, Op.ADD, x, x, name="good")
    with IsolatedPeer(n_threads=1) as iso:
        with pytest.raises(PeerCrashed, match="GGML_ASSERT.*can_repeat"):
            iso.compute(graph_of(bad), {x: np.ones(4), b: np.ones(3)}, [bad])
        (out,) = iso.compute(graph_of(good), {x: np.arange(4)}, [good])
        np.testing.assert_array_equal(out.ravel(), [0, 2, 4, 6])
        w = ctx.new_tensor(F32, (4, 2), name="w")
        y = node(ctx, Op.MUL_MAT, w, ctx.new_tensor(gg.GGMLType.F16, (4, 1), name="h"), ne=(2, 1), name="y")
        with pytest.raises(UnsupportedOpError):
            iso.compute(graph_of(y), {}, [y])
