"""The LSTM op: its builder's shapes and refusals, the compiled loop and the NumPy kernel against a float64 LSTM,
the RPC server's refusal."""

import functools

import numpy as np
import pytest
from tests.support.opcheck import new_input, nmse

from pyggml.backend.cpu import kernels
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import Op, host_ndarray
from pyggml.core.types import GGMLType as G
from pyggml.errors import GGMLTypeError, ShapeError


def lstm_f64(gates_x: np.ndarray, w_hh: np.ndarray, state: np.ndarray) -> np.ndarray:
    """[n + 2, H]: the hidden states, then the final h and c (PyTorch's LSTM cell, gates i, f, g, o)."""
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    h, c = state.astype(np.float64)
    out = []
    for projected in gates_x.astype(np.float64):
        i, f, g, o = np.split(projected + w_hh.astype(np.float64) @ h, 4)
        c = sig(f) * c + sig(i) * np.tanh(g)
        h = sig(o) * np.tanh(c)
        out.append(h)
    return np.array([*out, h, c])


def lstm_case(hidden: int, n: int, layout: str = "cont", seed: int = 0):
    """(node, expected): gates_x of a realistic scale (some gates saturated), in the given memory layout."""
    rng = np.random.default_rng(seed)
    ctx = Context()
    gates_x, w_hh, state = (new_input(ctx, G.F32, ne, lay, name) for ne, lay, name in
                            (((4 * hidden, n), layout, "gates_x"), ((hidden, 4 * hidden), "cont", "w_hh"),
                             ((hidden, 2), "cont", "state")))
    values = [rng.normal(0, 3, (n, 4 * hidden)), rng.normal(0, 1 / np.sqrt(hidden), (4 * hidden, hidden)),
              rng.normal(0, 0.5, (2, hidden))]
    for t, v in zip((gates_x, w_hh, state), values, strict=True):
        host_ndarray(t)[0, 0] = v.astype(np.float32)
    node = ops.lstm(ctx, gates_x, w_hh, state)
    return node, lstm_f64(*(host_ndarray(t)[0, 0] for t in (gates_x, w_hh, state)))


def test_builder_shape_and_sources():
    ctx = Context(no_alloc=True)
    gates_x, w_hh, state = (ctx.new_tensor(G.F32, ne) for ne in ((512, 7), (128, 512), (128, 2)))
    out = ops.lstm(ctx, gates_x, w_hh, state)
    assert (out.op, out.type, out.ne, out.src[:3]) == (Op.LSTM, G.F32, [128, 9, 1, 1], [gates_x, w_hh, state])


@pytest.mark.parametrize("shapes, error", [
    (((512, 7), (128, 256), (128, 2)), "w_hh must be"),
    (((500, 7), (128, 512), (128, 2)), "gates_x must be"),
    (((512, 7, 2), (128, 512), (128, 2)), "gates_x must be"),
    (((512, 7), (128, 512), (128, 1)), "state must be"),
])
def test_builder_refuses_shapes(shapes, error):
    ctx = Context(no_alloc=True)
    with pytest.raises(ShapeError, match=error):
        ops.lstm(ctx, *(ctx.new_tensor(G.F32, ne) for ne in shapes))


def test_builder_refuses_f16():
    ctx = Context(no_alloc=True)
    with pytest.raises(GGMLTypeError, match="F32"):
        ops.lstm(ctx, ctx.new_tensor(G.F32, (8, 3)), ctx.new_tensor(G.F16, (2, 8)), ctx.new_tensor(G.F32, (2, 2)))


@pytest.mark.parametrize("hidden, n", [(128, 40), (5, 9), (3, 1)])
def test_compiled_and_numpy_kernels_equal_float64_lstm(hidden, n):
    """Both kernels within float32 rounding of the float64 LSTM over steps that saturate some gates (NMSE 1e-12,
    largest error 2e-6), the final state in the last two rows."""
    node, expected = lstm_case(hidden, n)
    kernel = kernels.KERNELS[Op.LSTM]
    call = kernels.bound(node, kernel)
    assert not isinstance(call, functools.partial) or call.func is not kernel.fn, "not bound to the compiled loop"
    for run in (call, functools.partial(kernel.fn, node)):
        host_ndarray(node)[...] = np.nan
        run()
        got = host_ndarray(node)[0, 0]
        assert nmse(expected, got) < 1e-12 and np.abs(got - expected).max() < 2e-6
        np.testing.assert_array_equal(got[n - 1], got[n])


def test_strided_gates_run_the_numpy_kernel():
    """gates_x as a strided view (rows with a gap): the NumPy kernel computes it, with the same values."""
    node, expected = lstm_case(6, 5, layout="pad")
    assert kernels.supports(node)
    kernels.compute(node)
    assert np.abs(host_ndarray(node)[0, 0] - expected).max() < 2e-6


def test_rpc_does_not_serve_it():
    """No ggml build knows LSTM: an RPC server refuses the node rather than send it to a ggml peer."""
    from pyggml.backend.rpc.validate import Refused, check_node

    node, _ = lstm_case(4, 3)
    with pytest.raises(Refused, match="LSTM is not served"):
        check_node(node, kernels.supports)
