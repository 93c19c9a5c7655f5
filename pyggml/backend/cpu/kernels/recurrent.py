"""LSTM (pyggml's own op, core.ops.recurrent): the steps one after another, each a product and the gates, in float32."""

from __future__ import annotations

import functools

import numpy as np

from pyggml.backend.cpu.jit import lstm as jit_lstm
from pyggml.backend.cpu.kernels import kernel
from pyggml.backend.cpu.kernels._common import overlap, view
from pyggml.backend.cpu.kernels.unary import sigmoid
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType as G


def _all_f32(t: Tensor) -> bool:
    return t.type == G.F32 and all(s.type == G.F32 for s in t.srcs)


def _matrices(dst: Tensor) -> list[np.ndarray]:
    """gates_x [n, 4H], w_hh [4H, H], state [2, H] and out [n + 2, H]: views of the four 2-D tensors."""
    return [view(t)[0, 0] for t in (*dst.srcs, dst)]


def _bind(dst: Tensor):
    """The compiled loop, for C-contiguous operands that the output does not overlap."""
    arrays = _matrices(dst)
    if not all(a.flags.c_contiguous for a in arrays) or overlap(arrays[-1], *arrays[:-1]):
        return None
    return functools.partial(jit_lstm.lstm_f32, *arrays)


@kernel(Op.LSTM, supports=_all_f32, bind=_bind)
def lstm(dst: Tensor) -> None:
    gates_x, w_hh, state, out = _matrices(dst)
    hidden = w_hh.shape[1]
    h, c = state.copy()
    for t, projected in enumerate(gates_x):
        g = projected + w_hh @ h
        i, f, o = (sigmoid(g[k * hidden:(k + 1) * hidden]) for k in (0, 1, 3))
        c = f * c + i * np.tanh(g[2 * hidden:3 * hidden])
        h = o * np.tanh(c)
        out[t] = h
    out[-2:] = h, c
